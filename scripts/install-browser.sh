#!/usr/bin/env bash
# Headless Chromium for the report's browser test: Debian's package, driven by Playwright's
# Python package through executable_path (no browser download).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
else
  echo "chromium is not installed and this user cannot apt-get it; the browser test will fail." >&2
  echo "Install Debian's 'chromium' package (sudo apt-get install chromium) and rerun." >&2
  exit 1
fi
