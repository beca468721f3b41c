#!/usr/bin/env bash
# Installs playwright-core next to the browser test script, once, at the
# version pinned by package-lock.json. The browser is Debian's chromium
# (`apt-get install chromium`; .ci/run does it), not a downloaded one.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/playwright-core/package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm ci --no-audit --no-fund
