#!/usr/bin/env bash
# .ci/services.sh up|down|status -- the real parts the end-to-end tests talk to:
#   - a Debian host with its own systemd and sshd on 127.0.0.1:2222 (.ci/testhost.sh), with
#     the emulator installed in a venv at /opt/sglang-emu (from a wheelhouse built here);
#   - a PostgreSQL server on 127.0.0.1:5433 (Debian's package), for multi-host studies;
#   - Chromium (Debian's package), for the dashboard's browser test.
# Idempotent; needs root (CI runs as root).  Without root it does nothing and the tests that
# need these parts skip (unless TUNER_REQUIRE_SERVICES=1, which `make test` sets under CI).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
PG_DIR=$ROOT/.ci/.postgres
# The cluster lives beside the clone, unless the postgres user cannot reach it (a clone under a
# 0700 directory such as /root or a mktemp -d): then under postgres's own home, one per clone.
PG_DATA=$PG_DIR/data
PG_SOCK=$PG_DIR
if id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$ROOT" 2>/dev/null; then
  PG_SOCK=/var/lib/postgresql/sglang-tuner-$(printf %s "$ROOT" | md5sum | cut -c1-8)
  PG_DATA=$PG_SOCK/data
fi
PG_PORT=${PG_PORT:-5433}
WHEELHOUSE=$ROOT/.ci/.wheelhouse

log() { printf '[services] %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "not root: skipping $1 (tests that need it will skip)"
    return 1
  fi
}

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

wheelhouse() {
  # The emulator and what it imports, for the test host's Python (3.11, pure-Python wheels).
  rm -rf "$WHEELHOUSE"
  mkdir -p "$WHEELHOUSE"
  "$PY" -m pip wheel -q --no-deps -w "$WHEELHOUSE" "$ROOT" >/dev/null
  "$PY" -m pip wheel -q -w "$WHEELHOUSE" -c "$ROOT/constraints.txt" starlette uvicorn prometheus-client httpx >/dev/null
}

testhost_up() {
  need_root "the systemd test host" || return 0
  local t0=$SECONDS
  wheelhouse
  TH_WHEELHOUSE=$WHEELHOUSE .ci/testhost.sh up >/dev/null
  log "test host up in $((SECONDS - t0)) s (.ci/.testhost/env)"
}

port_free_for_postgres() {
  # Another clone's `make test` leaves its PostgreSQL up on the same port; pg_ctl then says only
  # "could not start server".  Name the holder and the fix in one line.
  if (exec 3<>"/dev/tcp/127.0.0.1/$PG_PORT") 2>/dev/null; then
    local holder
    holder=$(pgrep -a -f "postgres .*-p $PG_PORT( |$)" | grep -o -- '-D [^ ]*' | head -n 1 | cut -c4-)
    log "127.0.0.1:$PG_PORT is taken${holder:+ by the PostgreSQL of $holder (the make test of another clone)}: run" \
        "${holder:+.ci/services.sh down in that clone, or }PG_PORT=<a free port> make test"
    return 1
  fi
}

postgres_up() {
  need_root "PostgreSQL" || return 0
  apt_install postgresql
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  mkdir -p "$PG_DIR" "$PG_SOCK"
  chown postgres:postgres "$PG_DIR" "$PG_SOCK"
  if ! runuser -u postgres -- test -x "$ROOT" 2>/dev/null; then
    log "postgres cannot reach $ROOT: its cluster is in $PG_DATA"
  fi
  if [ ! -f "$PG_DATA/PG_VERSION" ]; then
    runuser -u postgres -- "$bin/initdb" -D "$PG_DATA" -A trust -U postgres >/dev/null
  fi
  if ! runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    port_free_for_postgres || return 1
    runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_SOCK/server.log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_SOCK" start >/dev/null
  fi
  echo "TUNER_TEST_POSTGRES=postgresql://postgres@127.0.0.1:$PG_PORT/postgres" > "$PG_DIR/env"
  log "postgres up on 127.0.0.1:$PG_PORT"
}

chromium_up() {
  need_root "Chromium" || return 0
  apt_install chromium chromium-driver fonts-dejavu-core
  log "chromium: $(chromium --version 2>/dev/null || echo missing)"
}

up() {
  testhost_up
  postgres_up
  chromium_up
}

down() {
  if [ -x .ci/testhost.sh ] && [ "$(id -u)" = 0 ]; then .ci/testhost.sh down >/dev/null 2>&1 || true; fi
  if [ -f "$PG_DATA/PG_VERSION" ]; then
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$bin" ] && runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
  fi
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  status)
    .ci/testhost.sh status && echo "testhost: running" || echo "testhost: stopped"
    [ -f "$PG_DIR/env" ] && cat "$PG_DIR/env" || echo "postgres: not set up"
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
