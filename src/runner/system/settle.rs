//! What comes before and after a case's fault: the fleet made idle (no call an earlier case left
//! open) and put in the shape the fault needs, and the drain that waits until the request ended
//! or nothing more can happen (held calls answered, the system's recovery bound passed), so that
//! liveness is judged only when it can be.

use super::case::CaseCtx;
use super::{Wire, now_ms};
use crate::Result;
use crate::fault::FaultKind;
use crate::history::Observation;
use crate::system::preset::{
    CELERY_PREFETCH_ENV, celery_keys, dramatiq_keys, fault_prefetch, read_enqueued,
};
use crate::system::{Framework, Submit, System};
use crate::wire::{Reply, TxStatus};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long an idle worker stopped between cases (to reshape the fleet) has to exit after its
/// SIGTERM before SIGKILL: nothing is in flight, and a worker that ignores its stop signal (the
/// drain bug) would otherwise cost every reshaping case this wait.
const HOUSEKEEPING_STOP: Duration = Duration::from_secs(3);

/// Starts a case on idle workers: a model call an earlier case left open on racecert's links
/// (held by its backends, or a worker still waiting for one) is waited out for a bound, then its
/// worker is restarted, so no case is judged on what an earlier one left behind.
pub(super) async fn idle_fleet(ctx: &mut CaseCtx<'_, '_>) -> Result<()> {
    const BOUND: Duration = Duration::from_secs(10);
    let waited = Instant::now();
    while !ctx.held_calls().is_empty() && waited.elapsed() < BOUND {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for index in 0..ctx.fleet.workers.len() {
        let links = &ctx.fleet.workers[index].links;
        if links.in_flight(&links.backend_links()).is_empty() {
            continue;
        }
        let id = ctx.fleet.workers[index].id.clone();
        ctx.fleet.stop(index, Duration::from_secs(2)).await;
        ctx.fleet.start(index).await?;
        ctx.note(
            &id,
            &id,
            format!(
                "restarted before the case: still in an earlier case's model call after {} ms",
                waited.elapsed().as_millis()
            ),
            "message",
        );
    }
    Ok(())
}

/// Stops worker `index` (SIGSTOP) while it holds no PostgreSQL transaction open, as its recorded
/// round trips say; returns how the stop landed, for the diagram.
///
/// Why: a framework may persist a task's state in a transaction of its own next to the task's
/// start (apalis' lock event: `UPDATE apalis.jobs ... SET status = 'Running'` inside
/// BEGIN/COMMIT, sent while the handler already runs). Stopped between the UPDATE and the COMMIT,
/// the worker holds the job's row for the whole pause, and the other workers' requeue
/// (`FOR UPDATE ... SKIP LOCKED`) passes the job over: the fault then tests nothing. On a loaded
/// machine that window is wide enough to hit. A stop that lands inside a transaction (a reply
/// recorded after the signal says so) is undone and tried again once it closed; bounded, after
/// which the worker stays stopped and the diagram says where.
pub(super) async fn stop_outside_transactions(ctx: &mut CaseCtx<'_, '_>, index: usize) -> String {
    const BOUND: Duration = Duration::from_secs(5);
    // Replies already on their way are recorded within this, once the worker is stopped.
    const SETTLE: Duration = Duration::from_millis(30);
    let worker = ctx.fleet.workers[index].id.clone();
    let started = Instant::now();
    let mut waited = Duration::ZERO;
    let mut retries = 0;
    loop {
        let waiting = Instant::now();
        while in_transaction(&ctx.fleet.wire, &worker) && started.elapsed() < BOUND {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        waited += waiting.elapsed();
        ctx.fleet.workers[index].signal_group(Signal::SIGSTOP);
        tokio::time::sleep(SETTLE).await;
        let inside = in_transaction(&ctx.fleet.wire, &worker);
        if !inside && retries == 0 && waited < Duration::from_millis(5) {
            return "outside any transaction of its own".to_owned();
        }
        if !inside {
            return format!(
                "outside any transaction of its own (waited {} ms for one to close, {retries} stop(s) undone)",
                waited.as_millis()
            );
        }
        if started.elapsed() >= BOUND {
            return format!(
                "inside a transaction it kept open for {} ms",
                started.elapsed().as_millis()
            );
        }
        ctx.fleet.workers[index].signal_group(Signal::SIGCONT);
        retries += 1;
    }
}

/// Whether `worker` holds a PostgreSQL transaction open: the last reply recorded on one of its
/// connections reported a transaction block (ReadyForQuery `T` or `E`).
pub(super) fn in_transaction(wire: &Wire, worker: &str) -> bool {
    let mut last: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for (_, event) in wire.lock().expect("poisoned").iter() {
        if event.worker != worker || event.service != "postgres" {
            continue;
        }
        let open = match &event.trip.reply {
            Some(Reply::Postgres(reply)) => {
                matches!(reply.tx, Some(TxStatus::Transaction | TxStatus::Failed))
            }
            // The connection ended before a reply: its transaction ended with it.
            _ => false,
        };
        let entry = last
            .entry(event.trip.conn)
            .or_insert((event.trip.seq, open));
        if event.trip.seq >= entry.0 {
            *entry = (event.trip.seq, open);
        }
    }
    last.values().any(|(_, open)| *open)
}

/// Puts the fleet in the shape case's fault needs. `prefetch-restore` runs the first worker with a
/// prefetch multiplier > 1 ([`CELERY_PREFETCH_ENV`]) and stops the others until the fault, so the
/// request waits in that worker's prefetch; `drain` runs the first worker alone; every other case
/// runs every worker as the file says.
/// A worker is restarted only when its variables change or it is not running.
pub(super) async fn prepare_fleet(ctx: &mut CaseCtx<'_, '_>, fault: FaultKind) -> Result<()> {
    let prefetch = fault == FaultKind::PrefetchRestore;
    // A rollout replaces the only worker running, the old version's: a drain's next job has no
    // other worker to go to until the replacement starts, and a cutover's request is the old
    // version's until the switch.
    let solo = prefetch
        || matches!(
            fault,
            FaultKind::Drain
                | FaultKind::Cutover
                | FaultKind::CacheInvalidationLag
                | FaultKind::BackendSwitch
        );
    // Every case begins on the first version: the active key says so.
    if let Some((first, _)) = ctx.system.versions.first() {
        ctx.set_active(&first.clone()).await?;
    }
    let multiplier = fault_prefetch(
        ctx.system
            .celery
            .as_ref()
            .map_or(1, |c| c.prefetch_multiplier),
    );
    // Stops first: a stopped worker takes nothing of the case.
    let mut order: Vec<usize> = (0..ctx.fleet.workers.len()).collect();
    order.rotate_left(1);
    for index in order {
        let want_env = if prefetch && index == 0 {
            vec![(CELERY_PREFETCH_ENV.to_owned(), multiplier.to_string())]
        } else {
            Vec::new()
        };
        let want_running = !solo || index == 0;
        let running = !ctx.fleet.exited(index);
        let changed = ctx.fleet.workers[index].extra_env != want_env;
        let id = ctx.fleet.workers[index].id.clone();
        if running && (changed || !want_running) {
            ctx.fleet.stop(index, HOUSEKEEPING_STOP).await;
            if !want_running {
                // A worker killed in a blocking pop (Celery's `BRPOP ... 1`) leaves that pop at
                // Redis until its connection's end gets there through the proxy; a message pushed
                // meanwhile goes to the dead worker and is lost. Its connections are cut at the
                // proxy before the case submits anything.
                let redis = &ctx.fleet.workers[index].links.redis;
                redis.reset_connections(Duration::ZERO).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                ctx.note(&id, &id, "stopped for this case", "message");
            }
        }
        ctx.fleet.workers[index].extra_env = want_env;
        if want_running && (!running || changed) {
            ctx.fleet.start(index).await?;
            ctx.note(
                &id,
                &id,
                if prefetch {
                    format!("started with {CELERY_PREFETCH_ENV}={multiplier}")
                } else {
                    "started as the file describes it".to_owned()
                },
                "message",
            );
        }
    }
    Ok(())
}

/// Waits until the request's row is final and nothing of the case is left in flight, or until
/// nothing can happen any more (the job is lost), bounded. A row that is not final keeps the
/// drain going until `recovered_by` (the fault plus the system's recovery bound): a quiet
/// system may still give the job back.
pub(super) async fn drain(
    ctx: &mut CaseCtx<'_, '_>,
    first_call_done: Instant,
    recovered_by: Instant,
    redelivery: Duration,
) -> Result<()> {
    let request = format!("{}-req", ctx.prefix);
    // Room for a call that arrived as the drain began to be answered by its hold.
    let bound = Instant::now() + redelivery * 2 + Duration::from_secs(15) + ctx.aim.slow;
    let mut quiet_since: Option<(Instant, i64, usize)> = None;
    loop {
        let writes: i64 =
            sqlx::query_scalar("SELECT count(*) FROM racecert_audit WHERE request_key = $1")
                .bind(&request)
                .fetch_one(&mut *ctx.pg)
                .await?;
        let calls: usize = ctx.calls().await?.iter().map(|(_, n)| n).sum();
        // Only what the case added: a message the broker held before the case's submission is an
        // earlier case's (a job stranded by a bug), judged there, not waited for here.
        let all = broker_holds(ctx).await?;
        let holds = added_by_case(ctx, all);
        let added = holds.len() as i64;
        // A model call racecert's backends still hold (a retry that arrived before the fault let
        // later calls answer at once) is work in flight whatever the framework: the request may
        // end once it is answered.
        let held = ctx.held_calls();
        let in_flight = added + held.len() as i64;
        tracing::debug!(in_flight, holds = holds.len(), "drain");
        let now = Instant::now();
        let may_recover = now < recovered_by && !row_is_final(ctx, &request).await?;
        if now >= first_call_done && in_flight == 0 && !may_recover {
            // Quiet: no new write and no new model call for a while.
            match quiet_since {
                Some((since, w, c)) if w == writes && c == calls => {
                    if now - since >= Duration::from_millis(1500) {
                        return Ok(());
                    }
                }
                _ => quiet_since = Some((now, writes, calls)),
            }
        } else {
            quiet_since = None;
        }
        if now >= bound || crate::interrupt::requested().is_some() {
            if !held.is_empty() {
                let why = format!(
                    "racecert's backends still held {} model call(s) (of {}) when the drain's bound ran out",
                    held.len(),
                    held.join(", ")
                );
                ctx.note("racecert", "racecert", why.clone(), "fault");
                ctx.liveness_blind = Some(why);
            }
            record_pending(ctx, &holds);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A message the broker holds for a worker: waiting in a queue, delivered and not acknowledged,
/// or (apalis) a job row not done.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct BrokerHeld {
    /// Where: the queue or record, as the diagram names it.
    pub(super) place: String,
    /// The message as stored (the envelope, a decoded body): where a request's id shows.
    pub(super) carries: String,
    /// The framework's id of the message, when it names one.
    pub(super) job_id: Option<String>,
}

/// What the broker still holds for the workers, read from the broker's own record: Celery's
/// queue list and kombu's `unacked` hash (a delivered message stays there until its ack);
/// apalis' job rows that are Pending, Queued or Running; Dramatiq's message hashes of the queue
/// and its delay queue (a message stays there from enqueue to ack). A `custom` system names no
/// broker racecert can read: nothing.
pub(super) async fn broker_holds(ctx: &mut CaseCtx<'_, '_>) -> Result<Vec<BrokerHeld>> {
    let message = |place: String, value: String| match read_enqueued(&value) {
        Some(read) => BrokerHeld {
            place,
            carries: read.carries,
            job_id: Some(read.job_id),
        },
        None => BrokerHeld {
            place,
            carries: value,
            job_id: None,
        },
    };
    let mut holds = Vec::new();
    match ctx.system.framework {
        Framework::Celery => {
            let queue = queue_of(ctx.system);
            let queued: Vec<String> = redis::cmd("LRANGE")
                .arg(&queue)
                .arg(0)
                .arg(-1)
                .query_async(ctx.rd)
                .await?;
            holds.extend(
                queued
                    .into_iter()
                    .map(|value| message(format!("the queue `{queue}`"), value)),
            );
            // `unacked` maps a delivery tag to `[message, exchange, routing_key]`.
            let unacked: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(celery_keys::UNACKED)
                .query_async(ctx.rd)
                .await?;
            for (tag, value) in unacked {
                let envelope = serde_json::from_str::<serde_json::Value>(&value)
                    .ok()
                    .and_then(|v| v.get(0).map(serde_json::Value::to_string))
                    .unwrap_or(value);
                holds.push(message(
                    format!("kombu's `{}` (delivery {tag})", celery_keys::UNACKED),
                    envelope,
                ));
            }
        }
        Framework::Apalis => {
            // The table exists once a worker ran apalis' migrations: before, nothing is held.
            let rows: Vec<(String, String, String)> = sqlx::query_as(
                "SELECT id::text, status::text, convert_from(job, 'UTF8') FROM apalis.jobs \
                 WHERE status IN ('Pending', 'Queued', 'Running')",
            )
            .fetch_all(&mut *ctx.pg)
            .await
            .unwrap_or_default();
            holds.extend(rows.into_iter().map(|(id, status, job)| BrokerHeld {
                place: format!("apalis.jobs (job {id}, {status})"),
                carries: job,
                job_id: Some(id),
            }));
        }
        Framework::Dramatiq => {
            let namespace = ctx.system.dramatiq()?.namespace.clone();
            let queue = queue_of(ctx.system);
            for queue in [queue.clone(), format!("{queue}.DQ")] {
                let (_, messages) = dramatiq_keys(&namespace, &queue);
                let stored: BTreeMap<String, String> = redis::cmd("HGETALL")
                    .arg(&messages)
                    .query_async(ctx.rd)
                    .await?;
                holds.extend(
                    stored
                        .into_values()
                        .map(|value| message(format!("`{messages}`"), value)),
                );
            }
        }
        Framework::Custom => {}
    }
    Ok(holds)
}

/// The holds the case added: a message the broker held before the case's submission
/// ([`CaseCtx::held_before`]) is an earlier case's.
fn added_by_case(ctx: &CaseCtx<'_, '_>, holds: Vec<BrokerHeld>) -> Vec<BrokerHeld> {
    holds
        .into_iter()
        .filter(|h| !ctx.held_before.contains(&h.carries))
        .collect()
}

/// Records, once the drain's bound ran out, each of the case's requests whose message the broker
/// still holds (its id in the message, or the task id the wire tied to it) among the holds the
/// case added: a delivery never acknowledged, judged by no-stuck-delivery.
fn record_pending(ctx: &mut CaseCtx<'_, '_>, holds: &[BrokerHeld]) {
    let mut requests = vec![format!("{}-req", ctx.prefix)];
    requests.extend(ctx.judged_too.iter().map(|(id, _)| id.clone()));
    for request in requests {
        let job_ids: Vec<String> = ctx
            .observations
            .iter()
            .filter_map(|(_, o)| match o {
                Observation::Enqueued { key, job_id } if *key == request => Some(job_id.clone()),
                _ => None,
            })
            .collect();
        let places: Vec<&str> = holds
            .iter()
            .filter(|h| {
                h.carries.contains(&request)
                    || h.job_id.as_ref().is_some_and(|id| job_ids.contains(id))
            })
            .map(|h| h.place.as_str())
            .collect();
        if places.is_empty() {
            continue;
        }
        let places = places.join(", ");
        ctx.note(
            "racecert",
            "racecert",
            format!("after the drain the broker still holds {request} in {places}"),
            "fault",
        );
        ctx.observations.push((
            now_ms(),
            Observation::Pending {
                key: request,
                deliveries: 0,
                held: Some(places),
            },
        ));
    }
}

/// Whether the request's row holds one of the file's terminal statuses (its last audited write).
pub(super) async fn row_is_final(ctx: &mut CaseCtx<'_, '_>, request: &str) -> Result<bool> {
    let status: Option<String> = sqlx::query_scalar(
        "SELECT new_status FROM racecert_audit WHERE request_key = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(request)
    .fetch_optional(&mut *ctx.pg)
    .await?
    .flatten();
    Ok(status.is_some_and(|status| ctx.system.results.terminal.contains(&status)))
}

pub(super) fn queue_of(system: &System) -> String {
    match &system.submit {
        Submit::Preset { queue, .. } => queue.clone(),
        // A submit command's queue is the framework's default one.
        Submit::Command(_) => system.framework.default_queue().into(),
    }
}
