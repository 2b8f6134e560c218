//! What happened in a run, from three sources: the workers' own events (their log lines, stamped
//! with the schedule step during which they were emitted), and two sources of truth no worker can
//! bypass: the Postgres audit trail filled by the trigger, and the model backends' request
//! journals. The checkers read only this.

use crate::Result;
use crate::contract::JobStatus;
use crate::contract::log::{LogLine, Status};
use crate::env::backends::JournalEntry;
use crate::reference::JobRow;
use sqlx::PgPool;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

/// One row of `inference_jobs_audit`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AuditRow {
    /// Order of the write.
    pub audit_id: i64,
    /// The job.
    pub idempotency_key: String,
    /// INSERT or UPDATE.
    pub operation: String,
    /// Status before.
    pub old_status: Option<String>,
    /// Status after.
    pub new_status: String,
    /// Generation before.
    pub old_generation: Option<i64>,
    /// Generation after.
    pub new_generation: i64,
    /// Version before.
    pub old_model_version: Option<String>,
    /// Version after.
    pub new_model_version: Option<String>,
    /// Lease token before.
    pub old_lease_token: Option<String>,
    /// Lease token after.
    pub new_lease_token: Option<String>,
    /// Worker recorded on the row after the write.
    pub worker_id: Option<String>,
    /// Attempt recorded on the row after the write.
    pub attempt: i32,
    /// Output after the write.
    pub output: Option<String>,
}

impl AuditRow {
    /// Whether this write moved the job into (or rewrote) a terminal status: a final write.
    pub fn is_final_write(&self) -> bool {
        self.new_status
            .parse::<JobStatus>()
            .is_ok_and(JobStatus::is_terminal)
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        format!(
            "audit#{} {} {} {}->{} generation {}->{} version {}->{} token {}->{} by {}",
            self.audit_id,
            self.idempotency_key,
            self.operation,
            self.old_status.as_deref().unwrap_or("-"),
            self.new_status,
            self.old_generation.map_or("-".into(), |g| g.to_string()),
            self.new_generation,
            self.old_model_version.as_deref().unwrap_or("-"),
            self.new_model_version.as_deref().unwrap_or("-"),
            self.old_lease_token.as_deref().unwrap_or("-"),
            self.new_lease_token.as_deref().unwrap_or("-"),
            self.worker_id.as_deref().unwrap_or("-"),
        )
    }
}

/// What an event is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A schedule step began (its description).
    Step(String),
    /// A fault was applied or undone (its description, with the keys it touched).
    Fault {
        /// What happened, e.g. `lease_expired`.
        what: String,
        /// Extra fields, e.g. the idempotency key.
        fields: Vec<(String, String)>,
    },
    /// A line a worker (or the cutover) logged.
    Worker(LogLine),
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Logical step of the schedule during which it happened (0 before the first step).
    pub step: usize,
    /// Milliseconds since the run started (wall time; not compared between runs).
    pub at_ms: u64,
    /// The event.
    pub kind: EventKind,
}

impl Event {
    /// A field of a worker line or a fault.
    pub fn field(&self, key: &str) -> Option<&str> {
        match &self.kind {
            EventKind::Worker(line) => line.get(key),
            EventKind::Fault { fields, .. } => fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str()),
            EventKind::Step(_) => None,
        }
    }

    /// The status word of a worker line, or the fault's name.
    pub fn status(&self) -> Option<&str> {
        match &self.kind {
            EventKind::Worker(line) => line.status(),
            EventKind::Fault { what, .. } => Some(what),
            EventKind::Step(_) => None,
        }
    }
}

/// Records events as a run goes, stamping each with the current step.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    inner: Mutex<RecorderState>,
}

#[derive(Debug, Default)]
struct RecorderState {
    step: usize,
    events: Vec<Event>,
    log_cursor: usize,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// A recorder starting now.
    pub fn new() -> Recorder {
        Recorder {
            started: Instant::now(),
            inner: Mutex::new(RecorderState::default()),
        }
    }

    fn push(&self, state: &mut RecorderState, kind: EventKind) {
        let at_ms = self.started.elapsed().as_millis() as u64;
        let step = state.step;
        state.events.push(Event { step, at_ms, kind });
    }

    /// Moves the log lines emitted since the last call into the history, under the current step.
    pub fn collect_log(&self, log: &crate::contract::log::LogSink) {
        let lines = log.lines();
        let mut state = self.inner.lock().expect("poisoned");
        let fresh: Vec<LogLine> = lines[state.log_cursor.min(lines.len())..].to_vec();
        state.log_cursor = lines.len();
        for line in fresh {
            self.push(&mut state, EventKind::Worker(line));
        }
    }

    /// Starts step `step` with a description.
    pub fn step(&self, step: usize, description: String) {
        let mut state = self.inner.lock().expect("poisoned");
        state.step = step;
        self.push(&mut state, EventKind::Step(description));
    }

    /// Records a fault.
    pub fn fault(&self, what: &str, fields: &[(&str, &str)]) {
        let mut state = self.inner.lock().expect("poisoned");
        let kind = EventKind::Fault {
            what: what.to_owned(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        self.push(&mut state, kind);
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner.lock().expect("poisoned").events.clone()
    }
}

/// A request the run submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedRequest {
    /// The client's request id.
    pub request_id: String,
    /// Its idempotency key.
    pub idempotency_key: String,
}

/// Everything the checkers look at.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Worker events, faults and steps, in order.
    pub events: Vec<Event>,
    /// The audit trail of the run's keys, in write order.
    pub audit: Vec<AuditRow>,
    /// The backends' journals for the run's keys, per backend in arrival order.
    pub journal: Vec<JournalEntry>,
    /// The jobs table rows of the run's keys.
    pub jobs: Vec<JobRow>,
    /// The requests submitted.
    pub requests: Vec<SubmittedRequest>,
}

/// Assembles the history of a run whose keys live under `prefix`: its events, plus the two
/// sources no worker can bypass (the audit trail and every backend's journal) and the job rows.
pub async fn collect(
    bed: &crate::env::TestBed,
    pg: &PgPool,
    prefix: &str,
    events: Vec<Event>,
    requests: Vec<SubmittedRequest>,
) -> Result<History> {
    let mut journal = Vec::new();
    for version in bed.versions() {
        journal.extend(bed.backend(version)?.journal(Some(prefix)).await);
    }
    Ok(History {
        events,
        audit: read_audit(pg, prefix).await?,
        journal,
        jobs: read_jobs(pg, prefix).await?,
        requests,
    })
}

/// Reads the audit trail of the keys under `prefix`.
pub async fn read_audit(pg: &PgPool, prefix: &str) -> Result<Vec<AuditRow>> {
    Ok(sqlx::query_as(
        "SELECT audit_id, idempotency_key, operation, old_status, new_status, old_generation,
                new_generation, old_model_version, new_model_version, old_lease_token,
                new_lease_token, worker_id, attempt, output
         FROM inference_jobs_audit WHERE idempotency_key LIKE $1 ORDER BY audit_id",
    )
    .bind(format!("{}%", like_escape(prefix)))
    .fetch_all(pg)
    .await?)
}

/// Reads the job rows of the keys under `prefix`.
pub async fn read_jobs(pg: &PgPool, prefix: &str) -> Result<Vec<JobRow>> {
    Ok(sqlx::query_as(
        "SELECT idempotency_key, request_id, status, generation, model_version, output, lease_token, worker_id
         FROM inference_jobs WHERE idempotency_key LIKE $1 ORDER BY idempotency_key",
    )
    .bind(format!("{}%", like_escape(prefix)))
    .fetch_all(pg)
    .await?)
}

fn like_escape(prefix: &str) -> String {
    prefix
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// The fields a timeline line shows, in the seed's order.
const TIMELINE_FIELDS: [&str; 8] = [
    "request_id",
    "attempt",
    "worker_id",
    "model_version",
    "backend_endpoint",
    "queue_receive_count",
    "status",
    "write",
];

impl History {
    /// The run as a timeline in the seed's log format: one line per worker event (worker,
    /// version, attempt, status) or fault, each prefixed by its step.
    pub fn timeline(&self) -> String {
        let mut out = String::new();
        for event in &self.events {
            match &event.kind {
                EventKind::Step(description) => {
                    let _ = writeln!(out, "step {:>2}  -- {description}", event.step);
                }
                EventKind::Fault { what, fields } => {
                    let _ = write!(out, "step {:>2}  FAULT status={what}", event.step);
                    for (k, v) in fields {
                        let _ = write!(out, " {k}={v}");
                    }
                    out.push('\n');
                }
                EventKind::Worker(line) => {
                    let _ = write!(
                        out,
                        "step {:>2}  {} {}",
                        event.step,
                        line.ts,
                        line.level.as_str()
                    );
                    for key in TIMELINE_FIELDS {
                        if let Some(value) = line.get(key) {
                            let _ = write!(out, " {key}={value}");
                        }
                    }
                    for key in [
                        "previous_model_version",
                        "new_model_version",
                        "served_model_version",
                        "generation",
                    ] {
                        if let Some(value) = line.get(key) {
                            let _ = write!(out, " {key}={value}");
                        }
                    }
                    out.push('\n');
                }
            }
        }
        out
    }

    /// Worker events with a given status word.
    pub fn with_status(&self, status: Status) -> impl Iterator<Item = &Event> + '_ {
        self.events
            .iter()
            .filter(move |e| matches!(&e.kind, EventKind::Worker(line) if line.is(status)))
    }

    /// The request id of a key, from the jobs table.
    pub fn request_of(&self, idempotency_key: &str) -> Option<&str> {
        self.jobs
            .iter()
            .find(|j| j.idempotency_key == idempotency_key)
            .map(|j| j.request_id.as_str())
    }
}
