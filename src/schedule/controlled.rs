//! The controlled runner: runs one [`Schedule`] against reference workers on the real test bed,
//! one step at a time. Every worker is held by a [`Gate`], so only the worker a step names moves,
//! and only as far as the step says; faults land between steps; time-driven events (lease TTL,
//! visibility timeout) happen when the schedule says, never by sleeping. The same schedule gives
//! the same history (wall-clock stamps aside).

use crate::check::{Invariant, Violation, check};
use crate::contract::Keys;
use crate::contract::log::LogSink;
use crate::contract::log::Status;
use crate::contract::worker::{WorkerContext, WorkerFactory, WorkerUnderTest};
use crate::env::backends::{Behaviour, ProgramGuard};
use crate::env::{DedicatedProxy, Target, TestBed};
use crate::fault::{Fault, FaultKind, PartitionTarget};
use crate::history::{EventKind, History, Recorder, SubmittedRequest, read_jobs};
use crate::reference::Pipeline;
use crate::reference::ReferenceFactory;
use crate::reference::checkpoints::{Arrival, Checkpoint, Gate};
use crate::reference::cutover::Cutover;
use crate::reference::defects::Defects;
use crate::reference::queue::{JobMessage, Queue};
use crate::reference::submit::InferenceRequest;
use crate::reference::worker::{BackendEndpoint, Infra};
use crate::schedule::{Schedule, Step, WorkerSpec};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Settings of controlled cases.
#[derive(Debug, Clone)]
pub struct CaseSettings {
    /// The workers of every case.
    pub workers: Vec<WorkerSpec>,
    /// Defects switched on in every worker (and the cutover).
    pub defects: Defects,
    /// Invariants checked after every case.
    pub invariants: Vec<Invariant>,
    /// The workers' backend timeout; an upstream-timeout fault delays the backend past it, so
    /// keep it short: it is real time spent.
    pub backend_timeout: Duration,
    /// Starts the workers under test (default: the reference worker).
    pub factory: Arc<dyn WorkerFactory>,
}

impl CaseSettings {
    /// Two workers, `worker-a` on v1 and `worker-c` on v2 (the seed's), no defect, every invariant.
    pub fn seed_pair() -> CaseSettings {
        CaseSettings {
            workers: vec![
                WorkerSpec {
                    id: "worker-a".into(),
                    version: "v1".into(),
                },
                WorkerSpec {
                    id: "worker-c".into(),
                    version: "v2".into(),
                },
            ],
            defects: Defects::none(),
            invariants: Invariant::ALL.to_vec(),
            backend_timeout: Duration::from_millis(250),
            factory: Arc::new(ReferenceFactory),
        }
    }
}

/// Fault kinds applied in a case, and whether each reached the path it targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// kind -> (times applied, times it landed on its target path).
    pub faults: BTreeMap<FaultKind, (u32, u32)>,
}

impl Coverage {
    /// Records one application of a fault kind and whether it landed on its target path.
    pub fn applied_kind(&mut self, kind: FaultKind, landed: bool) {
        let entry = self.faults.entry(kind).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += u32::from(landed);
    }

    /// Adds another case's coverage.
    pub fn merge(&mut self, other: &Coverage) {
        for (kind, (applied, landed)) in &other.faults {
            let entry = self.faults.entry(*kind).or_insert((0, 0));
            entry.0 += applied;
            entry.1 += landed;
        }
    }
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// What happened.
    pub history: History,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Which faults landed.
    pub coverage: Coverage,
}

/// A worker's place in the case.
struct Slot {
    worker: Arc<dyn WorkerUnderTest>,
    task: Option<JoinHandle<Result<()>>>,
    parked: Option<Arrival>,
    /// Idempotency key of the delivery in flight.
    key: Option<String>,
}

/// Runs controlled cases on one test bed.
pub struct Controller<'a> {
    bed: &'a TestBed,
    infra: Infra,
    settings: CaseSettings,
    backends: BTreeMap<String, BackendEndpoint>,
    run_id: String,
    cases: AtomicU64,
    /// Cases may run concurrently (each in its own namespace, on its own proxies when it cuts a
    /// link); one that restarts a container hits every case, so it runs alone.
    turns: tokio::sync::RwLock<()>,
}

impl std::fmt::Debug for Controller<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("run_id", &self.run_id)
            .finish()
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

impl<'a> Controller<'a> {
    /// A controller on `bed`; connections are shared by all its cases.
    pub async fn new(bed: &'a TestBed, settings: CaseSettings) -> Result<Controller<'a>> {
        if settings.workers.is_empty() {
            return Err(Error::Config("a case needs at least one worker".into()));
        }
        let infra = Infra::connect(&bed.redis_url(), &bed.database_url()).await?;
        let backends = crate::reference::backend_endpoints(bed)?;
        for spec in &settings.workers {
            if !backends.contains_key(&spec.version) {
                return Err(Error::Config(format!(
                    "worker {} runs {} but the test bed serves {}",
                    spec.id,
                    spec.version,
                    bed.versions().join(", ")
                )));
            }
        }
        Ok(Controller {
            bed,
            infra,
            settings,
            backends,
            run_id: format!(
                "r{}x{}",
                std::process::id(),
                RUNS.fetch_add(1, Ordering::Relaxed)
            ),
            cases: AtomicU64::new(0),
            turns: tokio::sync::RwLock::new(()),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &CaseSettings {
        &self.settings
    }

    /// Runs one schedule as a fresh case (its own key namespace) and checks it. Cases may run
    /// concurrently on one controller.
    pub async fn run(&self, schedule: &Schedule) -> Result<CaseResult> {
        let restarts = schedule
            .steps
            .iter()
            .any(|step| matches!(step, Step::Fault(Fault::RestartRedis)));
        let _turn = if restarts {
            (None, Some(self.turns.write().await))
        } else {
            (Some(self.turns.read().await), None)
        };
        let case = self.cases.fetch_add(1, Ordering::Relaxed);
        let namespace = format!("{}c{case}", self.run_id);
        let mut run = CaseRun::start(self, schedule, &namespace).await?;
        let outcome = run.execute(schedule).await;
        // Whatever happened, leave nothing running or held.
        let drained = run.drain().await;
        outcome?;
        drained?;
        run.finish().await
    }
}

/// The state of one running case.
struct CaseRun<'c, 'a> {
    controller: &'c Controller<'a>,
    pipeline: Pipeline,
    gate: Arc<Gate>,
    recorder: Recorder,
    slots: Vec<Slot>,
    requests: Vec<SubmittedRequest>,
    cutover: Option<Cutover>,
    programs: HashMap<String, ProgramGuard>,
    partitions: HashMap<PartitionTarget, DedicatedProxy>,
    /// The job queue as the case's workers see it (through their possibly partitioned link).
    queue: Queue,
    /// The harness's own connections (through the shared proxies): a case's partition cuts off
    /// its workers, not the clock or the operator.
    admin: Infra,
    cut_off: std::collections::HashSet<PartitionTarget>,
    inputs: Vec<String>,
    /// Steps in the schedule (the drain is numbered after them).
    steps: usize,
    redis_restarted: bool,
    coverage: Coverage,
}

impl<'c, 'a> CaseRun<'c, 'a> {
    async fn start(
        controller: &'c Controller<'a>,
        schedule: &Schedule,
        namespace: &str,
    ) -> Result<CaseRun<'c, 'a>> {
        let bed = controller.bed;
        let needs_partition = schedule
            .steps
            .iter()
            .any(|s| matches!(s, Step::Fault(Fault::Partition { .. } | Fault::Heal { .. })));
        // A partition must cut off this case only: it gets proxies (and connections) of its own.
        let mut partitions = HashMap::new();
        let infra = if needs_partition {
            let links = bed.case_links(false).await?;
            let infra = Infra::connect(links.redis_url(), links.database_url()).await?;
            partitions.insert(PartitionTarget::Redis, links.redis);
            partitions.insert(PartitionTarget::Postgres, links.postgres);
            infra
        } else {
            controller.infra.clone()
        };
        let log = LogSink::default();
        let mut pipeline = Pipeline::with_infra(
            infra,
            Keys::namespaced(namespace),
            controller.backends.clone(),
            log,
        )
        .await?;
        let gate = Arc::new(Gate::new(Duration::from_secs(20)));
        let settings = &controller.settings;
        let mut slots = Vec::new();
        for (index, spec) in settings.workers.iter().enumerate() {
            gate.hold(&spec.id);
            let worker = settings
                .factory
                .start(WorkerContext {
                    spec,
                    index,
                    infra: pipeline.infra.clone(),
                    keys: pipeline.keys.clone(),
                    backends: &controller.backends,
                    checkpoints: gate.checkpoints(),
                    log: pipeline.log.clone(),
                    backend_timeout: settings.backend_timeout,
                    // Time-driven events come from the schedule: keep the clock out of the way.
                    lease_ttl: Duration::from_secs(60),
                    defects: settings.defects.clone(),
                })
                .await?;
            slots.push(Slot {
                worker,
                task: None,
                parked: None,
                key: None,
            });
        }
        let mut requests = Vec::new();
        for request in &schedule.requests {
            let submitted = pipeline
                .api
                .submit(&InferenceRequest {
                    request_id: request.request_id.clone(),
                    input: request.input.clone(),
                })
                .await?;
            requests.push(SubmittedRequest {
                request_id: request.request_id.clone(),
                idempotency_key: submitted.idempotency_key,
            });
        }
        let queue = Queue::open(pipeline.infra.redis.clone(), &pipeline.keys).await?;
        let mut run = CaseRun {
            controller,
            // `partitions` is only non-empty when the pipeline runs on the case's own proxies.
            partitions: HashMap::new(),
            pipeline,
            gate,
            recorder: Recorder::new(),
            slots,
            requests,
            cutover: None,
            programs: HashMap::new(),
            queue,
            admin: controller.infra.clone(),
            cut_off: Default::default(),
            inputs: schedule
                .requests
                .iter()
                .map(|r| crate::reference::submit::normalize_input(&r.input))
                .collect(),
            steps: schedule.steps.len(),
            redis_restarted: false,
            coverage: Coverage::default(),
        };
        run.partitions = partitions;
        run.recorder.collect_log(&run.pipeline.log);
        Ok(run)
    }

    async fn execute(&mut self, schedule: &Schedule) -> Result<()> {
        for (i, step) in schedule.steps.iter().enumerate() {
            self.recorder.step(i + 1, step.to_string());
            match step {
                Step::Run { worker, to } => self.run_worker(*worker, *to).await?,
                Step::Crash { worker } => self.crash(*worker).await?,
                Step::Fault(fault) => self.apply(fault).await?,
            }
            self.recorder.collect_log(&self.pipeline.log);
        }
        Ok(())
    }

    fn slot_index(&self, worker: usize) -> usize {
        worker % self.slots.len()
    }

    /// Whether some other worker is mid-job (in flight past its lease, or crashed holding one).
    fn someone_in_flight(&self, except: usize) -> bool {
        self.slots
            .iter()
            .enumerate()
            .any(|(i, s)| i != except && s.task.is_some())
    }

    async fn run_worker(&mut self, worker: usize, to: Checkpoint) -> Result<()> {
        let index = self.slot_index(worker);
        if self.slots[index].task.is_none() {
            let slot_worker = self.slots[index].worker.clone();
            if slot_worker.is_draining() {
                return Ok(());
            }
            let received = self.receive_for(slot_worker.id()).await;
            let (delivery, redelivered) = match received {
                Ok(received) => received,
                Err(err) => {
                    // The worker could not reach its queue (a partition): its step does nothing.
                    self.recorder.fault(
                        "attempt_error",
                        &[("worker_id", slot_worker.id()), ("error", &err.to_string())],
                    );
                    if !self.cut_off.is_empty() {
                        self.coverage.applied_kind(FaultKind::Partition, true);
                    }
                    return Ok(());
                }
            };
            let Some(delivery) = delivery else {
                return Ok(());
            };
            if redelivered {
                let overlap = self.someone_in_flight(index);
                self.coverage.applied_kind(FaultKind::RetryOverlap, overlap);
                self.recorder.fault(
                    "redelivered",
                    &[
                        ("worker_id", slot_worker.id()),
                        ("idempotency_key", &delivery.job.idempotency_key),
                        ("queue_receive_count", &delivery.receive_count.to_string()),
                        ("overlap", if overlap { "true" } else { "false" }),
                    ],
                );
            }
            let slot = &mut self.slots[index];
            slot.key = Some(delivery.job.idempotency_key.clone());
            let runner = slot.worker.clone();
            slot.task = Some(tokio::spawn(async move { runner.process(delivery).await }));
        }
        let id = self.slots[index].worker.id().to_owned();
        if let Some(parked) = self.slots[index].parked.take() {
            if parked.at >= to {
                self.slots[index].parked = Some(parked);
                return Ok(());
            }
            parked.proceed();
        }
        loop {
            let arrival = self.gate.next(&id).await?;
            if arrival.at == Checkpoint::Done {
                arrival.proceed();
                self.settle(index).await?;
                return Ok(());
            }
            if arrival.at >= to {
                self.slots[index].parked = Some(arrival);
                return Ok(());
            }
            arrival.proceed();
        }
    }

    /// Waits for a worker's task to end and records how.
    async fn settle(&mut self, index: usize) -> Result<()> {
        let slot = &mut self.slots[index];
        slot.key = None;
        slot.parked = None;
        let Some(task) = slot.task.take() else {
            return Ok(());
        };
        let worker = slot.worker.id().to_owned();
        match task.await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                // Infrastructure errors (a partition, a restart) end the attempt; the delivery
                // stays unacknowledged and will be redelivered.
                let landed = !self.cut_off.is_empty();
                self.recorder.fault(
                    "attempt_error",
                    &[("worker_id", &worker), ("error", &err.to_string())],
                );
                if landed {
                    self.coverage.applied_kind(FaultKind::Partition, true);
                }
            }
            Err(join) => {
                return Err(Error::other(format!("worker {worker} panicked: {join}")));
            }
        }
        Ok(())
    }

    async fn crash(&mut self, worker: usize) -> Result<()> {
        let index = self.slot_index(worker);
        let Some(parked) = self.slots[index].parked.take() else {
            return Ok(());
        };
        let at = parked.at;
        let id = self.slots[index].worker.id().to_owned();
        parked.crash();
        self.settle(index).await?;
        self.coverage
            .applied_kind(FaultKind::WorkerCrash, at >= Checkpoint::AfterLease);
        self.recorder
            .fault("worker_crashed", &[("worker_id", &id), ("at", at.name())]);
        Ok(())
    }

    fn key_in_flight(&self, key: &str) -> bool {
        self.slots.iter().any(|s| {
            s.key.as_deref() == Some(key) && s.parked.is_some_and_at_least(Checkpoint::AfterLease)
        })
    }

    async fn apply(&mut self, fault: &Fault) -> Result<()> {
        let bed = self.controller.bed;
        let prefix = self.pipeline.keys.prefix().to_owned();
        match fault {
            Fault::ExpireLease { request } => {
                let Some(request) = self.requests.get(request % self.requests.len().max(1)) else {
                    return Ok(());
                };
                let key = request.idempotency_key.clone();
                let held = self.expire_lease(&key).await?;
                let landed = held && self.key_in_flight(&key);
                self.coverage.applied_kind(FaultKind::LeaseExpiry, landed);
                self.recorder.fault(
                    "lease_expired",
                    &[("idempotency_key", &key), ("held", &held.to_string())],
                );
            }
            Fault::RestartRedis => {
                let landed = self
                    .slots
                    .iter()
                    .any(|s| s.parked.is_some_and_at_least(Checkpoint::AfterLease));
                bed.restart(Target::Redis).await?;
                self.reconnect().await?;
                self.redis_restarted = true;
                self.coverage.applied_kind(FaultKind::RedisRestart, landed);
                self.recorder.fault("redis_restarted", &[]);
            }
            Fault::Partition { target } | Fault::Heal { target } => {
                let cut = matches!(fault, Fault::Partition { .. });
                let Some(proxy) = self.partitions.get(target) else {
                    return Err(Error::other("partition without the case's own proxies"));
                };
                if cut {
                    proxy.disable().await?;
                    self.cut_off.insert(*target);
                } else {
                    proxy.enable().await?;
                    self.cut_off.remove(target);
                    // Only Redis's connection manager needs waking; Postgres's pool opens fresh
                    // connections on its own.
                    if *target == PartitionTarget::Redis {
                        self.reconnect().await?;
                    }
                }
                self.recorder.fault(
                    if cut { "partition" } else { "heal" },
                    &[("target", &format!("{target:?}"))],
                );
            }
            Fault::Cutover { to } => {
                let landed = self
                    .slots
                    .iter()
                    .any(|s| s.parked.is_some_and_at_least(Checkpoint::AfterTake));
                let mut redis = self.admin.redis.clone();
                let cutover = crate::reference::cutover::cutover(
                    &mut redis,
                    &self.pipeline.keys,
                    to,
                    &self.controller.settings.defects,
                    &self.pipeline.log,
                )
                .await?;
                self.cutover = Some(cutover);
                self.coverage.applied_kind(FaultKind::Cutover, landed);
            }
            Fault::InvalidateCache => {
                if let Some(cutover) = self.cutover.as_mut() {
                    let mut redis = self.admin.redis.clone();
                    let deleted = cutover
                        .invalidate(&mut redis, &self.pipeline.keys, &self.pipeline.log)
                        .await?;
                    self.coverage
                        .applied_kind(FaultKind::CacheInvalidationLag, deleted > 0);
                }
            }
            Fault::UpstreamTimeout { version } => {
                let delay = self.controller.settings.backend_timeout + Duration::from_millis(150);
                let guard = bed
                    .backend(version)?
                    .program(&prefix, Behaviour::Delay(delay))
                    .await?;
                self.programs.insert(version.clone(), guard);
                self.recorder
                    .fault("upstream_slow", &[("model_version", version)]);
            }
            Fault::BackendFailure {
                version,
                status,
                calls,
            } => {
                let guard = bed
                    .backend(version)?
                    .program(
                        &prefix,
                        Behaviour::FailFirst {
                            status: *status,
                            calls: *calls,
                        },
                    )
                    .await?;
                self.programs.insert(version.clone(), guard);
                self.recorder.fault(
                    "backend_failing",
                    &[("model_version", version), ("status", &status.to_string())],
                );
            }
        }
        Ok(())
    }

    /// Heals every fault, lets parked workers finish, lets every lease run out and drains the
    /// queue with workers of the active version.
    async fn drain(&mut self) -> Result<()> {
        self.recorder.step(
            self.steps + 1,
            "drain: heal, finish parked workers, expire leases, redeliver".into(),
        );
        for proxy in self.partitions.values() {
            proxy.enable().await?;
        }
        if !self.cut_off.is_empty() {
            self.reconnect().await?;
        }
        self.cut_off.clear();
        self.programs.clear();
        for index in 0..self.slots.len() {
            let id = self.slots[index].worker.id().to_owned();
            self.gate.free(&id);
            if let Some(parked) = self.slots[index].parked.take() {
                parked.proceed();
            }
            self.settle(index).await?;
        }
        for request in self.requests.clone() {
            if self.expire_lease(&request.idempotency_key).await? {
                self.recorder.fault(
                    "lease_expired",
                    &[("idempotency_key", &request.idempotency_key)],
                );
            }
        }
        if self.redis_restarted {
            self.recover_queue().await?;
        }
        let active: Option<String> = {
            let mut redis = self.admin.redis.clone();
            redis::cmd("GET")
                .arg(self.pipeline.keys.active_version())
                .query_async(&mut redis)
                .await?
        };
        // Bounded: each round either processes a delivery or ends the drain.
        for _ in 0..(4 * self.requests.len() + 4) {
            let mut progressed = false;
            for slot in &self.slots {
                let worker = &slot.worker;
                if active
                    .as_deref()
                    .is_some_and(|v| v != worker.model_version())
                    || worker.is_draining()
                {
                    continue;
                }
                let (delivery, _) = self.receive_for(worker.id()).await?;
                // (After healing, the workers' connections answer again: reconnect() waited.)
                if let Some(delivery) = delivery {
                    if let Err(err) = worker.process(delivery).await {
                        self.recorder.fault(
                            "attempt_error",
                            &[("worker_id", worker.id()), ("error", &err.to_string())],
                        );
                    }
                    progressed = true;
                }
            }
            self.recorder.collect_log(&self.pipeline.log);
            if !progressed {
                break;
            }
        }
        Ok(())
    }

    /// After a restart or a healed partition the case's Redis connection has seen its socket die:
    /// its first command fails and reconnects. The harness waits until it answers again, so only
    /// the workers' attempts, never the harness's own bookkeeping, feel the fault.
    async fn reconnect(&self) -> Result<()> {
        self.reconnect_one(self.pipeline.infra.redis.clone())
            .await?;
        self.reconnect_one(self.admin.redis.clone()).await
    }

    async fn reconnect_one(&self, redis: redis::aio::ConnectionManager) -> Result<()> {
        crate::env::containers::wait_ready(
            "redis (case connections)",
            Duration::from_secs(10),
            || {
                let mut redis = redis.clone();
                async move { redis::cmd("PING").query_async::<String>(&mut redis).await }
            },
        )
        .await?;
        Ok(())
    }

    /// Redis lost the stream: the sweeper re-enqueues every job the table says is unfinished.
    async fn recover_queue(&mut self) -> Result<()> {
        let mut queue = Queue::open(self.admin.redis.clone(), &self.pipeline.keys).await?;
        for job in read_jobs(&self.admin.pg, self.pipeline.keys.prefix()).await? {
            if matches!(job.status.as_str(), "PENDING" | "IN_PROGRESS") {
                let input = self.controller_input(&job.request_id).unwrap_or_default();
                queue
                    .enqueue(&JobMessage {
                        idempotency_key: job.idempotency_key.clone(),
                        job_id: format!(
                            "job-{}",
                            &crate::contract::sha256_hex(&job.idempotency_key)[..12]
                        ),
                        request_id: job.request_id.clone(),
                        input,
                    })
                    .await?;
                self.recorder
                    .fault("requeued", &[("idempotency_key", &job.idempotency_key)]);
            }
        }
        Ok(())
    }

    /// The next delivery for a worker: a new job, else a redelivery of an unacknowledged one
    /// (its visibility timeout made to expire now). The flag says which.
    async fn receive_for(
        &self,
        worker: &str,
    ) -> Result<(Option<crate::reference::queue::Delivery>, bool)> {
        let mut queue = self.queue.clone();
        if let Some(delivery) = queue.receive(worker, Duration::from_secs(3600)).await? {
            return Ok((Some(delivery), false));
        }
        Ok((queue.claim_stale(worker, Duration::ZERO).await?, true))
    }

    /// Lets a lease run out now (the harness's clock), through the admin connection.
    async fn expire_lease(&self, idempotency_key: &str) -> Result<bool> {
        let mut redis = self.admin.redis.clone();
        let deleted: i64 = redis::cmd("DEL")
            .arg(self.pipeline.keys.lease(idempotency_key))
            .query_async(&mut redis)
            .await?;
        Ok(deleted == 1)
    }

    fn controller_input(&self, request_id: &str) -> Option<String> {
        // Inputs are not stored in the jobs table; the case knows them.
        self.requests
            .iter()
            .position(|r| r.request_id == request_id)
            .and_then(|i| self.inputs.get(i).cloned())
    }

    async fn finish(self) -> Result<CaseResult> {
        self.recorder.collect_log(&self.pipeline.log);
        let pg = &self.admin.pg;
        let prefix = self.pipeline.keys.prefix();
        let history = crate::history::collect(
            self.controller.bed,
            pg,
            prefix,
            self.recorder.events(),
            self.requests.clone(),
        )
        .await?;
        let mut coverage = self.coverage.clone();
        let upstream_failures = history.with_status(Status::UpstreamFailed).count() as u32;
        for (kind, marker) in [
            (FaultKind::UpstreamTimeout, "upstream_slow"),
            (FaultKind::BackendFailure, "backend_failing"),
        ] {
            let applied = history
                .events
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::Fault { what, .. } if what == marker))
                .count() as u32;
            if applied > 0 {
                let entry = coverage.faults.entry(kind).or_insert((0, 0));
                entry.0 += applied;
                entry.1 += upstream_failures.min(applied);
            }
        }
        let violations = check(&history, &self.controller.settings.invariants);
        Ok(CaseResult {
            history,
            violations,
            coverage,
        })
    }
}

trait ParkedAt {
    fn is_some_and_at_least(&self, at: Checkpoint) -> bool;
}

impl ParkedAt for Option<Arrival> {
    fn is_some_and_at_least(&self, at: Checkpoint) -> bool {
        self.as_ref().is_some_and(|a| a.at >= at)
    }
}
