#!/usr/bin/env bash
# Installs the published pi client for protocol v8 (@earendil-works/pi-client,
# chord and pi-protocol 0.85.1) next to seed.mjs, once, at the versions pinned
# by package-lock.json.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/@earendil-works/pi-client/package.json ] &&
  [ -f node_modules/@earendil-works/chord/package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm ci --no-audit --no-fund
