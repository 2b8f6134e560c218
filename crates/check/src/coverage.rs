//! Fault coverage, judged from the history alone: for every fault applied, whether it reached the
//! path it targets (a lease that ran out while its holder was still working, a redelivery while
//! another attempt ran, a crash of a worker holding a job, ...). Every runner gets the same
//! judgement because it reads the one recorded history, not the runner's own bookkeeping.
//!
//! Beside the counts, a run's [`Reach`]: which (fault, target path) pairs it reached and which
//! interleavings of checkpoints it saw per worker pair. Coverage-guided exploration keeps the
//! schedules that reached something new and mutates them, as coverage-guided fuzzers do.

use racecert_core::contract::log::{LogLine, Status};
use racecert_core::fault::{Effect, FaultKind, PartitionTarget};
use racecert_history::{EventKind, History, Observation};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Fault kinds applied in a run, and how often each reached its target path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// kind -> (times applied, times it landed on its target path).
    pub faults: BTreeMap<FaultKind, (u32, u32)>,
    /// What the runs reached (the union over merged runs).
    pub reached: BTreeSet<Reach>,
    /// Kinds that cannot apply where they were sent, and why (never counted as applied).
    pub not_applicable: BTreeMap<FaultKind, String>,
}

/// Something a run reached, as the signal of coverage-guided exploration. Checkpoints are the
/// workers' status words (the points of the flow their lines mark), so one feature set serves
/// every runner and every worker that logs the contract's lines.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reach {
    /// A fault of this kind was applied.
    Applied(FaultKind),
    /// A fault of this kind landed on its target path.
    Landed(FaultKind),
    /// The run reached where a fault of this kind would land, had it come next: a read in a
    /// cutover's lag window of an entry another version wrote, with the invalidation not yet
    /// run (cache-invalidation-lag). A mutant that adds the fault is one step from landing it.
    Near(FaultKind),
    /// Worker `first` passed checkpoint `at`, and the next checkpoint any other worker passed
    /// was `then`, by worker `second`: one interleaving of the pair.
    Interleaving {
        /// The worker that moved first.
        first: String,
        /// Its checkpoint.
        at: Status,
        /// The other worker.
        second: String,
        /// The other worker's next checkpoint.
        then: Status,
    },
    /// The first checkpoint a worker passed after a fault's effect.
    AfterFault {
        /// The effect's name.
        effect: &'static str,
        /// The worker.
        worker: String,
        /// Its checkpoint.
        at: Status,
    },
}

impl Reach {
    /// The (fault, target path) pair, if this is one.
    pub fn landed(&self) -> Option<FaultKind> {
        match self {
            Reach::Landed(kind) => Some(*kind),
            _ => None,
        }
    }

    /// Whether this is an interleaving of checkpoints of a worker pair.
    pub fn is_interleaving(&self) -> bool {
        matches!(self, Reach::Interleaving { .. })
    }
}

impl Coverage {
    /// Records one application of a fault kind and whether it landed on its target path.
    pub fn applied_kind(&mut self, kind: FaultKind, landed: bool) {
        let entry = self.faults.entry(kind).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += u32::from(landed);
    }

    /// Adds another run's coverage.
    pub fn merge(&mut self, other: &Coverage) {
        for (kind, (applied, landed)) in &other.faults {
            let entry = self.faults.entry(*kind).or_insert((0, 0));
            entry.0 += applied;
            entry.1 += landed;
        }
        self.reached.extend(other.reached.iter().cloned());
        for (kind, why) in &other.not_applicable {
            self.not_applicable
                .entry(*kind)
                .or_insert_with(|| why.clone());
        }
    }

    /// How many of `other`'s reached features this coverage lacks.
    pub fn new_in(&self, other: &Coverage) -> usize {
        other
            .reached
            .iter()
            .filter(|r| !self.reached.contains(r))
            .count()
    }

    /// Times `kind` landed.
    pub fn landed(&self, kind: FaultKind) -> u32 {
        self.faults.get(&kind).map_or(0, |(_, landed)| *landed)
    }
}

/// What a run must exercise to earn a PASS: every fault kind in scope lands on its target at
/// least `min_landed` times; a kind declared out of scope (with its reason) is reported, never
/// required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The kinds the run applies.
    pub kinds: Vec<FaultKind>,
    /// Landings each kind in scope needs.
    pub min_landed: u32,
    /// Kinds the run applies but does not require, each with why.
    pub out_of_scope: BTreeMap<FaultKind, String>,
}

impl Scope {
    /// Every kind of `kinds` in scope, once each.
    pub fn of(kinds: &[FaultKind]) -> Scope {
        let mut distinct: Vec<FaultKind> = Vec::new();
        for kind in kinds {
            if !distinct.contains(kind) {
                distinct.push(*kind);
            }
        }
        Scope {
            kinds: distinct,
            min_landed: 1,
            out_of_scope: BTreeMap::new(),
        }
    }

    /// The kinds in scope, in order.
    pub fn required(&self) -> impl Iterator<Item = FaultKind> + '_ {
        self.kinds
            .iter()
            .copied()
            .filter(|kind| !self.out_of_scope.contains_key(kind))
    }

    /// The kinds in scope that did not land often enough, each with why: never applied, applied
    /// but never on its target, or unable to apply here.
    pub fn unlanded(&self, coverage: &Coverage) -> Vec<(FaultKind, String)> {
        self.required()
            .filter_map(|kind| {
                let (applied, landed) = coverage.faults.get(&kind).copied().unwrap_or((0, 0));
                if landed >= self.min_landed {
                    return None;
                }
                let why = if let Some(why) = coverage.not_applicable.get(&kind) {
                    format!("cannot apply here: {why}")
                } else if applied == 0 {
                    "never applied".to_owned()
                } else if landed == 0 {
                    format!(
                        "applied {applied} times, never on its target{}",
                        kind.miss_hint()
                            .map(|h| format!(" ({h})"))
                            .unwrap_or_default()
                    )
                } else {
                    format!(
                        "landed {landed} of {applied} times, {} needed",
                        self.min_landed
                    )
                };
                Some((kind, why))
            })
            .collect()
    }
}

/// One attempt as the worker's lines tell it.
#[derive(Debug, Default)]
struct Attempt {
    key: String,
    leased: bool,
    /// When its lease was taken (history ms), as its line says.
    leased_at: Option<u64>,
    taken: bool,
    /// Its final write was attempted (accepted or not).
    wrote: bool,
}

impl Attempt {
    /// Holding the job: leased (or taken) and not yet at its final write.
    fn mid_job(&self) -> bool {
        (self.leased || self.taken) && !self.wrote
    }
}

/// Lasting faults whose landing is judged by what follows them.
#[derive(Debug, Default)]
struct Open {
    /// Versions with a slow backend, and whether a call timed out since.
    slow: HashMap<String, bool>,
    /// Versions with a failing backend, and whether a call failed since.
    failing: HashMap<String, bool>,
    /// Cut links, and whether an operation failed since.
    cut: HashMap<PartitionTarget, bool>,
}

/// The coverage of one run.
pub fn coverage(history: &History) -> Coverage {
    let mut scan = Scan::new(history);
    let keys = history.layout.matcher();
    let mut leases = super::landing::Leases::default();
    for event in &history.events {
        leases.observe(history, event, &keys);
        match &event.kind {
            EventKind::Harness(Observation::Draining) => scan.drain(),
            EventKind::Harness(Observation::AttemptError { worker, .. }) => {
                scan.attempts.remove(worker);
                mark_cut(&mut scan.open);
            }
            EventKind::Worker(line) => scan.worker_line(event.at_ms, line),
            EventKind::Fault(effect) => scan.fault(event.at_ms, effect, &leases),
            EventKind::Harness(_) | EventKind::Step(_) | EventKind::Wire(_) => {}
        }
    }
    scan.finish()
}

/// What the walk over one run's history carries from event to event.
struct Scan<'h> {
    history: &'h History,
    coverage: Coverage,
    /// Request id and idempotency key -> the request's input.
    input_of: HashMap<&'h str, &'h str>,
    attempts: HashMap<String, Attempt>,
    open: Open,
    // Inputs whose cache entry some version wrote: (input, version).
    cached: HashSet<(String, String)>,
    // Since the last cutover (its target version): whether a read of an entry left by another
    // version happened in the lag window.
    lag_window: Option<(String, bool)>,
    draining: bool,
}

impl<'h> Scan<'h> {
    /// The state before the first event.
    fn new(history: &'h History) -> Scan<'h> {
        let input_of: HashMap<&str, &str> = history
            .requests
            .iter()
            .flat_map(|r| {
                [
                    (r.request_id.as_str(), r.input.as_str()),
                    (r.idempotency_key.as_str(), r.input.as_str()),
                ]
            })
            .collect();
        Scan {
            history,
            coverage: Coverage::default(),
            input_of,
            attempts: HashMap::new(),
            open: Open::default(),
            cached: HashSet::new(),
            lag_window: None,
            draining: false,
        }
    }

    /// The drain began: the lasting faults close, and a lag-window read counts as near.
    fn drain(&mut self) {
        self.draining = true;
        close_open(&mut self.coverage, &mut self.open);
        if self.lag_window.as_ref().is_some_and(|(_, read)| *read) {
            self.coverage
                .reached
                .insert(Reach::Near(FaultKind::CacheInvalidationLag));
        }
    }

    /// The input of the request a line is about, by its request id or else its key.
    fn input_of_line(&self, line: &LogLine, key: &str) -> Option<&'h str> {
        self.input_of
            .get(line.get("request_id").unwrap_or("-"))
            .or_else(|| self.input_of.get(key))
            .copied()
    }

    /// A worker's line: moves its attempt along by the checkpoint it marks.
    fn worker_line(&mut self, at_ms: u64, line: &LogLine) {
        let Some(status) = line.status_word() else {
            return;
        };
        let worker = line.get("worker_id").unwrap_or("-").to_owned();
        let key = line.get("idempotency_key").unwrap_or("-").to_owned();
        let version = line.get("model_version").unwrap_or("-").to_owned();
        if status.is_receive() {
            self.received(status, worker, key);
            return;
        }
        match status {
            Status::LeaseAcquired => {
                let attempt = self.attempts.entry(worker).or_default();
                attempt.leased = true;
                attempt.leased_at = Some(at_ms);
            }
            Status::JobTaken => {
                self.attempts.entry(worker).or_default().taken = true;
            }
            Status::InferenceSucceeded | Status::LateSuccess | Status::LateWriteRejected => {
                self.attempts.entry(worker).or_default().wrote = true;
            }
            Status::CacheWritten => {
                if let Some(input) = self.input_of_line(line, &key) {
                    self.cached.insert((input.to_owned(), version));
                }
            }
            Status::CacheHit | Status::CacheMiss if !self.draining => {
                let input = self.input_of_line(line, &key);
                if let Some((to, read)) = self.lag_window.as_mut()
                    && version == *to
                    && let Some(input) = input
                    && self.cached.iter().any(|(i, v)| i == input && v != to)
                {
                    *read = true;
                }
            }
            Status::TimeoutWaitingUpstream | Status::UpstreamFailed => {
                if let Some(timed_out) = self.open.slow.get_mut(&version) {
                    *timed_out = true;
                }
                if status == Status::UpstreamFailed
                    && let Some(failed) = self.open.failing.get_mut(&version)
                {
                    *failed = true;
                }
                if status == Status::UpstreamFailed {
                    self.attempts.remove(&worker);
                }
            }
            Status::AttemptError => {
                self.attempts.remove(&worker);
                mark_cut(&mut self.open);
            }
            Status::DuplicateSkipped
            | Status::AlreadyCompleted
            | Status::VersionDeclined
            | Status::LeaseReleased
            | Status::LeaseLost => {
                self.attempts.remove(&worker);
            }
            _ => {}
        }
    }

    /// A delivery received: a new attempt, and a redelivery counts as a retry overlap.
    fn received(&mut self, status: Status, worker: String, key: String) {
        let overlap = self
            .attempts
            .iter()
            .any(|(other, a)| *other != worker && a.key == key);
        if status == Status::RetryDispatched && !self.draining {
            self.coverage.applied_kind(FaultKind::RetryOverlap, overlap);
        }
        self.attempts.insert(
            worker,
            Attempt {
                key,
                ..Attempt::default()
            },
        );
    }

    /// A fault's effect: counts it, landed or not, or opens a lasting one.
    fn fault(&mut self, at_ms: u64, effect: &Effect, leases: &super::landing::Leases) {
        let counted = !self.draining;
        let coverage = &mut self.coverage;
        let open = &mut self.open;
        match effect {
            Effect::LeaseExpired { key, held } => {
                let landed = *held && self.attempts.values().any(|a| a.key == *key && a.mid_job());
                if counted {
                    coverage.applied_kind(FaultKind::LeaseExpiry, landed);
                }
            }
            Effect::WorkerPaused { worker, ms } => {
                let landed = pause_landed(self.history, &self.attempts, leases, worker, *ms, at_ms);
                if counted {
                    coverage.applied_kind(FaultKind::LeaseExpiry, landed);
                }
            }
            Effect::WorkerCrashed { worker, .. } => {
                // On a holder: it had received a delivery and its attempt had not
                // ended (no release, skip or error), leased or not: a worker that acks on
                // receipt loses its job when killed before the lease.
                let landed = self.attempts.remove(worker).is_some();
                if counted {
                    coverage.applied_kind(FaultKind::WorkerCrash, landed);
                }
            }
            Effect::RedisRestarted => {
                let landed = self.attempts.values().any(|a| a.leased && !a.wrote);
                if counted {
                    coverage.applied_kind(FaultKind::RedisRestart, landed);
                }
            }
            Effect::CutOver { to, .. } => {
                let landed = self.attempts.values().any(|a| a.taken && !a.wrote);
                if counted {
                    coverage.applied_kind(FaultKind::Cutover, landed);
                }
                self.lag_window = Some((to.clone(), false));
            }
            Effect::CacheInvalidated { .. } => {
                let landed = self.lag_window.take().is_some_and(|(_, read)| read);
                if counted {
                    coverage.applied_kind(FaultKind::CacheInvalidationLag, landed);
                }
            }
            Effect::Partitioned { target } => {
                if counted {
                    open.cut.insert(*target, false);
                }
            }
            Effect::Healed { target } => {
                if let Some(landed) = open.cut.remove(target) {
                    coverage.applied_kind(FaultKind::Partition, landed);
                }
            }
            Effect::UpstreamSlow { version, .. } => {
                if counted {
                    close_slow(coverage, open, version);
                    open.slow.insert(version.clone(), false);
                }
            }
            Effect::BackendFailing { version, .. } => {
                if counted {
                    close_failing(coverage, open, version);
                    open.failing.insert(version.clone(), false);
                }
            }
            Effect::BackendRecovered { version } => {
                close_slow(coverage, open, version);
                close_failing(coverage, open, version);
            }
            Effect::Missed { kind, .. } => {
                if counted {
                    coverage.applied_kind(*kind, false);
                }
            }
            // Recorded when it began; what followed says whether it landed.
            Effect::FrameworkFault { kind, worker, .. } => {
                let landed = super::landing::framework(self.history, *kind, worker, at_ms as i64);
                if counted {
                    coverage.applied_kind(*kind, landed);
                }
            }
            Effect::NotApplicable { kind, why } => {
                coverage
                    .not_applicable
                    .entry(*kind)
                    .or_insert_with(|| why.clone());
            }
        }
    }

    /// The end of the history: the lasting faults still open close, and what was reached.
    fn finish(mut self) -> Coverage {
        let mut coverage = self.coverage;
        close_open(&mut coverage, &mut self.open);
        for (kind, (applied, landed)) in &coverage.faults {
            if *applied > 0 {
                coverage.reached.insert(Reach::Applied(*kind));
            }
            if *landed > 0 {
                coverage.reached.insert(Reach::Landed(*kind));
            }
        }
        coverage.reached.extend(orderings(self.history));
        coverage
    }
}

/// Whether a worker's pause, recorded at `at_ms` when it resumed after `ms`, landed.
fn pause_landed(
    history: &History,
    attempts: &HashMap<String, Attempt>,
    leases: &super::landing::Leases,
    worker: &str,
    ms: u64,
    at_ms: u64,
) -> bool {
    // Recorded when it resumed: it was stopped from `from` to now. It landed
    // only if its job was in hand and its lease really ran out meanwhile
    // (the wire's leases; without them, the line's lease and the TTL).
    let (from, to) = (at_ms.saturating_sub(ms) as i64, at_ms as i64);
    let attempt = attempts.get(worker).filter(|a| a.mid_job());
    let lost = if leases.any() {
        leases.lost_during(worker, from, to)
    } else {
        attempt
            .and_then(|a| a.leased_at)
            .zip(history.lease_ttl_ms)
            .is_some_and(|(at, ttl)| {
                let expires = (at + ttl) as i64;
                expires > from && expires <= to
            })
    };
    attempt.is_some() && lost
}

/// The interleavings of checkpoints per worker pair, and the checkpoints right after each fault,
/// up to the drain (what the schedule made happen, not the clean-up).
fn orderings(history: &History) -> BTreeSet<Reach> {
    let mut reached = BTreeSet::new();
    // The last checkpoint passed, by whom; and faults not yet followed by each worker.
    let mut last: Option<(String, Status)> = None;
    let mut pending: Vec<(&'static str, HashSet<String>)> = Vec::new();
    for event in &history.events {
        match &event.kind {
            EventKind::Harness(Observation::Draining) => break,
            EventKind::Fault(effect) => pending.push((effect.name(), HashSet::new())),
            EventKind::Worker(line) => {
                let Some(at) = line.status_word() else {
                    continue;
                };
                let worker = line.get("worker_id").unwrap_or("-").to_owned();
                for (effect, seen) in &mut pending {
                    if seen.insert(worker.clone()) {
                        reached.insert(Reach::AfterFault {
                            effect,
                            worker: worker.clone(),
                            at,
                        });
                    }
                }
                if let Some((first, before)) = &last
                    && *first != worker
                {
                    reached.insert(Reach::Interleaving {
                        first: first.clone(),
                        at: *before,
                        second: worker.clone(),
                        then: at,
                    });
                }
                last = Some((worker, at));
            }
            _ => {}
        }
    }
    reached
}

/// An operation failed: every cut link reached its target path.
fn mark_cut(open: &mut Open) {
    for landed in open.cut.values_mut() {
        *landed = true;
    }
}

fn close_slow(coverage: &mut Coverage, open: &mut Open, version: &str) {
    if let Some(landed) = open.slow.remove(version) {
        coverage.applied_kind(FaultKind::UpstreamTimeout, landed);
    }
}

fn close_failing(coverage: &mut Coverage, open: &mut Open, version: &str) {
    if let Some(landed) = open.failing.remove(version) {
        coverage.applied_kind(FaultKind::BackendFailure, landed);
    }
}

/// Counts the lasting faults still open (the drain heals them).
fn close_open(coverage: &mut Coverage, open: &mut Open) {
    for (_, landed) in open.slow.drain() {
        coverage.applied_kind(FaultKind::UpstreamTimeout, landed);
    }
    for (_, landed) in open.failing.drain() {
        coverage.applied_kind(FaultKind::BackendFailure, landed);
    }
    for (_, landed) in open.cut.drain() {
        coverage.applied_kind(FaultKind::Partition, landed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_that_never_landed_says_why_and_what_to_check() {
        let scope = Scope::of(&[
            FaultKind::UpstreamTimeout,
            FaultKind::KillMain,
            FaultKind::Partition,
        ]);
        let mut coverage = Coverage::default();
        coverage.applied_kind(FaultKind::UpstreamTimeout, false);
        coverage.applied_kind(FaultKind::UpstreamTimeout, false);
        coverage.applied_kind(FaultKind::KillMain, true);
        let why: BTreeMap<FaultKind, String> = scope.unlanded(&coverage).into_iter().collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(
            why[&FaultKind::UpstreamTimeout].starts_with("applied 2 times, never on its target")
                && why[&FaultKind::UpstreamTimeout].contains("[timeouts] model_ms"),
            "{why:?}"
        );
        assert_eq!(why[&FaultKind::Partition], "never applied");
    }
}
