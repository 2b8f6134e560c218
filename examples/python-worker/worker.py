#!/usr/bin/env python3
"""A racecert worker written to the contract (docs/contract.md) in Python 3.11.

Per delivery: lease (SET NX PX) -> take the job (IN_PROGRESS, new generation) -> version-aware
cache -> backend call -> cache write -> fenced final write -> XACK -> compare-and-delete release.

    python worker.py              # the safe flow
    python worker.py --unfenced   # the seed's bug: a plain, unfenced final write
    python worker.py --release-without-check   # lease released with a plain DEL
    python worker.py --lease-without-nx        # lease taken with SET PX, without NX
    python worker.py --cache-active-namespace  # result cached under the version live now
    python worker.py --read-then-write         # final transition read, then written (check-then-act)

Configuration comes only from the RACECERT_* environment variables. Log lines (logfmt) go to
stdout; the worker's own start/stop notes go to stderr. SIGTERM (or SIGINT) drains: no new job
is taken, the delivery in hand is finished, the process exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import psycopg
import redis

CACHE_TTL_S = 3600
BLOCK_MS = 200

# Compare-and-delete: release the lease only if it still holds our token.
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

TAKE_SQL = """
UPDATE inference_jobs
SET status = 'IN_PROGRESS', lease_token = %(token)s, generation = %(epoch)s,
    attempt = %(attempt)s, worker_id = %(worker_id)s, model_version = %(version)s,
    updated_at = clock_timestamp()
WHERE idempotency_key = %(key)s AND status IN ('PENDING', 'IN_PROGRESS')
  AND generation < %(epoch)s
RETURNING generation
"""

# The lease's epoch, drawn while holding the lease (and the lease confirmed after): holders of one
# lease draw in the order they held it, so the take admits only the newest holder.
DRAW_EPOCH_SQL = """
INSERT INTO inference_lease_epochs (idempotency_key, epoch) VALUES (%(key)s, 1)
ON CONFLICT (idempotency_key) DO UPDATE SET epoch = inference_lease_epochs.epoch + 1
RETURNING epoch
"""

FENCED_WRITE_SQL = """
UPDATE inference_jobs
SET status = 'SUCCEEDED', output = %(output)s, model_version = %(version)s,
    generation = %(next_generation)s,
    updated_at = clock_timestamp(), completed_at = clock_timestamp()
WHERE idempotency_key = %(key)s AND status = 'IN_PROGRESS' AND lease_token = %(token)s
  AND generation < %(next_generation)s
"""

# The seed's bug (--unfenced): last writer wins, whatever the row's state.
UNFENCED_WRITE_SQL = """
UPDATE inference_jobs
SET status = 'SUCCEEDED', output = %(output)s, model_version = %(version)s,
    generation = %(next_generation)s, lease_token = %(token)s,
    updated_at = clock_timestamp(), completed_at = clock_timestamp()
WHERE idempotency_key = %(key)s
"""

# --fence-on-status: the final write fenced by the status alone, not by the lease token, with the
# generation the attempt computed when it took the job. Right while only one attempt holds the
# job; a takeover between the take and the write (lease expiry, then another worker's take) lets
# the late attempt write over the new holder's IN_PROGRESS row with a generation that does not
# increase. Three ordered steps of two workers: a take, a takeover, a write.
STATUS_FENCED_WRITE_SQL = """
UPDATE inference_jobs
SET status = 'SUCCEEDED', output = %(output)s, model_version = %(version)s,
    generation = %(next_generation)s, lease_token = %(token)s,
    updated_at = clock_timestamp(), completed_at = clock_timestamp()
WHERE idempotency_key = %(key)s AND status = 'IN_PROGRESS'
"""

# --late-write-without-token: the final write by key and status alone, the token columns left
# alone (the lease was checked just before, with a GET): a late writer lands on the row of the
# attempt that took the job over, and its token columns still name that attempt.
TOKENLESS_WRITE_SQL = """
UPDATE inference_jobs
SET status = 'SUCCEEDED', output = %(output)s, model_version = %(version)s,
    generation = generation + 1,
    updated_at = clock_timestamp(), completed_at = clock_timestamp()
WHERE idempotency_key = %(key)s AND status = 'IN_PROGRESS'
"""

# --read-then-write: the final transition as a read, then a write in a second statement; the
# check is right when it runs and may be stale when the write lands (a time-of-check bug).
CHECK_OWNER_SQL = """
SELECT status, lease_token FROM inference_jobs WHERE idempotency_key = %(key)s
"""
CHECKED_WRITE_SQL = """
UPDATE inference_jobs
SET status = 'SUCCEEDED', output = %(output)s, model_version = %(version)s,
    generation = %(next_generation)s,
    updated_at = clock_timestamp(), completed_at = clock_timestamp()
WHERE idempotency_key = %(key)s
"""


class ConfigError(Exception):
    pass


class UpstreamError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    worker_id: str
    model_version: str
    redis_url: str
    database_url: str
    backend_url: str
    backend_endpoint: str
    key_prefix: str
    stream: str
    group: str
    lease_ttl_ms: int
    visibility_timeout_ms: int
    backend_timeout_ms: int

    @staticmethod
    def from_env(env: dict[str, str]) -> "Config":
        def var(name: str) -> str:
            value = env.get(name)
            if value is None or value == "":
                raise ConfigError(f"{name} is not set (see docs/contract.md)")
            return value

        def ms(name: str) -> int:
            raw = var(name)
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value <= 0:
                raise ConfigError(f"{name}={raw!r}: expected a positive number of milliseconds")
            return value

        prefix = env.get("RACECERT_KEY_PREFIX", "")
        if prefix and not prefix.endswith(":"):
            raise ConfigError(f"RACECERT_KEY_PREFIX={prefix!r} must be empty or end with ':'")
        worker_id = var("RACECERT_WORKER_ID")
        if any(c.isspace() for c in worker_id):
            raise ConfigError("RACECERT_WORKER_ID must not contain whitespace")
        return Config(
            worker_id=worker_id,
            model_version=var("RACECERT_MODEL_VERSION"),
            redis_url=var("RACECERT_REDIS_URL"),
            database_url=var("RACECERT_DATABASE_URL"),
            backend_url=var("RACECERT_BACKEND_URL").rstrip("/"),
            backend_endpoint=var("RACECERT_BACKEND_ENDPOINT"),
            key_prefix=prefix,
            stream=env.get("RACECERT_STREAM") or f"{prefix}inference:jobs",
            group=env.get("RACECERT_CONSUMER_GROUP") or "inference-workers",
            lease_ttl_ms=ms("RACECERT_LEASE_TTL_MS"),
            visibility_timeout_ms=ms("RACECERT_VISIBILITY_TIMEOUT_MS"),
            backend_timeout_ms=ms("RACECERT_BACKEND_TIMEOUT_MS"),
        )

    # Redis key names of the contract, under the namespace prefix.
    def lease_key(self, idempotency_key: str) -> str:
        return f"{self.key_prefix}inference:lock:{idempotency_key}"

    def active_version_key(self) -> str:
        return f"{self.key_prefix}inference:active_model_version"

    def progress_key(self, idempotency_key: str) -> str:
        return f"{self.key_prefix}inference:progress:{idempotency_key}"

    def cache_key(self, normalized_input: str, version: str | None = None) -> str:
        v = version or self.model_version
        digest = hashlib.sha256(f"{normalized_input}:{v}".encode("utf-8")).hexdigest()
        return f"{self.key_prefix}inf:{v}:{digest}"


# ---------------------------------------------------------------------------------------------
# Logging: `TIMESTAMP LEVEL key=value ...`, one line per event, flushed.


def timestamp() -> str:
    now = dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def logfmt_value(value: object) -> str:
    text = " ".join(str(value).splitlines()) if value is not None else "-"
    if text == "" or any(c.isspace() or c in '"=\\' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


_log_lock = threading.Lock()


def emit(level: str, fields: list[tuple[str, object]]) -> None:
    line = timestamp() + " " + level + "".join(f" {k}={logfmt_value(v)}" for k, v in fields)
    with _log_lock:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass


def note(message: str) -> None:
    """The worker's own remarks (start, stop): stderr, never mixed into the contract's log."""
    try:
        print(f"{timestamp()} {message}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


@dataclass
class Attempt:
    """The contract fields every log line of one delivery carries."""

    request_id: str = "-"
    job_id: str = "-"
    idempotency_key: str = "-"
    attempt: object = "-"
    queue_receive_count: object = "-"
    cache_key: str = "-"


# ---------------------------------------------------------------------------------------------


@dataclass
class Delivery:
    entry_id: str
    fields: dict[str, str]
    receive_count: int


@dataclass(frozen=True)
class Bugs:
    """Mistakes a team plausibly makes, switched on by flags, for demonstrations."""

    unfenced: bool = False  # final write without the fence (the seed's bug)
    release_without_check: bool = False  # DEL the lease, not compare-and-delete
    lease_without_nx: bool = False  # SET the lease without NX: always "acquired"
    cache_active_namespace: bool = False  # cache under the version live when writing
    read_then_write: bool = False  # final transition as a read, then a write (check-then-act)
    ack_on_receive: bool = False  # ack as soon as the job is taken: a crash mid-job loses it
    renew_without_check: bool = False  # extend the lease before the write with SET XX, no token check
    fence_on_status: bool = False  # final write fenced by status, not by the lease token
    long_lease: bool = False  # leases of 20 minutes, whatever the environment says (a unit slip)
    late_write_without_token: bool = False  # lease checked by GET, then a write without the token
    lease_ttl_in_seconds: bool = False  # the TTL in milliseconds passed as seconds (EX)
    no_ack_when_completed: bool = False  # a delivery of a completed job is never acknowledged
    renew_after_get: bool = False  # lease checked with GET, then extended with PEXPIRE
    progress_hash: bool = False  # not a bug: each stage mirrored into a Redis hash (longer jobs)


class Worker:
    def __init__(self, config: Config, bugs: Bugs) -> None:
        self.config = config
        self.bugs = bugs
        self.unfenced = bugs.unfenced
        self.stopping = False  # SIGTERM received: drain.
        self.declined = False  # Declined a job of another version: drain.
        self.lease_seq = 0
        self.errors_in_a_row = 0
        self.redis = redis.Redis.from_url(
            config.redis_url,
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=5.0,  # a stalled Redis ends the attempt instead of hanging it
        )
        self.release_script = self.redis.register_script(RELEASE_LEASE)
        self.pg: psycopg.Connection | None = None
        self.group_ready = False

    # -- logging ------------------------------------------------------------------------------

    def log(self, level: str, a: Attempt, status: str, **extra: object) -> None:
        c = self.config
        fields: list[tuple[str, object]] = [
            ("request_id", a.request_id),
            ("job_id", a.job_id),
            ("idempotency_key", a.idempotency_key),
            ("attempt", a.attempt),
            ("worker_id", c.worker_id),
            ("model_version", c.model_version),
            ("backend_endpoint", c.backend_endpoint),
            ("cache_key", a.cache_key),
            ("queue_receive_count", a.queue_receive_count),
            ("status", status),
        ]
        fields.extend(extra.items())
        emit(level, fields)

    # -- connections --------------------------------------------------------------------------

    def db(self) -> psycopg.Connection:
        if self.pg is None or self.pg.closed or self.pg.broken:
            if self.pg is not None:
                try:
                    self.pg.close()
                except Exception:
                    pass
            self.pg = None
            self.pg = psycopg.connect(
                self.config.database_url,
                autocommit=True,
                connect_timeout=2,
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=2,
                # A statement stuck server-side must not outlive a lease by much.
                options=f"-c statement_timeout={max(5000, self.config.lease_ttl_ms)}",
            )
        return self.pg

    def drop_db(self) -> None:
        if self.pg is not None and (self.pg.closed or self.pg.broken):
            try:
                self.pg.close()
            except Exception:
                pass
            self.pg = None

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.config.stream, self.config.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self.group_ready = True

    # -- the queue ----------------------------------------------------------------------------

    def receive(self) -> Delivery | None:
        """A stale delivery (idle >= visibility timeout) first, else a new one."""
        c = self.config
        if not self.group_ready:
            self.ensure_group()
        try:
            claimed = self.redis.xautoclaim(
                c.stream, c.group, c.worker_id, c.visibility_timeout_ms, start_id="0-0", count=1
            )
            # [next_start_id, [(id, fields), ...], deleted_ids]
            entries = [e for e in (claimed[1] if len(claimed) > 1 else []) if e and e[1]]
            if entries:
                entry_id, fields = entries[0]
                pending = self.redis.xpending_range(c.stream, c.group, entry_id, entry_id, 1)
                count = int(pending[0]["times_delivered"]) if pending else 1
                return Delivery(entry_id, dict(fields), count)
            reply = self.redis.xreadgroup(
                c.group, c.worker_id, {c.stream: ">"}, count=1, block=BLOCK_MS
            )
        except redis.exceptions.ResponseError as err:
            if "NOGROUP" in str(err) or "UNBLOCKED" in str(err):
                # Redis restarted or was flushed and lost the stream and group: recreate them.
                self.group_ready = False
                return None
            raise
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                if fields:
                    return Delivery(entry_id, dict(fields), 1)
        return None

    # -- one delivery -------------------------------------------------------------------------

    def process(self, d: Delivery) -> None:
        c = self.config
        a = Attempt(
            request_id=d.fields.get("request_id", "-"),
            job_id=d.fields.get("job_id", "-"),
            idempotency_key=d.fields.get("idempotency_key", "-"),
            attempt=d.receive_count,
            queue_receive_count=d.receive_count,
        )
        missing = [f for f in ("idempotency_key", "job_id", "request_id", "input") if f not in d.fields]
        if missing:
            # Not a job message: left pending (racecert never enqueues one).
            self.log("WARN", a, "attempt_error",
                     error=f"stream entry {d.entry_id} has no {missing[0]} field: not a job message")
            return
        key = d.fields["idempotency_key"]
        job_input = d.fields["input"]
        self.log("INFO", a, "retry_dispatched" if d.receive_count > 1 else "job_received")

        lease_key = c.lease_key(key)
        token: str | None = None
        try:
            # Bound to one version for life: read the pointer once, decline another version's job.
            active = self.redis.get(c.active_version_key())
            if active is not None and active != c.model_version:
                self.declined = True
                self.log("INFO", a, "version_declined", active_model_version=active)
                return

            # Lease.
            candidate = f"{c.worker_id}:{self.lease_seq}"
            self.lease_seq += 1
            nx = not self.bugs.lease_without_nx
            ttl_ms = 20 * 60 * 1000 if self.bugs.long_lease else c.lease_ttl_ms
            if self.bugs.lease_ttl_in_seconds:
                taken = self.redis.set(lease_key, candidate, nx=nx, ex=ttl_ms)
            else:
                taken = self.redis.set(lease_key, candidate, nx=nx, px=ttl_ms)
            if not taken:
                self.log("INFO", a, "duplicate_skipped")
                return
            token = candidate
            self.log("INFO", a, "lease_acquired", lease_token=token)
            epoch = int(self.db().execute(DRAW_EPOCH_SQL, {"key": key}).fetchone()[0])
            if self.redis.get(lease_key) != token:
                self.log("INFO", a, "duplicate_skipped", reason="lease lost before the take")
                token = None
                return

            # Take the job: IN_PROGRESS, our token, our epoch as its (strictly larger) generation.
            row = self.db().execute(TAKE_SQL, {
                "key": key, "token": token, "attempt": d.receive_count,
                "worker_id": c.worker_id, "version": c.model_version, "epoch": epoch,
            }).fetchone()
            if row is None and not self.job_is_terminal(key):
                # A newer holder took the job: its delivery is not ours to acknowledge.
                self.log("INFO", a, "duplicate_skipped", reason="a newer lease took the job")
                self.release(lease_key, token, a)
                return
            if row is None:
                self.log("INFO", a, "already_completed")
                if not self.bugs.no_ack_when_completed:
                    self.ack(d, a)
                self.release(lease_key, token, a)
                return
            generation = int(row[0])
            self.log("INFO", a, "job_taken", generation=generation)
            self.progress(key, "taken")
            if self.bugs.ack_on_receive:
                # The message is "safe": the row says IN_PROGRESS. Unless this process dies
                # before the final write, which nothing will ever redeliver.
                self.ack(d, a)

            # Version-aware cache.
            a.cache_key = c.cache_key(job_input)
            output = self.redis.get(a.cache_key)
            from_cache = output is not None
            if from_cache:
                served = output.split(":", 1)[0] if ":" in output else "-"
                self.log("INFO", a, "cache_hit", served_model_version=served)
            else:
                self.log("INFO", a, "cache_miss")
                self.log("INFO", a, "inference_started")
                self.progress(key, "inference")
                try:
                    output = self.call_backend(job_input, key, d.receive_count, a)
                except UpstreamError as err:
                    self.log("WARN", a, "upstream_failed", error=str(err))
                    self.release(lease_key, token, a)
                    return
                write_key = a.cache_key
                if self.bugs.cache_active_namespace:
                    live = self.redis.get(c.active_version_key())
                    write_key = c.cache_key(job_input, live)
                self.redis.setex(write_key, CACHE_TTL_S, output)
                self.log("INFO", a, "cache_written")
                self.progress(key, "cached")

            if self.bugs.renew_without_check:
                # "Make sure the lease outlives the write": extended with a plain SET XX, which
                # also overwrites a lease another worker took after ours ran out.
                self.redis.set(lease_key, token, xx=True, px=c.lease_ttl_ms)
                self.log("INFO", a, "lease_renewed")

            self.progress(key, "writing")
            if self.bugs.renew_after_get:
                # "Renew only while it is ours": a GET, then a PEXPIRE, two round trips. The lease
                # can run out and pass to another worker between them, and the PEXPIRE then
                # extends that worker's lease (three ordered steps: a check, a takeover, a renew).
                if self.redis.get(lease_key) == token:
                    self.redis.pexpire(lease_key, c.lease_ttl_ms)
                    self.log("INFO", a, "lease_renewed")

            # Final write, then ack after commit, then release.
            if self.unfenced:
                self.unfenced_write(a, key, token, generation + 1, output, from_cache)
                written = True
            else:
                written = self.fenced_write(a, key, token, generation + 1, output, from_cache)
            # The stream entry is the job's: a rejected late writer acks only a finished job,
            # or the job's last delivery is gone if the attempt that took over failed.
            if self.bugs.ack_on_receive:
                pass  # acked when taken
            elif written or self.job_is_terminal(key):
                self.ack(d, a)
            else:
                self.log("INFO", a, "left_for_redelivery")
            self.release(lease_key, token, a)
        except (redis.exceptions.RedisError, psycopg.Error, OSError) as err:
            # Partition, restart, timeout: the attempt ends, the delivery stays unacknowledged
            # and the queue redelivers it after the visibility timeout.
            self.log("WARN", a, "attempt_error", error=f"{type(err).__name__}: {err}")
            self.drop_db()
            if token is not None:
                try:
                    self.release(lease_key, token, a)
                except (redis.exceptions.RedisError, OSError):
                    pass  # the lease expires by its TTL
            self.pause_after_error()

    def progress(self, key: str, stage: str) -> None:
        """With --progress-hash, the stage a job is at, for a dashboard: one HSET per stage."""
        if self.bugs.progress_hash:
            self.redis.hset(self.config.progress_key(key),
                            mapping={"stage": stage, "worker": self.config.worker_id})

    def call_backend(self, job_input: str, key: str, attempt: int, a: Attempt) -> str:
        c = self.config
        body = json.dumps({
            "input": job_input, "idempotency_key": key, "attempt": attempt,
            "worker_id": c.worker_id,
        }).encode("utf-8")
        request = urllib.request.Request(
            f"{c.backend_url}/v1/infer", data=body, method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        # Like the reference worker: warn at half the timeout, keep waiting until the timeout.
        warn = threading.Timer(c.backend_timeout_ms / 2000,
                               lambda: self.log("WARN", a, "timeout_waiting_upstream"))
        warn.daemon = True
        warn.start()
        try:
            with urllib.request.urlopen(request, timeout=c.backend_timeout_ms / 1000) as response:
                answer = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            raise UpstreamError(f"{c.backend_endpoint}: HTTP {err.code}") from err
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise UpstreamError(f"{c.backend_endpoint}: {reason}") from err
        except (ValueError, UnicodeDecodeError) as err:
            raise UpstreamError(f"{c.backend_endpoint}: bad answer: {err}") from err
        finally:
            warn.cancel()
        output = answer.get("output") if isinstance(answer, dict) else None
        if not isinstance(output, str):
            raise UpstreamError(f"{c.backend_endpoint}: bad answer: no string output")
        return output

    def job_is_terminal(self, key: str) -> bool:
        row = self.db().execute(
            "SELECT status FROM inference_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
        return row is not None and row[0] in ("SUCCEEDED", "FAILED", "CANCELLED")

    def fenced_write(self, a: Attempt, key: str, token: str, next_generation: int,
                     output: str, from_cache: bool) -> bool:
        if self.bugs.read_then_write:
            return self.checked_write(a, key, token, next_generation, output, from_cache)
        if self.bugs.late_write_without_token:
            if self.redis.get(self.config.lease_key(key)) != token:
                self.log("WARN", a, "late_write_rejected")
                self.log("INFO", a, "discarded_late_result")
                return False
            sql = TOKENLESS_WRITE_SQL
        elif self.bugs.fence_on_status:
            sql = STATUS_FENCED_WRITE_SQL
        else:
            sql = FENCED_WRITE_SQL
        written = self.db().execute(sql, {
            "key": key, "token": token, "next_generation": next_generation,
            "output": output, "version": self.config.model_version,
        }).rowcount
        if written == 1:
            self.log("INFO", a, "inference_succeeded", write="result_store",
                     generation=next_generation, from_cache=str(from_cache).lower())
            return True
        self.log("WARN", a, "late_write_rejected")
        self.log("INFO", a, "discarded_late_result")
        return False

    def checked_write(self, a: Attempt, key: str, token: str, next_generation: int,
                      output: str, from_cache: bool) -> bool:
        """--read-then-write: read the row, check it is still ours, then write it unfenced."""
        params = {"key": key, "token": token, "next_generation": next_generation,
                  "output": output, "version": self.config.model_version}
        row = self.db().execute(CHECK_OWNER_SQL, params).fetchone()
        if row is None or row[0] != "IN_PROGRESS" or row[1] != token:
            self.log("WARN", a, "late_write_rejected")
            self.log("INFO", a, "discarded_late_result")
            return False
        self.db().execute(CHECKED_WRITE_SQL, params)
        self.log("INFO", a, "inference_succeeded", write="result_store",
                 generation=next_generation, from_cache=str(from_cache).lower())
        return True

    def unfenced_write(self, a: Attempt, key: str, token: str, next_generation: int,
                       output: str, from_cache: bool) -> None:
        """The seed's bug. The row is read first only to log what the write overwrote."""
        version = self.config.model_version
        conn = self.db()
        with conn.transaction():
            before = conn.execute(
                "SELECT status, model_version FROM inference_jobs WHERE idempotency_key = %s FOR UPDATE",
                (key,),
            ).fetchone()
            conn.execute(UNFENCED_WRITE_SQL, {
                "key": key, "token": token, "next_generation": next_generation,
                "output": output, "version": version,
            })
        if before is not None and before[0] == "SUCCEEDED":
            self.log("INFO", a, "late_success", write="result_store")
            if before[1] != version:
                self.log("WARN", a, "overwrite_detected",
                         previous_model_version=before[1] or "-", new_model_version=version)
        else:
            self.log("INFO", a, "inference_succeeded", write="result_store",
                     generation=next_generation, from_cache=str(from_cache).lower())

    def ack(self, d: Delivery, a: Attempt) -> None:
        self.redis.xack(self.config.stream, self.config.group, d.entry_id)
        self.log("INFO", a, "acked")

    def release(self, lease_key: str, token: str, a: Attempt) -> None:
        if self.bugs.release_without_check:
            deleted = self.redis.delete(lease_key)
        else:
            deleted = self.release_script(keys=[lease_key], args=[token])
        self.log("INFO", a, "lease_released" if int(deleted) == 1 else "lease_lost")

    # -- the loop -----------------------------------------------------------------------------

    def pause_after_error(self) -> None:
        self.errors_in_a_row += 1
        time.sleep(min(0.1 * 2 ** min(self.errors_in_a_row, 5), 2.0))

    def run(self) -> int:
        note(f"worker {self.config.worker_id} ({self.config.model_version}) started"
             f"{' UNFENCED' if self.unfenced else ''}, stream {self.config.stream}")
        while not (self.stopping or self.declined):
            try:
                delivery = self.receive()
            except (redis.exceptions.RedisError, OSError) as err:
                self.log("WARN", Attempt(), "attempt_error", error=f"{type(err).__name__}: {err}")
                self.pause_after_error()
                continue
            if delivery is None:
                continue
            self.errors_in_a_row = 0
            # Finished even if SIGTERM arrives meanwhile; the loop then stops.
            try:
                self.process(delivery)
            except Exception as err:  # never die on one delivery: it is redelivered
                self.log("ERROR", Attempt(), "attempt_error", error=f"{type(err).__name__}: {err}")
                self.drop_db()
                self.pause_after_error()
        note(f"worker {self.config.worker_id} drained ("
             f"{'SIGTERM' if self.stopping else 'declined another version'}), exiting 0")
        return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="A racecert worker written to the contract.")
    parser.add_argument("--unfenced", action="store_true",
                        help="final write without the fence (the seed's bug, for demonstration)")
    parser.add_argument("--release-without-check", action="store_true",
                        help="release the lease with a plain DEL (for demonstration)")
    parser.add_argument("--lease-without-nx", action="store_true",
                        help="take the lease with SET PX, without NX (for demonstration)")
    parser.add_argument("--cache-active-namespace", action="store_true",
                        help="cache under the version live at write time (for demonstration)")
    parser.add_argument("--read-then-write", action="store_true",
                        help="final write as a read, then an unfenced write (a check-then-act race)")
    parser.add_argument("--ack-on-receive", action="store_true",
                        help="ack the job when taken: a crash of its holder loses it (for demonstration)")
    parser.add_argument("--renew-without-check", action="store_true",
                        help="extend the lease with SET XX before the write, no token check "
                             "(a race of three ordered steps)")
    parser.add_argument("--long-lease", action="store_true",
                        help="take 20-minute leases whatever RACECERT_LEASE_TTL_MS says "
                             "(a lease no pause can outlast)")
    parser.add_argument("--late-write-without-token", action="store_true",
                        help="check the lease with a GET, then write by key and status alone, "
                             "leaving the token columns (for demonstration)")
    parser.add_argument("--lease-ttl-in-seconds", action="store_true",
                        help="pass the lease TTL in milliseconds as seconds: EX (for demonstration)")
    parser.add_argument("--no-ack-when-completed", action="store_true",
                        help="never acknowledge a delivery of a job already completed "
                             "(for demonstration)")
    parser.add_argument("--fence-on-status", action="store_true",
                        help="fence the final write on the status, not the lease token "
                             "(a race of three ordered steps)")
    parser.add_argument("--renew-after-get", action="store_true",
                        help="check the lease with GET, then extend it with PEXPIRE "
                             "(a race of three ordered steps)")
    parser.add_argument("--progress-hash", action="store_true",
                        help="mirror each stage into a Redis hash: more round trips per job, "
                             "no bug of its own")
    args = parser.parse_args(argv)
    try:
        config = Config.from_env(dict(os.environ))
    except ConfigError as err:
        print(f"worker.py: {err}", file=sys.stderr)
        return 2
    worker = Worker(config, Bugs(
        unfenced=args.unfenced,
        release_without_check=args.release_without_check,
        lease_without_nx=args.lease_without_nx,
        cache_active_namespace=args.cache_active_namespace,
        read_then_write=args.read_then_write,
        ack_on_receive=args.ack_on_receive,
        renew_without_check=args.renew_without_check,
        fence_on_status=args.fence_on_status,
        long_lease=args.long_lease,
        late_write_without_token=args.late_write_without_token,
        lease_ttl_in_seconds=args.lease_ttl_in_seconds,
        no_ack_when_completed=args.no_ack_when_completed,
        renew_after_get=args.renew_after_get,
        progress_hash=args.progress_hash,
    ))

    def drain(signum: int, _frame: object) -> None:
        worker.stopping = True

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
