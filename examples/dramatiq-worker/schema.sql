-- The team's result table. A job creates its own row (INSERT ... ON CONFLICT DO NOTHING) when it
-- starts, so submitting a request is only enqueueing the Dramatiq message; nothing else writes here.
-- status: PENDING (row created) -> RUNNING (the safe job took an epoch) -> SUCCEEDED | FAILED.
-- epoch/owner are used by actors.infer_safe only; the naive job never reads them.
CREATE TABLE IF NOT EXISTS inference_results (
    request_id    text PRIMARY KEY,
    input         text,
    status        text NOT NULL DEFAULT 'PENDING',
    output        text,
    model_version text,
    epoch         int  NOT NULL DEFAULT 0,
    owner         text,
    updated_at    timestamptz
);
