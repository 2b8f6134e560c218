//! What each framework really does, as data racecert writes and reads: Celery's message on its
//! Redis transport and the keys of kombu's unacked index; the row apalis' Postgres storage
//! fetches; the message Dramatiq's Redis broker enqueues; and the audit trigger racecert installs on a team's result table. Facts checked
//! against the installed versions are in docs/systems.md, sections 4, 5 and 5a.

use super::{Framework, Results};
use crate::contract::fencing::Fencing;
use crate::fault::FaultKind;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// The fault kinds a framework really has, weighted: the redelivery faults twice, since they are
/// what turns a slow attempt into a second writer. Every framework has `kill-main` (for apalis,
/// a restart under the same worker name), and every system has an API that may submit a request
/// again (`api-resubmission`), a model call that may outlast the worker's own timeout
/// (`upstream-timeout`: its retry or failure path runs while the call may still complete) and a
/// database link that may fail under a worker mid-job (`partition`), a rollout that replaces
/// the worker holding a job (`drain`) and one that switches to the next version while it holds
/// one (`cutover`).
pub fn faults(framework: Framework) -> Vec<FaultKind> {
    use FaultKind::*;
    let mut own = match framework {
        Framework::Celery => vec![
            ForcedRestore,
            VisibilityOutlived,
            KillPoolChild,
            ForcedRestore,
            VisibilityOutlived,
            KillMain,
            WarmShutdown,
            PrefetchRestore,
        ],
        Framework::Apalis => vec![HeartbeatMiss, HeartbeatMiss, KillMain],
        // A worker process killed mid-message (its main process then stops the rest: the
        // message waits for a maintenance pass), a worker paused past its heartbeat timeout (a
        // live message requeued), the whole process group killed, and a warm shutdown (Dramatiq
        // waits for running messages, requeues prefetched ones).
        Framework::Dramatiq => vec![
            KillHolder,
            HeartbeatMiss,
            HeartbeatMiss,
            KillMain,
            WarmShutdown,
        ],
        Framework::Custom => vec![KillHolder, KillHolder, KillMain],
    };
    own.extend([ApiResubmission, UpstreamTimeout, Partition, Drain, Cutover]);
    own
}

/// The kinds `system` has: its framework's ([`faults`]); `cache-invalidation-lag` when its
/// rollout has an invalidation step to run late; `backend-switch` when its workers share one
/// model URL whose backend the rollout switches; `time-limit` when a Dramatiq system declares
/// its actor's time limit (`[dramatiq] time_limit_ms`).
pub fn system_faults(system: &super::System) -> Vec<FaultKind> {
    let mut kinds = faults(system.framework);
    if system.rollout.invalidate.is_some() {
        kinds.push(FaultKind::CacheInvalidationLag);
    }
    if system.rollout.backend_switch {
        kinds.push(FaultKind::BackendSwitch);
    }
    if system.time_limit().is_some() {
        kinds.push(FaultKind::TimeLimit);
    }
    kinds
}

/// The kinds of a framework, by name, for messages.
pub fn fault_names(framework: Framework) -> String {
    let mut names: Vec<&str> = faults(framework).into_iter().map(FaultKind::name).collect();
    names.sort_unstable();
    names.dedup();
    names.join(", ")
}

/// How long the first attempt's model call must last for `kind` to land while it runs: past the
/// broker's visibility timeout (`visibility`), the heartbeat deadline (`orphan`) or the worker's
/// own model timeout (`model`) where the fault needs it, a few seconds otherwise. Every kind but
/// `upstream-timeout` stays below `model`: a slow model the worker waits for, not a failure.
pub fn call_hold(
    kind: FaultKind,
    visibility: Duration,
    orphan: Duration,
    model: Duration,
    time_limit: Option<Duration>,
) -> Duration {
    let below = model.saturating_sub(Duration::from_millis(500));
    match kind {
        // Past the worker's timeout by a margin a loaded machine keeps: the worker hangs up first.
        FaultKind::UpstreamTimeout => return model + Duration::from_secs(1),
        // Long enough for the second submission to reach a worker while the first call runs.
        FaultKind::ApiResubmission => return Duration::from_secs(5).min(below),
        _ => {}
    }
    let hold = match kind {
        FaultKind::VisibilityOutlived => visibility + Duration::from_secs(6),
        FaultKind::ForcedRestore => Duration::from_secs(6),
        // The task in front of the request runs past the request's visibility timeout and the
        // sweep after it (a worker start), so the request is still reserved when it is restored.
        FaultKind::PrefetchRestore => visibility + Duration::from_secs(8),
        FaultKind::HeartbeatMiss => orphan + Duration::from_secs(6),
        // Past the framework's time limit for the job (it is checked once a second), below the
        // HTTP client's timeout: the answer arrives and the limit interrupts the attempt then.
        FaultKind::TimeLimit => {
            time_limit.unwrap_or(model) + super::DramatiqOptions::TIME_LIMIT_MARGIN
        }
        _ => Duration::from_secs(3),
    };
    hold.min(below)
}

/// kombu's Redis transport keys (defaults; `global_keyprefix` empty).
pub mod celery_keys {
    /// Hash: delivery tag -> `[message, exchange, routing_key]` of every unacked delivery.
    pub const UNACKED: &str = "unacked";
    /// Sorted set: delivery tag scored by its delivery time (Unix seconds).
    pub const UNACKED_INDEX: &str = "unacked_index";
}

/// The variable `celery ... worker` reads for `--prefetch-multiplier`: Celery's CLI runs click
/// with `auto_envvar_prefix="CELERY"` (celery/bin/celery.py), so the worker subcommand's options
/// read `CELERY_WORKER_<OPTION>`. The value overrides the app's `worker_prefetch_multiplier`
/// (celery/bin/worker.py: `value or app.conf.worker_prefetch_multiplier`); an explicit
/// `--prefetch-multiplier` in the command wins over it. Checked with Celery 5.7.0.
pub const CELERY_PREFETCH_ENV: &str = "CELERY_WORKER_PREFETCH_MULTIPLIER";

/// The prefetch multiplier the `prefetch-restore` fault runs a Celery worker with: Celery's own
/// default, or the app's when it is larger.
pub fn fault_prefetch(configured: u32) -> u32 {
    configured.max(4)
}

/// One Celery message (protocol 2) as `apply_async` writes it with the JSON serializer: the
/// envelope `LPUSH`ed onto the queue's list.
#[derive(Debug, Clone, PartialEq)]
pub struct CeleryMessage {
    /// The task id (`headers.id`).
    pub task_id: String,
    /// kombu's delivery tag (`properties.delivery_tag`): the member of `unacked_index`.
    pub delivery_tag: String,
    /// The envelope, JSON.
    pub envelope: String,
}

/// The message running `task(**kwargs)`, with ids drawn from `ids` (seeded by the caller).
pub fn celery_message(
    task: &str,
    queue: &str,
    kwargs: &BTreeMap<String, String>,
    ids: &mut impl FnMut() -> u128,
) -> CeleryMessage {
    let task_id = uuid4(ids());
    let delivery_tag = uuid4(ids());
    let body = json!([
        [],
        kwargs,
        {"callbacks": null, "errbacks": null, "chain": null, "chord": null}
    ]);
    let kwargsrepr = format!(
        "{{{}}}",
        kwargs
            .iter()
            .map(|(k, v)| format!("'{k}': '{v}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let envelope = json!({
        "body": BASE64.encode(body.to_string()),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": task, "id": task_id, "shadow": null, "eta": null,
            "expires": null, "group": null, "group_index": null, "retries": 0,
            "timelimit": [null, null], "root_id": task_id, "parent_id": null,
            "argsrepr": "()", "kwargsrepr": kwargsrepr, "origin": "racecert",
            "ignore_result": true, "replaced_task_nesting": 0, "stamped_headers": null,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": uuid4(ids()),
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": delivery_tag,
        },
    });
    CeleryMessage {
        task_id,
        delivery_tag,
        envelope: envelope.to_string(),
    }
}

/// One Dramatiq message as `actor.send_with_options(kwargs=...)` enqueues it on the Redis
/// broker: the message `HSET` into `{namespace}:{queue}.msgs` under its `redis_message_id`, that
/// id `RPUSH`ed onto `{namespace}:{queue}` (what `dispatch.lua`'s `enqueue` does).
#[derive(Debug, Clone, PartialEq)]
pub struct DramatiqMessage {
    /// `message_id`: the id Dramatiq keeps across retries (a retry is a new Redis message).
    pub message_id: String,
    /// `options.redis_message_id`: this enqueue's member of the queue and its acks set.
    pub redis_message_id: String,
    /// The message, JSON (Dramatiq's `JSONEncoder`).
    pub data: String,
}

/// The message running `actor(**kwargs)` on `queue`, with ids drawn from `ids` (seeded by the
/// caller) and `timestamp_ms` as its `message_timestamp`.
pub fn dramatiq_message(
    actor: &str,
    queue: &str,
    kwargs: &BTreeMap<String, String>,
    timestamp_ms: i64,
    ids: &mut impl FnMut() -> u128,
) -> DramatiqMessage {
    let message_id = uuid4(ids());
    let redis_message_id = uuid4(ids());
    let data = json!({
        "queue_name": queue,
        "actor_name": actor,
        "args": [],
        "kwargs": kwargs,
        "options": {"redis_message_id": redis_message_id},
        "message_id": message_id,
        "message_timestamp": timestamp_ms,
    });
    DramatiqMessage {
        message_id,
        redis_message_id,
        data: data.to_string(),
    }
}

/// Dramatiq's Redis keys of `queue` under `namespace`: its list of message ids, and the hash of
/// their messages (a message stays there from its enqueue to its ack).
pub fn dramatiq_keys(namespace: &str, queue: &str) -> (String, String) {
    let list = format!("{namespace}:{queue}");
    let messages = format!("{list}.msgs");
    (list, messages)
}

/// Whether a message popped from a queue or held in `unacked` was restored (kombu sets
/// `headers.redelivered` and `properties.delivery_info.redelivered` when it restores).
pub fn celery_redelivered(envelope: &str) -> bool {
    let Ok(value) = serde_json::from_str::<Value>(envelope) else {
        return false;
    };
    // `unacked` holds `[message, exchange, routing_key]`.
    let message = value.get(0).unwrap_or(&value);
    message.pointer("/headers/redelivered") == Some(&Value::Bool(true))
        || message.pointer("/properties/delivery_info/redelivered") == Some(&Value::Bool(true))
}

/// What a message pushed onto a queue says of itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The framework's id of the message: Celery's task id (`headers.id`), or the `message_id`,
    /// `job_id` or `id` of any other JSON message (Dramatiq's, a team's own).
    pub job_id: String,
    /// kombu's delivery tag (`properties.delivery_tag`), on Celery's Redis transport.
    pub delivery_tag: Option<String>,
    /// What the message carries, as text: the envelope, and a base64 body decoded (kombu's
    /// `body_encoding`), where the request's id or input shows.
    pub carries: String,
}

/// Reads a value a client pushed onto a queue (an `LPUSH` or `RPUSH` argument, a hash field's
/// value): a Celery envelope, or a JSON object that names its own id. Anything else (a pickle,
/// a bare id) is not a message racecert can read, and gives None.
pub fn read_enqueued(value: &str) -> Option<Enqueued> {
    let message: Value = serde_json::from_str(value).ok()?;
    let text = |pointer: &str| message.pointer(pointer).and_then(Value::as_str);
    if let Some(task_id) = text("/headers/id") {
        let mut carries = value.to_owned();
        if text("/properties/body_encoding") == Some("base64")
            && let Some(body) = text("/body").and_then(|b| BASE64.decode(b).ok())
        {
            carries.push('\n');
            carries.push_str(&String::from_utf8_lossy(&body));
        }
        return Some(Enqueued {
            job_id: task_id.to_owned(),
            delivery_tag: text("/properties/delivery_tag").map(str::to_owned),
            carries,
        });
    }
    ["/message_id", "/job_id", "/id"]
        .iter()
        .find_map(|pointer| match message.pointer(pointer)? {
            Value::String(id) => Some(id.clone()),
            Value::Number(id) => Some(id.to_string()),
            _ => None,
        })
        .map(|job_id| Enqueued {
            job_id,
            delivery_tag: None,
            carries: value.to_owned(),
        })
}

/// A UUID version 4 text from 128 random bits.
fn uuid4(bits: u128) -> String {
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The statement that enqueues one apalis job (apalis-postgres 1.0): `$1` = job type (the
/// queue), `$2` = the job's JSON text. The id must be a ULID, which apalis' own SQL generates.
pub const APALIS_INSERT: &str = "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority) \
     VALUES (apalis.generate_ulid(), $1, convert_to($2, 'UTF8'), 'Pending', 0, 25, now(), 0) RETURNING id";

/// The audit table and trigger racecert installs on the team's result table (only in its own
/// test database): every insert and update, with the old and new status, the output and version,
/// the transaction and the time. No worker can write the table without leaving a row here.
pub fn audit_sql(results: &Results, fencing: Option<&Fencing>) -> String {
    let version = results
        .version
        .as_ref()
        .map_or("NULL".to_owned(), |v| format!("NEW.\"{v}\"::text"));
    // The team's fencing column before and after each write, as text (NULL without one).
    let (old_fence, new_fence) = fencing.map_or(("NULL".to_owned(), "NULL".to_owned()), |f| {
        (
            format!(
                "CASE WHEN TG_OP = 'UPDATE' THEN OLD.\"{}\"::text END",
                f.column
            ),
            format!("NEW.\"{}\"::text", f.column),
        )
    });
    format!(
        r#"CREATE TABLE IF NOT EXISTS racecert_audit (
    id bigserial PRIMARY KEY,
    op text NOT NULL,
    request_key text,
    old_status text,
    new_status text,
    output text,
    model_version text,
    old_fence text,
    new_fence text,
    txid bigint NOT NULL DEFAULT txid_current(),
    backend_pid int NOT NULL DEFAULT pg_backend_pid(),
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION racecert_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO racecert_audit (op, request_key, old_status, new_status, output, model_version,
                                old_fence, new_fence)
    VALUES (TG_OP, NEW."{key}"::text,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD."{status}"::text END,
            NEW."{status}"::text, NEW."{output}"::text, {version}, {old_fence}, {new_fence});
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS racecert_audit ON "{table}";
CREATE TRIGGER racecert_audit AFTER INSERT OR UPDATE ON "{table}"
    FOR EACH ROW EXECUTE FUNCTION racecert_audit_row();"#,
        key = results.key,
        status = results.status,
        output = results.output,
        table = results.table,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_message_gives_its_id_tag_and_decoded_body() {
        let kwargs = BTreeMap::from([("request_id".to_owned(), "req-7".to_owned())]);
        let mut n = 0u128;
        let message = celery_message("tasks.infer", "celery", &kwargs, &mut || {
            n += 1;
            n
        });
        let read = read_enqueued(&message.envelope).unwrap();
        assert_eq!(read.job_id, message.task_id);
        assert_eq!(read.delivery_tag, Some(message.delivery_tag));
        // The request id is only in the base64 body and in kwargsrepr; the decoded body shows it.
        let body = read.carries.lines().nth(1).unwrap_or_default();
        assert!(body.contains("req-7"), "{}", read.carries);
        let dramatiq = r#"{"queue_name":"default","actor_name":"infer","args":["req-7"],"kwargs":{},"options":{},"message_id":"5e1c","message_timestamp":1}"#;
        let read = read_enqueued(dramatiq).unwrap();
        assert_eq!((read.job_id.as_str(), read.delivery_tag), ("5e1c", None));
        assert!(read_enqueued("5e1c-plain-id").is_none());
        assert!(read_enqueued(r#"{"no":"id"}"#).is_none());
    }

    #[test]
    fn dramatiq_message_is_what_the_broker_enqueues() {
        let mut n = 0u128;
        let kwargs = BTreeMap::from([("request_id".to_owned(), "req-3".to_owned())]);
        let message = dramatiq_message(
            "infer_safe",
            "default",
            &kwargs,
            1_700_000_000_000,
            &mut || {
                n += 1;
                n
            },
        );
        let value: Value = serde_json::from_str(&message.data).unwrap();
        assert_eq!(value["actor_name"], "infer_safe");
        assert_eq!(value["queue_name"], "default");
        assert_eq!(value["kwargs"]["request_id"], "req-3");
        assert_eq!(
            value["options"]["redis_message_id"],
            message.redis_message_id
        );
        assert_ne!(message.message_id, message.redis_message_id);
        // Read back from the wire as any pushed message: Dramatiq's stable id, not this enqueue's.
        let read = read_enqueued(&message.data).unwrap();
        assert_eq!(read.job_id, message.message_id);
        assert_eq!(
            dramatiq_keys("dramatiq", "default"),
            (
                "dramatiq:default".to_owned(),
                "dramatiq:default.msgs".to_owned()
            )
        );
    }

    #[test]
    fn uuid4_has_its_version_and_variant() {
        let id = uuid4(u128::MAX);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_eq!(&uuid4(0)[14..15], "4");
    }

    #[test]
    fn celery_message_carries_the_task_and_its_kwargs() {
        let mut n = 0u128;
        let mut ids = || {
            n += 1;
            n
        };
        let kwargs = BTreeMap::from([("request_id".to_owned(), "req-1".to_owned())]);
        let message = celery_message("tasks.infer_naive", "celery", &kwargs, &mut ids);
        let value: Value = serde_json::from_str(&message.envelope).unwrap();
        assert_eq!(value["headers"]["task"], "tasks.infer_naive");
        assert_eq!(value["headers"]["id"], message.task_id);
        assert_eq!(value["properties"]["delivery_tag"], message.delivery_tag);
        assert_eq!(
            value["properties"]["delivery_info"]["routing_key"],
            "celery"
        );
        assert!(!celery_redelivered(&message.envelope));
        let restored = message.envelope.replace(
            "\"routing_key\":\"celery\"",
            "\"routing_key\":\"celery\",\"redelivered\":true",
        );
        assert!(celery_redelivered(&format!(
            "[{restored}, \"\", \"celery\"]"
        )));
    }
}
