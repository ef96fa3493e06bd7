#!/usr/bin/env bash
# Stops only LocalStack (SQS) and starts it again, waiting until it is healthy; DynamoDB Local is left alone.
# For fault tests. LocalStack runs without persistence, so every queue and message is gone after a restart.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_cmd curl "Install curl (Debian: apt-get install -y curl)."
"$CONVEYOR_LOCALSTACK_DIR/install.sh" >/dev/null || "$CONVEYOR_LOCALSTACK_DIR/install.sh"

take_run_lock
started_at=$SECONDS
stop_sqs
# The port must be free again before relaunching; a TERMed LocalStack can take a moment to release it.
while port_in_use "$SQS_PORT" && ((SECONDS - started_at < START_TIMEOUT)); do
  sleep 0.1
done
launch_sqs
wait_for sqs || exit 1
log "LocalStack restarted in $((SECONDS - started_at))s on http://127.0.0.1:$SQS_PORT"
