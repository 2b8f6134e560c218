//! The seed's root causes, named: switches a worker under test may honour to re-create one on
//! purpose, so the harness has real bugs to find. racecert's reference worker honours every one
//! (`src/reference`); a worker process receives them in `RACECERT_DEFECTS`. Each defect is named
//! as the CLI spells it.

use crate::{Error, Result};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// One root cause of the seed, re-created faithfully.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Defect {
    /// Cache key `sha256(normalized_input)` without the model version: after a cutover, answers
    /// of the previous version are served (root cause 1).
    UnversionedCacheKey,
    /// A redelivered job is processed even while another attempt holds the lease: two live
    /// attempts both run and both write (root cause 3).
    RetryWithoutDedupe,
    /// Every retry gets a new random idempotency key: the retry is a new job, so nothing
    /// deduplicates it and the request gets two final results (root cause 2).
    RandomIdPerRetry,
    /// The final write is a plain UPDATE: no lease-token, status or generation check, so a late
    /// attempt overwrites the newer result (the seed's canonical race).
    UnfencedFinalWrite,
    /// Cutover deletes the old cache entries asynchronously and late, from unversioned keys,
    /// instead of switching a pointer between version namespaces (root cause 4).
    LateCacheInvalidation,
    /// The worker re-reads the active-version pointer at every step instead of binding to its
    /// version for its lifetime: one job mixes versions (cache of one, backend of another).
    RereadActiveVersion,
    /// The delivery is acknowledged right after the job is taken, before the final write: a crash
    /// in between loses the job.
    AckBeforeFinalWrite,
    /// The lease is released with a plain `DEL`, not a compare-and-delete: an attempt whose lease
    /// ran out deletes the lease of the attempt that took over (its log still says
    /// `lease_released`).
    ReleaseWithoutTokenCheck,
    /// The lease is taken with `SET key token PX ttl`, without `NX`: it always "succeeds",
    /// overwriting a live lease of another attempt (its log still says `lease_acquired`).
    LeaseWithoutNx,
    /// The result is cached under the version that is active when it is written, not the version
    /// that produced it: after a cutover an old worker fills the new version's namespace with old
    /// outputs.
    CacheWriteActiveNamespace,
    /// The final write checks the lease (a `GET` of it) and then updates the row by its key and
    /// status alone: it never sets or compares the token columns, so after its lease expired and
    /// another attempt took the job, the late write lands on the new holder's row (only the
    /// writer's connection shows whose write it was).
    LateWriteWithoutToken,
    /// The lease TTL is given in the wrong unit (`EX` with a number of milliseconds): a lease
    /// of a minute lasts 16 hours, and a crashed worker's job waits that long.
    LeaseTtlInSeconds,
    /// A delivery of a job already completed is not acknowledged (one path forgets the `XACK`):
    /// it is redelivered forever.
    NoAckWhenCompleted,
    /// The final write is two statements: a `SELECT` of status and token ("still ours?"), then
    /// an `UPDATE` keyed by the job alone. Both sit between the same two checkpoints; between the
    /// statements, another attempt can take the job over and finish it, and the `UPDATE` then
    /// writes over its result.
    ReadThenWrite,
}

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 14] = [
        Defect::UnversionedCacheKey,
        Defect::RetryWithoutDedupe,
        Defect::RandomIdPerRetry,
        Defect::UnfencedFinalWrite,
        Defect::LateCacheInvalidation,
        Defect::RereadActiveVersion,
        Defect::AckBeforeFinalWrite,
        Defect::ReleaseWithoutTokenCheck,
        Defect::LeaseWithoutNx,
        Defect::CacheWriteActiveNamespace,
        Defect::LateWriteWithoutToken,
        Defect::LeaseTtlInSeconds,
        Defect::NoAckWhenCompleted,
        Defect::ReadThenWrite,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Defect::UnversionedCacheKey => "unversioned-cache-key",
            Defect::RetryWithoutDedupe => "retry-without-dedupe",
            Defect::RandomIdPerRetry => "random-id-per-retry",
            Defect::UnfencedFinalWrite => "unfenced-final-write",
            Defect::LateCacheInvalidation => "late-cache-invalidation",
            Defect::RereadActiveVersion => "reread-active-version",
            Defect::AckBeforeFinalWrite => "ack-before-final-write",
            Defect::ReleaseWithoutTokenCheck => "release-without-token-check",
            Defect::LeaseWithoutNx => "lease-without-nx",
            Defect::CacheWriteActiveNamespace => "cache-write-active-namespace",
            Defect::LateWriteWithoutToken => "late-write-without-token",
            Defect::LeaseTtlInSeconds => "lease-ttl-in-seconds",
            Defect::NoAckWhenCompleted => "no-ack-when-completed",
            Defect::ReadThenWrite => "read-then-write",
        }
    }
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Defect {
    type Err = Error;

    fn from_str(s: &str) -> Result<Defect> {
        Defect::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                Error::Config(format!(
                    "unknown defect {s:?}; known defects: {}",
                    Defect::ALL.map(Defect::name).join(", ")
                ))
            })
    }
}

/// A set of enabled defects (empty: the correct reference pipeline).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defects(BTreeSet<Defect>);

impl Defects {
    /// No defect: the correct pipeline.
    pub fn none() -> Defects {
        Defects::default()
    }

    /// Exactly these defects.
    pub fn of(defects: impl IntoIterator<Item = Defect>) -> Defects {
        Defects(defects.into_iter().collect())
    }

    /// Whether a defect is on.
    pub fn has(&self, defect: Defect) -> bool {
        self.0.contains(&defect)
    }

    /// Whether the cache key leaves out the version (either cache defect implies it).
    pub fn unversioned_cache(&self) -> bool {
        self.has(Defect::UnversionedCacheKey) || self.has(Defect::LateCacheInvalidation)
    }

    /// The enabled defects.
    pub fn iter(&self) -> impl Iterator<Item = Defect> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for defect in Defect::ALL {
            assert_eq!(defect.name().parse::<Defect>().unwrap(), defect);
        }
        let err = "no-such".parse::<Defect>().unwrap_err().to_string();
        assert!(err.contains("unfenced-final-write"), "{err}");
    }
}
