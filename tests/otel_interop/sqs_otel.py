"""A boto3 SQS producer or consumer instrumented by OpenTelemetry's own `opentelemetry-instrumentation-boto3sqs`,
for Conveyor's trace interop test (tests/tests/traces_interop.rs). Spans go to an OTLP/HTTP protobuf endpoint.

    python sqs_otel.py produce QUEUE_URL TRACES_URL SERVICE JOB_TYPE BODY_JSON...
        sends one message per BODY_JSON with the `conveyor.type` attribute a Conveyor job needs; the
        instrumentation opens a `<queue> send` producer span and puts its `traceparent` in the attributes.
    python sqs_otel.py consume QUEUE_URL TRACES_URL SERVICE COUNT
        receives until COUNT messages were processed (each deleted), inside the instrumentation's
        `<queue> receive` span and its per-message `<queue> process` span (linked to the sender's context).

Prints one JSON line per message (`sent` or `processed`), then `done` once the spans were exported.
AWS endpoint and credentials come from the environment (AWS_ENDPOINT_URL_SQS, AWS_REGION, ...).
"""

import json
import sys
import time

import boto3
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.boto3sqs import Boto3SQSInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

# How long `consume` waits for its messages before it gives up.
CONSUME_DEADLINE_SECONDS = 60


def say(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


def tracing(traces_url, service):
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url)))
    trace.set_tracer_provider(provider)
    Boto3SQSInstrumentor().instrument(tracer_provider=provider)
    return provider


def produce(sqs, queue_url, job_type, bodies):
    for body in bodies:
        sent = sqs.send_message(
            QueueUrl=queue_url,
            MessageBody=body,
            MessageAttributes={"conveyor.type": {"DataType": "String", "StringValue": job_type}},
        )
        say("sent", messageId=sent["MessageId"])


def consume(sqs, queue_url, count):
    processed = 0
    deadline = time.monotonic() + CONSUME_DEADLINE_SECONDS
    while processed < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {processed} of {count} messages arrived within {CONSUME_DEADLINE_SECONDS} s")
        received = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
        )
        # Iterating is what makes each message's `process` span current (the instrumentation's list).
        for message in received.get("Messages", []):
            attributes = message.get("MessageAttributes", {})
            current = trace.get_current_span().get_span_context()
            say(
                "processed",
                messageId=message["MessageId"],
                jobType=attributes.get("conveyor.type", {}).get("StringValue"),
                traceparent=attributes.get("traceparent", {}).get("StringValue"),
                processSpanId=format(current.span_id, "016x"),
            )
            # Deleting ends the message's `process` span.
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            processed += 1


def main():
    mode, queue_url, traces_url, service = sys.argv[1:5]
    provider = tracing(traces_url, service)
    sqs = boto3.client("sqs")
    if mode == "produce":
        produce(sqs, queue_url, sys.argv[5], sys.argv[6:])
    elif mode == "consume":
        consume(sqs, queue_url, int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: produce or consume")
    provider.shutdown()
    say("done")


if __name__ == "__main__":
    main()
