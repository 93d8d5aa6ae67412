#!/usr/bin/env bash
# A real SillyTavern 1.12.6 for tests/test_sillytavern*.py: unpacks the unmodified snapshot in
# ../shared/clients/, runs `npm install` and writes an offline config.yaml. The prepared tree is
# cached under ~/.cache/kioku/sillytavern/<tarball sha>/, so a second run costs nothing (npm's
# own cache, ~/.npm, also makes a fresh install quick).
# Prints the folder on stdout (the test reads it from $KIOKU_SILLYTAVERN):
#
#     export KIOKU_SILLYTAVERN="$(bash .ci/sillytavern.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "sillytavern.sh: $*" >&2; }

tarball="${KIOKU_SILLYTAVERN_TARBALL:-${KIOKU_SHARED:-../shared}/clients/sillytavern-1.12.6.tar.gz}"
[ -f "$tarball" ] || { say "no snapshot at $tarball"; exit 1; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "installing nodejs and npm (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q nodejs npm >&2 || { apt-get update -q >&2 && apt-get install -y -q nodejs npm >&2; }
fi

sha="$(sha256sum "$tarball" | cut -c1-16)"
home="${KIOKU_CACHE:-$HOME/.cache/kioku}/sillytavern/$sha"
root="$home/sillytavern"

if [ ! -d "$root/node_modules" ]; then
    say "preparing SillyTavern in $home (npm install: a few minutes on 2 cores)"
    rm -rf "$home.partial"
    mkdir -p "$home.partial"
    tar xzf "$tarball" -C "$home.partial"
    (cd "$home.partial/sillytavern" && npm install --no-audit --no-fund --loglevel=error >&2)
    # offline: no browser opened, no downloads, no update checks; whitelist on, loopback only
    python3 - "$home.partial/sillytavern/config.yaml" <<'EOF'
import re
import sys

path = sys.argv[1]
text = open(path, encoding="utf-8").read()
wanted = {
    "listen": "false",
    "whitelistMode": "true",
    "autorun": "false",
    "enableExtensionsAutoUpdate": "false",
    "enableDownloadableTokenizers": "false",
}
for key, value in wanted.items():
    text, n = re.subn(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M)
    assert n == 1, f"config.yaml has no {key}"
text, n = re.subn(r"^(\s+)disableAutoDownload:.*$", r"\1disableAutoDownload: true", text, flags=re.M)
assert n == 1, "config.yaml has no extras.disableAutoDownload"
open(path, "w", encoding="utf-8").write(text)
EOF
    rm -rf "$home"
    mv "$home.partial" "$home"
fi

# the tree stays as unpacked (a fresh SillyTavern): each test installs the extension into a data
# folder of its own, as docs/sillytavern.md says
rm -rf "$root/data/default-user/extensions/kioku"

say "SillyTavern $(node -p "require('$root/package.json').version") ready (node $(node --version))"
echo "$root"
