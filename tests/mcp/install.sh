#!/usr/bin/env bash
# Installs the reference MCP servers next to this script, once, at the
# versions pinned by package-lock.json.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/@modelcontextprotocol/server-everything/package.json ] &&
  [ -f node_modules/@modelcontextprotocol/server-filesystem/package.json ]; then
  exit 0
fi
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || npm ci --no-audit --no-fund
else
  npm install --no-audit --no-fund --loglevel=error
fi
