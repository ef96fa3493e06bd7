// An AWS SDK v3 SQS producer or consumer instrumented by OpenTelemetry's own
// `@opentelemetry/instrumentation-aws-sdk`, for Conveyor's trace interop test
// (tests/tests/traces_interop.rs). Spans go to an OTLP/HTTP protobuf endpoint.
//
//   node sqs_otel.cjs produce QUEUE_URL TRACES_URL SERVICE JOB_TYPE BODY_JSON...
//       sends one message per BODY_JSON with the `conveyor.type` attribute a Conveyor job needs; the
//       instrumentation opens a `<queue> send` producer span and puts its `traceparent` in the attributes.
//   node sqs_otel.cjs consume QUEUE_URL TRACES_URL SERVICE COUNT
//       receives until COUNT messages were processed (each deleted); the instrumentation's
//       `<queue> receive` span links to each message's sender context (it opens no per-message span).
//
// Prints one JSON line per message (`sent` or `processed`), then `done` once the spans were exported.
// AWS endpoint and credentials come from the environment (AWS_ENDPOINT_URL_SQS, AWS_REGION, ...).
'use strict';

const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { registerInstrumentations } = require('@opentelemetry/instrumentation');
const { AwsInstrumentation } = require('@opentelemetry/instrumentation-aws-sdk');

// How long `consume` waits for its messages before it gives up.
const CONSUME_DEADLINE_MS = 60_000;

const [mode, queueUrl, tracesUrl, service, ...rest] = process.argv.slice(2);

const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': service }),
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl }))],
});
// The W3C propagator and the async context manager, process-wide.
provider.register();
// Before the SDK is loaded: the instrumentation patches it as it is required.
registerInstrumentations({ instrumentations: [new AwsInstrumentation()] });

const {
  SQSClient,
  SendMessageCommand,
  ReceiveMessageCommand,
  DeleteMessageCommand,
} = require('@aws-sdk/client-sqs');

function say(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

async function produce(sqs, jobType, bodies) {
  for (const body of bodies) {
    const sent = await sqs.send(
      new SendMessageCommand({
        QueueUrl: queueUrl,
        MessageBody: body,
        MessageAttributes: { 'conveyor.type': { DataType: 'String', StringValue: jobType } },
      }),
    );
    say('sent', { messageId: sent.MessageId });
  }
}

async function consume(sqs, count) {
  let processed = 0;
  const deadline = Date.now() + CONSUME_DEADLINE_MS;
  while (processed < count) {
    if (Date.now() > deadline) {
      throw new Error(`only ${processed} of ${count} messages arrived within ${CONSUME_DEADLINE_MS} ms`);
    }
    const received = await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: queueUrl,
        MaxNumberOfMessages: 10,
        WaitTimeSeconds: 1,
        MessageAttributeNames: ['All'],
      }),
    );
    for (const message of received.Messages ?? []) {
      const attributes = message.MessageAttributes ?? {};
      say('processed', {
        messageId: message.MessageId,
        jobType: attributes['conveyor.type']?.StringValue ?? null,
        traceparent: attributes.traceparent?.StringValue ?? null,
      });
      await sqs.send(new DeleteMessageCommand({ QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle }));
      processed += 1;
    }
  }
}

async function main() {
  const sqs = new SQSClient({});
  if (mode === 'produce') {
    await produce(sqs, rest[0], rest.slice(1));
  } else if (mode === 'consume') {
    await consume(sqs, Number(rest[0]));
  } else {
    throw new Error(`unknown mode ${mode}: produce or consume`);
  }
  await provider.shutdown();
  say('done');
}

main().catch((error) => {
  say('error', { message: String(error?.stack ?? error) });
  process.exitCode = 1;
});
