#!/usr/bin/env bash
# Runs Mink's whole test suite on a fresh machine: formatting, the dependency-set check, and
# every test, built with clippy's lints denied, with cargo-nextest against SQLite (file and
# in-memory) and a throwaway PostgreSQL and a moto S3 server (from a pinned virtualenv) that
# this script starts on free loopback ports and stops on exit.
#
# Environment:
#   CARGO_TARGET_DIR  build directory (default: ~/.cache/mink/target, outside the clone)
#   CI=true           a missing service fails the run instead of skipping its tests
#   MINK_TEST_BACKTRACE=1  backtraces of failing tests (off: a failure's message ends the log)
#   extra arguments   are passed to `cargo nextest run` (for example a test filter)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mink/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-auto}"
# shellcheck source=scripts/lib/postgres.sh
source scripts/lib/postgres.sh
# shellcheck source=scripts/lib/python.sh
source scripts/lib/python.sh

started=$(date +%s)
step() { printf '\n==> %s (%ss)\n' "$1" "$(($(date +%s) - started))"; }

if ! command -v cargo-nextest >/dev/null 2>&1; then
  step "installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

step "disk space for the build"
# A target directory reused by many builds keeps every stale artifact until rustc fails for want
# of space. Below 20 GiB free, drop the incremental caches, then the whole debug profile (a cold
# build fits well inside CI's time).
free_gib() { df -Pk "$1" | awk 'NR == 2 {print int($4 / 1048576)}'; }
mkdir -p "$CARGO_TARGET_DIR"
for stale in debug/incremental debug; do
  if [ "$(free_gib "$CARGO_TARGET_DIR")" -ge 20 ]; then
    break
  fi
  echo "less than 20 GiB free: removing $CARGO_TARGET_DIR/$stale" >&2
  rm -rf "${CARGO_TARGET_DIR:?}/$stale"
done
echo "$(free_gib "$CARGO_TARGET_DIR") GiB free for $CARGO_TARGET_DIR"

step "cargo fmt --check"
cargo fmt --all -- --check

step "one copy of each heavy dependency"
# A name listed with two different versions is a second copy (the same version built for both
# the target and proc-macros is one copy).
dups=$(cargo tree --workspace -d -e normal,build --depth 0 --prefix none --format '{p}' --locked \
  | awk 'NF >= 2 {print $1, $2}' | sort -u | awk '{n[$1]++} END {for (c in n) if (n[c] > 1) print c}' \
  | grep -E '^(arrow|arrow-[a-z-]+|parquet|datafusion|datafusion-[a-z-]+|tonic|prost|sqlx|sqlx-[a-z]+|object_store|iceberg|iceberg-[a-z-]+|libsqlite3-sys|opentelemetry|opentelemetry_sdk)$' \
  || true)
if [ -n "$dups" ]; then
  echo "two versions of a heavy crate are linked (cargo tree -d):" >&2
  echo "$dups" >&2
  exit 1
fi

step "PostgreSQL"
trap 'stop_moto; stop_postgres' EXIT
if ! start_postgres; then
  if [ "${CI:-}" = "true" ]; then
    echo "CI=true: PostgreSQL is required." >&2
    exit 1
  fi
  echo "WARNING: PostgreSQL tests will be skipped (install PostgreSQL to run them)." >&2
fi

step "Python clients and moto (S3)"
if ensure_venv && start_moto; then
  :
elif [ "${CI:-}" = "true" ]; then
  echo "CI=true: the Python test clients and moto are required." >&2
  exit 1
else
  echo "WARNING: S3 tests will be skipped (needs python3 with venv and network access to PyPI)." >&2
fi

step "command-line tools (tmux, kcat)"
# The prompt's test drives mink-query in tmux; the Kafka tests run kcat. Installed when missing
# and this user can (root with apt-get); otherwise those tests skip, or fail with CI=true.
missing=()
for tool in tmux kcat; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; } \
    || echo "WARNING: could not install ${missing[*]}" >&2
fi

step "cargo nextest run, built through clippy"
# Clippy as the workspace's compiler wrapper, as `cargo clippy` runs it (RUSTC_WORKSPACE_WRAPPER,
# CLIPPY_ARGS): the test build lints every workspace target with warnings denied, and the
# dependencies are built once. A separate `cargo clippy` checked them all again, 9 of a cold
# run's 32 minutes.
# No backtraces unless asked for (MINK_TEST_BACKTRACE=1): CI shows the tail of this log, and a
# failed assertion's backtrace pushed the assertion's own message out of it.
RUST_BACKTRACE="${MINK_TEST_BACKTRACE:-0}" \
  RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)" \
  CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" \
  cargo nextest run --workspace --locked --no-fail-fast "$@"

step "done"
