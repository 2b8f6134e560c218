//! Certifying a worker racecert did not write: worker *processes* started from a command, each
//! given the contract's environment (docs/contract.md) pointing at the case's proxied services,
//! and process faults on top of the network and backend ones: SIGKILL (crash, then restart),
//! SIGSTOP/SIGCONT (a pause longer than the lease TTL, the seed's "slow, not dead" attempt), and a
//! rolling restart onto the new model version with a cutover. The workers' stdout is their log
//! (read with the replay parser); the audit trigger and the backend journals judge them anyway.
//! Every run ends within its time budget with a verdict; no process outlives it.

use crate::check::{Invariant, check};
use crate::contract::Keys;
use crate::contract::log::LogSink;
use crate::contract::log::Status;
use crate::env::TestBed;
use crate::fault::FaultKind;
use crate::history::{Event, EventKind, read_jobs};
use crate::reference::Pipeline;
use crate::reference::defects::Defects;
use crate::reference::process::WorkerEnv;
use crate::reference::worker::Infra;
use crate::schedule::WorkerSpec;
use crate::schedule::controlled::{CaseResult, Coverage};
use crate::{Error, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Settings of an external run.
#[derive(Debug, Clone)]
pub struct ExternalSettings {
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
    /// Lease TTL given to the workers.
    pub lease_ttl: Duration,
    /// Visibility timeout given to the workers.
    pub visibility_timeout: Duration,
    /// Backend timeout given to the workers.
    pub backend_timeout: Duration,
}

impl ExternalSettings {
    /// Two v1 and two v2 workers of `command`, every process fault, 6 seconds.
    pub fn mixed_fleet(command: &str, seed: u64) -> ExternalSettings {
        let worker = |id: &str, version: &str| WorkerSpec {
            id: id.into(),
            version: version.into(),
        };
        ExternalSettings {
            command: command.to_owned(),
            workers: vec![
                worker("worker-a", "v1"),
                worker("worker-b", "v1"),
                worker("worker-c", "v2"),
                worker("worker-d", "v2"),
            ],
            defects: Defects::none(),
            invariants: Invariant::ALL.to_vec(),
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
            // paused attempt come back and finish its call after its job was redelivered.
            lease_ttl: Duration::from_millis(1200),
            visibility_timeout: Duration::from_millis(1500),
            backend_timeout: Duration::from_millis(3000),
        }
    }
}

/// The result of an external run: the checked case, and each worker process's output.
#[derive(Debug, Clone)]
pub struct ExternalResult {
    /// History, violations, coverage.
    pub case: CaseResult,
    /// Per process (`worker-a#1`, ...): its stdout and stderr.
    pub outputs: BTreeMap<String, (String, String)>,
}

/// Events in arrival order, from worker stdout readers and the fault loop alike.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<Vec<EventKind>>>);

impl Timeline {
    fn push(&self, kind: EventKind) {
        self.0.lock().expect("poisoned").push(kind);
    }

    fn fault(&self, what: &str, fields: &[(&str, String)]) {
        self.push(EventKind::Fault {
            what: what.to_owned(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        });
    }
}

type Outputs = Arc<Mutex<BTreeMap<String, (String, String)>>>;

/// One running worker process.
struct Proc {
    spec: WorkerSpec,
    child: Child,
}

struct Fleet<'a> {
    settings: &'a ExternalSettings,
    env: BTreeMap<String, WorkerEnv>,
    timeline: Timeline,
    outputs: Outputs,
    starts: u32,
}

impl Fleet<'_> {
    fn start(&mut self, spec: &WorkerSpec) -> Result<Proc> {
        let env = self
            .env
            .get(&spec.version)
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
            .arg(format!("exec {}", self.settings.command))
            .envs(env.vars())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Nothing may outlive the run, whatever happens to it.
            .kill_on_drop(true)
            // Its own process group, so signals reach the worker behind `sh -c` too.
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|err| Error::io(format!("start worker `{}`", self.settings.command), err))?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let (timeline, outputs, key) = (self.timeline.clone(), self.outputs.clone(), label.clone());
        if let Some(stdout) = stdout {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(parsed) = crate::contract::log::parse::parse_line(&line)
                        && parsed.get("worker_id").is_some()
                    {
                        timeline.push(EventKind::Worker(parsed));
                    }
                    let mut outputs = outputs.lock().expect("poisoned");
                    let entry = outputs.entry(key.clone()).or_default();
                    entry.0.push_str(&line);
                    entry.0.push('\n');
                }
            });
        }
        let (outputs, key) = (self.outputs.clone(), label.clone());
        if let Some(stderr) = stderr {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut outputs = outputs.lock().expect("poisoned");
                    let entry = outputs.entry(key.clone()).or_default();
                    entry.1.push_str(&line);
                    entry.1.push('\n');
                }
            });
        }
        self.timeline.fault(
            "worker_started",
            &[
                ("worker_id", spec.id.clone()),
                ("model_version", spec.version.clone()),
            ],
        );
        Ok(Proc {
            spec: spec.clone(),
            child,
        })
    }
}

/// A worker whose latest log line says it holds a job (taken, not yet released).
fn in_flight(timeline: &Timeline, procs: &[Proc]) -> Option<usize> {
    let events = timeline.0.lock().expect("poisoned");
    procs.iter().position(|proc| {
        let last = events.iter().rev().find_map(|event| match event {
            EventKind::Worker(line) if line.get("worker_id") == Some(proc.spec.id.as_str()) => {
                line.status().map(str::to_owned)
            }
            _ => None,
        });
        matches!(
            last.as_deref(),
            Some("job_taken" | "cache_miss" | "inference_started" | "timeout_waiting_upstream")
        )
    })
}

fn signal(proc: &Proc, signal: Signal) {
    if let Some(pid) = proc.child.id() {
        // The whole process group: `sh -c CMD` and the worker it started.
        let _ = kill(Pid::from_raw(-(pid as i32)), signal);
    }
}

/// Stops a process: SIGTERM (drain), then SIGKILL after `grace`; whatever else is left in its
/// process group (a command that forked) is killed too.
async fn stop(proc: &mut Proc, grace: Duration) {
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
pub async fn run_external(bed: &TestBed, settings: &ExternalSettings) -> Result<ExternalResult> {
    if settings.workers.is_empty() || settings.command.trim().is_empty() {
        return Err(Error::Config(
            "an external run needs a worker command and workers".into(),
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
    // Faults touch this run only: proxies of its own for Redis, Postgres and each backend.
    let links = bed.case_links(true).await?;
    let (redis_proxy, pg_proxy, backend_proxies) = (&links.redis, &links.postgres, &links.backends);
    let mut envs = BTreeMap::new();
    for version in bed.versions() {
        envs.insert(
            version.to_owned(),
            WorkerEnv {
                worker_id: String::new(),
                model_version: version.to_owned(),
                redis_url: links.redis_url().to_owned(),
                database_url: links.database_url().to_owned(),
                backend_url: links.backend_url(version).unwrap_or_default(),
                backend_endpoint: crate::reference::endpoint_name(bed.backend(version)?.name()),
                key_prefix: keys.prefix().to_owned(),
                lease_ttl: settings.lease_ttl,
                visibility_timeout: settings.visibility_timeout,
                backend_timeout: settings.backend_timeout,
                defects: settings.defects.clone(),
            },
        );
    }
    let admin = Infra::connect(&bed.redis_url(), &bed.database_url()).await?;
    let log = LogSink::default();
    let mut api = Pipeline::with_infra(admin.clone(), keys.clone(), BTreeMap::new(), log.clone())
        .await?
        .api;
    let timeline = Timeline::default();
    let mut fleet = Fleet {
        settings,
        env: envs,
        timeline: timeline.clone(),
        outputs: Arc::default(),
        starts: 0,
    };
    let mut procs = Vec::new();
    for spec in &settings.workers {
        procs.push(fleet.start(spec)?);
    }
    // Slow backends keep attempts in flight long enough for pauses and crashes to land mid-job.
    // The delay is the backend's own (a wiremock program), not a latency toxic: the noxious
    // engine drops bytes still held by a delaying toxic when the server closes the connection,
    // and clients that send `Connection: close` (Python's urllib) would get empty replies.
    let mut slow = BTreeMap::new();
    for version in backend_proxies.keys() {
        let guard = bed
            .backend(version)?
            .program(
                keys.prefix(),
                crate::env::backends::Behaviour::Delay(Duration::from_millis(350)),
            )
            .await?;
        slow.insert(version.clone(), guard);
    }

    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut arrivals = crate::schedule::chaos::Arrivals::new(
        settings.requests,
        settings.inputs,
        settings.duration.mul_f64(0.7),
        &mut rng,
    );
    let mut coverage = Coverage::default();
    let last_version = settings
        .workers
        .iter()
        .map(|w| w.version.clone())
        .max()
        .unwrap_or_default();
    let mut rolled = !settings.faults.contains(&FaultKind::Cutover);
    while started.elapsed() < settings.duration || arrivals.pending() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
        arrivals.submit_due(started.elapsed(), &mut api).await?;
        if !rolled && started.elapsed() >= settings.duration / 2 {
            // Rolling rollout: the pointer switches, then each older worker drains and comes back
            // on the new version.
            let mut redis = admin.redis.clone();
            crate::reference::cutover::cutover(
                &mut redis,
                &keys,
                &last_version,
                &settings.defects,
                &log,
            )
            .await?;
            timeline.fault("cutover", &[("new_model_version", last_version.clone())]);
            for proc in procs.iter_mut().filter(|p| p.spec.version != last_version) {
                stop(proc, settings.backend_timeout * 3).await;
                let spec = WorkerSpec {
                    id: proc.spec.id.clone(),
                    version: last_version.clone(),
                };
                *proc = fleet.start(&spec)?;
            }
            coverage.applied_kind(FaultKind::Cutover, true);
            rolled = true;
            continue;
        }
        if settings.faults.is_empty() || !rng.random_bool(0.5) {
            continue;
        }
        let kind = settings.faults[rng.random_range(0..settings.faults.len())];
        let index = rng.random_range(0..procs.len());
        match kind {
            FaultKind::WorkerCrash => {
                let proc = &mut procs[index];
                signal(proc, Signal::SIGKILL);
                let _ = proc.child.wait().await;
                timeline.fault("worker_crashed", &[("worker_id", proc.spec.id.clone())]);
                let spec = proc.spec.clone();
                *proc = fleet.start(&spec)?;
                coverage.applied_kind(kind, true);
            }
            FaultKind::LeaseExpiry => {
                // Paused past its lease TTL and the visibility timeout: its job goes to another
                // worker, then it wakes up and carries on as if nothing happened. The pause is
                // aimed at a worker that is mid-job (its log says so), waiting briefly for one.
                let mut target = None;
                for _ in 0..25 {
                    target = in_flight(&timeline, &procs);
                    if target.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let proc = &procs[target.unwrap_or(index)];
                // Long enough for the redelivery and another worker's whole attempt, short
                // enough that the paused call has not timed out when it wakes up.
                let pause = (settings.visibility_timeout + Duration::from_millis(800)).min(
                    settings
                        .backend_timeout
                        .saturating_sub(Duration::from_millis(500)),
                );
                signal(proc, Signal::SIGSTOP);
                timeline.fault(
                    "worker_paused",
                    &[
                        ("worker_id", proc.spec.id.clone()),
                        ("ms", pause.as_millis().to_string()),
                    ],
                );
                tokio::time::sleep(pause).await;
                signal(proc, Signal::SIGCONT);
                // Its lease is gone for the checkers too: the pause outlived the TTL.
                for request in &arrivals.submitted {
                    timeline.fault(
                        "lease_expired",
                        &[("idempotency_key", request.idempotency_key.clone())],
                    );
                }
                timeline.fault("worker_resumed", &[("worker_id", proc.spec.id.clone())]);
                coverage.applied_kind(kind, true);
            }
            FaultKind::UpstreamTimeout => {
                let versions: Vec<&String> = backend_proxies.keys().collect();
                let version = versions[rng.random_range(0..versions.len())].clone();
                // Newest program wins: slower than the workers' timeout for a while.
                let timeout = bed
                    .backend(&version)?
                    .program(
                        keys.prefix(),
                        crate::env::backends::Behaviour::Delay(
                            settings.backend_timeout + Duration::from_millis(300),
                        ),
                    )
                    .await?;
                timeline.fault("upstream_slow", &[("model_version", version.clone())]);
                tokio::time::sleep(settings.backend_timeout).await;
                drop(timeout);
                coverage.faults.entry(kind).or_insert((0, 0)).0 += 1;
            }
            FaultKind::Partition => {
                let (proxy, target) = if rng.random_bool(0.5) {
                    (redis_proxy, "Redis")
                } else {
                    (pg_proxy, "Postgres")
                };
                proxy.disable().await?;
                timeline.fault("partition", &[("target", target.into())]);
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
                proxy.enable().await?;
                timeline.fault("heal", &[("target", target.into())]);
                coverage.faults.entry(kind).or_insert((0, 0)).0 += 1;
            }
            _ => {}
        }
        if Instant::now() > hard_deadline {
            break;
        }
    }

    let requests = std::mem::take(&mut arrivals.submitted);
    // Heal, then let the fleet finish the queue, bounded by the budget.
    drop(slow);
    redis_proxy.enable().await?;
    pg_proxy.enable().await?;
    timeline.fault("healed", &[]);
    for proc in &procs {
        signal(proc, Signal::SIGCONT);
    }
    // Workers declined by the cutover have drained and exited: bring them back on the active
    // version so the drain has hands.
    for proc in procs.iter_mut() {
        if proc.child.try_wait().ok().flatten().is_some() {
            let spec = WorkerSpec {
                id: proc.spec.id.clone(),
                version: if rolled {
                    last_version.clone()
                } else {
                    proc.spec.version.clone()
                },
            };
            *proc = fleet.start(&spec)?;
        }
    }
    let settled = loop {
        let jobs = read_jobs(&admin.pg, keys.prefix()).await?;
        let open = requests.iter().any(|r| {
            jobs.iter()
                .find(|j| j.idempotency_key == r.idempotency_key)
                .is_none_or(|j| !matches!(j.status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED"))
        });
        if !open {
            break true;
        }
        if Instant::now() + settings.backend_timeout * 3 > hard_deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    timeline.fault("drained", &[("settled", settled.to_string())]);
    for proc in procs.iter_mut() {
        stop(proc, settings.backend_timeout * 2).await;
    }
    // Let the readers take the last lines.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut events: Vec<Event> = Vec::new();
    for line in log.lines() {
        // The cutover line (written by the harness).
        events.push(Event {
            step: 0,
            at_ms: 0,
            kind: EventKind::Worker(line),
        });
    }
    events.extend(
        timeline
            .0
            .lock()
            .expect("poisoned")
            .drain(..)
            .map(|kind| Event {
                step: 0,
                at_ms: 0,
                kind,
            }),
    );
    let history = crate::history::collect(bed, &admin.pg, keys.prefix(), events, requests).await?;
    let late = history.with_status(Status::LateWriteRejected).count()
        + history.with_status(Status::LateSuccess).count();
    let entry = coverage
        .faults
        .entry(FaultKind::LeaseExpiry)
        .or_insert((0, 0));
    entry.1 = entry.1.min(late as u32);
    let failures = history.with_status(Status::UpstreamFailed).count() as u32;
    if let Some(entry) = coverage.faults.get_mut(&FaultKind::UpstreamTimeout) {
        entry.1 = failures.min(entry.0);
    }
    let violations = check(&history, &settings.invariants);
    let outputs = fleet.outputs.lock().expect("poisoned").clone();
    Ok(ExternalResult {
        case: CaseResult {
            history,
            violations,
            coverage,
        },
        outputs,
    })
}
