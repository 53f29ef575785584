#!/usr/bin/env bash
# Runs a benchmark suite in release mode against a throwaway PostgreSQL (started here, stopped
# on exit) and SQLite files in a temporary directory.
#   ./scripts/bench.sh metadata [--seconds 5] [--json] ...
# Builds only the benchmark crate (-p mink-bench) into the shared target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mink/target}"
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh

suite="${1:-metadata}"
shift || true
cargo build --release --locked -p mink-bench
trap stop_postgres EXIT
if start_postgres; then
  export MINK_BENCH_POSTGRES_URL="$MINK_TEST_POSTGRES_URL"
fi
"$CARGO_TARGET_DIR/release/mink-bench" "$suite" "$@"
