"""An inference worker written the way a team writes it on Celery 5 with the Redis broker.

The tasks do the same job (create the result row, call the model, store its output):

- ``tasks.infer_naive`` ends with a plain ``UPDATE ... WHERE request_id = ...``: when Celery runs a
  request twice (the message outlived ``visibility_timeout`` and was restored while the first
  attempt was still running), both attempts write and the slower one overwrites the faster one.
- ``tasks.infer_retrying`` is the naive task with Celery's ``autoretry_for`` on upstream errors:
  a model call that outlives ``MODEL_TIMEOUT_S`` marks the row FAILED and the retry writes
  SUCCEEDED over it, a final result taken back.
- ``tasks.infer_fenced`` takes an epoch at start and writes only while that epoch is still the
  row's: of two overlapping attempts only the one that took the latest epoch writes; the other one
  logs ``late_write_rejected`` and discards its result. It also sets ``reject_on_worker_lost`` so a
  killed pool child requeues its message instead of losing the job, and retries when the database
  is unreachable instead of leaving its row unfinished.
- ``tasks.infer_fenced_resuming`` is the fenced task that retries a refused final write later with
  the same epoch and output: the late attempt's message is retried for ever, never acknowledged.
- ``tasks.infer_locked`` is the fenced task behind a per-request Redis lock that saves duplicate
  model calls, with a flaw only the wire shows: a redelivered message takes the lock over.

Every task reads the model through a result cache when ``CACHE_PREFIX`` is set (keys
``{CACHE_PREFIX}{sha256 of the input}``, ``CACHE_TTL_S``, default 3600): ``cached.toml`` puts the
model version in the prefix; ``stale-cache.toml`` does not, so after a rollout the new version
serves the old model's cached output.

Configuration comes from the environment only, so any harness (racecert, a test, a person) can run
it unchanged: ``BROKER_URL`` (Redis), ``DATABASE_URL`` (Postgres), ``MODEL_URL`` (an
OpenAI-compatible server), ``MODEL_NAME``, ``MODEL_VERSION``, ``WORKER_NAME``,
``VISIBILITY_TIMEOUT_S`` (default 5: short on purpose, real inference outlives it),
``MODEL_TIMEOUT_S`` (default 30), ``LOCK_TTL_MS`` (default 60000), ``IGNORE_SIGTERM`` (``1``:
the drain bug of ``draining.toml``), ``CACHE_PREFIX``, ``CACHE_TTL_S``, ``VERSION_FROM_ANSWER``
(``1``: record the version the model answered with, not the worker's own).
"""

import hashlib
import json
import logging
import os
import urllib.error
import urllib.request
import uuid

import psycopg
import redis
from celery import Celery
from celery.utils.log import get_task_logger

BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:8000").rstrip("/")
MODEL_NAME = os.environ.get("MODEL_NAME", "inference-model")
MODEL_VERSION = os.environ.get("MODEL_VERSION", "v1")
WORKER_NAME = os.environ.get("WORKER_NAME", "worker-a")
VISIBILITY_TIMEOUT_S = float(os.environ.get("VISIBILITY_TIMEOUT_S", "5"))
MODEL_TIMEOUT_S = float(os.environ.get("MODEL_TIMEOUT_S", "30"))
LOCK_TTL_MS = int(os.environ.get("LOCK_TTL_MS", "60000"))
CACHE_PREFIX = os.environ.get("CACHE_PREFIX", "")
CACHE_TTL_S = int(os.environ.get("CACHE_TTL_S", "3600"))
VERSION_FROM_ANSWER = os.environ.get("VERSION_FROM_ANSWER") == "1"

app = Celery("tasks", broker=BROKER_URL)
app.conf.update(
    # The settings a team picks to "not lose work": ack after the task returns, take one message
    # at a time. With the Redis broker an unacked message is restored after visibility_timeout,
    # whether or not the first attempt is still running.
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
    task_serializer="json",
    accept_content=["json"],
    # No result backend: the result lives in the team's own table.
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)

log = get_task_logger(__name__)

if os.environ.get("IGNORE_SIGTERM") == "1":
    import signal

    from celery.signals import worker_ready

    @worker_ready.connect
    def keep_consuming_after_sigterm(**_):
        """The drain bug (draining.toml): a SIGTERM handler of the team's own, installed once the
        worker is ready (to flush metrics, say), replaces Celery's warm shutdown and never stops
        the consumer. Told to stop during a rollout, the worker goes on taking jobs until the
        orchestrator's SIGKILL ends it in the middle of one."""

        def flush_and_carry_on(signum, frame):
            logging.getLogger("tasks").warning("SIGTERM received: metrics flushed")

        signal.signal(signal.SIGTERM, flush_and_carry_on)


def _logfmt_value(value):
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def step(task, request_id, status, level=logging.INFO, **extra):
    """One log line per step, with the fields a diagnosis needs (the seed's field names)."""
    delivery = task.request.delivery_info or {}
    redelivered = bool(delivery.get("redelivered"))
    fields = {
        "request_id": request_id,
        "job_id": task.request.id,
        "attempt": task.request.retries + 1,
        "redelivered": str(redelivered).lower(),
        "worker_id": WORKER_NAME,
        "model_version": MODEL_VERSION,
        "backend_endpoint": MODEL_URL,
        "status": status,
    }
    fields.update(extra)
    log.log(level, " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items()))


def connect():
    # autocommit: every statement is its own transaction, as in most team code.
    return psycopg.connect(DATABASE_URL, autocommit=True)


def ensure_row(conn, request_id, text):
    """The task creates its own row, so submitting is only enqueueing the Celery message."""
    conn.execute(
        "INSERT INTO inference_results (request_id, input, status, updated_at)"
        " VALUES (%s, %s, 'PENDING', now()) ON CONFLICT (request_id) DO NOTHING",
        (request_id, text),
    )


def call_model(text):
    """OpenAI-compatible completion: POST {MODEL_URL}/v1/completions -> (choices[0].text, the
    model that answered: its ``model`` field)."""
    body = json.dumps({"model": MODEL_NAME, "prompt": text}).encode()
    req = urllib.request.Request(
        f"{MODEL_URL}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=MODEL_TIMEOUT_S) as resp:
        answer = json.load(resp)
    return answer["choices"][0]["text"], answer.get("model") or MODEL_VERSION


def call_model_cached(task, request_id, text):
    """The model behind the result cache a team adds once the same prompts come back: a hit is
    served as is, a miss computed and stored. Whether a rollout serves the old model's output
    depends only on the key: with the version in ``CACHE_PREFIX`` the new version misses and
    computes; without it, it reads what the old version stored.

    Returns the output and the version the row records: the worker's own (``MODEL_VERSION``),
    or with ``VERSION_FROM_ANSWER=1`` the model that answered, for workers that share one model
    URL whose backend a rollout switches under them (``backend-switch.toml``)."""
    if not CACHE_PREFIX:
        return recorded(*call_model(text))
    key = CACHE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]
    store = lock_store()
    hit = store.get(key)
    if hit is not None:
        step(task, request_id, "cache_hit", cache_key=key)
        return hit.decode(), MODEL_VERSION
    output, answered_by = call_model(text)
    store.set(key, output, ex=CACHE_TTL_S)
    return recorded(output, answered_by)


def recorded(output, answered_by):
    return output, answered_by if VERSION_FROM_ANSWER else MODEL_VERSION


def received(task, request_id):
    redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
    step(task, request_id, "retry_dispatched" if redelivered else "job_received")


@app.task(bind=True, name="tasks.infer_naive")
def infer_naive(self, request_id, input):
    """Call the model and store its answer: last writer wins."""
    received(self, request_id)
    run_naive(self, request_id, input)


# The errors of a model call that a retry may cure: a timeout (urllib raises TimeoutError from a
# read that outlived MODEL_TIMEOUT_S), a refused or reset connection, an HTTP error.
UPSTREAM_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError)


@app.task(
    bind=True,
    name="tasks.infer_retrying",
    autoretry_for=UPSTREAM_ERRORS,
    retry_backoff=1,
    retry_backoff_max=2,
    retry_jitter=False,
    max_retries=3,
)
def infer_retrying(self, request_id, input):
    """The naive task with the retry a team adds once the model starts timing out: an upstream
    error marks the row FAILED (so a client polling it hears at once) and Celery retries the task;
    the retry's success then writes SUCCEEDED over FAILED. Two final writes for one request: the
    client that read FAILED was told something the table later took back."""
    received(self, request_id)
    run_naive(self, request_id, input)


def run_naive(task, request_id, input):
    """The naive body: row, model call, a plain UPDATE of the final result (FAILED on an upstream
    error, then the error raised again)."""
    with connect() as conn:
        ensure_row(conn, request_id, input)
        step(task, request_id, "inference_started")
        try:
            output, version = call_model_cached(task, request_id, input)
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            step(task, request_id, "upstream_failed", logging.WARNING, error=exc)
            conn.execute(
                "UPDATE inference_results SET status = 'FAILED', owner = %s, updated_at = now()"
                " WHERE request_id = %s",
                (WORKER_NAME, request_id),
            )
            raise
        conn.execute(
            "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
            " owner = %s, updated_at = now() WHERE request_id = %s",
            (output, version, WORKER_NAME, request_id),
        )
    step(task, request_id, "inference_succeeded", write="result_store")
    return None


# reject_on_worker_lost: a pool child killed mid-task has its message requeued instead of acked
# (Celery's default acks it: the job is lost). autoretry_for: a database outage fails the task,
# which Celery would ack, leaving the row RUNNING forever; a retry (a new message, retries + 1)
# finishes it once the database is back. Running it again is safe because of the fence.
RERUN_SAFELY = dict(
    reject_on_worker_lost=True,
    autoretry_for=(psycopg.OperationalError,),
    retry_backoff=1,
    retry_backoff_max=4,
    retry_jitter=False,
    max_retries=20,
)


@app.task(bind=True, name="tasks.infer_fenced", **RERUN_SAFELY)
def infer_fenced(self, request_id, input):
    """Take an epoch before the model call; write only while that epoch is still the row's."""
    received(self, request_id)
    run_fenced(self, request_id, input)


@app.task(
    bind=True,
    name="tasks.infer_fenced_acked",
    **{k: v for k, v in RERUN_SAFELY.items() if k != "reject_on_worker_lost"},
)
def infer_fenced_acked(self, request_id, input):
    """The fenced task as a team writes it first: the epoch fence is right, but without
    ``reject_on_worker_lost`` Celery acks the message of a pool child killed mid-task (its
    default), so nothing runs the job again and its row stays RUNNING: a lost job that only a
    kill of the child holding it shows."""
    received(self, request_id)
    run_fenced(self, request_id, input)


def run_fenced(task, request_id, input):
    """The fenced body: epoch at start, final write only while the epoch is still the row's."""
    with connect() as conn:
        epoch = take_epoch(task, conn, request_id, input)
        if epoch is None:
            return None
        output, version = fenced_model_call(task, conn, request_id, input, epoch)
        if not fenced_write(task, conn, request_id, epoch, output, version):
            step(task, request_id, "discarded_late_result", logging.WARNING, generation=epoch)
    return None


def take_epoch(task, conn, request_id, input):
    """Creates the row if needed and takes the next epoch; None when the row is already final."""
    ensure_row(conn, request_id, input)
    row = conn.execute(
        "UPDATE inference_results SET epoch = epoch + 1, owner = %s, status = 'RUNNING',"
        " updated_at = now() WHERE request_id = %s AND status NOT IN ('SUCCEEDED', 'FAILED')"
        " RETURNING epoch",
        (WORKER_NAME, request_id),
    ).fetchone()
    if row is None:
        step(task, request_id, "already_completed")
        return None
    epoch = row[0]
    step(task, request_id, "job_taken", generation=epoch)
    step(task, request_id, "inference_started", generation=epoch)
    return epoch


def fenced_model_call(task, conn, request_id, input, epoch):
    """The model call; an upstream error marks the row FAILED (while the epoch is its own)."""
    try:
        return call_model_cached(task, request_id, input)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        step(task, request_id, "upstream_failed", logging.WARNING, error=exc)
        conn.execute(
            "UPDATE inference_results SET status = 'FAILED', updated_at = now()"
            " WHERE request_id = %s AND epoch = %s AND status NOT IN ('SUCCEEDED', 'FAILED')",
            (request_id, epoch),
        )
        conn.commit()
        raise


def fenced_write(task, conn, request_id, epoch, output, version):
    """The final write, only while ``epoch`` is still the row's; True when it wrote."""
    written = conn.execute(
        "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
        " updated_at = now()"
        " WHERE request_id = %s AND epoch = %s AND status NOT IN ('SUCCEEDED', 'FAILED')",
        (output, version, request_id, epoch),
    ).rowcount
    # Committed before it is logged: a log line says what the table already holds.
    conn.commit()
    if written == 1:
        step(task, request_id, "inference_succeeded", write="result_store", generation=epoch)
        return True
    step(task, request_id, "late_write_rejected", logging.WARNING, generation=epoch)
    return False


# max_retries=None on the task: ``self.retry(max_retries=None)`` would mean the task's own limit.
@app.task(
    bind=True,
    name="tasks.infer_fenced_resuming",
    **{**RERUN_SAFELY, "max_retries": None},
)
def infer_fenced_resuming(self, request_id, input, epoch=None, output=None, version=None):
    """The fenced task with a "resume" a team adds so that no computed result is thrown away: a
    refused final write is retried later with the same epoch and output, as if the refusal were a
    passing conflict. It never is (the row's epoch only grows): a late attempt's message is
    retried for ever and never acknowledged, a stuck delivery, though the row ended once."""
    received(self, request_id)
    with connect() as conn:
        if epoch is None:
            epoch = take_epoch(self, conn, request_id, input)
            if epoch is None:
                return None
            output, version = fenced_model_call(self, conn, request_id, input, epoch)
        if fenced_write(self, conn, request_id, epoch, output, version):
            return None
    step(self, request_id, "write_retry_scheduled", logging.WARNING, generation=epoch)
    kwargs = dict(request_id=request_id, input=input, epoch=epoch, output=output, version=version)
    raise self.retry(kwargs=kwargs, countdown=1)


_LOCKS = None


def lock_store():
    """The Redis the locks live in: the broker's (one connection pool per process)."""
    global _LOCKS
    if _LOCKS is None:
        _LOCKS = redis.Redis.from_url(BROKER_URL)
    return _LOCKS


# Compare-and-delete: release the lock only while it still holds this attempt's token.
RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


@app.task(bind=True, name="tasks.infer_locked", **RERUN_SAFELY)
def infer_locked(self, request_id, input):
    """The fenced task behind a per-request lock (``lock:{request_id}``, ``SET NX PX``) that saves
    duplicate model calls, released by compare-and-delete.

    Its flaw, a common one: a redelivered message is taken to mean that the worker running it
    died, so the lock is taken over (``SET`` without ``NX``) instead of waited for. With the Redis
    broker a redelivery means only that the message outlived ``visibility_timeout``; the first
    attempt may still be running, and then two attempts hold the lock at once. The result table
    stays right (the epoch fence); the lock does not, and nothing in the logs says so: only the
    wire does (racecert's lease-discipline check, given ``[keys] lease = "lock:{key}"``).
    """
    received(self, request_id)
    key = f"lock:{request_id}"
    token = f"{WORKER_NAME}:{self.request.id}:{uuid.uuid4().hex[:8]}"
    store = lock_store()
    if (self.request.delivery_info or {}).get("redelivered"):
        # "The first worker died": take its lock over.
        store.set(key, token, px=LOCK_TTL_MS)
        step(self, request_id, "lock_taken_over")
    elif not store.set(key, token, px=LOCK_TTL_MS, nx=True):
        step(self, request_id, "lock_busy")
        raise self.retry(countdown=1)
    try:
        run_fenced(self, request_id, input)
    finally:
        store.eval(RELEASE, 1, key, token)
