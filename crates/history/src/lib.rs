//! What happened in a run, from three sources: the workers' own events (their log lines, stamped
//! with the schedule step during which they were emitted), and two sources of truth no worker can
//! bypass: the Postgres audit trail filled by the trigger, and the model backends' request
//! journals. The checkers read only this.

#![deny(missing_docs)]

use racecert_core::Result;
use racecert_core::contract::JobRow;
use racecert_core::contract::JobStatus;
use racecert_core::contract::layout::KeyLayout;
use racecert_core::contract::log::{Echo, LogLine, LogSink, Status};
use racecert_core::fault::Effect;
use racecert_wire::JournalEntry;
use racecert_wire::{WireEvent, WireListener};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Whose round trips are the submitter's, not a worker's: a team's `[submit] command` runs on
/// links of its own under this name. What it does to a request is its submission (the row
/// its API inserts, the message it pushes), never work on it.
pub const SUBMITTER: &str = "submitter";

/// One row of `inference_jobs_audit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Generation after (None: the table has no generation column).
    pub new_generation: Option<i64>,
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
    /// The writing transaction.
    #[serde(default)]
    pub txid: Option<i64>,
    /// The server process of the connection that wrote ([`History::attribute_writers`] maps
    /// it to a worker through the connections' recorded startups).
    #[serde(default)]
    pub backend_pid: Option<i32>,
    /// When it was written, Unix microseconds (the database's clock: the host's, for a
    /// database in a container on it).
    #[serde(default)]
    pub recorded_us: Option<i64>,
    /// The worker whose connection carried the write, from the wire (None: no wire, or a
    /// connection the wire did not see: the harness's, a submitter's).
    #[serde(default)]
    pub writer: Option<String>,
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
            self.new_generation.map_or("-".into(), |g| g.to_string()),
            self.old_model_version.as_deref().unwrap_or("-"),
            self.new_model_version.as_deref().unwrap_or("-"),
            self.old_lease_token.as_deref().unwrap_or("-"),
            self.new_lease_token.as_deref().unwrap_or("-"),
            match (&self.writer, &self.worker_id) {
                (Some(writer), _) => format!("{writer} (its connection)"),
                (None, Some(column)) => column.clone(),
                (None, None) => "-".into(),
            },
        )
    }
}

/// What the harness saw or did, besides faults: how the queue redelivered, which attempts ended
/// in an error, what the drain did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "observed", rename_all = "snake_case")]
pub enum Observation {
    /// A job was handed again to a worker (its visibility timeout made to expire, or run out).
    Redelivered {
        /// The worker it went to.
        worker: String,
        /// The job's idempotency key.
        key: String,
        /// How many times it has been delivered, this one included.
        receive_count: u64,
    },
    /// An attempt ended in an infrastructure error (a partition, a restart); its delivery stays
    /// unacknowledged.
    AttemptError {
        /// The worker.
        worker: String,
        /// The error.
        error: String,
    },
    /// The queue lost a job (Redis restarted) and the harness's sweeper enqueued it again.
    Requeued {
        /// The job's idempotency key.
        key: String,
    },
    /// A worker (process) started.
    WorkerStarted {
        /// Its id.
        worker: String,
        /// The version it serves.
        version: String,
    },
    /// The drain began: every fault is healed from here on, and what follows is the system
    /// settling, not the schedule (coverage counts nothing after it).
    Draining,
    /// The drain ended: faults healed, leases expired, the queue worked off.
    Drained {
        /// Whether every request ended terminal within the drain's bound.
        settled: bool,
    },
    /// A job's lease was set to outlive the liveness bound (or never to expire): the drain lets
    /// time pass up to the bound, not beyond, so the job waits behind it.
    LeaseOutlivesBound {
        /// The job's idempotency key.
        key: String,
        /// What the lease had left, ms (-1: no expiry).
        ttl_ms: i64,
        /// The liveness bound, ms.
        bound_ms: u64,
    },
    /// A worker was held at its links before a request (a schedule's step between statements).
    Held {
        /// The worker.
        worker: String,
        /// The request it is held before (its fingerprint).
        before: String,
    },
    /// A request was submitted (a team's system: the way its API does it).
    Submitted {
        /// The request's key.
        key: String,
    },
    /// A request's message went onto the queue under the framework's own id for it (Celery's
    /// task id, a message or job id), read from the message racecert wrote or from the
    /// submitter's push on the wire: what ties the framework's lines and deliveries to the
    /// request when they name only that id.
    Enqueued {
        /// The request's key.
        key: String,
        /// The framework's id of the message.
        job_id: String,
    },
    /// A team's API refused a request submitted again (its submit command exited non-zero): a
    /// protection against duplicates, not a broken description.
    Refused {
        /// The request's key.
        key: String,
        /// How the command ended, and the last line it wrote on stderr.
        why: String,
    },
    /// A rollout switched the active model version: requests accepted from here (plus
    /// `window_ms`, the mixed window a team allows) belong to `to`.
    Switched {
        /// The version rolled away from.
        from: String,
        /// The version rolled out.
        to: String,
        /// How long old and new may both answer after the switch, ms.
        window_ms: u64,
    },
    /// A rollout told a worker to stop (its stop signal): from here it should begin no new job.
    Stopping {
        /// The worker.
        worker: String,
        /// The signal, by name.
        signal: String,
    },
    /// A rollout's cache invalidation step ran (the team's command, or its key patterns
    /// deleted).
    Invalidated {
        /// What it did.
        detail: String,
    },
    /// After the drain, a delivery was still unacknowledged.
    Pending {
        /// The job's idempotency key.
        key: String,
        /// How many times it was delivered.
        deliveries: u64,
        /// Where the broker still holds its message (a queue, an unacked or in-progress record),
        /// when racecert read it from the broker rather than counted deliveries.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        held: Option<String>,
    },
}

impl Observation {
    /// The observation's name, as timelines print it.
    pub fn name(&self) -> &'static str {
        match self {
            Observation::Redelivered { .. } => "redelivered",
            Observation::AttemptError { .. } => "attempt_error",
            Observation::Requeued { .. } => "requeued",
            Observation::WorkerStarted { .. } => "worker_started",
            Observation::Draining => "draining",
            Observation::Drained { .. } => "drained",
            Observation::LeaseOutlivesBound { .. } => "lease_outlives_bound",
            Observation::Pending { .. } => "pending_delivery",
            Observation::Held { .. } => "held",
            Observation::Submitted { .. } => "submitted",
            Observation::Enqueued { .. } => "enqueued",
            Observation::Refused { .. } => "refused",
            Observation::Switched { .. } => "switched",
            Observation::Stopping { .. } => "stopping",
            Observation::Invalidated { .. } => "invalidated",
        }
    }

    /// `key=value` pairs, for timelines and diagrams.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Observation::Redelivered {
                worker,
                key,
                receive_count,
            } => vec![
                ("worker_id", worker.clone()),
                ("idempotency_key", key.clone()),
                ("queue_receive_count", receive_count.to_string()),
            ],
            Observation::AttemptError { worker, error } => {
                vec![("worker_id", worker.clone()), ("error", error.clone())]
            }
            Observation::Requeued { key } => vec![("idempotency_key", key.clone())],
            Observation::WorkerStarted { worker, version } => {
                vec![
                    ("worker_id", worker.clone()),
                    ("model_version", version.clone()),
                ]
            }
            Observation::Draining => Vec::new(),
            Observation::Drained { settled } => vec![("settled", settled.to_string())],
            Observation::LeaseOutlivesBound {
                key,
                ttl_ms,
                bound_ms,
            } => vec![
                ("idempotency_key", key.clone()),
                ("lease_ttl_ms", ttl_ms.to_string()),
                ("bound_ms", bound_ms.to_string()),
            ],
            Observation::Pending {
                key,
                deliveries,
                held,
            } => {
                let mut fields = vec![
                    ("idempotency_key", key.clone()),
                    ("deliveries", deliveries.to_string()),
                ];
                fields.extend(held.iter().map(|held| ("held", held.clone())));
                fields
            }
            Observation::Held { worker, before } => {
                vec![("worker_id", worker.clone()), ("before", before.clone())]
            }
            Observation::Submitted { key } => vec![("idempotency_key", key.clone())],
            Observation::Enqueued { key, job_id } => {
                vec![("idempotency_key", key.clone()), ("job_id", job_id.clone())]
            }
            Observation::Refused { key, why } => {
                vec![("idempotency_key", key.clone()), ("why", why.clone())]
            }
            Observation::Switched {
                from,
                to,
                window_ms,
            } => vec![
                ("from", from.clone()),
                ("to", to.clone()),
                ("window_ms", window_ms.to_string()),
            ],
            Observation::Stopping { worker, signal } => {
                vec![("worker_id", worker.clone()), ("signal", signal.clone())]
            }
            Observation::Invalidated { detail } => vec![("detail", detail.clone())],
        }
    }
}

/// What an event is.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// A schedule step began (its description).
    Step(String),
    /// A fault landed (what it did).
    Fault(Effect),
    /// The harness saw or did something.
    Harness(Observation),
    /// A line a worker logged.
    Worker(LogLine),
    /// A round trip a worker made, as its links recorded it (boxed: most events are small).
    Wire(Box<WireEvent>),
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Logical step of the schedule during which it happened (0 before the first step).
    pub step: usize,
    /// Milliseconds since the run started (wall time; not compared between runs).
    pub at_ms: u64,
    /// The event.
    pub kind: EventKind,
}

impl Event {
    /// A field of a worker line, a fault's effect or an observation.
    pub fn field(&self, key: &str) -> Option<String> {
        let find = |fields: Vec<(&'static str, String)>| {
            fields.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v)
        };
        match &self.kind {
            EventKind::Worker(line) => line.get(key).map(str::to_owned),
            EventKind::Fault(effect) => find(effect.fields()),
            EventKind::Harness(observation) => find(observation.fields()),
            EventKind::Step(_) | EventKind::Wire(_) => None,
        }
    }

    /// The worker line, if this is one.
    pub fn line(&self) -> Option<&LogLine> {
        match &self.kind {
            EventKind::Worker(line) => Some(line),
            _ => None,
        }
    }
}

/// Records a run's events as they happen, in real order, each stamped with the current schedule
/// step and the time since the run started. Every runner records through one of these: worker
/// lines arrive through [`Recorder::log_sink`] (in process) or [`Recorder::line`] (a process's
/// stdout), faults through [`Recorder::fault`], the harness's own observations through
/// [`Recorder::observe`].
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    /// `started` in Unix milliseconds (what the audit trail's times are compared with).
    started_unix_ms: i64,
    inner: Mutex<RecorderState>,
}

#[derive(Debug, Default)]
struct RecorderState {
    step: usize,
    events: Vec<Event>,
}

impl Recorder {
    /// A recorder starting now.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            started: Instant::now(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            inner: Mutex::new(RecorderState::default()),
        })
    }

    fn push(&self, kind: EventKind) {
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut state = self.inner.lock().expect("poisoned");
        let step = state.step;
        state.events.push(Event { step, at_ms, kind });
    }

    /// A log sink whose lines are recorded the moment they are emitted.
    pub fn log_sink(self: &Arc<Self>, echo: Echo) -> LogSink {
        let recorder = Arc::clone(self);
        LogSink::with_listener(
            echo,
            Arc::new(move |line: &LogLine| {
                recorder.line(line.clone());
            }),
        )
    }

    /// Starts step `step` with a description.
    pub fn step(&self, step: usize, description: String) {
        self.inner.lock().expect("poisoned").step = step;
        self.push(EventKind::Step(description));
    }

    /// Records a line a worker logged.
    pub fn line(&self, line: LogLine) {
        self.push(EventKind::Worker(line));
    }

    /// Records what a fault did.
    pub fn fault(&self, effect: Effect) {
        self.push(EventKind::Fault(effect));
    }

    /// Where a worker's links deliver its round trips: recorded as they complete.
    pub fn wire_listener(self: &Arc<Self>) -> WireListener {
        let recorder = Arc::clone(self);
        Arc::new(move |event: WireEvent| recorder.push(EventKind::Wire(Box::new(event))))
    }

    /// Records what the harness saw or did.
    pub fn observe(&self, observation: Observation) {
        self.push(EventKind::Harness(observation));
    }

    /// When it started: its events' milliseconds count from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// When it started, in Unix milliseconds.
    pub fn started_unix_ms(&self) -> i64 {
        self.started_unix_ms
    }

    /// Milliseconds from this recorder's start to `origin` (negative: before it): what turns a
    /// round trip's stamp (microseconds since `origin`, the wire's clock) into event time.
    pub fn offset_of(&self, origin: Instant) -> i64 {
        if origin >= self.started {
            origin.duration_since(self.started).as_millis() as i64
        } else {
            -(self.started.duration_since(origin).as_millis() as i64)
        }
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.inner.lock().expect("poisoned").events.clone()
    }

    /// How many events are recorded.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("poisoned").events.len()
    }

    /// Whether nothing is recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events from the `from`-th on (a case among many on one recorder: copying only its
    /// own keeps each case as cheap as the first).
    pub fn events_since(&self, from: usize) -> Vec<Event> {
        let state = self.inner.lock().expect("poisoned");
        state.events.get(from..).unwrap_or_default().to_vec()
    }
}

/// A request the run submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedRequest {
    /// The client's request id.
    pub request_id: String,
    /// Its idempotency key.
    pub idempotency_key: String,
    /// Its normalized input (requests with the same input share cache entries).
    pub input: String,
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
    /// On real clocks, the lease TTL the workers were given (leases run out by themselves); None
    /// when only the schedule makes leases expire.
    pub lease_ttl_ms: Option<u64>,
    /// The run's key prefix (its namespace), when it has one.
    pub namespace: Option<String>,
    /// Whether the workers' round trips were recorded (the wire checks apply).
    pub wire_recorded: bool,
    /// Where the system keeps leases and cache entries (the wire checks match keys with it).
    pub layout: KeyLayout,
    /// The statuses that end a job, as the system spells them (empty: the contract's).
    pub terminal: Vec<String>,
    /// A team's own fencing column, when its system file names one: its values are the audit
    /// rows' generations ([`racecert_core::contract::fencing::FenceOrder::Increasing`]) or lease tokens
    /// ([`racecert_core::contract::fencing::FenceOrder::Token`]), and the fencing invariants judge them
    /// as the team's (None: the contract's columns).
    pub fencing: Option<racecert_core::contract::fencing::Fencing>,
    /// The server processes of the workers' Postgres connections, with the worker whose links
    /// carried each (connections can outlive a case: their startups are then not in its events).
    pub connections: BTreeMap<i32, String>,
    /// Where the wire's clock starts, in the events' milliseconds: a round trip sent at `sent_us`
    /// happened at `wire_origin_ms + sent_us / 1000` (None: not known, times of round trips are
    /// then their events').
    pub wire_origin_ms: Option<i64>,
    /// Where the events' clock starts, in Unix milliseconds (what the audit trail's times are
    /// compared with), when known.
    pub epoch_unix_ms: Option<i64>,
}

/// Assembles the history of a run whose keys live under `prefix`: its events, plus the two
/// sources no worker can bypass (the audit trail, read here, and the backends' journals of the
/// run's calls, which the caller took out of its backends) and the job rows.
pub async fn collect(
    journal: Vec<JournalEntry>,
    pg: &PgPool,
    prefix: &str,
    events: Vec<Event>,
    requests: Vec<SubmittedRequest>,
    connections: BTreeMap<i32, String>,
) -> Result<History> {
    let rows = read_rows(pg, prefix).await?;
    Ok(assemble(
        rows,
        journal,
        prefix,
        events,
        requests,
        connections,
    ))
}

/// [`collect`] with the rows already read (a runner whose cases share a prefix reads only its
/// case's keys: [`read_rows_of`]).
pub fn assemble(
    (audit, jobs): (Vec<AuditRow>, Vec<JobRow>),
    journal: Vec<JournalEntry>,
    prefix: &str,
    events: Vec<Event>,
    requests: Vec<SubmittedRequest>,
    connections: BTreeMap<i32, String>,
) -> History {
    let mut history = History {
        events,
        audit,
        journal,
        jobs,
        requests,
        lease_ttl_ms: None,
        namespace: (!prefix.is_empty()).then(|| prefix.to_owned()),
        wire_recorded: false,
        layout: KeyLayout::contract(prefix),
        terminal: Vec::new(),
        fencing: None,
        connections,
        wire_origin_ms: None,
        epoch_unix_ms: None,
    };
    history.attribute_writers();
    history
}

/// Reads the audit trail and the job rows of the keys under `prefix` in one statement (one round
/// trip, one snapshot): every case ends with this read, and a round trip is what a case costs.
pub async fn read_rows(pg: &PgPool, prefix: &str) -> Result<(Vec<AuditRow>, Vec<JobRow>)> {
    let pattern = format!("{}%", like_escape(prefix));
    read_rows_where(pg, "idempotency_key LIKE $1", pattern, prefix).await
}

/// [`read_rows`] of these keys only: the rows of one case among the many a prefix gathers over a
/// search (reading them all would make every case slower than the one before).
pub async fn read_rows_of(pg: &PgPool, keys: &[String]) -> Result<(Vec<AuditRow>, Vec<JobRow>)> {
    read_rows_where(
        pg,
        "idempotency_key = ANY($1)",
        keys.to_vec(),
        "the case's keys",
    )
    .await
}

async fn read_rows_where<T>(
    pg: &PgPool,
    filter: &str,
    value: T,
    of: &str,
) -> Result<(Vec<AuditRow>, Vec<JobRow>)>
where
    T: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    // The job rows' table first: tables are locked in the order the statement names them, and
    // every writer and the schema take the jobs table before the audit table (schema.sql).
    let statement = format!(
        "SELECT
            (SELECT coalesce(json_agg(j ORDER BY j.idempotency_key), '[]')::text FROM (
                SELECT idempotency_key, request_id, status, generation, model_version, output,
                       lease_token, worker_id
                FROM inference_jobs WHERE {filter}) j),
            (SELECT coalesce(json_agg(a ORDER BY a.audit_id), '[]')::text FROM (
                SELECT audit_id, idempotency_key, operation, old_status, new_status,
                       old_generation, new_generation, old_model_version, new_model_version,
                       old_lease_token, new_lease_token, worker_id, attempt, output, txid,
                       backend_pid,
                       (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_us
                FROM inference_jobs_audit WHERE {filter}) a)"
    );
    // `filter` is one of this module's two constants; the values are bound.
    let (jobs, audit): (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(statement))
        .bind(value)
        .fetch_one(pg)
        .await?;
    let parse = |what: &str, err: serde_json::Error| {
        racecert_core::Error::other(format!("reading the {what} of {of:?}: {err}"))
    };
    Ok((
        serde_json::from_str(&audit).map_err(|e| parse("audit trail", e))?,
        serde_json::from_str(&jobs).map_err(|e| parse("job rows", e))?,
    ))
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
    /// When an audited write happened, in the events' milliseconds (fractions kept: the audit
    /// trail's clock is in microseconds), when the trail's clock is placed.
    pub fn written_at(&self, row: &AuditRow) -> Option<f64> {
        let epoch = self.epoch_unix_ms?;
        Some(row.recorded_us? as f64 / 1000.0 - epoch as f64)
    }

    /// Whether `status` ends a job: one of [`History::terminal`], or the contract's terminal
    /// statuses.
    pub fn is_terminal(&self, status: &str) -> bool {
        if self.terminal.is_empty() {
            status
                .parse::<JobStatus>()
                .is_ok_and(JobStatus::is_terminal)
        } else {
            self.terminal.iter().any(|t| t == status)
        }
    }

    /// Whether an audited write is a final write: it moved the job into (or rewrote) a terminal
    /// status.
    pub fn is_final(&self, row: &AuditRow) -> bool {
        self.is_terminal(&row.new_status)
    }

    /// Fills each audited write's [`AuditRow::writer`]: the worker whose connection's startup (in
    /// the events, or [`History::connections`]) names the write's server process. Writes of connections the wire did not see (the
    /// harness's own, a submitter's) keep none.
    pub fn attribute_writers(&mut self) {
        let mut by_pid = self.connections.clone();
        for event in &self.events {
            if let EventKind::Wire(wire) = &event.kind
                && let racecert_wire::Request::Postgres(racecert_wire::PgRequest::Startup(startup)) =
                    &wire.trip.request
                && let Some(pid) = startup.backend_pid
            {
                // A later connection with the same process id is the one that counts (Postgres
                // reuses ids of ended connections).
                by_pid.insert(pid, wire.worker.clone());
            }
        }
        for row in &mut self.audit {
            row.writer = row.backend_pid.and_then(|pid| by_pid.get(&pid).cloned());
        }
    }

    /// The run as a timeline in the seed's log format: one line per worker event (worker,
    /// version, attempt, status) or fault, each prefixed by its step.
    pub fn timeline(&self) -> String {
        let mut out = String::new();
        for event in &self.events {
            match &event.kind {
                EventKind::Step(description) => {
                    let _ = writeln!(out, "step {:>2}  -- {description}", event.step);
                }
                EventKind::Fault(effect) => {
                    let _ = write!(
                        out,
                        "step {:>2}  FAULT status={}",
                        event.step,
                        effect.name()
                    );
                    for (k, v) in effect.fields() {
                        let _ = write!(out, " {k}={v}");
                    }
                    out.push('\n');
                }
                // Set-up and health checks say nothing about the run.
                EventKind::Wire(wire) if wire.trip.is_effectless() => {}
                EventKind::Wire(wire) => {
                    let _ = writeln!(
                        out,
                        "step {:>2}  WIRE {} {} {}",
                        event.step,
                        wire.worker,
                        wire.service,
                        wire.trip.describe(self.namespace.as_deref())
                    );
                }
                EventKind::Harness(observation) => {
                    let _ = write!(
                        out,
                        "step {:>2}  HARNESS status={}",
                        event.step,
                        observation.name()
                    );
                    for (k, v) in observation.fields() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_delivery_written_before_held_existed_still_reads() {
        let old = r#"{"observed":"pending","key":"k","deliveries":3}"#;
        let read: Observation = serde_json::from_str(old).unwrap();
        assert_eq!(
            read,
            Observation::Pending {
                key: "k".into(),
                deliveries: 3,
                held: None
            }
        );
        // Written again, it is what it was: no `held` where there is none.
        assert_eq!(serde_json::to_string(&read).unwrap(), old);
    }

    #[test]
    fn a_case_reads_only_the_events_recorded_since_it_began() {
        let recorder = Recorder::new();
        recorder.observe(Observation::Draining);
        let from = recorder.len();
        recorder.observe(Observation::Drained { settled: true });
        let since = recorder.events_since(from);
        assert_eq!(since.len(), 1);
        assert!(matches!(
            since[0].kind,
            EventKind::Harness(Observation::Drained { settled: true })
        ));
        assert!(recorder.events_since(recorder.len() + 5).is_empty());
        assert_eq!(recorder.events().len(), 2);
    }
}
