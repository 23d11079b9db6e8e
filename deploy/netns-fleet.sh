#!/usr/bin/env bash
# A fleet of N hosts on one machine, to try the mesh by hand and to test it under faults: each
# host is a network namespace with its own address on a bridge (the bridge lives in a namespace
# of its own), and runs one mesh-node that finds the others by mDNS over that bridge. Nothing
# touches this machine's real interfaces. Needs root and iproute2.
#
# Usage: deploy/netns-fleet.sh COMMAND
#   up N [--release] [--embedded]   build N hosts (host1..hostN, 10.78.0.1..N) and start a node
#                                   in each; --embedded gives host1 the embedded model (fetched
#                                   by deploy/fetch-model.sh); waits until every node sees all
#   down                            stop the nodes, delete the namespaces and the fleet's files
#   status                          mesh-cli status, as host1 sees the fleet
#   cli I ARGS...                   mesh-cli ARGS against host I, from inside its namespace
#   exec I CMD...                   run CMD inside host I's namespace
#                                   (a slow link: exec I tc qdisc add dev eth0 root tbf rate
#                                   256kbit burst 16kbit latency 500ms; a lossy one, 20% each
#                                   way: nft rules with `numgen random mod 100 < 20 drop`, see
#                                   tests/tests/netns_fleet.rs)
#   cut I | heal I                  take host I's link to the bridge down (a partition) or up
#   kill I [SIGNAL] | start I       signal host I's node (default KILL), or start it again
# Environment: FLEET_NAME (namespace prefix, default amf; one fleet per name), FLEET_DIR (its
# files: configs, CA, data dirs, logs; default /tmp/agentmesh-fleet-$FLEET_NAME; it must be this
# user's own directory, not a link, writable by nobody else), FLEET_BIN (a directory with
# mesh-node and mesh-cli to use instead of building them).
set -euo pipefail
# Runs as root: everything it writes (keys, configs, logs) is for its user alone.
umask 077

name=${FLEET_NAME:-amf}
dir=${FLEET_DIR:-/tmp/agentmesh-fleet-$name}
root=$(cd "$(dirname "$0")/.." && pwd)
hub="$name-hub"

die() { echo "netns-fleet.sh: $*" >&2; exit 1; }
# The fleet's directory, under a shared /tmp by default: someone else may have made it first
# (to read the keys, or plant links the node would write through). It is used only when it is
# a real directory of this user's that no one else can write; `up` creates it so.
check_dir() {
  [ -e "$dir" ] || [ -L "$dir" ] || return 0
  [ ! -L "$dir" ] && [ -d "$dir" ] || die "$dir is not a directory of its own (a link or a file); remove it, or set FLEET_DIR to a directory of yours"
  [ "$(stat -c %u "$dir")" = "$(id -u)" ] ||
    die "$dir belongs to another user; refusing it (remove it, or set FLEET_DIR to a directory of yours)"
  [ $((8#$(stat -c %a "$dir") & 8#022)) = 0 ] ||
    die "$dir can be written by others (mode $(stat -c %a "$dir")); refusing it (chmod 700 it, or set FLEET_DIR to another directory)"
}
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
host_ns() { echo "$name-$1"; }
addr() { echo "10.78.0.$1"; }
count() { cat "$dir/count" 2>/dev/null || die "no fleet \`$name\` is up (deploy/netns-fleet.sh up N)"; }
bin() { cat "$dir/bin"; }
check_host() {
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$(count)" ] ||
    die "no host \`$1\` in fleet \`$name\` (hosts are 1..$(count))"
}
need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null || die "needs \`ip\` (Debian: apt-get install iproute2)"
}
cli_in() { # host args...: mesh-cli against that host, inside its namespace
  local i=$1; shift
  ip netns exec "$(host_ns "$i")" "$(bin)/mesh-cli" --node "$(addr "$i"):7700" \
    --ca "$dir/ca/ca.pem" --cert "$dir/ca/mesh-cli.pem" --key "$dir/ca/mesh-cli.key" "$@"
}

start_node() { # host
  local i=$1
  ip netns exec "$(host_ns "$i")" "$(bin)/mesh-node" --config "$dir/host$i.toml" \
    >> "$dir/host$i.log" 2>&1 &
  echo $! > "$dir/host$i.pid"
}

up() {
  local n=${1:-} profile=debug embedded=false
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "up: give the number of hosts, 1-200 (e.g. \`up 3\`)"
  shift
  for arg in "$@"; do
    case "$arg" in
      --release) profile=release ;;
      --embedded) embedded=true ;;
      *) die "up: unknown option \`$arg\`" ;;
    esac
  done
  need_root
  # Every host ends up talking to every other: N×(N−1) ARP entries, all in one neighbour
  # table that every namespace shares, capped machine-wide (gc_thresh3: 1024 by default,
  # enough for 32 hosts). Past the cap the kernel logs "neighbor table overflow" and the last
  # hosts get no network at all, so refuse up front.
  local arp_cap arp_need=$((n * (n - 1)))
  arp_cap=$(cat /proc/sys/net/ipv4/neigh/default/gc_thresh3 2>/dev/null || echo 0)
  if [ "$arp_cap" -gt 0 ] && [ "$arp_need" -gt "$arp_cap" ]; then
    die "up $n: $n hosts need $arp_need ARP entries, more than this machine's neighbour table holds (net.ipv4.neigh.default.gc_thresh3 = $arp_cap, shared by every namespace; hosts past it get no network). Raise it first (sysctl -w net.ipv4.neigh.default.gc_thresh2=$arp_need net.ipv4.neigh.default.gc_thresh3=$((arp_need * 2))), or start fewer hosts; tests/src/bin/fleet-bench.rs runs large fleets on loopback without namespaces"
  fi
  [ ! -e "$dir/count" ] || die "fleet \`$name\` is already up ($dir); \`down\` it first"
  local bins=${FLEET_BIN:-$root/target/$profile}
  bins=$(cd "$bins" 2>/dev/null && pwd) || die "FLEET_BIN: no directory \`${FLEET_BIN:-}\`"
  if [ -z "${FLEET_BIN:-}" ]; then
    local flags=()
    [ "$profile" = release ] && flags=(--release)
    (cd "$root" && cargo build --bins --quiet "${flags[@]}")
  fi
  [ -x "$bins/mesh-node" ] && [ -x "$bins/mesh-cli" ] || die "no mesh-node and mesh-cli in $bins"
  mkdir -p -m 700 "$dir"
  check_dir
  echo "$bins" > "$dir/bin"
  local model=""
  if $embedded; then model=$("$root/deploy/fetch-model.sh" 2>/dev/null | tail -n 1); fi

  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  # Without a multicast querier, snooping could starve mDNS: flood, like a plain switch.
  ip -n "$hub" link set br0 type bridge mcast_snooping 0
  ip -n "$hub" link set br0 up
  echo "$n" > "$dir/count"

  "$(bin)/mesh-cli" ca init --dir "$dir/ca" >/dev/null
  "$(bin)/mesh-cli" ca issue --dir "$dir/ca" --role client --name mesh-cli >/dev/null
  for i in $(seq 1 "$n"); do
    local ns
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$hub" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "p$i" master br0 up
    ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    "$(bin)/mesh-cli" ca issue --dir "$dir/ca" --role node --name "host$i" --san "$(addr "$i")" >/dev/null
    {
      echo "[node]"
      echo "name = \"host$i\""
      echo "listen = \"$(addr "$i"):7700\""
      echo "data_dir = \"$dir/host$i\""
      echo "[discovery]"
      echo "mdns = true"
      echo "[tls]"
      echo "ca = \"$dir/ca/ca.pem\""
      echo "cert = \"$dir/ca/host$i.pem\""
      echo "key = \"$dir/ca/host$i.key\""
      if [ "$i" = 1 ] && [ -n "$model" ]; then
        echo "[[models]]"
        echo "name = \"smollm2-135m\""
        echo "backend = \"embedded\""
        echo "path = \"$model\""
        echo "threads = 1"
        echo "[roles]"
        echo "chat = [\"smollm2-135m\"]"
      fi
    } > "$dir/host$i.toml"
    start_node "$i"
  done

  local deadline=$((SECONDS + 60)) seen=0
  while :; do
    seen=0
    for i in $(seq 1 "$n"); do
      local up_here
      up_here=$(cli_in "$i" status --json 2>/dev/null | grep -c '"state": "up"' || true)
      [ "$up_here" = "$n" ] && seen=$((seen + 1))
    done
    [ "$seen" = "$n" ] && break
    if [ $SECONDS -ge $deadline ]; then
      die "only $seen of $n nodes saw the whole fleet within 60 s; logs: $dir/host*.log"
    fi
    sleep 0.2 # poll interval; the deadline is above
  done
  echo "fleet \`$name\`: $n hosts up, every node sees all $n (files in $dir)"
  echo "  deploy/netns-fleet.sh status | cli I ARGS | exec I CMD | cut I | heal I | kill I | start I | down"
}

down() {
  need_root
  local n
  n=$(cat "$dir/count" 2>/dev/null || echo 0)
  for i in $(seq 1 "$n"); do
    [ -f "$dir/host$i.pid" ] && kill -TERM "$(cat "$dir/host$i.pid")" 2>/dev/null || true
  done
  local deadline=$((SECONDS + 10))
  for i in $(seq 1 "$n"); do
    local pid
    pid=$(cat "$dir/host$i.pid" 2>/dev/null || echo "")
    [ -n "$pid" ] || continue
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
      sleep 0.1 # poll interval; the deadline is above
    done
  done
  for i in $(seq 1 "$n"); do ip netns del "$(host_ns "$i")" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  # Only a directory this script made (it holds `count`) is removed, never another one that
  # FLEET_DIR happens to name.
  if [ -f "$dir/count" ]; then rm -rf "$dir"; fi
  echo "fleet \`$name\` is down"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
check_dir
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) count >/dev/null; need_root; cli_in 1 status ;;
  cli) [ $# -ge 1 ] || die "cli: give a host number"; check_host "$1"; need_root; cli_in "$@" ;;
  exec)
    [ $# -ge 2 ] || die "exec: give a host number and a command"
    check_host "$1"; need_root
    ns=$(host_ns "$1"); shift
    exec ip netns exec "$ns" "$@" ;;
  cut|heal)
    [ $# = 1 ] || die "$cmd: give one host number"
    check_host "$1"; need_root
    state=down; [ "$cmd" = heal ] && state=up
    ip -n "$hub" link set "p$1" "$state"
    echo "host$1's link is $state" ;;
  kill)
    [ $# -ge 1 ] || die "kill: give a host number"
    check_host "$1"; need_root
    kill -"${2:-KILL}" "$(cat "$dir/host$1.pid")" ;;
  start)
    [ $# = 1 ] || die "start: give one host number"
    check_host "$1"; need_root
    if kill -0 "$(cat "$dir/host$1.pid")" 2>/dev/null; then die "host$1's node is running"; fi
    start_node "$1"
    echo "host$1's node started" ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command \`$cmd\` (see --help)" ;;
esac
