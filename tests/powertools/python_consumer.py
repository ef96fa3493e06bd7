"""A Powertools for AWS Lambda (Python) consumer of SQS records, driven by Conveyor's interop tests.

Run with the venv localstack/install-powertools.sh makes: .local/powertools/venv/bin/python python_consumer.py SPEC
SPEC is JSON: {"endpoint", "table", "prefix", "key_jmespath", "records": [SQS record, ...], "mode": "run" | "hold" |
"bench", optional "lease_ms", "validation_jmespath", "sort_key_attr", "static_pk_value", "expires_after_seconds"}.
It prints one JSON line per event: {"event": "started", "messageId"} when the handler runs, then per record
{"event": "result", "value"} or {"event": "error", "error": <exception class>, "message"}; "bench" prints
{"event": "bench", "latencies_ms": [...]} instead (one idempotent call per record, claim + complete).
"hold": the handler waits for a line on stdin before it returns (a claim held in progress).
"""

import json
import os
import sys
import time

import boto3
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)


def emit(**fields):
    print(json.dumps(fields), flush=True)


class LambdaContext:
    """Just what Powertools reads: the remaining time, which becomes in_progress_expiration."""

    def __init__(self, remaining_ms):
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self):
        return self.remaining_ms


def main():
    spec = json.loads(sys.argv[1])
    client = boto3.client(
        "dynamodb",
        endpoint_url=spec["endpoint"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )
    persistence = DynamoDBPersistenceLayer(
        table_name=spec["table"],
        boto3_client=client,
        sort_key_attr=spec.get("sort_key_attr"),
        static_pk_value=spec.get("static_pk_value"),
    )
    config = IdempotencyConfig(
        event_key_jmespath=spec["key_jmespath"],
        payload_validation_jmespath=spec.get("validation_jmespath", ""),
        raise_on_no_idempotency_key=True,
        expires_after_seconds=spec.get("expires_after_seconds", 3600),
    )
    if spec.get("lease_ms"):
        config.register_lambda_context(LambdaContext(spec["lease_ms"]))
    mode = spec.get("mode", "run")

    def handle(record):
        if mode != "bench":
            emit(event="started", messageId=record["messageId"])
        if mode == "hold":
            sys.stdin.readline()
        return {"by": "python", "messageId": record["messageId"]}

    idempotent = idempotent_function(
        handle,
        data_keyword_argument="record",
        persistence_store=persistence,
        config=config,
        key_prefix=spec["prefix"],
    )
    if mode == "bench":
        latencies = []
        for record in spec["records"]:
            start = time.perf_counter()
            idempotent(record=record)
            latencies.append((time.perf_counter() - start) * 1000.0)
        emit(event="bench", latencies_ms=latencies)
        return
    for record in spec["records"]:
        try:
            emit(event="result", value=idempotent(record=record))
        except Exception as error:  # the tests assert on the class name
            emit(event="error", error=type(error).__name__, message=str(error))


if __name__ == "__main__":
    main()
