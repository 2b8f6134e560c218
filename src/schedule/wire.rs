//! Wire schedules (issue 13): deterministic interleavings of worker *processes* in any language,
//! made at the round trips their connections already carry. Every worker runs behind links of
//! its own; a [`Gate`] (the links' [`Holder`]) holds each of its effectful requests (a Redis
//! command, a SQL round trip, a backend call) before it reaches the server, and the schedule says
//! whose request goes next. Connection set-up and health checks pass without holding.
//!
//! A step lets a worker complete some round trips, runs it until it is about to touch a table or
//! key, expires a lease (and the delivery's visibility timeout: the time-driven events of a long
//! pause, made to happen by the schedule), kills or stops a process, or applies any other fault.
//! Round trips that decide nothing (an empty queue poll, a script-cache miss) are let through
//! while their worker runs and are not counted, so a schedule means the same whatever a worker
//! did before the case.
//!
//! Schedules come from PCT (probabilistic concurrency testing, Burckhardt et al. 2010: random
//! priorities, `d - 1` random priority change points over `k` steps), or, for small cases, from
//! the enumeration of every depth-2 schedule (one preemption, with or without a lease expiry at
//! it). Every released round trip leaves a fingerprint; a replay that sees other fingerprints
//! than its file recorded reports a *divergence* (the worker sent something else), which is
//! neither a pass nor a failure. A failure shrinks to a minimal schedule, written as a
//! [`WireScheduleFile`] and replayed by `racecert run --schedule FILE --worker-cmd CMD`.
//!
//! Holds are short: a request held longer than [`WireSettings::max_hold`] goes on by itself
//! (below the clients' own socket timeouts), and the outcome says so, as it says when a held
//! request's connection ended (the worker's own timeout gave up on it).

use crate::check::Invariant;
use crate::contract::defect::{Defect, Defects};
use crate::contract::log::Echo;
use crate::contract::worker::Infra;
use crate::contract::{CONSUMER_GROUP, Keys};
use crate::env::TestBed;
use crate::env::links::WireEvent;
use crate::env::wire::{Holder, PgRequest, RedisReply, Reply, Request, RoundTrip};
use crate::fault::{Fault, apply};
use crate::history::{Observation, Recorder, SubmittedRequest, read_jobs};
use crate::reference::Pipeline;
use crate::reference::process::WorkerEnv;
use crate::reference::submit::InferenceRequest;
use crate::schedule::controlled::CaseResult;
use crate::schedule::fleet::{Processes, signal, stop};
use crate::schedule::plane::{BackendFaults, CasePlane, Services, WorkerLink};
use crate::schedule::{RequestSpec, WorkerSpec};
use crate::{Error, Result};
use futures::FutureExt;
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

/// One step of a wire schedule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum WireStep {
    /// Let worker `worker` complete `trips` effectful round trips (uncounted ones, such as an
    /// empty queue poll, go through meanwhile); it is then held before its next one.
    Run {
        /// Index of the worker.
        worker: usize,
        /// Round trips to complete.
        trips: u32,
    },
    /// Let worker `worker` run until its next request's fingerprint contains `before` (a
    /// statement on a table: `UPDATE inference_jobs`; a command on a key: `SET {ns}inference:lock`)
    /// and hold it there.
    Until {
        /// Index of the worker.
        worker: usize,
        /// Part of the fingerprint to stop before.
        before: String,
    },
    /// Let worker `worker` run until it has nothing left to do (it polls an empty queue), is
    /// blocked, or stops coming back.
    Finish {
        /// Index of the worker.
        worker: usize,
    },
    /// Request `request`'s lease is deleted and its delivery made idle past the visibility
    /// timeout: what a pause longer than both would do, without the pause.
    Expire {
        /// Index of the request.
        request: usize,
    },
    /// SIGKILL worker `worker` (its process group), then start it again, as a supervisor would.
    Kill {
        /// Index of the worker.
        worker: usize,
    },
    /// SIGSTOP worker `worker` for `ms` milliseconds, then SIGCONT.
    Stop {
        /// Index of the worker.
        worker: usize,
        /// How long it stays stopped.
        ms: u64,
    },
    /// Any other fault (backend, cutover, partition).
    Fault(Fault),
}

impl fmt::Display for WireStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireStep::Run { worker, trips } => {
                write!(f, "let worker #{worker} complete {trips} round trip(s)")
            }
            WireStep::Until { worker, before } => {
                write!(f, "run worker #{worker}, hold it before `{before}`")
            }
            WireStep::Finish { worker } => write!(f, "let worker #{worker} finish"),
            WireStep::Expire { request } => {
                write!(
                    f,
                    "expire request #{request}'s lease and visibility timeout"
                )
            }
            WireStep::Kill { worker } => write!(f, "SIGKILL worker #{worker} (restarted)"),
            WireStep::Stop { worker, ms } => write!(f, "SIGSTOP worker #{worker} for {ms} ms"),
            WireStep::Fault(fault) => write!(f, "fault: {fault}"),
        }
    }
}

/// A wire case: requests submitted up front, then the steps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WireSchedule {
    /// Requests submitted before the first step.
    pub requests: Vec<RequestSpec>,
    /// The steps, in order.
    pub steps: Vec<WireStep>,
}

impl fmt::Display for WireSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, request) in self.requests.iter().enumerate() {
            writeln!(
                f,
                "  request #{i}: {} input={:?}",
                request.request_id, request.input
            )?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "  step {:>2}: {step}", i + 1)?;
        }
        Ok(())
    }
}

/// Settings of wire cases.
#[derive(Debug, Clone)]
pub struct WireSettings {
    /// The command that starts one worker (run with `sh -c`).
    pub command: String,
    /// Workers (id and version).
    pub workers: Vec<WorkerSpec>,
    /// Defects passed in `RACECERT_DEFECTS` (the reference worker honours them).
    pub defects: Defects,
    /// Invariants checked.
    pub invariants: Vec<Invariant>,
    /// Lease TTL given to the workers: long, so leases expire when the schedule says.
    pub lease_ttl: Duration,
    /// Visibility timeout given to the workers: long, so redeliveries happen when the schedule
    /// says.
    pub visibility_timeout: Duration,
    /// Backend timeout given to the workers.
    pub backend_timeout: Duration,
    /// How long a worker may take to come back with its next request before a step moves on.
    pub arrive: Duration,
    /// The same for a freshly started process (interpreter start, imports, connections).
    pub start: Duration,
    /// How long a released request may take to be answered before its worker counts as blocked
    /// (a lock held by a worker that is held itself).
    pub answer: Duration,
    /// Longest hold: a request held longer goes on by itself, and the outcome says so.
    pub max_hold: Duration,
    /// Bound of the drain after the last step.
    pub drain: Duration,
}

impl WireSettings {
    /// Two v1 workers of `command` on one request's worth of contention, every invariant.
    pub fn pair(command: &str) -> WireSettings {
        let worker = |id: &str| WorkerSpec {
            id: id.into(),
            version: "v1".into(),
        };
        WireSettings {
            command: command.to_owned(),
            workers: vec![worker("worker-a"), worker("worker-b")],
            defects: Defects::none(),
            invariants: Invariant::ALL.to_vec(),
            lease_ttl: Duration::from_secs(60),
            visibility_timeout: Duration::from_secs(60),
            backend_timeout: Duration::from_secs(3),
            // Generous for a loaded machine (a starved interpreter is late, and a step that gives
            // up on it early diverges); only a worker that really waits on something pays them.
            arrive: Duration::from_millis(1500),
            start: Duration::from_secs(20),
            answer: Duration::from_millis(1500),
            // Below redis-py's and most clients' socket timeouts (5 s and up).
            max_hold: Duration::from_secs(4),
            drain: Duration::from_secs(15),
        }
    }
}

/// Where a replay first saw other round trips than its file recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The step (from 1).
    pub step: usize,
    /// The fingerprints the file recorded for it.
    pub expected: Vec<String>,
    /// The fingerprints seen.
    pub got: Vec<String>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "DIVERGED at step {}: the worker sent something else than recorded",
            self.step
        )?;
        writeln!(f, "  expected: {}", self.expected.join(" ; "))?;
        write!(f, "  got:      {}", self.got.join(" ; "))
    }
}

/// What a wire case did.
#[derive(Debug, Clone)]
pub struct WireOutcome {
    /// The steps run (for a generated case: the steps the generator took).
    pub schedule: WireSchedule,
    /// History, violations, coverage.
    pub case: CaseResult,
    /// Per step, the fingerprints of the effectful round trips it released.
    pub trace: Vec<Vec<String>>,
    /// On replay: where the run left the recorded trace.
    pub divergence: Option<Divergence>,
    /// Holds that ended without the schedule (a held worker's own timeout, the longest hold).
    pub timeouts: Vec<String>,
    /// What the scheduler saw (a worker blocked, not coming back, idle).
    pub notes: Vec<String>,
    /// Per process: stdout and stderr.
    pub outputs: BTreeMap<String, (String, String)>,
    /// Wall time of the case.
    pub elapsed: Duration,
}

impl WireOutcome {
    /// The verdict in a word: `diverged`, `failed` or `passed`.
    pub fn verdict(&self) -> &'static str {
        if self.divergence.is_some() {
            "diverged"
        } else if !self.case.violations.is_empty() {
            "failed"
        } else {
            "passed"
        }
    }

    /// The case in text: schedule, trace, timeouts, divergence, violations, timeline.
    pub fn text(&self, title: &str) -> String {
        let mut out = format!("{title}: {}\n{}", self.verdict(), self.schedule);
        for (i, trips) in self.trace.iter().enumerate() {
            if !trips.is_empty() {
                out.push_str(&format!(
                    "  trips of step {}: {}\n",
                    i + 1,
                    trips.join(" ; ")
                ));
            }
        }
        for timeout in &self.timeouts {
            out.push_str(&format!("  held worker timed out: {timeout}\n"));
        }
        if let Some(divergence) = &self.divergence {
            out.push_str(&format!("{divergence}\n"));
        }
        for violation in &self.case.violations {
            out.push_str(&format!("  VIOLATION {violation}\n"));
        }
        out
    }
}

// ------------------------------------------------------------------------------------ the gate

/// Whether a request passes without holding: connection set-up, health checks, statements only
/// prepared. (Decided on the request alone: the reply is not known yet.)
fn passes(request: &Request) -> bool {
    match request {
        Request::Postgres(PgRequest::Startup(_) | PgRequest::Cancel) => true,
        Request::Postgres(PgRequest::Batch(batch)) => batch.statements.iter().all(|s| !s.executed),
        Request::Redis(command) => matches!(
            command.name.as_str(),
            "PING"
                | "HELLO"
                | "AUTH"
                | "SELECT"
                | "CLIENT"
                | "SCRIPT"
                | "COMMAND"
                | "INFO"
                | "READONLY"
                | "ECHO"
        ),
        Request::Http(_) => false,
    }
}

fn is_poll(request: &Request) -> bool {
    matches!(request, Request::Redis(c) if c.name == "XAUTOCLAIM" || c.name == "XREADGROUP")
}

/// Whether a finished round trip decided nothing a schedule counts: effectless traffic, a queue
/// poll that got nothing, a consumer group created again (it exists).
fn uncounted(trip: &RoundTrip) -> bool {
    if trip.is_effectless() {
        return true;
    }
    let Request::Redis(command) = &trip.request else {
        return false;
    };
    let reply = match &trip.reply {
        Some(Reply::Redis(reply)) => reply,
        _ => return false,
    };
    match command.name.as_str() {
        "XREADGROUP" => matches!(reply, RedisReply::Nil | RedisReply::Array { len: 0, .. }),
        "XAUTOCLAIM" => match reply {
            RedisReply::Array { items, .. } => {
                matches!(items.get(1), Some(RedisReply::Array { len: 0, .. }) | None)
            }
            RedisReply::Nil => true,
            _ => false,
        },
        "XGROUP" => matches!(reply, RedisReply::Error(e) if e.starts_with("BUSYGROUP")),
        _ => false,
    }
}

struct Held {
    link: String,
    conn: u64,
    first: u64,
    count: u64,
    fingerprint: String,
    poll: bool,
    release: oneshot::Sender<()>,
    since: Instant,
}

#[derive(Default)]
struct GateState {
    /// Everything goes through (the drain).
    open: bool,
    next_seq: HashMap<(String, u64), u64>,
    held: VecDeque<Held>,
    done: HashMap<(String, u64, u64), RoundTrip>,
    /// When the worker last completed a counted round trip.
    progress: Option<Instant>,
    /// Per-case names replaced in fingerprints (a case's idempotency keys by `{req#i}`), so a
    /// case's fingerprints are the same whichever run it is.
    aliases: Vec<(String, String)>,
}

/// One worker's holder: holds its effectful requests until the scheduler releases them.
pub struct Gate {
    worker: String,
    namespace: String,
    max_hold: Duration,
    state: Mutex<GateState>,
    changed: Notify,
    timeouts: Arc<Mutex<Vec<String>>>,
}

impl Gate {
    fn new(worker: &str, namespace: &str, max_hold: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            worker: worker.to_owned(),
            namespace: namespace.to_owned(),
            max_hold,
            state: Mutex::new(GateState::default()),
            changed: Notify::new(),
            timeouts: Arc::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("poisoned")
    }

    fn print_with(&self, aliases: &[(String, String)], request: &Request) -> String {
        let mut print = request.fingerprint(Some(&self.namespace)).0;
        for (name, alias) in aliases {
            print = print.replace(name.as_str(), alias);
        }
        print
    }

    /// A request's fingerprint in this case.
    fn print(&self, request: &Request) -> String {
        let aliases = self.lock().aliases.clone();
        self.print_with(&aliases, request)
    }

    /// Forgets the last case: finished trips, progress, timeouts; `aliases` name this one's.
    fn begin(&self, aliases: Vec<(String, String)>) {
        let mut state = self.lock();
        state.done.clear();
        state.progress = None;
        state.aliases = aliases;
        self.timeouts.lock().expect("poisoned").clear();
    }

    /// Holds again (between cases).
    fn close(&self) {
        self.lock().open = false;
    }

    fn trip(&self, event: &WireEvent) {
        let trip = &event.trip;
        {
            let mut state = self.lock();
            if !uncounted(trip) {
                state.progress = Some(Instant::now());
            }
            state
                .done
                .insert((trip.link.clone(), trip.conn, trip.seq), trip.clone());
        }
        self.changed.notify_waiters();
    }

    /// The oldest live held request (dropping those whose hold ended without us): its
    /// fingerprint and whether it is a queue poll.
    fn front(&self, notes: &mut Vec<String>) -> Option<(String, bool)> {
        let mut state = self.lock();
        while let Some(held) = state.held.front() {
            if held.release.is_closed() {
                let held = state.held.pop_front().expect("front");
                notes.push(format!(
                    "{}'s held `{}` went on without the schedule after {} ms (its hold ended: \
                     the longest hold, or the worker's own timeout)",
                    self.worker,
                    held.fingerprint,
                    held.since.elapsed().as_millis()
                ));
                continue;
            }
            return Some((held.fingerprint.clone(), held.poll));
        }
        None
    }

    /// Waits up to `wait` for a live held request.
    async fn arrival(&self, wait: Duration, notes: &mut Vec<String>) -> Option<(String, bool)> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(front) = self.front(notes) {
                return Some(front);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return self.front(notes);
            }
        }
    }

    /// Releases the oldest held request and waits up to `answer` for its round trips; `None` if
    /// they did not all finish (the worker is blocked), else the finished trips.
    async fn release(&self, answer: Duration) -> Option<Vec<RoundTrip>> {
        let (link, conn, first, count) = {
            let mut state = self.lock();
            let held = state.held.pop_front()?;
            let _ = held.release.send(());
            (held.link, held.conn, held.first, held.count)
        };
        let deadline = Instant::now() + answer;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                let trips: Vec<RoundTrip> = (first..first + count)
                    .filter_map(|seq| state.done.get(&(link.clone(), conn, seq)).cloned())
                    .collect();
                if trips.len() as u64 == count {
                    return Some(trips);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Lets everything through from now on, the held requests first.
    fn open(&self) {
        let mut state = self.lock();
        state.open = true;
        for held in state.held.drain(..) {
            let _ = held.release.send(());
        }
    }

    fn progress(&self) -> Option<Instant> {
        self.lock().progress
    }
}

impl Holder for Gate {
    fn before(
        &self,
        link: &str,
        conn: u64,
        requests: &[Request],
    ) -> Option<BoxFuture<'static, ()>> {
        let mut state = self.lock();
        let seq = state.next_seq.entry((link.to_owned(), conn)).or_default();
        let first = *seq;
        *seq += requests.len() as u64;
        if state.open || requests.iter().all(passes) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let fingerprint = requests
            .iter()
            .map(|r| self.print_with(&state.aliases, r))
            .collect::<Vec<_>>()
            .join(" + ");
        state.held.push_back(Held {
            link: link.to_owned(),
            conn,
            first,
            count: requests.len() as u64,
            fingerprint: fingerprint.clone(),
            poll: requests.first().is_some_and(is_poll),
            release: tx,
            since: Instant::now(),
        });
        drop(state);
        self.changed.notify_waiters();
        let (max, timeouts, worker) = (self.max_hold, self.timeouts.clone(), self.worker.clone());
        Some(
            async move {
                if tokio::time::timeout(max, rx).await.is_err() {
                    timeouts.lock().expect("poisoned").push(format!(
                        "{worker}'s `{fingerprint}` held past the longest hold ({} ms): let go",
                        max.as_millis()
                    ));
                }
            }
            .boxed(),
        )
    }
}

// ------------------------------------------------------------------------------------ a case

/// How one release went.
enum Released {
    /// Counted round trips finished (their fingerprints).
    Trips(Vec<String>),
    /// Only uncounted ones.
    Uncounted,
    /// Not answered in time: the worker waits on something (a lock).
    Blocked,
}

/// Why a worker is not runnable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stuck {
    /// It did not come back to the gate.
    Away,
    /// It polls an empty queue.
    Idle,
}

/// Worker processes behind their gates, kept from case to case (a process costs its interpreter's
/// start; a case costs a few milliseconds of set-up): each case submits requests of its own,
/// judges only what concerns them, and leaves every worker held before its next queue poll.
struct Case<'b> {
    settings: WireSettings,
    api: crate::reference::submit::Api,
    /// Cases begun on these processes.
    cases: u64,
    /// Where this case's events start in the recorder.
    events_from: usize,
    plane: CasePlane<'b, Processes>,
    gates: Vec<Arc<Gate>>,
    recorder: Arc<Recorder>,
    admin: Infra,
    keys: Keys,
    submitted: Vec<SubmittedRequest>,
    /// Per worker: started since it last came to the gate (waits `start`, not `arrive`).
    fresh: Vec<bool>,
    notes: Vec<String>,
    trace: Vec<Vec<String>>,
    steps_run: Vec<WireStep>,
    started: Instant,
}

static CASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<'b> Case<'b> {
    async fn open(bed: &'b TestBed, settings: &WireSettings) -> Result<Case<'b>> {
        if settings.workers.is_empty() || settings.command.trim().is_empty() {
            return Err(Error::Config(
                "a wire schedule needs a worker command and workers".into(),
            ));
        }
        let started = Instant::now();
        let namespace = format!(
            "w{}c{}",
            std::process::id(),
            CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let keys = Keys::namespaced(&namespace);
        let recorder = Recorder::new();
        let mut links = Vec::new();
        let mut envs = Vec::new();
        let mut gates = Vec::new();
        for spec in &settings.workers {
            // A tapped proxy restarts on its port; under load another socket may take the port
            // meanwhile: new links (new ports) are tried before giving up.
            let mut tries = 0;
            let link = loop {
                match WorkerLink::open_with(bed, true, false, true).await {
                    Ok(link) => break link,
                    Err(err) if tries < 3 && err.to_string().contains("Address already in use") => {
                        tries += 1;
                        tracing::warn!(%err, "opening a worker's links again");
                    }
                    Err(err) => return Err(err),
                }
            };
            let gate = Gate::new(&spec.id, keys.prefix(), settings.max_hold);
            let listener = {
                let (recorder, gate) = (recorder.wire_listener(), gate.clone());
                Arc::new(move |event: WireEvent| {
                    gate.trip(&event);
                    recorder(event);
                })
            };
            link.links.record(&spec.id, listener);
            if !link.links.hold(Some(gate.clone())) {
                return Err(Error::Config(
                    "wire schedules need the proxy in process (a remote TOXIPROXY_URL cannot hold \
                     round trips)"
                        .into(),
                ));
            }
            let mut by_version = BTreeMap::new();
            for (version, backend) in &link.backends {
                by_version.insert(
                    version.clone(),
                    WorkerEnv {
                        worker_id: String::new(),
                        model_version: version.clone(),
                        redis_url: link.links.redis_url().to_owned(),
                        database_url: link.links.database_url().to_owned(),
                        backend_url: backend.url.clone(),
                        backend_endpoint: backend.name.clone(),
                        key_prefix: keys.prefix().to_owned(),
                        lease_ttl: settings.lease_ttl,
                        visibility_timeout: settings.visibility_timeout,
                        backend_timeout: settings.backend_timeout,
                        defects: settings.defects.clone(),
                    },
                );
            }
            envs.push(by_version);
            links.push(link);
            gates.push(gate);
        }
        let admin =
            Infra::connect_harness(&bed.harness_redis_url(), &bed.harness_database_url()).await?;
        let api = Pipeline::with_infra(
            admin.clone(),
            keys.clone(),
            BTreeMap::new(),
            recorder.log_sink(Echo::Off),
        )
        .await?
        .api;
        let mut processes = Processes {
            command: settings.command.clone(),
            env: envs,
            recorder: recorder.clone(),
            outputs: Arc::default(),
            starts: 0,
            procs: Vec::new(),
            readers: Vec::new(),
            // Wire schedules never pause by the fleet's rule; the field is the fleet's.
            wake: rand::SeedableRng::seed_from_u64(0),
        };
        for (index, spec) in settings.workers.iter().enumerate() {
            let proc = processes.start(index, spec)?;
            processes.procs.push(proc);
        }
        // Every worker comes to the gate (its first effectful request) before the first step.
        let mut notes = Vec::new();
        for gate in &gates {
            if gate.arrival(settings.start, &mut notes).await.is_none() {
                // A command that cannot run as a worker gets an error with what it said, not a
                // verdict on jobs nobody worked on.
                if let Some(message) = processes.exited_at_once().await {
                    return Err(Error::Config(message));
                }
                notes.push(format!(
                    "{} sent no request within {} s of its start (see its stderr)",
                    gate.worker,
                    settings.start.as_secs()
                ));
            }
        }
        let services = Services::new(
            bed,
            keys.clone(),
            admin.clone(),
            links,
            BackendFaults::Toxics,
            settings.defects.clone(),
            settings.backend_timeout,
        );
        Ok(Case {
            settings: settings.clone(),
            api,
            cases: 0,
            events_from: 0,
            plane: CasePlane {
                services,
                workers: processes,
            },
            fresh: vec![false; gates.len()],
            gates,
            recorder,
            admin,
            keys,
            submitted: Vec::new(),
            notes,
            trace: Vec::new(),
            steps_run: Vec::new(),
            started,
        })
    }

    /// Starts a case: its requests (ids of this case's own, fingerprinted as `{req#i}`), a clean
    /// trace.
    async fn begin(&mut self, requests: &[RequestSpec]) -> Result<()> {
        self.cases += 1;
        self.started = Instant::now();
        self.events_from = self.recorder.events().len();
        self.trace.clear();
        self.steps_run.clear();
        self.submitted.clear();
        let mut aliases = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            let request_id = format!("c{}-{}", self.cases, request.request_id);
            let done = self
                .api
                .submit(&InferenceRequest {
                    request_id: request_id.clone(),
                    input: request.input.clone(),
                })
                .await?;
            let bare = done
                .idempotency_key
                .strip_prefix(self.keys.prefix())
                .unwrap_or(&done.idempotency_key)
                .to_owned();
            aliases.push((bare, format!("{{req#{i}}}")));
            self.submitted.push(SubmittedRequest {
                request_id,
                idempotency_key: done.idempotency_key,
                input: crate::reference::submit::normalize_input(&request.input),
            });
        }
        for gate in &self.gates {
            gate.begin(aliases.clone());
        }
        self.plane.services.requests = self
            .submitted
            .iter()
            .map(|r| r.idempotency_key.clone())
            .collect();
        Ok(())
    }

    fn worker(&self, worker: usize) -> usize {
        worker % self.gates.len()
    }

    /// Whether the queue has something for a poll: an entry never delivered, or a delivery idle
    /// past the visibility timeout.
    async fn work_available(&self) -> Result<bool> {
        let mut redis = self.admin.redis.clone();
        let stream = self.keys.stream();
        let last: redis::Value = redis::cmd("XREVRANGE")
            .arg(&stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut redis)
            .await?;
        let last_id = first_id(&last);
        let groups: redis::Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&stream)
            .query_async(&mut redis)
            .await
            .unwrap_or(redis::Value::Nil);
        let delivered = group_field(&groups, CONSUMER_GROUP, "last-delivered-id");
        if let (Some(last), Some(delivered)) = (last_id, delivered)
            && stream_id(&last) > stream_id(&delivered)
        {
            return Ok(true);
        }
        let idle: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("IDLE")
            .arg(self.settings.visibility_timeout.as_millis() as u64)
            .arg("-")
            .arg("+")
            .arg(1)
            .query_async(&mut redis)
            .await
            .unwrap_or(redis::Value::Nil);
        Ok(matches!(&idle, redis::Value::Array(items) if !items.is_empty()))
    }

    /// The worker's next held request, if it is runnable now. A worker released last came back
    /// already (or was given `arrive` to), so only a fresh process is waited for.
    async fn runnable(&mut self, worker: usize) -> Result<std::result::Result<String, Stuck>> {
        let wait = if self.fresh[worker] {
            self.settings.start
        } else {
            Duration::ZERO
        };
        let mut notes = Vec::new();
        let front = self.gates[worker].arrival(wait, &mut notes).await;
        self.notes.extend(notes);
        let Some((fingerprint, poll)) = front else {
            return Ok(Err(Stuck::Away));
        };
        self.fresh[worker] = false;
        if poll && !self.work_available().await? {
            return Ok(Err(Stuck::Idle));
        }
        Ok(Ok(fingerprint))
    }

    async fn release(&mut self, worker: usize) -> Released {
        let gate = self.gates[worker].clone();
        match gate.release(self.settings.answer).await {
            None => {
                self.notes.push(format!(
                    "{} blocked: a released request was not answered within {} ms",
                    gate.worker,
                    self.settings.answer.as_millis()
                ));
                Released::Blocked
            }
            Some(trips) => {
                // Let it come back with its next request, so every decision sees each worker
                // either at the gate or away (blocked, busy).
                let mut notes = Vec::new();
                gate.arrival(self.settings.arrive, &mut notes).await;
                self.notes.extend(notes);
                let prints: Vec<String> = trips
                    .iter()
                    .filter(|trip| !uncounted(trip))
                    .map(|trip| gate.print(&trip.request))
                    .collect();
                if prints.is_empty() {
                    Released::Uncounted
                } else {
                    Released::Trips(prints)
                }
            }
        }
    }

    /// Runs `worker` for up to `trips` counted round trips, or until it holds before `before`;
    /// the fingerprints of what it completed.
    async fn run_worker(
        &mut self,
        worker: usize,
        trips: u32,
        before: Option<&str>,
    ) -> Result<Vec<String>> {
        let worker = self.worker(worker);
        let mut done = Vec::new();
        let mut counted = 0;
        // Uncounted releases are bounded too: a worker that only ever polls stops somewhere.
        let mut releases = 0;
        while counted < trips && releases < 400 {
            let fingerprint = match self.runnable(worker).await? {
                Ok(fingerprint) => fingerprint,
                Err(_) => break,
            };
            if before.is_some_and(|b| fingerprint.contains(b)) {
                break;
            }
            releases += 1;
            match self.release(worker).await {
                Released::Trips(prints) => {
                    counted += 1;
                    done.extend(prints);
                }
                Released::Uncounted => {}
                Released::Blocked => break,
            }
        }
        Ok(done)
    }

    async fn step(&mut self, step: &WireStep) -> Result<Vec<String>> {
        let number = self.steps_run.len() + 1;
        self.recorder.step(number, step.to_string());
        self.steps_run.push(step.clone());
        let trips = match step {
            WireStep::Run { worker, trips } => self.run_worker(*worker, *trips, None).await?,
            WireStep::Until { worker, before } => {
                self.run_worker(*worker, u32::MAX, Some(before)).await?
            }
            WireStep::Finish { worker } => self.run_worker(*worker, 200, None).await?,
            WireStep::Expire { request } => {
                let effect =
                    apply(&Fault::ExpireLease { request: *request }, &mut self.plane).await?;
                self.recorder.fault(effect);
                if let Some(key) = self.plane.services.requests.get(*request).cloned() {
                    self.expire_delivery(&key).await?;
                }
                Vec::new()
            }
            WireStep::Kill { worker } => {
                let worker = self.worker(*worker);
                let effect = apply(&Fault::CrashWorker { worker }, &mut self.plane).await?;
                self.recorder.fault(effect);
                self.fresh[worker] = true;
                // The restarted process comes to the gate before the schedule goes on.
                let _ = self.runnable(worker).await?;
                Vec::new()
            }
            WireStep::Stop { worker, ms } => {
                let worker = self.worker(*worker);
                let effect =
                    apply(&Fault::PauseWorker { worker, ms: *ms }, &mut self.plane).await?;
                self.recorder.fault(effect);
                Vec::new()
            }
            WireStep::Fault(fault) => {
                let effect = apply(fault, &mut self.plane).await?;
                self.recorder.fault(effect);
                Vec::new()
            }
        };
        self.trace.push(trips.clone());
        Ok(trips)
    }

    /// Makes the delivery of `key` idle past the visibility timeout (its owner unchanged): the
    /// next poll of any worker claims it.
    async fn expire_delivery(&self, key: &str) -> Result<bool> {
        let mut redis = self.admin.redis.clone();
        let stream = self.keys.stream();
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("-")
            .arg("+")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        let entries: redis::Value = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut redis)
            .await?;
        let Some(id) = entry_of(&entries, key) else {
            return Ok(false);
        };
        let Some(consumer) = pending_owner(&pending, &id) else {
            return Ok(false);
        };
        let idle = self.settings.visibility_timeout + Duration::from_secs(1);
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg(&consumer)
            .arg(0)
            .arg(&id)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID")
            .query_async(&mut redis)
            .await?;
        Ok(true)
    }

    /// Heals, lets every worker run free until every request is terminal (expiring the leases
    /// and deliveries of jobs nobody works on), judges what concerns this case's requests, and
    /// leaves every worker held before its next queue poll, ready for the next case.
    async fn finish(
        &mut self,
        bed: &TestBed,
        schedule: WireSchedule,
        expected: Option<&[Vec<String>]>,
    ) -> Result<WireOutcome> {
        let step = self.steps_run.len() + 1;
        self.recorder.step(
            step,
            "drain: heal, release every hold, let the workers finish".into(),
        );
        self.recorder.observe(Observation::Draining);
        self.plane.services.heal_all().await?;
        // Still under the gates, in worker order: each worker finishes what the schedule left
        // in its hands, up to its next queue poll. Only if that leaves a job open (a worker
        // died with it, or waits on another) do the workers run free while time passes.
        self.settle().await?;
        let mut settled = self.open_jobs().await?.is_empty();
        if !settled {
            for gate in &self.gates {
                gate.open();
            }
            settled = self.drain(bed).await?;
            self.settle().await?;
        }
        self.recorder.observe(Observation::Drained { settled });
        let keys: std::collections::HashSet<String> = self
            .submitted
            .iter()
            .map(|r| r.idempotency_key.clone())
            .collect();
        let events = self.recorder.events().split_off(self.events_from);
        let mut history = crate::history::collect(
            bed,
            &self.admin.pg,
            self.keys.prefix(),
            events,
            self.submitted.clone(),
        )
        .await?;
        history
            .audit
            .retain(|row| keys.contains(&row.idempotency_key));
        history
            .jobs
            .retain(|job| keys.contains(&job.idempotency_key));
        history.journal.retain(|entry| {
            entry
                .request
                .as_ref()
                .is_some_and(|call| keys.contains(&call.idempotency_key))
        });
        history.lease_ttl_ms = Some(self.settings.lease_ttl.as_millis() as u64);
        history.wire_recorded = true;
        let divergence = expected.and_then(|expected| diverged(expected, &self.trace));
        let mut timeouts: Vec<String> = Vec::new();
        for gate in &self.gates {
            timeouts.extend(gate.timeouts.lock().expect("poisoned").iter().cloned());
        }
        timeouts.extend(
            self.notes
                .iter()
                .filter(|n| n.contains("without the schedule"))
                .cloned(),
        );
        let outputs = self.plane.workers.outputs.lock().expect("poisoned").clone();
        let outcome = WireOutcome {
            schedule,
            case: CaseResult::judge(history, &self.settings.invariants),
            trace: std::mem::take(&mut self.trace),
            divergence,
            timeouts,
            notes: std::mem::take(&mut self.notes),
            outputs,
            elapsed: self.started.elapsed(),
        };
        self.clean().await?;
        Ok(outcome)
    }

    /// Every worker held before its next queue poll, in worker order (a worker that left,
    /// declining a version, is started again).
    async fn settle(&mut self) -> Result<()> {
        let processes = &mut self.plane.workers;
        for index in 0..processes.procs.len() {
            if processes.procs[index]
                .child
                .try_wait()
                .ok()
                .flatten()
                .is_some()
            {
                let spec = self.settings.workers[index].clone();
                processes.restart(index, &spec)?;
                self.fresh[index] = true;
            }
        }
        for gate in &self.gates {
            gate.close();
        }
        for worker in 0..self.gates.len() {
            let wait = if self.fresh[worker] {
                self.settings.start
            } else {
                self.settings.arrive
            };
            let mut notes = Vec::new();
            for _ in 0..100 {
                match self.gates[worker].arrival(wait, &mut notes).await {
                    Some((_, true)) => break,
                    Some((_, false)) => {
                        self.gates[worker].release(self.settings.answer).await;
                    }
                    None => break,
                }
            }
            self.fresh[worker] = false;
        }
        Ok(())
    }

    /// Between cases: the namespace's cache and version pointer gone, and no delivery of this
    /// case left to claim.
    async fn clean(&mut self) -> Result<()> {
        let mut redis = self.admin.redis.clone();
        let found =
            crate::contract::worker::scan_keys(&mut redis, &format!("{}inf:*", self.keys.prefix()))
                .await?;
        if !found.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&found)
                .query_async(&mut redis)
                .await?;
        }
        let _: i64 = redis::cmd("DEL")
            .arg(self.keys.active_version())
            .query_async(&mut redis)
            .await?;
        let stream = self.keys.stream();
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("-")
            .arg("+")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        if let redis::Value::Array(entries) = pending {
            let ids: Vec<String> = entries
                .iter()
                .filter_map(|entry| match entry {
                    redis::Value::Array(parts) => parts.first().and_then(text_of),
                    _ => None,
                })
                .collect();
            if !ids.is_empty() {
                let _: i64 = redis::cmd("XACK")
                    .arg(&stream)
                    .arg(CONSUMER_GROUP)
                    .arg(&ids)
                    .query_async(&mut redis)
                    .await?;
            }
        }
        Ok(())
    }

    /// Stops the processes and hands the links back (holding nothing).
    async fn stop(mut self) {
        for gate in &self.gates {
            gate.open();
        }
        for proc in self.plane.workers.procs.iter_mut() {
            signal(proc, Signal::SIGCONT);
            stop(proc, Duration::from_secs(2)).await;
        }
        for reader in std::mem::take(&mut self.plane.workers.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        }
        for link in self.plane.services.release_links() {
            link.links.hold(None);
        }
    }

    /// The case's requests whose job is not terminal.
    async fn open_jobs(&self) -> Result<Vec<String>> {
        let jobs = read_jobs(&self.admin.pg, self.keys.prefix()).await?;
        Ok(self
            .submitted
            .iter()
            .filter(|r| {
                jobs.iter()
                    .find(|j| j.idempotency_key == r.idempotency_key)
                    .is_none_or(|j| !j.status().is_ok_and(|s| s.is_terminal()))
            })
            .map(|r| r.idempotency_key.clone())
            .collect())
    }

    async fn drain(&mut self, _bed: &TestBed) -> Result<bool> {
        let deadline = Instant::now() + self.settings.drain;
        let mut last_expiry = Instant::now();
        loop {
            let open = self.open_jobs().await?;
            if open.is_empty() {
                return Ok(true);
            }
            if Instant::now() > deadline || crate::interrupt::requested().is_some() {
                return Ok(false);
            }
            // Nobody progressed for a while: time passes (leases and visibility timeouts run out)
            // so a job whose worker died or gave up is taken again.
            let quiet = Duration::from_millis(600);
            let last = self
                .gates
                .iter()
                .filter_map(|g| g.progress())
                .max()
                .unwrap_or(self.started);
            if last.elapsed() > quiet && last_expiry.elapsed() > quiet {
                for key in &open {
                    self.plane.services.delete_lease(key).await?;
                    self.expire_delivery(key).await?;
                }
                last_expiry = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn diverged(expected: &[Vec<String>], got: &[Vec<String>]) -> Option<Divergence> {
    let steps = expected.len().max(got.len());
    (0..steps).find_map(|i| {
        let (e, g) = (
            expected.get(i).cloned().unwrap_or_default(),
            got.get(i).cloned().unwrap_or_default(),
        );
        (e != g).then_some(Divergence {
            step: i + 1,
            expected: e,
            got: g,
        })
    })
}

fn text_of(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn first_id(entries: &redis::Value) -> Option<String> {
    match entries {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::Array(entry) => text_of(entry.first()?),
            _ => None,
        },
        _ => None,
    }
}

fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

fn pairs(value: &redis::Value) -> Vec<(String, &redis::Value)> {
    match value {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text_of(pair.first()?)?, pair.get(1)?)))
            .collect(),
        redis::Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text_of(k)?, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn group_field(groups: &redis::Value, group: &str, field: &str) -> Option<String> {
    let redis::Value::Array(groups) = groups else {
        return None;
    };
    groups.iter().find_map(|info| {
        let fields = pairs(info);
        let name = fields
            .iter()
            .find(|(k, _)| k == "name")
            .and_then(|(_, v)| text_of(v))?;
        (name == group)
            .then(|| {
                fields
                    .iter()
                    .find(|(k, _)| k == field)
                    .and_then(|(_, v)| text_of(v))
            })
            .flatten()
    })
}

fn entry_of(entries: &redis::Value, key: &str) -> Option<String> {
    let redis::Value::Array(entries) = entries else {
        return None;
    };
    entries.iter().find_map(|entry| {
        let redis::Value::Array(parts) = entry else {
            return None;
        };
        let id = text_of(parts.first()?)?;
        let fields = pairs(parts.get(1)?);
        fields
            .iter()
            .any(|(k, v)| k == "idempotency_key" && text_of(v).as_deref() == Some(key))
            .then_some(id)
    })
}

fn pending_owner(pending: &redis::Value, id: &str) -> Option<String> {
    let redis::Value::Array(entries) = pending else {
        return None;
    };
    entries.iter().find_map(|entry| {
        let redis::Value::Array(parts) = entry else {
            return None;
        };
        (text_of(parts.first()?)?.as_str() == id).then(|| text_of(parts.get(1)?))?
    })
}

// ------------------------------------------------------------------------------------ running

/// Runs `schedule` on `bed`; with `expected` (a file's trace), a run that sends other round trips
/// is reported as a divergence.
pub async fn run_wire(
    bed: &TestBed,
    settings: &WireSettings,
    schedule: &WireSchedule,
    expected: Option<&[Vec<String>]>,
) -> Result<WireOutcome> {
    let mut case = Case::open(bed, settings).await?;
    let outcome = run_on(&mut case, bed, schedule, expected).await;
    case.stop().await;
    outcome
}

/// Runs `schedule` on the processes of `case`.
async fn run_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    schedule: &WireSchedule,
    expected: Option<&[Vec<String>]>,
) -> Result<WireOutcome> {
    case.begin(&schedule.requests).await?;
    let mut failed = None;
    for step in &schedule.steps {
        if crate::interrupt::requested().is_some() {
            break;
        }
        if let Err(err) = case.step(step).await {
            failed = Some(err);
            break;
        }
    }
    let outcome = case.finish(bed, schedule.clone(), expected).await?;
    match failed {
        Some(err) => Err(err),
        None => Ok(outcome),
    }
}

/// A PCT plan: random worker priorities and `depth - 1` priority change points over `steps`
/// counted round trips; at a change point a lease expiry (or, rarely, a SIGKILL of the worker
/// that ran) may land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pct {
    /// The bug depth `d` searched for.
    pub depth: usize,
    /// Expected counted round trips of a case (`k`).
    pub steps: u32,
}

impl Default for Pct {
    fn default() -> Pct {
        Pct {
            depth: 2,
            steps: 24,
        }
    }
}

/// Runs one PCT case of seed `seed` over `requests` and returns what it did (its schedule is the
/// steps taken, replayable with [`run_wire`]).
pub async fn run_pct(
    bed: &TestBed,
    settings: &WireSettings,
    requests: &[RequestSpec],
    pct: Pct,
    seed: u64,
) -> Result<WireOutcome> {
    let mut case = Case::open(bed, settings).await?;
    let outcome = pct_on(&mut case, bed, requests, pct, seed).await;
    case.stop().await;
    outcome
}

/// Runs one PCT case on the processes of `case`.
async fn pct_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    requests: &[RequestSpec],
    pct: Pct,
    seed: u64,
) -> Result<WireOutcome> {
    let settings = case.settings.clone();
    let mut rng = StdRng::seed_from_u64(seed);
    let n = settings.workers.len();
    let d = pct.depth.max(1);
    let k = pct.steps.max(2);
    // Priorities d..d+n-1 at random; change point i lowers the running worker's to d-1-i.
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let mut priority = vec![0usize; n];
    for (rank, worker) in order.iter().enumerate() {
        priority[*worker] = d + rank;
    }
    let mut changes: Vec<u32> = Vec::new();
    while changes.len() < d - 1 {
        let at = rng.random_range(1..=k);
        if !changes.contains(&at) {
            changes.push(at);
        }
    }
    changes.sort_unstable();
    // What lands at each change point.
    let faults: Vec<Option<WireStep>> = changes
        .iter()
        .map(|_| match rng.random_range(0..8) {
            0..=4 => Some(WireStep::Expire {
                request: rng.random_range(0..requests.len().max(1)),
            }),
            5 => Some(WireStep::Kill { worker: usize::MAX }),
            _ => None,
        })
        .collect();

    case.begin(requests).await?;
    let mut steps: Vec<WireStep> = Vec::new();
    let mut counted = 0u32;
    let mut run: Option<(usize, u32, Vec<String>)> = None;
    let result: Result<()> = async {
        while counted < k * 3 {
            if crate::interrupt::requested().is_some() {
                break;
            }
            // The highest-priority runnable worker.
            let mut candidates: Vec<usize> = (0..n).collect();
            candidates.sort_by_key(|w| std::cmp::Reverse(priority[*w]));
            let mut chosen = None;
            for worker in candidates {
                if case.runnable(worker).await?.is_ok() {
                    chosen = Some(worker);
                    break;
                }
            }
            let Some(worker) = chosen else { break };
            if run.as_ref().is_some_and(|(w, _, _)| *w != worker) {
                let (w, trips, prints) = run.take().expect("run");
                steps.push(WireStep::Run { worker: w, trips });
                case.record_generated(WireStep::Run { worker: w, trips }, prints);
            }
            match case.release(worker).await {
                Released::Trips(prints) => {
                    counted += 1;
                    let entry = run.get_or_insert((worker, 0, Vec::new()));
                    entry.1 += 1;
                    entry.2.extend(prints);
                    if let Some(i) = changes.iter().position(|c| *c == counted) {
                        priority[worker] = d - 1 - i;
                        if let Some((w, trips, prints)) = run.take() {
                            steps.push(WireStep::Run { worker: w, trips });
                            case.record_generated(WireStep::Run { worker: w, trips }, prints);
                        }
                        if let Some(fault) = &faults[i] {
                            let fault = match fault {
                                WireStep::Kill { .. } => WireStep::Kill { worker },
                                other => other.clone(),
                            };
                            case.step(&fault).await?;
                            steps.push(fault);
                        }
                    }
                }
                Released::Uncounted => {}
                Released::Blocked => {}
            }
        }
        if let Some((w, trips, prints)) = run.take() {
            steps.push(WireStep::Run { worker: w, trips });
            case.record_generated(WireStep::Run { worker: w, trips }, prints);
        }
        Ok(())
    }
    .await;
    let requests = requests.to_vec();
    let outcome = case
        .finish(bed, WireSchedule { requests, steps }, None)
        .await?;
    result.map(|()| outcome)
}

impl Case<'_> {
    /// Records a step the generator took as it went (PCT decides release by release; the
    /// schedule groups them into steps afterwards).
    fn record_generated(&mut self, step: WireStep, prints: Vec<String>) {
        let number = self.steps_run.len() + 1;
        self.recorder.step(number, step.to_string());
        self.steps_run.push(step);
        self.trace.push(prints);
    }
}

/// Every depth-2 schedule of a small case: worker `a` runs `c` round trips (c = 1..=`steps`) and
/// is preempted, with or without request 0's lease expiring then; worker `b` finishes, then `a`.
pub fn depth_two(workers: usize, steps: u32, requests: &[RequestSpec]) -> Vec<WireSchedule> {
    let mut out = Vec::new();
    for expire in [true, false] {
        for c in 1..=steps {
            for a in 0..workers {
                for b in (0..workers).filter(|b| *b != a) {
                    let mut list = vec![WireStep::Run {
                        worker: a,
                        trips: c,
                    }];
                    if expire {
                        list.push(WireStep::Expire { request: 0 });
                    }
                    list.push(WireStep::Finish { worker: b });
                    list.push(WireStep::Finish { worker: a });
                    out.push(WireSchedule {
                        requests: requests.to_vec(),
                        steps: list,
                    });
                }
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------ search

/// How a wire search goes.
#[derive(Debug, Clone)]
pub struct WireSearch {
    /// Seed (PCT plans, the order of the depth-2 enumeration).
    pub seed: u64,
    /// Wall-clock budget of the search (shrinking excluded).
    pub budget: Duration,
    /// Most cases (by default none: the budget ends the search, as it ends a certification's
    /// suites; set it to reproduce a search exactly).
    pub cases: u32,
    /// Requests per case.
    pub requests: usize,
    /// Enumerate depth-2 schedules up to this many round trips of the preempted worker first
    /// (0: PCT only).
    pub depth_two_steps: u32,
    /// The PCT plan.
    pub pct: Pct,
    /// Most shrink candidates tried.
    pub shrink_runs: u32,
}

impl WireSearch {
    /// The default search of `racecert certify --worker-cmd`.
    pub fn default_for(seed: u64) -> WireSearch {
        WireSearch {
            seed,
            budget: Duration::from_secs(90),
            cases: u32::MAX,
            requests: 1,
            depth_two_steps: 14,
            pct: Pct::default(),
            shrink_runs: 40,
        }
    }
}

/// A failure a search found, shrunk.
#[derive(Debug, Clone)]
pub struct WireFound {
    /// The case number it was found at (from 1).
    pub case: u32,
    /// Time to the first failing case.
    pub after: Duration,
    /// The case as found.
    pub original: WireSchedule,
    /// The shrunk case's outcome (its schedule is the minimal one).
    pub shrunk: WireOutcome,
    /// Shrink runs made.
    pub shrink_runs: u32,
}

/// What a wire search did.
#[derive(Debug, Clone)]
pub struct WireReport {
    /// Cases run.
    pub cases: u32,
    /// Wall time of the search (shrinking excluded).
    pub elapsed: Duration,
    /// The failure, if any.
    pub found: Option<WireFound>,
    /// Cases in which a held worker timed out (a hold ended without the schedule).
    pub timeouts: u32,
    /// The last outcome (for a report when nothing failed).
    pub last: Option<WireOutcome>,
}

/// Searches wire schedules: the depth-2 enumeration (in a seeded order) for small cases, then
/// PCT, until a case breaks an invariant or the budget ends; a failure is shrunk.
pub async fn search(
    bed: &TestBed,
    settings: &WireSettings,
    search: &WireSearch,
    progress: impl Fn(u32),
) -> Result<WireReport> {
    let started = Instant::now();
    let requests: Vec<RequestSpec> = (0..search.requests.max(1))
        .map(|i| RequestSpec {
            request_id: format!("req-{i}"),
            input: format!("input-{i}"),
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(search.seed);
    let mut enumerated = if search.depth_two_steps > 0 {
        depth_two(settings.workers.len(), search.depth_two_steps, &requests)
    } else {
        Vec::new()
    };
    // Seeded order, preemptions with a lease expiry first: with nothing expired, the other
    // worker has no delivery to take and the preemption changes nothing.
    enumerated.shuffle(&mut rng);
    enumerated.sort_by_key(|s| {
        !s.steps
            .iter()
            .any(|st| matches!(st, WireStep::Expire { .. }))
    });
    let mut enumerated = enumerated.into_iter();
    let mut cases = 0;
    let mut timeouts = 0;
    let mut last = None;
    let mut case = Case::open(bed, settings).await?;
    let report = search_on(
        &mut case,
        bed,
        search,
        &requests,
        &mut enumerated,
        &mut rng,
        (&mut cases, &mut timeouts, &mut last),
        started,
        progress,
    )
    .await;
    case.stop().await;
    if let Some(report) = report? {
        return Ok(report);
    }
    Ok(WireReport {
        cases,
        elapsed: started.elapsed(),
        found: None,
        timeouts,
        last,
    })
}

#[allow(clippy::too_many_arguments)]
async fn search_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    search: &WireSearch,
    requests: &[RequestSpec],
    enumerated: &mut impl Iterator<Item = WireSchedule>,
    rng: &mut StdRng,
    (cases, timeouts, last): (&mut u32, &mut u32, &mut Option<WireOutcome>),
    started: Instant,
    progress: impl Fn(u32),
) -> Result<Option<WireReport>> {
    while *cases < search.cases && started.elapsed() < search.budget {
        if crate::interrupt::requested().is_some() {
            break;
        }
        *cases += 1;
        let outcome = match enumerated.next() {
            Some(schedule) => run_on(case, bed, &schedule, None).await?,
            None => pct_on(case, bed, requests, search.pct, rng.random()).await?,
        };
        progress(*cases);
        *timeouts += u32::from(!outcome.timeouts.is_empty());
        if !outcome.case.violations.is_empty() {
            let after = started.elapsed();
            let elapsed = after;
            let original = outcome.schedule.clone();
            let (shrunk, runs) = shrink_on(case, bed, outcome, search.shrink_runs).await?;
            return Ok(Some(WireReport {
                cases: *cases,
                elapsed,
                found: Some(WireFound {
                    case: *cases,
                    after,
                    original,
                    shrunk,
                    shrink_runs: runs,
                }),
                timeouts: *timeouts,
                last: None,
            }));
        }
        *last = Some(outcome);
    }
    Ok(None)
}

fn violated(outcome: &WireOutcome) -> Vec<Invariant> {
    let mut names: Vec<Invariant> = outcome
        .case
        .violations
        .iter()
        .map(|v| v.invariant)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Smaller variants of a schedule, smallest first: a step dropped, a run shortened, two runs of
/// one worker merged.
fn candidates(schedule: &WireSchedule) -> Vec<WireSchedule> {
    let steps = &schedule.steps;
    let mut out = Vec::new();
    let with = |steps: Vec<WireStep>| WireSchedule {
        requests: schedule.requests.clone(),
        steps,
    };
    for i in (0..steps.len()).rev() {
        let mut fewer = steps.clone();
        fewer.remove(i);
        if !fewer.is_empty() {
            out.push(with(fewer));
        }
    }
    for i in 0..steps.len().saturating_sub(1) {
        if let (
            WireStep::Run {
                worker: a,
                trips: x,
            },
            WireStep::Run {
                worker: b,
                trips: y,
            },
        ) = (&steps[i], &steps[i + 1])
            && a == b
        {
            let mut merged = steps.clone();
            merged[i] = WireStep::Run {
                worker: *a,
                trips: x + y,
            };
            merged.remove(i + 1);
            out.push(with(merged));
        }
    }
    for i in 0..steps.len() {
        if let WireStep::Run { worker, trips } = &steps[i]
            && *trips > 1
        {
            let mut shorter = steps.clone();
            shorter[i] = WireStep::Run {
                worker: *worker,
                trips: trips - 1,
            };
            out.push(with(shorter));
        }
    }
    if schedule.requests.len() > 1 {
        let mut fewer = schedule.clone();
        fewer.requests.pop();
        out.push(fewer);
    }
    out
}

/// Shrinks a failing outcome: candidates are tried in order and the first that breaks one of the
/// same invariants replaces it, until none does or `runs` candidates were tried.
pub async fn shrink(
    bed: &TestBed,
    settings: &WireSettings,
    failing: WireOutcome,
    runs: u32,
) -> Result<(WireOutcome, u32)> {
    let mut case = Case::open(bed, settings).await?;
    let shrunk = shrink_on(&mut case, bed, failing, runs).await;
    case.stop().await;
    shrunk
}

async fn shrink_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    failing: WireOutcome,
    runs: u32,
) -> Result<(WireOutcome, u32)> {
    let target = violated(&failing);
    let mut best = failing;
    let mut tried = 0;
    'outer: while tried < runs {
        for candidate in candidates(&best.schedule) {
            if tried >= runs || crate::interrupt::requested().is_some() {
                break 'outer;
            }
            tried += 1;
            let outcome = run_on(case, bed, &candidate, None).await?;
            if violated(&outcome).iter().any(|v| target.contains(v)) {
                best = outcome;
                continue 'outer;
            }
        }
        break;
    }
    Ok((best, tried))
}

// ------------------------------------------------------------------------------------ files

/// The format tag of a wire schedule file.
pub const FORMAT: &str = "racecert-wire-schedule/1";

/// A wire schedule with the settings it ran under and the round trips it released, replayed by
/// `racecert run --schedule FILE --worker-cmd CMD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireScheduleFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The worker command it was found with (for people: the replay's `--worker-cmd` decides).
    pub command: String,
    /// The workers, in index order.
    pub workers: Vec<WorkerSpec>,
    /// Defects passed to the workers.
    #[serde(default)]
    pub defects: Vec<Defect>,
    /// Invariants checked.
    pub invariants: Vec<Invariant>,
    /// Lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Visibility timeout, ms.
    pub visibility_timeout_ms: u64,
    /// Backend timeout, ms.
    pub backend_timeout_ms: u64,
    /// The invariants it broke when it was written.
    #[serde(default)]
    pub violated: Vec<Invariant>,
    /// The steps.
    pub schedule: WireSchedule,
    /// Per step, the fingerprints of the round trips it released (a replay that sees others
    /// diverged).
    pub trace: Vec<Vec<String>>,
}

impl WireScheduleFile {
    /// The file of an outcome run under `settings`.
    pub fn of(settings: &WireSettings, outcome: &WireOutcome) -> WireScheduleFile {
        WireScheduleFile {
            format: FORMAT.to_owned(),
            command: settings.command.clone(),
            workers: settings.workers.clone(),
            defects: settings.defects.iter().collect(),
            invariants: settings.invariants.clone(),
            lease_ttl_ms: settings.lease_ttl.as_millis() as u64,
            visibility_timeout_ms: settings.visibility_timeout.as_millis() as u64,
            backend_timeout_ms: settings.backend_timeout.as_millis() as u64,
            violated: violated(outcome),
            schedule: outcome.schedule.clone(),
            trace: outcome.trace.clone(),
        }
    }

    /// The settings to replay it with `command`.
    pub fn settings(&self, command: &str) -> WireSettings {
        WireSettings {
            command: command.to_owned(),
            workers: self.workers.clone(),
            defects: Defects::of(self.defects.iter().copied()),
            invariants: self.invariants.clone(),
            lease_ttl: Duration::from_millis(self.lease_ttl_ms),
            visibility_timeout: Duration::from_millis(self.visibility_timeout_ms),
            backend_timeout: Duration::from_millis(self.backend_timeout_ms),
            ..WireSettings::pair(command)
        }
    }

    /// Whether the file at `path` is a wire schedule file (by its format tag).
    pub fn is_wire(path: &Path) -> bool {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(str::to_owned))
            .is_some_and(|f| f == FORMAT)
    }

    /// Reads one; a bad one is refused with `file:line:column`.
    pub fn read(path: &Path) -> Result<WireScheduleFile> {
        let file: WireScheduleFile = crate::schedule::file::read_json(path, "wire schedule file")?;
        if file.format != FORMAT {
            return Err(Error::Config(format!(
                "{}: format {:?}, expected {FORMAT:?}",
                path.display(),
                file.format
            )));
        }
        if file.workers.is_empty() || file.schedule.steps.is_empty() {
            return Err(Error::Config(format!(
                "{}: a wire schedule file needs workers and steps",
                path.display()
            )));
        }
        Ok(file)
    }

    /// Writes it (pretty JSON), creating the directory.
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::schedule::file::write_json(self, path, "wire schedule")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests() -> Vec<RequestSpec> {
        vec![RequestSpec {
            request_id: "req-0".into(),
            input: "input-0".into(),
        }]
    }

    #[test]
    fn depth_two_enumerates_every_preemption_with_and_without_expiry() {
        let all = depth_two(2, 5, &requests());
        // 2 ordered pairs x 5 preemption points x {expiry, none}.
        assert_eq!(all.len(), 20);
        let unique: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        assert!(all.iter().all(|s| s.steps.len() <= 4));
    }

    #[test]
    fn shrink_candidates_are_smaller_and_merge_runs() {
        let schedule = WireSchedule {
            requests: requests(),
            steps: vec![
                WireStep::Run {
                    worker: 0,
                    trips: 2,
                },
                WireStep::Run {
                    worker: 0,
                    trips: 3,
                },
                WireStep::Expire { request: 0 },
            ],
        };
        let all = candidates(&schedule);
        assert!(
            all.iter()
                .all(|c| c.steps.len() < 3 || c.steps.iter().map(trips_of).sum::<u32>() < 5)
        );
        assert!(all.iter().any(|c| c.steps.first()
            == Some(&WireStep::Run {
                worker: 0,
                trips: 5
            })));
    }

    fn trips_of(step: &WireStep) -> u32 {
        match step {
            WireStep::Run { trips, .. } => *trips,
            _ => 0,
        }
    }

    #[test]
    fn a_wire_file_round_trips_and_a_divergence_names_its_step() {
        let settings = WireSettings::pair("python worker.py");
        let schedule = WireSchedule {
            requests: requests(),
            steps: vec![
                WireStep::Until {
                    worker: 0,
                    before: "UPDATE inference_jobs".into(),
                },
                WireStep::Expire { request: 0 },
                WireStep::Finish { worker: 1 },
            ],
        };
        let file = WireScheduleFile {
            format: FORMAT.into(),
            command: settings.command.clone(),
            workers: settings.workers.clone(),
            defects: Vec::new(),
            invariants: settings.invariants.clone(),
            lease_ttl_ms: 60_000,
            visibility_timeout_ms: 60_000,
            backend_timeout_ms: 3000,
            violated: vec![Invariant::AtMostOneFinalWrite],
            schedule,
            trace: vec![vec!["redis GET {ns}x".into()], vec![], vec![]],
        };
        let dir = std::env::temp_dir().join(format!("racecert-wire-{}", std::process::id()));
        let path = dir.join("case.json");
        file.write(&path).unwrap();
        assert!(WireScheduleFile::is_wire(&path));
        assert_eq!(WireScheduleFile::read(&path).unwrap(), file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"until\"", "\"sprint\"")).unwrap();
        let err = WireScheduleFile::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("case.json:") && err.contains("sprint"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
        let got = vec![vec!["redis SET {ns}x".to_owned()]];
        let divergence = diverged(&file.trace, &got).expect("diverged");
        assert_eq!(divergence.step, 1);
        assert!(diverged(&file.trace, &file.trace).is_none());
    }

    #[test]
    fn polls_that_got_nothing_and_setup_are_uncounted() {
        use crate::env::wire::RedisCommand;
        let trip = |name: &str, reply: RedisReply| RoundTrip {
            link: "l".into(),
            conn: 1,
            seq: 0,
            sent_us: 0,
            forwarded_us: Some(0),
            answered_us: Some(1),
            request: Request::Redis(RedisCommand {
                name: name.into(),
                args: vec![],
                argc: 0,
                keys: vec![],
                queued: false,
                truncated: false,
            }),
            reply: Some(Reply::Redis(reply)),
        };
        assert!(uncounted(&trip("XREADGROUP", RedisReply::Nil)));
        assert!(!uncounted(&trip(
            "XREADGROUP",
            RedisReply::Array {
                len: 1,
                items: vec![]
            }
        )));
        let empty_claim = RedisReply::Array {
            len: 3,
            items: vec![
                RedisReply::Status("0-0".into()),
                RedisReply::Array {
                    len: 0,
                    items: vec![],
                },
            ],
        };
        assert!(uncounted(&trip("XAUTOCLAIM", empty_claim)));
        assert!(uncounted(&trip("PING", RedisReply::Status("PONG".into()))));
        assert!(!uncounted(&trip("SET", RedisReply::Status("OK".into()))));
        assert!(passes(&trip("HELLO", RedisReply::Nil).request));
        assert!(!passes(&trip("XACK", RedisReply::Int(1)).request));
    }
}
