#!/usr/bin/env bash
# Stops the LocalStack and DynamoDB Local started by start.sh (by PID file: SIGTERM, up to 10 s, then SIGKILL) and
# removes the PID files. Harmless when nothing runs. Never touches processes it did not start.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

take_run_lock
if ! sqs_pid >/dev/null && ! dynamodb_pid >/dev/null; then
  rm -f "$SQS_PID_FILE" "$DYNAMODB_PID_FILE" "$RUN_DIR"/*.port
  log "nothing running"
  exit 0
fi
rc=0
stop_sqs || rc=1
stop_dynamodb || rc=1
((rc == 0)) && log "stopped"
exit "$rc"
