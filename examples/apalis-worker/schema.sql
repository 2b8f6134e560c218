-- The team's result table. A job creates its own row (INSERT ... ON CONFLICT DO NOTHING) when it
-- starts, so submitting a request is only enqueueing the apalis job. apalis' own tables (schema
-- `apalis`) are created by the worker at start (PostgresStorage::setup).
-- status: PENDING (row created) -> RUNNING (fenced handler took an epoch) -> SUCCEEDED | FAILED.
CREATE TABLE IF NOT EXISTS predictions (
    request_id    text PRIMARY KEY,
    input         text,
    status        text NOT NULL DEFAULT 'PENDING',
    output        text,
    model_version text,
    epoch         int  NOT NULL DEFAULT 0,
    owner         text,
    updated_at    timestamptz
);
