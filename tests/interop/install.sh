#!/usr/bin/env bash
# Installs the published pi client (v1) next to the interop script, once,
# at the versions pinned by package-lock.json.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/@earendil-works/pi-client/package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm ci --no-audit --no-fund
