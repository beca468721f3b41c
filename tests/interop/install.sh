#!/usr/bin/env bash
# Installs the published pi client (v1) next to the interop script, once.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/@earendil-works/pi-client/package.json ]; then
  exit 0
fi
npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm install --no-audit --no-fund
