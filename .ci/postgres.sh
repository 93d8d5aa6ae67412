#!/usr/bin/env bash
# A real PostgreSQL server for kioku's tests: installs the Debian package if missing, creates a
# throwaway cluster (initdb) listening on 127.0.0.1, a `kioku` role and a `kioku_test` database,
# and prints the line that tells the tests where it is:
#
#     eval "$(.ci/postgres.sh)"        # exports KIOKU_TEST_PG=postgresql://kioku:kioku@127.0.0.1:55432/kioku_test
#     .ci/postgres.sh stop             # stops it (the data directory stays until `.ci/postgres.sh clean`)
#
# Only the export line goes to stdout; progress goes to stderr. Running it again while the server
# is up just prints the line again. Settings: KIOKU_PG_PORT (55432), KIOKU_PG_DIR (/tmp/kioku-pg).
# fsync is off: this cluster holds test data only.
set -euo pipefail

PORT=${KIOKU_PG_PORT:-55432}
DIR=${KIOKU_PG_DIR:-/tmp/kioku-pg}
URL="postgresql://kioku:kioku@127.0.0.1:${PORT}/kioku_test"

say() { echo "postgres.sh: $*" >&2; }

pg_bin() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

BIN=$(pg_bin || true)
if [ -z "$BIN" ]; then
    say "installing postgresql (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
    BIN=$(pg_bin)
fi

# The server refuses to run as root: run it as `postgres` when we are root.
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$DIR" postgres
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

case "${1:-start}" in
stop)
    if [ -f "$DIR/PG_VERSION" ]; then as_pg "$BIN/pg_ctl" -D "$DIR" -m fast -w stop >&2 || true; fi
    exit 0
    ;;
clean)
    if [ -f "$DIR/PG_VERSION" ]; then as_pg "$BIN/pg_ctl" -D "$DIR" -m fast -w stop >&2 || true; fi
    rm -rf "$DIR"
    exit 0
    ;;
start) ;;
*)
    say "usage: $0 [start|stop|clean]"
    exit 2
    ;;
esac

if [ ! -f "$DIR/PG_VERSION" ]; then
    say "initdb $DIR"
    mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
    chmod 700 "$DIR"
    as_pg "$BIN/initdb" -D "$DIR" -U postgres --auth=trust -E UTF8 --locale=C >"$DIR.initdb.log" 2>&1 \
        || { cat "$DIR.initdb.log" >&2; exit 1; }
fi

# A server killed without a clean stop (a session that ended) can leave a postmaster.pid whose
# pid still exists (a zombie, or reused): pg_ctl then thinks it runs. If nothing answers, the
# lock file is stale, and this throwaway cluster can simply start again.
if as_pg "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1 \
    && ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 5; then
    say "server not answering: removing a stale postmaster.pid"
    rm -f "$DIR/postmaster.pid"
fi

if ! as_pg "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1; then
    say "starting on 127.0.0.1:$PORT"
    as_pg "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -t 60 start -o \
        "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        >&2 || { tail -n 30 "$DIR/server.log" >&2; exit 1; }
fi

psql_admin() { as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }

if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = 'kioku'")" != 1 ]; then
    psql_admin -c "CREATE ROLE kioku LOGIN PASSWORD 'kioku' CREATEDB" >&2
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = 'kioku_test'")" != 1 ]; then
    psql_admin -c "CREATE DATABASE kioku_test OWNER kioku" >&2
fi

say "ready: $URL"
echo "export KIOKU_TEST_PG=$URL"
