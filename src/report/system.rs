//! Reports of a system run (`racecert certify --system`): the verdict, each failing case's
//! violations with the audit rows that prove them, its sequence diagram (text here, SVG in the
//! HTML) and the command that replays it.

use super::{DiagramEvent, esc, svg};
use crate::runner::system::{SystemOutcome, replay_command, sequence_text};
use std::fmt::Write as _;
use std::path::Path;

/// The terminal report.
pub fn system_text(outcome: &SystemOutcome, file: &Path) -> String {
    let mut out = String::new();
    let verdict = outcome.verdict();
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
    // Landed / applied per kind in scope, from the evidence; why a kind fell short.
    let coverage = outcome.coverage();
    let scope = outcome.scope();
    let short: std::collections::BTreeMap<_, _> = scope.unlanded(&coverage).into_iter().collect();
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
    if let Some(case) = outcome.cases.iter().find(|c| !c.not_judged.is_empty()) {
        let names: Vec<&str> = case.not_judged.iter().map(|i| i.name()).collect();
        let _ = writeln!(
            out,
            "not judged (the system's description gives nothing to judge them by): {}",
            names.join(", ")
        );
    }
    if verdict == crate::check::Verdict::Inconclusive {
        let kinds: Vec<&str> = short.keys().map(|k| k.name()).collect();
        let _ = writeln!(
            out,
            "INCONCLUSIVE: every invariant held, but these fault kinds never landed on their target: {} (more --budget or --cases, or see why above)",
            kinds.join(", ")
        );
    }
    if let Some(case) = outcome.first_failure() {
        let _ = writeln!(
            out,
            "\ncounterexample: case {} (fault {}), request {}, found after {} ms",
            case.number,
            case.fault,
            case.request,
            outcome.first_failure_ms.unwrap_or_default()
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
    out
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
