# shellcheck shell=bash
# The test virtualenv and the moto S3 server. Sourced by scripts/test.sh and scripts/bench.sh.
#   ensure_venv  -> exports MINK_VENV (installs scripts/requirements-test.txt when it changed)
#   start_moto   -> exports MINK_TEST_S3_ENDPOINT and MINK_TEST_S3_BUCKET
#   stop_moto

ensure_venv() {
  MINK_VENV="${MINK_VENV:-$HOME/.cache/mink/venv}"
  export MINK_VENV
  local req stamp
  req="$(pwd)/scripts/requirements-test.txt"
  if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found: install Python 3.11 (apt-get install python3 python3-venv)." >&2
    return 1
  fi
  stamp="$MINK_VENV/.requirements-$(sha256sum "$req" | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    rm -rf "$MINK_VENV"
    python3 -m venv "$MINK_VENV" || {
      echo "could not create a virtualenv: install python3-venv." >&2
      return 1
    }
    "$MINK_VENV/bin/pip" install --quiet --upgrade pip >/dev/null
    "$MINK_VENV/bin/pip" install --quiet -r "$req" || return 1
    touch "$stamp"
  fi
}

stop_moto() {
  if [ -n "${MINK_MOTO_PID:-}" ]; then
    kill "$MINK_MOTO_PID" 2>/dev/null || true
    wait "$MINK_MOTO_PID" 2>/dev/null || true
  fi
  MINK_MOTO_PID=
}

start_moto() {
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  MINK_MOTO_LOG=$(mktemp "${TMPDIR:-/tmp}/mink-moto.XXXXXX.log")
  "$MINK_VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$MINK_MOTO_LOG" 2>&1 &
  MINK_MOTO_PID=$!
  local i
  for i in $(seq 1 100); do
    if "$MINK_VENV/bin/python" - "$port" <<'PY' 2>/dev/null; then
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
s3.create_bucket(Bucket="mink-test")
PY
      export MINK_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
      export MINK_TEST_S3_BUCKET="mink-test"
      echo "moto S3 on 127.0.0.1:$port (bucket mink-test)"
      return 0
    fi
    sleep 0.1
  done
  cat "$MINK_MOTO_LOG" >&2
  return 1
}
