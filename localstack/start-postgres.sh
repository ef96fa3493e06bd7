#!/usr/bin/env bash
# Starts the Postgres the outbox's Postgres tests use (crates/conveyor-outbox/tests/postgres.rs): a throwaway
# cluster in <repo>/.local/run/postgres (made by initdb on first use), listening on 127.0.0.1 port
# ${CONVEYOR_POSTGRES_PORT:-55432} only, trust authentication, superuser `postgres`, database `conveyor`:
#   postgres://postgres@127.0.0.1:55432/conveyor   (the tests' CONVEYOR_TEST_POSTGRES_URL default)
# Installs Postgres first when missing (install-postgres.sh). Postgres refuses to run as root: as root the cluster
# belongs to Debian's `postgres` user and runs as it. Idempotent: harmless when it already runs; returns once
# pg_isready answers. Log: <repo>/.local/logs/postgres.log. Called by start.sh (`make local-aws`); stop.sh stops it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$CONVEYOR_LOCALSTACK_DIR/install-postgres.sh"
BIN="$(postgres_bin_dir)"

# Its own lock: start.sh calls this while holding the run lock.
hold_lock "$RUN_DIR/postgres.lock" 180 "another start-postgres.sh"
mkdir -p "$RUN_DIR" "$LOG_DIR"

# Makes the cluster when there is none (a half-made one from an interrupted initdb is made again).
init_cluster() {
  [[ -f "$POSTGRES_DATA/PG_VERSION" ]] && return 0
  if [[ "$(id -u)" == 0 ]] && ! id postgres >/dev/null 2>&1; then
    err "running as root, but there is no 'postgres' user to run Postgres as (Postgres refuses root)."
    err "  Debian's postgresql package creates it: apt-get install -y postgresql, or run this as a normal user"
    return 1
  fi
  rm -rf "$POSTGRES_DATA"
  mkdir -p "$POSTGRES_DATA"
  chmod 700 "$POSTGRES_DATA"
  if [[ "$(id -u)" == 0 ]]; then chown postgres: "$POSTGRES_DATA"; fi
  log "creating a Postgres cluster in $POSTGRES_DATA"
  (cd "$POSTGRES_DATA" && as_postgres_owner "$BIN/initdb" -D "$POSTGRES_DATA" -U postgres --auth=trust \
    -E UTF8 --locale=C >"$RUN_DIR/postgres-initdb.log" 2>&1) || {
    err "initdb failed"
    print_log_tail "$RUN_DIR/postgres-initdb.log"
    return 1
  }
  # A throwaway test cluster: TCP on loopback only, no socket file, no fsync.
  cat >>"$POSTGRES_DATA/postgresql.conf" <<'CONF'

# conveyor: localstack/start-postgres.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
}

start_cluster() {
  rotate_log "$POSTGRES_LOG"
  touch "$POSTGRES_LOG"
  if [[ "$(id -u)" == 0 ]]; then chown postgres: "$POSTGRES_LOG"; fi
  log "starting Postgres $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$POSTGRES_PORT, log: $POSTGRES_LOG"
  (
    cd "$POSTGRES_DATA" || exit 1
    close_inherited_fds
    as_postgres_owner "$BIN/pg_ctl" -D "$POSTGRES_DATA" -l "$POSTGRES_LOG" -w -t "$START_TIMEOUT" \
      -o "-p $POSTGRES_PORT" start </dev/null >/dev/null
  ) || {
    err "Postgres did not start"
    print_log_tail "$POSTGRES_LOG"
    return 1
  }
}

wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  until postgres_ready; do
    if ((SECONDS >= deadline)); then
      err "Postgres on 127.0.0.1:$POSTGRES_PORT did not answer pg_isready within ${START_TIMEOUT}s (CONVEYOR_START_TIMEOUT)"
      print_log_tail "$POSTGRES_LOG"
      return 1
    fi
    sleep 0.25
  done
}

create_database() {
  local psql=("$BIN/psql" -h 127.0.0.1 -p "$POSTGRES_PORT" -U postgres -v ON_ERROR_STOP=1 -qtA)
  if [[ "$("${psql[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$POSTGRES_DB'")" != 1 ]]; then
    "${psql[@]}" -d postgres -c "CREATE DATABASE $POSTGRES_DB" >/dev/null || {
      err "could not create database $POSTGRES_DB on 127.0.0.1:$POSTGRES_PORT"
      return 1
    }
  fi
}

main() {
  if postgres_running; then
    log "Postgres already running ($POSTGRES_DATA)"
  elif port_in_use "$POSTGRES_PORT"; then
    # Another checkout's cluster (or anyone's Postgres with trust auth) that answers is as good as ours.
    if postgres_ready; then
      log "a Postgres not started by this checkout already answers on 127.0.0.1:$POSTGRES_PORT; using it"
    else
      port_taken_message "$POSTGRES_PORT" Postgres CONVEYOR_POSTGRES_PORT
      return 2
    fi
  else
    init_cluster
    start_cluster
  fi
  wait_ready
  create_database
  log "Postgres ready: postgres://postgres@127.0.0.1:$POSTGRES_PORT/$POSTGRES_DB"
}

main "$@"
