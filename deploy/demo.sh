#!/usr/bin/env bash
# Starts a local 3-node agentmesh (alpha, beta, gamma) with its own mesh CA and prints
# `mesh-cli status`. mDNS never touches this machine's real interfaces:
#   - as root: the nodes run inside a network namespace made for the demo, with real mDNS on
#     its loopback;
#   - otherwise: mDNS is off and beta and gamma find alpha through a static peer on loopback
#     (and each other through alpha).
#
# Usage: deploy/demo.sh [--once]
#   --once   print the status and stop the mesh (default: keep it running until Ctrl-C)
# Environment: DEMO_DIR (work dir; default a new temp dir), CARGO_PROFILE (debug|release).
set -euo pipefail

once=false
case "${1:-}" in
  --once) once=true ;;
  "") ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: deploy/demo.sh [--once]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
profile=${CARGO_PROFILE:-debug}
if [ "$profile" = release ]; then build_flags=(--release); else build_flags=(); fi
# Building mesh-node needs cmake, a C++ compiler and libclang (llama.cpp, for the embedded
# model backend); deploy/test.sh --setup-only installs them (and fetches the default model).
"$root/deploy/test.sh" --setup-only
echo "==> building mesh-node and mesh-cli ($profile)"
(cd "$root" && cargo build --bins "${build_flags[@]}" --quiet)
bin="$root/target/$profile"

work=${DEMO_DIR:-$(mktemp -d -t agentmesh-demo.XXXXXX)}
mkdir -p "$work"
echo "==> demo files in $work"

ns=""
in_ns=()   # the command prefix that runs a program inside the demo namespace (empty: no namespace)
run() { "${in_ns[@]}" "$@"; }
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$ns" ]; then ip netns del "$ns" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 0' INT TERM

if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  ns="agentmesh-demo-$$"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  in_ns=(ip netns exec "$ns")
  mdns=true
  echo "==> running as root: nodes live in network namespace $ns, discovering each other by mDNS"
else
  mdns=false
  echo "==> not root: mDNS off; beta and gamma dial alpha as a static peer on 127.0.0.1"
fi

ca="$work/ca"
if [ ! -f "$ca/ca.pem" ]; then
  "$bin/mesh-cli" ca init --dir "$ca" >/dev/null
  for name in alpha beta gamma mesh-cli; do
    "$bin/mesh-cli" ca issue --dir "$ca" --name "$name" >/dev/null
  done
fi

# alpha: a GPU box serving coder and chat; beta: a home server; gamma: a laptop with no models.
extra_alpha='
[node]
roles = ["chat"]

[[resources.gpus]]
name = "RTX 4090"
vram_mb = 24576

[[models]]
name = "qwen-coder"
backend = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "qwen2.5-coder:7b"

[roles]
coder = ["qwen-coder"]
'
extra_beta='
[node]
roles = ["research"]

[[resources.gpus]]
name = "RTX 3060"
vram_mb = 12288
'

start_node() { # name static_peer extra_toml; sets $started to the address it listens on
  local name=$1 peer=$2 extra=$3 dir="$work/$1"
  mkdir -p "$dir"
  rm -f "$dir/node.addr"
  {
    echo "[node]"
    echo "name = \"$name\""
    echo "listen = \"127.0.0.1:0\""
    echo "data_dir = \"$dir\""
    echo "$extra" | sed -n '/^\[node\]/,/^$/p' | sed '1d'
    echo "[discovery]"
    echo "mdns = $mdns"
    if [ -n "$peer" ]; then echo "static_peers = [\"$peer\"]"; fi
    echo "[tls]"
    echo "ca = \"$ca/ca.pem\""
    echo "cert = \"$ca/$name.pem\""
    echo "key = \"$ca/$name.key\""
    echo "$extra" | sed '/^\[node\]/,/^$/d'
  } > "$work/$name.toml"
  # Not through `run`: a backgrounded function would leave $! pointing at a subshell.
  "${in_ns[@]}" "$bin/mesh-node" --config "$work/$name.toml" > "$work/$name.log" 2>&1 &
  pids+=($!)
  local deadline=$((SECONDS + 30))
  until [ -s "$dir/node.addr" ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "error: $name did not start; its log:" >&2; cat "$work/$name.log" >&2; exit 1
    fi
    sleep 0.1
  done
  started=$(cat "$dir/node.addr")
}

start_node alpha "" "$extra_alpha"; alpha=$started
peer=""; [ "$mdns" = true ] || peer=$alpha
start_node beta "$peer" "$extra_beta"; beta=$started
start_node gamma "$peer" ""; gamma=$started
echo "==> alpha $alpha, beta $beta, gamma $gamma"

cli=("$bin/mesh-cli" --node "$gamma" --ca "$ca/ca.pem" --cert "$ca/mesh-cli.pem" --key "$ca/mesh-cli.key")
echo "==> waiting for every node to see the other two"
deadline=$((SECONDS + 30))
until [ "$(run "${cli[@]}" status --json 2>/dev/null | grep -c '"state": "up"')" = 3 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "error: the mesh did not form within 30 s; logs are in $work" >&2
    run "${cli[@]}" status >&2 || true
    exit 1
  fi
  sleep 0.2
done

echo
run "${cli[@]}" status
echo

if $once; then
  exit 0
fi
prefix=""; [ -n "$ns" ] && prefix="ip netns exec $ns "
cat <<EOF
The mesh is running. In another terminal:
  ${prefix}${cli[*]} status
  ${prefix}${cli[*]} nodes show alpha
Node logs: $work/*.log. Press Ctrl-C to stop the mesh.
EOF
while true; do sleep 3600 & wait $!; done
