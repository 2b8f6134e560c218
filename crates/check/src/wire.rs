//! Invariants judged on the wire: what each worker really sent to Redis and to the model backends
//! (recorded round trips), not what it logged. Lease ownership is replayed from the commands on
//! lease keys and their replies; cache entries are judged by the version their key names and the
//! version their value was produced by; backend calls by the requests the backends received.
//! Every violation carries the round trips that prove it.

use super::{Invariant, Violation};
use racecert_core::contract::layout::KeyMatcher;
use racecert_core::contract::log::Status;
use racecert_core::fault::Effect;
use racecert_history::{Event, EventKind, History, Observation};
use racecert_wire::WireEvent;
use racecert_wire::{RedisReply, Reply, Request, RoundTrip};
use regex::Regex;
use std::collections::{BTreeSet, HashMap};
use std::sync::OnceLock;

/// Who holds a lease, as the wire says.
#[derive(Debug, Clone)]
struct Holder {
    worker: String,
    token: String,
    /// When it runs out by itself (real clocks), in the history's milliseconds.
    expires_at: Option<u64>,
    /// The round trip that took it.
    proof: String,
    /// When its SET reached the server (wire clock, µs).
    forwarded_us: Option<u64>,
    /// The holder (worker, token) this replay still believed live when this SET NX succeeded.
    /// The success proves the server had freed that lease first: a release by that holder
    /// recorded after this SET (round trips on two connections complete in either order, and
    /// the proxy's forwarding order is not the server's) ran before it.
    displaced: Option<(String, String)>,
}

impl Holder {
    /// Whether `worker`'s release (with these arguments) is the one that freed the lease this
    /// holder's SET NX then took: it ran first, and the lease stays this holder's.
    fn freed_by(&self, worker: &str, args: &[&String]) -> bool {
        self.displaced
            .as_ref()
            .is_some_and(|(was, token)| was == worker && (args.is_empty() || args.contains(&token)))
    }
}

/// A model output in a value: `{version}:{16 hex}` (contract::model_output).
pub(super) fn output_versions(value: &str) -> BTreeSet<String> {
    static OUTPUT: OnceLock<Regex> = OnceLock::new();
    let output = OUTPUT
        .get_or_init(|| Regex::new(r"([A-Za-z0-9_.-]+):[0-9a-f]{16}\b").expect("a valid pattern"));
    output
        .captures_iter(value)
        .filter_map(|c| c.get(1).map(|m| m.as_str().to_owned()))
        .collect()
}

fn proof(event: &Event, wire: &WireEvent, namespace: Option<&str>) -> String {
    format!(
        "step {} wire {} {}: {}",
        event.step,
        wire.worker,
        wire.service,
        wire.trip.describe(namespace)
    )
}

fn redis(trip: &RoundTrip) -> Option<(&racecert_wire::RedisCommand, Option<&RedisReply>)> {
    match (&trip.request, &trip.reply) {
        (Request::Redis(command), Some(Reply::Redis(reply))) => Some((command, Some(reply))),
        (Request::Redis(command), None) => Some((command, None)),
        _ => None,
    }
}

/// An option of a Redis `SET` (`NX`, `PX`, ...), case-insensitive, with the argument after it.
fn option<'a>(args: &'a [String], name: &str) -> Option<Option<&'a String>> {
    args.iter()
        .position(|a| a.eq_ignore_ascii_case(name))
        .map(|i| args.get(i + 1))
}

/// The TTL a `SET` gives, in ms.
fn set_ttl(args: &[String]) -> Option<u64> {
    if let Some(Some(ms)) = option(args, "PX") {
        return ms.parse().ok();
    }
    option(args, "EX")
        .flatten()
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| s * 1000)
}

fn ok(reply: Option<&RedisReply>) -> bool {
    matches!(reply, Some(RedisReply::Status(s)) if s.eq_ignore_ascii_case("OK"))
}

fn positive(reply: Option<&RedisReply>) -> bool {
    matches!(reply, Some(RedisReply::Int(n)) if *n > 0)
}

/// The bound version of each worker, as its own lines and starts say (for stale reads).
/// Each worker's model version as of the event being judged: a worker restarted on a new
/// version (a rolling restart keeps its id) reads as that version from its restart on, and as
/// the old one before it.
#[derive(Default)]
struct WorkerVersions(HashMap<String, String>);

impl WorkerVersions {
    fn observe(&mut self, event: &racecert_history::Event) {
        match &event.kind {
            EventKind::Harness(Observation::WorkerStarted { worker, version }) => {
                self.0.insert(worker.clone(), version.clone());
            }
            EventKind::Worker(line) => {
                if let (Some(worker), Some(version)) =
                    (line.get("worker_id"), line.get("model_version"))
                    && !line.is(Status::Cutover)
                {
                    self.0.insert(worker.to_owned(), version.to_owned());
                }
            }
            _ => {}
        }
    }

    fn of(&self, worker: &str) -> Option<&String> {
        self.0.get(worker)
    }
}

/// Who took each job's lease and when (the events' milliseconds, when its `SET` reached the
/// server), per idempotency key, in time order, with the round trip as proof: the job's owner at any moment is
/// the last one before it.
pub(super) fn lease_takers(
    history: &History,
    keys: &KeyMatcher,
) -> HashMap<String, Vec<(f64, String, String)>> {
    let namespace = history.namespace.as_deref();
    let mut takers: HashMap<String, Vec<(f64, String, String)>> = HashMap::new();
    for event in &history.events {
        let EventKind::Wire(wire) = &event.kind else {
            continue;
        };
        let Some((command, reply)) = redis(&wire.trip) else {
            continue;
        };
        if command.name != "SET" || command.queued || !ok(reply) {
            continue;
        }
        let Some(job) = command.keys.first().and_then(|k| keys.lease_of(k)) else {
            continue;
        };
        // When Redis ran it: when the SET reached the server (a held SET runs at its release,
        // not when it was sent), as lease discipline orders them; two held SETs let go together
        // are answered in either order, but run in the order they went on.
        let at = match (
            history.wire_origin_ms,
            wire.trip.forwarded_us.or(wire.trip.answered_us),
        ) {
            (Some(origin), Some(us)) => origin as f64 + us as f64 / 1000.0,
            _ => event.at_ms as f64,
        };
        takers.entry(job).or_default().push((
            at,
            wire.worker.clone(),
            proof(event, wire, namespace),
        ));
    }
    for taken in takers.values_mut() {
        taken.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    takers
}

/// Lease discipline: a lease is taken only when free (or by its holder), and renewed or released
/// only by the holder whose token it stores.
pub(super) fn lease_discipline(history: &History, keys: &KeyMatcher) -> Vec<Violation> {
    let namespace = history.namespace.as_deref();
    let mut leases: HashMap<String, Holder> = HashMap::new();
    let mut violations = Vec::new();
    for event in &history.events {
        if history.lease_ttl_ms.is_some() {
            leases.retain(|_, h| h.expires_at.is_none_or(|at| event.at_ms < at));
        }
        let wire = match &event.kind {
            EventKind::Fault(Effect::LeaseExpired { key, .. }) => {
                leases.retain(|lease, _| keys.lease_of(lease).as_deref() != Some(key.as_str()));
                continue;
            }
            EventKind::Fault(Effect::RedisRestarted) => {
                leases.clear();
                continue;
            }
            EventKind::Wire(wire) => wire,
            _ => continue,
        };
        let Some((command, reply)) = redis(&wire.trip) else {
            continue;
        };
        if command.queued {
            // Its effect is EXEC's, judged there by its keys.
            continue;
        }
        let Some(lease) = command.keys.iter().find(|k| keys.is_lease(k)) else {
            continue;
        };
        // Round trips are recorded as they complete; two released at once (the drain opening
        // held requests) may complete in the other order than the server ran them. A command
        // that reached the server before the live holder's SET ran before it: judged against
        // the lease as it was then (freed, since that SET succeeded), and it leaves that SET's.
        if leases.get(lease).is_some_and(|h| {
            matches!((wire.trip.forwarded_us, h.forwarded_us), (Some(this), Some(set)) if this < set)
        }) {
            continue;
        }
        let call = LeaseCall {
            event,
            wire,
            command,
            reply,
            lease,
            live: leases.get(lease).cloned(),
            namespace,
        };
        call.judge(&mut leases, &mut violations);
    }
    violations
}

/// One command on a lease key, judged against the holder this replay believed live before it.
struct LeaseCall<'a> {
    event: &'a Event,
    wire: &'a WireEvent,
    command: &'a racecert_wire::RedisCommand,
    reply: Option<&'a RedisReply>,
    lease: &'a String,
    live: Option<Holder>,
    namespace: Option<&'a str>,
}

impl LeaseCall<'_> {
    /// Judges the command and applies its effect to the replayed leases.
    fn judge(&self, leases: &mut HashMap<String, Holder>, violations: &mut Vec<Violation>) {
        let (wire, lease, reply) = (self.wire, self.lease, self.reply);
        match self.command.name.as_str() {
            "SET" if ok(reply) => self.set(leases, violations),
            "DEL" | "UNLINK" | "GETDEL"
                if positive(reply) || matches!(reply, Some(RedisReply::Bulk { .. })) =>
            {
                if self
                    .live
                    .as_ref()
                    .is_some_and(|h| h.freed_by(&wire.worker, &[]))
                {
                    return;
                }
                if let Some(holder) = self.foreign(None) {
                    violations.push(self.violation(
                        format!(
                            "{} deleted the live lease {lease} of {} without checking its token",
                            wire.worker, holder.worker
                        ),
                        holder,
                    ));
                }
                leases.remove(lease);
            }
            "EXPIRE" | "PEXPIRE" | "PERSIST" | "EXPIREAT" | "PEXPIREAT" if positive(reply) => {
                if let Some(holder) = self.foreign(None) {
                    violations.push(self.violation(
                        format!(
                            "{} extended the live lease {lease} of {}",
                            wire.worker, holder.worker
                        ),
                        holder,
                    ));
                }
            }
            "EVAL" | "EVALSHA" | "FCALL" if positive(reply) => self.script(leases, violations),
            _ => {}
        }
    }

    /// A `SET` that succeeded: the lease is now this worker's.
    fn set(&self, leases: &mut HashMap<String, Holder>, violations: &mut Vec<Violation>) {
        let (event, wire, command, lease) = (self.event, self.wire, self.command, self.lease);
        let token = command.args.get(1).cloned().unwrap_or_default();
        // A SET NX that succeeded proves the key was free (expired, deleted, restarted),
        // whatever this replay believed: only a SET without NX can overwrite.
        let exclusive = option(&command.args, "NX").is_some();
        let displaced = self
            .live
            .as_ref()
            .filter(|h| exclusive && h.worker != wire.worker)
            .map(|h| (h.worker.clone(), h.token.clone()));
        if let Some(holder) = self.foreign(Some(&token)).filter(|_| !exclusive) {
            violations.push(self.violation(
                format!(
                    "{} overwrote the live lease {lease} of {} (token {}) with its own",
                    wire.worker, holder.worker, holder.token
                ),
                holder,
            ));
        }
        leases.insert(
            lease.clone(),
            Holder {
                worker: wire.worker.clone(),
                token,
                expires_at: set_ttl(&command.args).map(|ttl| event.at_ms + ttl),
                proof: proof(event, wire, self.namespace),
                forwarded_us: wire.trip.forwarded_us,
                displaced,
            },
        );
    }

    /// A script that acted on the lease (released or renewed it): right only for the holder
    /// whose token it was given.
    fn script(&self, leases: &mut HashMap<String, Holder>, violations: &mut Vec<Violation>) {
        let (wire, command, lease) = (self.wire, self.command, self.lease);
        // The first argument after the keys is the token by the contract's convention; any
        // argument equal to the holder's token counts.
        let numkeys: usize = command
            .args
            .get(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(command.keys.len());
        let rest: Vec<&String> = command.args.iter().skip(2 + numkeys).collect();
        if !rest.is_empty()
            && self
                .live
                .as_ref()
                .is_some_and(|h| h.freed_by(&wire.worker, &rest))
        {
            return;
        }
        if let Some(holder) = self
            .live
            .as_ref()
            .filter(|h| h.worker != wire.worker && !rest.iter().any(|arg| **arg == h.token))
        {
            violations.push(self.violation(
                format!(
                    "{} ran a script on the live lease {lease} of {} (token {}) with another token",
                    wire.worker, holder.worker, holder.token
                ),
                holder,
            ));
        }
        leases.remove(lease);
    }

    /// The live holder, if another worker's whose token this is not (any token, for `None`).
    fn foreign(&self, token: Option<&String>) -> Option<&Holder> {
        self.live
            .as_ref()
            .filter(|h| token.is_none_or(|t| *t != h.token) && h.worker != self.wire.worker)
    }

    /// A breach of the discipline, proved by the holder's round trip and this one.
    fn violation(&self, observed: String, holder: &Holder) -> Violation {
        Violation {
            invariant: Invariant::LeaseDiscipline,
            observed,
            evidence: vec![
                holder.proof.clone(),
                proof(self.event, self.wire, self.namespace),
            ],
        }
    }
}

/// No entry in one model version's cache namespace holds an output another version produced:
/// judged when it is written.
pub(super) fn no_cross_version_cache_entry(history: &History, keys: &KeyMatcher) -> Vec<Violation> {
    let namespace = history.namespace.as_deref();
    let mut violations = Vec::new();
    for event in &history.events {
        let EventKind::Wire(wire) = &event.kind else {
            continue;
        };
        let Some((command, reply)) = redis(&wire.trip) else {
            continue;
        };
        let value = match command.name.as_str() {
            "SET" | "SETNX" | "GETSET" => command.args.get(1),
            "SETEX" | "PSETEX" => command.args.get(2),
            _ => None,
        };
        let (Some(key), Some(value)) = (command.keys.first(), value) else {
            continue;
        };
        let written = command.queued
            || ok(reply)
            || positive(reply)
            || matches!(reply, Some(RedisReply::Bulk { .. } | RedisReply::Nil) if command.name == "GETSET");
        let Some(version) = keys.cache_version(key) else {
            continue;
        };
        if !written {
            continue;
        }
        let produced = output_versions(value);
        if let Some(other) = produced.iter().find(|v| **v != version) {
            violations.push(Violation {
                invariant: Invariant::NoCrossVersionCacheEntry,
                observed: format!(
                    "{} wrote an output of {other} into {version}'s cache namespace ({key})",
                    wire.worker
                ),
                evidence: vec![proof(event, wire, namespace)],
            });
        }
    }
    violations
}

/// No attempt is served a cached output of another model version: every cache read on the wire
/// whose answer was produced by a version other than the reader's.
pub(super) fn no_stale_cache_read(history: &History, keys: &KeyMatcher) -> Vec<Violation> {
    let namespace = history.namespace.as_deref();
    let mut versions = WorkerVersions::default();
    let mut violations = Vec::new();
    for event in &history.events {
        versions.observe(event);
        let EventKind::Wire(wire) = &event.kind else {
            continue;
        };
        let Some((command, Some(RedisReply::Bulk { text, .. }))) = redis(&wire.trip) else {
            continue;
        };
        if !matches!(command.name.as_str(), "GET" | "GETEX" | "GETDEL") {
            continue;
        }
        let Some(key) = command.keys.first() else {
            continue;
        };
        // A cache read: in the cache's layout, or (an unversioned cache) any key holding an
        // output that is not a lease.
        if keys.is_lease(key) {
            continue;
        }
        let Some(reader) = versions.of(&wire.worker) else {
            continue;
        };
        let served = output_versions(text);
        let in_cache = keys.cache_version(key).is_some() || !served.is_empty();
        if let (true, Some(other)) = (in_cache, served.iter().find(|v| *v != reader)) {
            violations.push(Violation {
                invariant: Invariant::NoStaleCacheRead,
                observed: format!(
                    "{} running as {reader} read a {other} output from cache key {key}",
                    wire.worker
                ),
                evidence: vec![proof(event, wire, namespace)],
            });
        }
    }
    violations
}

/// No backend call for a job while another worker holds a valid lease on it and the caller never
/// held one: execution without dedupe, judged from the lease commands and the backend calls on
/// the wire.
pub(super) fn compute_waste_bounded(history: &History, keys: &KeyMatcher) -> Vec<Violation> {
    let namespace = history.namespace.as_deref();
    let mut leases: HashMap<String, Holder> = HashMap::new();
    // (worker, job key) pairs where the worker took the lease at some point.
    let mut held: BTreeSet<(String, String)> = BTreeSet::new();
    let mut violations = Vec::new();
    for event in &history.events {
        if history.lease_ttl_ms.is_some() {
            leases.retain(|_, h| h.expires_at.is_none_or(|at| event.at_ms < at));
        }
        let wire = match &event.kind {
            EventKind::Fault(Effect::LeaseExpired { key, .. }) => {
                leases.retain(|lease, _| keys.lease_of(lease).as_deref() != Some(key.as_str()));
                continue;
            }
            EventKind::Fault(Effect::RedisRestarted) => {
                leases.clear();
                continue;
            }
            EventKind::Wire(wire) => wire,
            _ => continue,
        };
        match (&wire.trip.request, &wire.trip.reply) {
            (Request::Redis(command), reply) => {
                let reply = match reply {
                    Some(Reply::Redis(r)) => Some(r),
                    _ => None,
                };
                let Some(lease) = command.keys.iter().find(|k| keys.is_lease(k)) else {
                    continue;
                };
                let Some(job) = keys.lease_of(lease) else {
                    continue;
                };
                match command.name.as_str() {
                    "SET" if ok(reply) => {
                        held.insert((wire.worker.clone(), job.clone()));
                        leases.insert(
                            job,
                            Holder {
                                worker: wire.worker.clone(),
                                token: command.args.get(1).cloned().unwrap_or_default(),
                                expires_at: set_ttl(&command.args).map(|ttl| event.at_ms + ttl),
                                proof: proof(event, wire, namespace),
                                forwarded_us: wire.trip.forwarded_us,
                                displaced: None,
                            },
                        );
                    }
                    "DEL" | "UNLINK" | "GETDEL" | "EVAL" | "EVALSHA" | "FCALL"
                        if positive(reply) || matches!(reply, Some(RedisReply::Bulk { .. })) =>
                    {
                        leases.remove(&job);
                    }
                    _ => {}
                }
            }
            (Request::Http(http), _) if wire.service.starts_with("backend:") => {
                let call: Option<racecert_core::contract::InferRequest> =
                    serde_json::from_str(&http.body).ok();
                let Some(job) = call.map(|c| c.idempotency_key).filter(|k| !k.is_empty()) else {
                    continue;
                };
                if held.contains(&(wire.worker.clone(), job.clone())) {
                    continue;
                }
                if let Some(holder) = leases.get(&job).filter(|h| h.worker != wire.worker) {
                    violations.push(Violation {
                        invariant: Invariant::ComputeWasteBounded,
                        observed: format!(
                            "{} called the backend for {job} without ever holding its lease, while {} held it",
                            wire.worker, holder.worker
                        ),
                        evidence: vec![holder.proof.clone(), proof(event, wire, namespace)],
                    });
                }
            }
            _ => {}
        }
    }
    violations
}

/// drain-discipline: a worker told to stop (a rollout's stop signal: a `drain` or `cutover`
/// fault) begins nothing new. Judged
/// per request of the history: a worker that had not acted on a request before its stop signal
/// and sends a round trip acting on it after (its model call, a statement or command naming it)
/// took a new job while it should have been draining. The first such round trip is the evidence.
pub(super) fn drain_discipline(history: &History) -> Vec<Violation> {
    use super::landing::sent_ms;
    let signals = history.events.iter().filter_map(|event| match &event.kind {
        EventKind::Harness(Observation::Stopping { worker, .. }) => {
            Some((worker.as_str(), event.at_ms as i64))
        }
        _ => None,
    });
    let mut out = Vec::new();
    for (worker, signal) in signals {
        for request in &history.requests {
            let names: Vec<&str> = [request.request_id.as_str(), request.input.as_str()]
                .into_iter()
                .filter(|n| n.len() >= 4)
                .collect();
            let mut acts = history.events.iter().filter_map(|event| match &event.kind {
                EventKind::Wire(wire) if wire.worker == worker && wire.trip.names_any(&names) => {
                    Some((sent_ms(history, event, &wire.trip), event, wire.as_ref()))
                }
                _ => None,
            });
            let Some((first, event, wire)) = acts.next() else {
                continue;
            };
            if first < signal {
                continue;
            }
            out.push(Violation {
                invariant: Invariant::DrainDiscipline,
                observed: format!(
                    "{worker} took request {} {} ms after it was told to stop",
                    request.request_id,
                    first - signal
                ),
                evidence: vec![
                    format!("t={signal}ms {worker} told to stop (its stop signal)"),
                    proof(event, wire, history.namespace.as_deref()),
                ],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use racecert_core::contract::layout::KeyLayout;
    use racecert_wire::RedisCommand;

    fn redis_trip(
        worker: &str,
        name: &str,
        args: &[&str],
        keys: &[&str],
        reply: RedisReply,
    ) -> EventKind {
        EventKind::Wire(Box::new(WireEvent {
            worker: worker.into(),
            service: "redis".into(),
            trip: RoundTrip {
                link: "l".into(),
                conn: 1,
                seq: 0,
                sent_us: 0,
                forwarded_us: Some(0),
                answered_us: Some(1),
                request: Request::Redis(RedisCommand {
                    name: name.into(),
                    args: args.iter().map(|a| (*a).to_owned()).collect(),
                    argc: args.len(),
                    keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                    queued: false,
                    truncated: false,
                    pushed: Vec::new(),
                }),
                reply: Some(Reply::Redis(reply)),
            },
        }))
    }

    fn history(kinds: Vec<EventKind>) -> History {
        History {
            events: kinds
                .into_iter()
                .enumerate()
                .map(|(i, kind)| Event {
                    step: i,
                    at_ms: i as u64,
                    kind,
                })
                .collect(),
            wire_recorded: true,
            namespace: Some("c:".into()),
            layout: KeyLayout::contract("c:"),
            ..History::default()
        }
    }

    #[test]
    fn a_foreign_release_and_a_lease_stomp_break_lease_discipline_a_fenced_release_does_not() {
        let lease = "c:inference:lock:c:idem-1";
        let matcher = KeyLayout::contract("c:").matcher();
        let ok = || RedisReply::Status("OK".into());
        let taken = |w: &str, t: &str| {
            redis_trip(w, "SET", &[lease, t, "NX", "PX", "60000"], &[lease], ok())
        };
        let expired = EventKind::Fault(Effect::LeaseExpired {
            key: "c:idem-1".into(),
            held: true,
        });
        // a takes, its lease expires, c takes; a releases with a token check (no effect): fine.
        let fenced = history(vec![
            taken("a", "ta"),
            expired.clone(),
            taken("c", "tc"),
            redis_trip(
                "a",
                "EVALSHA",
                &["sha", "1", lease, "ta"],
                &[lease],
                RedisReply::Int(0),
            ),
        ]);
        assert!(lease_discipline(&fenced, &matcher).is_empty());
        // The same, released with a plain DEL: a deletes c's live lease.
        let plain = history(vec![
            taken("a", "ta"),
            expired,
            taken("c", "tc"),
            redis_trip("a", "DEL", &[lease], &[lease], RedisReply::Int(1)),
        ]);
        let found = lease_discipline(&plain, &matcher);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].observed.contains("a deleted the live lease"),
            "{}",
            found[0].observed
        );
        assert_eq!(found[0].evidence.len(), 2);
        // A SET without NX over a live lease stomps it.
        let stomp = history(vec![
            taken("a", "ta"),
            redis_trip("c", "SET", &[lease, "tc", "PX", "60000"], &[lease], ok()),
        ]);
        assert_eq!(lease_discipline(&stomp, &matcher).len(), 1);
    }

    #[test]
    fn a_release_that_reached_the_server_before_the_takeover_is_judged_in_server_order() {
        let lease = "c:inference:lock:c:idem-1";
        let matcher = KeyLayout::contract("c:").matcher();
        let forwarded = |mut kind: EventKind, at: u64| {
            if let EventKind::Wire(wire) = &mut kind {
                wire.trip.forwarded_us = Some(at);
            }
            kind
        };
        let take = |w: &str, t: &str, at: u64| {
            let ok = RedisReply::Status("OK".into());
            let set = redis_trip(w, "SET", &[lease, t, "NX", "PX", "60000"], &[lease], ok);
            forwarded(set, at)
        };
        let release = |at: u64| {
            let script = &["sha", "1", lease, "ta"];
            forwarded(
                redis_trip("a", "EVALSHA", script, &[lease], RedisReply::Int(1)),
                at,
            )
        };
        // Both held, then released together: c's SET completed first in the recording, but a's
        // release reached the server first (it freed the key c's SET NX then took).
        let reordered = history(vec![take("a", "ta", 10), take("c", "tc", 30), release(20)]);
        assert!(lease_discipline(&reordered, &matcher).is_empty());
        // The proxy forwarded the release after c's SET, yet the server ran it first: c's SET NX
        // succeeded while a's lease had not expired, and a's script acted on a's token (seen in
        // CI: two connections' writes reach the server in either order).
        let late = history(vec![take("a", "ta", 10), take("c", "tc", 30), release(40)]);
        assert!(lease_discipline(&late, &matcher).is_empty());
        // After an expiry freed a's lease, c's SET NX proves nothing about a: a script of a's
        // that still acts is run on c's live lease.
        let expired = EventKind::Fault(Effect::LeaseExpired {
            key: "c:idem-1".into(),
            held: true,
        });
        let foreign = history(vec![
            take("a", "ta", 10),
            expired,
            take("c", "tc", 30),
            release(40),
        ]);
        assert_eq!(lease_discipline(&foreign, &matcher).len(), 1);
        // The displaced holder's script with another token is not the release that freed it.
        let other = forwarded(
            redis_trip(
                "a",
                "EVALSHA",
                &["sha", "1", lease, "tx"],
                &[lease],
                RedisReply::Int(1),
            ),
            40,
        );
        let stray = history(vec![take("a", "ta", 10), take("c", "tc", 30), other]);
        assert_eq!(lease_discipline(&stray, &matcher).len(), 1);
    }

    #[test]
    fn cache_entries_and_reads_are_judged_by_the_versions_they_name() {
        let matcher = KeyLayout::contract("c:").matcher();
        let v1 = racecert_core::contract::model_output("x", "v1");
        let cross = history(vec![redis_trip(
            "a",
            "SETEX",
            &["c:inf:v2:abc", "3600", &v1],
            &["c:inf:v2:abc"],
            RedisReply::Status("OK".into()),
        )]);
        assert_eq!(no_cross_version_cache_entry(&cross, &matcher).len(), 1);
        let mut stale = history(vec![
            EventKind::Harness(Observation::WorkerStarted {
                worker: "c".into(),
                version: "v2".into(),
            }),
            redis_trip(
                "c",
                "GET",
                &["c:inf:abc"],
                &["c:inf:abc"],
                RedisReply::Bulk {
                    len: v1.len(),
                    text: v1.clone(),
                },
            ),
        ]);
        assert_eq!(no_stale_cache_read(&stale, &matcher).len(), 1);
        stale.events.truncate(1);
        assert!(no_stale_cache_read(&stale, &matcher).is_empty());
    }

    #[test]
    fn a_worker_restarted_on_a_new_version_is_judged_by_its_version_at_each_read() {
        // A rolling restart keeps the worker's id: its v1 reads before it and its v2 reads after
        // it are both fresh (seen as a false no-stale-cache-read in a long fleet run, when the
        // last start's version judged every read).
        let matcher = KeyLayout::contract("c:").matcher();
        let read = |version: &str| {
            let output = racecert_core::contract::model_output("x", version);
            redis_trip(
                "b",
                "GET",
                &[&format!("c:inf:{version}:abc")],
                &[&format!("c:inf:{version}:abc")],
                RedisReply::Bulk {
                    len: output.len(),
                    text: output,
                },
            )
        };
        let started = |version: &str| {
            EventKind::Harness(Observation::WorkerStarted {
                worker: "b".into(),
                version: version.into(),
            })
        };
        let rolled = history(vec![started("v1"), read("v1"), started("v2"), read("v2")]);
        assert!(no_stale_cache_read(&rolled, &matcher).is_empty());
        // After the restart, an entry of the old version is still a stale read.
        let stale = history(vec![started("v1"), read("v1"), started("v2"), read("v1")]);
        let found = no_stale_cache_read(&stale, &matcher);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].observed.contains("running as v2 read a v1 output"));
    }

    #[test]
    fn a_worker_told_to_stop_that_takes_the_next_job_breaks_drain_discipline() {
        let brpop_then = |worker: &str, request: &str| {
            redis_trip(
                worker,
                "HSET",
                &["unacked", "tag", request],
                &["unacked"],
                RedisReply::Int(1),
            )
        };
        let stop = EventKind::Harness(Observation::Stopping {
            worker: "a".into(),
            signal: "SIGTERM".into(),
        });
        let requests = vec![
            racecert_history::SubmittedRequest {
                request_id: "req-first".into(),
                idempotency_key: "req-first".into(),
                input: "first input".into(),
            },
            racecert_history::SubmittedRequest {
                request_id: "req-next".into(),
                idempotency_key: "req-next".into(),
                input: "next input".into(),
            },
        ];
        // Event times are their positions (ms); with no wire origin, a round trip is sent when
        // its event is. a holds req-first (0), is told to stop (1), finishes req-first (2): fine;
        // b takes req-next (3): fine.
        let mut good = history(vec![
            brpop_then("a", "req-first"),
            stop.clone(),
            brpop_then("a", "req-first"),
            brpop_then("b", "req-next"),
        ]);
        good.requests = requests.clone();
        assert!(drain_discipline(&good).is_empty());
        // a takes req-next after its stop signal: a violation, with the round trip.
        let mut bad = history(vec![
            brpop_then("a", "req-first"),
            stop,
            brpop_then("a", "req-next"),
        ]);
        bad.requests = requests;
        let found = drain_discipline(&bad);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].observed.starts_with("a took request req-next"));
        assert!(found[0].evidence.iter().any(|e| e.contains("req-next")));
    }
}
