//! The chaos runner: free-running workers of mixed versions with real clocks (short visibility
//! timeout and lease TTL), real toxics on the case's own proxies, backend failures, partitions,
//! crashes (a worker's task aborted at whatever await point it is in) and a cutover, for a bounded
//! time. It finds what checkpoints do not model; it is reproducible in distribution (the fault
//! plan comes from a seed), and everything it does is recorded and judged by the same checkers.

use crate::check::CaseResult;
use crate::check::Invariant;
use crate::contract::Keys;
use crate::contract::checkpoint::Checkpoints;
use crate::contract::defect::Defects;
use crate::contract::delivery::Delivery;
use crate::contract::log::Echo;
use crate::contract::worker::{Infra, WorkerContext, WorkerFactory, WorkerUnderTest};
use crate::env::TestBed;
use crate::fault::{Fault, FaultKind, PartitionTarget, apply};
use crate::history::{Observation, Recorder};
use crate::reference::Pipeline;
use crate::reference::queue::Queue;
use crate::runner::arrivals::Arrivals;
use crate::runner::plane::{BackendControl, CasePlane, Services, WorkerLink, Workers};
use crate::schedule::WorkerSpec;
use crate::{Error, Result};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Settings of a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosSettings {
    /// Workers (mixed versions make version skew possible).
    pub workers: Vec<WorkerSpec>,
    /// Defects switched on.
    pub defects: Defects,
    /// Invariants checked at the end.
    pub invariants: Vec<Invariant>,
    /// Starts the workers under test.
    pub factory: Arc<dyn WorkerFactory>,
    /// How long faults are injected.
    pub duration: Duration,
    /// Requests submitted (over a small pool of inputs).
    pub requests: usize,
    /// Distinct inputs.
    pub inputs: usize,
    /// Fault kinds to draw from.
    pub faults: Vec<FaultKind>,
    /// Seed of the fault plan and the workers' pauses.
    pub seed: u64,
    /// Workers' backend timeout.
    pub backend_timeout: Duration,
    /// Lease TTL (real clock).
    pub lease_ttl: Duration,
    /// Queue visibility timeout (real clock).
    pub visibility_timeout: Duration,
    /// Cutover target, if the run should roll out a new version half way.
    pub cutover_to: Option<String>,
}

impl ChaosSettings {
    /// The seed's fleet (`worker-a`, `worker-b` on v1; `worker-c`, `worker-d` on v2), every fault
    /// but a Redis restart, a cutover to v2 half way, 3 seconds.
    pub fn mixed_fleet(seed: u64) -> ChaosSettings {
        let worker = |id: &str, version: &str| WorkerSpec {
            id: id.into(),
            version: version.into(),
        };
        ChaosSettings {
            workers: vec![
                worker("worker-a", "v1"),
                worker("worker-b", "v1"),
                worker("worker-c", "v2"),
                worker("worker-d", "v2"),
            ],
            defects: Defects::none(),
            invariants: Invariant::own(),
            factory: Arc::new(crate::reference::ReferenceFactory),
            duration: Duration::from_secs(3),
            requests: 24,
            inputs: 4,
            faults: vec![
                FaultKind::UpstreamTimeout,
                FaultKind::LeaseExpiry,
                FaultKind::WorkerCrash,
                FaultKind::Partition,
                FaultKind::BackendFailure,
            ],
            seed,
            backend_timeout: Duration::from_millis(400),
            lease_ttl: Duration::from_millis(900),
            visibility_timeout: Duration::from_millis(600),
            cutover_to: Some("v2".into()),
        }
    }
}

static CHAOS_RUNS: AtomicU64 = AtomicU64::new(0);

/// Processes a delivery; an infrastructure error ends the attempt and is recorded (the delivery
/// stays unacknowledged and is redelivered).
async fn process_logged(worker: &dyn WorkerUnderTest, delivery: Delivery, recorder: &Recorder) {
    if let Err(err) = worker.process(delivery).await {
        recorder.observe(Observation::AttemptError {
            worker: worker.id().to_owned(),
            error: err.to_string(),
        });
    }
}

/// One worker's loop: receive (the harness's queue, real visibility timeout), process, pause.
async fn worker_loop(
    worker: Arc<dyn WorkerUnderTest>,
    mut queue: Queue,
    visibility: Duration,
    stop: Arc<AtomicBool>,
    seed: u64,
    recorder: Arc<Recorder>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        if worker.is_draining() {
            break;
        }
        match queue.receive(worker.id(), visibility).await {
            Ok(Some(delivery)) => process_logged(worker.as_ref(), delivery, &recorder).await,
            // Nothing to do: poll again soon (free-running workers poll, as real ones do).
            Ok(None) => tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The chaos case's workers: free-running tasks; a crash aborts one at whatever await point it is
/// in, and the "process" restarts (same worker id, fresh task).
struct Tasks {
    workers: Vec<Arc<dyn WorkerUnderTest>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Each worker's view of the queue, through its own link.
    queues: Vec<Queue>,
    visibility: Duration,
    stop: Arc<AtomicBool>,
    seed: u64,
    recorder: Arc<Recorder>,
    crashes: u64,
}

impl Tasks {
    fn spawn(&self, index: usize) -> tokio::task::JoinHandle<()> {
        tokio::spawn(worker_loop(
            self.workers[index].clone(),
            self.queues[index].clone(),
            self.visibility,
            self.stop.clone(),
            self.seed ^ ((index as u64) << 32) ^ self.crashes,
            self.recorder.clone(),
        ))
    }
}

impl Workers for Tasks {
    fn id(&self, worker: usize) -> String {
        self.workers[worker % self.workers.len()].id().to_owned()
    }

    async fn crash(&mut self, worker: usize) -> Result<Option<Option<String>>> {
        let index = worker % self.workers.len();
        self.tasks[index].abort();
        self.crashes += 1;
        self.tasks[index] = self.spawn(index);
        // Where the task was when aborted is unknown; the history's lines tell what it held.
        Ok(Some(None))
    }

    async fn pause(&mut self, _worker: usize, _pause: Duration) -> Result<Option<Duration>> {
        Ok(None)
    }
}

/// Runs one chaos case on `bed`.
pub async fn run_chaos(bed: &TestBed, settings: &ChaosSettings) -> Result<CaseResult> {
    if settings.workers.is_empty() || settings.requests == 0 {
        return Err(Error::Config(
            "a chaos run needs workers and requests".into(),
        ));
    }
    let started = Instant::now();
    let keys = Keys::namespaced(&format!(
        "x{}c{}",
        std::process::id(),
        CHAOS_RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let links = open_links(bed, settings.workers.len()).await?;
    let versions: Vec<String> = bed.versions().into_iter().map(str::to_owned).collect();
    let admin =
        Infra::connect_harness(&bed.harness_redis_url(), &bed.harness_database_url()).await?;
    let recorder = Recorder::new();
    let log = recorder.log_sink(Echo::Off);
    // The API side submits through the harness's connections: clients retry their submits, and
    // the faults under test are the workers'.
    let mut api = Pipeline::with_infra(admin.clone(), keys.clone(), BTreeMap::new(), log.clone())
        .await?
        .api;
    // Requests arrive throughout the first 80% of the run, so faults meet work in flight.
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut arrivals = Arrivals::new(
        settings.requests,
        settings.inputs,
        settings.duration.mul_f64(0.8),
        &mut rng,
    );

    let (workers, queues) = start_workers(settings, &links, &keys, &log).await?;
    let stop = Arc::new(AtomicBool::new(false));
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
        workers: Tasks::started(workers, queues, settings, &stop, &recorder),
    };
    let wire_recorded = plane.services.record_all(&settings.workers, &recorder);
    // The fault plan: a seeded sequence of faults at seeded times, each one a step.
    let deadline = started + settings.duration;
    let mut cutover_done = settings.cutover_to.is_none();
    let mut slow: BTreeSet<String> = BTreeSet::new();
    let mut step = 0;
    while Instant::now() < deadline || arrivals.pending() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        let fresh = arrivals.submit_due(started.elapsed(), &mut api).await?;
        plane.services.requests.extend(fresh);
        // Faults come every few polls, not every one.
        if !rng.random_bool(0.35) {
            continue;
        }
        let submitted = arrivals.submitted.len();
        let drawn = next_faults(
            &mut cutover_done,
            started,
            settings,
            &versions,
            &mut slow,
            submitted,
            &mut rng,
        );
        let Some(faults) = drawn else {
            continue;
        };
        for (i, fault) in faults.iter().enumerate() {
            if i > 0 {
                // A partition lasts a moment of real time before it heals.
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
            }
            step += 1;
            recorder.step(step, fault.to_string());
            let effect = apply(fault, &mut plane).await?;
            recorder.fault(effect);
        }
    }

    // Heal everything, stop the loops, let in-flight attempts end.
    step += 1;
    recorder.step(
        step,
        "drain: heal, stop the loops, expire leases, redeliver".into(),
    );
    recorder.observe(Observation::Draining);
    stop_the_loops(&mut plane, &stop, settings).await?;
    // Drain: leases run out, then workers of the active version take what is left.
    let active = plane.services.active_version().await?;
    let requests = std::mem::take(&mut arrivals.submitted);
    for request in &requests {
        plane
            .services
            .delete_lease(&request.idempotency_key)
            .await?;
    }
    let settled = drain_queue(&plane.workers, &recorder, active.as_deref(), requests.len()).await?;
    recorder.observe(Observation::Drained { settled });
    let history = plane
        .history(&recorder, requests, settings.lease_ttl, wire_recorded)
        .await?;
    Ok(CaseResult::judge(history, &settings.invariants))
}

/// Starts the case's workers, each through its own link; with each, its view of the queue.
async fn start_workers(
    settings: &ChaosSettings,
    links: &[WorkerLink],
    keys: &Keys,
    log: &crate::contract::log::LogSink,
) -> Result<(Vec<Arc<dyn WorkerUnderTest>>, Vec<Queue>)> {
    let mut workers = Vec::new();
    let mut queues = Vec::new();
    for (index, spec) in settings.workers.iter().enumerate() {
        let infra = links[index].infra()?.clone();
        queues.push(Queue::over(infra.redis.clone(), keys));
        let worker = settings
            .factory
            .start(WorkerContext {
                spec,
                index,
                infra,
                keys: keys.clone(),
                backends: &links[index].backends,
                checkpoints: Checkpoints::free(),
                log: log.clone(),
                backend_timeout: settings.backend_timeout,
                lease_ttl: settings.lease_ttl,
                defects: settings.defects.clone(),
            })
            .await?;
        workers.push(worker);
    }
    Ok((workers, queues))
}

/// The drain after the loops stopped: workers of the `active` version take what is left, in
/// turn, until a round finds nothing (true) or the rounds run out (false).
async fn drain_queue(
    tasks: &Tasks,
    recorder: &Recorder,
    active: Option<&str>,
    requests: usize,
) -> Result<bool> {
    for _ in 0..(4 * requests + 8) {
        let mut progressed = false;
        for (index, worker) in tasks.workers.iter().enumerate() {
            let mut queue = tasks.queues[index].clone();
            if active.is_some_and(|v| v != worker.model_version()) || worker.is_draining() {
                continue;
            }
            let delivery = match queue.receive(worker.id(), Duration::ZERO).await? {
                Some(d) => Some(d),
                None => queue.claim_stale(worker.id(), Duration::ZERO).await?,
            };
            if let Some(delivery) = delivery {
                progressed = true;
                process_logged(worker.as_ref(), delivery, recorder).await;
            }
        }
        if !progressed {
            return Ok(true);
        }
    }
    Ok(false)
}

impl Tasks {
    /// The case's worker loops, spawned.
    fn started(
        workers: Vec<Arc<dyn WorkerUnderTest>>,
        queues: Vec<Queue>,
        settings: &ChaosSettings,
        stop: &Arc<AtomicBool>,
        recorder: &Arc<Recorder>,
    ) -> Tasks {
        let mut tasks = Tasks {
            workers,
            tasks: Vec::new(),
            queues,
            visibility: settings.visibility_timeout,
            stop: stop.clone(),
            seed: settings.seed,
            recorder: recorder.clone(),
            crashes: 0,
        };
        tasks.tasks = (0..tasks.workers.len()).map(|i| tasks.spawn(i)).collect();
        tasks
    }
}

/// Heals everything, stops the loops and lets in-flight attempts end (bounded), then reconnects
/// the workers' links for the drain.
async fn stop_the_loops(
    plane: &mut CasePlane<'_, Tasks>,
    stop: &AtomicBool,
    settings: &ChaosSettings,
) -> Result<()> {
    stop.store(true, Ordering::SeqCst);
    plane.services.heal_all().await?;
    for task in std::mem::take(&mut plane.workers.tasks) {
        let _ =
            tokio::time::timeout(settings.backend_timeout * 4 + Duration::from_secs(2), task).await;
    }
    plane.services.reconnect().await?;
    Ok(())
}

/// The faults of the plan's next step: the cutover once half the run is over (if the run has
/// one), else one draw of the settings' kinds (None: nothing this time). `slow` holds the
/// backends an upstream timeout left slow; `submitted` is how many requests are in so far.
fn next_faults(
    cutover_done: &mut bool,
    started: Instant,
    settings: &ChaosSettings,
    versions: &[String],
    slow: &mut BTreeSet<String>,
    submitted: usize,
    rng: &mut StdRng,
) -> Option<Vec<Fault>> {
    if !*cutover_done && started.elapsed() >= settings.duration / 2 {
        *cutover_done = true;
        return Some(vec![Fault::Cutover {
            to: settings.cutover_to.clone().unwrap_or_default(),
        }]);
    }
    if settings.faults.is_empty() {
        return None;
    }
    let kind = settings.faults[rng.random_range(0..settings.faults.len())];
    let version = versions[rng.random_range(0..versions.len())].clone();
    Some(match kind {
        // A slow backend stays slow until the plan draws it again.
        FaultKind::UpstreamTimeout if slow.remove(&version) => {
            vec![Fault::RecoverBackend { version }]
        }
        FaultKind::UpstreamTimeout => {
            slow.insert(version.clone());
            vec![Fault::UpstreamTimeout { version }]
        }
        FaultKind::BackendFailure => vec![Fault::BackendFailure {
            version,
            status: 503,
            calls: 2,
        }],
        FaultKind::LeaseExpiry if submitted > 0 => {
            vec![Fault::ExpireLease {
                request: rng.random_range(0..submitted),
            }]
        }
        FaultKind::WorkerCrash => vec![Fault::CrashWorker {
            worker: rng.random_range(0..settings.workers.len()),
        }],
        FaultKind::Partition => {
            let target = if rng.random_bool(0.5) {
                PartitionTarget::Redis
            } else {
                PartitionTarget::Postgres
            };
            vec![Fault::Partition { target }, Fault::Heal { target }]
        }
        _ => return None,
    })
}

/// Faults touch this case only, and every round trip is attributed: each of the `workers` has
/// proxies of its own for Redis, Postgres and each backend.
async fn open_links(bed: &TestBed, workers: usize) -> Result<Vec<WorkerLink>> {
    let mut links = Vec::new();
    for _ in 0..workers {
        links.push(WorkerLink::open(bed, true, true).await?);
    }
    Ok(links)
}
