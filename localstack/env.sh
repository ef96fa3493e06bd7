# shellcheck shell=bash
# Source me (do not run me):  source localstack/env.sh
# Points the AWS SDK (and the aws CLI) at the emulators started by start.sh, with dummy credentials.
# Always overwrites these variables; ports follow CONVEYOR_SQS_PORT / CONVEYOR_DYNAMODB_PORT like start.sh.
# No `set -e` here on purpose: it would leak into the shell that sources this file.

export AWS_ENDPOINT_URL_SQS="http://127.0.0.1:${CONVEYOR_SQS_PORT:-4566}"
# S3 (large payloads) is served by the same LocalStack as SQS.
export AWS_ENDPOINT_URL_S3="http://127.0.0.1:${CONVEYOR_SQS_PORT:-4566}"
export AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:${CONVEYOR_DYNAMODB_PORT:-8000}"
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
