# shellcheck shell=bash
# Starts and stops a throwaway PostgreSQL on a free loopback port (initdb + pg_ctl in a temp
# directory). Sourced by scripts/test.sh and scripts/bench.sh.
#   start_postgres  -> exports MINK_TEST_POSTGRES_URL, returns 1 when PostgreSQL is not installed
#                      (on port $MINK_PG_PORT when set, else on a free one)
#   stop_postgres   -> stops it and removes the directory (safe to call twice)

_pg_bin_dir() {
  local initdb
  initdb=$(command -v initdb 2>/dev/null || true)
  if [ -n "$initdb" ]; then
    dirname "$(readlink -f "$initdb")"
    return 0
  fi
  local dir
  for dir in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin /opt/homebrew/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

_pg_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_postgres() {
  local bin
  if ! bin=$(_pg_bin_dir); then
    echo "PostgreSQL server binaries (initdb, pg_ctl) not found." >&2
    echo "Install them: 'apt-get install postgresql' (Debian/Ubuntu), 'brew install postgresql' (macOS)." >&2
    return 1
  fi
  MINK_PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mink-pg.XXXXXX")
  export MINK_PG_DIR
  local as=()
  # initdb refuses to run as root: run the server as an unprivileged user.
  if [ "$(id -u)" = 0 ]; then
    local user=postgres
    id "$user" >/dev/null 2>&1 || user=nobody
    chown "$user" "$MINK_PG_DIR"
    as=(runuser -u "$user" --)
  fi
  MINK_PG_AS=("${as[@]}")
  MINK_PG_BIN=$bin
  local port
  port=${MINK_PG_PORT:-$(_pg_free_port)}
  "${as[@]}" "$bin/initdb" -D "$MINK_PG_DIR/data" -U mink --auth=trust -E UTF8 --no-locale >"$MINK_PG_DIR/initdb.log" 2>&1 || {
    cat "$MINK_PG_DIR/initdb.log" >&2
    return 1
  }
  "${as[@]}" "$bin/pg_ctl" -D "$MINK_PG_DIR/data" -l "$MINK_PG_DIR/server.log" -w -t 60 \
    -o "-p $port -k $MINK_PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=128MB" \
    start >/dev/null || {
    cat "$MINK_PG_DIR/server.log" >&2
    return 1
  }
  export MINK_TEST_POSTGRES_URL="postgres://mink@127.0.0.1:$port/postgres"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $MINK_PG_DIR)"
}

stop_postgres() {
  if [ -n "${MINK_PG_DIR:-}" ] && [ -d "$MINK_PG_DIR/data" ]; then
    "${MINK_PG_AS[@]}" "$MINK_PG_BIN/pg_ctl" -D "$MINK_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ -n "${MINK_PG_DIR:-}" ]; then
    rm -rf "$MINK_PG_DIR"
  fi
  MINK_PG_DIR=
}
