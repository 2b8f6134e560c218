//! Imperfect drain: the seed's question "do old workers still receive jobs after the rollout
//! started?", answered from the log. A worker took a job after its own stop signal (a SIGTERM,
//! Celery's warm shutdown, a drain), or a worker on the old version took a request that was first
//! seen after the cutover to the new one. A request accepted before the cutover and finished by
//! an old worker is a drain doing its job, not this cause.

use super::{Actor, Cause, Finding};
use crate::contract::log::Status;
use crate::replay::story::{Event, Reconstruction, RequestStory};

/// The line on which an attempt took its job: its receipt, else its first execution.
fn took(events: &[Event]) -> Option<&Event> {
    events
        .iter()
        .find(|e| e.word.is_some_and(Status::is_receive))
        .or_else(|| events.iter().find(|e| e.executes()))
}

pub(super) fn imperfect_drain(
    reconstruction: &Reconstruction,
    story: &RequestStory,
    findings: &mut Vec<Finding>,
) {
    let accepted = story.events().first().map(|(e, _)| (e.seq, e.line));
    for attempt in &story.attempts {
        let Some(took) = took(&attempt.events) else {
            continue;
        };
        // After its own stop signal, unless it started again in between (a new process).
        let stop = reconstruction
            .marks
            .iter()
            .rfind(|m| {
                m.status == Status::StopRequested
                    && m.seq < took.seq
                    && m.worker_id.as_deref() == Some(attempt.worker_id.as_str())
            })
            .filter(|stop| {
                reconstruction
                    .mark_between(
                        &attempt.worker_id,
                        &[Status::WorkerStarted],
                        stop.seq,
                        took.seq,
                    )
                    .is_none()
            });
        // On the old version, for a request first seen after the cutover.
        let cutover = attempt.model_version.as_deref().and_then(|version| {
            let (accepted_seq, accepted_line) = accepted?;
            let cutover = reconstruction
                .cutovers
                .iter()
                .rfind(|c| c.seq < accepted_seq)?;
            let old = match (cutover.from.as_deref(), cutover.to.as_deref()) {
                (Some(from), _) => from == version,
                (None, Some(to)) => to != version,
                (None, None) => false,
            };
            old.then_some((cutover, accepted_line))
        });
        if stop.is_none() && cutover.is_none() {
            continue;
        }
        let mut because = Vec::new();
        let mut lines = vec![took.line];
        if let Some(stop) = stop {
            because.push(format!("after its own stop signal at line {}", stop.line));
            lines.push(stop.line);
        }
        if let Some((cutover, accepted_line)) = cutover {
            because.push(format!(
                "a request first seen at line {accepted_line}, after the cutover{} at line {}",
                cutover
                    .to
                    .as_deref()
                    .map(|v| format!(" to {v}"))
                    .unwrap_or_default(),
                cutover.line
            ));
            lines.extend([cutover.line, accepted_line]);
        }
        findings.push(Finding::new(
            Cause::ImperfectDrain,
            &story.request_id,
            format!(
                "{} took request {} at line {}, {}: old workers still received jobs after the rollout started (imperfect drain)",
                attempt.who(),
                story.request_id,
                took.line,
                because.join(", and ")
            ),
            lines,
            vec![
                Actor::of(story, attempt),
                Actor {
                    request_id: story.request_id.clone(),
                    worker_id: None,
                    model_version: cutover.and_then(|(c, _)| c.to.clone()),
                },
            ],
        ));
    }
}
