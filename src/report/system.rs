//! Reports of a system run (`racecert certify --system`): the verdict, each failing case's
//! violations with the audit rows that prove them, its sequence diagram (text here, SVG in the
//! HTML) and the command that replays it.

use super::{DiagramEvent, esc, svg};
use crate::check::Verdict;
use crate::check::coverage::{Coverage, Scope};
use crate::fault::FaultKind;
use crate::runner::system::{SystemCase, SystemOutcome, replay_command, sequence_text};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The terminal report.
pub fn system_text(outcome: &SystemOutcome, file: &Path) -> String {
    let mut out = String::new();
    let verdict = outcome.verdict();
    write_summary(&mut out, outcome, verdict);
    // Landed / applied per kind in scope, from the evidence; why a kind fell short.
    let coverage = outcome.coverage();
    let scope = outcome.scope();
    let short: BTreeMap<_, _> = scope.unlanded(&coverage).into_iter().collect();
    write_coverage(&mut out, &scope, &coverage, &short);
    let blind: Vec<&SystemCase> = outcome
        .cases
        .iter()
        .filter(|c| c.liveness_blind.is_some())
        .collect();
    write_not_judged(&mut out, outcome, &blind);
    if verdict == Verdict::Inconclusive {
        write_inconclusive(&mut out, &short, &blind);
    }
    write_counterexamples(&mut out, outcome, file);
    out
}

/// The verdict, the workers' start-up times, the recovery bound, and one line a case.
fn write_summary(out: &mut String, outcome: &SystemOutcome, verdict: Verdict) {
    let _ = writeln!(
        out,
        "system {}: {} ({} case(s), seed {})",
        outcome.system,
        verdict.word(),
        outcome.cases.len(),
        outcome.seed
    );
    let starts: Vec<String> = outcome
        .startup_ms
        .iter()
        .map(|(w, ms)| format!("{w} {ms} ms"))
        .collect();
    let _ = writeln!(out, "worker start-up: {}", starts.join(", "));
    if !outcome.recovery.is_empty() {
        let _ = writeln!(
            out,
            "liveness judged after every held model call ended and the recovery bound: {}",
            outcome.recovery
        );
    }
    for case in &outcome.cases {
        let _ = writeln!(
            out,
            "  case {:>2} {:<20} {:<5} {:<11} {} final write(s), {} model call(s), {} ms",
            case.number,
            case.fault.name(),
            if case.violations.is_empty() {
                "ok"
            } else {
                "FAIL"
            },
            match (&case.effect, case.landed) {
                (_, true) => "landed",
                (None, _) => "not applied",
                (Some(_), false) => "missed",
            },
            case.final_writes,
            case.model_calls,
            case.elapsed_ms
        );
        if let Some(
            crate::fault::Effect::Missed { why, .. }
            | crate::fault::Effect::NotApplicable { why, .. },
        ) = &case.effect
        {
            let _ = writeln!(out, "           the fault did nothing: {why}");
        }
    }
}

/// Landed / applied per kind in scope, with why a kind fell `short`.
fn write_coverage(
    out: &mut String,
    scope: &Scope,
    coverage: &Coverage,
    short: &BTreeMap<FaultKind, String>,
) {
    let _ = writeln!(out, "fault coverage (landed / applied):");
    for kind in &scope.kinds {
        let (applied, landed) = coverage.faults.get(kind).copied().unwrap_or((0, 0));
        let _ = writeln!(
            out,
            "  {:<20} {landed} / {applied}{}",
            kind.name(),
            short
                .get(kind)
                .map(|why| format!("  not covered: {why} (target: {})", kind.target_path()))
                .unwrap_or_default()
        );
    }
}

/// What was not judged: invariants no case could judge, requests the API refused again, and
/// the `blind` cases whose liveness is not judged.
fn write_not_judged(out: &mut String, outcome: &SystemOutcome, blind: &[&SystemCase]) {
    // What no case judged is the description's doing; what one case could not judge is said
    // with that case.
    let described: Vec<&str> = outcome
        .cases
        .first()
        .map(|first| {
            first
                .not_judged
                .iter()
                .filter(|i| outcome.cases.iter().all(|c| c.not_judged.contains(i)))
                .map(|i| i.name())
                .collect()
        })
        .unwrap_or_default();
    if !described.is_empty() {
        let _ = writeln!(
            out,
            "not judged (the system's description gives nothing to judge them by): {}",
            described.join(", ")
        );
    }
    for case in &outcome.cases {
        if let Some(why) = &case.refused {
            let _ = writeln!(
                out,
                "case {} ({}): protection: the API refused the request submitted again ({why})",
                case.number, case.fault
            );
        }
    }
    for case in blind {
        let _ = writeln!(
            out,
            "case {} ({}): liveness not judged: {}",
            case.number,
            case.fault,
            case.liveness_blind.as_deref().unwrap_or_default()
        );
    }
}

/// Why an INCONCLUSIVE run is one: kinds that fell `short` of landing, `blind` cases.
fn write_inconclusive(
    out: &mut String,
    short: &BTreeMap<FaultKind, String>,
    blind: &[&SystemCase],
) {
    let kinds: Vec<&str> = short.keys().map(|k| k.name()).collect();
    if !kinds.is_empty() {
        let _ = writeln!(
            out,
            "INCONCLUSIVE: every invariant held, but these fault kinds never landed on their target: {} (more --budget or --cases, or see why above)",
            kinds.join(", ")
        );
    }
    if !blind.is_empty() {
        let _ = writeln!(
            out,
            "INCONCLUSIVE: every invariant judged held, but {} case(s) ended while racecert itself still held their work (their liveness is not judged)",
            blind.len()
        );
    }
}

/// Every failing case (a `--keep-going` run has more than one), each with its diagram and
/// the command that replays it; the first one with when it was found.
fn write_counterexamples(out: &mut String, outcome: &SystemOutcome, file: &Path) {
    for (index, case) in outcome
        .cases
        .iter()
        .filter(|c| !c.violations.is_empty())
        .enumerate()
    {
        let found = if index == 0 {
            format!(
                ", found after {} ms",
                outcome.first_failure_ms.unwrap_or_default()
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "\ncounterexample: case {} (fault {}), request {}{found}",
            case.number, case.fault, case.request,
        );
        for violation in &case.violations {
            let _ = writeln!(
                out,
                "  violated {}: {}",
                violation.invariant, violation.observed
            );
            for line in &violation.evidence {
                let _ = writeln!(out, "    {line}");
            }
        }
        let _ = writeln!(out, "\nsequence diagram (time since the case started):");
        out.push_str(&sequence_text(case));
        let _ = writeln!(
            out,
            "\nreplay: {}",
            replay_command(file, outcome.seed, case.number, case.fault)
        );
    }
}

/// A self-contained HTML page with every failing case's SVG sequence diagram.
pub fn system_html(outcome: &SystemOutcome, file: &Path) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><meta charset=\"utf-8\"><title>racecert: {}</title><body style=\"font-family:sans-serif\"><h1>{} : {}</h1>",
        esc(&outcome.system),
        esc(&outcome.system),
        if outcome.passed() { "PASS" } else { "FAIL" }
    );
    for case in outcome.cases.iter().filter(|c| !c.violations.is_empty()) {
        let _ = write!(
            out,
            "<h2>case {} ({})</h2><p><code>{}</code></p><ul>",
            case.number,
            esc(case.fault.name()),
            esc(&replay_command(file, outcome.seed, case.number, case.fault))
        );
        for v in &case.violations {
            let _ = write!(
                out,
                "<li><b>{}</b>: {}<pre>{}</pre></li>",
                esc(v.invariant.name()),
                esc(&v.observed),
                esc(&v.evidence.join("\n"))
            );
        }
        out.push_str("</ul>");
        let events: Vec<DiagramEvent> = case
            .diagram
            .iter()
            .enumerate()
            .map(|(step, a)| DiagramEvent {
                step,
                from: a.from.clone(),
                to: a.to.clone(),
                label: format!("+{}ms {}", a.at_ms, a.label),
                kind: match a.kind.as_str() {
                    "write" => "violation".into(),
                    other => other.into(),
                },
            })
            .collect();
        out.push_str(&svg::sequence_diagram(&case.lanes, &events));
    }
    let _ = write!(
        out,
        "<h2>worker output</h2>{}</body>",
        outcome
            .outputs
            .iter()
            .map(|(k, v)| format!("<h3>{}</h3><pre>{}</pre>", esc(k), esc(v)))
            .collect::<String>()
    );
    out
}

/// The workers' lines as `docker compose logs` prints them (`worker-a  | LINE`), in time order:
/// the incident log of a system run, which `racecert replay LOG --system FILE` reads back.
pub fn workers_log(outcome: &SystemOutcome) -> String {
    let width = outcome
        .log
        .iter()
        .map(|l| l.worker.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for line in &outcome.log {
        let _ = writeln!(out, "{:<width$} | {}", line.worker, line.line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Violation;
    use crate::fault::FaultKind;
    use std::collections::BTreeMap;

    /// Case 1 of request `r`: its fault and the invariants it broke; no writes, no diagram.
    fn case(fault: FaultKind, broke: &[&str], final_writes: usize) -> SystemCase {
        SystemCase {
            number: 1,
            fault,
            request: "r".into(),
            writes: Vec::new(),
            violations: broke
                .iter()
                .map(|i| Violation {
                    invariant: i.parse().expect("an invariant"),
                    observed: String::new(),
                    evidence: Vec::new(),
                })
                .collect(),
            not_judged: Vec::new(),
            effect: None,
            landed: false,
            diagram: Vec::new(),
            lanes: Vec::new(),
            elapsed_ms: 0,
            model_calls: 1,
            final_writes,
            liveness_blind: None,
            refused: None,
        }
    }
    #[test]
    fn a_keep_going_report_shows_every_counterexample_with_its_replay() {
        let mut first = case(FaultKind::KillPoolChild, &["no-lost-job"], 0);
        first.number = 2;
        let mut second = case(FaultKind::ForcedRestore, &["at-most-one-final-write"], 2);
        second.number = 5;
        let outcome = SystemOutcome {
            system: "s".into(),
            seed: 3,
            cases: vec![case(FaultKind::KillMain, &[], 1), first, second],
            startup_ms: BTreeMap::new(),
            first_failure_ms: Some(1200),
            outputs: BTreeMap::new(),
            log: Vec::new(),
            kinds: Vec::new(),
            recovery: "6000 ms, racecert's default".into(),
        };
        let text = crate::report::system::system_text(&outcome, std::path::Path::new("s.toml"));
        assert!(
            text.contains(
                "counterexample: case 2 (fault kill-pool-child), request r, found after 1200 ms"
            ) && text.contains("counterexample: case 5 (fault forced-restore), request r\n")
                && text.contains("violated at-most-one-final-write")
                && text.matches("\nreplay: ").count() == 2
                && text.contains("the recovery bound: 6000 ms, racecert's default"),
            "{text}"
        );
    }
}
