#!/usr/bin/env bash
# Installs the published ACP SDK next to the ACP script, once, at the
# versions pinned by package-lock.json.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/@agentclientprotocol/sdk/package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm ci --no-audit --no-fund
