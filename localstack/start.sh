#!/usr/bin/env bash
# Starts LocalStack (SQS and S3, for large payloads) on 127.0.0.1:${CONVEYOR_SQS_PORT:-4566} and DynamoDB Local on
# port ${CONVEYOR_DYNAMODB_PORT:-8000} in the background, installing them first if needed, and waits (bounded by
# CONVEYOR_START_TIMEOUT, default 60 s) until both answer. Then the outbox tests' Postgres on
# 127.0.0.1:${CONVEYOR_POSTGRES_PORT:-55432} (start-postgres.sh). Safe to run twice: our own running instances are reused.
# CONVEYOR_LOCAL_SQS=moto runs moto's server (PyPI, install-moto.sh) there instead of LocalStack, for a machine
# where localstack-core cannot be installed: `make demo` passes on it (the tests are written for LocalStack).
# Logs: <repo>/.local/logs/, PID files: <repo>/.local/run/. Stop with stop.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_cmd curl "Install curl (Debian: apt-get install -y curl)."
"$CONVEYOR_LOCALSTACK_DIR/install.sh" --quiet
require_java

take_run_lock
started_at=$SECONDS

rc=0
preflight || rc=$?
if ((rc == 0)); then
  launch_sqs || rc=$?
fi
if ((rc == 0)); then
  launch_dynamodb || rc=$?
fi
if ((rc != 0)); then
  exit "$rc"
fi

wait_for sqs dynamodb || {
  err "start-up failed; processes left as they are (run $CONVEYOR_LOCALSTACK_DIR/stop.sh to clean up)"
  exit 1
}

# Postgres has its own lock (start-postgres.sh takes it); this one is held until the script exits.
"$CONVEYOR_LOCALSTACK_DIR/start-postgres.sh" || {
  err "Postgres did not start (the outbox's Postgres tests need it); see above"
  exit 1
}

log "ready in $((SECONDS - started_at))s: SQS http://127.0.0.1:$SQS_PORT  DynamoDB http://127.0.0.1:$DYNAMODB_PORT  Postgres postgres://postgres@127.0.0.1:$POSTGRES_PORT/$POSTGRES_DB"
log "point the SDK at them with: source $CONVEYOR_LOCALSTACK_DIR/env.sh"
