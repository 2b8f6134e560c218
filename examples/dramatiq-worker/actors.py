"""An inference worker as a team writes it on Dramatiq with its Redis broker (racecert's
``framework = "dramatiq"`` preset). ``dramatiq actors --processes 1 --threads 1`` forks one
worker process that runs the messages; the main process only watches it (and stops everything
when it dies).

- ``infer_naive(request_id, input)``: creates its row, calls the model, then a plain
  ``UPDATE ... WHERE request_id = ...``. When the broker requeues a live message (its worker
  stopped heartbeating past ``heartbeat_timeout``: a GC pause, a frozen container) two attempts
  run and both write a final status; after its own model timeout it writes ``FAILED`` and
  Dramatiq's Retries middleware runs it again, which then writes ``SUCCEEDED`` too.
- ``infer_safe(request_id, input)``: each attempt takes ``epoch = epoch + 1`` and its final
  write holds only while the epoch is still the row's; the last retry writes ``FAILED``, once.
- ``infer_lost(request_id, input)``: ``max_retries=0`` and no failure write: when its model
  call times out the message goes to Dramatiq's dead-letter queue and the row stays ``RUNNING``
  for good: a lost job.

Every actor runs under ``time_limit=TIME_LIMIT_MS`` (Dramatiq's ``TimeLimit`` middleware, 600 s
by default). Its ``TimeLimitExceeded`` is a ``BaseException`` raised in the actor's thread once a
blocking read returns: past the limit, the model's answer arrives and is dropped, no ``except
Exception`` (nor ``MODEL_ERRORS``) sees it, and the Retries middleware runs the message again.

Variables: ``REDIS_URL``, ``DATABASE_URL``, ``MODEL_URL`` (OpenAI-style ``/v1/completions``),
``MODEL_NAME``, ``MODEL_VERSION``, ``WORKER_NAME``, ``MODEL_TIMEOUT_S``, ``MODEL_ATTEMPTS``,
``TIME_LIMIT_MS``, and the broker's ``DRAMATIQ_NAMESPACE``, ``HEARTBEAT_TIMEOUT_MS``,
``MAINTENANCE_CHANCE``.
"""

import json
import logging
import os
import urllib.error
import urllib.request

import dramatiq
import psycopg
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

DATABASE_URL = os.environ["DATABASE_URL"]
MODEL_URL = os.environ["MODEL_URL"].rstrip("/")
MODEL_NAME = os.environ.get("MODEL_NAME", "inference-model")
MODEL_VERSION = os.environ.get("MODEL_VERSION", "v1")
WORKER_NAME = os.environ.get("WORKER_NAME", "worker")
MODEL_TIMEOUT_S = float(os.environ.get("MODEL_TIMEOUT_S", "15"))
MODEL_ATTEMPTS = int(os.environ.get("MODEL_ATTEMPTS", "1"))
# Each actor's time limit, milliseconds (Dramatiq's own default when unset).
TIME_LIMIT_MS = int(os.environ.get("TIME_LIMIT_MS", "600000"))
# The Retries middleware's settings of the retrying actors: a short back-off, so that a retry
# runs within the seconds a test waits, not Dramatiq's default 15 s doubling 20 times.
MAX_RETRIES = 3

broker = RedisBroker(
    url=os.environ["REDIS_URL"],
    namespace=os.environ.get("DRAMATIQ_NAMESPACE", "dramatiq"),
    heartbeat_timeout=int(os.environ.get("HEARTBEAT_TIMEOUT_MS", "60000")),
    maintenance_chance=int(os.environ.get("MAINTENANCE_CHANCE", "1000")),
)
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)

# Dramatiq's worker process routes the root logger to its main process's stderr; a line reads
# `[time] [PID n] [Thread-1] [actors] [INFO] request_id=... status=...`.
log = logging.getLogger("actors")
log.setLevel(logging.INFO)


def _logfmt_value(value):
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def step(request_id, status, level=logging.INFO, **extra):
    """One logfmt line per step, with the fields a diagnosis needs."""
    message = CurrentMessage.get_current_message()
    fields = {
        "request_id": request_id,
        "job_id": message.message_id if message else "",
        "attempt": retries(message) + 1,
        "worker_id": WORKER_NAME,
        "model_version": MODEL_VERSION,
        "pid": os.getpid(),
        "status": status,
    }
    fields.update(extra)
    log.log(level, " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items()))


def retries(message):
    """How many times the Retries middleware has run this message again."""
    return message.options.get("retries", 0) if message else 0


def connect():
    # autocommit: every statement is its own transaction, as in most team code.
    return psycopg.connect(DATABASE_URL, autocommit=True)


def ensure_row(conn, request_id, text):
    conn.execute(
        "INSERT INTO inference_results (request_id, input, status, updated_at)"
        " VALUES (%s, %s, 'PENDING', now()) ON CONFLICT (request_id) DO NOTHING",
        (request_id, text),
    )


def call_model(text):
    """POST {MODEL_URL}/v1/completions -> choices[0].text, tried ``MODEL_ATTEMPTS`` times in a
    row when the model times out (an HTTP client's own retry: the next try starts at once,
    while the model may still be computing the first)."""
    body = json.dumps({"model": MODEL_NAME, "prompt": text}).encode()
    for attempt in range(1, MODEL_ATTEMPTS + 1):
        req = urllib.request.Request(
            f"{MODEL_URL}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=MODEL_TIMEOUT_S) as resp:
                answer = json.load(resp)
            return answer["choices"][0]["text"]
        except TimeoutError:
            if attempt == MODEL_ATTEMPTS:
                raise


MODEL_ERRORS = (urllib.error.URLError, OSError, KeyError, ValueError)


def take_plain(conn, request_id, text):
    """The naive take: the row RUNNING under this worker, whoever else holds it."""
    ensure_row(conn, request_id, text)
    conn.execute(
        "UPDATE inference_results SET status = 'RUNNING', owner = %s, updated_at = now()"
        " WHERE request_id = %s",
        (WORKER_NAME, request_id),
    )
    step(request_id, "inference_started")


def write_plain(conn, request_id, output):
    """The naive final write: whatever the row holds, this attempt's result replaces it."""
    conn.execute(
        "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
        " updated_at = now() WHERE request_id = %s",
        (output, MODEL_VERSION, request_id),
    )


@dramatiq.actor(
    max_retries=MAX_RETRIES, min_backoff=1000, max_backoff=4000, time_limit=TIME_LIMIT_MS
)
def infer_naive(request_id, input):
    step(request_id, "job_received")
    with connect() as conn:
        take_plain(conn, request_id, input)
        try:
            output = call_model(input)
        except MODEL_ERRORS as exc:
            step(request_id, "upstream_failed", logging.WARNING, error=exc)
            conn.execute(
                "UPDATE inference_results SET status = 'FAILED', updated_at = now()"
                " WHERE request_id = %s",
                (request_id,),
            )
            raise
        write_plain(conn, request_id, output)
    step(request_id, "inference_succeeded", write="result_store")


@dramatiq.actor(
    max_retries=MAX_RETRIES, min_backoff=1000, max_backoff=4000, time_limit=TIME_LIMIT_MS
)
def infer_safe(request_id, input):
    message = CurrentMessage.get_current_message()
    step(request_id, "job_received")
    with connect() as conn:
        ensure_row(conn, request_id, input)
        row = conn.execute(
            "UPDATE inference_results SET epoch = epoch + 1, owner = %s, status = 'RUNNING',"
            " updated_at = now() WHERE request_id = %s AND status NOT IN ('SUCCEEDED', 'FAILED')"
            " RETURNING epoch",
            (WORKER_NAME, request_id),
        ).fetchone()
        if row is None:
            step(request_id, "already_completed")
            return
        epoch = row[0]
        step(request_id, "inference_started", generation=epoch)
        try:
            output = call_model(input)
        except MODEL_ERRORS as exc:
            step(request_id, "upstream_failed", logging.WARNING, error=exc, generation=epoch)
            if retries(message) >= MAX_RETRIES:
                # The last attempt: the request ends FAILED, once, if no newer attempt took it.
                conn.execute(
                    "UPDATE inference_results SET status = 'FAILED', updated_at = now()"
                    " WHERE request_id = %s AND epoch = %s"
                    " AND status NOT IN ('SUCCEEDED', 'FAILED')",
                    (request_id, epoch),
                )
            raise
        written = conn.execute(
            "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
            " updated_at = now() WHERE request_id = %s AND epoch = %s"
            " AND status NOT IN ('SUCCEEDED', 'FAILED')",
            (output, MODEL_VERSION, request_id, epoch),
        ).rowcount
    if written == 1:
        step(request_id, "inference_succeeded", write="result_store", generation=epoch)
    else:
        step(request_id, "late_write_rejected", logging.WARNING, generation=epoch)


@dramatiq.actor(max_retries=0, time_limit=TIME_LIMIT_MS)
def infer_lost(request_id, input):
    step(request_id, "job_received")
    with connect() as conn:
        take_plain(conn, request_id, input)
        # No failure path: an exception leaves the row RUNNING, and with max_retries=0 the
        # message goes to the dead-letter queue instead of running again.
        output = call_model(input)
        write_plain(conn, request_id, output)
    step(request_id, "inference_succeeded", write="result_store")
