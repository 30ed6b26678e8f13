#!/usr/bin/env bash
# Makes sure a headless Chromium is on the machine (Debian's `chromium` package), for PNG/SVG figure
# export through kaleido >= 1 and for the dashboard's browser test. Idempotent; never fails the
# set-up: where it cannot install (no root, no apt, no registry) it prints one line saying why,
# and the tests that need a browser say so when they skip.
set -uo pipefail
for c in "${BROWSER_PATH:-}" chromium chromium-browser google-chrome google-chrome-stable; do
  [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && { echo "chromium: $(command -v "$c")"; exit 0; }
done
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "chromium: not installed and no root to install it (apt-get install chromium); browser tests will skip"; exit 0; fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium: not installed and no apt-get here; install Chromium/Chrome or set BROWSER_PATH"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q chromium >/tmp/tlcap-chromium.log 2>&1; then
  $SUDO apt-get update -q >>/tmp/tlcap-chromium.log 2>&1 || true
  $SUDO apt-get install -y -q chromium >>/tmp/tlcap-chromium.log 2>&1 || {
    echo "chromium: apt-get install chromium failed (see /tmp/tlcap-chromium.log); browser tests will skip"; exit 0; }
fi
echo "chromium: $(command -v chromium) (installed from Debian's packages)"
