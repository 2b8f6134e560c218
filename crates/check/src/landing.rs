//! Whether a fault landed on its target, judged from what the history shows happened, never
//! from what the fault meant to do: a pause counts as a lease expiry only if the paused worker's
//! lease really ran out (or another worker took it) while it was stopped; a kill of a team's
//! worker counts only if that worker had the request in flight when it died; a forced redelivery
//! counts only if another worker then acted on the request. The evidence is the wire (each
//! worker's round trips, with their send and answer times), the audit trail (when the final
//! write came) and the requests' ids and inputs (what a round trip names).

use racecert_core::contract::layout::KeyMatcher;
use racecert_core::fault::FaultKind;
use racecert_history::{Event, EventKind, History, Observation};
use racecert_wire::{RedisReply, Reply, Request, RoundTrip};
use std::collections::HashMap;

/// A lease event on the wire: who took, released or lost which lease key, when.
#[derive(Debug, Clone)]
enum LeaseEvent {
    /// Taken (a `SET` answered OK) for `ttl` ms (None: no expiry).
    Taken { ttl: Option<u64> },
    /// Released or deleted.
    Gone,
}

/// The leases on the wire, replayed as events arrive: per key, what happened to it, when, by
/// whom.
#[derive(Debug, Default)]
pub(super) struct Leases {
    by_key: HashMap<String, Vec<(i64, String, LeaseEvent)>>,
}

impl Leases {
    /// Takes in one event (a round trip on a lease key, or a fault that removed leases).
    pub(super) fn observe(&mut self, history: &History, event: &Event, keys: &KeyMatcher) {
        let EventKind::Wire(wire) = &event.kind else {
            return;
        };
        let (Request::Redis(command), Some(Reply::Redis(reply))) =
            (&wire.trip.request, &wire.trip.reply)
        else {
            return;
        };
        let Some(key) = command.keys.iter().find(|k| keys.is_lease(k)) else {
            return;
        };
        let at = answered_ms(history, event, &wire.trip);
        let change = match command.name.as_str() {
            "SET" if matches!(reply, RedisReply::Status(s) if s.eq_ignore_ascii_case("OK")) => {
                LeaseEvent::Taken {
                    ttl: set_ttl(&command.args),
                }
            }
            "DEL" | "UNLINK" | "GETDEL" => LeaseEvent::Gone,
            "EVAL" | "EVALSHA" | "FCALL" if matches!(reply, RedisReply::Int(n) if *n > 0) => {
                LeaseEvent::Gone
            }
            _ => return,
        };
        self.by_key
            .entry(key.clone())
            .or_default()
            .push((at, wire.worker.clone(), change));
    }

    /// Whether a lease `worker` held when it stopped (`from`) ran out, or was taken by another
    /// worker, before it resumed (`to`): what makes a pause a lease expiry.
    pub(super) fn lost_during(&self, worker: &str, from: i64, to: i64) -> bool {
        self.by_key.values().any(|events| {
            // The holder as of `from`.
            let held =
                events
                    .iter()
                    .rev()
                    .find(|(at, _, _)| *at <= from)
                    .and_then(|(at, who, change)| match change {
                        LeaseEvent::Taken { ttl } if who == worker => Some((*at, *ttl)),
                        _ => None,
                    });
            let Some((taken_at, ttl)) = held else {
                return false;
            };
            let ran_out = ttl.is_some_and(|ttl| {
                let expires = taken_at + ttl as i64;
                expires > from && expires <= to
            });
            let taken_over = events.iter().any(|(at, who, change)| {
                *at > from
                    && *at <= to
                    && who != worker
                    && matches!(change, LeaseEvent::Taken { .. })
            });
            ran_out || taken_over
        })
    }

    /// Whether any lease was seen at all (the worker uses the contract's leases).
    pub(super) fn any(&self) -> bool {
        !self.by_key.is_empty()
    }
}

/// The TTL a `SET` gives, in ms.
fn set_ttl(args: &[String]) -> Option<u64> {
    let after = |name: &str| {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case(name))
            .and_then(|i| args.get(i + 1))
    };
    if let Some(ms) = after("PX") {
        return ms.parse().ok();
    }
    after("EX")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| s * 1000)
}

/// When a round trip was sent, in the history's milliseconds (its event's time when the wire's
/// clock is not placed).
pub(super) fn sent_ms(history: &History, event: &Event, trip: &RoundTrip) -> i64 {
    match history.wire_origin_ms {
        Some(origin) => origin + (trip.sent_us / 1000) as i64,
        None => event.at_ms as i64,
    }
}

/// When a round trip was answered (its event's time when the wire's clock is not placed, or
/// there was no answer: the connection ended first).
fn answered_ms(history: &History, event: &Event, trip: &RoundTrip) -> i64 {
    match (history.wire_origin_ms, trip.answered_us) {
        (Some(origin), Some(us)) => origin + (us / 1000) as i64,
        _ => event.at_ms as i64,
    }
}

/// The ids and inputs of the history's requests: what a round trip acting on one names.
fn names(history: &History) -> Vec<&str> {
    history
        .requests
        .iter()
        .flat_map(|r| [r.request_id.as_str(), r.input.as_str()])
        .filter(|n| n.len() >= 4)
        .collect()
}

/// When each final write of any request came, in the history's milliseconds (none when the
/// audit trail's clock is not placed).
fn final_times(history: &History) -> Vec<i64> {
    history
        .audit
        .iter()
        .filter(|row| history.is_final(row))
        .filter_map(|row| history.written_at(row))
        .map(|ms| ms as i64)
        .collect()
}

/// When the first final write of any request came, in the history's milliseconds (None: none
/// came, or the audit trail's clock is not placed).
fn first_final(history: &History) -> Option<i64> {
    final_times(history).into_iter().min()
}

/// A model call (HTTP) that names one of the history's requests.
struct ModelCall<'h> {
    worker: &'h str,
    sent: i64,
    /// When it was answered, or when its connection ended without an answer.
    ended: i64,
    answered: bool,
}

/// The history's model calls of its requests, in the order recorded.
fn model_calls(history: &History) -> Vec<ModelCall<'_>> {
    let names = names(history);
    history
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Wire(wire)
                if matches!(wire.trip.request, Request::Http(_)) && wire.trip.names_any(&names) =>
            {
                Some(ModelCall {
                    worker: wire.worker.as_str(),
                    sent: sent_ms(history, event, &wire.trip),
                    ended: answered_ms(history, event, &wire.trip),
                    answered: wire.trip.reply.is_some(),
                })
            }
            _ => None,
        })
        .collect()
}

/// The round trips of the history that act on a request, with their worker and send and answer
/// times.
fn acting(history: &History) -> Vec<(&str, i64, i64, bool)> {
    let names = names(history);
    history
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Wire(wire) if wire.trip.names_any(&names) => Some((
                wire.worker.as_str(),
                sent_ms(history, event, &wire.trip),
                answered_ms(history, event, &wire.trip),
                wire.trip.reply.is_some(),
            )),
            _ => None,
        })
        .collect()
}

/// Whether `worker` had a request in hand at `at`: a round trip of its acting on the request was
/// in flight then (sent before, answered after or never), and no final write had come.
fn held(history: &History, worker: &str, at: i64) -> bool {
    let unfinished = first_final(history).is_none_or(|done| done > at);
    unfinished
        && acting(history)
            .iter()
            .any(|(who, sent, answered, replied)| {
                *who == worker && *sent <= at && (!replied || *answered >= at)
            })
}

/// Whether, after `at`, a worker other than `worker` acted on the request (its restored or
/// requeued delivery reached it).
fn taken_by_another(history: &History, worker: &str, at: i64) -> bool {
    acting(history)
        .iter()
        .any(|(who, sent, _, _)| *who != worker && *sent >= at)
}

/// Whether a delivery of the request began after `at`: a line (the framework's own, such as
/// Celery's `Task ...[id] received`, or the worker's) saying a job of the request was received,
/// its job known by id from lines that name the request.
fn received_after(history: &History, at: i64) -> bool {
    let ids: Vec<&str> = history
        .requests
        .iter()
        .flat_map(|r| [r.request_id.as_str(), r.idempotency_key.as_str()])
        .collect();
    let lines = || {
        history.events.iter().filter_map(|event| match &event.kind {
            EventKind::Worker(line) => Some((event.at_ms as i64, line)),
            _ => None,
        })
    };
    let jobs: std::collections::BTreeSet<&str> = lines()
        .filter(|(_, line)| {
            line.get("request_id").is_some_and(|r| ids.contains(&r))
                || line
                    .get("idempotency_key")
                    .is_some_and(|k| ids.contains(&k))
        })
        .filter_map(|(_, line)| line.get("job_id"))
        .chain(history.events.iter().filter_map(|event| match &event.kind {
            // The message's id as it went onto the queue (from the wire or racecert's own
            // message): a delivery line naming only that id is the request's.
            EventKind::Harness(Observation::Enqueued { key, job_id })
                if ids.contains(&key.as_str()) =>
            {
                Some(job_id.as_str())
            }
            _ => None,
        }))
        .collect();
    lines().any(|(when, line)| {
        when >= at
            && line.status_word().is_some_and(|s| s.is_receive())
            && (line.get("request_id").is_some_and(|r| ids.contains(&r))
                || line.get("job_id").is_some_and(|j| jobs.contains(j)))
    })
}

/// Whether the team's API refused a submission of the request at or after `at`.
fn refused_after(history: &History, at: i64) -> bool {
    history.events.iter().any(|event| {
        event.at_ms as i64 >= at
            && matches!(&event.kind, EventKind::Harness(Observation::Refused { .. }))
    })
}

/// Whether the request was untouched at `at` (reserved, not started: no round trip acting on it
/// in flight or done) and unfinished.
fn reserved(history: &History, at: i64) -> bool {
    // The submitter's own trips (the row its API inserted, the message it pushed) are the
    // submission, not a start of the work.
    first_final(history).is_none_or(|done| done > at)
        && !acting(history)
            .iter()
            .any(|(who, sent, _, _)| *who != racecert_history::SUBMITTER && *sent <= at)
}

/// Whether framework fault `kind`, begun at `at` (history ms) on `worker`, landed on its target.
pub(super) fn framework(history: &History, kind: FaultKind, worker: &str, at: i64) -> bool {
    match kind {
        // A kill of the job's process lands when what it killed held the job: the call in
        // flight at the signal ended with its connection, unanswered. A signal that left the
        // call's process alive is applied, not landed.
        FaultKind::KillPoolChild | FaultKind::KillHolder => {
            held(history, worker, at) && died_in_call(history, worker, at)
        }
        // The worker's main process (its process group) died while the worker held the job,
        // whether or not the process in the call was in that group: what the framework does
        // with a job whose worker died under it is what this kind tests.
        FaultKind::KillMain | FaultKind::WarmShutdown => held(history, worker, at),
        // Redelivered while the first attempt still held it (or, prefetched, had not begun it):
        // another worker acted on the request, or a delivery of it began again.
        FaultKind::VisibilityOutlived | FaultKind::ForcedRestore | FaultKind::HeartbeatMiss => {
            held(history, worker, at)
                && (taken_by_another(history, worker, at) || received_after(history, at))
        }
        FaultKind::PrefetchRestore => {
            reserved(history, at)
                && (taken_by_another(history, worker, at) || received_after(history, at))
        }
        // The second submission reached a worker (or the team's API acted on it, or refused
        // it as a duplicate: the fault met the system's protection) while the first attempt
        // still held the request.
        FaultKind::ApiResubmission => {
            held(history, worker, at)
                && (taken_by_another(history, worker, at)
                    || received_after(history, at)
                    || refused_after(history, at))
        }
        FaultKind::UpstreamTimeout => hung_up(history, worker, at),
        // The call was answered, and no final write followed it before the request's next
        // model call (its retry) or at all: the attempt dropped the answer it was given.
        FaultKind::TimeLimit => held(history, worker, at) && answer_dropped(history, worker, at),
        FaultKind::Partition => cut_off(history, worker, at),
        // Told to stop with the request in hand (whether it then took the next job is what
        // drain-discipline judges).
        FaultKind::Drain => held(history, worker, at),
        // The old version held the request at the switch, and the new version then took the
        // request that followed it (the same input, accepted after the switch).
        FaultKind::Cutover => held(history, worker, at) && taken_by_another(history, worker, at),
        // The worker held the request at the switch, and called the model (now the next
        // version) again after it, and was answered.
        FaultKind::BackendSwitch => {
            held(history, worker, at)
                && history.events.iter().any(|event| match &event.kind {
                    EventKind::Wire(wire) => {
                        wire.worker == worker
                            && matches!(wire.trip.request, Request::Http(_))
                            && wire.trip.reply.is_some()
                            && sent_ms(history, event, &wire.trip) > at
                    }
                    _ => false,
                })
        }
        // As a cutover, and the new version acted on that request before the invalidation
        // step ran: what a cache answers in between is what the lag exposes.
        FaultKind::CacheInvalidationLag => {
            let invalidated = history.events.iter().find_map(|event| match &event.kind {
                EventKind::Harness(Observation::Invalidated { .. }) => Some(event.at_ms as i64),
                _ => None,
            });
            held(history, worker, at)
                && invalidated.is_some_and(|until| {
                    acting(history)
                        .iter()
                        .any(|(who, sent, _, _)| *who != worker && *sent >= at && *sent <= until)
                })
        }
        _ => false,
    }
}

/// Whether the partition begun at `at` met `worker` while it held the request: a round trip of
/// the worker's, sent after the cut, got no answer (its connection ended first). The statement
/// the model's answer leads to, or what a pool sends before it (a ping, a new connection's
/// start-up), or a retry's reconnect: an operation of the job failed in the partition.
fn cut_off(history: &History, worker: &str, at: i64) -> bool {
    held(history, worker, at)
        && history.events.iter().any(|event| match &event.kind {
            EventKind::Wire(wire) => {
                wire.worker == worker
                    && !matches!(wire.trip.request, Request::Http(_))
                    && wire.trip.reply.is_none()
                    && sent_ms(history, event, &wire.trip) >= at
            }
            _ => false,
        })
}

/// Whether `worker` hung up on a model call of the request it had sent by `at`: the call's
/// connection ended before any answer came (its own timeout gave up on it first).
fn hung_up(history: &History, worker: &str, at: i64) -> bool {
    model_calls(history)
        .iter()
        .any(|call| call.worker == worker && !call.answered && call.sent <= at)
}

/// Whether a model call of `worker`'s for the request, in flight at `at`, was answered, and yet
/// no final write came between that answer and the request's next model call (of any worker)
/// or the end: the attempt was interrupted after its answer arrived (a framework's time limit)
/// and never wrote it. An attempt that goes on writes within moments of its answer.
fn answer_dropped(history: &History, worker: &str, at: i64) -> bool {
    let calls = model_calls(history);
    let finals = final_times(history);
    calls.iter().any(|call| {
        if call.worker != worker || !call.answered || call.sent > at || call.ended < at {
            return false;
        }
        let next = calls
            .iter()
            .map(|later| later.sent)
            .filter(|sent| *sent > call.ended)
            .min()
            .unwrap_or(i64::MAX);
        !finals
            .iter()
            .any(|done| *done >= call.ended && *done < next)
    })
}

/// Whether a model call of `worker`'s for the request, sent before `at`, lost its connection at
/// or after `at` without an answer: the process that held it died holding it.
fn died_in_call(history: &History, worker: &str, at: i64) -> bool {
    model_calls(history)
        .iter()
        .any(|call| call.worker == worker && !call.answered && call.sent <= at && call.ended >= at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use racecert_core::contract::layout::KeyLayout;
    use racecert_history::{AuditRow, SubmittedRequest};
    use racecert_wire::{HttpRequest, RedisCommand, WireEvent};

    fn trip(request: Request, reply: Option<Reply>, sent_ms: u64, answered_ms: u64) -> RoundTrip {
        RoundTrip {
            link: "l".into(),
            conn: 1,
            seq: 0,
            sent_us: sent_ms * 1000,
            forwarded_us: Some(sent_ms * 1000),
            answered_us: reply.as_ref().map(|_| answered_ms * 1000),
            request,
            reply,
        }
    }

    fn wire(at: u64, worker: &str, trip: RoundTrip) -> Event {
        Event {
            step: 0,
            at_ms: at,
            kind: EventKind::Wire(Box::new(WireEvent {
                worker: worker.into(),
                service: "x".into(),
                trip,
            })),
        }
    }

    fn set(key: &str, px: u64) -> Request {
        Request::Redis(RedisCommand {
            name: "SET".into(),
            args: vec![
                key.into(),
                "tok".into(),
                "NX".into(),
                "PX".into(),
                px.to_string(),
            ],
            argc: 5,
            keys: vec![key.into()],
            queued: false,
            truncated: false,
            pushed: Vec::new(),
        })
    }

    #[test]
    fn a_pause_shorter_than_the_lease_does_not_count_as_an_expiry() {
        let layout = KeyLayout::contract("");
        let keys = layout.matcher();
        let lease = "inference:lock:k";
        let history = History {
            wire_origin_ms: Some(0),
            layout,
            ..History::default()
        };
        let mut leases = Leases::default();
        let ok = Some(Reply::Redis(RedisReply::Status("OK".into())));
        // worker-a takes a 20-minute lease at 100 ms.
        leases.observe(
            &history,
            &wire(
                100,
                "worker-a",
                trip(set(lease, 1_200_000), ok.clone(), 99, 100),
            ),
            &keys,
        );
        assert!(leases.any());
        // Paused from 1 s to 3 s: the lease never ran out, nobody took it.
        assert!(!leases.lost_during("worker-a", 1000, 3000));
        // A 1.5 s lease taken at 100 ms runs out during the same pause.
        let mut short = Leases::default();
        short.observe(
            &history,
            &wire(100, "worker-a", trip(set(lease, 1500), ok.clone(), 99, 100)),
            &keys,
        );
        assert!(short.lost_during("worker-a", 1000, 3000));
        // So does a lease another worker took while it was paused.
        leases.observe(
            &history,
            &wire(
                2000,
                "worker-b",
                trip(set(lease, 1_200_000), ok, 1999, 2000),
            ),
            &keys,
        );
        assert!(leases.lost_during("worker-a", 1000, 3000));
        assert!(
            !leases.lost_during("worker-b", 1000, 3000),
            "b held nothing then"
        );
    }

    #[test]
    fn a_time_limit_lands_when_the_answered_attempt_never_wrote_it() {
        let call = || {
            Request::Http(HttpRequest {
                method: "POST".into(),
                path: "/v1/completions".into(),
                headers: Vec::new(),
                body: "{\"prompt\": \"hello 78\"}".into(),
                body_len: 22,
            })
        };
        let answer = || {
            Some(Reply::Http(racecert_wire::HttpResponse {
                status: 200,
                headers: Vec::new(),
                body: String::new(),
                body_len: 0,
            }))
        };
        let done = |at_ms: i64| AuditRow {
            audit_id: at_ms,
            idempotency_key: "req-78".into(),
            operation: "UPDATE".into(),
            old_status: Some("IN_PROGRESS".into()),
            new_status: "SUCCEEDED".into(),
            old_generation: None,
            new_generation: None,
            old_model_version: None,
            new_model_version: None,
            old_lease_token: None,
            new_lease_token: None,
            worker_id: None,
            attempt: 0,
            output: Some("out".into()),
            txid: None,
            backend_pid: None,
            recorded_us: Some(at_ms * 1000),
            writer: None,
        };
        // worker-a's call, sent at 100, answered at 1200 (past the limit); its retry's call at
        // 2500, answered at 2600, and the retry's final write at 2650.
        let history = History {
            requests: vec![SubmittedRequest {
                request_id: "req-78".into(),
                idempotency_key: "req-78".into(),
                input: "hello 78".into(),
            }],
            wire_origin_ms: Some(0),
            epoch_unix_ms: Some(0),
            events: vec![
                wire(1200, "worker-a", trip(call(), answer(), 100, 1200)),
                wire(2600, "worker-a", trip(call(), answer(), 2500, 2600)),
            ],
            audit: vec![done(2650)],
            ..History::default()
        };
        assert!(framework(&history, FaultKind::TimeLimit, "worker-a", 500));
        // The attempt wrote within moments of its answer: the limit did not interrupt it.
        let mut wrote = history.clone();
        wrote.audit.insert(0, done(1210));
        assert!(!framework(&wrote, FaultKind::TimeLimit, "worker-a", 500));
        // No retry and no final write at all (dead-lettered): landed.
        let mut dead = history.clone();
        dead.events.truncate(1);
        dead.audit.clear();
        assert!(framework(&dead, FaultKind::TimeLimit, "worker-a", 500));
        // A call that got no answer is the worker's own timeout, not the time limit.
        let mut hung = dead.clone();
        hung.events[0] = wire(1200, "worker-a", trip(call(), None, 100, 0));
        assert!(!framework(&hung, FaultKind::TimeLimit, "worker-a", 500));
        assert!(framework(
            &hung,
            FaultKind::UpstreamTimeout,
            "worker-a",
            500
        ));
        // Begun after the answer came, nothing was in flight.
        assert!(!framework(&history, FaultKind::TimeLimit, "worker-a", 1300));
    }

    /// A model call with this body.
    fn infer(body: &str) -> Request {
        Request::Http(HttpRequest {
            method: "POST".into(),
            path: "/v1/infer".into(),
            headers: Vec::new(),
            body: body.into(),
            body_len: body.len() as u64,
        })
    }

    /// The model's answer.
    fn answered() -> Option<Reply> {
        Some(Reply::Http(racecert_wire::HttpResponse {
            status: 200,
            headers: Vec::new(),
            body: String::new(),
            body_len: 0,
        }))
    }

    /// req-77 in flight on worker-a (its call cut at 900), then redelivered to worker-b.
    fn in_flight() -> History {
        History {
            requests: vec![SubmittedRequest {
                request_id: "req-77".into(),
                idempotency_key: "req-77".into(),
                input: "hello 77".into(),
            }],
            wire_origin_ms: Some(0),
            epoch_unix_ms: Some(0),
            events: vec![
                // worker-a's call for the request: sent at 100, cut (no answer) at 900.
                wire(
                    900,
                    "worker-a",
                    trip(infer("{\"input\": \"hello 77\"}"), None, 100, 0),
                ),
                // worker-b's call of another request, answered.
                wire(
                    300,
                    "worker-b",
                    trip(infer("{\"input\": \"other\"}"), answered(), 200, 300),
                ),
                // After the kill at 500, worker-b calls for the request: a redelivery.
                wire(
                    1500,
                    "worker-b",
                    trip(infer("{\"input\": \"hello 77\"}"), answered(), 1000, 1500),
                ),
            ],
            ..History::default()
        }
    }

    #[test]
    fn a_kill_lands_only_on_a_worker_with_the_request_in_flight() {
        let history = in_flight();
        assert!(framework(
            &history,
            FaultKind::KillPoolChild,
            "worker-a",
            500
        ));
        assert!(!framework(
            &history,
            FaultKind::KillPoolChild,
            "worker-b",
            500
        ));
        assert!(framework(
            &history,
            FaultKind::ForcedRestore,
            "worker-a",
            500
        ));
        // Before the call was sent, worker-a held nothing.
        assert!(!framework(&history, FaultKind::KillMain, "worker-a", 50));
        // Killed at 950, after its call's connection had already ended (at 900): what died
        // held no call.
        assert!(!framework(&history, FaultKind::KillHolder, "worker-a", 950));
        assert!(framework(&history, FaultKind::KillHolder, "worker-a", 500));
        // A kill of the holder whose call was answered anyway (the process in the call was not
        // the one killed) did not land, though the worker held the request at the signal; the
        // main process's kill did (the worker died under the job).
        let mut survived = history.clone();
        survived.events[0] = wire(
            1200,
            "worker-a",
            trip(infer("{\"input\": \"hello 77\"}"), answered(), 100, 1200),
        );
        assert!(!framework(
            &survived,
            FaultKind::KillHolder,
            "worker-a",
            500
        ));
        assert!(!framework(
            &survived,
            FaultKind::KillPoolChild,
            "worker-a",
            500
        ));
        assert!(framework(&survived, FaultKind::KillMain, "worker-a", 500));
        assert!(framework(
            &survived,
            FaultKind::WarmShutdown,
            "worker-a",
            500
        ));
    }

    #[test]
    fn a_resubmission_and_a_hang_up_land_on_the_request_in_flight() {
        let history = in_flight();
        // A resubmission at 500 lands like a redelivery: worker-b acted on the request after.
        assert!(framework(
            &history,
            FaultKind::ApiResubmission,
            "worker-a",
            500
        ));
        // worker-a's call got no answer: it hung up (its timeout); worker-b's was answered.
        assert!(framework(
            &history,
            FaultKind::UpstreamTimeout,
            "worker-a",
            500
        ));
        assert!(!framework(
            &history,
            FaultKind::UpstreamTimeout,
            "worker-b",
            1600
        ));
    }

    #[test]
    fn a_partition_lands_only_on_what_a_holder_sent_after_the_cut() {
        let history = in_flight();
        // A partition at 500 met worker-a only if something it sent after the cut got no answer.
        assert!(!framework(&history, FaultKind::Partition, "worker-a", 500));
        let mut cut = history.clone();
        let sync = Request::Postgres(racecert_wire::PgRequest::Batch(racecert_wire::PgBatch {
            mode: racecert_wire::PgProtocol::Extended,
            statements: Vec::new(),
        }));
        cut.events
            .push(wire(800, "worker-a", trip(sync.clone(), None, 700, 0)));
        assert!(framework(&cut, FaultKind::Partition, "worker-a", 500));
        // Sent before the cut, it is not the partition's doing; nor on a worker that held nothing.
        assert!(!framework(&cut, FaultKind::Partition, "worker-a", 750));
        let mut idle = history.clone();
        idle.events
            .push(wire(800, "worker-b", trip(sync, None, 700, 0)));
        assert!(!framework(&idle, FaultKind::Partition, "worker-b", 500));
    }

    #[test]
    fn a_cutover_and_a_backend_switch_land_by_what_followed_the_request_in_flight() {
        let history = in_flight();
        // A cutover at 500: worker-a held the request, worker-b (the new version) acted on it
        // after; switched before worker-a's call was sent, nothing was in flight.
        assert!(framework(&history, FaultKind::Cutover, "worker-a", 500));
        assert!(!framework(&history, FaultKind::Cutover, "worker-a", 50));
        // A backend switch at 500 lands once worker-a called the model again and was answered.
        assert!(!framework(
            &history,
            FaultKind::BackendSwitch,
            "worker-a",
            500
        ));
        let mut called = history.clone();
        called.events.push(wire(
            1300,
            "worker-a",
            trip(
                infer("{\"input\": \"hello 77 after\"}"),
                answered(),
                1200,
                1300,
            ),
        ));
        assert!(framework(
            &called,
            FaultKind::BackendSwitch,
            "worker-a",
            500
        ));
    }

    #[test]
    fn a_late_invalidation_lands_when_the_new_version_acted_before_it_ran() {
        let history = in_flight();
        // A late invalidation lands when the new version acted before it ran.
        let invalidated = |at: u64| Event {
            step: 0,
            at_ms: at,
            kind: EventKind::Harness(Observation::Invalidated {
                detail: "cache:* deleted".into(),
            }),
        };
        let mut late = history.clone();
        late.events.push(invalidated(1200));
        assert!(framework(
            &late,
            FaultKind::CacheInvalidationLag,
            "worker-a",
            500
        ));
        let mut early = history.clone();
        early.events.push(invalidated(700));
        assert!(!framework(
            &early,
            FaultKind::CacheInvalidationLag,
            "worker-a",
            500
        ));
    }
}
