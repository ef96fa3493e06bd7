#!/usr/bin/env bash
# Usage: restart-sqs.sh [--kill]
# Stops only LocalStack (SQS) and starts it again, waiting until it is healthy; DynamoDB Local is left alone.
# For fault tests. --kill sends SIGKILL instead of a graceful SIGTERM (a crash, and about 2 s faster).
# LocalStack runs without persistence, so every queue and message is gone after a restart.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

signal=TERM
case "${1:-}" in
  "") ;;
  --kill) signal=KILL ;;
  *)
    err "usage: $0 [--kill]"
    exit 64
    ;;
esac

require_cmd curl "Install curl (Debian: apt-get install -y curl)."
"$CONVEYOR_LOCALSTACK_DIR/install.sh" --quiet

take_run_lock
started_at=$SECONDS
if ! sqs_pid >/dev/null && port_in_use "$SQS_PORT"; then
  err "the LocalStack on port $SQS_PORT was not started by this checkout ($CONVEYOR_LOCALSTACK_DIR/start.sh), so it"
  err "  cannot be restarted from here: stop it (its own stop.sh, or docker compose down) and run this again"
  exit 2
fi
if [[ "$signal" == KILL ]] && pid="$(sqs_pid)"; then
  log "killing LocalStack (pid $pid) with SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.05
  done
fi
stop_sqs
# The port must be free again before relaunching; a stopped LocalStack can take a moment to release it.
while port_in_use "$SQS_PORT" && ((SECONDS - started_at < START_TIMEOUT)); do
  sleep 0.1
done
launch_sqs
wait_for sqs || exit 1
log "LocalStack restarted in $((SECONDS - started_at))s on http://127.0.0.1:$SQS_PORT"
