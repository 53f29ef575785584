#!/usr/bin/env bash
# Runs a benchmark suite in release mode against a throwaway PostgreSQL and a moto S3 server
# (started here, stopped on exit), SQLite files and a local object store in a temp directory.
#   ./scripts/bench.sh metadata [--seconds 5] [--json] ...
#   ./scripts/bench.sh s3stream [--seconds 5] [--json] ...
#   ./scripts/bench.sh flight | kafka | kv | cluster | lake | sql-tail [--json] ...
#   ./scripts/bench.sh tpch [--scale 1] [--iterations 3] [--queries 1,6] [--json]
#   ./scripts/bench.sh produce|consume|e2e --flight HOST:PORT | --kafka HOST:PORT [...]
#   ./scripts/bench.sh sql --flight-sql HOST:PORT --query "SELECT ..." [...]
#     (against a running cluster or any Kafka broker: nothing is started here)
# Builds only the benchmark crate (-p mink-bench) into the shared target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mink/target}"
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=scripts/lib/python.sh
source scripts/lib/python.sh

suite="${1:-metadata}"
shift || true
cargo build --release --locked -p mink-bench
case "$suite" in
  produce | consume | e2e | sql) exec "$CARGO_TARGET_DIR/release/mink-bench" "$suite" "$@" ;;
esac
trap 'stop_moto; stop_postgres' EXIT
if start_postgres; then
  export MINK_BENCH_POSTGRES_URL="$MINK_TEST_POSTGRES_URL"
fi
if ensure_venv && start_moto; then
  export MINK_BENCH_S3_ENDPOINT="$MINK_TEST_S3_ENDPOINT" MINK_BENCH_S3_BUCKET="$MINK_TEST_S3_BUCKET"
  # The kafka suite measures the CPU moto spends serving (its catch-up bound).
  export MINK_BENCH_MOTO_PID="$MINK_MOTO_PID"
fi
"$CARGO_TARGET_DIR/release/mink-bench" "$suite" "$@"
