//! A counterexample's sequence diagram as lanes and arrows, read from its history: what
//! [`svg`](super::svg) draws and the reports list.

use super::DiagramEvent;
use crate::check::Violation;
use crate::contract::log::Status;
use crate::history::{EventKind, History};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Lanes and arrows of a counterexample's sequence diagram. When the workers' round trips were
/// recorded, the arrows to Redis, Postgres and the backends are those round trips (what each
/// worker really sent, with the reply), and the workers' own log lines are notes on their lanes.
pub fn diagram(history: &History, violations: &[Violation]) -> (Vec<String>, Vec<DiagramEvent>) {
    let wired = history
        .events
        .iter()
        .any(|e| matches!(e.kind, EventKind::Wire(_)));
    let (lanes, lane_of) = diagram_lanes(history, wired);
    let evidence: Vec<&str> = violations
        .iter()
        .flat_map(|v| v.evidence.iter().map(String::as_str))
        .collect();
    let mut events = Vec::new();
    for request in &history.requests {
        events.push(DiagramEvent {
            step: 0,
            from: "API".into(),
            to: "queue".into(),
            label: format!("submit {}", request.request_id),
            kind: "message".into(),
        });
    }
    for event in &history.events {
        let drawn = match &event.kind {
            EventKind::Step(_) => None,
            EventKind::Fault(effect) => Some(fault_event(event.step, effect, &lanes)),
            EventKind::Harness(_) => None,
            EventKind::Wire(wire) if wire.trip.is_effectless() => None,
            EventKind::Wire(wire) => Some(wire_event(event.step, wire, &lane_of, history)),
            EventKind::Worker(line) => worker_event(event.step, line, wired, &lanes, &evidence),
        };
        events.extend(drawn);
    }
    (lanes, events)
}

/// The diagram's lanes, left to right (API, queue, workers, Redis, Postgres, backends), and
/// each worker id's lane.
fn diagram_lanes(history: &History, wired: bool) -> (Vec<String>, BTreeMap<String, String>) {
    let mut workers: Vec<String> = Vec::new();
    let mut backends: Vec<String> = Vec::new();
    // Worker id -> its lane, once its first line names its version.
    let mut lane_of: BTreeMap<String, String> = BTreeMap::new();
    for event in &history.events {
        if let EventKind::Wire(wire) = &event.kind
            && let Some(version) = wire.service.strip_prefix("backend:")
        {
            let lane = format!("backend {version}");
            if !backends.contains(&lane) {
                backends.push(lane);
            }
        }
        if let EventKind::Worker(line) = &event.kind {
            if let (Some(worker), Some(version)) =
                (line.get("worker_id"), line.get("model_version"))
                && !lane_of.contains_key(worker)
            {
                lane_of.insert(worker.to_owned(), format!("{worker} ({version})"));
            }
            if let (Some(worker), Some(version)) =
                (line.get("worker_id"), line.get("model_version"))
            {
                let lane = format!("{worker} ({version})");
                if !workers.contains(&lane) {
                    workers.push(lane);
                }
            }
            if let Some(backend) = line.get("backend_endpoint").filter(|b| *b != "-")
                && !wired
                && line.is(Status::InferenceStarted)
                && !backends.contains(&backend.to_owned())
            {
                backends.push(backend.to_owned());
            }
        }
    }
    for event in &history.events {
        if let EventKind::Wire(wire) = &event.kind
            && !lane_of.contains_key(&wire.worker)
        {
            lane_of.insert(wire.worker.clone(), wire.worker.clone());
            workers.push(wire.worker.clone());
        }
    }
    let mut lanes = vec!["API".to_owned(), "queue".to_owned()];
    lanes.extend(workers.iter().cloned());
    lanes.extend(["Redis".to_owned(), "Postgres".to_owned()]);
    lanes.extend(backends.iter().cloned());
    (lanes, lane_of)
}

/// A fault's band across every lane, labelled with what it did.
fn fault_event(step: usize, effect: &crate::fault::Effect, lanes: &[String]) -> DiagramEvent {
    let detail: Vec<String> = effect
        .fields()
        .into_iter()
        .filter(|(k, _)| *k != "idempotency_key")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    DiagramEvent {
        step,
        from: lanes[0].clone(),
        to: lanes[lanes.len() - 1].clone(),
        label: format!("{} {}", effect.name(), detail.join(" "))
            .trim()
            .to_owned(),
        kind: "fault".into(),
    }
}

/// A recorded round trip: an arrow from the worker's lane to the service it called.
fn wire_event(
    step: usize,
    wire: &crate::wire::WireEvent,
    lane_of: &BTreeMap<String, String>,
    history: &History,
) -> DiagramEvent {
    let from = lane_of
        .get(&wire.worker)
        .cloned()
        .unwrap_or_else(|| wire.worker.clone());
    let to = match wire.service.strip_prefix("backend:") {
        Some(version) => format!("backend {version}"),
        None if wire.service == "redis" => "Redis".to_owned(),
        None => "Postgres".to_owned(),
    };
    DiagramEvent {
        step,
        from,
        to,
        label: wire.trip.describe(history.namespace.as_deref()),
        kind: "wire".into(),
    }
}

/// A worker's log line with a status: an arrow (a note on its lane when the wire was
/// recorded), marked a violation when it is one or is evidence of one; None for other lines.
fn worker_event(
    step: usize,
    line: &crate::contract::log::LogLine,
    wired: bool,
    lanes: &[String],
    evidence: &[&str],
) -> Option<DiagramEvent> {
    let raw = line.status()?;
    let status = line.status_word();
    let worker = match (line.get("worker_id"), line.get("model_version")) {
        (Some(w), Some(v)) => format!("{w} ({v})"),
        _ => return None,
    };
    let backend = line.get("backend_endpoint").unwrap_or("-").to_owned();
    // With the wire recorded, the log says what the worker claims: a note.
    let (from, to) = if wired {
        (worker.clone(), worker.clone())
    } else {
        status_lanes(status, &worker, &backend)
    };
    let to = if lanes.contains(&to) {
        to
    } else {
        from.clone()
    };
    let from = if lanes.contains(&from) {
        from
    } else {
        to.clone()
    };
    let logfmt = line.to_logfmt();
    let violating = matches!(
        status,
        Some(Status::LateSuccess | Status::OverwriteDetected)
    ) || evidence.iter().any(|e| e.ends_with(&logfmt));
    let mut label = raw.to_owned();
    for key in [
        "generation",
        "served_model_version",
        "previous_model_version",
    ] {
        if let Some(value) = line.get(key) {
            let _ = write!(label, " {key}={value}");
        }
    }
    Some(DiagramEvent {
        step,
        from,
        to,
        label,
        kind: if violating { "violation" } else { "message" }.into(),
    })
}

/// The lanes a worker's line of `status` is an arrow between (from, to), as its log tells it.
fn status_lanes(status: Option<Status>, worker: &str, backend: &str) -> (String, String) {
    match status {
        Some(Status::JobReceived | Status::RetryDispatched) => {
            ("queue".to_owned(), worker.to_owned())
        }
        Some(Status::Acked) => (worker.to_owned(), "queue".to_owned()),
        Some(
            Status::LeaseAcquired
            | Status::DuplicateSkipped
            | Status::LeaseReleased
            | Status::LeaseLost
            | Status::CacheHit
            | Status::CacheMiss
            | Status::CacheWritten,
        ) => (worker.to_owned(), "Redis".to_owned()),
        Some(Status::InferenceStarted) => (worker.to_owned(), backend.to_owned()),
        Some(Status::TimeoutWaitingUpstream | Status::UpstreamFailed) => {
            (backend.to_owned(), worker.to_owned())
        }
        _ => (worker.to_owned(), "Postgres".to_owned()),
    }
}
