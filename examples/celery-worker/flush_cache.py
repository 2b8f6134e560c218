"""The cache invalidation step of a team's rollout: delete every key matching a pattern.

    python flush_cache.py REDIS_URL PATTERN

racecert runs it as ``[rollout] invalidate_command`` (``{redis_url}`` is the run's Redis, through
the submitter's proxy, so its commands are on the wire like a worker's).
"""

import sys

import redis


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: flush_cache.py REDIS_URL PATTERN")
    url, pattern = sys.argv[1], sys.argv[2]
    store = redis.Redis.from_url(url)
    keys = list(store.scan_iter(match=pattern, count=1000))
    deleted = store.delete(*keys) if keys else 0
    print(f"deleted {deleted} key(s) matching {pattern}")


if __name__ == "__main__":
    main()
