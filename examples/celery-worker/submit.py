"""Enqueue one inference request the way the team's API does: ``task.delay(...)``.

    python submit.py REQUEST_ID INPUT [--fenced | --locked]

Reads ``BROKER_URL`` like the worker. Prints the Celery task id. racecert can use it as a submit
command; its Celery preset writes the same message to Redis itself (no Python needed).
"""

import argparse

import tasks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request_id")
    parser.add_argument("input")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--fenced", action="store_true", help="enqueue tasks.infer_fenced")
    which.add_argument("--locked", action="store_true", help="enqueue tasks.infer_locked")
    args = parser.parse_args()
    if args.fenced:
        task = tasks.infer_fenced
    elif args.locked:
        task = tasks.infer_locked
    else:
        task = tasks.infer_naive
    result = task.delay(request_id=args.request_id, input=args.input)
    print(result.id)


if __name__ == "__main__":
    main()
