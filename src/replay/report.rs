//! The text report of `racecert replay`: what was read, the stories, the diagnoses with their
//! lines, and per cause the schedule that re-creates it and how each run came out. Long logs are
//! summarised (the JSON report carries everything).

use super::reproduce::{Outcome, ReplayReport, Run, Verdict};
use super::{Analysis, parse};
use std::fmt::Write as _;

/// Stories shown in full before the rest are counted.
const STORIES_SHOWN: usize = 20;
/// Findings shown per cause before the rest are counted.
const FINDINGS_SHOWN: usize = 5;
/// Malformed lines listed.
const MALFORMED_SHOWN: usize = 20;

/// Found fields listed per seed field.
const KEYS_SHOWN: usize = 3;
/// Records listed as ambiguous.
const AMBIGUOUS_SHOWN: usize = 10;

impl Analysis {
    /// What was read: counts, shapes, where each field was found, what could not be used.
    fn reading_text(&self, out: &mut String) {
        let reading = &self.reading;
        let shapes: Vec<String> = reading
            .shapes
            .iter()
            .map(|(shape, n)| format!("{shape} ({n})"))
            .collect();
        let _ = writeln!(
            out,
            "read {} relevant line(s), {} unrelated, {} malformed{}",
            self.lines,
            self.unrelated,
            reading.malformed_count,
            if shapes.is_empty() {
                String::new()
            } else {
                format!("; shapes: {}", shapes.join(", "))
            }
        );
        self.fields_found_text(out);
        for container in &reading.containers {
            let _ = writeln!(
                out,
                "line {} holds {} records ({}), numbered {} to {}; the lines after it are numbered on from there",
                container.line,
                container.records,
                container.shape,
                container.first,
                container.first + container.records - 1
            );
        }
        self.unused_lines_text(out);
        if let Some((_, workers)) = reading.ambiguous.first() {
            let lines: Vec<String> = reading
                .ambiguous
                .iter()
                .take(AMBIGUOUS_SHOWN)
                .map(|(line, _)| line.to_string())
                .collect();
            let _ = writeln!(
                out,
                "attribution ambiguous on {} line(s) ({}{}): two workers' output is interleaved with nothing to tell them apart ({}); their lines are kept as one unnamed worker's, each receive its own attempt, never joined to an attempt that had ended",
                reading.ambiguous.len(),
                lines.join(", "),
                if reading.ambiguous.len() > AMBIGUOUS_SHOWN {
                    ", ..."
                } else {
                    ""
                },
                workers.replace('|', " or ")
            );
        }
        if reading.not_kept > 0 {
            let _ = writeln!(
                out,
                "{} more relevant line(s) were read but not kept (over {} kept lines): narrow with --request ID",
                reading.not_kept,
                parse::MAX_KEPT
            );
        }
    }

    /// Where each seed field was found: the first keys it was read from, with their counts.
    fn fields_found_text(&self, out: &mut String) {
        let reading = &self.reading;
        let mut fields: Vec<String> = Vec::new();
        for found in &reading.found {
            let same: Vec<&parse::Found> = reading
                .found
                .iter()
                .filter(|f| f.field == found.field)
                .collect();
            if !std::ptr::eq(same[0], found) {
                continue;
            }
            let keys: Vec<String> = same
                .iter()
                .take(KEYS_SHOWN)
                .map(|f| {
                    if f.key == f.field {
                        format!("{} ({} from line {})", f.key, f.records, f.first_line)
                    } else {
                        format!("`{}` ({} from line {})", f.key, f.records, f.first_line)
                    }
                })
                .collect();
            fields.push(format!("{} <- {}", found.field, keys.join(", ")));
        }
        if !fields.is_empty() {
            let _ = writeln!(out, "fields found:");
            for field in fields {
                let _ = writeln!(out, "  {field}");
            }
        }
    }

    /// The lines that could not be used: malformed ones, and samples of the unrelated ones.
    fn unused_lines_text(&self, out: &mut String) {
        let reading = &self.reading;
        for malformed in self.malformed.iter().take(MALFORMED_SHOWN) {
            let _ = writeln!(
                out,
                "  malformed line {}: {}{}",
                malformed.line_no,
                malformed.reason,
                if malformed.text.is_empty() {
                    String::new()
                } else {
                    format!("; it looked like: {}", malformed.text)
                }
            );
        }
        if reading.malformed_count > MALFORMED_SHOWN {
            let _ = writeln!(
                out,
                "  ... and {} more malformed line(s)",
                reading.malformed_count - MALFORMED_SHOWN.min(self.malformed.len())
            );
        }
        for sample in &reading.unrelated_samples {
            let _ = writeln!(
                out,
                "  unused line {} ({}): {}",
                sample.line_no, sample.reason, sample.text
            );
        }
        if !reading.unrelated_samples.is_empty() {
            let _ = writeln!(
                out,
                "  (if these carry the request under a name of your own, map it: --field request_id=PATH)"
            );
        }
    }

    /// Human-readable story and diagnosis.
    pub fn text(&self) -> String {
        let mut out = String::new();
        self.reading_text(&mut out);
        let reconstruction = &self.reconstruction;
        for story in reconstruction.requests.iter().take(STORIES_SHOWN) {
            let _ = writeln!(out, "request {}:", story.request_id);
            for attempt in &story.attempts {
                let statuses: Vec<String> = attempt
                    .events
                    .iter()
                    .map(|e| format!("{}@{}", e.status, e.line))
                    .collect();
                let _ = writeln!(
                    out,
                    "  attempt {} on {}: {}",
                    attempt.attempt,
                    attempt.who(),
                    statuses.join(" ")
                );
            }
            if !story.other.is_empty() {
                let statuses: Vec<String> = story
                    .other
                    .iter()
                    .map(|e| format!("{}@{}", e.status, e.line))
                    .collect();
                let _ = writeln!(out, "  not tied to an attempt: {}", statuses.join(" "));
            }
        }
        if reconstruction.requests.len() > STORIES_SHOWN {
            let _ = writeln!(
                out,
                "... and {} more request(s)",
                reconstruction.requests.len() - STORIES_SHOWN
            );
        }
        for cutover in &reconstruction.cutovers {
            let _ = writeln!(
                out,
                "cutover at line {}: {} -> {}",
                cutover.line,
                cutover.from.as_deref().unwrap_or("?"),
                cutover.to.as_deref().unwrap_or("?")
            );
        }
        for mark in &reconstruction.marks {
            let _ = writeln!(
                out,
                "{} at line {}{}",
                mark.status,
                mark.line,
                mark.worker_id
                    .as_deref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            );
        }
        if self.findings.is_empty() {
            out.push_str("diagnosis: no race in these lines\n");
        }
        let mut shown: Vec<(super::Cause, usize)> = Vec::new();
        for finding in &self.findings {
            let count = match shown.iter_mut().find(|(c, _)| *c == finding.cause) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    shown.push((finding.cause, 1));
                    1
                }
            };
            if count <= FINDINGS_SHOWN {
                let _ = writeln!(
                    out,
                    "diagnosis {}: {} (lines {})",
                    finding.cause,
                    finding.explanation,
                    finding
                        .lines
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        for (cause, count) in shown {
            if count > FINDINGS_SHOWN {
                let _ = writeln!(
                    out,
                    "diagnosis {cause}: ... and {} more finding(s)",
                    count - FINDINGS_SHOWN
                );
            }
        }
        out
    }
}

impl ReplayReport {
    /// The analysis, then per cause its schedule and how each run came out.
    pub fn text(&self) -> String {
        let mut out = self.analysis.text();
        if self.reproductions.is_empty() {
            return out;
        }
        let _ = writeln!(
            out,
            "\nreproductions against {}: {}",
            self.worker,
            match &self.defects_given {
                Some(defects) => format!(
                    "every cause with {} (as given), then the safe reference",
                    defects.join(", ")
                ),
                None => "each cause with the defect that switches off the protection against it, then the safe reference".to_owned(),
            }
        );
        let (mut reproduced, mut prevented, mut not_built) = (0, 0, 0);
        for reproduction in &self.reproductions {
            let _ = write!(
                out,
                "\ncause {} (request {}): ",
                reproduction.cause, reproduction.request_id
            );
            let (plan, runs) = match &reproduction.outcome {
                Outcome::CouldNotBeBuilt { reason } => {
                    not_built += 1;
                    let _ = writeln!(out, "could not be built: {reason}");
                    continue;
                }
                Outcome::Ran { plan, runs } => (plan, runs),
            };
            let _ = writeln!(
                out,
                "{} ({}); without protection it breaks {}",
                plan.shape,
                plan.shape.describe(),
                plan.breaks
            );
            let _ = writeln!(
                out,
                "  workers: {}",
                plan.workers
                    .iter()
                    .map(|w| format!("{} ({})", w.id, w.version))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if !plan.renamed.is_empty() {
                let _ = writeln!(
                    out,
                    "  versions renamed onto the test bed's: {}",
                    plan.renamed
                        .iter()
                        .map(|(logged, run)| format!("{logged} -> {run}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            for line in plan.schedule.to_string().lines() {
                let _ = writeln!(out, "  {line}");
            }
            let protections: Vec<&str> = runs
                .iter()
                .flat_map(|r| r.protections.iter().map(String::as_str))
                .collect();
            for run in runs {
                reproduced += usize::from(run.verdict == Verdict::Reproduced);
                prevented += usize::from(run.verdict == Verdict::Prevented);
                run_text(&mut out, reproduction.cause, plan.breaks, run, &protections);
            }
        }
        let _ = writeln!(
            out,
            "\nsummary: {} cause(s); {reproduced} reproduced, {prevented} prevented by the safe reference, {not_built} could not be built",
            self.reproductions.len()
        );
        out
    }
}

fn run_text(
    out: &mut String,
    cause: super::Cause,
    breaks: crate::check::Invariant,
    run: &Run,
    protections: &[&str],
) {
    let again = if run.diagnosed_again {
        format!("; the run's own log shows {cause} again")
    } else {
        String::new()
    };
    let defects = run.defects.join(", ");
    match run.verdict {
        Verdict::Reproduced => {
            let observed = run
                .violations
                .iter()
                .find(|v| v.invariant == breaks)
                .map(|v| v.observed.as_str())
                .unwrap_or_default();
            let others: Vec<&str> = run
                .violations
                .iter()
                .map(|v| v.invariant.name())
                .filter(|name| *name != breaks.name())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let _ = writeln!(
                out,
                "  reproduced with {defects}: {breaks} broke ({observed}){}{again}",
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; also broke {}", others.join(", "))
                }
            );
        }
        Verdict::NotReproduced => {
            let _ = writeln!(
                out,
                "  not reproduced with {defects}: {breaks} held{}",
                if run.violations.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (broke {})",
                        run.violations
                            .iter()
                            .map(|v| v.invariant.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
            timeline(out, run);
        }
        Verdict::Prevented => {
            let _ = writeln!(
                out,
                "  prevented by the safe reference{}: every invariant held",
                if protections.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", protections.join("; "))
                }
            );
        }
        Verdict::NotPrevented => {
            let _ = writeln!(out, "  not prevented by the safe reference:");
            for violation in &run.violations {
                let _ = writeln!(
                    out,
                    "    {} broke: {}",
                    violation.invariant.name(),
                    violation.observed
                );
                for line in &violation.evidence {
                    let _ = writeln!(out, "      {line}");
                }
            }
            timeline(out, run);
        }
    }
}

fn timeline(out: &mut String, run: &Run) {
    let _ = writeln!(out, "    timeline:");
    for line in run.timeline.lines() {
        let _ = writeln!(out, "      {line}");
    }
}
