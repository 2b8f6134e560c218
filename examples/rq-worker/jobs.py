"""An inference worker as a team writes it on RQ (python-rq) with Redis: a framework racecert has
no preset for (``framework = "custom"``). RQ's worker forks a work horse per job and puts it in a
process group of its own (``os.setpgrp()``), so a signal to the worker's group never reaches the
process that runs the job.

- ``jobs.infer_naive(request_id, input)``: creates its row, calls the model, then a plain
  ``UPDATE ... WHERE request_id = ...``. Enqueued without a ``Retry``: when its work horse dies
  (the OOM killer, a node's kill), RQ moves the job to its FailedJobRegistry and the row stays
  ``RUNNING`` for good: a lost job.
- ``jobs.infer_safe(request_id, input)``: enqueued with ``Retry(max=3)``, so RQ enqueues the job
  again when its horse dies or it raises; each attempt takes ``epoch = epoch + 1`` and its final
  write holds only while the epoch is still the row's, so an older attempt never overwrites a
  newer one.
- ``jobs.infer_unguarded(request_id, input)``: the safe job's take without the guard on its final
  write: when the API submits a request again, the older attempt's late result overwrites the
  newer one's (racecert's fencing invariants name the epoch it wrote under).

Variables: ``REDIS_URL``, ``DATABASE_URL``, ``MODEL_URL`` (OpenAI-style ``/v1/completions``),
``MODEL_NAME``, ``MODEL_VERSION``, ``WORKER_NAME``, ``MODEL_TIMEOUT_S``.
"""

import json
import logging
import os
import sys
import urllib.error
import urllib.request

import psycopg
from rq import get_current_job

DATABASE_URL = os.environ["DATABASE_URL"]
MODEL_URL = os.environ["MODEL_URL"].rstrip("/")
MODEL_NAME = os.environ.get("MODEL_NAME", "inference-model")
MODEL_VERSION = os.environ.get("MODEL_VERSION", "v1")
WORKER_NAME = os.environ.get("WORKER_NAME", "worker")
MODEL_TIMEOUT_S = float(os.environ.get("MODEL_TIMEOUT_S", "15"))

log = logging.getLogger("jobs")
if not log.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _logfmt_value(value):
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def step(request_id, status, level=logging.INFO, **extra):
    """One logfmt line per step, with the fields a diagnosis needs."""
    job = get_current_job()
    fields = {
        "request_id": request_id,
        "job_id": job.id if job else "",
        "attempt": attempt(job),
        "worker_id": WORKER_NAME,
        "model_version": MODEL_VERSION,
        "pid": os.getpid(),
        "status": status,
    }
    fields.update(extra)
    log.log(level, " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items()))


def attempt(job):
    """1 for the first run; RQ counts retries down from the ``max_retries`` submit.py records."""
    if job is None:
        return 1
    return job.meta.get("max_retries", 0) - (job.retries_left or 0) + 1


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
    """POST {MODEL_URL}/v1/completions -> choices[0].text."""
    body = json.dumps({"model": MODEL_NAME, "prompt": text}).encode()
    req = urllib.request.Request(
        f"{MODEL_URL}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=MODEL_TIMEOUT_S) as resp:
        answer = json.load(resp)
    return answer["choices"][0]["text"]


def infer_naive(request_id, input):
    step(request_id, "job_received")
    with connect() as conn:
        ensure_row(conn, request_id, input)
        conn.execute(
            "UPDATE inference_results SET status = 'RUNNING', owner = %s, updated_at = now()"
            " WHERE request_id = %s",
            (WORKER_NAME, request_id),
        )
        step(request_id, "inference_started")
        try:
            output = call_model(input)
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            step(request_id, "upstream_failed", logging.WARNING, error=exc)
            conn.execute(
                "UPDATE inference_results SET status = 'FAILED', updated_at = now()"
                " WHERE request_id = %s",
                (request_id,),
            )
            raise
        conn.execute(
            "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
            " updated_at = now() WHERE request_id = %s",
            (output, MODEL_VERSION, request_id),
        )
    step(request_id, "inference_succeeded", write="result_store")


def infer_safe(request_id, input):
    run_epoch(request_id, input, fenced_write=True)


def infer_unguarded(request_id, input):
    """The safe job's take without its guard on the final write: the fix half made. An older
    attempt's late result still overwrites the newer one's."""
    run_epoch(request_id, input, fenced_write=False)


def run_epoch(request_id, input, fenced_write):
    job = get_current_job()
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
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            step(request_id, "upstream_failed", logging.WARNING, error=exc, generation=epoch)
            if not (job and job.retries_left):
                # The last attempt: the request ends FAILED, once, if no newer attempt took it.
                conn.execute(
                    "UPDATE inference_results SET status = 'FAILED', updated_at = now()"
                    " WHERE request_id = %s AND epoch = %s"
                    " AND status NOT IN ('SUCCEEDED', 'FAILED')",
                    (request_id, epoch),
                )
            raise
        guard = " AND epoch = %s AND status NOT IN ('SUCCEEDED', 'FAILED')" if fenced_write else ""
        written = conn.execute(
            "UPDATE inference_results SET status = 'SUCCEEDED', output = %s, model_version = %s,"
            " updated_at = now() WHERE request_id = %s" + guard,
            (output, MODEL_VERSION, request_id, epoch) if fenced_write
            else (output, MODEL_VERSION, request_id),
        ).rowcount
    if written == 1:
        step(request_id, "inference_succeeded", write="result_store", generation=epoch)
    else:
        step(request_id, "late_write_rejected", logging.WARNING, generation=epoch)
