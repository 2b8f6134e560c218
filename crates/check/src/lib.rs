//! Invariants, each with a name and a report: what should hold, what was observed, and the events
//! that prove it. They read a [`History`] only, so they judge any worker honouring the contract,
//! and they lean on the audit trail and the backend journals wherever a worker's own log could lie.
//! [`coverage`] judges, from the same history, which faults reached the path they target.

#![deny(missing_docs)]

pub mod coverage;
mod fencing;
mod landing;
mod wire;

use racecert_core::contract::log::Status;
use racecert_core::contract::output_version;
use racecert_core::fault::Effect;
use racecert_history::{AuditRow, EventKind, History, Observation};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

/// A named invariant.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Invariant {
    /// At most one final write per request.
    AtMostOneFinalWrite,
    /// Generations strictly increase per idempotency key, write after write.
    GenerationsIncrease,
    /// A final write comes from the owner: IN_PROGRESS before, same lease token after.
    NoNonOwnerFinalWrite,
    /// A stored result was produced by the version it names.
    ResultNamesItsVersion,
    /// No attempt is served a cached output of another version.
    NoStaleCacheRead,
    /// Every submitted request ends terminal once faults heal.
    NoLostJob,
    /// No backend call for a request while another attempt holds a valid lease on it.
    ComputeWasteBounded,
    /// A lease is taken only when free, renewed and released only by its holder (on the wire).
    LeaseDiscipline,
    /// No cache entry in one version's namespace holds another version's output (on the wire).
    NoCrossVersionCacheEntry,
    /// Every delivery is acknowledged once its job is done: none is left pending after the
    /// drain.
    NoStuckDelivery,
    /// A worker told to stop takes no new job (on the wire).
    DrainDiscipline,
    /// Requests accepted after a rollout's switch (and its mixed window) are answered by the
    /// new version.
    ServedByNewVersion,
}

impl Invariant {
    /// The invariants about what eventually happens (a request ends, a delivery is taken, the
    /// new version serves): judged only once nothing racecert holds can still change the answer.
    pub const LIVENESS: [Invariant; 3] = [
        Invariant::NoLostJob,
        Invariant::NoStuckDelivery,
        Invariant::ServedByNewVersion,
    ];

    /// Every invariant.
    pub const ALL: [Invariant; 12] = [
        Invariant::AtMostOneFinalWrite,
        Invariant::GenerationsIncrease,
        Invariant::NoNonOwnerFinalWrite,
        Invariant::ResultNamesItsVersion,
        Invariant::NoStaleCacheRead,
        Invariant::NoLostJob,
        Invariant::ComputeWasteBounded,
        Invariant::LeaseDiscipline,
        Invariant::NoCrossVersionCacheEntry,
        Invariant::NoStuckDelivery,
        Invariant::DrainDiscipline,
        Invariant::ServedByNewVersion,
    ];

    /// Whether it needs a team's system's rollout to judge anything: a stop signal or a
    /// version switch that the system runner records. racecert's own runners make neither, so
    /// they do not claim it held.
    pub fn needs_rollout(self) -> bool {
        matches!(
            self,
            Invariant::DrainDiscipline | Invariant::ServedByNewVersion
        )
    }

    /// The invariants racecert's own runners judge (in process, fleets, wire schedules): every
    /// one but those that need a team's rollout.
    pub fn own() -> Vec<Invariant> {
        Invariant::ALL
            .into_iter()
            .filter(|i| !i.needs_rollout())
            .collect()
    }

    /// Whether it is judged from recorded round trips only (nothing to judge without them).
    pub fn needs_wire(self) -> bool {
        matches!(
            self,
            Invariant::LeaseDiscipline
                | Invariant::NoCrossVersionCacheEntry
                | Invariant::DrainDiscipline
        )
    }

    /// Short name, as suites and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::AtMostOneFinalWrite => "at-most-one-final-write",
            Invariant::GenerationsIncrease => "generations-increase",
            Invariant::NoNonOwnerFinalWrite => "no-non-owner-final-write",
            Invariant::ResultNamesItsVersion => "result-names-its-version",
            Invariant::NoStaleCacheRead => "no-stale-cache-read",
            Invariant::NoLostJob => "no-lost-job",
            Invariant::ComputeWasteBounded => "compute-waste-bounded",
            Invariant::LeaseDiscipline => "lease-discipline",
            Invariant::NoCrossVersionCacheEntry => "no-cross-version-cache-entry",
            Invariant::NoStuckDelivery => "no-stuck-delivery",
            Invariant::DrainDiscipline => "drain-discipline",
            Invariant::ServedByNewVersion => "served-by-new-version",
        }
    }

    /// What should hold, in a sentence.
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::AtMostOneFinalWrite => "at most one final write per request",
            Invariant::GenerationsIncrease => "generations strictly increase per idempotency key",
            Invariant::NoNonOwnerFinalWrite => {
                "a final write is made by the lease owner of an IN_PROGRESS job"
            }
            Invariant::ResultNamesItsVersion => {
                "a stored result was produced by the model version it names"
            }
            Invariant::NoStaleCacheRead => {
                "no attempt is served a cached output of another model version"
            }
            Invariant::NoLostJob => "every submitted request ends terminal once faults heal",
            Invariant::ComputeWasteBounded => {
                "no backend call for a request while another attempt holds a valid lease on it"
            }
            Invariant::LeaseDiscipline => {
                "a lease is taken only when free, and renewed or released only by the holder whose token it stores"
            }
            Invariant::NoCrossVersionCacheEntry => {
                "no entry in one model version's cache namespace holds an output of another version"
            }
            Invariant::NoStuckDelivery => {
                "every delivery is acknowledged once its job is done, none redelivered endlessly"
            }
            Invariant::DrainDiscipline => "a worker told to stop takes no new job",
            Invariant::ServedByNewVersion => {
                "a request accepted after the rollout's switch (and its mixed window) is answered by the new version"
            }
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Invariant {
    type Err = racecert_core::Error;

    fn from_str(s: &str) -> racecert_core::Result<Invariant> {
        Invariant::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| {
                racecert_core::Error::Config(format!(
                    "unknown invariant {s:?}; known: {}",
                    Invariant::ALL.map(Invariant::name).join(", ")
                ))
            })
    }
}

/// What a certificate is worth: PASSED only when every invariant held *and* every fault kind
/// in scope landed on its target; INCONCLUSIVE when nothing failed but something in scope never
/// landed (the run did not exercise what it claims); FAILED on a counterexample or a suite that
/// did not come out as expected.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Everything in scope landed and held.
    Passed,
    /// Nothing failed, but not everything in scope was exercised.
    Inconclusive,
    /// A counterexample, an error, or a suite not as expected.
    Failed,
}

impl Verdict {
    /// The verdict in a word, upper case.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Passed => "PASSED",
            Verdict::Inconclusive => "INCONCLUSIVE",
            Verdict::Failed => "FAILED",
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// What was observed.
    pub observed: String,
    /// The events and rows that prove it.
    pub evidence: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invariant {} violated", self.invariant)?;
        writeln!(f, "  should hold: {}", self.invariant.statement())?;
        writeln!(f, "  observed:    {}", self.observed)?;
        for line in &self.evidence {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

/// Checks `invariants` on `history`. With the workers' round trips recorded, the cache and lease
/// invariants are judged on the wire (what the workers sent), else on their log lines.
pub fn check(history: &History, invariants: &[Invariant]) -> Vec<Violation> {
    let keys = history.layout.matcher();
    let wire = history.wire_recorded;
    invariants
        .iter()
        .flat_map(|invariant| match invariant {
            Invariant::AtMostOneFinalWrite => at_most_one_final_write(history),
            Invariant::GenerationsIncrease => generations_increase(history),
            Invariant::NoNonOwnerFinalWrite => no_non_owner_final_write(history),
            Invariant::ResultNamesItsVersion => result_names_its_version(history),
            Invariant::NoStaleCacheRead if wire => wire::no_stale_cache_read(history, &keys),
            Invariant::NoStaleCacheRead => no_stale_cache_read(history),
            Invariant::NoLostJob => no_lost_job(history),
            Invariant::NoStuckDelivery => no_stuck_delivery(history),
            Invariant::ComputeWasteBounded if wire => wire::compute_waste_bounded(history, &keys),
            Invariant::ComputeWasteBounded => compute_waste_bounded(history),
            Invariant::LeaseDiscipline if wire => wire::lease_discipline(history, &keys),
            Invariant::NoCrossVersionCacheEntry if wire => {
                wire::no_cross_version_cache_entry(history, &keys)
            }
            Invariant::DrainDiscipline if wire => wire::drain_discipline(history),
            Invariant::ServedByNewVersion => served_by_new_version(history),
            Invariant::LeaseDiscipline
            | Invariant::NoCrossVersionCacheEntry
            | Invariant::DrainDiscipline => Vec::new(),
        })
        .collect()
}

/// served-by-new-version: every request submitted at or after a rollout's switch plus its mixed
/// window ends with an output of the version rolled out (the output names the version that
/// produced it). An old worker still consuming, or a cache answering with the old model's
/// output, both break it.
fn served_by_new_version(history: &History) -> Vec<Violation> {
    let switch = history.events.iter().find_map(|event| match &event.kind {
        EventKind::Harness(Observation::Switched { to, window_ms, .. }) => {
            Some((event.at_ms + window_ms, to.as_str(), event.at_ms))
        }
        _ => None,
    });
    let Some((from_ms, to, switched_ms)) = switch else {
        return Vec::new();
    };
    let mut violations = Vec::new();
    for event in &history.events {
        let EventKind::Harness(Observation::Submitted { key }) = &event.kind else {
            continue;
        };
        if event.at_ms < from_ms {
            continue;
        }
        let Some(job) = history.jobs.iter().find(|j| j.idempotency_key == *key) else {
            continue;
        };
        let Some(output) = job.output.as_deref() else {
            continue;
        };
        let named = wire::output_versions(output);
        if let Some(other) = named.iter().find(|v| *v != to) {
            violations.push(Violation {
                invariant: Invariant::ServedByNewVersion,
                observed: format!(
                    "request {key}, accepted {} ms after the switch to {to}, was answered by {other}",
                    event.at_ms - switched_ms
                ),
                evidence: vec![
                    format!("t={switched_ms}ms the rollout switched to {to}"),
                    format!("t={}ms {key} submitted", event.at_ms),
                    format!("final row of {key}: output {output:?}"),
                ],
            });
        }
    }
    violations
}

fn by_key(audit: &[AuditRow]) -> BTreeMap<&str, Vec<&AuditRow>> {
    let mut map: BTreeMap<&str, Vec<&AuditRow>> = BTreeMap::new();
    for row in audit {
        map.entry(row.idempotency_key.as_str())
            .or_default()
            .push(row);
    }
    map
}

fn at_most_one_final_write(history: &History) -> Vec<Violation> {
    let mut per_request: BTreeMap<String, Vec<&AuditRow>> = BTreeMap::new();
    for row in history.audit.iter().filter(|r| history.is_final(r)) {
        let request = history
            .request_of(&row.idempotency_key)
            .unwrap_or(&row.idempotency_key)
            .to_owned();
        per_request.entry(request).or_default().push(row);
    }
    per_request
        .into_iter()
        .filter(|(_, rows)| rows.len() > 1)
        .map(|(request, rows)| Violation {
            invariant: Invariant::AtMostOneFinalWrite,
            observed: format!("request {request} has {} final writes", rows.len()),
            evidence: rows.iter().map(|r| r.describe()).collect(),
        })
        .collect()
}

fn generations_increase(history: &History) -> Vec<Violation> {
    if let Some(fencing) = &history.fencing {
        return fencing::never_back(history, fencing);
    }
    let mut violations = Vec::new();
    for (key, rows) in by_key(&history.audit) {
        for pair in rows.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let (Some(was), Some(now)) = (before.new_generation, after.new_generation) else {
                continue;
            };
            if now <= was {
                violations.push(Violation {
                    invariant: Invariant::GenerationsIncrease,
                    observed: format!("key {key}: generation went from {was} to {now}"),
                    evidence: vec![before.describe(), after.describe()],
                });
            }
        }
    }
    violations
}

/// A final write comes from the owner of the job. Ownership is judged from what the writer
/// really held, where the wire shows it: the writer is the worker whose connection carried the
/// write (the audit row's server process against the connections' startups). It must have taken
/// the job's lease (its `SET` answered OK) before writing, and nobody may have taken the job over
/// since: another worker that took the lease after the writer's last `SET` and then wrote the
/// job's row (took the job) before the final write. A lease taken over but not yet used does not
/// make the old holder's write wrong: the result store had not heard of the new holder, and a
/// fenced take refuses it afterwards. Without that evidence, and beside it, the token columns
/// judge: a final write over a job that was not IN_PROGRESS, or under another token than the
/// row's.
fn no_non_owner_final_write(history: &History) -> Vec<Violation> {
    if let Some(fencing) = &history.fencing {
        return fencing::final_writes_by_holders(history, fencing);
    }
    let takers = if history.wire_recorded {
        wire::lease_takers(history, &history.layout.matcher())
    } else {
        HashMap::new()
    };
    let mut violations = Vec::new();
    for r in history.audit.iter().filter(|r| history.is_final(r)) {
        if let (Some(writer), Some(at), Some(taken)) = (
            r.writer.as_deref(),
            history.written_at(r),
            takers.get(&r.idempotency_key),
        ) {
            let own = taken
                .iter()
                .rev()
                .find(|(t, worker, _)| *t <= at && worker == writer);
            let taken_over = own.and_then(|(since, _, _)| {
                taken
                    .iter()
                    .filter(|(t, worker, _)| t > since && *t <= at && worker != writer)
                    .find_map(|(t, worker, proof)| {
                        history
                            .audit
                            .iter()
                            .filter(|w| w.idempotency_key == r.idempotency_key)
                            .filter(|w| w.audit_id < r.audit_id)
                            .filter(|w| w.writer.as_deref() == Some(worker.as_str()))
                            .find(|w| history.written_at(w).is_some_and(|wt| wt >= *t))
                            .map(|w| (worker, proof, w))
                    })
            });
            let observed = match (own, taken_over) {
                (None, _) => Some((
                    format!(
                        "key {}: final write by {writer}, who never took the job's lease (the writer's connection carried it)",
                        r.idempotency_key
                    ),
                    vec![r.describe()],
                )),
                (Some(_), Some((owner, proof, took))) => Some((
                    format!(
                        "key {}: final write by {writer}, whose lease {owner} had taken since and used to take the job (the writer's connection carried it)",
                        r.idempotency_key
                    ),
                    vec![proof.clone(), took.describe(), r.describe()],
                )),
                (Some(_), None) => None,
            };
            if let Some((observed, evidence)) = observed {
                violations.push(Violation {
                    invariant: Invariant::NoNonOwnerFinalWrite,
                    observed,
                    evidence,
                });
                continue;
            }
        }
        if r.old_status.as_deref() != Some("IN_PROGRESS") || r.old_lease_token != r.new_lease_token
        {
            violations.push(Violation {
                invariant: Invariant::NoNonOwnerFinalWrite,
                observed: format!(
                    "key {}: final write over status {} with token {} (owner's token {})",
                    r.idempotency_key,
                    r.old_status.as_deref().unwrap_or("-"),
                    r.new_lease_token.as_deref().unwrap_or("-"),
                    r.old_lease_token.as_deref().unwrap_or("-"),
                ),
                evidence: vec![r.describe()],
            });
        }
    }
    violations
}

fn result_names_its_version(history: &History) -> Vec<Violation> {
    history
        .audit
        .iter()
        .filter(|r| history.is_final(r))
        .filter_map(|r| {
            // Judged where both sides speak: the output names the version that produced it (the
            // backends' outputs do) and the row names a version.
            let produced = r.output.as_deref().and_then(output_version)?;
            let named = r.new_model_version.as_deref()?;
            (produced != named).then(|| Violation {
                invariant: Invariant::ResultNamesItsVersion,
                observed: format!(
                    "key {}: record names {named} but the output was produced by {produced}",
                    r.idempotency_key,
                ),
                evidence: vec![r.describe()],
            })
        })
        .collect()
}

fn no_stale_cache_read(history: &History) -> Vec<Violation> {
    history
        .with_status(Status::CacheHit)
        .filter_map(|e| Some((e, e.line()?)))
        .filter(|(_, line)| line.get("served_model_version") != line.get("model_version"))
        .map(|(e, line)| Violation {
            invariant: Invariant::NoStaleCacheRead,
            observed: format!(
                "{} running as {} was served a {} output from cache key {}",
                line.get("worker_id").unwrap_or("-"),
                line.get("model_version").unwrap_or("-"),
                line.get("served_model_version").unwrap_or("-"),
                line.get("cache_key").unwrap_or("-"),
            ),
            evidence: vec![event_line(e)],
        })
        .collect()
}

fn no_lost_job(history: &History) -> Vec<Violation> {
    history
        .requests
        .iter()
        .filter_map(|request| {
            let job = history
                .jobs
                .iter()
                .find(|j| j.idempotency_key == request.idempotency_key);
            let terminal = job.is_some_and(|j| history.is_terminal(&j.status));
            (!terminal).then(|| Violation {
                invariant: Invariant::NoLostJob,
                observed: format!(
                    "request {} ({}) is {} after the run healed and drained",
                    request.request_id,
                    request.idempotency_key,
                    job.map_or("missing", |j| j.status.as_str())
                ),
                evidence: history
                    .events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        EventKind::Harness(Observation::LeaseOutlivesBound {
                            key,
                            ttl_ms,
                            bound_ms,
                        }) if *key == request.idempotency_key => Some(format!(
                            "its lease was set to live {} more, past the liveness bound of {bound_ms} ms: nothing may take the job until then",
                            if *ttl_ms < 0 {
                                "forever".to_owned()
                            } else {
                                format!("{ttl_ms} ms")
                            }
                        )),
                        _ => None,
                    })
                    .chain(
                        history
                            .audit
                            .iter()
                            .filter(|r| r.idempotency_key == request.idempotency_key)
                            .map(AuditRow::describe),
                    )
                    .collect(),
            })
        })
        .collect()
}

/// Deliveries a drain left pending: a delivery is acknowledged once its job is done (the queue
/// would hand it out again forever), and a job whose delivery is still pending is not done.
fn no_stuck_delivery(history: &History) -> Vec<Violation> {
    history
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Harness(Observation::Pending {
                key,
                deliveries,
                held,
            }) => {
                let status = history
                    .jobs
                    .iter()
                    .find(|j| j.idempotency_key == *key)
                    .map_or("missing", |j| j.status.as_str());
                // A count read from the broker's record (racecert did not see the deliveries
                // itself) is left out rather than printed as 0.
                let delivered = match deliveries {
                    0 => String::new(),
                    n => format!(", delivered {n} time(s)"),
                };
                let place = held
                    .as_ref()
                    .map_or(String::new(), |held| format!("; the broker holds it in {held}"));
                Some(Violation {
                    invariant: Invariant::NoStuckDelivery,
                    observed: format!(
                        "the delivery of {} ({key}) is still unacknowledged after the drain{delivered}; its job is {status}{place}",
                        history.request_of(key).unwrap_or(key)
                    ),
                    evidence: vec![format!("step {} {:?}", event.step, event.kind)],
                })
            }
            _ => None,
        })
        .collect()
}

/// Replays lease ownership from the events. A backend call is waste beyond policy when its attempt
/// never held the lease while another attempt held a valid one: execution without dedupe. An
/// attempt that held the lease and lost it to expiry may still finish its call (the policy allows
/// that duplicate: the fence stops its write). On real clocks ([`History::lease_ttl_ms`]) a lease
/// also runs out by itself.
fn compute_waste_bounded(history: &History) -> Vec<Violation> {
    // key -> (holder, acquired at ms)
    let mut holders: HashMap<String, (String, u64)> = HashMap::new();
    // (worker, key) of attempts that acquired the lease.
    let mut leased: BTreeSet<(String, String)> = BTreeSet::new();
    let mut violations = Vec::new();
    for event in &history.events {
        if let Some(ttl) = history.lease_ttl_ms {
            holders.retain(|_, (_, acquired)| event.at_ms < *acquired + ttl);
        }
        match &event.kind {
            EventKind::Fault(Effect::LeaseExpired { key, .. }) => {
                holders.remove(key);
            }
            EventKind::Fault(Effect::RedisRestarted) => holders.clear(),
            EventKind::Worker(line) => {
                let (Some(key), Some(worker)) =
                    (line.get("idempotency_key"), line.get("worker_id"))
                else {
                    continue;
                };
                let attempt = (worker.to_owned(), key.to_owned());
                match line.status_word() {
                    Some(Status::JobReceived | Status::RetryDispatched) => {
                        leased.remove(&attempt);
                    }
                    Some(Status::LeaseAcquired) => {
                        holders.insert(key.to_owned(), (worker.to_owned(), event.at_ms));
                        leased.insert(attempt);
                    }
                    Some(Status::LeaseReleased)
                        if holders.get(key).is_some_and(|(h, _)| h == worker) =>
                    {
                        holders.remove(key);
                    }
                    Some(Status::InferenceStarted) if !leased.contains(&attempt) => {
                        if let Some((holder, _)) = holders.get(key).filter(|(h, _)| h != worker) {
                            violations.push(Violation {
                                invariant: Invariant::ComputeWasteBounded,
                                observed: format!(
                                    "{worker} called the backend for {key} without the lease, while {holder} held it"
                                ),
                                evidence: vec![event_line(event)],
                            });
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    violations
}

fn event_line(event: &racecert_history::Event) -> String {
    match &event.kind {
        EventKind::Worker(line) => format!("step {} {}", event.step, line.to_logfmt()),
        EventKind::Fault(effect) => format!("step {} fault {effect}", event.step),
        other => format!("step {} {other:?}", event.step),
    }
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// What happened.
    pub history: History,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Which faults landed.
    pub coverage: coverage::Coverage,
}

impl CaseResult {
    /// Judges a history: the invariants, and which faults reached their target paths.
    pub fn judge(history: History, invariants: &[Invariant]) -> CaseResult {
        CaseResult {
            violations: check(&history, invariants),
            coverage: coverage::coverage(&history),
            history,
        }
    }
}

/// Backend calls per request, from the journals (compute spent, for reports).
pub fn backend_calls_per_request(history: &History) -> BTreeMap<String, usize> {
    let mut calls = BTreeMap::new();
    for entry in &history.journal {
        if let Some(request) = &entry.request {
            let id = history
                .request_of(&request.idempotency_key)
                .unwrap_or(&request.idempotency_key)
                .to_owned();
            *calls.entry(id).or_insert(0) += 1;
        }
    }
    calls
}

/// The invariants broken in a list of violations, deduplicated.
pub fn broken(violations: &[Violation]) -> BTreeSet<Invariant> {
    violations.iter().map(|v| v.invariant).collect()
}

#[cfg(test)]
mod tests;
