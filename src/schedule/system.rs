//! The system runner: certifies a worker racecert did not write, from its system description
//! (crate::system), on its own framework, tables and model API. It provisions what the file asks
//! (a Python environment, a setup build), gives the run a database and a Redis database of its
//! own with racecert's audit trigger on the team's result table, starts one worker process per
//! model version (each behind proxy listeners of its own, so its Redis, Postgres and model round
//! trips are recorded on the wire), then runs cases: one request, one fault the framework really
//! has, a drain, a verdict from the audit trail.
//!
//! Faults per preset (docs/systems.md, sections 4 and 5):
//! - Celery: a model call that outlives `visibility_timeout`, then a sweep (the idle worker's broker
//!   connection reset at its proxy: kombu restores on reconnect); a forced restore (the delivery's
//!   score in `unacked_index` aged, then the same sweep); SIGKILL of the pool child; SIGKILL of the
//!   main process (restarted once the delivery is older than the visibility timeout); SIGTERM
//!   (warm shutdown) mid-task; prefetch > 1 (one worker run with a prefetch multiplier, the
//!   request reserved behind a slow task until it is older than the visibility timeout, then a
//!   sweep).
//! - apalis: missed heartbeats (SIGSTOP of the worker mid-call past `heartbeat_s x
//!   missed_heartbeats`, SIGCONT once another worker finished the requeued job); SIGKILL and a
//!   restart under the same worker name.
//! - every framework: SIGKILL of the worker mid-call and a restart.

use crate::check::{self, Invariant};
use crate::contract::output_version;
use crate::env::TestBed;
use crate::env::backends::{Behaviour, ModelBackend, ProgramGuard, release_all};
use crate::env::links::{CaseLinks, WireEvent};
use crate::env::python::Venv;
use crate::env::wire::{PgRequest, Reply, Request, TxStatus};
use crate::history::{Event, EventKind, History, Observation};
use crate::system::preset::{
    APALIS_INSERT, CELERY_PREFETCH_ENV, audit_sql, celery_keys, celery_message, fault_prefetch,
};
use crate::system::{Framework, Submit, System, fill};
use crate::{Error, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A fault the system runner injects into one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum SystemFault {
    /// Celery: the model call outlives `visibility_timeout`; a sweep restores the delivery.
    VisibilityOutlived,
    /// Celery: the delivery's score in `unacked_index` is aged; a sweep restores it.
    ForcedRestore,
    /// Celery: SIGKILL of the pool child running the task.
    KillPoolChild,
    /// SIGKILL of the worker process (Celery: the main process) mid-call, then a restart.
    KillMain,
    /// Celery: SIGTERM (warm shutdown) mid-task, then a restart.
    WarmShutdown,
    /// apalis: SIGSTOP mid-call past the heartbeat deadline, SIGCONT after the requeue ran.
    HeartbeatMiss,
    /// Celery: one worker runs with a prefetch multiplier > 1 and reserves the request behind a
    /// slow task; the reserved delivery outlives `visibility_timeout` and a sweep restores it.
    PrefetchRestore,
}

impl SystemFault {
    /// Every fault, in name order.
    pub const ALL: [SystemFault; 7] = [
        SystemFault::VisibilityOutlived,
        SystemFault::ForcedRestore,
        SystemFault::KillPoolChild,
        SystemFault::KillMain,
        SystemFault::WarmShutdown,
        SystemFault::HeartbeatMiss,
        SystemFault::PrefetchRestore,
    ];

    /// Its name (`forced-restore`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SystemFault::VisibilityOutlived => "visibility-outlived",
            SystemFault::ForcedRestore => "forced-restore",
            SystemFault::KillPoolChild => "kill-pool-child",
            SystemFault::KillMain => "kill-main",
            SystemFault::WarmShutdown => "warm-shutdown",
            SystemFault::HeartbeatMiss => "heartbeat-miss",
            SystemFault::PrefetchRestore => "prefetch-restore",
        }
    }

    /// The faults a framework really has, weighted: the redelivery faults twice, since they are
    /// what turns a slow attempt into a second writer.
    pub fn of(framework: Framework) -> Vec<SystemFault> {
        use SystemFault::*;
        match framework {
            Framework::Celery => vec![
                ForcedRestore,
                VisibilityOutlived,
                KillPoolChild,
                ForcedRestore,
                VisibilityOutlived,
                KillMain,
                WarmShutdown,
                PrefetchRestore,
            ],
            Framework::Apalis => vec![HeartbeatMiss, HeartbeatMiss, KillMain],
            Framework::Custom => vec![KillMain],
        }
    }

    /// Whether `framework` has this fault.
    pub fn applies_to(self, framework: Framework) -> bool {
        SystemFault::of(framework).contains(&self)
    }
}

impl std::fmt::Display for SystemFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SystemFault {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        SystemFault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault {s:?} (one of: {})",
                    SystemFault::ALL.map(SystemFault::name).join(", ")
                )
            })
    }
}

/// Settings of a system run.
#[derive(Debug, Clone)]
pub struct SystemSettings {
    /// Cases at most.
    pub cases: u32,
    /// The run's seed: case `n`'s fault and ids come from `(seed, n)`.
    pub seed: u64,
    /// Wall-clock budget for the cases (start-up and setup not counted).
    pub budget: Duration,
    /// Faults run in turn, case 1 the first (empty: drawn from the framework's own by the seed).
    pub faults: Vec<SystemFault>,
    /// Only this case number (a replay); `None`: cases 1, 2, ...
    pub only_case: Option<u32>,
    /// Stop at the first failing case.
    pub stop_at_first_failure: bool,
    /// How long a worker may take to be ready.
    pub startup_deadline: Duration,
    /// What the run is looking for (a replay's diagnoses): with goals, a case whose fault serves
    /// only goals already met is skipped. Empty: every case runs.
    pub goals: Vec<Goal>,
}

/// Something a run looks for: a case with one of `faults` that breaks one of `breaks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Goal {
    /// The faults that can meet it.
    pub faults: Vec<SystemFault>,
    /// The invariants whose breach meets it.
    pub breaks: Vec<String>,
}

impl Goal {
    /// Whether one of `cases` met it.
    pub fn met(&self, cases: &[SystemCase]) -> bool {
        cases.iter().any(|case| {
            self.faults.contains(&case.fault)
                && case
                    .violations
                    .iter()
                    .any(|v| self.breaks.contains(&v.invariant))
        })
    }
}

/// Whether a case with `fault` can still meet a goal (always, without goals).
fn still_needed(goals: &[Goal], fault: SystemFault, cases: &[SystemCase]) -> bool {
    goals.is_empty()
        || goals
            .iter()
            .any(|goal| goal.faults.contains(&fault) && !goal.met(cases))
}

impl SystemSettings {
    /// Up to 20 cases in 60 seconds, stopping at the first failure.
    pub fn certify(seed: u64) -> SystemSettings {
        SystemSettings {
            cases: 20,
            seed,
            budget: Duration::from_secs(60),
            faults: Vec::new(),
            only_case: None,
            stop_at_first_failure: true,
            startup_deadline: Duration::from_secs(60),
            goals: Vec::new(),
        }
    }
}

/// One arrow (or fault band, or note) of a case's sequence diagram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Arrow {
    /// Milliseconds since the case started.
    pub at_ms: i64,
    /// Lane it starts at.
    pub from: String,
    /// Lane it ends at (same as `from` for a fault band or a note).
    pub to: String,
    /// Text on it.
    pub label: String,
    /// `message`, `fault`, `write` or `violation`.
    pub kind: String,
}

/// A broken invariant in one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemViolation {
    /// `at-most-one-final-write`, `no-lost-job`, `result-names-its-version`, and with `[keys]`
    /// the wire checks of the worker's own leases and cache (`lease-discipline`, ...).
    pub invariant: String,
    /// The request.
    pub request: String,
    /// What was seen.
    pub observed: String,
    /// The audit rows (or other facts) proving it.
    pub evidence: Vec<String>,
}

/// One final write, as the audit trigger recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditWrite {
    /// `INSERT` or `UPDATE`.
    pub op: String,
    /// Previous status.
    pub old_status: Option<String>,
    /// New status.
    pub new_status: Option<String>,
    /// Output column.
    pub output: Option<String>,
    /// Version column.
    pub model_version: Option<String>,
    /// Transaction id.
    pub txid: i64,
    /// Unix milliseconds.
    pub at_ms: i64,
    /// The worker whose wire carried the write (from its recorded Postgres round trips).
    pub worker: Option<String>,
}

/// One case of a system run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemCase {
    /// Its number (replay with `--case`).
    pub number: u32,
    /// The fault injected.
    pub fault: SystemFault,
    /// The request submitted.
    pub request: String,
    /// Every write of the request's row, in order.
    pub writes: Vec<AuditWrite>,
    /// Broken invariants.
    pub violations: Vec<SystemViolation>,
    /// The sequence diagram.
    pub diagram: Vec<Arrow>,
    /// Lanes of the diagram, left to right.
    pub lanes: Vec<String>,
    /// How long it took.
    pub elapsed_ms: u64,
    /// Model calls made for the request.
    pub model_calls: usize,
    /// Writes that set a terminal status.
    pub final_writes: usize,
}

/// The result of a system run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemOutcome {
    /// The system's name.
    pub system: String,
    /// The seed.
    pub seed: u64,
    /// Cases run.
    pub cases: Vec<SystemCase>,
    /// Per worker, how long it took to be ready (first start).
    pub startup_ms: BTreeMap<String, u64>,
    /// Milliseconds from the first case's start to the end of the first failing case.
    pub first_failure_ms: Option<u64>,
    /// Per process start (`worker-a#1`): its stdout and stderr.
    pub outputs: BTreeMap<String, String>,
    /// Every line the workers printed, in the order racecert read them (what the team's log
    /// collector would hold; `racecert replay LOG --system FILE` reads it back).
    #[serde(default)]
    pub log: Vec<WorkerLine>,
}

/// One line a worker printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerLine {
    /// Unix milliseconds when racecert read it.
    pub at_ms: i64,
    /// The worker (`worker-a`), the same across its restarts.
    pub worker: String,
    /// The line.
    pub line: String,
}

impl SystemOutcome {
    /// No case broke an invariant.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.violations.is_empty())
    }

    /// The first failing case.
    pub fn first_failure(&self) -> Option<&SystemCase> {
        self.cases.iter().find(|c| !c.violations.is_empty())
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Lines the workers printed: (unix ms, process label, line).
type Lines = Arc<Mutex<Vec<(i64, String, String)>>>;
/// Round trips the workers' links carried: (unix ms, event).
type Wire = Arc<Mutex<Vec<(i64, WireEvent)>>>;

/// One worker of the fleet: its identity, its links, its current process.
struct Worker {
    id: String,
    version: String,
    /// The start command, placeholders filled.
    command: String,
    env: Vec<(String, String)>,
    links: CaseLinks,
    /// Its model's URL (its own proxy).
    model_url: String,
    child: Option<Child>,
    starts: u32,
    /// Variables a case adds to the file's for this worker's next starts (the prefetch fault's
    /// multiplier); empty for the fleet as the file describes it.
    extra_env: Vec<(String, String)>,
}

impl Worker {
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| c.id()).map(|p| p as i32)
    }

    /// The worker's main process: the child itself when the command was exec'ed, else the
    /// shell's first child.
    fn main_pid(&self) -> Option<i32> {
        let pid = self.pid()?;
        if simple_command(&self.command) {
            Some(pid)
        } else {
            children_of(pid).into_iter().min().or(Some(pid))
        }
    }

    fn signal_group(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(-pid), signal);
        }
    }
}

/// The running system: its workers and what they printed and sent.
struct Fleet<'a> {
    system: &'a System,
    ready: Option<String>,
    workers: Vec<Worker>,
    lines: Lines,
    wire: Wire,
    readers: Vec<tokio::task::JoinHandle<()>>,
    deadline: Duration,
}

impl Fleet<'_> {
    /// Starts worker `index` and waits until it is ready: its `ready` line, else its first
    /// broker or database round trip. A process that exits first is an error naming the command
    /// and its stderr.
    async fn start(&mut self, index: usize) -> Result<Duration> {
        let started = Instant::now();
        let worker = &mut self.workers[index];
        worker.starts += 1;
        let label = format!("{}#{}", worker.id, worker.starts);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            // A simple command is exec'ed, so the child is the worker itself (its pool children
            // are the child's); a compound one runs as written.
            .arg(if simple_command(&worker.command) {
                format!("exec {}", worker.command)
            } else {
                worker.command.clone()
            })
            .current_dir(&self.system.start.workdir)
            .env_clear()
            .envs(
                ["PATH", "HOME", "LANG"]
                    .iter()
                    .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))),
            )
            .envs(worker.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(
                worker
                    .extra_env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let mut child = command.spawn().map_err(|err| {
            Error::io(
                format!(
                    "{}: start `{}` in {}",
                    self.system.place("start.command"),
                    worker.command,
                    self.system.start.workdir.display()
                ),
                err,
            )
        })?;
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let (lines, label) = (self.lines.clone(), label.clone());
            self.readers.push(tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines
                        .lock()
                        .expect("poisoned")
                        .push((now_ms(), label.clone(), line));
                }
            }));
        }
        worker.child = Some(child);
        let ready = self.ready.as_ref().map(|r| {
            fill(
                r,
                &[
                    ("worker_id", &worker.id),
                    ("model_version", &worker.version),
                ],
            )
        });
        let id = worker.id.clone();
        let shown = worker.command.clone();
        loop {
            let seen = match &ready {
                Some(ready) => self
                    .lines
                    .lock()
                    .expect("poisoned")
                    .iter()
                    .any(|(_, l, line)| *l == label && line.contains(ready.as_str())),
                None => self
                    .wire
                    .lock()
                    .expect("poisoned")
                    .iter()
                    .any(|(_, e)| e.worker == id && e.service != "postgres"),
            };
            if seen {
                return Ok(started.elapsed());
            }
            let worker = &mut self.workers[index];
            if let Some(status) = worker
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                // Let the readers take the last lines.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(Error::Config(format!(
                    "{}: worker {id} `{}` exited ({status}) before it was ready{}; its output:\n{}",
                    self.system.place("start.command"),
                    shown,
                    ready
                        .as_ref()
                        .map(|r| format!(" (no line containing {r:?})"))
                        .unwrap_or_default(),
                    self.output_of(&label, 25)
                )));
            }
            if started.elapsed() > self.deadline || crate::interrupt::requested().is_some() {
                return Err(Error::Config(format!(
                    "{}: worker {id} `{}` was not ready within {:?}{}; its output:\n{}",
                    self.system.place("start.command"),
                    shown,
                    self.deadline,
                    ready
                        .as_ref()
                        .map(|r| format!(" (no line containing {r:?})"))
                        .unwrap_or_default(),
                    self.output_of(&label, 25)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `n` lines process `label` printed.
    fn output_of(&self, label: &str, n: usize) -> String {
        let lines = self.lines.lock().expect("poisoned");
        let mine: Vec<&str> = lines
            .iter()
            .filter(|(_, l, _)| l == label)
            .map(|(_, _, line)| line.as_str())
            .collect();
        let tail = &mine[mine.len().saturating_sub(n)..];
        if tail.is_empty() {
            "  (nothing)".into()
        } else {
            tail.iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    }

    /// Stops worker `index`: SIGCONT, SIGTERM, SIGKILL of its group after `grace`.
    async fn stop(&mut self, index: usize, grace: Duration) {
        let worker = &mut self.workers[index];
        worker.signal_group(Signal::SIGCONT);
        worker.signal_group(Signal::SIGTERM);
        if let Some(mut child) = worker.child.take() {
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                if let Some(pid) = child.id() {
                    let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
                }
                let _ = child.wait().await;
            }
            worker.child = Some(child);
        }
        worker.signal_group(Signal::SIGKILL);
        worker.child = None;
    }

    /// Whether worker `index`'s process has exited.
    fn exited(&mut self, index: usize) -> bool {
        self.workers[index]
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }
}

/// A command `exec` can replace the shell with: no list, pipe or subshell.
fn simple_command(command: &str) -> bool {
    !command.contains([';', '&', '|', '\n', '(', '`'])
}

/// The children of process `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    // The name may hold spaces and parentheses: fields resume after the last ')'.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split(' ').nth(1)?.parse::<i32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Replaces the path (and keeps the query) of a `scheme://authority/path?query` URL.
fn with_path(url: &str, path: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let query = rest[authority_end..]
        .find('?')
        .map(|q| &rest[authority_end + q..])
        .unwrap_or("");
    format!("{scheme}://{}/{path}{query}", &rest[..authority_end])
}

/// Links of a worker's own (Redis and Postgres proxies), every round trip recorded as its.
async fn open_links(bed: &TestBed, wire: &Wire, id: &str) -> Result<CaseLinks> {
    let links = bed.links(false, true).await?;
    let sink = wire.clone();
    links.record(
        id,
        Arc::new(move |event: WireEvent| {
            sink.lock().expect("poisoned").push((now_ms(), event));
        }),
    );
    Ok(links)
}

/// Fills a worker's command and environment from the file's placeholders and its links.
fn configure(system: &System, worker: &mut Worker, redis_db: u64, database: &str, venv: &str) {
    let redis_url = with_path(worker.links.redis_url(), &redis_db.to_string());
    let database_url = with_path(worker.links.database_url(), database);
    let values = [
        ("worker_id", worker.id.as_str()),
        ("model_version", worker.version.as_str()),
        ("redis_url", redis_url.as_str()),
        ("database_url", database_url.as_str()),
        ("model_url", worker.model_url.as_str()),
        ("venv", venv),
    ];
    worker.env = system
        .start
        .env
        .iter()
        .map(|(k, v)| (k.clone(), fill(v, &values)))
        .collect();
    worker.command = fill(&system.start.command, &values);
}

/// Runs a system against `bed` and judges every case from the audit trail.
pub async fn run_system(
    bed: &TestBed,
    system: &System,
    settings: &SystemSettings,
) -> Result<SystemOutcome> {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let faults = if settings.faults.is_empty() {
        SystemFault::of(system.framework)
    } else {
        settings.faults.clone()
    };
    if let Some(bad) = faults.iter().find(|f| !f.applies_to(system.framework)) {
        return Err(Error::Config(format!(
            "fault {bad} does not apply to framework {:?} (its faults: {})",
            system.framework.name(),
            SystemFault::of(system.framework)
                .iter()
                .map(|f| f.name())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    // The Python environment, built once per requirements file and cached.
    let venv = match &system.start.requirements {
        Some(requirements) => {
            let requirements = requirements.clone();
            let venv = tokio::task::spawn_blocking(move || Venv::ensure(&requirements))
                .await
                .map_err(|err| Error::other(format!("venv task: {err}")))??;
            venv.dir().display().to_string()
        }
        None => String::new(),
    };
    // A database and a Redis database of the run's own: frameworks use fixed names (`celery`,
    // `unacked`, `apalis.jobs`).
    let database = format!("racecert_sys_{}_{run}", std::process::id());
    let redis_db = 1 + (std::process::id() as u64 + run) % 15;
    let admin_url = bed.database_direct_url();
    let mut admin = PgConnection::connect(&admin_url).await?;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {database}")))
        .execute(&mut admin)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await?;
    let outcome = run_in_database(
        bed, system, settings, &faults, &venv, &database, redis_db, run,
    )
    .await;
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {database} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn run_in_database(
    bed: &TestBed,
    system: &System,
    settings: &SystemSettings,
    faults: &[SystemFault],
    venv: &str,
    database: &str,
    redis_db: u64,
    run: u64,
) -> Result<SystemOutcome> {
    // The model backends of the run, answering in the worker's own API.
    let mut backends = Vec::new();
    for (version, name) in &system.versions {
        backends.push(ModelBackend::start_with(name, version, system.model.clone()).await);
    }
    let mut model_proxies = Vec::new();
    let outcome = run_with_backends(
        bed,
        system,
        settings,
        faults,
        venv,
        database,
        redis_db,
        run,
        &backends,
        &mut model_proxies,
    )
    .await;
    for name in model_proxies {
        let _ = bed.toxiproxy().delete(&name).await;
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn run_with_backends(
    bed: &TestBed,
    system: &System,
    settings: &SystemSettings,
    faults: &[SystemFault],
    venv: &str,
    database: &str,
    redis_db: u64,
    run: u64,
    backends: &[ModelBackend],
    model_proxies: &mut Vec<String>,
) -> Result<SystemOutcome> {
    let db_url = with_path(&bed.database_direct_url(), database);
    let mut pg = PgConnection::connect(&db_url).await?;
    prepare_results(&mut pg, system).await?;
    let redis_url = with_path(&bed.redis_direct_url(), &redis_db.to_string());
    let redis = redis::Client::open(redis_url.as_str())?;
    let (connect, reply) = crate::contract::worker::HARNESS_REDIS_PATIENCE;
    let mut rd = redis
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect))
                .set_response_timeout(Some(reply)),
        )
        .await?;
    let _: () = redis::cmd("FLUSHDB").query_async(&mut rd).await?;

    let lines: Lines = Arc::default();
    let wire: Wire = Arc::default();
    let mut workers = Vec::new();
    for (i, (version, _)) in system.versions.iter().enumerate() {
        let id = format!("worker-{}", (b'a' + i as u8) as char);
        let links = open_links(bed, &wire, &id).await?;
        // The worker's own proxy in front of its version's model.
        let proxy_name = format!("{}-sys{run}-{id}-model", bed.id());
        let proxy = bed
            .toxiproxy()
            .create(&proxy_name, "127.0.0.1:0", &backends[i].addr().to_string())
            .await?;
        model_proxies.push(proxy_name);
        let model_url = format!("http://{}", proxy.listen());
        let mut worker = Worker {
            id,
            command: String::new(),
            version: version.clone(),
            env: Vec::new(),
            links,
            model_url,
            child: None,
            starts: 0,
            extra_env: Vec::new(),
        };
        configure(system, &mut worker, redis_db, database, venv);
        workers.push(worker);
    }
    if let Some(setup) = &system.start.setup {
        // The caller's tool set-up only, none of the workers' variables nor racecert's own (a
        // build must not see the run's DATABASE_URL: sqlx's macros would check their queries
        // against the empty test database; nor cargo's variables of an enclosing `cargo test`,
        // which would make the team's build start over).
        let output = Command::new("sh")
            .arg("-c")
            .arg(setup)
            .current_dir(&system.start.workdir)
            .env_clear()
            .envs(
                [
                    "PATH",
                    "HOME",
                    "LANG",
                    "CARGO_HOME",
                    "RUSTUP_HOME",
                    "TMPDIR",
                ]
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))),
            )
            .output()
            .await
            .map_err(|err| Error::io(format!("setup `{setup}`"), err))?;
        if !output.status.success() {
            return Err(Error::Config(format!(
                "{}: setup `{setup}` failed ({}):\n{}",
                system.place("start.setup"),
                output.status,
                tail(&String::from_utf8_lossy(&output.stderr), 20)
            )));
        }
    }
    let mut fleet = Fleet {
        system,
        ready: system.start.ready.clone(),
        workers,
        lines: lines.clone(),
        wire: wire.clone(),
        readers: Vec::new(),
        deadline: settings.startup_deadline,
    };
    let mut startup_ms = BTreeMap::new();
    let mut result = Ok(());
    // One at a time: two start-ups at once share the machine's cores and would each look slower.
    for index in 0..fleet.workers.len() {
        match fleet.start(index).await {
            Ok(took) => {
                startup_ms.insert(fleet.workers[index].id.clone(), took.as_millis() as u64);
            }
            Err(err) => {
                result = Err(err);
                break;
            }
        }
    }
    let mut cases = Vec::new();
    let mut first_failure_ms = None;
    if result.is_ok() {
        let began = Instant::now();
        let numbers: Vec<u32> = match settings.only_case {
            Some(n) => vec![n],
            None => (1..=settings.cases).collect(),
        };
        for number in numbers {
            if crate::interrupt::requested().is_some()
                || (settings.only_case.is_none() && began.elapsed() >= settings.budget)
            {
                break;
            }
            let mut rng = StdRng::seed_from_u64(settings.seed ^ (u64::from(number) << 32));
            // Faults given: each in turn, so every one is exercised; else drawn from the seed.
            let drawn = rng.random_range(0..faults.len());
            let fault = if settings.faults.is_empty() {
                faults[drawn]
            } else {
                faults[(number as usize - 1) % faults.len()]
            };
            if !still_needed(&settings.goals, fault, &cases) {
                continue;
            }
            let mut ctx = CaseCtx {
                bed,
                redis_db,
                database: database.to_owned(),
                venv: venv.to_owned(),
                backends,
                system,
                fleet: &mut fleet,
                pg: &mut pg,
                rd: &mut rd,
                rng,
                prefix: format!("rs{}x{run}c{number}", std::process::id()),
                arrows: Vec::new(),
                t0: now_ms(),
                first: number == 1 || settings.only_case.is_some(),
                companions: Vec::new(),
            };
            let started = Instant::now();
            match run_case(&mut ctx, number, fault, venv, redis_db, database).await {
                Ok(mut case) => {
                    case.elapsed_ms = started.elapsed().as_millis() as u64;
                    let failed = !case.violations.is_empty();
                    cases.push(case);
                    if failed {
                        first_failure_ms.get_or_insert(began.elapsed().as_millis() as u64);
                        if settings.stop_at_first_failure {
                            break;
                        }
                    }
                }
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
    }
    for index in 0..fleet.workers.len() {
        fleet.stop(index, Duration::from_secs(5)).await;
    }
    for reader in std::mem::take(&mut fleet.readers) {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    for worker in &fleet.workers {
        worker.links.stop_recording();
    }
    result?;
    let mut outputs: BTreeMap<String, String> = BTreeMap::new();
    let mut log = Vec::new();
    for (at_ms, label, line) in lines.lock().expect("poisoned").iter() {
        let entry = outputs.entry(label.clone()).or_default();
        entry.push_str(line);
        entry.push('\n');
        log.push(WorkerLine {
            at_ms: *at_ms,
            worker: label.split('#').next().unwrap_or(label).to_owned(),
            line: line.clone(),
        });
    }
    // Stdout and stderr are read by separate tasks: time order, as a collector would merge them.
    log.sort_by_key(|l| l.at_ms);
    Ok(SystemOutcome {
        system: system.name.clone(),
        seed: settings.seed,
        cases,
        startup_ms,
        first_failure_ms,
        outputs,
        log,
    })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Applies the schema, checks every declared column exists, installs the audit trigger.
async fn prepare_results(pg: &mut PgConnection, system: &System) -> Result<()> {
    let results = &system.results;
    if let Some(schema) = &results.schema {
        let sql = std::fs::read_to_string(schema).map_err(|err| Error::io_at(schema, err))?;
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *pg)
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "{}: applying schema {}: {err}",
                    system.place("results.table"),
                    schema.display()
                ))
            })?;
    }
    let columns: Vec<String> = sqlx::query(
        "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1 \
         AND table_schema = current_schema() ORDER BY ordinal_position",
    )
    .bind(&results.table)
    .fetch_all(&mut *pg)
    .await?
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect();
    if columns.is_empty() {
        return Err(Error::Config(format!(
            "{}: table {:?} does not exist{}",
            system.place("results.table"),
            results.table,
            match &results.schema {
                Some(schema) => format!(" after applying {}", schema.display()),
                None => " (no `schema` file to create it)".into(),
            }
        )));
    }
    for (field, column) in [
        ("results.key", Some(&results.key)),
        ("results.status", Some(&results.status)),
        ("results.output", Some(&results.output)),
        ("results.version", results.version.as_ref()),
    ] {
        if let Some(column) = column
            && !columns.contains(column)
        {
            return Err(Error::Config(format!(
                "{}: table {:?} has no column {column:?} (its columns: {})",
                system.place(field),
                results.table,
                columns.join(", ")
            )));
        }
    }
    sqlx::raw_sql(AssertSqlSafe(audit_sql(results)))
        .execute(&mut *pg)
        .await?;
    Ok(())
}

/// What a case works with.
struct CaseCtx<'a, 'f> {
    bed: &'a TestBed,
    redis_db: u64,
    database: String,
    venv: String,
    backends: &'a [ModelBackend],
    system: &'a System,
    fleet: &'a mut Fleet<'f>,
    pg: &'a mut PgConnection,
    rd: &'a mut redis::aio::MultiplexedConnection,
    rng: StdRng,
    prefix: String,
    arrows: Vec<Arrow>,
    t0: i64,
    first: bool,
    /// Inputs of requests a case submits besides its own (the prefetch fault's slow task in
    /// front of it): their model calls are not the request's.
    companions: Vec<String>,
}

impl CaseCtx<'_, '_> {
    fn note(&mut self, from: &str, to: &str, label: impl Into<String>, kind: &str) {
        self.arrows.push(Arrow {
            at_ms: now_ms() - self.t0,
            from: from.to_owned(),
            to: to.to_owned(),
            label: label.into(),
            kind: kind.to_owned(),
        });
    }

    /// Slows every version's model for this case's calls.
    async fn slow_models(&self, delay: Duration) -> Result<Vec<ProgramGuard>> {
        let mut guards = Vec::new();
        for backend in self.backends {
            guards.push(
                backend
                    .program(&self.prefix, Behaviour::Delay(delay))
                    .await?,
            );
        }
        Ok(guards)
    }

    /// Model calls of this case so far, per version.
    async fn calls(&self) -> Result<Vec<(String, usize)>> {
        let mut out = Vec::new();
        for backend in self.backends {
            let n = backend.journal(Some(&self.prefix)).await.len();
            out.push((backend.version().to_owned(), n));
        }
        Ok(out)
    }

    /// Model calls of the case's own request (its companions' left out), every version.
    async fn request_calls(&self) -> usize {
        let mut n = 0;
        for backend in self.backends {
            n += backend
                .journal(Some(&self.prefix))
                .await
                .iter()
                .filter(|e| {
                    e.request
                        .as_ref()
                        .is_none_or(|r| !self.companions.contains(&r.input))
                })
                .count();
        }
        n
    }

    /// Resets worker `index`'s broker connection at its proxy: live connections drop, the
    /// framework reconnects (Celery's consumer runs its restore sweep on reconnect).
    async fn reset_broker(&mut self, index: usize) -> Result<()> {
        let id = self.fleet.workers[index].id.clone();
        let proxy = &self.fleet.workers[index].links.redis;
        proxy.disable().await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut enabled = proxy.enable().await;
        for _ in 0..5 {
            if enabled.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            enabled = proxy.enable().await;
        }
        if let Err(err) = enabled {
            // The listener's port was taken while it was closed (another process on this
            // machine bound it): the worker gets new links and a restart, whose start runs the
            // same restore sweep.
            self.note(
                &id,
                "redis",
                format!("its proxy could not listen again ({err}): new links, restart"),
                "fault",
            );
            self.fleet.stop(index, Duration::from_secs(5)).await;
            let links = open_links(self.bed, &self.fleet.wire, &id).await?;
            let worker = &mut self.fleet.workers[index];
            worker.links = links;
            configure(
                self.system,
                worker,
                self.redis_db,
                &self.database,
                &self.venv,
            );
            self.fleet.start(index).await?;
            return Ok(());
        }
        self.note(
            &id,
            "redis",
            "broker connection reset at its proxy",
            "fault",
        );
        Ok(())
    }

    /// Submits one request the way the framework's clients do; the Celery preset returns the
    /// delivery tag it wrote.
    async fn submit(&mut self, request_id: &str, input: &str) -> Result<Option<String>> {
        let system = self.system;
        let venv = self.venv.clone();
        let venv = venv.as_str();
        let database = self.database.clone();
        let database = database.as_str();
        let values = [("request_id", request_id), ("input", input), ("venv", venv)];
        let mut delivery_tag = None;
        match &system.submit {
            Submit::Preset { task, args, queue } => {
                let args: BTreeMap<String, String> = args
                    .iter()
                    .map(|(k, v)| (k.clone(), fill(v, &values)))
                    .collect();
                match system.framework {
                    Framework::Celery => {
                        let rng = &mut self.rng;
                        let message =
                            celery_message(task, queue, &args, &mut || rng.random::<u128>());
                        let _: i64 = redis::cmd("LPUSH")
                            .arg(queue)
                            .arg(&message.envelope)
                            .query_async(self.rd)
                            .await?;
                        self.note(
                            "racecert",
                            "redis",
                            format!(
                                "LPUSH {queue} {task}[{}] tag {}",
                                message.task_id, message.delivery_tag
                            ),
                            "message",
                        );
                        delivery_tag = Some(message.delivery_tag);
                    }
                    Framework::Apalis => {
                        let job = serde_json::to_string(&args)
                            .map_err(|e| Error::other(e.to_string()))?;
                        let id: String = sqlx::query_scalar(APALIS_INSERT)
                        .bind(task)
                        .bind(&job)
                        .fetch_one(&mut *self.pg)
                        .await
                        .map_err(|err| {
                            Error::Config(format!(
                                "{}: enqueueing an apalis job failed (are apalis' tables created by the worker?): {err}",
                                system.place("submit")
                            ))
                        })?;
                        self.note(
                            "racecert",
                            "db",
                            format!("INSERT apalis.jobs {task} id {id}"),
                            "message",
                        );
                    }
                    Framework::Custom => unreachable!("validated: custom has no preset"),
                }
            }
            Submit::Command(command) => {
                let redis_url = String::new();
                let command = fill(
                    command,
                    &[
                        ("request_id", request_id),
                        ("input", input),
                        ("venv", venv),
                        ("redis_url", &redis_url),
                        ("database_url", database),
                    ],
                );
                let output = Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .current_dir(&system.start.workdir)
                    .envs(
                        self.fleet.workers[0]
                            .env
                            .iter()
                            .map(|(k, v)| (k.as_str(), v.as_str())),
                    )
                    .output()
                    .await
                    .map_err(|err| Error::io(format!("submit `{command}`"), err))?;
                if !output.status.success() {
                    return Err(Error::Config(format!(
                        "{}: submit command `{command}` failed ({}):\n{}",
                        system.place("submit"),
                        output.status,
                        tail(&String::from_utf8_lossy(&output.stderr), 20)
                    )));
                }
                self.note(
                    "racecert",
                    "racecert",
                    format!("submitted with `{command}`"),
                    "message",
                );
            }
        }
        Ok(delivery_tag)
    }

    /// Ages the delivery in kombu's unacked index so the next sweep restores it.
    async fn age_delivery(&mut self, tag: &str) -> Result<bool> {
        let changed: i64 = redis::cmd("ZADD")
            .arg(celery_keys::UNACKED_INDEX)
            .arg("XX")
            .arg("CH")
            .arg(1)
            .arg(tag)
            .query_async(self.rd)
            .await?;
        self.note(
            "racecert",
            "redis",
            format!("ZADD unacked_index XX CH 1 {tag} (aged: {})", changed == 1),
            "fault",
        );
        Ok(changed == 1)
    }
}

async fn run_case(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: SystemFault,
    venv: &str,
    redis_db: u64,
    database: &str,
) -> Result<SystemCase> {
    let system = ctx.system;
    let request_id = format!("{}-req", ctx.prefix);
    let input = format!("{} hello world {number}", ctx.prefix);
    let vt = system
        .celery
        .as_ref()
        .map(|c| Duration::from_secs_f64(c.visibility_timeout_s))
        .unwrap_or(Duration::from_secs(5));
    let orphan = system
        .apalis
        .as_ref()
        .map(|a| Duration::from_secs_f64(a.heartbeat_s * f64::from(a.missed_heartbeats)))
        .unwrap_or(Duration::from_secs(6));
    // How long the first attempt's model call lasts: past what the fault needs, below the
    // worker's own model timeout (a slow model it waits for, not an upstream failure).
    let slow = match fault {
        SystemFault::VisibilityOutlived => vt + Duration::from_secs(6),
        SystemFault::ForcedRestore => Duration::from_secs(6),
        // The task in front of the request runs past the request's visibility timeout and the
        // sweep after it (a worker start), so the request is still reserved when it is restored.
        SystemFault::PrefetchRestore => vt + Duration::from_secs(8),
        SystemFault::HeartbeatMiss => orphan + Duration::from_secs(6),
        _ => Duration::from_secs(3),
    }
    .min(
        system
            .model_timeout
            .saturating_sub(Duration::from_millis(500)),
    );
    prepare_fleet(ctx, fault).await?;
    let mut slow_guards = ctx.slow_models(slow).await?;
    ctx.note(
        "racecert",
        "racecert",
        format!(
            "case {number}: fault {fault}, every model answers in {} ms",
            slow.as_millis()
        ),
        "message",
    );

    let delivery_tag = if fault == SystemFault::PrefetchRestore {
        // A slow task first, then the request: the worker reserves the request behind it.
        let blocker = format!("{} blocker {number}", ctx.prefix);
        ctx.companions.push(blocker.clone());
        ctx.submit(&format!("{}-blk", ctx.prefix), &blocker).await?;
        ctx.submit(&request_id, &input).await?
    } else {
        ctx.submit(&request_id, &input).await?
    };
    let _ = (redis_db, venv, database);

    // Taken: a model call of this case arrived at some version's backend.
    let waited = Instant::now();
    let taker = loop {
        let calls = ctx.calls().await?;
        if let Some(index) = calls.iter().position(|(_, n)| *n > 0) {
            break Some(index);
        }
        if waited.elapsed() > ctx.fleet.deadline.min(Duration::from_secs(30)) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let Some(taker) = taker else {
        if ctx.first {
            let queued = match &system.submit {
                Submit::Preset { queue, .. } if system.framework == Framework::Celery => {
                    let len: i64 = redis::cmd("LLEN").arg(queue).query_async(ctx.rd).await?;
                    let unacked: i64 = redis::cmd("HLEN")
                        .arg(celery_keys::UNACKED)
                        .query_async(ctx.rd)
                        .await?;
                    format!("; the queue {queue:?} holds {len} message(s), `unacked` {unacked}")
                }
                _ => String::new(),
            };
            let mut last = String::new();
            for worker in &ctx.fleet.workers {
                last.push_str(&format!(
                    "\n{}:\n{}",
                    worker.id,
                    ctx.fleet
                        .output_of(&format!("{}#{}", worker.id, worker.starts), 10)
                ));
            }
            return Err(Error::Config(format!(
                "{}: no worker consumed request {request_id} (no model call within {:?}){queued}; the workers' last lines:{last}",
                system.place("start.command"),
                waited.elapsed()
            )));
        }
        release_all(slow_guards).await;
        return judge(ctx, number, fault, request_id).await;
    };
    let call_started = Instant::now();
    let taker_id = ctx.fleet.workers[taker].id.clone();
    let taker_version = ctx.fleet.workers[taker].version.clone();
    let other = (taker + 1) % ctx.fleet.workers.len();
    ctx.note(
        &taker_id,
        &format!("model {taker_version}"),
        "model call (attempt 1)",
        "message",
    );

    // The fault.
    // The other worker's model answers fast, so its attempt overtakes the slow first one.
    let restore_to_other = |ctx: &mut CaseCtx<'_, '_>, guards: &mut Vec<ProgramGuard>| {
        let version = ctx.fleet.workers[other].version.clone();
        let position = ctx.system.versions.iter().position(|(v, _)| *v == version);
        position
            .filter(|position| *position < guards.len())
            .map(|position| guards.remove(position))
    };
    match fault {
        SystemFault::VisibilityOutlived | SystemFault::ForcedRestore => {
            let tag = delivery_tag.clone().unwrap_or_default();
            if fault == SystemFault::VisibilityOutlived {
                // Real time: the delivery is older than the visibility timeout while its model
                // call still runs.
                tokio::time::sleep(vt + Duration::from_millis(300)).await;
                ctx.note(
                    &taker_id,
                    &taker_id,
                    format!(
                        "delivery older than visibility_timeout ({} ms), still in its model call",
                        vt.as_millis()
                    ),
                    "fault",
                );
            } else {
                ctx.age_delivery(&tag).await?;
            }
            if other != taker {
                if let Some(program) = restore_to_other(ctx, &mut slow_guards) {
                    program.release().await;
                }
                ctx.reset_broker(other).await?;
            }
        }
        SystemFault::PrefetchRestore => {
            // The taker runs the slow task in front and holds the request in its prefetch: both
            // deliveries are in `unacked`, their clocks running, the request never started.
            let reserved_by = Instant::now() + Duration::from_secs(5);
            let mut reserved = false;
            while Instant::now() < reserved_by {
                let unacked: Vec<String> = redis::cmd("HKEYS")
                    .arg(celery_keys::UNACKED)
                    .query_async(ctx.rd)
                    .await?;
                reserved = match &delivery_tag {
                    Some(tag) => unacked.contains(tag),
                    None => unacked.len() >= 2,
                };
                if reserved {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ctx.note(
                &taker_id,
                &taker_id,
                if reserved {
                    "the request is reserved (prefetched) behind the slow task, unacked".to_owned()
                } else {
                    format!(
                        "the request was not prefetched within 5 s (does the command set \
                         --prefetch-multiplier itself? {CELERY_PREFETCH_ENV} is overridden by it)"
                    )
                },
                "fault",
            );
            tokio::time::sleep(vt + Duration::from_millis(300)).await;
            ctx.note(
                &taker_id,
                &taker_id,
                format!(
                    "reserved delivery older than visibility_timeout ({} ms), never started",
                    vt.as_millis()
                ),
                "fault",
            );
            if other != taker {
                // The stopped worker's start runs kombu's restore sweep.
                if let Some(program) = restore_to_other(ctx, &mut slow_guards) {
                    program.release().await;
                }
                ctx.fleet.start(other).await?;
                let other_id = ctx.fleet.workers[other].id.clone();
                ctx.note(
                    &other_id,
                    "redis",
                    "started: its consumer's restore sweep",
                    "fault",
                );
            } else {
                ctx.reset_broker(taker).await?;
            }
        }
        SystemFault::KillPoolChild => {
            let main = ctx.fleet.workers[taker].main_pid();
            let children = main.map(children_of).unwrap_or_default();
            for child in &children {
                let _ = kill(Pid::from_raw(*child), Signal::SIGKILL);
            }
            ctx.note(
                &taker_id,
                &taker_id,
                format!("SIGKILL pool child {children:?} mid-call"),
                "fault",
            );
            release_all(std::mem::take(&mut slow_guards)).await;
        }
        SystemFault::KillMain => {
            ctx.fleet.workers[taker].signal_group(Signal::SIGKILL);
            if let Some(child) = ctx.fleet.workers[taker].child.as_mut() {
                let _ = child.wait().await;
            }
            ctx.note(
                &taker_id,
                &taker_id,
                "SIGKILL of the worker process (group) mid-call",
                "fault",
            );
            release_all(std::mem::take(&mut slow_guards)).await;
            if system.framework == Framework::Celery {
                // Its delivery stays in `unacked`; kombu restores it at the first sweep after the
                // visibility timeout, which the restarted worker's start runs.
                tokio::time::sleep(vt + Duration::from_millis(300)).await;
            }
            ctx.fleet.start(taker).await?;
            ctx.note(
                &taker_id,
                &taker_id,
                "restarted under the same name",
                "message",
            );
        }
        SystemFault::WarmShutdown => {
            if let Some(pid) = ctx.fleet.workers[taker].main_pid() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            ctx.note(
                &taker_id,
                &taker_id,
                "SIGTERM (warm shutdown) mid-task",
                "fault",
            );
            let exited = Instant::now();
            while !ctx.fleet.exited(taker) && exited.elapsed() < slow + Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ctx.fleet.stop(taker, Duration::from_secs(1)).await;
            ctx.fleet.start(taker).await?;
            ctx.note(&taker_id, &taker_id, "restarted", "message");
        }
        SystemFault::HeartbeatMiss => {
            let inside = stop_outside_transactions(ctx, taker).await;
            ctx.note(
                &taker_id,
                &taker_id,
                format!(
                    "SIGSTOP mid-call, {inside} (heartbeat deadline {} ms)",
                    orphan.as_millis()
                ),
                "fault",
            );
            if let Some(program) = restore_to_other(ctx, &mut slow_guards) {
                program.release().await;
            }
            // Until the other worker ran the requeued job (its model call), bounded.
            let paused = Instant::now();
            let other_version = ctx.fleet.workers[other].version.clone();
            // Generous: the requeue runs in the other worker's heartbeat, which a loaded machine
            // delays well past the deadline.
            let mut requeued = false;
            while paused.elapsed() < orphan + Duration::from_secs(30) {
                let calls = ctx.calls().await?;
                let total: usize = calls.iter().map(|(_, n)| n).sum();
                if total > 1 || calls.iter().any(|(v, n)| *v == other_version && *n > 0) {
                    requeued = true;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ctx.fleet.workers[taker].signal_group(Signal::SIGCONT);
            ctx.note(
                &taker_id,
                &taker_id,
                if requeued {
                    "SIGCONT (its job ran elsewhere meanwhile)".to_owned()
                } else {
                    format!("SIGCONT: no requeue within {:?}", paused.elapsed())
                },
                "fault",
            );
        }
    }
    // The first attempt's model call may still be running: wait it out, then drain.
    let done_by = call_started + slow + Duration::from_millis(500);
    release_all(slow_guards).await;
    drain(ctx, done_by, vt.max(orphan)).await?;
    judge(ctx, number, fault, request_id).await
}

/// Stops worker `index` (SIGSTOP) while it holds no PostgreSQL transaction open, as its recorded
/// round trips say; returns how the stop landed, for the diagram.
///
/// Why: a framework may persist a task's state in a transaction of its own next to the task's
/// start (apalis' lock event: `UPDATE apalis.jobs ... SET status = 'Running'` inside
/// BEGIN/COMMIT, sent while the handler already runs). Stopped between the UPDATE and the COMMIT,
/// the worker holds the job's row for the whole pause, and the other workers' requeue
/// (`FOR UPDATE ... SKIP LOCKED`) passes the job over: the fault then tests nothing. On a loaded
/// machine that window is wide enough to hit. A stop that lands inside a transaction (a reply
/// recorded after the signal says so) is undone and tried again once it closed; bounded, after
/// which the worker stays stopped and the diagram says where.
async fn stop_outside_transactions(ctx: &mut CaseCtx<'_, '_>, index: usize) -> String {
    const BOUND: Duration = Duration::from_secs(5);
    // Replies already on their way are recorded within this, once the worker is stopped.
    const SETTLE: Duration = Duration::from_millis(30);
    let worker = ctx.fleet.workers[index].id.clone();
    let started = Instant::now();
    let mut waited = Duration::ZERO;
    let mut retries = 0;
    loop {
        let waiting = Instant::now();
        while in_transaction(&ctx.fleet.wire, &worker) && started.elapsed() < BOUND {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        waited += waiting.elapsed();
        ctx.fleet.workers[index].signal_group(Signal::SIGSTOP);
        tokio::time::sleep(SETTLE).await;
        let inside = in_transaction(&ctx.fleet.wire, &worker);
        if !inside && retries == 0 && waited < Duration::from_millis(5) {
            return "outside any transaction of its own".to_owned();
        }
        if !inside {
            return format!(
                "outside any transaction of its own (waited {} ms for one to close, {retries} stop(s) undone)",
                waited.as_millis()
            );
        }
        if started.elapsed() >= BOUND {
            return format!(
                "inside a transaction it kept open for {} ms",
                started.elapsed().as_millis()
            );
        }
        ctx.fleet.workers[index].signal_group(Signal::SIGCONT);
        retries += 1;
    }
}

/// Whether `worker` holds a PostgreSQL transaction open: the last reply recorded on one of its
/// connections reported a transaction block (ReadyForQuery `T` or `E`).
fn in_transaction(wire: &Wire, worker: &str) -> bool {
    let mut last: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for (_, event) in wire.lock().expect("poisoned").iter() {
        if event.worker != worker || event.service != "postgres" {
            continue;
        }
        let open = match &event.trip.reply {
            Some(Reply::Postgres(reply)) => {
                matches!(reply.tx, Some(TxStatus::Transaction | TxStatus::Failed))
            }
            // The connection ended before a reply: its transaction ended with it.
            _ => false,
        };
        let entry = last
            .entry(event.trip.conn)
            .or_insert((event.trip.seq, open));
        if event.trip.seq >= entry.0 {
            *entry = (event.trip.seq, open);
        }
    }
    last.values().any(|(_, open)| *open)
}

/// Puts the fleet in the shape case's fault needs. `prefetch-restore` runs the first worker with a
/// prefetch multiplier > 1 ([`CELERY_PREFETCH_ENV`]) and stops the others until the fault, so the
/// request waits in that worker's prefetch; every other case runs every worker as the file says.
/// A worker is restarted only when its variables change or it is not running.
async fn prepare_fleet(ctx: &mut CaseCtx<'_, '_>, fault: SystemFault) -> Result<()> {
    let prefetch = fault == SystemFault::PrefetchRestore;
    let multiplier = fault_prefetch(
        ctx.system
            .celery
            .as_ref()
            .map_or(1, |c| c.prefetch_multiplier),
    );
    // Stops first: a stopped worker takes nothing of the case.
    let mut order: Vec<usize> = (0..ctx.fleet.workers.len()).collect();
    order.rotate_left(1);
    for index in order {
        let want_env = if prefetch && index == 0 {
            vec![(CELERY_PREFETCH_ENV.to_owned(), multiplier.to_string())]
        } else {
            Vec::new()
        };
        let want_running = !prefetch || index == 0;
        let running = !ctx.fleet.exited(index);
        let changed = ctx.fleet.workers[index].extra_env != want_env;
        let id = ctx.fleet.workers[index].id.clone();
        if running && (changed || !want_running) {
            ctx.fleet.stop(index, Duration::from_secs(10)).await;
            if !want_running {
                ctx.note(&id, &id, "stopped for this case", "message");
            }
        }
        ctx.fleet.workers[index].extra_env = want_env;
        if want_running && (!running || changed) {
            ctx.fleet.start(index).await?;
            ctx.note(
                &id,
                &id,
                if prefetch {
                    format!("started with {CELERY_PREFETCH_ENV}={multiplier}")
                } else {
                    "started as the file describes it".to_owned()
                },
                "message",
            );
        }
    }
    Ok(())
}

/// Waits until the request's row is final and nothing of the case is left in flight, or until
/// nothing can happen any more (the job is lost), bounded.
async fn drain(
    ctx: &mut CaseCtx<'_, '_>,
    first_call_done: Instant,
    redelivery: Duration,
) -> Result<()> {
    let request = format!("{}-req", ctx.prefix);
    let bound = Instant::now() + redelivery * 2 + Duration::from_secs(15);
    let mut quiet_since: Option<(Instant, i64, usize)> = None;
    loop {
        let writes: i64 =
            sqlx::query_scalar("SELECT count(*) FROM racecert_audit WHERE request_key = $1")
                .bind(&request)
                .fetch_one(&mut *ctx.pg)
                .await?;
        let calls: usize = ctx.calls().await?.iter().map(|(_, n)| n).sum();
        let in_flight = match ctx.system.framework {
            Framework::Celery => {
                let queued: i64 = redis::cmd("LLEN")
                    .arg(queue_of(ctx.system))
                    .query_async(ctx.rd)
                    .await?;
                let unacked: i64 = redis::cmd("HLEN")
                    .arg(celery_keys::UNACKED)
                    .query_async(ctx.rd)
                    .await?;
                queued + unacked
            }
            Framework::Apalis => sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM apalis.jobs WHERE status IN ('Pending', 'Queued', 'Running')",
            )
            .fetch_one(&mut *ctx.pg)
            .await
            .unwrap_or(0),
            Framework::Custom => 0,
        };
        let now = Instant::now();
        if now >= first_call_done && in_flight == 0 {
            // Quiet: no new write and no new model call for a while.
            match quiet_since {
                Some((since, w, c)) if w == writes && c == calls => {
                    if now - since >= Duration::from_millis(1500) {
                        return Ok(());
                    }
                }
                _ => quiet_since = Some((now, writes, calls)),
            }
        } else {
            quiet_since = None;
        }
        if now >= bound || crate::interrupt::requested().is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn queue_of(system: &System) -> String {
    match &system.submit {
        Submit::Preset { queue, .. } => queue.clone(),
        Submit::Command(_) => "celery".into(),
    }
}

/// The verdict of one case, from the audit trail; writes are attributed to workers from their
/// recorded Postgres round trips.
async fn judge(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: SystemFault,
    request: String,
) -> Result<SystemCase> {
    let system = ctx.system;
    let results = &system.results;
    let rows = sqlx::query(
        "SELECT op, old_status, new_status, output, model_version, txid, \
         (extract(epoch FROM at) * 1000)::bigint AS at_ms FROM racecert_audit \
         WHERE request_key = $1 ORDER BY id",
    )
    .bind(&request)
    .fetch_all(&mut *ctx.pg)
    .await?;
    // The workers' statements on the result table that name this request.
    let statements: Vec<(i64, String, String)> = ctx
        .fleet
        .wire
        .lock()
        .expect("poisoned")
        .iter()
        .filter_map(|(at, event)| match &event.trip.request {
            Request::Postgres(PgRequest::Batch(batch)) => Some(
                batch
                    .statements
                    .iter()
                    .filter(|s| {
                        s.executed
                            && matches!(s.verb.as_str(), "UPDATE" | "INSERT")
                            && s.tables.iter().any(|t| t.ends_with(&results.table))
                            && (s.sql.contains(&request)
                                || s.params.iter().flatten().any(|p| *p == request))
                    })
                    .map(|s| (*at, event.worker.clone(), s.sql.clone()))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    let mut writes = Vec::new();
    for row in &rows {
        let new_status: Option<String> = row.get("new_status");
        let at_ms: i64 = row.get("at_ms");
        let terminal = new_status
            .as_ref()
            .is_some_and(|s| results.terminal.contains(s));
        // The statement that carried it: the last one of the request sent before the audit
        // row's time that names the new status (final writes) .
        let worker = statements
            .iter()
            .filter(|(at, _, sql)| {
                *at + 50 >= at_ms - 2000
                    && (!terminal
                        || new_status
                            .as_ref()
                            .is_some_and(|s| sql.contains(s.as_str())))
            })
            .min_by_key(|(at, _, _)| (at - at_ms).abs())
            .map(|(_, w, _)| w.clone());
        writes.push(AuditWrite {
            op: row.get("op"),
            old_status: row.get("old_status"),
            new_status,
            output: row.get("output"),
            model_version: row.get("model_version"),
            txid: row.get("txid"),
            at_ms,
            worker,
        });
    }
    for write in &writes {
        let to = write.worker.clone().unwrap_or_else(|| "db".into());
        let terminal = write
            .new_status
            .as_ref()
            .is_some_and(|s| results.terminal.contains(s));
        ctx.arrows.push(Arrow {
            at_ms: write.at_ms - ctx.t0,
            from: to,
            to: "db".into(),
            label: format!(
                "{} {} {}->{}{}",
                write.op,
                results.table,
                write.old_status.as_deref().unwrap_or("-"),
                write.new_status.as_deref().unwrap_or("-"),
                write
                    .output
                    .as_ref()
                    .map(|o| format!(" output={o}"))
                    .unwrap_or_default()
            ),
            kind: if terminal { "write" } else { "message" }.into(),
        });
    }
    // What the workers said about it (Celery's own received/succeeded lines, the task's own).
    let task_lines: Vec<(i64, String, String)> = ctx
        .fleet
        .lines
        .lock()
        .expect("poisoned")
        .iter()
        .filter(|(at, _, line)| {
            *at >= ctx.t0
                && (line.contains(&request) || line.contains("received") && line.contains("Task "))
        })
        .filter(|(_, _, line)| {
            [
                "received",
                "succeeded in",
                "retry_dispatched",
                "late_write_rejected",
                "WorkerLostError",
                "Re-enqueued",
                "Warm shutdown",
                "exited with",
            ]
            .iter()
            .any(|w| line.contains(w))
        })
        .cloned()
        .collect();
    for (at, label, line) in task_lines {
        let worker = label.split('#').next().unwrap_or(&label).to_owned();
        let short = line
            .split_once("]: ")
            .or_else(|| line.split_once("] "))
            .map_or(line.as_str(), |(_, rest)| rest);
        let short: String = short.chars().take(110).collect();
        ctx.arrows.push(Arrow {
            at_ms: at - ctx.t0,
            from: worker.clone(),
            to: worker,
            label: short,
            kind: "message".into(),
        });
    }
    // The worker's own lock and cache round trips (`[keys]`), as its wire carried them.
    let layout = system.keys.matcher();
    let own_keys: Vec<Arrow> = case_trips(ctx)
        .iter()
        .filter_map(|(at, event)| match &event.trip.request {
            Request::Redis(command)
                if command
                    .keys
                    .iter()
                    .any(|k| layout.is_lease(k) || layout.cache_version(k).is_some()) =>
            {
                Some(Arrow {
                    at_ms: at - ctx.t0,
                    from: event.worker.clone(),
                    to: "redis".into(),
                    label: event.trip.describe(None),
                    kind: "message".into(),
                })
            }
            _ => None,
        })
        .collect();
    ctx.arrows.extend(own_keys);
    let model_calls = ctx.request_calls().await;

    let mut violations = Vec::new();
    let finals: Vec<&AuditWrite> = writes
        .iter()
        .filter(|w| {
            w.new_status
                .as_ref()
                .is_some_and(|s| results.terminal.contains(s))
        })
        .collect();
    let describe = |w: &AuditWrite| {
        format!(
            "audit: {} by {} txid {} {} -> {} output={} {}={}",
            w.op,
            w.worker.as_deref().unwrap_or("?"),
            w.txid,
            w.old_status.as_deref().unwrap_or("-"),
            w.new_status.as_deref().unwrap_or("-"),
            w.output.as_deref().unwrap_or("-"),
            results.version.as_deref().unwrap_or("version"),
            w.model_version.as_deref().unwrap_or("-"),
        )
    };
    let final_writes = finals.len();
    if finals.len() > 1 {
        violations.push(SystemViolation {
            invariant: "at-most-one-final-write".into(),
            request: request.clone(),
            observed: format!(
                "{} final writes to {}.{} = {:?}; the last one ({}) overwrote {}",
                finals.len(),
                results.table,
                results.key,
                request,
                finals
                    .last()
                    .and_then(|w| w.output.clone())
                    .unwrap_or_default(),
                finals[0].output.clone().unwrap_or_default(),
            ),
            evidence: finals.iter().map(|w| describe(w)).collect(),
        });
    }
    let last_status = writes.last().and_then(|w| w.new_status.clone());
    if !last_status
        .as_ref()
        .is_some_and(|s| results.terminal.contains(s))
    {
        violations.push(SystemViolation {
            invariant: "no-lost-job".into(),
            request: request.clone(),
            observed: format!(
                "after the drain the row's {} is {} (final: {})",
                results.status,
                last_status.as_deref().unwrap_or("absent: no row"),
                results.terminal.join(", ")
            ),
            evidence: writes.iter().map(describe).collect(),
        });
    }
    if results.version.is_some() {
        for w in &finals {
            if let (Some(output), Some(version)) = (&w.output, &w.model_version)
                && output_version(output).is_some_and(|named| named != version)
            {
                violations.push(SystemViolation {
                    invariant: "result-names-its-version".into(),
                    request: request.clone(),
                    observed: format!("output {output} stored with version {version}"),
                    evidence: vec![describe(w)],
                });
            }
        }
    }
    violations.extend(wire_violations(ctx, &request));
    for v in &violations {
        ctx.note(
            "db",
            "db",
            format!("VIOLATION {}: {}", v.invariant, v.observed),
            "violation",
        );
    }
    let mut arrows = std::mem::take(&mut ctx.arrows);
    arrows.sort_by_key(|a| a.at_ms);
    let mut lanes = vec!["racecert".to_owned(), "redis".to_owned()];
    for worker in &ctx.fleet.workers {
        lanes.push(worker.id.clone());
    }
    for (version, _) in &system.versions {
        lanes.push(format!("model {version}"));
    }
    lanes.push("db".into());
    Ok(SystemCase {
        number,
        fault,
        request,
        writes,
        violations,
        diagram: arrows,
        lanes,
        elapsed_ms: 0,
        model_calls,
        final_writes,
    })
}

/// The round trips the workers sent since the case began, with their times.
fn case_trips(ctx: &CaseCtx<'_, '_>) -> Vec<(i64, WireEvent)> {
    ctx.fleet
        .wire
        .lock()
        .expect("poisoned")
        .iter()
        .filter(|(at, _)| *at >= ctx.t0)
        .cloned()
        .collect()
}

/// What the wire says about the worker's own leases and cache, when the system names their keys
/// (`[keys]`): the case's recorded round trips, with each worker's version, judged by the same
/// wire checks as racecert's own workers. Backend calls are not judged here (compute waste needs
/// the contract's request body to know the job).
fn wire_violations(ctx: &CaseCtx<'_, '_>, request: &str) -> Vec<SystemViolation> {
    let layout = &ctx.system.keys;
    let mut invariants = Vec::new();
    if layout.lease.is_some() {
        invariants.push(Invariant::LeaseDiscipline);
    }
    if layout.cache.is_some() {
        invariants.extend([
            Invariant::NoCrossVersionCacheEntry,
            Invariant::NoStaleCacheRead,
        ]);
    }
    if invariants.is_empty() {
        return Vec::new();
    }
    let started = ctx.fleet.workers.iter().map(|w| Event {
        step: 0,
        at_ms: 0,
        kind: EventKind::Harness(Observation::WorkerStarted {
            worker: w.id.clone(),
            version: w.version.clone(),
        }),
    });
    let trips: Vec<Event> = case_trips(ctx)
        .into_iter()
        .map(|(at, event)| Event {
            step: 0,
            at_ms: (at - ctx.t0) as u64,
            kind: EventKind::Wire(Box::new(event)),
        })
        .collect();
    let history = History {
        events: started.chain(trips).collect(),
        // Real clocks: a lease runs out by the TTL its SET gave it.
        lease_ttl_ms: Some(0),
        wire_recorded: true,
        layout: layout.clone(),
        ..History::default()
    };
    check::check(&history, &invariants)
        .into_iter()
        .map(|v| SystemViolation {
            invariant: v.invariant.name().into(),
            request: request.to_owned(),
            observed: v.observed,
            // A system case has no schedule steps: the proof's place is its time.
            evidence: v
                .evidence
                .into_iter()
                .map(|e| e.strip_prefix("step 0 ").map(str::to_owned).unwrap_or(e))
                .collect(),
        })
        .collect()
}

/// A case's sequence diagram as text: one column per lane, one row per arrow, time on the left.
pub fn sequence_text(case: &SystemCase) -> String {
    const W: usize = 12;
    let col = |lane: &str| case.lanes.iter().position(|l| l == lane).unwrap_or(0);
    let mut out = String::new();
    out.push_str("         ");
    for lane in &case.lanes {
        let name: String = lane.chars().take(W - 1).collect();
        out.push_str(&format!("{name:<W$}"));
    }
    out.push('\n');
    for arrow in &case.diagram {
        let (a, b) = (col(&arrow.from), col(&arrow.to));
        let (lo, hi) = (a.min(b), a.max(b));
        let mut row: Vec<char> = (0..case.lanes.len() * W)
            .map(|i| if i % W == 0 { '|' } else { ' ' })
            .collect();
        if arrow.kind == "fault" || arrow.kind == "violation" {
            let mark = if arrow.kind == "fault" { '~' } else { '!' };
            row[a * W] = mark;
        } else if lo == hi {
            row[a * W] = '*';
        } else {
            for cell in row.iter_mut().take(hi * W).skip(lo * W + 1) {
                *cell = '-';
            }
            if b > a {
                row[hi * W - 1] = '>';
                row[lo * W] = 'o';
            } else {
                row[lo * W + 1] = '<';
                row[hi * W] = 'o';
            }
        }
        let line: String = row.into_iter().collect();
        out.push_str(&format!(
            "{:>7}ms {} {}\n",
            arrow.at_ms,
            line.trim_end(),
            arrow.label
        ));
    }
    out
}

/// The command that reruns exactly case `number` of `file` with `seed`.
pub fn replay_command(file: &Path, seed: u64, number: u32, fault: SystemFault) -> String {
    format!(
        "racecert replay --system {} --seed {seed} --case {number} --fault {fault}",
        file.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_skipped_once_every_goal_it_serves_is_met() {
        let case = |fault, broke: &[&str]| SystemCase {
            number: 1,
            fault,
            request: "r".into(),
            writes: Vec::new(),
            violations: broke
                .iter()
                .map(|i| SystemViolation {
                    invariant: (*i).into(),
                    request: "r".into(),
                    observed: String::new(),
                    evidence: Vec::new(),
                })
                .collect(),
            diagram: Vec::new(),
            lanes: Vec::new(),
            elapsed_ms: 0,
            model_calls: 1,
            final_writes: 1,
        };
        let duplicate = Goal {
            faults: vec![SystemFault::ForcedRestore, SystemFault::VisibilityOutlived],
            breaks: vec!["at-most-one-final-write".into()],
        };
        let lost = Goal {
            faults: vec![SystemFault::KillPoolChild, SystemFault::VisibilityOutlived],
            breaks: vec!["no-lost-job".into()],
        };
        let goals = [duplicate, lost];
        assert!(still_needed(&[], SystemFault::KillMain, &[]));
        assert!(!still_needed(&goals, SystemFault::KillMain, &[]));
        // A restore that broke something else met nothing.
        let ran = [case(SystemFault::ForcedRestore, &["no-lost-job"])];
        assert!(still_needed(&goals, SystemFault::VisibilityOutlived, &ran));
        // Once it reproduced the duplicate, visibility-outlived still serves the lost job.
        let ran = [case(
            SystemFault::ForcedRestore,
            &["at-most-one-final-write"],
        )];
        assert!(still_needed(&goals, SystemFault::VisibilityOutlived, &ran));
        let ran = [
            case(SystemFault::ForcedRestore, &["at-most-one-final-write"]),
            case(SystemFault::KillPoolChild, &["no-lost-job"]),
        ];
        assert!(!still_needed(&goals, SystemFault::VisibilityOutlived, &ran));
    }

    #[test]
    fn a_worker_is_in_a_transaction_while_its_last_reply_on_a_connection_says_so() {
        use crate::env::wire::{PgBatch, PgProtocol, PgReply, RoundTrip};
        let trip = |worker: &str, conn: u64, seq: u64, tx: Option<TxStatus>| {
            (
                0,
                WireEvent {
                    worker: worker.into(),
                    service: "postgres".into(),
                    trip: RoundTrip {
                        link: "l".into(),
                        conn,
                        seq,
                        sent_us: 0,
                        forwarded_us: Some(0),
                        answered_us: tx.map(|_| 1),
                        request: Request::Postgres(PgRequest::Batch(PgBatch {
                            mode: PgProtocol::Simple,
                            statements: Vec::new(),
                        })),
                        reply: tx.map(|tx| {
                            Reply::Postgres(PgReply {
                                tx: Some(tx),
                                ..PgReply::default()
                            })
                        }),
                    },
                },
            )
        };
        let wire: Wire = Arc::default();
        assert!(!in_transaction(&wire, "worker-a"));
        // BEGIN on connection 7, then an UPDATE in it: open.
        wire.lock().unwrap().extend([
            trip("worker-a", 7, 0, Some(TxStatus::Transaction)),
            trip("worker-a", 7, 1, Some(TxStatus::Transaction)),
            trip("worker-a", 8, 0, Some(TxStatus::Idle)),
        ]);
        assert!(in_transaction(&wire, "worker-a"));
        assert!(!in_transaction(&wire, "worker-b"));
        // COMMIT answered: closed.
        wire.lock()
            .unwrap()
            .push(trip("worker-a", 7, 2, Some(TxStatus::Idle)));
        assert!(!in_transaction(&wire, "worker-a"));
        // A failed transaction is open until its ROLLBACK; a connection that ended is closed.
        wire.lock().unwrap().extend([
            trip("worker-a", 9, 0, Some(TxStatus::Failed)),
            trip("worker-a", 10, 0, Some(TxStatus::Transaction)),
            trip("worker-a", 10, 1, None),
        ]);
        assert!(in_transaction(&wire, "worker-a"));
        wire.lock()
            .unwrap()
            .push(trip("worker-a", 9, 1, Some(TxStatus::Idle)));
        assert!(!in_transaction(&wire, "worker-a"));
    }

    #[test]
    fn only_simple_commands_are_execed() {
        assert!(simple_command(
            "/v/bin/celery -A tasks worker -n a@racecert"
        ));
        assert!(!simple_command("echo boom >&2; exit 3"));
        assert!(!simple_command("build && run"));
    }

    #[test]
    fn paths_are_replaced_and_queries_kept() {
        assert_eq!(
            with_path("redis://127.0.0.1:6379", "3"),
            "redis://127.0.0.1:6379/3"
        );
        assert_eq!(
            with_path("redis://127.0.0.1:6379/0", "3"),
            "redis://127.0.0.1:6379/3"
        );
        assert_eq!(
            with_path("postgresql://u:p@127.0.0.1:5/db?sslmode=disable", "x"),
            "postgresql://u:p@127.0.0.1:5/x?sslmode=disable"
        );
    }

    #[test]
    fn fault_names_round_trip_and_presets_have_their_own() {
        for fault in SystemFault::ALL {
            assert_eq!(fault.name().parse::<SystemFault>(), Ok(fault));
        }
        assert!(SystemFault::ForcedRestore.applies_to(Framework::Celery));
        assert!(!SystemFault::ForcedRestore.applies_to(Framework::Apalis));
        assert!(SystemFault::HeartbeatMiss.applies_to(Framework::Apalis));
        assert!(
            "nap"
                .parse::<SystemFault>()
                .unwrap_err()
                .contains("forced-restore")
        );
    }

    #[test]
    fn our_own_process_has_no_children_we_did_not_start() {
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        assert!(children_of(me).contains(&(child.id() as i32)));
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn the_diagram_draws_arrows_between_lanes() {
        let case = SystemCase {
            number: 1,
            fault: SystemFault::ForcedRestore,
            request: "r".into(),
            writes: Vec::new(),
            violations: Vec::new(),
            diagram: vec![
                Arrow {
                    at_ms: 5,
                    from: "a".into(),
                    to: "c".into(),
                    label: "call".into(),
                    kind: "message".into(),
                },
                Arrow {
                    at_ms: 9,
                    from: "c".into(),
                    to: "a".into(),
                    label: "back".into(),
                    kind: "message".into(),
                },
            ],
            lanes: vec!["a".into(), "b".into(), "c".into()],
            elapsed_ms: 0,
            model_calls: 0,
            final_writes: 0,
        };
        let text = sequence_text(&case);
        assert!(text.contains("o---------------------->| call"), "{text}");
        assert!(text.contains("|<----------------------o back"), "{text}");
    }
}
