//! The chaos runner: free-running workers of mixed versions with real clocks (short visibility
//! timeout and lease TTL), real toxics on the case's own proxies, backend failures, partitions,
//! crashes (a worker's task aborted at whatever await point it is in) and a cutover, for a bounded
//! time. It finds what checkpoints do not model; it is reproducible in distribution (the fault
//! plan comes from a seed), and everything it does is recorded and judged by the same checkers.

use crate::check::{Invariant, check};
use crate::contract::Keys;
use crate::contract::log::Level;
use crate::contract::log::LogSink;
use crate::contract::log::Status;
use crate::contract::worker::{WorkerContext, WorkerFactory, WorkerUnderTest};
use crate::env::TestBed;
use crate::env::backends::Behaviour;
use crate::env::proxy::{Direction, Toxic};
use crate::fault::FaultKind;
use crate::history::{Event, EventKind, SubmittedRequest};
use crate::reference::Pipeline;
use crate::reference::checkpoints::Checkpoints;
use crate::reference::defects::Defects;
use crate::reference::queue::Queue;
use crate::reference::submit::InferenceRequest;
use crate::reference::worker::{BackendEndpoint, Infra};
use crate::schedule::WorkerSpec;
use crate::schedule::controlled::{CaseResult, Coverage};
use crate::{Error, Result};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
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
            invariants: Invariant::ALL.to_vec(),
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

/// Requests submitted at seeded times over the first part of a free-running case, so that faults
/// meet work in flight (shared by the chaos and external runners).
pub(crate) struct Arrivals {
    due: std::iter::Peekable<std::vec::IntoIter<(Duration, usize)>>,
    inputs: usize,
    /// What was submitted so far.
    pub(crate) submitted: Vec<SubmittedRequest>,
}

impl Arrivals {
    /// `count` requests at times drawn from `rng` within `window`, over `inputs` distinct inputs.
    pub(crate) fn new(count: usize, inputs: usize, window: Duration, rng: &mut StdRng) -> Arrivals {
        let mut due: Vec<(Duration, usize)> = (0..count)
            .map(|i| (window.mul_f64(rng.random_range(0.0..1.0)), i))
            .collect();
        due.sort();
        Arrivals {
            due: due.into_iter().peekable(),
            inputs: inputs.max(1),
            submitted: Vec::new(),
        }
    }

    /// Whether requests are still to come.
    pub(crate) fn pending(&mut self) -> bool {
        self.due.peek().is_some()
    }

    /// Submits every request due `elapsed` into the run.
    pub(crate) async fn submit_due(
        &mut self,
        elapsed: Duration,
        api: &mut crate::reference::submit::Api,
    ) -> Result<()> {
        while let Some((at, i)) = self.due.peek().copied() {
            if elapsed < at {
                break;
            }
            self.due.next();
            let request_id = format!("req-{i}");
            let submitted = api
                .submit(&InferenceRequest {
                    request_id: request_id.clone(),
                    input: format!("input-{}", i % self.inputs),
                })
                .await?;
            self.submitted.push(SubmittedRequest {
                request_id,
                idempotency_key: submitted.idempotency_key,
            });
        }
        Ok(())
    }
}

/// Marks a log line as a fault (turned into a fault event in the history).
const FAULT_FIELD: &str = "fault";

fn emit_fault(log: &LogSink, what: &str, fields: &[(&str, String)]) {
    let mut line = vec![
        ("status".to_owned(), what.to_owned()),
        (FAULT_FIELD.to_owned(), "true".to_owned()),
    ];
    line.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    log.emit(Level::Warn, line);
}

/// Processes a delivery; an infrastructure error ends the attempt and is recorded as a fault
/// event (the delivery stays unacknowledged and is redelivered).
async fn process_logged(
    worker: &dyn WorkerUnderTest,
    delivery: crate::reference::queue::Delivery,
    log: &LogSink,
) {
    if let Err(err) = worker.process(delivery).await {
        emit_fault(
            log,
            "attempt_error",
            &[
                ("worker_id", worker.id().to_owned()),
                ("error", err.to_string()),
            ],
        );
    }
}

/// One worker's loop: receive (the harness's queue, real visibility timeout), process, pause.
async fn worker_loop(
    worker: Arc<dyn WorkerUnderTest>,
    queue: Queue,
    visibility: Duration,
    stop: Arc<AtomicBool>,
    seed: u64,
    log: LogSink,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut queue = queue;
    while !stop.load(Ordering::SeqCst) {
        if worker.is_draining() {
            break;
        }
        match queue.receive(worker.id(), visibility).await {
            Ok(Some(delivery)) => {
                process_logged(worker.as_ref(), delivery, &log).await;
            }
            Ok(None) => {
                // Nothing to do: poll again soon (free-running workers poll, as real ones do).
                tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
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
    let namespace = format!(
        "x{}c{}",
        std::process::id(),
        CHAOS_RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let keys = Keys::namespaced(&namespace);
    // Faults touch this case only: proxies of its own for Redis, Postgres and each backend.
    let links = bed.case_links(true).await?;
    let mut backends = BTreeMap::new();
    for version in bed.versions() {
        backends.insert(
            version.to_owned(),
            BackendEndpoint {
                name: crate::reference::endpoint_name(bed.backend(version)?.name()),
                url: links.backend_url(version).unwrap_or_default(),
            },
        );
    }
    let (redis_proxy, pg_proxy, backend_proxies) = (&links.redis, &links.postgres, &links.backends);
    let infra = Infra::connect(links.redis_url(), links.database_url()).await?;
    let admin = Infra::connect(&bed.redis_url(), &bed.database_url()).await?;
    let log = LogSink::default();
    // The API side submits through the harness's connections: clients retry their submits, and
    // the faults under test are the workers'.
    let mut api = Pipeline::with_infra(admin.clone(), keys.clone(), backends.clone(), log.clone())
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

    let mut workers = Vec::new();
    for (index, spec) in settings.workers.iter().enumerate() {
        let worker = settings
            .factory
            .start(WorkerContext {
                spec,
                index,
                infra: infra.clone(),
                keys: keys.clone(),
                backends: &backends,
                checkpoints: Checkpoints::free(),
                log: log.clone(),
                backend_timeout: settings.backend_timeout,
                lease_ttl: settings.lease_ttl,
                defects: settings.defects.clone(),
            })
            .await?;
        workers.push(worker);
    }
    let queue = Queue::open(infra.redis.clone(), &keys).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let spawn_worker = |index: usize, generation: u64| {
        tokio::spawn(worker_loop(
            workers[index].clone(),
            queue.clone(),
            settings.visibility_timeout,
            stop.clone(),
            settings.seed ^ ((index as u64) << 32) ^ generation,
            log.clone(),
        ))
    };
    let mut tasks: Vec<_> = (0..workers.len()).map(|i| spawn_worker(i, 0)).collect();

    // The fault plan: a seeded sequence of faults at seeded times.
    let mut coverage = Coverage::default();
    let mut guards = Vec::new();
    let deadline = started + settings.duration;
    let mut cutover_done = settings.cutover_to.is_none();
    let mut crashes = 0u64;
    while Instant::now() < deadline || arrivals.pending() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        arrivals.submit_due(started.elapsed(), &mut api).await?;
        // Faults come every few polls, not every one.
        if !rng.random_bool(0.35) {
            continue;
        }
        if !cutover_done && started.elapsed() >= settings.duration / 2 {
            let to = settings.cutover_to.clone().unwrap_or_default();
            let mut redis = admin.redis.clone();
            crate::reference::cutover::cutover(&mut redis, &keys, &to, &settings.defects, &log)
                .await?;
            cutover_done = true;
            continue;
        }
        if settings.faults.is_empty() {
            continue;
        }
        let kind = settings.faults[rng.random_range(0..settings.faults.len())];
        let versions: Vec<String> = backend_proxies.keys().cloned().collect();
        let version = versions[rng.random_range(0..versions.len())].clone();
        match kind {
            FaultKind::UpstreamTimeout => {
                let proxy = &backend_proxies[&version];
                let latency = settings.backend_timeout.as_millis() as u32 + 200;
                let name = Toxic::Latency {
                    latency_ms: latency,
                    jitter_ms: 0,
                }
                .name(Direction::Downstream);
                if proxy.info().await?.toxics.iter().all(|t| t.name != name) {
                    proxy
                        .add_toxic(
                            Toxic::Latency {
                                latency_ms: latency,
                                jitter_ms: 0,
                            },
                            Direction::Downstream,
                            1.0,
                        )
                        .await?;
                    emit_fault(&log, "upstream_slow", &[("model_version", version.clone())]);
                    coverage.faults.entry(kind).or_insert((0, 0)).0 += 1;
                } else {
                    proxy.remove_toxic(&name).await?;
                    emit_fault(
                        &log,
                        "upstream_recovered",
                        &[("model_version", version.clone())],
                    );
                }
            }
            FaultKind::BackendFailure => {
                let guard = bed
                    .backend(&version)?
                    .program(
                        keys.prefix(),
                        Behaviour::FailFirst {
                            status: 503,
                            calls: 2,
                        },
                    )
                    .await?;
                guards.push(guard);
                emit_fault(
                    &log,
                    "backend_failing",
                    &[("model_version", version.clone())],
                );
                coverage.faults.entry(kind).or_insert((0, 0)).0 += 1;
            }
            FaultKind::LeaseExpiry if !arrivals.submitted.is_empty() => {
                let requests = &arrivals.submitted;
                let request = &requests[rng.random_range(0..requests.len())];
                let mut redis = admin.redis.clone();
                let deleted: i64 = redis::cmd("DEL")
                    .arg(keys.lease(&request.idempotency_key))
                    .query_async(&mut redis)
                    .await?;
                emit_fault(
                    &log,
                    "lease_expired",
                    &[("idempotency_key", request.idempotency_key.clone())],
                );
                coverage.applied_kind(kind, deleted == 1);
            }
            FaultKind::WorkerCrash => {
                let index = rng.random_range(0..tasks.len());
                tasks[index].abort();
                crashes += 1;
                emit_fault(
                    &log,
                    "worker_crashed",
                    &[("worker_id", workers[index].id().to_owned())],
                );
                coverage.applied_kind(kind, true);
                // The process restarts (same worker id, fresh task).
                tasks[index] = spawn_worker(index, crashes);
            }
            FaultKind::Partition => {
                let (proxy, target) = if rng.random_bool(0.5) {
                    (redis_proxy, "Redis")
                } else {
                    (pg_proxy, "Postgres")
                };
                proxy.disable().await?;
                emit_fault(&log, "partition", &[("target", target.into())]);
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
                proxy.enable().await?;
                emit_fault(&log, "heal", &[("target", target.into())]);
                coverage.faults.entry(kind).or_insert((0, 0)).0 += 1;
            }
            _ => {}
        }
    }

    let requests = std::mem::take(&mut arrivals.submitted);
    // Heal everything, stop the loops, let in-flight attempts end.
    stop.store(true, Ordering::SeqCst);
    guards.clear();
    for proxy in backend_proxies.values() {
        proxy.clear_toxics().await?;
    }
    redis_proxy.enable().await?;
    pg_proxy.enable().await?;
    for task in tasks {
        let _ =
            tokio::time::timeout(settings.backend_timeout * 4 + Duration::from_secs(2), task).await;
    }
    emit_fault(&log, "healed", &[]);
    // Drain: leases run out, then workers of the active version take what is left.
    crate::env::containers::wait_ready(
        "redis (chaos connections)",
        Duration::from_secs(10),
        || {
            let mut redis = infra.redis.clone();
            async move { redis::cmd("PING").query_async::<String>(&mut redis).await }
        },
    )
    .await?;
    let active: Option<String> = {
        let mut redis = admin.redis.clone();
        redis::cmd("GET")
            .arg(keys.active_version())
            .query_async(&mut redis)
            .await?
    };
    for request in &requests {
        let mut redis = admin.redis.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(keys.lease(&request.idempotency_key))
            .query_async(&mut redis)
            .await?;
    }
    let mut queue = queue;
    for _ in 0..(4 * requests.len() + 8) {
        let mut progressed = false;
        for worker in &workers {
            if active
                .as_deref()
                .is_some_and(|v| v != worker.model_version())
                || worker.is_draining()
            {
                continue;
            }
            let delivery = match queue.receive(worker.id(), Duration::ZERO).await? {
                Some(d) => Some(d),
                None => queue.claim_stale(worker.id(), Duration::ZERO).await?,
            };
            if let Some(delivery) = delivery {
                progressed = true;
                process_logged(worker.as_ref(), delivery, &log).await;
            }
        }
        if !progressed {
            break;
        }
    }

    // The history: log lines in emission order, faults among them.
    let events = log
        .lines()
        .into_iter()
        .map(|line| {
            let kind = if line.get(FAULT_FIELD) == Some("true") {
                EventKind::Fault {
                    what: line.status().unwrap_or("fault").to_owned(),
                    fields: line
                        .fields
                        .iter()
                        .filter(|(k, _)| k != "status" && k != FAULT_FIELD)
                        .cloned()
                        .collect(),
                }
            } else {
                EventKind::Worker(line)
            };
            Event {
                step: 0,
                at_ms: 0,
                kind,
            }
        })
        .collect();
    let history = crate::history::collect(bed, &admin.pg, keys.prefix(), events, requests).await?;
    let upstream_failures = history.with_status(Status::UpstreamFailed).count() as u32;
    for kind in [FaultKind::UpstreamTimeout, FaultKind::BackendFailure] {
        if let Some(entry) = coverage.faults.get_mut(&kind) {
            entry.1 = upstream_failures.min(entry.0);
        }
    }
    let errors = history
        .events
        .iter()
        .filter(|e| e.status() == Some("attempt_error"))
        .count() as u32;
    if let Some(entry) = coverage.faults.get_mut(&FaultKind::Partition) {
        entry.1 = errors.min(entry.0);
    }
    let overlaps = history.with_status(Status::RetryDispatched).count() as u32;
    coverage.applied_kind(FaultKind::RetryOverlap, overlaps > 0);
    let violations = check(&history, &settings.invariants);
    Ok(CaseResult {
        history,
        violations,
        coverage,
    })
}
