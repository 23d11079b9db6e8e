#!/usr/bin/env bash
# The agentmesh demo: builds, fetches the embedded model if missing, and starts a local 3-node
# mesh joined with tokens, as the README's "Three devices in ten minutes" does on real devices
# (each node a "device" with a home of its own here), then walks through what the mesh does,
# printing each step:
#   server  a home server with no models: its node makes the mesh's CA (the issuer) and hosts
#           an MCP server (deploy/mcp-sysinfo.py)
#   gpu     a GPU box: serves role `chat` with the embedded SmolLM2-135M model, declares a GPU
#   laptop  no models at all; the demo's mesh-cli runs here, with a certificate from a token
# 1. `mesh-cli status` of the fleet; 2. a task asked of the laptop runs on gpu's model;
# 3. the laptop's OpenAI-compatible front door lists and reaches gpu's model; 4. a cron schedule
# added on server fires on gpu; 5. a memory write on the laptop is read on server and gpu;
# 6. a task asked of the laptop has gpu's model call the MCP tool server hosts, after a person
#    approves the call (gpu's [approval] policy); with --once it is approved automatically.
#
# mDNS never touches this machine's real interfaces: as root the nodes run inside a network
# namespace made for the demo, with real mDNS on its loopback; otherwise mDNS is off and gpu
# and laptop find server by dialing the issuer their token names (and each other through it).
#
# Usage: deploy/demo.sh [--once]
#   --once   run the steps, approving step 6's call automatically, then stop the mesh
#            (default: you approve it at the prompt; the mesh keeps running until Ctrl-C)
# Environment: DEMO_DIR (work dir; default a new temp dir; run again on the same one, the
# devices keep their certificates), CARGO_PROFILE (debug|release, default debug).
set -euo pipefail

once=false
case "${1:-}" in
  --once) once=true ;;
  "") ;;
  -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: deploy/demo.sh [--once]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
profile=${CARGO_PROFILE:-debug}
if [ "$profile" = release ]; then build_flags=(--release); else build_flags=(); fi
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold="" plain=""; fi
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$plain"; }
say() { printf '    %s\n' "$*"; }

# Building mesh-node needs cmake, a C++ compiler and libclang (llama.cpp, for the embedded
# model backend); deploy/test.sh --setup-build installs them. The demo itself needs python3 with
# its standard library only: no Python packages (those are the tests', in target/venv).
step "setup: build packages (deploy/test.sh --setup-build) and the embedded model"
"$root/deploy/test.sh" --setup-build
# Its messages (downloading, or already there) and errors go to the terminal.
model=$("$root/deploy/fetch-model.sh" | tail -n 1)
say "model: $model"
step "building mesh-node and mesh-cli ($profile)"
(cd "$root" && cargo build --bins "${build_flags[@]}" --quiet)
bin="$root/target/$profile"

work=${DEMO_DIR:-$(mktemp -d -t agentmesh-demo.XXXXXX)}
mkdir -p "$work"
say "demo files (configs, data dirs, logs) in $work"

ns=""
in_ns=()   # the command prefix that runs a program inside the demo namespace (empty: no namespace)
run() { "${in_ns[@]}" "$@"; }
pids=()
sleeper=""
cleanup() {
  if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null || true; fi
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
else
  mdns=false
fi

# Each device has a home of its own, as on real machines: a node with no [tls] in its config
# keeps its certificates (and, on the first device, the mesh's CA) in its default data dir,
# ~/.local/share/agentmesh, and mesh-cli finds its own in ~/.config/agentmesh. `on NAME` sets
# $cmd to the prefix that runs a program on that device: its HOME, the built binaries first on
# PATH, the demo's namespace, and none of the caller's MESH_* or XDG_* settings.
on() {
  cmd=(env -u XDG_DATA_HOME -u XDG_CONFIG_HOME -u MESH_NODE -u MESH_CA -u MESH_CERT -u MESH_KEY
      -u MESH_JOIN_TOKEN -u MESH_NODE_CONFIG HOME="$work/$1" PATH="$bin:$PATH" "${in_ns[@]}")
}
data_dir() { echo "$work/$1/.local/share/agentmesh"; }

# gpu: the GPU box, the only node with a model. `threads = 1` keeps llama.cpp from spinning
# both cores of a small machine; a real GPU box would leave it at the default.
extra_gpu="
[node]
roles = [\"chat\"]

[[resources.gpus]]
name = \"RTX 4090\"
vram_mb = 24576

[[models]]
name = \"smollm2-135m\"
backend = \"embedded\"
path = \"$model\"
threads = 1

[roles]
chat = [\"smollm2-135m\"]

[approval]
servers = [\"sysinfo\"]
timeout_s = 300
"

# server: a home server hosting an MCP server over stdio (standard library Python only); its
# tool counts as `read`, so any node's tasks may call it.
extra_server="
[[mcp]]
name = \"sysinfo\"
command = \"python3\"
args = [\"$root/deploy/mcp-sysinfo.py\"]
tier = \"read\"
"

start_node() { # name extra_toml [mesh-node args...]: starts its node, waits until it listens
  local name=$1 extra=$2 dir; shift 2
  dir=$(data_dir "$name")
  mkdir -p "$work/$name" "$dir"
  rm -f "$dir/node.addr" "$dir/http.addr"
  {
    echo "[node]"
    echo "name = \"$name\""
    echo "listen = \"127.0.0.1:0\""
    echo "$extra" | sed -n '/^\[node\]/,/^$/p' | sed '1d'
    echo "[discovery]"
    echo "mdns = $mdns"
    # Without mDNS a joined node dials the issuer its token named; a DEMO_DIR used again has
    # the issuer on a new port, so the configs name it too.
    if [ -n "$issuer" ]; then echo "static_peers = [\"$issuer\"]"; fi
    echo "[http]"
    echo "listen = \"127.0.0.1:0\""
    echo "$extra" | sed '/^\[node\]/,/^$/d'
  } > "$work/$name.toml"
  on "$name"
  # Not through a function: a backgrounded function would leave $! pointing at a subshell.
  "${cmd[@]}" mesh-node --config "$work/$name.toml" "$@" > "$work/$name.log" 2>&1 &
  pids+=($!)
  local deadline=$((SECONDS + 60))
  until [ -s "$dir/node.addr" ] && [ -s "$dir/http.addr" ]; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "error: $name did not start; its log:" >&2; cat "$work/$name.log" >&2; exit 1
    fi
    sleep 0.1 # poll interval; the deadline is above
  done
}

# Shows a command as a person types it on device NAME (a token shortened).
show() { # name command...
  local name=$1; shift
  say "$(printf '%-6s' "$name") \$ $(echo "$*" | sed -E 's/(agentmesh-join:)[^ ]*/\1…/g')"
}

if $mdns; then
  step "3 devices in network namespace $ns, joined with tokens; they find each other by mDNS on its loopback"
else
  step "3 devices on 127.0.0.1, joined with tokens (not root: mDNS off; gpu and laptop dial the issuer)"
fi
say "(each its own HOME in $work; the nodes' configs set ports and the demo's models and tools)"
say "server \$ mesh-node --config server.toml &      # no [tls]: its node makes the mesh's CA"
issuer=""
start_node server "$extra_server"
$mdns || issuer=$(cat "$(data_dir server)/node.addr")
show server mesh-cli token create --uses 2
on server; node_token=$("${cmd[@]}" mesh-cli token create --uses 2 2>/dev/null)
for name in gpu laptop; do
  extra=""; [ "$name" = gpu ] && extra=$extra_gpu
  say "$(printf '%-6s' "$name") \$ mesh-node --config $name.toml --join agentmesh-join:… &"
  start_node "$name" "$extra" --join "$node_token"
done
# The laptop's mesh-cli gets its own certificate once (join refuses to overwrite it).
if [ ! -f "$work/laptop/.config/agentmesh/mesh-cli.pem" ]; then
  show server mesh-cli token create --role client
  on server; cli_token=$("${cmd[@]}" mesh-cli token create --role client 2>/dev/null)
  show laptop mesh-cli join --name laptop-cli "$cli_token"
  on laptop; "${cmd[@]}" mesh-cli join --name laptop-cli "$cli_token" | head -n 1 | sed 's/^/    /'
fi
for name in server gpu laptop; do
  say "$(printf '%-6s' "$name") gRPC $(cat "$(data_dir "$name")/node.addr")   OpenAI API http://$(cat "$(data_dir "$name")/http.addr")/v1   log $work/$name.log"
done
laptop_http=$(cat "$(data_dir laptop)/http.addr")

cli() { # args...: mesh-cli on the laptop, with the certificate it joined with
  on laptop
  "${cmd[@]}" mesh-cli "$@"
}
# Reads JSON on stdin and prints the result of a Python expression over it (`j`).
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

deadline=$((SECONDS + 60))
until [ "$(cli status --json 2>/dev/null | grep -c '"state": "up"')" = 3 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "error: the mesh did not form within 60 s; logs are in $work" >&2
    cli status >&2 || true
    exit 1
  fi
  sleep 0.2 # poll interval; the deadline is above
done

step "1/6 the fleet, as the laptop sees it: mesh-cli status"
cli status | sed 's/^/    /'

question="What is the capital of France? Answer in one word."
step "2/6 a task asked of the laptop (no models) runs where it fits: on gpu's embedded model"
say "\$ mesh-cli run --role chat --explain \"$question\""
cli run --role chat --explain "$question" | sed 's/^/    /'
say "\$ mesh-cli run --role chat --json \"$question\""
result=$(cli run --role chat --json "$question")
say "executed on: $(echo "$result" | json 'j["executed_on"]')   status: $(echo "$result" | json 'j["status"]')"
say "answer:      $(echo "$result" | json 'j["output"].strip()')"

step "3/6 the laptop's OpenAI-compatible front door reaches every model in the fleet"
say "GET http://$laptop_http/v1/models"
run python3 - "$laptop_http" <<'EOF'
import json, sys, urllib.request
base = f"http://{sys.argv[1]}/v1"
models = json.load(urllib.request.urlopen(f"{base}/models", timeout=30))
print("    models:", ", ".join(m["id"] for m in models["data"]))
body = json.dumps({"model": "smollm2-135m", "max_tokens": 32,
                   "messages": [{"role": "user", "content": "Say hello in five words."}]})
print('    POST /v1/chat/completions {"model": "smollm2-135m", ...}')
request = urllib.request.Request(f"{base}/chat/completions", data=body.encode(),
                                 headers={"content-type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=120))
print("    answer:", answer["choices"][0]["message"]["content"].strip())
EOF

step "4/6 a cron schedule added on server fires on gpu (the only node serving role chat)"
say "\$ mesh-cli --node server cron add --name demo-hello --schedule \"*/5 * * * * *\" --role chat \"Say hello.\""
cli --node server cron add --name demo-hello --schedule "*/5 * * * * *" --role chat "Say hello." | sed 's/^/    /'
deadline=$((SECONDS + 90))
firing=""
until [ -n "$firing" ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "error: the schedule did not complete a firing within 90 s; logs are in $work" >&2
    cli --node server cron history demo-hello >&2 || true
    exit 1
  fi
  sleep 0.5 # poll interval; the deadline is above
  firing=$(cli --node server cron history demo-hello --json 2>/dev/null |
    python3 -c '
import json, sys
for f in json.load(sys.stdin):
    if f["status"] == "done":
        print("fired at %s, owned by %s, executed on %s: %s"
              % (f["scheduled_at"], f["owner"], f["executed_on"], f["status"]))' || true)
done
echo "$firing" | head -n 1 | sed 's/^/    /'
cli --node server cron rm demo-hello >/dev/null
say "(schedule removed)"

step "5/6 shared memory: written on the laptop, read on server and gpu"
say "\$ mesh-cli memory put notes greeting \"hello from the laptop\""
cli memory put notes greeting "hello from the laptop" | sed 's/^/    /'
for name in server gpu; do
  deadline=$((SECONDS + 10))
  until value=$(cli --node "$name" memory get notes greeting 2>/dev/null); do
    if [ $SECONDS -ge $deadline ]; then
      echo "error: $name did not receive the write within 10 s" >&2; exit 1
    fi
    sleep 0.05 # poll interval; the deadline is above
  done
  say "\$ mesh-cli --node $(printf '%-6s' "$name") memory get notes greeting    # -> $value"
done

step "6/6 an MCP tool on another node, after a person's approval"
say "server hosts an MCP server (deploy/mcp-sysinfo.py) with one tool, sysinfo__status; every node's"
say "tasks are offered it. gpu's policy ([approval] servers = [\"sysinfo\"]) holds each call until a"
say "person approves it, from any node. --tool makes the small model call it in its first round."
deadline=$((SECONDS + 60))
until cli --node gpu status --json 2>/dev/null | grep -q '"sysinfo__status"'; do
  if [ $SECONDS -ge $deadline ]; then
    echo "error: gpu does not see server's MCP tool within 60 s; server's log: $work/server.log" >&2; exit 1
  fi
  sleep 0.2 # poll interval; the deadline is above
done
say "\$ mesh-cli nodes show server    # (its MCP tools)"
cli nodes show server | sed -n '/^mcp tools:/,$p' | sed 's/^/    /'
ask="How is the home server doing? Answer in one sentence."
say "\$ mesh-cli run --role chat --tool sysinfo__status \"$ask\""
if ! $once && [ -t 0 ] && [ -t 2 ]; then
  say "(mesh-cli asks you below: type y to approve the call, anything else to deny it)"
  cli run --role chat --tool sysinfo__status "$ask"
else
  out="$work/step6.out"
  cli run --role chat --tool sysinfo__status "$ask" </dev/null >"$out" 2>&1 &
  runner=$!
  deadline=$((SECONDS + 120))
  id=""
  until [ -n "$id" ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "error: no call waited for approval within 120 s; logs are in $work" >&2; cat "$out" >&2; exit 1
    fi
    sleep 0.2 # poll interval; the deadline is above
    id=$(cli approvals ls --json 2>/dev/null |
      json 'j["approvals"][0]["approval_id"] if j["approvals"] else ""' || true)
  done
  say "\$ mesh-cli approvals ls"
  cli approvals ls | sed 's/^/    /'
  if $once; then why="--once mode"; else why="no terminal to ask in"; fi
  say "\$ mesh-cli approvals approve $id    # approved automatically: $why"
  cli approvals approve "$id" | sed 's/^/    /'
  if ! wait "$runner"; then
    echo "error: the task failed; what mesh-cli printed:" >&2; cat "$out" >&2; exit 1
  fi
  sed 's/^/    /' "$out"
fi

if $once; then
  step "done; stopping the mesh"
  exit 0
fi
prefix=""; [ -n "$ns" ] && prefix="ip netns exec $ns "
step "the mesh keeps running; Ctrl-C stops it. In another terminal:"
cat <<EOF
    ${prefix}env HOME=$work/laptop $bin/mesh-cli status      # the laptop's mesh-cli
    ${prefix}curl http://$laptop_http/v1/models
EOF
while true; do sleep 3600 & sleeper=$!; wait $sleeper; done
