#!/usr/bin/env bash
# Runs every agentmesh test, installing what the tests need first:
#   - iproute2 (`ip`): the mDNS and multi-host tests build network namespaces, so mDNS never
#     leaves on this machine's real interfaces (needs root);
#   - python-zeroconf: a third-party mDNS client that must see our adverts;
#   - the official `openai` Python package, a real client of the front door.
# Usage: deploy/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v ip >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
  else
    echo "warning: \`ip\` (iproute2) is missing; the namespace tests will fail" >&2
  fi
fi
if ! python3 -c 'import zeroconf, openai' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check zeroconf openai
fi
if [ "$(id -u)" != 0 ]; then
  echo "note: not root: the mDNS and multi-host tests need network namespaces and will fail; run as root (CI does)" >&2
fi

exec cargo test --workspace "$@"
