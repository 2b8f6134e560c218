//! Certification suites: which workers run, which faults a schedule may contain, and how long
//! (a time budget, or a fixed number of cases).
//! [`builtin`] lists the suites racecert ships, one per fault of the seed plus a full v1 -> v2
//! rollout; every one of them must pass on the reference worker and report its fault coverage.

pub mod certify;
pub mod file;

use crate::check::Invariant;
use crate::check::coverage::Scope;
use crate::contract::defect::Defect;
use crate::contract::defect::Defects;
use crate::fault::FaultKind;
use crate::runner::controlled::CaseSettings;
use crate::schedule::ScheduleSpace;
use std::collections::BTreeSet;

/// A suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Name, e.g. `retry-overlap`.
    pub name: String,
    /// What it certifies.
    pub description: String,
    /// Workers, defects, invariants, timeouts.
    pub settings: CaseSettings,
    /// The schedules it generates.
    pub space: ScheduleSpace,
    /// A fixed number of cases per run (exact reproduction); None: the run spends a time budget.
    pub cases: Option<u32>,
    /// What a PASS needs: the kinds that must land on their target, and how often.
    pub scope: Scope,
}

impl Suite {
    /// Whether cases restart shared containers (and so need the test bed to themselves).
    pub fn is_exclusive(&self) -> bool {
        self.space.faults.contains(&FaultKind::RedisRestart)
    }

    /// The same suite with `defects` switched on in its workers.
    pub fn with_defects(mut self, defects: Defects) -> Suite {
        self.settings.defects = defects;
        self
    }
}

/// The suite files shipped in `suites/`, embedded so an installed binary has them too.
pub const SHIPPED: [(&str, &str); 8] = [
    (
        "suites/upstream-timeout.toml",
        include_str!("../../suites/upstream-timeout.toml"),
    ),
    (
        "suites/retry-overlap.toml",
        include_str!("../../suites/retry-overlap.toml"),
    ),
    (
        "suites/lease-expiry.toml",
        include_str!("../../suites/lease-expiry.toml"),
    ),
    (
        "suites/worker-crash.toml",
        include_str!("../../suites/worker-crash.toml"),
    ),
    (
        "suites/redis-restart.toml",
        include_str!("../../suites/redis-restart.toml"),
    ),
    (
        "suites/partition.toml",
        include_str!("../../suites/partition.toml"),
    ),
    (
        "suites/stale-cache-at-cutover.toml",
        include_str!("../../suites/stale-cache-at-cutover.toml"),
    ),
    (
        "suites/full-rollout.toml",
        include_str!("../../suites/full-rollout.toml"),
    ),
];

/// Where a defect of the reference worker is caught, and what it is known to break: the shipped
/// suite whose faults reach it, and the invariants a counterexample must violate (a check that
/// a defect is caught asserts these, not just "some violation"). For re-reading the active
/// version, which mixes versions within a job, the minimal counterexample breaks one of three
/// invariants depending on where the cutover lands ([`Catching::one_of`]): a result that does
/// not name its version, an output cached under another version's key, or, when the cutover
/// comes before its cache read, a v1 worker served a v2 output from the v2 namespace.
pub fn catching(defect: Defect) -> Catching {
    let (suite, all_of, one_of): (&'static str, &'static [Invariant], &'static [Invariant]) =
        match defect {
            Defect::RereadActiveVersion => (
                "stale-cache-at-cutover",
                &[],
                &[
                    Invariant::ResultNamesItsVersion,
                    Invariant::NoCrossVersionCacheEntry,
                    Invariant::NoStaleCacheRead,
                ],
            ),
            // The attempt that never took the lease either calls the backend while the holder
            // still works, or wins the take (the newest epoch) and writes as a non-owner.
            Defect::RetryWithoutDedupe => (
                "retry-overlap",
                &[],
                &[
                    Invariant::ComputeWasteBounded,
                    Invariant::NoNonOwnerFinalWrite,
                ],
            ),
            // The write lands on the row of whoever took the job between the check and the
            // write: over its result (two final writes), or under its generation, or merely
            // after its takeover, depending on where the takeover stopped.
            Defect::ReadThenWrite => (
                "lease-expiry",
                &[],
                &[
                    Invariant::AtMostOneFinalWrite,
                    Invariant::GenerationsIncrease,
                    Invariant::NoNonOwnerFinalWrite,
                ],
            ),
            other => {
                let (suite, all_of) = catching_all(other);
                (suite, all_of, &[])
            }
        };
    Catching {
        suite,
        all_of,
        one_of,
    }
}

/// Where a defect is caught and what its counterexample must break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Catching {
    /// The shipped suite that catches it.
    pub suite: &'static str,
    /// Invariants every counterexample breaks.
    pub all_of: &'static [Invariant],
    /// Invariants of which every counterexample breaks at least one (empty: no such set).
    pub one_of: &'static [Invariant],
}

impl Catching {
    /// What a counterexample that broke `broken` lacks to be caught for the right reason (empty:
    /// nothing).
    pub fn missing(&self, broken: &BTreeSet<Invariant>) -> Vec<Invariant> {
        let mut missing: Vec<Invariant> = self
            .all_of
            .iter()
            .filter(|i| !broken.contains(i))
            .copied()
            .collect();
        if !self.one_of.is_empty() && !self.one_of.iter().any(|i| broken.contains(i)) {
            missing.extend(self.one_of.iter().copied());
        }
        missing
    }
}

fn catching_all(defect: Defect) -> (&'static str, &'static [Invariant]) {
    match defect {
        Defect::UnversionedCacheKey | Defect::LateCacheInvalidation => {
            ("stale-cache-at-cutover", &[Invariant::NoStaleCacheRead])
        }
        Defect::RereadActiveVersion => ("stale-cache-at-cutover", &[]),
        Defect::CacheWriteActiveNamespace => (
            "stale-cache-at-cutover",
            &[Invariant::NoCrossVersionCacheEntry],
        ),
        Defect::AckBeforeFinalWrite => ("worker-crash", &[Invariant::NoLostJob]),
        Defect::RetryWithoutDedupe => ("retry-overlap", &[]),
        Defect::LeaseWithoutNx => ("retry-overlap", &[Invariant::LeaseDiscipline]),
        Defect::RandomIdPerRetry => ("lease-expiry", &[Invariant::AtMostOneFinalWrite]),
        Defect::UnfencedFinalWrite => (
            "lease-expiry",
            &[
                Invariant::AtMostOneFinalWrite,
                Invariant::GenerationsIncrease,
            ],
        ),
        Defect::ReleaseWithoutTokenCheck => ("lease-expiry", &[Invariant::LeaseDiscipline]),
        Defect::LateWriteWithoutToken => ("lease-expiry", &[Invariant::NoNonOwnerFinalWrite]),
        Defect::LeaseTtlInSeconds => ("worker-crash", &[Invariant::NoLostJob]),
        Defect::NoAckWhenCompleted => ("worker-crash", &[Invariant::NoStuckDelivery]),
        Defect::ReadThenWrite => ("lease-expiry", &[]),
    }
}

/// The suites racecert ships (parsed from [`SHIPPED`]).
pub fn shipped() -> Vec<file::LoadedSuite> {
    SHIPPED
        .iter()
        .map(|(path, text)| file::parse(text, path).expect("shipped suites are valid"))
        .collect()
}

/// The shipped suites, as suites.
pub fn builtin() -> Vec<Suite> {
    shipped().into_iter().map(|loaded| loaded.suite).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_suites_is_shipped_and_valid() {
        let mut on_disk: Vec<String> = std::fs::read_dir("suites")
            .expect("suites/ next to Cargo.toml")
            .filter_map(|e| e.ok())
            .map(|e| format!("suites/{}", e.file_name().to_string_lossy()))
            .filter(|name| name.ends_with(".toml"))
            .collect();
        on_disk.sort();
        let mut shipped: Vec<String> = SHIPPED.iter().map(|(path, _)| (*path).to_owned()).collect();
        shipped.sort();
        assert_eq!(on_disk, shipped, "suites/ and SHIPPED disagree");
        let suites = super::shipped();
        assert_eq!(suites.len(), SHIPPED.len());
        assert!(suites.iter().all(|s| s.expect_pass));
    }
}
