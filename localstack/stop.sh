#!/usr/bin/env bash
# Stops the LocalStack and DynamoDB Local started by start.sh (by PID file: SIGTERM, up to 10 s, then SIGKILL) and
# removes the PID files; stops the Postgres cluster start-postgres.sh runs (pg_ctl stop; its data stays). Harmless
# when nothing runs. Never touches processes it did not start.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

take_run_lock
pg_rc=0
stop_postgres || pg_rc=1
if ! sqs_pid >/dev/null && ! dynamodb_pid >/dev/null; then
  rm -f "$SQS_PID_FILE" "$DYNAMODB_PID_FILE" "$RUN_DIR"/*.port
  log "nothing else running"
  exit "$pg_rc"
fi
rc=$pg_rc
stop_sqs || rc=1
stop_dynamodb || rc=1
((rc == 0)) && log "stopped"
exit "$rc"
