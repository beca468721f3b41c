#!/usr/bin/env bash
# Profiles the server process during one benchmark with perf (software clock,
# DWARF call graphs) and prints where its time goes.
#
#   bench/profile.sh <which> [more benchmarks...]
#
# Env as for the bench (BENCH_QUICK, BENCH_ROUNDS, BENCH_FANOUT_K, PI_SERVER_BIN).
# The raw data stays in $CARGO_TARGET_DIR/bench-perf/server-<pid>.data.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
rm -rf "$target/bench-perf"
BENCH_PERF=1 cargo run --release -p bench -- "$@"
for data in "$target"/bench-perf/*.data; do
  echo "== $data: by shared object"
  perf report -i "$data" --no-children --sort dso -g none --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -5
  echo "== $data: top functions (self time)"
  perf report -i "$data" --no-children --sort symbol -g none --stdio 2>/dev/null |
    grep -E '^ +[0-9]' | sed -E 's/ +- +- *$//' | head -25 | cut -c1-150
  echo "== $data: pi-server functions (inclusive time)"
  perf report -i "$data" --children --sort symbol -g none --stdio 2>/dev/null |
    grep -E '^ +[0-9]' | grep -E 'kernel::|pi_daemon::|pi_agent::|pi_store::' | sed -E 's/ +- +- *$//' | head -25 | cut -c1-150
done
