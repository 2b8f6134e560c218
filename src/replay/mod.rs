//! Reproducing a reported race from production logs (`racecert replay`): [`parse`] reads the lines,
//! [`reconstruct`] groups them per request into attempts (worker, version, what each did, in
//! order), [`diagnose`] names the seed's races with the lines that prove them, and
//! [`synthesize`] turns the story into a controlled schedule that the harness runs against the
//! reference worker (and its defects), so "random and unreproducible" becomes a sequence of
//! events that replays on a laptop.

pub use crate::contract::log::parse;

use crate::contract::log::LogLine;
use crate::fault::Fault;
use crate::reference::checkpoints::Checkpoint;
use crate::schedule::{RequestSpec, Schedule, Step, WorkerSpec};
use parse::{Parsed, ParsedLine};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Statuses meaning an attempt wrote its result.
const WRITES: [&str; 3] = ["inference_succeeded", "late_success", "cache_hit_succeeded"];
/// Statuses meaning an attempt executed the job (a dispatch alone is not an execution: the
/// attempt may have been skipped as a duplicate).
const WORKING: [&str; 5] = [
    "cache_miss",
    "cache_hit",
    "inference_started",
    "timeout_waiting_upstream",
    "job_taken",
];

/// One attempt of a request, as the log tells it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Attempt {
    /// Attempt number (from `attempt=`, else order of appearance).
    pub attempt: u32,
    /// Worker that ran it.
    pub worker_id: String,
    /// Model version it ran with.
    pub model_version: Option<String>,
    /// Backend it called.
    pub backend_endpoint: Option<String>,
    /// Cache key it used.
    pub cache_key: Option<String>,
    /// (line number, timestamp, status) in order.
    pub events: Vec<(usize, String, String)>,
}

impl Attempt {
    fn first_line(&self) -> usize {
        self.events.first().map_or(0, |e| e.0)
    }

    fn line_of(&self, statuses: &[&str]) -> Option<usize> {
        self.events
            .iter()
            .find(|(_, _, s)| statuses.contains(&s.as_str()))
            .map(|e| e.0)
    }

    /// Line of its result write, if any.
    pub fn write_line(&self) -> Option<usize> {
        self.line_of(&WRITES)
    }

    /// Whether it logged an upstream timeout.
    pub fn timed_out(&self) -> Option<usize> {
        self.line_of(&["timeout_waiting_upstream", "upstream_failed"])
    }
}

/// One request (or idempotency key) and its attempts.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestStory {
    /// Request id.
    pub request_id: String,
    /// Attempts in order of their first line.
    pub attempts: Vec<Attempt>,
    /// Lines about the request that belong to no attempt (e.g. `overwrite_detected`).
    pub other: Vec<(usize, String)>,
}

/// Every request found, plus cutovers.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Reconstruction {
    /// Per request, in order of first appearance.
    pub requests: Vec<RequestStory>,
    /// (line, from, to) of logged cutovers.
    pub cutovers: Vec<(usize, Option<String>, String)>,
}

/// Groups the lines per request into attempts. `only` keeps one request (by request id or
/// idempotency key).
pub fn reconstruct(parsed: &Parsed, only: Option<&str>) -> Reconstruction {
    let mut order: Vec<String> = Vec::new();
    let mut stories: BTreeMap<String, RequestStory> = BTreeMap::new();
    let mut cutovers = Vec::new();
    for ParsedLine { line_no, line, .. } in &parsed.lines {
        if line.status() == Some("cutover") {
            cutovers.push((
                *line_no,
                line.get("previous_model_version").map(str::to_owned),
                line.get("new_model_version").unwrap_or("-").to_owned(),
            ));
            continue;
        }
        let Some(request) = line
            .get("request_id")
            .or_else(|| line.get("idempotency_key"))
            .or_else(|| line.get("job_id"))
        else {
            continue;
        };
        if only
            .is_some_and(|wanted| wanted != request && line.get("idempotency_key") != Some(wanted))
        {
            continue;
        }
        let story = stories.entry(request.to_owned()).or_insert_with(|| {
            order.push(request.to_owned());
            RequestStory {
                request_id: request.to_owned(),
                attempts: Vec::new(),
                other: Vec::new(),
            }
        });
        let status = line.status().unwrap_or("-").to_owned();
        let Some(worker) = line.get("worker_id") else {
            story.other.push((*line_no, status));
            continue;
        };
        let number: Option<u32> = line.get("attempt").and_then(|a| a.parse().ok());
        let index = story
            .attempts
            .iter()
            .position(|a| a.worker_id == worker && number.is_none_or(|n| n == a.attempt));
        let index = match index {
            Some(index) => index,
            None => {
                let attempt = number.unwrap_or(story.attempts.len() as u32 + 1);
                story.attempts.push(Attempt {
                    attempt,
                    worker_id: worker.to_owned(),
                    model_version: None,
                    backend_endpoint: None,
                    cache_key: None,
                    events: Vec::new(),
                });
                story.attempts.len() - 1
            }
        };
        let attempt = &mut story.attempts[index];
        let fill = |slot: &mut Option<String>, value: Option<&str>| {
            if slot.is_none() {
                *slot = value.filter(|v| *v != "-").map(str::to_owned);
            }
        };
        fill(&mut attempt.model_version, line.get("model_version"));
        fill(&mut attempt.backend_endpoint, line.get("backend_endpoint"));
        fill(&mut attempt.cache_key, line.get("cache_key"));
        attempt.events.push((*line_no, line.ts.clone(), status));
    }
    let mut requests: Vec<RequestStory> = order
        .into_iter()
        .filter_map(|id| stories.remove(&id))
        .collect();
    for story in &mut requests {
        story.attempts.sort_by_key(Attempt::first_line);
    }
    Reconstruction { requests, cutovers }
}

/// A race named in the seed's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Race {
    /// The same request executed by more than one worker.
    MultipleWorkers,
    /// An older attempt wrote after a newer one finished (late write / overwrite).
    LateWrite,
    /// Attempts of one request on different model versions.
    VersionSkew,
    /// A cache entry served across versions.
    CrossVersionCache,
    /// A retry dispatched while the first attempt was still running.
    RetryWhileRunning,
}

impl Race {
    /// kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Race::MultipleWorkers => "multiple-workers",
            Race::LateWrite => "late-write",
            Race::VersionSkew => "version-skew",
            Race::CrossVersionCache => "cross-version-cache",
            Race::RetryWhileRunning => "retry-while-running",
        }
    }
}

/// A diagnosis with its proof.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// Which race.
    pub race: Race,
    /// The request.
    pub request_id: String,
    /// What happened, in a sentence.
    pub explanation: String,
    /// Line numbers that prove it.
    pub lines: Vec<usize>,
}

/// Names the races the reconstruction shows.
pub fn diagnose(reconstruction: &Reconstruction) -> Vec<Finding> {
    let mut findings = Vec::new();
    for story in &reconstruction.requests {
        let working: Vec<&Attempt> = story
            .attempts
            .iter()
            .filter(|a| {
                a.events
                    .iter()
                    .any(|(_, _, s)| WORKING.contains(&s.as_str()) || WRITES.contains(&s.as_str()))
            })
            .collect();
        let mut workers: Vec<&str> = working.iter().map(|a| a.worker_id.as_str()).collect();
        workers.sort();
        workers.dedup();
        if workers.len() > 1 {
            findings.push(Finding {
                race: Race::MultipleWorkers,
                request_id: story.request_id.clone(),
                explanation: format!(
                    "request {} was executed by {} workers: {}",
                    story.request_id,
                    workers.len(),
                    workers.join(", ")
                ),
                lines: working.iter().map(|a| a.first_line()).collect(),
            });
        }
        let mut versions: Vec<&str> = working
            .iter()
            .filter_map(|a| a.model_version.as_deref())
            .collect();
        versions.sort();
        versions.dedup();
        if versions.len() > 1 {
            findings.push(Finding {
                race: Race::VersionSkew,
                request_id: story.request_id.clone(),
                explanation: format!(
                    "attempts of {} ran on versions {}",
                    story.request_id,
                    versions.join(" and ")
                ),
                lines: working.iter().map(|a| a.first_line()).collect(),
            });
        }
        // A retry dispatched while an earlier attempt had started and not yet written or failed
        // (executed or not: the dispatch is the race).
        let dispatched: Vec<&Attempt> = story.attempts.iter().collect();
        for pair in dispatched.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let later_start = later.first_line();
            let earlier_done = earlier
                .events
                .iter()
                .find(|(_, _, s)| {
                    WRITES.contains(&s.as_str())
                        || s == "upstream_failed"
                        || s == "late_write_rejected"
                })
                .map(|e| e.0);
            if earlier_done.is_none_or(|done| done > later_start) {
                findings.push(Finding {
                    race: Race::RetryWhileRunning,
                    request_id: story.request_id.clone(),
                    explanation: format!(
                        "attempt {} on {} started (line {later_start}) while attempt {} on {} was still running{}",
                        later.attempt,
                        later.worker_id,
                        earlier.attempt,
                        earlier.worker_id,
                        earlier
                            .timed_out()
                            .map(|l| format!(" (it had only timed out waiting upstream, line {l})"))
                            .unwrap_or_default()
                    ),
                    lines: vec![earlier.first_line(), later_start],
                });
            }
        }
        // A write by an attempt after a newer attempt's write.
        let mut writes: Vec<(usize, &Attempt)> = working
            .iter()
            .filter_map(|a| a.write_line().map(|l| (l, *a)))
            .collect();
        writes.sort_by_key(|(line, _)| *line);
        for pair in writes.windows(2) {
            let ((first_line, first), (second_line, second)) = (pair[0], pair[1]);
            if second.attempt < first.attempt {
                let mut lines = vec![first_line, second_line];
                lines.extend(
                    story
                        .other
                        .iter()
                        .filter(|(_, s)| s == "overwrite_detected")
                        .map(|(l, _)| *l),
                );
                findings.push(Finding {
                    race: Race::LateWrite,
                    request_id: story.request_id.clone(),
                    explanation: format!(
                        "attempt {} ({} on {}) wrote at line {second_line}, after the newer attempt {} ({} on {}) had written at line {first_line}: the late result overwrote the newer one",
                        second.attempt,
                        second.worker_id,
                        second.model_version.as_deref().unwrap_or("?"),
                        first.attempt,
                        first.worker_id,
                        first.model_version.as_deref().unwrap_or("?"),
                    ),
                    lines,
                });
            }
        }
    }
    // Cache entries shared across versions: one cache key used by attempts of several versions,
    // with a hit served to a version other than the one that missed (and filled) it.
    let mut by_key: BTreeMap<&str, Vec<(&RequestStory, &Attempt)>> = BTreeMap::new();
    for story in &reconstruction.requests {
        for attempt in &story.attempts {
            if let Some(key) = attempt.cache_key.as_deref() {
                by_key.entry(key).or_default().push((story, attempt));
            }
        }
    }
    for (key, uses) in by_key {
        let filled: Vec<&(&RequestStory, &Attempt)> = uses
            .iter()
            .filter(|(_, a)| a.events.iter().any(|(_, _, s)| s == "cache_miss"))
            .collect();
        for (story, attempt) in &uses {
            let Some(hit) = attempt
                .events
                .iter()
                .find(|(_, _, s)| s == "cache_hit")
                .map(|e| e.0)
            else {
                continue;
            };
            let other = filled.iter().find(|(_, filler)| {
                filler.model_version != attempt.model_version && filler.first_line() < hit
            });
            if let Some((filler_story, filler)) = other {
                findings.push(Finding {
                    race: Race::CrossVersionCache,
                    request_id: story.request_id.clone(),
                    explanation: format!(
                        "{} on {} got a cache hit on {key} (line {hit}), an entry filled by {} on {} for request {}: the cache key does not distinguish versions",
                        attempt.worker_id,
                        attempt.model_version.as_deref().unwrap_or("?"),
                        filler.worker_id,
                        filler.model_version.as_deref().unwrap_or("?"),
                        filler_story.request_id
                    ),
                    lines: vec![filler.first_line(), hit],
                });
            }
        }
    }
    findings.sort_by(|a, b| (a.race, &a.request_id).cmp(&(b.race, &b.request_id)));
    findings
}

/// A controlled case that re-enacts a request's story: the logged workers (with their versions),
/// attempts started in the logged order, an earlier attempt held while a later one runs when the
/// log shows the overlap, its lease expiring (the visibility timeout that sent the retry), and the
/// writes in the logged order.
pub fn synthesize(
    reconstruction: &Reconstruction,
    request_id: &str,
) -> Option<(Vec<WorkerSpec>, Schedule)> {
    let story = reconstruction
        .requests
        .iter()
        .find(|r| r.request_id == request_id)?;
    let mut workers: Vec<WorkerSpec> = Vec::new();
    let worker_index = |attempt: &Attempt, workers: &mut Vec<WorkerSpec>| -> usize {
        let version = attempt.model_version.clone().unwrap_or_else(|| "v1".into());
        match workers.iter().position(|w| w.id == attempt.worker_id) {
            Some(i) => i,
            None => {
                workers.push(WorkerSpec {
                    id: attempt.worker_id.clone(),
                    version,
                });
                workers.len() - 1
            }
        }
    };
    let attempts: Vec<&Attempt> = story.attempts.iter().collect();
    if attempts.is_empty() {
        return None;
    }
    let mut requests = vec![RequestSpec {
        request_id: story.request_id.clone(),
        input: "input-0".into(),
    }];
    let mut steps = Vec::new();
    // Cross-version cache stories involve another request that filled the entry first.
    for other in &reconstruction.requests {
        if other.request_id == story.request_id {
            continue;
        }
        let shares_cache = other.attempts.iter().any(|o| {
            o.cache_key.is_some()
                && attempts.iter().any(|a| a.cache_key == o.cache_key)
                && o.first_line() < attempts[0].first_line()
        });
        if shares_cache {
            requests.insert(
                0,
                RequestSpec {
                    request_id: other.request_id.clone(),
                    input: "input-0".into(),
                },
            );
            for attempt in &other.attempts {
                let w = worker_index(attempt, &mut workers);
                steps.push(Step::Run {
                    worker: w,
                    to: Checkpoint::Done,
                });
            }
        }
    }
    for (line, _, to) in &reconstruction.cutovers {
        if *line < attempts[0].first_line() {
            steps.push(Step::Fault(Fault::Cutover { to: to.clone() }));
        }
    }
    // Which attempts wrote, in the logged order; those still running when a later attempt starts
    // are held before their final write.
    let request_index = requests.len() - 1;
    let mut held: Vec<(usize, usize)> = Vec::new(); // (write line or MAX, worker)
    for (i, attempt) in attempts.iter().enumerate() {
        let w = worker_index(attempt, &mut workers);
        let overlapped_by_next = attempts.get(i + 1).is_some_and(|next| {
            attempt
                .write_line()
                .is_none_or(|write| write > next.first_line())
        });
        if overlapped_by_next {
            // Still in its backend call when the next attempt started: hold it right after the
            // call, before it caches or writes anything.
            let stop = if attempt
                .events
                .iter()
                .any(|(_, _, s)| s == "inference_started" || s == "timeout_waiting_upstream")
            {
                Checkpoint::AfterBackendCall
            } else {
                Checkpoint::AfterLease
            };
            steps.push(Step::Run {
                worker: w,
                to: stop,
            });
            // The retry came because the attempt looked dead: its lease ran out, unless the log
            // shows a plain duplicate execution with no timeout at all.
            if attempt.timed_out().is_some() {
                steps.push(Step::Fault(Fault::ExpireLease {
                    request: request_index,
                }));
            }
            held.push((attempt.write_line().unwrap_or(usize::MAX), w));
        } else {
            steps.push(Step::Run {
                worker: w,
                to: Checkpoint::Done,
            });
        }
    }
    held.sort();
    for (_, w) in held {
        steps.push(Step::Run {
            worker: w,
            to: Checkpoint::Done,
        });
    }
    Some((workers, Schedule { requests, steps }))
}

/// The whole analysis of a log, for the text and JSON outputs.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Lines read.
    pub lines: usize,
    /// Malformed lines (number, reason).
    pub malformed: Vec<(usize, String)>,
    /// Unrelated lines skipped.
    pub unrelated: usize,
    /// The reconstruction.
    pub reconstruction: Reconstruction,
    /// The findings.
    pub findings: Vec<Finding>,
}

/// Parses, reconstructs and diagnoses `bytes`.
pub fn analyse(bytes: &[u8], only: Option<&str>) -> Analysis {
    let parsed = parse::parse(bytes);
    let reconstruction = reconstruct(&parsed, only);
    let findings = diagnose(&reconstruction);
    Analysis {
        lines: parsed.lines.len(),
        malformed: parsed
            .malformed
            .iter()
            .map(|m| (m.line_no, m.reason.clone()))
            .collect(),
        unrelated: parsed.unrelated,
        reconstruction,
        findings,
    }
}

impl Analysis {
    /// Human-readable story and diagnosis.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "read {} relevant line(s), {} unrelated, {} malformed",
            self.lines,
            self.unrelated,
            self.malformed.len()
        );
        for (line, reason) in self.malformed.iter().take(20) {
            let _ = writeln!(out, "  malformed line {line}: {reason}");
        }
        for story in &self.reconstruction.requests {
            let _ = writeln!(out, "request {}:", story.request_id);
            for attempt in &story.attempts {
                let statuses: Vec<String> = attempt
                    .events
                    .iter()
                    .map(|(line, _, status)| format!("{status}@{line}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  attempt {} on {} ({}): {}",
                    attempt.attempt,
                    attempt.worker_id,
                    attempt
                        .model_version
                        .as_deref()
                        .unwrap_or("version not logged"),
                    statuses.join(" ")
                );
            }
        }
        if self.findings.is_empty() {
            out.push_str("diagnosis: no race in these lines\n");
        }
        for finding in &self.findings {
            let _ = writeln!(
                out,
                "diagnosis {}: {} (lines {})",
                finding.race.name(),
                finding.explanation,
                finding
                    .lines
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        out
    }
}

/// Lines as the seed's log shows them (used by tests and examples).
pub fn seed_log() -> &'static str {
    include_str!("seed.log")
}

/// Turns a log line of the reference worker into the parser's form (for round trips in tests).
pub fn reparse(line: &LogLine) -> Option<LogLine> {
    parse::parse_line(&line.to_logfmt()).ok()
}

#[cfg(test)]
mod tests;

/// The reproduced run of a story.
#[derive(Debug, Clone)]
pub struct ReplayRun {
    /// The workers, as logged.
    pub workers: Vec<WorkerSpec>,
    /// The synthesized schedule.
    pub schedule: Schedule,
    /// What the harness saw.
    pub result: crate::schedule::controlled::CaseResult,
    /// Races of the incident that the reproduced run shows again.
    pub reproduced: Vec<Race>,
    /// Races of the incident that the worker under test prevented.
    pub prevented: Vec<Race>,
}

/// Runs the story of `request_id` against the reference worker (with `defects`) on `bed`.
pub async fn replay_on(
    bed: &crate::env::TestBed,
    analysis: &Analysis,
    request_id: &str,
    defects: crate::reference::defects::Defects,
) -> crate::Result<ReplayRun> {
    let (workers, schedule) =
        synthesize(&analysis.reconstruction, request_id).ok_or_else(|| {
            crate::Error::Config(format!("no attempts of request {request_id} in the log"))
        })?;
    let mut settings = crate::schedule::controlled::CaseSettings::seed_pair();
    settings.workers = workers.clone();
    settings.defects = defects;
    let controller = crate::schedule::controlled::Controller::new(bed, settings).await?;
    let result = controller.run(&schedule).await?;
    // Diagnose the reproduced run with the same code that read the incident.
    let lines: String = result
        .history
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            crate::history::EventKind::Worker(line) => Some(line.to_logfmt() + "\n"),
            _ => None,
        })
        .collect();
    let rerun = analyse(lines.as_bytes(), None);
    let incident: Vec<Race> = dedup(
        analysis
            .findings
            .iter()
            .filter(|f| f.request_id == request_id)
            .map(|f| f.race),
    );
    let again: Vec<Race> = dedup(rerun.findings.iter().map(|f| f.race));
    Ok(ReplayRun {
        workers,
        schedule,
        reproduced: incident
            .iter()
            .copied()
            .filter(|r| again.contains(r))
            .collect(),
        prevented: incident
            .iter()
            .copied()
            .filter(|r| !again.contains(r))
            .collect(),
        result,
    })
}

fn dedup(races: impl Iterator<Item = Race>) -> Vec<Race> {
    let mut races: Vec<Race> = races.collect();
    races.sort();
    races.dedup();
    races
}
