"""Enqueue one inference request the way the team's API does: ``Queue.enqueue(...)``.

    python submit.py REQUEST_ID INPUT [--job naive|safe|unguarded] [--insert]

Reads ``REDIS_URL`` like the worker. ``--job safe`` and ``--job unguarded`` enqueue
``jobs.infer_safe`` / ``jobs.infer_unguarded`` with ``Retry(max=3)`` (RQ enqueues the job again
when its work horse dies or it raises); the default, ``jobs.infer_naive``, with no retry. The job's id is the request id plus a random suffix (RQ job
ids must be unique while the job is kept), printed on stdout.

``--insert`` submits as an API that stores the request first: it INSERTs the request's row
(``DATABASE_URL``; the primary key is the request id) before enqueueing, so a request submitted
again is refused (exit 1, "already accepted") instead of run twice.
"""

import argparse
import os
import sys
import uuid

import psycopg
from redis import Redis
from rq import Queue, Retry

MAX_RETRIES = 3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request_id")
    parser.add_argument("input")
    parser.add_argument("--job", choices=["naive", "safe", "unguarded"], default="naive")
    parser.add_argument("--insert", action="store_true", help="store the request's row first")
    args = parser.parse_args()
    if args.insert:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            try:
                conn.execute(
                    "INSERT INTO inference_results (request_id, input, status, updated_at)"
                    " VALUES (%s, %s, 'PENDING', now())",
                    (args.request_id, args.input),
                )
            except psycopg.errors.UniqueViolation:
                sys.exit(f"request {args.request_id} already accepted")
    queue = Queue("inference", connection=Redis.from_url(os.environ["REDIS_URL"]))
    options = {"job_id": f"{args.request_id}-{uuid.uuid4().hex[:8]}", "job_timeout": 120}
    if args.job != "naive":
        options.update(retry=Retry(max=MAX_RETRIES), meta={"max_retries": MAX_RETRIES})
    job = queue.enqueue(
        f"jobs.infer_{args.job}",
        kwargs={"request_id": args.request_id, "input": args.input},
        **options,
    )
    print(job.id)


if __name__ == "__main__":
    main()
