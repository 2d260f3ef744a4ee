#!/usr/bin/env bash
# The HTML plan pages are tested in a real headless browser: install Debian's Chromium when it is
# missing (root, as on the development and CI machines), or say how to.
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "graphamp tests need Chromium: sudo apt-get install chromium" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
