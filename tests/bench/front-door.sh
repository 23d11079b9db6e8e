#!/usr/bin/env bash
# Front-door benchmark: the same load generator (wrk, keep-alive, POST /v1/chat/completions) in
# the same run against
#   direct    a fixed-answer OpenAI backend (nginx returning one canned completion),
#   local     a node's front door whose model is that backend (the node calls it, streaming),
#   one hop   the front door of a node without models, which routes to the first over mTLS
#             gRPC (Models.Chat),
#   litellm   (with --litellm) a LiteLLM proxy on the same backend,
# then the other APIs through the same hop: POST /v1/responses (OpenAI Responses) and
# POST /v1/messages (Anthropic Messages), each translated to the same chat,
# and prints requests/s and latency percentiles of each, and what the front door adds to the
# direct p50/p99.
#
# Usage: tests/bench/front-door.sh [--duration S] [--connections N] [--threads T]
#                                  [--litellm DIR] [--litellm-workers N]
#   --duration S        seconds of load per target (default 10)
#   --connections N     wrk connections (default 8)
#   --threads T         wrk threads (default 1)
#   --litellm DIR       also measure a LiteLLM proxy from the virtualenv DIR
#                       (python3 -m venv DIR && DIR/bin/pip install 'litellm[proxy]')
#   --litellm-workers N LiteLLM's --num_workers (default 1)
# Needs wrk and nginx (Debian: apt-get install wrk nginx-light; done when run as root) and a
# release build (cargo build --release --bins). Everything listens on 127.0.0.1 only.
set -euo pipefail

duration=10 connections=8 threads=1 litellm="" litellm_workers=1
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --litellm) litellm=$2; shift 2 ;;
    --litellm-workers) litellm_workers=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "front-door.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/target/release"
for tool in wrk nginx; do
  if ! command -v $tool >/dev/null && [ -x /usr/sbin/$tool ]; then PATH="$PATH:/usr/sbin"; fi
  if ! command -v $tool >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get install -y -q wrk nginx-light >/dev/null
    else
      echo "front-door.sh: needs \`$tool\` (Debian: apt-get install wrk nginx-light)" >&2; exit 1
    fi
  fi
done
for b in mesh-node mesh-cli; do
  [ -x "$bin/$b" ] || { echo "front-door.sh: $bin/$b is missing: run cargo build --release --bins" >&2; exit 1; }
done

work=$(mktemp -d -t front-door-bench.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill -QUIT "$(cat "$work/nginx.pid")" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_until() { # seconds description command...: polls the command until it succeeds
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "front-door.sh: $what within $limit s" >&2; exit 1; fi
    sleep 0.1 # poll interval; the deadline is above
  done
}

# The backend: a streamed answer for nodes (they always stream), a plain one for LiteLLM and
# for the direct measurement.
backend_port=$(free_port)
chunk='{"id":"c","object":"chat.completion.chunk","created":0,"model":"fake","choices":[{"index":0,"delta":{"role":"assistant","content":"hello"},"finish_reason":null}]}'
last='{"id":"c","object":"chat.completion.chunk","created":0,"model":"fake","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}'
plain='{"id":"c","object":"chat.completion","created":0,"model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}'
mkdir -p "$work/nginx"
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx/error.log;
daemon on;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$backend_port;
    location = /sse/v1/chat/completions {
      default_type text/event-stream;
      return 200 'data: $chunk

data: $last

data: [DONE]

';
    }
    location = /plain/v1/chat/completions {
      default_type application/json;
      return 200 '$plain';
    }
    location / {
      default_type application/json;
      return 200 '{"object":"list","data":[{"id":"fake","object":"model"}]}';
    }
  }
}
CONF
nginx -c "$work/nginx.conf" -p "$work/nginx"

ca="$work/ca"
"$bin/mesh-cli" ca init --dir "$ca" >/dev/null
for name in gpu laptop; do "$bin/mesh-cli" ca issue --dir "$ca" --role node --name "$name" >/dev/null; done
start_node() { # name static_peers(toml list) extra_toml; sets $grpc and $http
  local name=$1 peers=$2 extra=$3 dir="$work/$1"
  mkdir -p "$dir"
  cat > "$work/$name.toml" <<TOML
[node]
name = "$name"
listen = "127.0.0.1:0"
data_dir = "$dir"

[discovery]
mdns = false
static_peers = $peers

[http]
listen = "127.0.0.1:0"

[tls]
ca = "$ca/ca.pem"
cert = "$ca/$name.pem"
key = "$ca/$name.key"
$extra
TOML
  RUST_LOG=warn "$bin/mesh-node" --config "$work/$name.toml" > "$work/$name.log" 2>&1 &
  pids+=($!)
  wait_until 30 "$name did not start (log: $work/$name.log)" test -s "$dir/http.addr"
  grpc=$(cat "$dir/node.addr") http=$(cat "$dir/http.addr")
}
start_node gpu "[]" "
[[models]]
name = \"fake\"
backend = \"openai\"
base_url = \"http://127.0.0.1:$backend_port/sse/v1\"
model = \"fake\"
"
gpu_http=$http gpu_grpc=$grpc
start_node laptop "[\"$gpu_grpc\"]" ""
laptop_http=$http

body='{"model":"fake","messages":[{"role":"user","content":"Say hello."}]}'
# Sent to every target (LiteLLM refuses to start without a master key; the others ignore it).
key="sk-front-door-bench"
post() { # url: one chat completion, fails unless it answers 200 with the canned text
  python3 - "$1" "$body" "$key" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(),
                             headers={"content-type": "application/json", "authorization": f"Bearer {sys.argv[3]}"})
answer = json.load(urllib.request.urlopen(req, timeout=5))
assert answer["choices"][0]["message"]["content"] == "hello", answer
PY
}
wait_until 30 "the laptop's front door did not reach gpu's model" post "http://$laptop_http/v1/chat/completions"
post "http://$gpu_http/v1/chat/completions"
post "http://127.0.0.1:$backend_port/plain/v1/chat/completions"

responses_body='{"model":"fake","input":"Say hello.","store":false}'
messages_body='{"model":"fake","max_tokens":16,"messages":[{"role":"user","content":"Say hello."}]}'
# name|url|body of each measurement (the first is the reference for "+p99").
targets=("direct|http://127.0.0.1:$backend_port/plain/v1/chat/completions|$body"
         "local|http://$gpu_http/v1/chat/completions|$body"
         "one hop|http://$laptop_http/v1/chat/completions|$body"
         "responses, one hop|http://$laptop_http/v1/responses|$responses_body"
         "messages, one hop|http://$laptop_http/v1/messages|$messages_body")

lua() { # body: a wrk script posting it
  cat <<LUA
wrk.method = "POST"
wrk.body = '$1'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
wrk.headers["anthropic-version"] = "2023-06-01"
LUA
}

# wrk's latency lines ("50%  123.00us") in milliseconds.
to_ms() { awk '{ v=$2; u=v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
  f = (u=="us") ? 0.001 : (u=="ms") ? 1 : (u=="s") ? 1000 : (u=="m") ? 60000 : 0; printf "%.3f", v*f }'; }

echo "wrk -t$threads -c$connections -d${duration}s --latency, POST; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %10s %9s %9s %9s %9s %7s %8s\n' target "req/s" "p50 ms" "p90 ms" "p99 ms" "+p99 ms" "steal" errors
# CPU time the hypervisor took from this VM (the `steal` column of /proc/stat), as a share of all
# CPU time: runs with much steal measure the host, not agentmesh.
cpu_times() { awk '/^cpu / {print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
direct_p99=""
measure() { # name url body: one wrk run, one table row
  local name=$1 url=$2 out rps p50 p90 p99 errors added before after steal
  lua "$3" > "$work/post.lua"
  before=$(cpu_times)
  out=$(wrk -t"$threads" -c"$connections" -d"${duration}s" --latency -s "$work/post.lua" "$url")
  rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
  p50=$(echo "$out" | grep -E '^ +50%' | to_ms)
  p90=$(echo "$out" | grep -E '^ +90%' | to_ms)
  p99=$(echo "$out" | grep -E '^ +99%' | to_ms)
  after=$(cpu_times)
  steal=$(echo "$before $after" | awk '{ d = $4 - $2; printf "%.0f%%", (d > 0 ? 100 * ($3 - $1) / d : 0) }')
  errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {e=e $0 "; "} END {print (e=="" ? "0" : e)}')
  [ -n "$direct_p99" ] || direct_p99=$p99
  added=$(awk -v a="$p99" -v b="$direct_p99" 'BEGIN {printf "%.3f", a-b}')
  printf '%-22s %10s %9s %9s %9s %9s %7s %8s\n' "$name" "$rps" "$p50" "$p90" "$p99" "$added" "$steal" "$errors"
}
for target in "${targets[@]}"; do
  IFS='|' read -r name url request <<< "$target"
  measure "$name" "$url" "$request"
done

# LiteLLM last, so that its process is not running beside the others' measurements.
if [ -n "$litellm" ]; then
  [ -x "$litellm/bin/litellm" ] || { echo "front-door.sh: no $litellm/bin/litellm (pip install 'litellm[proxy]' into that venv)" >&2; exit 1; }
  litellm_port=$(free_port)
  cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: fake
    litellm_params:
      model: openai/fake
      api_base: http://127.0.0.1:$backend_port/plain/v1
      api_key: none
general_settings:
  master_key: $key
YAML
  "$litellm/bin/litellm" --config "$work/litellm.yaml" --host 127.0.0.1 --port "$litellm_port" \
    --num_workers "$litellm_workers" > "$work/litellm.log" 2>&1 &
  pids+=($!)
  wait_until 180 "LiteLLM did not answer (log: $work/litellm.log)" post "http://127.0.0.1:$litellm_port/v1/chat/completions"
  measure "litellm, $litellm_workers worker(s)" "http://127.0.0.1:$litellm_port/v1/chat/completions" "$body"
fi

