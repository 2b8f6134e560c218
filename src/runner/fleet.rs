//! The fleet runner: certifies a worker racecert did not write, as *processes* started from a
//! command, each given the contract's environment (docs/contract.md) pointing at the case's
//! proxied services, with process faults on top of the network and backend ones: SIGKILL (crash,
//! then restart), SIGSTOP/SIGCONT (a pause longer than the lease TTL, the seed's "slow, not dead"
//! attempt), and a rolling restart onto the new model version with a cutover. The workers' stdout
//! is their log, recorded line by line as it arrives; the audit trigger and the backend journals
//! judge them anyway. Every run ends within its time budget with a verdict; no process outlives it.
//!
//! Why one file of ~940 lines: a run is one sequence (start the processes, inject, drain, judge)
//! whose steps share the run's processes, recorder and plane; the settings and the process
//! bookkeeping beside it are used by nothing else.

use crate::check::CaseResult;
use crate::check::Invariant;
use crate::contract::Keys;
use crate::contract::defect::Defects;
use crate::contract::log::{Echo, Status};
use crate::contract::worker::Infra;
use crate::env::TestBed;
use crate::fault::{Fault, FaultKind, PartitionTarget, apply};
use crate::history::{EventKind, Observation, Recorder, read_jobs};
use crate::logs::parse_line;
use crate::reference::Pipeline;
use crate::reference::process::WorkerEnv;
use crate::runner::arrivals::Arrivals;
use crate::runner::link_gate::Standby;
use crate::runner::plane::{BackendControl, CasePlane, Services, WorkerLink, Workers};
use crate::schedule::WorkerSpec;
use crate::{Error, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Settings of a fleet run.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// The command that starts one worker (run with `sh -c`).
    pub command: String,
    /// Workers to start (id and version).
    pub workers: Vec<WorkerSpec>,
    /// Defects passed through in `RACECERT_DEFECTS` (the reference worker honours them).
    pub defects: Defects,
    /// Invariants checked.
    pub invariants: Vec<Invariant>,
    /// How long faults are injected.
    pub duration: Duration,
    /// Hard limit for the whole run, drain included.
    pub budget: Duration,
    /// Requests submitted over the run.
    pub requests: usize,
    /// Distinct inputs.
    pub inputs: usize,
    /// Seed of the fault plan.
    pub seed: u64,
    /// Fault kinds drawn from (worker-crash = SIGKILL, lease-expiry = SIGSTOP past the TTL,
    /// cutover = rolling restart onto the last version, upstream-timeout, partition).
    pub faults: Vec<FaultKind>,
    /// Lease TTL given to the workers (all of them, or half if `long_lease_ttl` is set).
    pub lease_ttl: Duration,
    /// A longer lease TTL for every other worker (which ones turns with the seed).
    pub long_lease_ttl: Option<Duration>,
    /// Visibility timeout given to the workers.
    pub visibility_timeout: Duration,
    /// Backend timeout given to the workers.
    pub backend_timeout: Duration,
}

impl FleetSettings {
    /// The lease TTL worker `index` is given.
    pub fn lease_ttl_of(&self, index: usize) -> Duration {
        match self.long_lease_ttl {
            Some(long) if (index as u64 + self.seed) % 2 == 1 => long,
            _ => self.lease_ttl,
        }
    }

    /// Two v1 and two v2 workers of `command`, every process fault, 8 seconds.
    pub fn mixed_fleet(command: &str, seed: u64) -> FleetSettings {
        let worker = |id: &str, version: &str| WorkerSpec {
            id: id.into(),
            version: version.into(),
        };
        FleetSettings {
            command: command.to_owned(),
            workers: vec![
                worker("worker-a", "v1"),
                worker("worker-b", "v1"),
                worker("worker-c", "v2"),
                worker("worker-d", "v2"),
            ],
            defects: Defects::none(),
            invariants: Invariant::own(),
            duration: Duration::from_secs(8),
            budget: Duration::from_secs(45),
            requests: 40,
            // Distinct inputs: every job calls its backend (no cache hits), so workers spend
            // their time mid-job, where pauses and crashes matter.
            inputs: 40,
            seed,
            // Pauses past the lease are what turn a slow attempt into a late writer: drawn twice
            // as often as the other faults.
            faults: vec![
                FaultKind::LeaseExpiry,
                FaultKind::LeaseExpiry,
                FaultKind::WorkerCrash,
                FaultKind::Cutover,
                FaultKind::UpstreamTimeout,
            ],
            // The visibility timeout is shorter than the backend timeout on purpose: that is the
            // seed's "visibility timeout shorter than real inference time", the fault that lets a
            // paused attempt come back and finish its call after its job was redelivered. The
            // workers' lease TTLs straddle it: shorter for every other worker (a redelivery finds
            // the lease expired and takes the job over) and longer for the rest (a redelivery
            // meets a live lease, which a worker must respect: skip the duplicate, never
            // overwrite the lease), so every run has both; which worker gets which turns with
            // the seed.
            lease_ttl: Duration::from_millis(1200),
            long_lease_ttl: Some(Duration::from_millis(2600)),
            visibility_timeout: Duration::from_millis(1500),
            backend_timeout: Duration::from_millis(3000),
        }
    }
}

/// The result of a fleet run: the checked case, and each worker process's output.
#[derive(Debug, Clone)]
pub struct FleetResult {
    /// History, violations, coverage.
    pub case: CaseResult,
    /// Per process (`worker-a#1`, ...): its stdout and stderr.
    pub outputs: BTreeMap<String, (String, String)>,
}

pub(crate) type Outputs = Arc<Mutex<BTreeMap<String, (String, String)>>>;

/// One running worker process.
pub(crate) struct Proc {
    pub(crate) spec: WorkerSpec,
    pub(crate) child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Nothing of a worker may outlive its run, whatever ends it (a panic, an interrupted
        // run): the whole process group goes, children a framework forked included.
        signal(self, Signal::SIGKILL);
    }
}

/// When a paused worker wakes, relative to the attempt that took its job over.
#[derive(Debug, Clone, Copy)]
enum Takeover {
    /// As soon as the other attempt calls its backend (it holds the lease now).
    Started,
    /// Once the other attempt acked the job.
    Finished,
}

/// The fleet's processes: started from the command, one process group each.
pub(crate) struct Processes {
    pub(crate) command: String,
    /// Per worker, the contract's environment per version, through the worker's own links
    /// (worker id and version filled per start).
    pub(crate) env: Vec<BTreeMap<String, WorkerEnv>>,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) outputs: Outputs,
    pub(crate) starts: u32,
    pub(crate) procs: Vec<Proc>,
    /// The output readers: each ends when its process's pipe closes.
    pub(crate) readers: Vec<tokio::task::JoinHandle<()>>,
    /// Draws when a paused worker wakes (seeded with the run).
    pub(crate) wake: StdRng,
    /// Whether a crashed process is restarted at once, as a supervisor would (the fleet); the
    /// wire runner replaces it itself, with a process started ahead.
    pub(crate) restart_crashed: bool,
}

impl Processes {
    /// Starts worker `index` of `spec`, through the links of `env[index]`.
    pub(crate) fn start(&mut self, index: usize, spec: &WorkerSpec) -> Result<Proc> {
        let proc = self.launch(index, spec, None)?;
        self.recorder.observe(Observation::WorkerStarted {
            worker: spec.id.clone(),
            version: spec.version.clone(),
        });
        Ok(proc)
    }

    /// Starts a process of `spec` through the links of `env[env_index]`; one on `standby` has its
    /// log lines recorded only once live (and its start is observed then, by its starter).
    pub(crate) fn launch(
        &mut self,
        env_index: usize,
        spec: &WorkerSpec,
        standby: Option<Arc<Standby>>,
    ) -> Result<Proc> {
        let env = self
            .env
            .get(env_index)
            .and_then(|by_version| by_version.get(&spec.version))
            .cloned()
            .ok_or_else(|| Error::Config(format!("no backend for version {}", spec.version)))?;
        let env = WorkerEnv {
            worker_id: spec.id.clone(),
            model_version: spec.version.clone(),
            ..env
        };
        self.starts += 1;
        let label = format!("{}#{}", spec.id, self.starts);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            // exec: the worker itself is the child, so waiting on it waits on the worker.
            .arg(format!("exec {}", self.command))
            .envs(env.vars())
            // Its owner: the next start reaps it if this run is killed before it can.
            .env(
                crate::env::reaper::OWNER_ENV,
                crate::env::reaper::Owner::current().env_value(),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Nothing may outlive the run, whatever happens to it.
            .kill_on_drop(true)
            // Its own process group, so signals reach the worker behind `sh -c` too.
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|err| Error::io(format!("start worker `{}`", self.command), err))?;
        if let Some(stdout) = child.stdout.take() {
            let (recorder, outputs, key) =
                (self.recorder.clone(), self.outputs.clone(), label.clone());
            self.readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // Recorded the moment it arrives, among the faults: real order.
                    if let Ok(parsed) = parse_line(&line)
                        && parsed.get("worker_id").is_some()
                    {
                        match &standby {
                            Some(standby) => standby.line(&recorder, parsed),
                            None => recorder.line(parsed),
                        }
                    }
                    let mut outputs = outputs.lock().expect("poisoned");
                    let entry = outputs.entry(key.clone()).or_default();
                    entry.0.push_str(&line);
                    entry.0.push('\n');
                }
            }));
        }
        if let Some(stderr) = child.stderr.take() {
            let (outputs, key) = (self.outputs.clone(), label.clone());
            self.readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut outputs = outputs.lock().expect("poisoned");
                    let entry = outputs.entry(key.clone()).or_default();
                    entry.1.push_str(&line);
                    entry.1.push('\n');
                }
            }));
        }
        Ok(Proc {
            spec: spec.clone(),
            child,
        })
    }

    /// Replaces process `index` by a fresh one of `spec`.
    pub(crate) fn restart(&mut self, index: usize, spec: &WorkerSpec) -> Result<()> {
        let fresh = self.start(index, spec)?;
        self.procs[index] = fresh;
        Ok(())
    }

    /// The request the worker's latest log line is about, if any.
    fn current_request(&self, index: usize) -> Option<String> {
        let id = self.procs[index].spec.id.as_str();
        self.recorder
            .events()
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::Worker(line) if line.get("worker_id") == Some(id) => {
                    line.get("request_id").map(str::to_owned)
                }
                _ => None,
            })
    }

    /// Whether another worker has taken over `request` (a mid-job line) or finished it (acked).
    fn taken_over(&self, index: usize, request: &str, at: Takeover) -> bool {
        let id = self.procs[index].spec.id.as_str();
        self.recorder
            .events()
            .iter()
            .rev()
            .any(|event| match &event.kind {
                EventKind::Worker(line)
                    if line.get("request_id") == Some(request)
                        && line.get("worker_id") != Some(id) =>
                {
                    line.status_word().is_some_and(|status| match at {
                        Takeover::Started => status == Status::InferenceStarted,
                        Takeover::Finished => status == Status::Acked,
                    })
                }
                _ => false,
            })
    }

    /// When every process has exited by itself without a line on stdout, the command cannot run
    /// as a worker (a typo, a missing dependency, a crash at start): what it said, to report
    /// instead of a verdict on jobs nobody worked on.
    pub(crate) async fn exited_at_once(&mut self) -> Option<String> {
        let mut statuses = Vec::new();
        for proc in &mut self.procs {
            match proc.child.try_wait() {
                Ok(Some(status)) => statuses.push(status),
                _ => return None,
            }
        }
        let quiet = |outputs: &Outputs| {
            outputs
                .lock()
                .expect("poisoned")
                .values()
                .all(|(out, _)| out.trim().is_empty())
        };
        if statuses.is_empty() || !quiet(&self.outputs) {
            return None;
        }
        // The pipes closed with the processes: the readers take the last lines and end.
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        }
        if !quiet(&self.outputs) {
            return None;
        }
        let outputs = self.outputs.lock().expect("poisoned");
        let stderr = outputs
            .values()
            .map(|(_, err)| err.trim())
            .find(|err| !err.is_empty())
            .unwrap_or("(nothing on stderr)");
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        Some(format!(
            "worker command `{}` exited at once ({}) in all {} of its processes, without a line on stdout; its stderr:\n{}",
            self.command,
            statuses[0],
            statuses.len(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }

    /// The indices of the workers whose latest log line says they hold a job (taken, not
    /// released).
    fn mid_job(&self) -> Vec<usize> {
        let events = self.recorder.events();
        (0..self.procs.len())
            .filter(|index| self.holds_a_job(*index, &events))
            .collect()
    }

    fn holds_a_job(&self, index: usize, events: &[crate::history::Event]) -> bool {
        let id = self.procs[index].spec.id.as_str();
        events
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::Worker(line) if line.get("worker_id") == Some(id) => line.status_word(),
                _ => None,
            })
            .is_some_and(|status| status.is_mid_job())
    }

    /// Waits briefly for a worker holding a job, preferring those `prefer` accepts: where a
    /// crash or a pause must land (the job holder), not on a random worker.
    async fn job_holder(&self, prefer: impl Fn(usize) -> bool) -> Option<usize> {
        for _ in 0..50 {
            let holders = self.mid_job();
            if let Some(index) = holders.iter().copied().find(|i| prefer(*i)) {
                return Some(index);
            }
            if let Some(index) = holders.first() {
                return Some(*index);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Workers for Processes {
    fn id(&self, worker: usize) -> String {
        self.procs[worker % self.procs.len()].spec.id.clone()
    }

    async fn crash(&mut self, worker: usize) -> Result<Option<Option<String>>> {
        let index = worker % self.procs.len();
        signal(&self.procs[index], Signal::SIGKILL);
        let _ = self.procs[index].child.wait().await;
        if self.restart_crashed {
            // A crashed process is restarted, as a supervisor would.
            let spec = self.procs[index].spec.clone();
            self.restart(index, &spec)?;
        }
        Ok(Some(None))
    }

    async fn pause(&mut self, worker: usize, pause: Duration) -> Result<Option<Duration>> {
        let index = worker % self.procs.len();
        let request = self.current_request(index);
        // Where the paused attempt wakes decides which race it can show: while another worker
        // holds its redelivered job (two holders at once: an unchecked release or lease write
        // hits the other's lease), or after that attempt finished (a late writer over a
        // finished job). Either way, no later than `pause`.
        let wake_at = if self.wake.random_bool(0.5) {
            Takeover::Started
        } else {
            Takeover::Finished
        };
        signal(&self.procs[index], Signal::SIGSTOP);
        let stopped = Instant::now();
        let deadline = stopped + pause;
        while Instant::now() < deadline {
            if let Some(request) = &request
                && self.taken_over(index, request, wake_at)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        signal(&self.procs[index], Signal::SIGCONT);
        Ok(Some(stopped.elapsed()))
    }
}

pub(crate) fn signal(proc: &Proc, signal: Signal) {
    if let Some(pid) = proc.child.id() {
        // The whole process group: `sh -c CMD` and the worker it started.
        let _ = kill(Pid::from_raw(-(pid as i32)), signal);
    }
}

/// Stops a process: SIGTERM (drain), then SIGKILL after `grace`; whatever else is left in its
/// process group (a command that forked) is killed too.
pub(crate) async fn stop(proc: &mut Proc, grace: Duration) {
    let group = proc.child.id();
    signal(proc, Signal::SIGCONT);
    signal(proc, Signal::SIGTERM);
    if tokio::time::timeout(grace, proc.child.wait())
        .await
        .is_err()
    {
        signal(proc, Signal::SIGKILL);
        let _ = proc.child.wait().await;
    }
    if let Some(pid) = group {
        let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
    }
}

/// Runs the worker command as a fleet on `bed` and checks what happened.
/// Runs the worker command as a fleet on `bed` and checks what happened.
pub async fn run_fleet(bed: &TestBed, settings: &FleetSettings) -> Result<FleetResult> {
    if settings.workers.is_empty() || settings.command.trim().is_empty() {
        return Err(Error::Config(
            "a fleet run needs a worker command and workers".into(),
        ));
    }
    let started = Instant::now();
    let hard_deadline = started + settings.budget;
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let namespace = format!(
        "e{}c{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let keys = Keys::namespaced(&namespace);
    let (links, envs) = open_links(bed, settings, &keys).await?;
    let versions: Vec<String> = bed.versions().into_iter().map(str::to_owned).collect();
    let admin =
        Infra::connect_harness(&bed.harness_redis_url(), &bed.harness_database_url()).await?;
    let recorder = Recorder::new();
    let mut api = Pipeline::with_infra(
        admin.clone(),
        keys.clone(),
        BTreeMap::new(),
        recorder.log_sink(Echo::Off),
    )
    .await?
    .api;
    let processes = Processes::fleet(settings, envs, &recorder)?;
    let slow = slow_backends(bed, &versions, &keys).await?;
    let mut plane = CasePlane {
        services: Services::new(
            bed,
            keys.clone(),
            admin.clone(),
            links,
            BackendControl::Toxics,
            settings.defects.clone(),
            settings.backend_timeout,
        ),
        workers: processes,
    };
    let wire_recorded = plane.services.record_all(&settings.workers, &recorder);
    let mut run = Run {
        settings,
        recorder: &recorder,
        rng: StdRng::seed_from_u64(settings.seed),
        versions,
        step: 0,
        last_version: settings
            .workers
            .iter()
            .map(|w| w.version.clone())
            .max()
            .unwrap_or_default(),
        rolled: !settings.faults.contains(&FaultKind::Cutover),
    };
    let requests = run
        .inject(&mut plane, &mut api, started, hard_deadline)
        .await?;

    // Heal, then let the fleet finish the queue, bounded by the budget.
    run.step += 1;
    recorder.step(
        run.step,
        "drain: heal, let the fleet finish the queue".into(),
    );
    recorder.observe(Observation::Draining);
    crate::env::backends::release_all(slow).await;
    plane.services.heal_all().await?;
    run.restart_the_exited(&mut plane.workers)?;
    let mut queue = crate::reference::queue::Queue::over(admin.redis.clone(), &keys);
    let settled = settle(
        &admin,
        &keys,
        &requests,
        &mut queue,
        settings,
        hard_deadline,
    )
    .await?;
    for proc in plane.workers.procs.iter_mut() {
        stop(proc, settings.backend_timeout * 2).await;
    }
    // Every process group is gone, so every pipe is closed: the readers take the last lines and
    // end. (Bounded anyway: a reader must never hold the verdict.)
    for reader in std::mem::take(&mut plane.workers.readers) {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    observe_leftovers(&plane, &admin, &keys, &mut queue, settings, &recorder).await?;
    recorder.observe(Observation::Drained { settled });
    // The log-based checks take one TTL: the shortest, so no lease is taken as held longer
    // than it could have been (the wire checks read each lease's own PX).
    let history = plane
        .history(&recorder, requests, settings.lease_ttl, wire_recorded)
        .await?;
    let outputs = plane.workers.outputs.lock().expect("poisoned").clone();
    Ok(FleetResult {
        case: CaseResult::judge(history, &settings.invariants),
        outputs,
    })
}

/// Faults touch this run only, and every round trip is attributed: each worker has proxies of
/// its own for Redis, Postgres and each backend, which its restarts keep. Per worker, its links
/// and the contract's environment per version through them.
async fn open_links(
    bed: &TestBed,
    settings: &FleetSettings,
    keys: &Keys,
) -> Result<(Vec<WorkerLink>, Vec<BTreeMap<String, WorkerEnv>>)> {
    let mut links = Vec::new();
    let mut envs = Vec::new();
    for index in 0..settings.workers.len() {
        let lease_ttl = settings.lease_ttl_of(index);
        let link = WorkerLink::open(bed, true, false).await?;
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
                    lease_ttl,
                    visibility_timeout: settings.visibility_timeout,
                    backend_timeout: settings.backend_timeout,
                    defects: settings.defects.clone(),
                },
            );
        }
        envs.push(by_version);
        links.push(link);
    }
    Ok((links, envs))
}

/// The fault-injection phase of a fleet run: its draws, its steps and the rollout's progress.
struct Run<'s> {
    settings: &'s FleetSettings,
    recorder: &'s Recorder,
    rng: StdRng,
    versions: Vec<String>,
    /// The last step recorded.
    step: usize,
    /// The version the rolling restart moves the fleet to.
    last_version: String,
    /// Whether the rolling restart happened (or is not in scope).
    rolled: bool,
}

impl Run<'_> {
    /// Submits the arrivals and injects faults until the duration is over and every arrival is
    /// in (or the budget or an interrupt ends it); the requests submitted.
    async fn inject(
        &mut self,
        plane: &mut CasePlane<'_, Processes>,
        api: &mut crate::reference::submit::Api,
        started: Instant,
        hard_deadline: Instant,
    ) -> Result<Vec<crate::history::SubmittedRequest>> {
        let settings = self.settings;
        let mut arrivals = Arrivals::new(
            settings.requests,
            settings.inputs,
            settings.duration.mul_f64(0.7),
            &mut self.rng,
        );
        // The kinds drawn by turn first (the rolling restart is the cutover's own, not drawn).
        let mut rotation: Vec<FaultKind> = Vec::new();
        for kind in &settings.faults {
            if *kind != FaultKind::Cutover && !rotation.contains(kind) {
                rotation.push(*kind);
            }
        }
        rotation.shuffle(&mut self.rng);
        let mut applied_kinds = 0;
        while started.elapsed() < settings.duration || arrivals.pending() {
            if crate::interrupt::requested().is_some() {
                break;
            }
            if let Some(message) = plane.workers.exited_at_once().await {
                return Err(Error::Config(message));
            }
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..300))).await;
            let fresh = arrivals.submit_due(started.elapsed(), api).await?;
            plane.services.requests.extend(fresh);
            if !self.rolled && started.elapsed() >= settings.duration / 2 {
                self.rolling_restart(plane).await?;
                continue;
            }
            if settings.faults.is_empty() || !self.rng.random_bool(0.5) {
                continue;
            }
            // Every kind once first (in the seed's order), then drawn as the settings weigh them.
            let kind = match rotation.get(applied_kinds) {
                Some(kind) => {
                    applied_kinds += 1;
                    *kind
                }
                None => settings.faults[self.rng.random_range(0..settings.faults.len())],
            };
            for (fault, lasts) in self.plan(kind, &plane.workers).await {
                self.step += 1;
                self.recorder.step(self.step, fault.to_string());
                self.recorder.fault(apply(&fault, plane).await?);
                tokio::time::sleep(lasts).await;
            }
            if Instant::now() > hard_deadline {
                break;
            }
        }
        Ok(std::mem::take(&mut arrivals.submitted))
    }

    /// Rolling rollout: the pointer switches, then each older worker drains and comes back on
    /// the new version.
    async fn rolling_restart(&mut self, plane: &mut CasePlane<'_, Processes>) -> Result<()> {
        self.step += 1;
        let cutover = Fault::Cutover {
            to: self.last_version.clone(),
        };
        self.recorder
            .step(self.step, format!("rolling restart: {cutover}"));
        self.recorder.fault(apply(&cutover, plane).await?);
        let processes = &mut plane.workers;
        for index in 0..processes.procs.len() {
            if processes.procs[index].spec.version == self.last_version {
                continue;
            }
            stop(
                &mut processes.procs[index],
                self.settings.backend_timeout * 3,
            )
            .await;
            let spec = WorkerSpec {
                id: processes.procs[index].spec.id.clone(),
                version: self.last_version.clone(),
            };
            processes.restart(index, &spec)?;
        }
        self.rolled = true;
        Ok(())
    }

    /// The faults of one draw of `kind`, each with how long it lasts before the next (real
    /// time).
    async fn plan(&mut self, kind: FaultKind, workers: &Processes) -> Vec<(Fault, Duration)> {
        let settings = self.settings;
        let worker = self.rng.random_range(0..settings.workers.len());
        let version = self.versions[self.rng.random_range(0..self.versions.len())].clone();
        match kind {
            FaultKind::WorkerCrash => {
                // Aimed at a worker holding a job: a crash of an idle one tests nothing.
                let target = workers.job_holder(|_| true).await;
                vec![(
                    Fault::CrashWorker {
                        worker: target.unwrap_or(worker),
                    },
                    Duration::ZERO,
                )]
            }
            FaultKind::LeaseExpiry => {
                // Paused past its lease TTL and the visibility timeout: its job goes to another
                // worker, then it wakes up and carries on as if nothing happened. The pause is
                // aimed at a worker that is mid-job (its log says so), one whose lease the pause
                // can outlast when there is one.
                let target = workers
                    .job_holder(|index| settings.lease_ttl_of(index) == settings.lease_ttl)
                    .await;
                vec![(
                    Fault::PauseWorker {
                        worker: target.unwrap_or(worker),
                        ms: self.pause().as_millis() as u64,
                    },
                    Duration::ZERO,
                )]
            }
            FaultKind::UpstreamTimeout => vec![
                (
                    Fault::UpstreamTimeout {
                        version: version.clone(),
                    },
                    settings.backend_timeout,
                ),
                (Fault::RecoverBackend { version }, Duration::ZERO),
            ],
            FaultKind::Partition => {
                let target = if self.rng.random_bool(0.5) {
                    PartitionTarget::Redis
                } else {
                    PartitionTarget::Postgres
                };
                vec![
                    (
                        Fault::Partition { target },
                        Duration::from_millis(self.rng.random_range(100..400)),
                    ),
                    (Fault::Heal { target }, Duration::ZERO),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// How long a lease-expiry pause lasts: past the visibility timeout (its job is
    /// redelivered), and short enough that the paused call has not timed out when it wakes up.
    /// Drawn across the other worker's attempt: waking after it ended makes a late writer over a
    /// finished job; waking while it runs makes two holders of one job at once (a release or a
    /// lease write that is not checked then hits the other holder's lease).
    fn pause(&mut self) -> Duration {
        let settings = self.settings;
        let from = settings.visibility_timeout + Duration::from_millis(100);
        let to = (settings.visibility_timeout + Duration::from_millis(800))
            .min(
                settings
                    .backend_timeout
                    .saturating_sub(Duration::from_millis(500)),
            )
            .max(from);
        Duration::from_millis(
            self.rng
                .random_range(from.as_millis() as u64..=to.as_millis() as u64),
        )
    }

    /// Wakes every paused process; workers declined by the cutover have drained and exited:
    /// they come back on the active version so the drain has hands.
    fn restart_the_exited(&self, processes: &mut Processes) -> Result<()> {
        for index in 0..processes.procs.len() {
            signal(&processes.procs[index], Signal::SIGCONT);
            if processes.procs[index]
                .child
                .try_wait()
                .ok()
                .flatten()
                .is_some()
            {
                let spec = WorkerSpec {
                    id: processes.procs[index].spec.id.clone(),
                    version: if self.rolled {
                        self.last_version.clone()
                    } else {
                        processes.procs[index].spec.version.clone()
                    },
                };
                processes.restart(index, &spec)?;
            }
        }
        Ok(())
    }
}

/// Waits until settled: every job terminal and nothing left pending (a delivery a worker left
/// unacknowledged is redelivered after the visibility timeout; a worker that never acks it
/// leaves it pending for good, which the judge reports). False: the budget or an interrupt ended
/// the wait first.
async fn settle(
    admin: &Infra,
    keys: &Keys,
    requests: &[crate::history::SubmittedRequest],
    queue: &mut crate::reference::queue::Queue,
    settings: &FleetSettings,
    hard_deadline: Instant,
) -> Result<bool> {
    loop {
        let jobs = read_jobs(&admin.pg, keys.prefix()).await?;
        let open = requests.iter().any(|r| {
            jobs.iter()
                .find(|j| j.idempotency_key == r.idempotency_key)
                .is_none_or(|j| !j.status().is_ok_and(|s| s.is_terminal()))
        });
        if !open && queue.pending().await?.is_empty() {
            return Ok(true);
        }
        if Instant::now() + settings.backend_timeout * 3 > hard_deadline
            || crate::interrupt::requested().is_some()
        {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Records what the drain left: deliveries still pending, and open jobs behind a lease set to
/// outlive the liveness bound (twice the longest TTL the workers were given), which wait for it
/// whatever the drain allows.
async fn observe_leftovers(
    plane: &CasePlane<'_, Processes>,
    admin: &Infra,
    keys: &Keys,
    queue: &mut crate::reference::queue::Queue,
    settings: &FleetSettings,
    recorder: &Recorder,
) -> Result<()> {
    for (key, deliveries) in queue.pending().await? {
        recorder.observe(Observation::Pending {
            key,
            deliveries,
            held: None,
        });
    }
    let bound = settings
        .long_lease_ttl
        .unwrap_or(settings.lease_ttl)
        .max(settings.lease_ttl)
        * 2;
    let open: Vec<String> = read_jobs(&admin.pg, keys.prefix())
        .await?
        .into_iter()
        .filter(|j| !j.status().is_ok_and(|s| s.is_terminal()))
        .map(|j| j.idempotency_key)
        .collect();
    let ttls = plane.services.lease_ttls(&open).await?;
    for (key, ttl) in open.into_iter().zip(ttls) {
        if let Some(ttl_ms) = ttl.filter(|t| *t < 0 || *t as u128 > bound.as_millis()) {
            recorder.observe(Observation::LeaseOutlivesBound {
                key,
                ttl_ms,
                bound_ms: bound.as_millis() as u64,
            });
        }
    }
    Ok(())
}

impl Processes {
    /// The fleet's processes, one per worker of `settings`, started.
    fn fleet(
        settings: &FleetSettings,
        envs: Vec<BTreeMap<String, WorkerEnv>>,
        recorder: &Arc<Recorder>,
    ) -> Result<Processes> {
        let mut processes = Processes {
            command: settings.command.clone(),
            env: envs,
            recorder: recorder.clone(),
            outputs: Arc::default(),
            starts: 0,
            procs: Vec::new(),
            readers: Vec::new(),
            wake: StdRng::seed_from_u64(settings.seed ^ 0x7761_6b65),
            restart_crashed: true,
        };
        for (index, spec) in settings.workers.iter().enumerate() {
            let proc = processes.start(index, spec)?;
            processes.procs.push(proc);
        }
        Ok(processes)
    }
}

/// Slow backends keep attempts in flight long enough for pauses and crashes to land mid-job: a
/// setting of the run, not a fault.
async fn slow_backends(
    bed: &TestBed,
    versions: &[String],
    keys: &Keys,
) -> Result<Vec<crate::env::backends::ProgramGuard>> {
    let mut slow = Vec::new();
    for version in versions {
        slow.push(
            bed.backend(version)?
                .program(
                    keys.prefix(),
                    crate::env::backends::Behaviour::Delay(Duration::from_millis(350)),
                )
                .await?,
        );
    }
    Ok(slow)
}
