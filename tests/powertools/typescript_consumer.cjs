// A Powertools for AWS Lambda (TypeScript) consumer of SQS records, driven by Conveyor's interop tests.
//
// Run with NODE_PATH=.local/powertools/node/node_modules (localstack/install-powertools.sh installs it):
//   node typescript_consumer.cjs SPEC
// SPEC and the printed JSON lines are the same as python_consumer.py's (see there).
'use strict';

const readline = require('node:readline');
const { DynamoDBClient } = require('@aws-sdk/client-dynamodb');
const { IdempotencyConfig, makeIdempotent } = require('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = require('@aws-lambda-powertools/idempotency/dynamodb');

const emit = (fields) => process.stdout.write(`${JSON.stringify(fields)}\n`);

// Powertools warns on every call made outside Lambda without a context; not news here.
const warn = console.warn;
console.warn = (...args) => {
  if (!String(args[0]).startsWith('Could not determine remaining time left')) warn(...args);
};

const oneLine = () =>
  new Promise((resolve) => {
    const lines = readline.createInterface({ input: process.stdin });
    lines.once('line', () => {
      lines.close();
      resolve();
    });
  });

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const client = new DynamoDBClient({
    endpoint: spec.endpoint,
    region: process.env.AWS_REGION || 'us-east-1',
  });
  const persistenceStore = new DynamoDBPersistenceLayer({
    tableName: spec.table,
    awsSdkV3Client: client,
    sortKeyAttr: spec.sort_key_attr,
    staticPkValue: spec.static_pk_value,
  });
  const config = new IdempotencyConfig({
    eventKeyJmesPath: spec.key_jmespath,
    payloadValidationJmesPath: spec.validation_jmespath,
    throwOnNoIdempotencyKey: true,
    expiresAfterSeconds: spec.expires_after_seconds ?? 3600,
  });
  if (spec.lease_ms) {
    config.registerLambdaContext({ getRemainingTimeInMillis: () => spec.lease_ms });
  }
  const mode = spec.mode || 'run';
  const handle = async (record) => {
    if (mode !== 'bench') emit({ event: 'started', messageId: record.messageId });
    if (mode === 'hold') await oneLine();
    return { by: 'typescript', messageId: record.messageId };
  };
  const idempotent = makeIdempotent(handle, { persistenceStore, config, keyPrefix: spec.prefix });
  if (mode === 'bench') {
    const latencies = [];
    for (const record of spec.records) {
      const start = process.hrtime.bigint();
      await idempotent(record);
      latencies.push(Number(process.hrtime.bigint() - start) / 1e6);
    }
    emit({ event: 'bench', latencies_ms: latencies });
    return;
  }
  for (const record of spec.records) {
    try {
      emit({ event: 'result', value: await idempotent(record) });
    } catch (error) {
      emit({ event: 'error', error: error.name, message: String(error.message) });
    }
  }
}

main().catch((error) => {
  emit({ event: 'fatal', error: error.name, message: String(error.stack || error) });
  process.exit(1);
});
