//! The verdict of a system case, from the audit trail on the team's result table, the workers'
//! recorded round trips and their lines; and its sequence diagram.

use super::case::CaseCtx;
use super::{Arrow, SystemCase};
use crate::Result;
use crate::check::{CaseResult, Invariant};
use crate::contract::JobRow;
use crate::contract::fencing::FenceOrder;
use crate::fault::FaultKind;
use crate::history::{AuditRow, Event, EventKind, History, Observation, SubmittedRequest};
use crate::system::{Framework, System};
use crate::wire::{Reply, Request, RoundTrip, WireEvent};
use sqlx::Row;

/// What can be judged of a system as its file describes it: the audit trail always says how
/// many final writes a request had and whether it ended; a preset's broker, read after the
/// drain, whether a delivery was never acknowledged; the version column lets a result be
/// checked against the version it names; `[keys]` lets the wire judge the team's own leases and
/// cache; `[fencing]` names the team's generation or token column, by which the fencing
/// invariants are judged (without it they are reported as not judged). Backend calls are not
/// judged (compute waste needs the contract's request body to know the job).
pub(super) fn judged(system: &System) -> (Vec<Invariant>, Vec<Invariant>) {
    // Every worker's round trips are recorded: a worker told to stop is judged on what it took.
    let mut judged = vec![
        Invariant::AtMostOneFinalWrite,
        Invariant::NoLostJob,
        Invariant::DrainDiscipline,
    ];
    // A preset's broker is read after the drain: a delivery never acknowledged shows there.
    if system.framework != Framework::Custom {
        judged.push(Invariant::NoStuckDelivery);
    }
    if system.results.version.is_some() {
        judged.push(Invariant::ResultNamesItsVersion);
    }
    if system.fencing.is_some() {
        judged.extend([
            Invariant::GenerationsIncrease,
            Invariant::NoNonOwnerFinalWrite,
        ]);
    }
    if system.keys.lease.is_some() {
        judged.push(Invariant::LeaseDiscipline);
    }
    if let Some(cache) = &system.keys.cache {
        judged.push(Invariant::NoStaleCacheRead);
        // One version's entries apart from another's only where the key names the version.
        if cache.contains("{version}") {
            judged.push(Invariant::NoCrossVersionCacheEntry);
        }
    }
    if system.rollout.served_by_new_version.is_some() {
        judged.push(Invariant::ServedByNewVersion);
    }
    let not_judged = Invariant::ALL
        .into_iter()
        .filter(|i| !judged.contains(i))
        .collect();
    (judged, not_judged)
}

/// The audited writes of `request` on the team's result table, in order.
async fn audit_rows(ctx: &mut CaseCtx<'_, '_>, request: &str) -> Result<Vec<AuditRow>> {
    let rows = sqlx::query(
        "SELECT id, op, old_status, new_status, output, model_version, old_fence, new_fence, \
         txid, backend_pid, (extract(epoch FROM at) * 1000000)::bigint AS at_us \
         FROM racecert_audit WHERE request_key = $1 ORDER BY id",
    )
    .bind(request)
    .fetch_all(&mut *ctx.pg)
    .await?;
    let order = ctx.system.fencing.as_ref().map(|f| f.order);
    // The fence as the team's column holds it: a number for an increasing one (a value that is
    // not one stays unknown), text for a token.
    let fence = |row: &sqlx::postgres::PgRow, column: &str| -> (Option<i64>, Option<String>) {
        let value: Option<String> = row.get(column);
        match order {
            Some(FenceOrder::Increasing) => (value.and_then(|v| v.trim().parse().ok()), None),
            Some(FenceOrder::Token) => (None, value),
            None => (None, None),
        }
    };
    Ok(rows
        .iter()
        .map(|row| AuditRow {
            audit_id: row.get("id"),
            idempotency_key: request.to_owned(),
            operation: row.get("op"),
            old_status: row.get("old_status"),
            // A NULL status column is no status at all: not terminal.
            new_status: row
                .get::<Option<String>, _>("new_status")
                .unwrap_or_default(),
            old_generation: fence(row, "old_fence").0,
            new_generation: fence(row, "new_fence").0,
            old_model_version: None,
            new_model_version: row.get("model_version"),
            old_lease_token: fence(row, "old_fence").1,
            new_lease_token: fence(row, "new_fence").1,
            worker_id: None,
            attempt: 0,
            output: row.get("output"),
            txid: row.get("txid"),
            backend_pid: row.get("backend_pid"),
            recorded_us: row.get("at_us"),
            writer: None,
        })
        .collect())
}

/// The case's history: the workers' starts, what its faults did, the workers' round trips and
/// the lines of theirs racecert can read, the audit trail, the request's final row. Times are
/// milliseconds since the case began.
async fn history(ctx: &mut CaseCtx<'_, '_>, request: &str, input: &str) -> Result<History> {
    let t0 = ctx.t0;
    let since = |at: i64| (at - t0).max(0) as u64;
    let mut events: Vec<Event> = ctx
        .fleet
        .workers
        .iter()
        .map(|w| Event {
            step: 0,
            at_ms: 0,
            kind: EventKind::Harness(Observation::WorkerStarted {
                worker: w.id.clone(),
                version: w.version.clone(),
            }),
        })
        .collect();
    // A system case has no schedule steps: every event is step 0, and its time says where it is.
    for (at, observation) in &ctx.observations {
        events.push(Event {
            step: 0,
            at_ms: since(*at),
            kind: EventKind::Harness(observation.clone()),
        });
    }
    for (at, effect) in &ctx.effects {
        events.push(Event {
            step: 0,
            at_ms: since(*at),
            kind: EventKind::Fault(effect.clone()),
        });
    }
    for (at, event) in case_trips(ctx) {
        events.push(Event {
            step: 0,
            at_ms: since(at),
            kind: EventKind::Wire(Box::new(event)),
        });
    }
    for (at, _, line) in ctx.fleet.lines.lock().expect("poisoned").iter() {
        if *at >= t0
            && let Ok(line) = crate::logs::parse_line(line)
        {
            events.push(Event {
                step: 0,
                at_ms: since(*at),
                kind: EventKind::Worker(line),
            });
        }
    }
    events.sort_by_key(|e| e.at_ms);
    // The case's request, and the ones its fault submitted as jobs of their own (a drain's next
    // job): each judged on its own audited writes and final row.
    let mut requests = vec![SubmittedRequest {
        request_id: request.to_owned(),
        idempotency_key: request.to_owned(),
        input: input.to_owned(),
    }];
    requests.extend(ctx.judged_too.iter().map(|(id, input)| SubmittedRequest {
        request_id: id.clone(),
        idempotency_key: id.clone(),
        input: input.clone(),
    }));
    let mut audit = Vec::new();
    let mut jobs = Vec::new();
    for submitted in &requests {
        let rows = audit_rows(ctx, &submitted.request_id).await?;
        if let Some(row) = rows.last() {
            jobs.push(JobRow {
                idempotency_key: submitted.request_id.clone(),
                request_id: submitted.request_id.clone(),
                status: row.new_status.clone(),
                generation: 0,
                model_version: row.new_model_version.clone(),
                output: row.output.clone(),
                lease_token: None,
                worker_id: None,
            });
        }
        audit.extend(rows);
    }
    let connections = ctx
        .fleet
        .workers
        .iter()
        .chain(&ctx.fleet.submitter)
        .flat_map(|w| {
            w.links
                .backend_pids()
                .into_iter()
                .map(|pid| (pid, w.id.clone()))
        })
        .collect();
    let mut history = History {
        events,
        audit,
        journal: ctx.journal().await,
        jobs,
        requests,
        // Real clocks: a lease runs out by the TTL its SET gave it.
        lease_ttl_ms: Some(0),
        namespace: None,
        wire_recorded: true,
        layout: ctx.system.keys.clone(),
        terminal: ctx.system.results.terminal.clone(),
        fencing: ctx.system.fencing.clone(),
        connections,
        wire_origin_ms: Some(ctx.wire_origin_unix_ms - t0),
        epoch_unix_ms: Some(t0),
    };
    history.attribute_writers();
    Ok(history)
}

/// The verdict of one case: its history judged by the one judge ([`crate::check`]), with the
/// invariants the system's description makes judgeable; and its sequence diagram.
pub(super) async fn judge(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: FaultKind,
    request: String,
    input: &str,
) -> Result<SystemCase> {
    let history = history(ctx, &request, input).await?;
    let (case, not_judged) = judge_history(ctx, history);
    let writes = write_arrows(ctx, &case.history);
    ctx.arrows.extend(writes);
    let task_lines = task_line_arrows(ctx, &request);
    ctx.arrows.extend(task_lines);
    let own_keys = own_key_arrows(ctx);
    ctx.arrows.extend(own_keys);
    let lost = lost_statement_arrows(ctx, &request);
    ctx.arrows.extend(lost);
    ctx.arrows.extend(model_call_arrows(ctx, input, fault));
    let model_calls = ctx.request_calls().await;
    // The case's own request's (a drain's next job is judged, not counted here).
    let final_writes = case
        .history
        .audit
        .iter()
        .filter(|w| w.idempotency_key == request && case.history.is_final(w))
        .count();
    for v in &case.violations {
        ctx.note(
            "db",
            "db",
            format!("VIOLATION {}: {}", v.invariant, v.observed),
            "violation",
        );
    }
    let mut arrows = std::mem::take(&mut ctx.arrows);
    arrows.sort_by_key(|a| a.at_ms);
    Ok(SystemCase {
        number,
        fault,
        request,
        writes: case.history.audit.clone(),
        violations: case.violations.clone(),
        not_judged,
        diagram: arrows,
        lanes: lanes(ctx),
        elapsed_ms: 0,
        model_calls,
        final_writes,
        effect: ctx.effects.first().map(|(_, effect)| effect.clone()),
        landed: case.coverage.landed(fault) > 0,
        liveness_blind: ctx.liveness_blind.take(),
        refused: ctx.observations.iter().find_map(|(_, o)| match o {
            Observation::Refused { why, .. } => Some(why.clone()),
            _ => None,
        }),
    })
}

/// The case's history judged on the invariants the system makes judgeable (liveness set aside
/// when racecert held the request's work), and the invariants not judged.
fn judge_history(ctx: &CaseCtx<'_, '_>, history: History) -> (CaseResult, Vec<Invariant>) {
    let (mut invariants, mut not_judged) = judged(ctx.system);
    if ctx.liveness_blind.is_some() {
        // Whether the request ended cannot be told while racecert itself holds its work: not
        // judged (and said so on the diagram), never FAILED for racecert's own doing.
        let liveness = Invariant::LIVENESS;
        not_judged.extend(invariants.iter().filter(|i| liveness.contains(i)).copied());
        invariants.retain(|i| !liveness.contains(i));
    }
    let mut case = CaseResult::judge(history, &invariants);
    // A system case has no schedule steps: the proof's place is its time, not "step 0".
    for violation in &mut case.violations {
        for line in &mut violation.evidence {
            if let Some(rest) = line.strip_prefix("step 0 ") {
                *line = rest.to_owned();
            }
        }
    }
    (case, not_judged)
}

/// One arrow per audited write, from its writer to the database: a final write's as a write.
fn write_arrows(ctx: &CaseCtx<'_, '_>, history: &History) -> Vec<Arrow> {
    let results = &ctx.system.results;
    history
        .audit
        .iter()
        .map(|write| {
            let terminal = history.is_final(write);
            Arrow {
                at_ms: write.recorded_us.map_or(ctx.t0, |us| us / 1000) - ctx.t0,
                from: write.writer.clone().unwrap_or_else(|| "db".into()),
                to: "db".into(),
                label: format!(
                    "{} {} {}->{}{}",
                    write.operation,
                    results.table,
                    write.old_status.as_deref().unwrap_or("-"),
                    write.new_status,
                    write
                        .output
                        .as_ref()
                        .map(|o| format!(" output={o}"))
                        .unwrap_or_default()
                ),
                kind: if terminal { "write" } else { "message" }.into(),
            }
        })
        .collect()
}

/// What the workers said about the request (Celery's own received/succeeded lines, the task's
/// own), each a note on the worker's lane.
fn task_line_arrows(ctx: &CaseCtx<'_, '_>, request: &str) -> Vec<Arrow> {
    let task_lines: Vec<(i64, String, String)> = ctx
        .fleet
        .lines
        .lock()
        .expect("poisoned")
        .iter()
        .filter(|(at, _, line)| {
            *at >= ctx.t0
                && (line.contains(request) || line.contains("received") && line.contains("Task "))
        })
        .filter(|(_, _, line)| {
            [
                "received",
                "succeeded in",
                "retry_dispatched",
                "late_write_rejected",
                "WorkerLostError",
                "Re-enqueued",
                "Warm shutdown",
                "exited with",
            ]
            .iter()
            .any(|w| line.contains(w))
        })
        .cloned()
        .collect();
    let mut arrows = Vec::new();
    for (at, label, line) in task_lines {
        let worker = label.split('#').next().unwrap_or(&label).to_owned();
        let short = line
            .split_once("]: ")
            .or_else(|| line.split_once("] "))
            .map_or(line.as_str(), |(_, rest)| rest);
        let short: String = short.chars().take(110).collect();
        arrows.push(Arrow {
            at_ms: at - ctx.t0,
            from: worker.clone(),
            to: worker,
            label: short,
            kind: "message".into(),
        });
    }
    arrows
}

/// The worker's own lock and cache round trips (`[keys]`), as its wire carried them.
fn own_key_arrows(ctx: &CaseCtx<'_, '_>) -> Vec<Arrow> {
    let layout = ctx.system.keys.matcher();
    case_trips(ctx)
        .iter()
        .filter_map(|(at, event)| match &event.trip.request {
            Request::Redis(command)
                if command
                    .keys
                    .iter()
                    .any(|k| layout.is_lease(k) || layout.is_cache(k)) =>
            {
                Some(Arrow {
                    at_ms: at - ctx.t0,
                    from: event.worker.clone(),
                    to: "redis".into(),
                    label: event.trip.describe(None),
                    kind: "message".into(),
                })
            }
            _ => None,
        })
        .collect()
}

/// Statements on the request that never got an answer (a partition, a death mid-statement):
/// the audit trail cannot show them, the wire can.
fn lost_statement_arrows(ctx: &CaseCtx<'_, '_>, request: &str) -> Vec<Arrow> {
    case_trips(ctx)
        .iter()
        .filter(|(_, event)| {
            event.trip.reply.is_none()
                && matches!(event.trip.request, Request::Postgres(_))
                && event.trip.names_any(&[request])
        })
        .map(|(_, event)| Arrow {
            at_ms: sent_unix_ms(ctx, &event.trip) - ctx.t0,
            from: event.worker.clone(),
            to: "db".into(),
            label: format!("{}: its connection ended first", event.trip.describe(None)),
            kind: "message".into(),
        })
        .collect()
}

/// The diagram's lanes, left to right: racecert, Redis, the submitter, the workers, the models,
/// the database.
fn lanes(ctx: &CaseCtx<'_, '_>) -> Vec<String> {
    let mut lanes = vec!["racecert".to_owned(), "redis".to_owned()];
    if let Some(submitter) = &ctx.fleet.submitter {
        lanes.push(submitter.id.clone());
    }
    for worker in &ctx.fleet.workers {
        lanes.push(worker.id.clone());
    }
    for (version, _) in &ctx.system.versions {
        lanes.push(format!("model {version}"));
    }
    lanes.push("db".into());
    lanes
}

/// Every model call of the case's request, as the workers' backend links carried it (the body
/// names the request's input, which no other request shares): from the worker to its version's
/// model when it was sent, numbered, with what ended it when no answer did (the worker hung up:
/// its timeout, or its death). A call after the first is a second attempt, made by what the
/// case's fault does: a delivery again, a submission again, or the app's retry.
fn model_call_arrows(ctx: &CaseCtx<'_, '_>, input: &str, fault: FaultKind) -> Vec<Arrow> {
    let version_of = |worker: &str| {
        ctx.fleet
            .workers
            .iter()
            .find(|w| w.id == worker)
            .map(|w| w.version.clone())
    };
    // The version an answer came from, when it is not the caller's own (a backend switched
    // under it): the output in the answer names it.
    let answered_by = |trip: &RoundTrip, own: &str| -> Option<String> {
        let Some(Reply::Http(answer)) = &trip.reply else {
            return None;
        };
        ctx.system
            .versions
            .iter()
            .map(|(v, _)| v)
            .find(|v| *v != own && answer.body.contains(&format!("{v}:")))
            .cloned()
    };
    // The calls carrying `input` (a JSON string body carries it escaped, without its quotes).
    let calls_of = |input: &str| -> Vec<(i64, String, String, bool, Option<String>)> {
        let quoted = serde_json::to_string(input).unwrap_or_default();
        let needle = quoted.trim_matches('"').to_owned();
        let mut calls: Vec<_> = case_trips(ctx)
            .into_iter()
            .filter_map(|(_, event)| match &event.trip.request {
                Request::Http(http) if http.body.contains(&needle) => {
                    let version = version_of(&event.worker)?;
                    let other = answered_by(&event.trip, &version);
                    Some((
                        sent_unix_ms(ctx, &event.trip),
                        event.worker.clone(),
                        version,
                        event.trip.reply.is_some(),
                        other,
                    ))
                }
                _ => None,
            })
            .collect();
        calls.sort_by_key(|(at, ..)| *at);
        calls
    };
    let again = match fault {
        FaultKind::ApiResubmission => "the request submitted again",
        FaultKind::UpstreamTimeout => "after attempt 1 timed out",
        FaultKind::TimeLimit => "after the time limit interrupted attempt 1",
        FaultKind::Partition => "after attempt 1 failed in the partition",
        FaultKind::Cutover | FaultKind::CacheInvalidationLag => {
            "the same input, a request accepted after the switch"
        }
        _ => "its message delivered again",
    };
    let arrow = |at: i64,
                 worker: String,
                 version: String,
                 label: String,
                 answered: bool,
                 other: Option<String>| Arrow {
        at_ms: at - ctx.t0,
        from: worker,
        to: format!("model {version}"),
        label: format!(
            "{label}{}{}",
            other
                .map(|v| format!(", answered by {v}"))
                .unwrap_or_default(),
            if answered {
                ""
            } else {
                ", never answered: the worker hung up (its timeout) or died first"
            }
        ),
        kind: "message".into(),
    };
    let mut arrows: Vec<Arrow> = calls_of(input)
        .into_iter()
        .enumerate()
        .map(|(i, (at, worker, version, answered, other))| {
            let label = if i == 0 {
                "model call (attempt 1)".to_owned()
            } else {
                format!("model call (attempt {}: {again})", i + 1)
            };
            arrow(at, worker, version, label, answered, other)
        })
        .collect();
    // The requests the fault submitted with inputs of their own (a drain's next job, a
    // backend switch's request after it).
    for (id, other_input) in &ctx.judged_too {
        if other_input != input {
            for (at, worker, version, answered, other) in calls_of(other_input) {
                arrows.push(arrow(
                    at,
                    worker,
                    version,
                    format!("model call for {id}"),
                    answered,
                    other,
                ));
            }
        }
    }
    arrows
}

/// When a round trip was sent, Unix ms (the wire's clock placed on the bed's origin).
fn sent_unix_ms(ctx: &CaseCtx<'_, '_>, trip: &RoundTrip) -> i64 {
    ctx.wire_origin_unix_ms + (trip.sent_us / 1000) as i64
}

fn case_trips(ctx: &CaseCtx<'_, '_>) -> Vec<(i64, WireEvent)> {
    ctx.fleet
        .wire
        .lock()
        .expect("poisoned")
        .iter()
        .filter(|(at, _)| *at >= ctx.t0)
        .cloned()
        .collect()
}

/// A case's sequence diagram as text: one column per lane, one row per arrow, time on the left.
pub fn sequence_text(case: &SystemCase) -> String {
    const W: usize = 12;
    let col = |lane: &str| case.lanes.iter().position(|l| l == lane).unwrap_or(0);
    let mut out = String::new();
    out.push_str("         ");
    for lane in &case.lanes {
        let name: String = lane.chars().take(W - 1).collect();
        out.push_str(&format!("{name:<W$}"));
    }
    out.push('\n');
    for arrow in &case.diagram {
        let (a, b) = (col(&arrow.from), col(&arrow.to));
        let (lo, hi) = (a.min(b), a.max(b));
        let mut row: Vec<char> = (0..case.lanes.len() * W)
            .map(|i| if i % W == 0 { '|' } else { ' ' })
            .collect();
        if arrow.kind == "fault" || arrow.kind == "violation" {
            let mark = if arrow.kind == "fault" { '~' } else { '!' };
            row[a * W] = mark;
        } else if lo == hi {
            row[a * W] = '*';
        } else {
            for cell in row.iter_mut().take(hi * W).skip(lo * W + 1) {
                *cell = '-';
            }
            if b > a {
                row[hi * W - 1] = '>';
                row[lo * W] = 'o';
            } else {
                row[lo * W + 1] = '<';
                row[hi * W] = 'o';
            }
        }
        let line: String = row.into_iter().collect();
        out.push_str(&format!(
            "{:>7}ms {} {}\n",
            arrow.at_ms,
            line.trim_end(),
            arrow.label
        ));
    }
    out
}
