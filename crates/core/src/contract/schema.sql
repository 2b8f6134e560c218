-- racecert contract schema: the jobs table every worker under test writes to, and the audit
-- trail that a trigger fills on every insert and update. The checkers read the audit table as
-- ground truth: a worker can skip its own logging, it cannot skip this trigger.
--
-- Applying this file is idempotent (IF NOT EXISTS / OR REPLACE), so a test bed can apply it on
-- every start without dropping data of a running suite.

CREATE TABLE IF NOT EXISTS inference_jobs (
    idempotency_key TEXT PRIMARY KEY,
    request_id      TEXT        NOT NULL,
    job_id          TEXT        NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'IN_PROGRESS', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    lease_token     TEXT,
    generation      BIGINT      NOT NULL DEFAULT 0,
    model_version   TEXT,
    output          TEXT,
    attempt         INTEGER     NOT NULL DEFAULT 0,
    worker_id       TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    completed_at    TIMESTAMPTZ
);

CREATE TABLE IF NOT EXISTS inference_jobs_audit (
    audit_id          BIGSERIAL   PRIMARY KEY,
    idempotency_key   TEXT        NOT NULL,
    operation         TEXT        NOT NULL,
    old_status        TEXT,
    new_status        TEXT        NOT NULL,
    old_generation    BIGINT,
    new_generation    BIGINT      NOT NULL,
    old_model_version TEXT,
    new_model_version TEXT,
    old_lease_token   TEXT,
    new_lease_token   TEXT,
    worker_id         TEXT,
    attempt           INTEGER     NOT NULL,
    output            TEXT,
    txid              BIGINT      NOT NULL DEFAULT txid_current(),
    recorded_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Lease epochs: a per-job counter a worker draws from while it holds the job's lease, and
-- confirms the lease still holds afterwards. Two holders of one lease draw in the order they
-- held it, so the take (`generation < epoch`) admits only the newest holder, however long an
-- older one paused between its lease and its take. Kept outside the jobs table so drawing leaves
-- no audit row; in Postgres, not Redis, so a Redis restart cannot hand out an old epoch again.
CREATE TABLE IF NOT EXISTS inference_lease_epochs (
    idempotency_key TEXT   PRIMARY KEY,
    epoch           BIGINT NOT NULL
);

-- A bed on external services applies this to a database whose tables other beds' workers may be
-- writing. A worker's write locks the job row's table, then (through the trigger) the audit
-- table; the statements below lock both too, in the other order (the index, then the trigger).
-- Taking both locks first, in the workers' order, is what keeps the two from deadlocking.
LOCK TABLE inference_jobs, inference_jobs_audit IN ACCESS EXCLUSIVE MODE;

-- The server process of the connection that wrote: on the wire, each connection's startup names
-- its process (BackendKeyData), so a write is attributed to the worker whose connection carried
-- it, whatever columns the writer chose to set. (Added to tables of older schemas too.)
ALTER TABLE inference_jobs_audit ADD COLUMN IF NOT EXISTS backend_pid INTEGER NOT NULL DEFAULT pg_backend_pid();

CREATE INDEX IF NOT EXISTS inference_jobs_audit_key ON inference_jobs_audit (idempotency_key, audit_id);

CREATE OR REPLACE FUNCTION inference_jobs_audit_row() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO inference_jobs_audit (idempotency_key, operation, old_status, new_status,
            old_generation, new_generation, old_model_version, new_model_version,
            old_lease_token, new_lease_token, worker_id, attempt, output)
        VALUES (NEW.idempotency_key, TG_OP, NULL, NEW.status, NULL, NEW.generation, NULL,
            NEW.model_version, NULL, NEW.lease_token, NEW.worker_id, NEW.attempt, NEW.output);
    ELSE
        INSERT INTO inference_jobs_audit (idempotency_key, operation, old_status, new_status,
            old_generation, new_generation, old_model_version, new_model_version,
            old_lease_token, new_lease_token, worker_id, attempt, output)
        VALUES (NEW.idempotency_key, TG_OP, OLD.status, NEW.status, OLD.generation,
            NEW.generation, OLD.model_version, NEW.model_version, OLD.lease_token,
            NEW.lease_token, NEW.worker_id, NEW.attempt, NEW.output);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS inference_jobs_audit_trigger ON inference_jobs;
CREATE TRIGGER inference_jobs_audit_trigger
    AFTER INSERT OR UPDATE ON inference_jobs
    FOR EACH ROW EXECUTE FUNCTION inference_jobs_audit_row();
