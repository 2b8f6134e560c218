//! Reports people can read: a terminal summary, JSON (also the input of `racecert report merge`
//! for sharded runs), JUnit XML for CI systems, and an HTML page with an SVG sequence diagram of
//! every counterexample (lanes: API, queue, each worker with its version, Redis, Postgres, each
//! backend), faults and violating writes marked.
//!
//! Why one file of ~800 lines: one report model and its four renderings (terminal, JSON, JUnit,
//! HTML), kept together so a field added to the model is rendered everywhere; the SVG diagram and
//! the lanes and arrows it draws (from a history) are submodules of their own.

mod sequence;
mod svg;
pub mod system;

pub use sequence::diagram;

use crate::check::CaseResult;
use crate::check::Violation;
use crate::check::coverage::{Coverage, Scope};
use crate::fault::FaultKind;
use crate::runner::explore::{Counterexample, ExploreReport};
use crate::schedule::Schedule;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// A whole certification run (or one shard of it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// racecert's version.
    pub racecert_version: String,
    /// When the run started (UTC).
    pub started_at: String,
    /// Shard `i/n` this report covers, if sharded.
    pub shard: Option<(u32, u32)>,
    /// One entry per suite run.
    pub suites: Vec<SuiteOutcome>,
    /// The signal that stopped the run early, if one did: the report is partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

pub use crate::check::Verdict;

/// One fault kind's coverage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CoverageRow {
    /// Fault kind.
    pub fault: String,
    /// The path it targets.
    pub target: String,
    /// Times applied.
    pub applied: u32,
    /// Times it reached its target path.
    pub landed: u32,
    /// Why it did not land as often as a PASS needs (a kind in scope only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
    /// Why the run does not require it (a kind declared out of scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_scope: Option<String>,
}

/// One broken invariant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ViolationReport {
    /// Invariant name.
    pub invariant: String,
    /// What should hold.
    pub should_hold: String,
    /// What was observed.
    pub observed: String,
    /// Proof.
    pub evidence: Vec<String>,
}

/// One arrow (or fault band) of a sequence diagram.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiagramEvent {
    /// Schedule step.
    pub step: usize,
    /// Lane it starts at.
    pub from: String,
    /// Lane it ends at (same as `from` for a fault band).
    pub to: String,
    /// Text on the arrow.
    pub label: String,
    /// `message`, `fault` or `violation`.
    pub kind: String,
}

/// A shrunk counterexample, as reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CounterexampleReport {
    /// Broken invariants.
    pub violations: Vec<ViolationReport>,
    /// The minimal schedule.
    pub schedule: Schedule,
    /// The timeline in the seed's log format.
    pub timeline: String,
    /// Lanes of the sequence diagram, left to right.
    pub lanes: Vec<String>,
    /// The diagram's events.
    pub diagram: Vec<DiagramEvent>,
    /// Cases before the first failure.
    pub found_after_cases: u32,
    /// Milliseconds before the first failure.
    pub found_after_ms: u64,
    /// The command that reproduces it exactly (from its schedule file when one was written).
    pub replay: String,
    /// The schedule file, if one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_file: Option<String>,
    /// The command that regenerates it from the exploration's seed and case number.
    #[serde(default)]
    pub seed_replay: String,
    /// The minimal wire schedule, when the counterexample was found by holding a black-box
    /// worker's round trips (then `schedule` holds only its requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_schedule: Option<WireScheduleText>,
}

/// A wire schedule as a report shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireScheduleText {
    /// Its steps after shrinking.
    pub steps: usize,
    /// Its steps before shrinking.
    pub shrunk_from: usize,
    /// One step a line.
    pub text: String,
}

/// One suite's result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SuiteOutcome {
    /// Suite name.
    pub name: String,
    /// Suite file.
    pub path: String,
    /// Defects switched on.
    pub defects: Vec<String>,
    /// Seed.
    pub seed: u64,
    /// Cases run.
    pub cases_run: u32,
    /// Wall time, ms.
    pub elapsed_ms: u64,
    /// The time budget it had, ms (None: a fixed number of cases).
    #[serde(default)]
    pub budget_ms: Option<u64>,
    /// Of the cases, mutants of schedules that reached new coverage.
    #[serde(default)]
    pub mutants_run: u32,
    /// Schedules kept for reaching something new.
    #[serde(default)]
    pub corpus: u32,
    /// Interleavings of checkpoints per worker pair reached.
    #[serde(default)]
    pub interleavings: u32,
    /// Whether every invariant held.
    pub held: bool,
    /// Whether the suite was expected to pass.
    pub expect_pass: bool,
    /// Fault coverage.
    pub coverage: Vec<CoverageRow>,
    /// Fault kinds in scope that did not land on their target as often as a PASS needs.
    pub not_covered: Vec<String>,
    /// Invariants the suite asks for that could not be judged: the wire-only ones when the
    /// workers' round trips were not recorded (a proxy that is not racecert's, or recording off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_judged: Vec<String>,
    /// The counterexample, if an invariant broke.
    pub counterexample: Option<CounterexampleReport>,
    /// A harness error that stopped the suite (never a verdict).
    pub error: Option<String>,
    /// External workers: stdout and stderr of each process (`worker-a#1`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub worker_outputs: BTreeMap<String, (String, String)>,
}

impl SuiteOutcome {
    /// Whether the outcome is what the suite expects (pass held, or an expected failure found).
    pub fn as_expected(&self) -> bool {
        self.error.is_none() && self.held == self.expect_pass
    }

    /// The suite's verdict: FAILED if not as expected; INCONCLUSIVE if it should pass, held, and
    /// left a kind in scope unlanded; PASSED otherwise.
    pub fn verdict(&self) -> Verdict {
        if !self.as_expected() {
            Verdict::Failed
        } else if self.expect_pass && !self.not_covered.is_empty() {
            Verdict::Inconclusive
        } else {
            Verdict::Passed
        }
    }

    /// Builds the outcome of an exploration.
    #[allow(clippy::too_many_arguments)]
    pub fn from_exploration(
        name: &str,
        path: &str,
        defects: Vec<String>,
        seed: u64,
        expect_pass: bool,
        scope: &Scope,
        report: &ExploreReport,
        replay: String,
    ) -> SuiteOutcome {
        let coverage = coverage_rows(scope, &report.coverage);
        let not_covered = not_covered(&coverage);
        SuiteOutcome {
            name: name.to_owned(),
            path: path.to_owned(),
            defects,
            seed,
            cases_run: report.cases_run,
            elapsed_ms: report.elapsed.as_millis() as u64,
            budget_ms: None,
            mutants_run: report.mutants_run,
            corpus: report.corpus,
            interleavings: report
                .coverage
                .reached
                .iter()
                .filter(|r| r.is_interleaving())
                .count() as u32,
            held: report.found.is_none(),
            expect_pass,
            coverage,
            not_covered,
            not_judged: Vec::new(),
            counterexample: report
                .found
                .as_ref()
                .map(|c| counterexample_report(c, replay)),
            error: None,
            worker_outputs: BTreeMap::new(),
        }
    }
}

/// Coverage rows of the fault kinds of a run's scope, in that order: landed / applied, and why a
/// kind in scope fell short or why one is out of scope.
pub fn coverage_rows(scope: &Scope, coverage: &Coverage) -> Vec<CoverageRow> {
    let short: BTreeMap<FaultKind, String> = scope.unlanded(coverage).into_iter().collect();
    scope
        .kinds
        .iter()
        .map(|kind| {
            let (applied, landed) = coverage.faults.get(kind).copied().unwrap_or((0, 0));
            CoverageRow {
                fault: kind.name().to_owned(),
                target: kind.target_path().to_owned(),
                applied,
                landed,
                short: short.get(kind).cloned(),
                out_of_scope: scope.out_of_scope.get(kind).cloned(),
            }
        })
        .collect()
}

/// The kinds of coverage rows that fell short of what a PASS needs.
pub fn not_covered(rows: &[CoverageRow]) -> Vec<String> {
    rows.iter()
        .filter(|row| row.short.is_some())
        .map(|row| row.fault.clone())
        .collect()
}

fn violation_report(violation: &Violation) -> ViolationReport {
    ViolationReport {
        invariant: violation.invariant.name().to_owned(),
        should_hold: violation.invariant.statement().to_owned(),
        observed: violation.observed.clone(),
        evidence: violation.evidence.clone(),
    }
}

/// A test bed's addresses, one service a line (`racecert env up`, `racecert smoke`).
pub fn addresses_text(a: &crate::env::Addresses) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "redis      {}  (direct {})",
        a.redis_url, a.redis_direct_url
    );
    let _ = writeln!(
        out,
        "postgres   {}  (direct {})",
        a.database_url, a.database_direct_url
    );
    for (name, version, url) in &a.backends {
        let _ = writeln!(out, "backend    {url}  {name} serving {version}");
    }
    let _ = writeln!(out, "toxiproxy  {}", a.toxiproxy_url);
    out
}

/// A counterexample as text a person can act on: what broke, the minimal schedule, the timeline
/// in the seed's log format, and how to replay it.
pub fn counterexample_text(found: &Counterexample, seed: u64, replay: &str) -> String {
    let mut out = String::new();
    for violation in found.violations() {
        out.push_str(&violation.to_string());
    }
    let _ = write!(
        out,
        "minimal schedule ({} steps):\n{}",
        found.shrunk.schedule.steps.len(),
        found.shrunk.schedule
    );
    out.push_str("timeline:\n");
    out.push_str(&found.shrunk.case.history.timeline());
    let _ = writeln!(
        out,
        "found after {} case(s) in {:.2?}; seed {seed}\nreplay: {replay}",
        found.found_after.0, found.found_after.1
    );
    out
}

/// One case as text: its schedule, its timeline, and the verdict (`racecert run`).
pub fn case_text(title: &str, schedule: &Schedule, result: &CaseResult) -> String {
    let mut out = format!("{title}:\n{schedule}");
    let _ = writeln!(out, "timeline:\n{}", result.history.timeline());
    for violation in &result.violations {
        out.push_str(&violation.to_string());
    }
    if result.violations.is_empty() {
        out.push_str("every invariant held\n");
    }
    out
}

/// The report of a counterexample found by exploration.
pub fn counterexample_report(found: &Counterexample, replay: String) -> CounterexampleReport {
    CounterexampleReport::of_case(
        &found.shrunk.case,
        found.shrunk.schedule.clone(),
        found.found_after,
        replay,
    )
}

impl CounterexampleReport {
    /// How big the minimal schedule is, in words: "3 wire steps", "5 steps", or, for a
    /// free-running fleet round (whose seed is its only schedule), "a fleet round".
    pub fn size(&self) -> String {
        match (&self.wire_schedule, self.schedule.steps.len()) {
            (Some(wire), _) => format!("{} wire steps", wire.steps),
            (None, 0) => "a fleet round".to_owned(),
            (None, steps) => format!("{steps} steps"),
        }
    }

    /// The minimal schedule's steps, one a line.
    pub fn schedule_lines(&self) -> String {
        match &self.wire_schedule {
            Some(wire) => wire.text.clone(),
            None => self.schedule.to_string(),
        }
    }

    /// The report of a failing case: its violations, schedule, timeline and diagram.
    pub fn of_case(
        result: &CaseResult,
        schedule: Schedule,
        found_after: (u32, std::time::Duration),
        replay: String,
    ) -> CounterexampleReport {
        let (lanes, diagram) = diagram(&result.history, &result.violations);
        CounterexampleReport {
            violations: result.violations.iter().map(violation_report).collect(),
            schedule,
            timeline: result.history.timeline(),
            lanes,
            diagram,
            found_after_cases: found_after.0,
            found_after_ms: found_after.1.as_millis() as u64,
            seed_replay: replay.clone(),
            replay,
            schedule_file: None,
            wire_schedule: None,
        }
    }
}

impl Report {
    /// An empty report starting now.
    pub fn new(shard: Option<(u32, u32)>) -> Report {
        Report {
            racecert_version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: crate::contract::log::timestamp_now(),
            shard,
            suites: Vec::new(),
            interrupted: None,
        }
    }

    /// The run's verdict: the worst of its suites' (an interrupted run is never PASSED: it
    /// is INCONCLUSIVE unless a suite failed).
    pub fn verdict(&self) -> Verdict {
        let worst = self
            .suites
            .iter()
            .map(SuiteOutcome::verdict)
            .max()
            .unwrap_or(Verdict::Inconclusive);
        if self.interrupted.is_some() {
            worst.max(Verdict::Inconclusive)
        } else {
            worst
        }
    }

    /// Whether the run earned a PASS: every suite as expected and everything in scope landed.
    pub fn passed(&self) -> bool {
        self.verdict() == Verdict::Passed
    }

    /// Joins shard reports into one (suites in name order; a suite present twice is an error).
    pub fn merge(reports: Vec<Report>) -> Result<Report> {
        let mut merged = Report::new(None);
        if let Some(first) = reports.first() {
            merged.started_at = first.started_at.clone();
        }
        for report in reports {
            // A shard cut short makes the whole run partial.
            if merged.interrupted.is_none() {
                merged.interrupted = report.interrupted;
            }
            for suite in report.suites {
                if merged
                    .suites
                    .iter()
                    .any(|s| s.name == suite.name && s.defects == suite.defects)
                {
                    return Err(Error::Config(format!(
                        "suite {} appears in more than one shard report",
                        suite.name
                    )));
                }
                merged.suites.push(suite);
            }
        }
        merged
            .suites
            .sort_by(|a, b| (&a.name, &a.defects).cmp(&(&b.name, &b.defects)));
        Ok(merged)
    }

    /// The terminal summary without colour.
    pub fn terminal(&self) -> String {
        self.terminal_with(false)
    }

    /// The terminal summary: per suite cases, verdict, time; per violation the invariant, seed
    /// and replay command. `color` marks verdicts with ANSI colours (for a terminal only).
    pub fn terminal_with(&self, color: bool) -> String {
        let paint = |text: &str, code: &str| {
            if color {
                format!("\x1b[{code}m{text}\x1b[0m")
            } else {
                text.to_owned()
            }
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<26} {:<26} {:>6} {:>9} {:>8}  verdict",
            "suite", "defects", "cases", "time", "budget"
        );
        for suite in &self.suites {
            let verdict = match (&suite.error, suite.held, suite.expect_pass) {
                (Some(_), _, _) => "ERROR",
                (None, true, true) if !suite.not_covered.is_empty() => "INCONCLUSIVE",
                (None, true, true) => "pass",
                (None, false, false) => "caught (expected)",
                (None, false, true) => "FAIL",
                (None, true, false) => "NOT CAUGHT",
            };
            let defects = if suite.defects.is_empty() {
                "-".to_owned()
            } else {
                suite.defects.join(",")
            };
            let verdict = match suite.verdict() {
                Verdict::Passed => paint(verdict, "32"),
                Verdict::Inconclusive => paint(verdict, "1;33"),
                Verdict::Failed => paint(verdict, "1;31"),
            };
            let budget = suite.budget_ms.map_or("cases".to_owned(), |ms| {
                format!("{:.1}s", ms as f64 / 1000.0)
            });
            let _ = writeln!(
                out,
                "{:<26} {:<26} {:>6} {:>8.1}s {budget:>8}  {verdict}",
                suite.name,
                defects,
                suite.cases_run,
                suite.elapsed_ms as f64 / 1000.0
            );
            // Landed / applied per kind, from the evidence; why a kind in scope fell short.
            if !suite.coverage.is_empty() {
                let counts: Vec<String> = suite
                    .coverage
                    .iter()
                    .map(|row| format!("{} {}/{}", row.fault, row.landed, row.applied))
                    .collect();
                let _ = writeln!(out, "    landed/applied: {}", counts.join(", "));
            }
            for row in &suite.coverage {
                if let Some(why) = &row.short {
                    let _ = writeln!(
                        out,
                        "    not covered: {} ({why}; target: {})",
                        row.fault, row.target
                    );
                }
                if let Some(why) = &row.out_of_scope {
                    let _ = writeln!(out, "    out of scope: {} ({why})", row.fault);
                }
            }
            if !suite.not_judged.is_empty() {
                let _ = writeln!(
                    out,
                    "    not judged (round trips not recorded): {}",
                    suite.not_judged.join(", ")
                );
            }
            if let Some(error) = &suite.error {
                let _ = writeln!(out, "    harness error: {error}");
            }
            if let Some(found) = &suite.counterexample {
                for violation in &found.violations {
                    let _ = writeln!(
                        out,
                        "    violated {}: {} (seed {}, {})",
                        violation.invariant,
                        violation.observed,
                        suite.seed,
                        found.size()
                    );
                }
                let _ = writeln!(out, "    replay: {}", found.replay);
            }
        }
        let verdict = match (&self.interrupted, self.verdict()) {
            (Some(signal), _) => paint(
                &format!("certification INTERRUPTED by {signal} (partial report)"),
                "1;33",
            ),
            (None, Verdict::Passed) => paint("certification PASSED", "1;32"),
            (None, Verdict::Inconclusive) if self.suites.is_empty() => paint(
                "certification INCONCLUSIVE: nothing was certified (no suite ran)",
                "1;33",
            ),
            (None, Verdict::Inconclusive) => {
                let short: Vec<String> = self
                    .suites
                    .iter()
                    .filter(|s| s.verdict() == Verdict::Inconclusive)
                    .map(|s| format!("{}: {}", s.name, s.not_covered.join(", ")))
                    .collect();
                paint(
                    &format!(
                        "certification INCONCLUSIVE: fault kinds that never landed on their target: {}",
                        short.join("; ")
                    ),
                    "1;33",
                )
            }
            (None, Verdict::Failed) => paint("certification FAILED", "1;31"),
        };
        let _ = writeln!(out, "{verdict}");
        out
    }

    /// JUnit XML: one test suite per racecert suite, one test case per invariant.
    pub fn junit(&self) -> Result<String> {
        use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
        let mut report = quick_junit::Report::new("racecert");
        for suite in &self.suites {
            let mut junit_suite = TestSuite::new(format!(
                "{}{}",
                suite.name,
                if suite.defects.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", suite.defects.join(","))
                }
            ));
            junit_suite.set_time(std::time::Duration::from_millis(suite.elapsed_ms));
            let broken: Vec<&ViolationReport> = suite
                .counterexample
                .iter()
                .flat_map(|c| c.violations.iter())
                .collect();
            for invariant in crate::check::Invariant::own() {
                let failures: Vec<&&ViolationReport> = broken
                    .iter()
                    .filter(|v| v.invariant == invariant.name())
                    .collect();
                let status = if let Some(error) = &suite.error {
                    let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                    status.set_message(error.clone());
                    status
                } else if failures.is_empty() {
                    TestCaseStatus::success()
                } else if !suite.expect_pass {
                    // An expected catch is a success of the suite.
                    TestCaseStatus::success()
                } else {
                    let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    status.set_message(failures[0].observed.clone());
                    status.set_description(
                        suite
                            .counterexample
                            .as_ref()
                            .map(|c| format!("{}\nreplay: {}", c.timeline, c.replay))
                            .unwrap_or_default(),
                    );
                    status
                };
                let mut case = TestCase::new(invariant.name(), status);
                case.set_classname(format!("racecert.{}", suite.name));
                junit_suite.add_test_case(case);
            }
            // The coverage a PASS needs, as a test of its own: an INCONCLUSIVE suite is not a
            // green one.
            let status = if suite.verdict() == Verdict::Inconclusive {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_type("inconclusive");
                status.set_message(format!(
                    "INCONCLUSIVE: never landed on their target: {}",
                    suite.not_covered.join(", ")
                ));
                status.set_description(
                    suite
                        .coverage
                        .iter()
                        .filter_map(|row| {
                            row.short
                                .as_ref()
                                .map(|why| format!("{}: {why}", row.fault))
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
                status
            } else {
                TestCaseStatus::success()
            };
            let mut case = TestCase::new("fault-coverage", status);
            case.set_classname(format!("racecert.{}", suite.name));
            junit_suite.add_test_case(case);
            report.add_test_suite(junit_suite);
        }
        report
            .to_string()
            .map_err(|err| Error::other(format!("JUnit serialisation: {err}")))
    }

    /// The HTML report.
    pub fn html(&self) -> String {
        let mut out = String::new();
        out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        out.push_str("<title>racecert certification report</title><style>");
        out.push_str("body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}.pass{color:#176f2c}.fail{color:#b00020;font-weight:bold}.inconclusive{color:#9a6700;font-weight:bold}pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}svg{border:1px solid #ddd;background:#fff}");
        out.push_str("</style></head><body>\n");
        let _ = writeln!(
            out,
            "<h1>racecert certification report</h1><p>racecert {} &middot; started {} &middot; <span class=\"{}\">{}</span></p>",
            esc(&self.racecert_version),
            esc(&self.started_at),
            match self.verdict() {
                Verdict::Passed => "pass",
                Verdict::Inconclusive => "inconclusive",
                Verdict::Failed => "fail",
            },
            self.verdict().word()
        );
        out.push_str("<table><tr><th>suite</th><th>defects</th><th>cases</th><th>time</th><th>verdict</th><th>not covered</th></tr>\n");
        for suite in &self.suites {
            let _ = writeln!(
                out,
                "<tr><td><a href=\"#{name}\">{name}</a></td><td>{}</td><td>{}</td><td>{:.1} s</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                esc(&suite.defects.join(", ")),
                suite.cases_run,
                suite.elapsed_ms as f64 / 1000.0,
                match suite.verdict() {
                    Verdict::Passed => "pass",
                    Verdict::Inconclusive => "inconclusive",
                    Verdict::Failed => "fail",
                },
                if suite.error.is_some() {
                    "error"
                } else if !suite.held {
                    "counterexample"
                } else if !suite.not_covered.is_empty() {
                    "INCONCLUSIVE: held, but not everything in scope landed"
                } else {
                    "every invariant held, every fault kind landed"
                },
                esc(&suite.not_covered.join(", ")),
                name = esc(&suite.name),
            );
        }
        out.push_str("</table>\n");
        for suite in &self.suites {
            let _ = writeln!(out, "<h2 id=\"{0}\">{0}</h2>", esc(&suite.name));
            out.push_str(
                "<table><tr><th>fault</th><th>target path</th><th>landed / applied</th><th>note</th></tr>",
            );
            for row in &suite.coverage {
                let note = match (&row.short, &row.out_of_scope) {
                    (Some(why), _) => format!("<span class=\"inconclusive\">{}</span>", esc(why)),
                    (None, Some(why)) => format!("out of scope: {}", esc(why)),
                    (None, None) => String::new(),
                };
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{} / {}</td><td>{note}</td></tr>",
                    esc(&row.fault),
                    esc(&row.target),
                    row.landed,
                    row.applied
                );
            }
            out.push_str("</table>\n");
            if let Some(found) = &suite.counterexample {
                for violation in &found.violations {
                    let _ = writeln!(
                        out,
                        "<h3 class=\"fail\">{}</h3><p>should hold: {}<br>observed: {}</p><pre>{}</pre>",
                        esc(&violation.invariant),
                        esc(&violation.should_hold),
                        esc(&violation.observed),
                        esc(&violation.evidence.join("\n"))
                    );
                }
                let _ = writeln!(
                    out,
                    "<p>minimal schedule ({}), found after {} case(s); replay: <code>{}</code></p><pre>{}</pre>",
                    found.size(),
                    found.found_after_cases,
                    esc(&found.replay),
                    esc(&found.schedule_lines())
                );
                out.push_str(&svg::sequence_diagram(&found.lanes, &found.diagram));
                let _ = writeln!(out, "<h4>timeline</h4><pre>{}</pre>", esc(&found.timeline));
            }
            for (process, (stdout, stderr)) in &suite.worker_outputs {
                let _ = writeln!(
                    out,
                    "<details><summary>worker {} output</summary><pre>{}</pre><pre>{}</pre></details>",
                    esc(process),
                    esc(stdout),
                    esc(stderr)
                );
            }
        }
        out.push_str("</body></html>\n");
        out
    }

    /// Writes `report.json`, `junit.xml` and `report.html` into `dir`.
    pub fn write_all(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
        let write = |name: &str, contents: String| -> Result<()> {
            let path = dir.join(name);
            std::fs::write(&path, contents).map_err(|err| Error::io_at(&path, err))
        };
        write(
            "report.json",
            serde_json::to_string_pretty(self).map_err(|err| Error::other(err.to_string()))?,
        )?;
        write("junit.xml", self.junit()?)?;
        write("report.html", self.html())
    }

    /// Reads a `report.json`.
    pub fn read(path: &Path) -> Result<Report> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::io_at(path, err))?;
        serde_json::from_str(&text).map_err(|err| {
            Error::Config(format!(
                "{}:{}:{}: not a racecert report: {err}",
                path.display(),
                err.line(),
                err.column()
            ))
        })
    }
}

/// Escapes text for HTML and SVG.
pub(crate) fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
