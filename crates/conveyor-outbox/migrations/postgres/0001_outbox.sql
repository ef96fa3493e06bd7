-- Conveyor's transactional outbox on Postgres (conveyor-outbox, feature `postgres`).
-- Idempotent: safe to run again. Run it with your own migrations (sqlx migrate, refinery, Flyway, psql) or
-- with the crate's `postgres::migrate`. Other names or a schema: `postgres::PostgresTables::migration`.

-- Unsent jobs: one row per job, removed once the relay has sent it. Nothing expires.
CREATE TABLE IF NOT EXISTS conveyor_outbox (
    aggregate         text    NOT NULL,            -- whose order the job keeps (the FIFO message group id)
    sequence          bigint  NOT NULL,            -- the job's place in its aggregate, from 1
    id                text    NOT NULL,            -- the item id (FIFO deduplication id, `outbox:<id>` key)
    queue_url         text    NOT NULL,
    job_type          text    NOT NULL,
    idempotency_key   text    NOT NULL,
    body              text    NOT NULL,
    attributes        jsonb   NOT NULL DEFAULT '{}',  -- {"name": {"type": ..., "string": ...} | {"type": ..., "binary": <base64>}}
    delay_ms          bigint,
    group_id          text,
    deduplication_id  text,
    trace_header      text,
    created_at_millis bigint  NOT NULL,            -- the writer's clock, epoch milliseconds
    attempts          integer NOT NULL DEFAULT 0,  -- failed sends so far
    last_error        text,
    parked_at_millis  bigint,                      -- set: parked, not relayed until unparked
    format_version    integer NOT NULL,            -- a relay refuses rows of a format it does not know
    PRIMARY KEY (aggregate, sequence)
);

-- The relay's sweep: aggregates whose oldest unparked job is older than a moment, oldest first.
CREATE INDEX IF NOT EXISTS conveyor_outbox_pending
    ON conveyor_outbox (created_at_millis, aggregate) WHERE parked_at_millis IS NULL;

-- The backlog's parked jobs, oldest first.
CREATE INDEX IF NOT EXISTS conveyor_outbox_parked
    ON conveyor_outbox (created_at_millis) WHERE parked_at_millis IS NOT NULL;

-- The last sequence number allocated per aggregate (kept after its jobs are sent: never delete a row
-- while the aggregate has jobs in conveyor_outbox). A writer's upsert locks the aggregate's row until its
-- transaction ends: an aggregate's writers commit one after another.
CREATE TABLE IF NOT EXISTS conveyor_outbox_heads (
    aggregate text   PRIMARY KEY,
    sequence  bigint NOT NULL
);

-- The polling relay's leases (who relays, fenced by epoch and version).
CREATE TABLE IF NOT EXISTS conveyor_outbox_leases (
    name    text   PRIMARY KEY,
    owner   text   NOT NULL,
    epoch   bigint NOT NULL,
    version bigint NOT NULL
);
