#!/usr/bin/env bash
# A real Chromium for the console's browser test: Debian `chromium` + `chromium-driver`, and
# `fonts-noto-cjk` so the screenshots show 記憶 and 区切り instead of boxes, installed with apt-get
# when missing. Prints the versions; the test finds /usr/bin/chromium and /usr/bin/chromedriver
# (or $KIOKU_CHROMIUM / $KIOKU_CHROMEDRIVER) and drives them with selenium.
#
#     .ci/chromium.sh
set -euo pipefail

say() { echo "chromium.sh: $*" >&2; }

need=()
command -v "${KIOKU_CHROMIUM:-chromium}" >/dev/null 2>&1 || need+=(chromium)
command -v "${KIOKU_CHROMEDRIVER:-chromedriver}" >/dev/null 2>&1 || need+=(chromium-driver)
fc-list :lang=ja family 2>/dev/null | grep -q CJK || need+=(fonts-noto-cjk)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${need[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${need[@]}" >&2; }
fi
python -c "import selenium" 2>/dev/null || { say "installing selenium (pip)"; python -m pip install -q 'selenium>=4.20' >&2; }

"${KIOKU_CHROMIUM:-chromium}" --version >&2
"${KIOKU_CHROMEDRIVER:-chromedriver}" --version >&2
fc-list :lang=ja family | grep CJK | head -1 >&2
