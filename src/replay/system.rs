//! Replaying an incident against the team's own system (`racecert replay LOG --system FILE`): the
//! log's diagnoses ([`super::diagnose`], each with its line numbers) are mapped to the faults the
//! system's framework really has that re-create them ([`faults_for`]: a redelivery after the
//! visibility timeout to `visibility-outlived` / `forced-restore`, a crash to `kill-pool-child` /
//! `kill-main`, a retry while the first attempt runs to `upstream-timeout` / `api-resubmission`,
//! ...), those faults run as cases against the team's worker
//! ([`crate::runner::system::run_system`], one case per fault), and every diagnosis is reported
//! as reproduced on the team's worker (with the case and its replay command), prevented by it, or
//! not reproducible with that framework, with the reason.
//!
//! Why a mapping per cause and not a synthesised schedule (as [`super::plan`] does for racecert's
//! reference worker): a team's worker has no checkpoints racecert can hold it at; what racecert can
//! do to it is what its framework does in production, so the question per diagnosis is which of
//! those faults makes the same race.

use super::{Analysis, Cause};
use crate::contract::layout::KeyLayout;
use crate::fault::FaultKind;
use crate::runner::system::{Goal, SystemCase, SystemOutcome, replay_command};
use crate::system::Framework;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// The system invariant that two attempts writing break.
const DUPLICATE: &[&str] = &["at-most-one-final-write"];
/// Attempts on two versions: two writes, or a result stored under the wrong version.
const SKEW: &[&str] = &["at-most-one-final-write", "result-names-its-version"];
/// A job that never finishes.
const LOST: &[&str] = &["no-lost-job"];
/// A worker that took a job after its stop signal (on the wire), lost it to its SIGKILL, or
/// answered it on the old version.
const DRAIN: &[&str] = &["drain-discipline", "no-lost-job", "served-by-new-version"];
/// An output of the old version served after the switch, from the cache (on the wire) or as the
/// stored result.
const CACHE: &[&str] = &[
    "no-stale-cache-read",
    "no-cross-version-cache-entry",
    "result-names-its-version",
    "served-by-new-version",
];
/// Two attempts holding one lock (seen on the wire, `[keys] lease`), or both writing.
const LEASE: &[&str] = &["lease-discipline", "at-most-one-final-write"];

/// The faults of `framework` that can re-create `cause` on a system whose own keys are `keys`,
/// and the system invariants whose breach shows it; or why none can.
pub fn faults_for(
    cause: Cause,
    framework: Framework,
    keys: &KeyLayout,
) -> Result<(Vec<FaultKind>, &'static [&'static str]), &'static str> {
    use Cause::*;
    use FaultKind::*;
    match (framework, cause) {
        // A lease that ran out while its attempt still ran: a redelivery during a long call
        // makes a second attempt meet the first one's lock, judged on the wire.
        (Framework::Celery, LeaseTtlTooShort) if keys.lease.is_some() => {
            Ok((vec![VisibilityOutlived, ForcedRestore], LEASE))
        }
        (Framework::Apalis | Framework::Dramatiq, LeaseTtlTooShort) if keys.lease.is_some() => {
            Ok((vec![HeartbeatMiss], LEASE))
        }
        // A redelivery while the first attempt runs: the message outlived the visibility timeout
        // (for real, forced through kombu's own sweep, or while it waited in a prefetch).
        (Framework::Celery, VisibilityTimeoutTooShort) => Ok((
            vec![VisibilityOutlived, ForcedRestore, PrefetchRestore],
            DUPLICATE,
        )),
        (Framework::Celery, MultipleWorkers | RetryWhileRunning) => {
            Ok((vec![ForcedRestore, VisibilityOutlived], DUPLICATE))
        }
        // Without a framework's redelivery, a retry while the first attempt ran is the app's own
        // retry after its model call timed out, or the API submitting again.
        (Framework::Custom, RetryWhileRunning) => {
            Ok((vec![UpstreamTimeout, ApiResubmission], DUPLICATE))
        }
        // Each retry submitted as a new job: the API submitting the request again is that retry.
        (_, NewJobIdPerRetry) => Ok((vec![ApiResubmission], DUPLICATE)),
        (Framework::Celery, LateWrite | MultipleFinalWrites) => Ok((
            vec![ForcedRestore, VisibilityOutlived, PrefetchRestore],
            DUPLICATE,
        )),
        (Framework::Celery, VersionSkew) => Ok((vec![ForcedRestore, VisibilityOutlived], SKEW)),
        // A worker still taking jobs after its stop signal: the rollout's replacement, for real.
        (_, ImperfectDrain) => Ok((vec![Drain], DRAIN)),
        // A crash: Celery acks a killed pool child's message; a killed main process's delivery
        // waits for the visibility timeout.
        (Framework::Celery, LostJob) => Ok((vec![KillPoolChild, KillMain], LOST)),
        (Framework::Celery, AckBeforeFinalWrite) => Ok((vec![KillPoolChild], LOST)),
        // apalis and Dramatiq redeliver when a worker misses its heartbeats; Dramatiq's Retries
        // middleware also runs the message again after the attempt's own timeout.
        (Framework::Dramatiq, RetryWhileRunning) => {
            Ok((vec![HeartbeatMiss, UpstreamTimeout], DUPLICATE))
        }
        (
            Framework::Apalis | Framework::Dramatiq,
            VisibilityTimeoutTooShort
            | MultipleWorkers
            | RetryWhileRunning
            | LateWrite
            | MultipleFinalWrites,
        ) => Ok((vec![HeartbeatMiss], DUPLICATE)),
        (Framework::Apalis | Framework::Dramatiq, VersionSkew) => Ok((vec![HeartbeatMiss], SKEW)),
        (Framework::Apalis, LostJob | AckBeforeFinalWrite) => Ok((vec![KillMain], LOST)),
        // The crash of the process that holds the job (a forked child, a worker process), and of
        // the whole worker.
        (Framework::Dramatiq | Framework::Custom, LostJob | AckBeforeFinalWrite) => {
            Ok((vec![KillHolder, KillMain], LOST))
        }
        // A custom system has no redelivery racecert can force; the second attempt these causes
        // need comes from the request submitted again while the first attempt runs.
        (Framework::Custom, MultipleWorkers | LateWrite | MultipleFinalWrites) => {
            Ok((vec![ApiResubmission], DUPLICATE))
        }
        (Framework::Custom, VersionSkew) => Ok((vec![ApiResubmission], SKEW)),
        (Framework::Custom, VisibilityTimeoutTooShort) => Err(
            "a `custom` system has no queue visibility timeout racecert can outlive (no framework preset); api-resubmission makes a second attempt, which the log's other diagnoses use",
        ),
        // A cache race: a rollout while the old version holds a request, then the same input
        // asked of the new version (an entry the old version filled, or filled again after an
        // invalidation at the switch), judged on the wire from the cache's keys.
        (_, CrossVersionCache | UnversionedCacheKey | CacheHitBeforeInvalidation)
            if keys.cache.is_some() =>
        {
            Ok((vec![Cutover], CACHE))
        }
        (_, CrossVersionCache | UnversionedCacheKey | CacheHitBeforeInvalidation) => Err(
            "a cache race is judged on the wire from the worker's own cache keys: name them in the system file (`[cache] key = \"cache:*\"`, with `{version}` where the key has it)",
        ),
        (Framework::Custom, LeaseTtlTooShort) => Err(
            "a lease race needs a second attempt while the first still runs, and a `custom` system has no redelivery racecert can force; `racecert replay LOG` without --system re-creates it on racecert's reference worker",
        ),
        (_, LeaseTtlTooShort) => Err(
            "a lease race is judged on the wire from the worker's own lock keys: name them in the system file (`[keys] lease = \"lock:{key}\"`); `racecert replay LOG` without --system re-creates it on racecert's reference worker",
        ),
    }
}

/// The faults to run for an analysis: every fault some diagnosis maps to, once, in the order the
/// diagnoses first need them.
pub fn faults_to_run(
    analysis: &Analysis,
    framework: Framework,
    keys: &KeyLayout,
) -> Vec<FaultKind> {
    let mut faults = Vec::new();
    for (mapped, _) in goals(analysis, framework, keys)
        .into_iter()
        .map(|g| (g.faults, g.breaks))
    {
        for fault in mapped {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
    }
    faults
}

/// What the replay looks for, one goal per diagnosis a fault can re-create: the run skips a
/// fault once every diagnosis it could re-create has been reproduced.
pub fn goals(analysis: &Analysis, framework: Framework, keys: &KeyLayout) -> Vec<Goal> {
    analysis
        .findings
        .iter()
        .filter_map(|finding| faults_for(finding.cause, framework, keys).ok())
        .map(|(faults, breaks)| Goal {
            faults,
            breaks: breaks.iter().map(|b| (*b).to_owned()).collect(),
        })
        .collect()
}

/// How a diagnosis came out on the team's worker.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum SystemVerdict {
    /// A case with one of the cause's faults broke the invariant that shows it.
    Reproduced {
        /// The case.
        case: u32,
        /// Its fault.
        fault: FaultKind,
        /// The invariant it broke.
        broke: String,
        /// What was seen.
        observed: String,
        /// The command that reruns exactly that case.
        replay: String,
    },
    /// Every case with the cause's faults held the invariants that show it.
    Prevented {
        /// The cases that ran.
        cases: Vec<RanCase>,
        /// Other invariants those cases broke (`invariant: observed`), if any.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        other_violations: Vec<String>,
    },
    /// No fault of the framework re-creates it, or its cases did not run.
    NotReproducible {
        /// Why.
        reason: String,
    },
}

/// A case that ran for a diagnosis, with what shows the fault took effect (a second model call
/// means the request really ran again).
#[derive(Debug, Clone, Serialize)]
pub struct RanCase {
    /// Its number.
    pub case: u32,
    /// Its fault.
    pub fault: FaultKind,
    /// Model calls of its request.
    pub model_calls: usize,
    /// Final writes of its request.
    pub final_writes: usize,
}

/// One diagnosis of the log and its verdict on the team's worker.
#[derive(Debug, Clone, Serialize)]
pub struct SystemDiagnosis {
    /// The cause.
    pub cause: Cause,
    /// The request of the incident.
    pub request_id: String,
    /// The log's lines that prove it.
    pub lines: Vec<usize>,
    /// What happened, as diagnosed.
    pub explanation: String,
    /// How it came out.
    #[serde(flatten)]
    pub verdict: SystemVerdict,
}

/// What `racecert replay LOG --system FILE` reports.
#[derive(Debug, Clone, Serialize)]
pub struct SystemReplay {
    /// The incident, read and diagnosed.
    pub analysis: Analysis,
    /// The system file.
    pub file: String,
    /// The system's name.
    pub system: String,
    /// Its framework.
    pub framework: String,
    /// The faults run, one case each.
    pub faults: Vec<FaultKind>,
    /// The run (absent when no diagnosis maps to a fault of the framework).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<SystemOutcome>,
    /// One per diagnosis, in the findings' order.
    pub diagnoses: Vec<SystemDiagnosis>,
}

impl SystemReplay {
    /// Judges every diagnosis of `analysis` from the cases of `outcome` (None: nothing ran).
    pub fn judge(
        analysis: Analysis,
        file: &Path,
        system: &str,
        framework: Framework,
        keys: &KeyLayout,
        outcome: Option<SystemOutcome>,
    ) -> SystemReplay {
        let cases: &[SystemCase] = outcome.as_ref().map_or(&[], |o| &o.cases);
        let seed = outcome.as_ref().map_or(1, |o| o.seed);
        let diagnoses = analysis
            .findings
            .iter()
            .map(|finding| {
                let verdict = match faults_for(finding.cause, framework, keys) {
                    Err(reason) => SystemVerdict::NotReproducible {
                        reason: reason.to_owned(),
                    },
                    Ok((faults, breaks)) => verdict(cases, &faults, breaks, file, seed),
                };
                SystemDiagnosis {
                    cause: finding.cause,
                    request_id: finding.request_id.clone(),
                    lines: finding.lines.clone(),
                    explanation: finding.explanation.clone(),
                    verdict,
                }
            })
            .collect();
        SystemReplay {
            analysis,
            file: file.display().to_string(),
            system: system.to_owned(),
            framework: framework.name().to_owned(),
            faults: faults_to_run_of(cases),
            outcome,
            diagnoses,
        }
    }

    /// Whether the team's worker held: no diagnosis was reproduced on it.
    pub fn held(&self) -> bool {
        !self
            .diagnoses
            .iter()
            .any(|d| matches!(d.verdict, SystemVerdict::Reproduced { .. }))
    }

    /// The analysis, then per diagnosis how it came out on the team's worker.
    pub fn text(&self) -> String {
        let mut out = self.analysis.text();
        if self.diagnoses.is_empty() {
            return out;
        }
        let _ = writeln!(
            out,
            "\nreplayed against {} ({}, {}): {}",
            self.system,
            self.framework,
            self.file,
            if self.faults.is_empty() {
                "no diagnosis maps to a fault of this framework, nothing ran".to_owned()
            } else {
                format!(
                    "one case per fault: {}",
                    self.faults
                        .iter()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        let (mut reproduced, mut prevented, mut not) = (0, 0, 0);
        let mut drawn = Vec::new();
        for d in &self.diagnoses {
            let lines = d
                .lines
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(
                out,
                "\ncause {} (request {}, lines {lines}): ",
                d.cause, d.request_id
            );
            match &d.verdict {
                SystemVerdict::Reproduced {
                    case,
                    fault,
                    broke,
                    observed,
                    replay,
                } => {
                    reproduced += 1;
                    let _ = writeln!(
                        out,
                        "REPRODUCED on the team's worker by case {case} (fault {fault}): {broke} broke ({observed})"
                    );
                    let _ = writeln!(out, "  replay: {replay}");
                    if !drawn.contains(case)
                        && let Some(c) = self
                            .outcome
                            .as_ref()
                            .and_then(|o| o.cases.iter().find(|c| c.number == *case))
                    {
                        drawn.push(*case);
                        let _ = writeln!(out, "  sequence diagram of case {case}:");
                        for line in crate::runner::system::sequence_text(c).lines() {
                            let _ = writeln!(out, "    {line}");
                        }
                    }
                }
                SystemVerdict::Prevented {
                    cases,
                    other_violations,
                } => {
                    prevented += 1;
                    let _ = writeln!(
                        out,
                        "prevented by the team's worker: its invariant held in {}{}",
                        cases
                            .iter()
                            .map(|c| format!(
                                "case {} ({}: {} model call(s), {} final write(s))",
                                c.case, c.fault, c.model_calls, c.final_writes
                            ))
                            .collect::<Vec<_>>()
                            .join(", "),
                        if other_violations.is_empty() {
                            String::new()
                        } else {
                            format!("; but: {}", other_violations.join("; "))
                        }
                    );
                }
                SystemVerdict::NotReproducible { reason } => {
                    not += 1;
                    let _ = writeln!(out, "not reproducible with {}: {reason}", self.framework);
                }
            }
        }
        let _ = writeln!(
            out,
            "\nsummary: {} diagnosis(es); {reproduced} reproduced on the team's worker, {prevented} prevented by it, {not} not reproducible with {}",
            self.diagnoses.len(),
            self.framework
        );
        out
    }
}

fn faults_to_run_of(cases: &[SystemCase]) -> Vec<FaultKind> {
    let mut faults = Vec::new();
    for case in cases {
        if !faults.contains(&case.fault) {
            faults.push(case.fault);
        }
    }
    faults
}

/// The verdict of one diagnosis from the cases of its faults.
fn verdict(
    cases: &[SystemCase],
    faults: &[FaultKind],
    breaks: &[&str],
    file: &Path,
    seed: u64,
) -> SystemVerdict {
    let mine: Vec<&SystemCase> = cases.iter().filter(|c| faults.contains(&c.fault)).collect();
    for case in &mine {
        if let Some(v) = case
            .violations
            .iter()
            .find(|v| breaks.contains(&v.invariant.name()))
        {
            return SystemVerdict::Reproduced {
                case: case.number,
                fault: case.fault,
                broke: v.invariant.name().to_owned(),
                observed: v.observed.clone(),
                replay: replay_command(file, seed, case.number, case.fault),
            };
        }
    }
    if mine.is_empty() {
        return SystemVerdict::NotReproducible {
            reason: format!(
                "no case with {} ran (cut by the budget or an interrupt)",
                faults
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        };
    }
    SystemVerdict::Prevented {
        cases: mine
            .iter()
            .map(|c| RanCase {
                case: c.number,
                fault: c.fault,
                model_calls: c.model_calls,
                final_writes: c.final_writes,
            })
            .collect(),
        other_violations: mine
            .iter()
            .flat_map(|c| {
                c.violations
                    .iter()
                    .map(move |v| format!("case {} {}: {}", c.number, v.invariant, v.observed))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_a_fault_of_its_framework_or_a_reason() {
        for framework in [
            Framework::Celery,
            Framework::Apalis,
            Framework::Dramatiq,
            Framework::Custom,
        ] {
            for cause in Cause::ALL {
                for keys in [KeyLayout::default(), KeyLayout::contract("")] {
                    match faults_for(cause, framework, &keys) {
                        Ok((faults, breaks)) => {
                            assert!(!faults.is_empty() && !breaks.is_empty(), "{cause}");
                            for fault in faults {
                                assert!(
                                    crate::system::preset::faults(framework).contains(&fault),
                                    "{fault} is not a fault of {framework:?} ({cause})"
                                );
                            }
                        }
                        Err(reason) => assert!(reason.len() > 20, "{cause}: {reason}"),
                    }
                }
            }
        }
        let none = KeyLayout::default();
        // A Celery redelivery is re-created by the redelivery faults, a crash by the kills.
        let (faults, _) =
            faults_for(Cause::VisibilityTimeoutTooShort, Framework::Celery, &none).unwrap();
        assert!(faults.contains(&FaultKind::ForcedRestore));
        let (faults, breaks) = faults_for(Cause::LostJob, Framework::Celery, &none).unwrap();
        assert!(faults.contains(&FaultKind::KillPoolChild) && breaks == ["no-lost-job"]);
        // A lease race needs the worker's lock keys, to be judged on the wire.
        let reason = faults_for(Cause::LeaseTtlTooShort, Framework::Celery, &none).unwrap_err();
        assert!(reason.contains("[keys] lease"), "{reason}");
        let locks = KeyLayout {
            lease: Some("lock:{key}".into()),
            cache: None,
        };
        let (_, breaks) = faults_for(Cause::LeaseTtlTooShort, Framework::Apalis, &locks).unwrap();
        assert!(breaks.contains(&"lease-discipline"));
        // A cache race needs the cache's keys; with them, a rollout re-creates it.
        let reason = faults_for(Cause::UnversionedCacheKey, Framework::Celery, &none).unwrap_err();
        assert!(reason.contains("[cache] key"), "{reason}");
        let cached = KeyLayout {
            lease: None,
            cache: Some("cache:*".into()),
        };
        let (faults, breaks) =
            faults_for(Cause::UnversionedCacheKey, Framework::Apalis, &cached).unwrap();
        assert_eq!(faults, [FaultKind::Cutover]);
        assert!(breaks.contains(&"no-stale-cache-read"));
    }

    #[test]
    fn the_seed_log_maps_to_celery_faults_once_each() {
        let analysis = super::super::analyse(super::super::seed_log().as_bytes(), None);
        let faults = faults_to_run(&analysis, Framework::Celery, &KeyLayout::default());
        assert!(!faults.is_empty());
        let unique: std::collections::BTreeSet<_> = faults.iter().collect();
        assert_eq!(unique.len(), faults.len(), "{faults:?}");
        // Nothing ran: every mapped diagnosis says so, none is called prevented.
        let replay = SystemReplay::judge(
            analysis,
            Path::new("naive.toml"),
            "celery-naive",
            Framework::Celery,
            &KeyLayout::default(),
            None,
        );
        assert!(replay.held());
        assert!(
            replay
                .diagnoses
                .iter()
                .all(|d| matches!(d.verdict, SystemVerdict::NotReproducible { .. })),
            "{}",
            replay.text()
        );
    }
}
