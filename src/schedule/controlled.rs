//! The controlled runner: runs one [`Schedule`] against workers under test on the real test bed,
//! one step at a time. Every worker is held by a [`Gate`], so only the worker a step names moves,
//! and only as far as the step says; faults land between steps, through [`crate::fault::apply`];
//! time-driven events (lease TTL, visibility timeout) happen when the schedule says, never by
//! sleeping. The same schedule gives the same history (wall-clock stamps aside).
//!
//! The runner owns apply -> check: it records everything through one [`Recorder`], then judges
//! the history with the checkers and the coverage, as every runner does.

use crate::check::coverage::{Coverage, coverage};
use crate::check::{Invariant, Violation, check};
use crate::contract::Keys;
use crate::contract::checkpoint::{Arrival, Checkpoint, Gate};
use crate::contract::defect::Defects;
use crate::contract::delivery::{Delivery, JobMessage};
use crate::contract::log::Echo;
use crate::contract::worker::{
    BackendEndpoint, Infra, WorkerContext, WorkerFactory, WorkerUnderTest,
};
use crate::env::TestBed;
use crate::fault::{Fault, apply};
use crate::history::{History, Observation, Recorder, SubmittedRequest, read_jobs};
use crate::reference::Pipeline;
use crate::reference::ReferenceFactory;
use crate::reference::queue::Queue;
use crate::reference::submit::InferenceRequest;
use crate::schedule::plane::{CasePlane, Services, Workers};
use crate::schedule::{Schedule, Step, WorkerSpec};
use crate::{Error, Result};
use std::collections::BTreeMap;
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

impl CaseResult {
    /// Judges a history: the invariants, and which faults reached their target paths.
    pub fn judge(history: History, invariants: &[Invariant]) -> CaseResult {
        CaseResult {
            violations: check(&history, invariants),
            coverage: coverage(&history),
            history,
        }
    }
}

/// Runs controlled cases on one test bed.
pub struct Controller<'a> {
    bed: &'a TestBed,
    /// The workers' connections in cases that cut no link.
    infra: Infra,
    /// The harness's own connections (patient).
    admin: Infra,
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
        // No case cuts these links (a partition gets links of its own): no need to fail fast.
        let infra = Infra::connect_with(
            &bed.redis_url(),
            &bed.database_url(),
            Duration::from_secs(10),
        )
        .await?;
        let admin = Infra::connect_harness(&bed.redis_url(), &bed.database_url()).await?;
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
            admin,
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

/// A worker's place in the case.
struct Slot {
    worker: Arc<dyn WorkerUnderTest>,
    task: Option<JoinHandle<Result<()>>>,
    parked: Option<Arrival>,
}

/// The case's workers, parked at their checkpoints by the gate.
struct Slots {
    slots: Vec<Slot>,
    gate: Arc<Gate>,
    recorder: Arc<Recorder>,
}

impl Slots {
    fn index(&self, worker: usize) -> usize {
        worker % self.slots.len()
    }

    /// Waits for a worker's task to end; an infrastructure error is recorded (its delivery stays
    /// unacknowledged and will be redelivered).
    async fn settle(&mut self, index: usize) -> Result<()> {
        let slot = &mut self.slots[index];
        slot.parked = None;
        let Some(task) = slot.task.take() else {
            return Ok(());
        };
        let worker = slot.worker.id().to_owned();
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                self.recorder.observe(Observation::AttemptError {
                    worker,
                    error: err.to_string(),
                });
                Ok(())
            }
            Err(join) => Err(Error::other(format!("worker {worker} panicked: {join}"))),
        }
    }
}

impl Workers for Slots {
    fn id(&self, worker: usize) -> String {
        self.slots[self.index(worker)].worker.id().to_owned()
    }

    async fn crash(&mut self, worker: usize) -> Result<Option<Option<String>>> {
        let index = self.index(worker);
        let Some(parked) = self.slots[index].parked.take() else {
            return Ok(None);
        };
        let at = parked.at;
        parked.crash();
        self.settle(index).await?;
        Ok(Some(Some(at.name().to_owned())))
    }

    async fn pause(&mut self, _worker: usize, _pause: Duration) -> Result<bool> {
        // No clock runs here: a pause is a worker held at its checkpoint while the schedule moves
        // others, which `Run` steps express already.
        Ok(false)
    }
}

/// The state of one running case.
struct CaseRun<'c, 'a> {
    controller: &'c Controller<'a>,
    pipeline: Pipeline,
    plane: CasePlane<'a, Slots>,
    recorder: Arc<Recorder>,
    requests: Vec<SubmittedRequest>,
    /// The job queue as the case's workers see it (through their possibly partitioned link).
    queue: Queue,
    /// Steps in the schedule (the drain is numbered after them).
    steps: usize,
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
        let (infra, links) = if needs_partition {
            let links = bed.case_links(false).await?;
            let infra = Infra::connect(links.redis_url(), links.database_url()).await?;
            (infra, Some(links))
        } else {
            (controller.infra.clone(), None)
        };
        let recorder = Recorder::new();
        let keys = Keys::namespaced(namespace);
        let pipeline = Pipeline::with_infra(
            infra.clone(),
            keys.clone(),
            controller.backends.clone(),
            recorder.log_sink(Echo::Off),
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
            });
        }
        // The API side submits through the harness's connections: a client retries its submit,
        // and the faults under test are the workers'.
        let mut api = crate::reference::submit::Api::new(
            controller.admin.pg.clone(),
            Queue::open(controller.admin.redis.clone(), &keys).await?,
            keys.clone(),
        );
        let mut requests = Vec::new();
        for request in &schedule.requests {
            let submitted = api
                .submit(&InferenceRequest {
                    request_id: request.request_id.clone(),
                    input: request.input.clone(),
                })
                .await?;
            requests.push(SubmittedRequest {
                request_id: request.request_id.clone(),
                idempotency_key: submitted.idempotency_key,
                input: crate::reference::submit::normalize_input(&request.input),
            });
        }
        let queue = Queue::open(pipeline.infra.redis.clone(), &pipeline.keys).await?;
        let mut services = Services::new(
            bed,
            keys,
            controller.admin.clone(),
            infra,
            links,
            settings.defects.clone(),
            settings.backend_timeout,
        );
        services.requests = requests.iter().map(|r| r.idempotency_key.clone()).collect();
        Ok(CaseRun {
            controller,
            pipeline,
            plane: CasePlane {
                services,
                workers: Slots {
                    slots,
                    gate,
                    recorder: recorder.clone(),
                },
            },
            recorder,
            requests,
            queue,
            steps: schedule.steps.len(),
        })
    }

    async fn execute(&mut self, schedule: &Schedule) -> Result<()> {
        for (i, step) in schedule.steps.iter().enumerate() {
            self.recorder.step(i + 1, step.to_string());
            match step {
                Step::Run { worker, to } => self.run_worker(*worker, *to).await?,
                Step::Crash { worker } => {
                    self.fault(&Fault::CrashWorker { worker: *worker }).await?
                }
                Step::Fault(fault) => self.fault(fault).await?,
            }
        }
        Ok(())
    }

    async fn fault(&mut self, fault: &Fault) -> Result<()> {
        let effect = apply(fault, &mut self.plane).await?;
        self.recorder.fault(effect);
        Ok(())
    }

    async fn run_worker(&mut self, worker: usize, to: Checkpoint) -> Result<()> {
        let slots = &self.plane.workers;
        let index = slots.index(worker);
        if slots.slots[index].task.is_none() {
            let slot_worker = slots.slots[index].worker.clone();
            if slot_worker.is_draining() {
                return Ok(());
            }
            let delivery = match self.receive_for(slot_worker.id()).await {
                Ok(delivery) => delivery,
                Err(err) => {
                    // The worker could not reach its queue (a partition): its step does nothing.
                    self.recorder.observe(Observation::AttemptError {
                        worker: slot_worker.id().to_owned(),
                        error: err.to_string(),
                    });
                    return Ok(());
                }
            };
            let Some(delivery) = delivery else {
                return Ok(());
            };
            let slot = &mut self.plane.workers.slots[index];
            let runner = slot.worker.clone();
            slot.task = Some(tokio::spawn(async move { runner.process(delivery).await }));
        }
        let slots = &mut self.plane.workers;
        let id = slots.slots[index].worker.id().to_owned();
        if let Some(parked) = slots.slots[index].parked.take() {
            if parked.at >= to {
                slots.slots[index].parked = Some(parked);
                return Ok(());
            }
            parked.proceed();
        }
        loop {
            let arrival = slots.gate.next(&id).await?;
            if arrival.at == Checkpoint::Done {
                arrival.proceed();
                slots.settle(index).await?;
                return Ok(());
            }
            if arrival.at >= to {
                slots.slots[index].parked = Some(arrival);
                return Ok(());
            }
            arrival.proceed();
        }
    }

    /// Heals every fault, lets parked workers finish, lets every lease run out and drains the
    /// queue with workers of the active version.
    async fn drain(&mut self) -> Result<()> {
        self.recorder.step(
            self.steps + 1,
            "drain: heal, finish parked workers, expire leases, redeliver".into(),
        );
        self.recorder.observe(Observation::Draining);
        self.plane.services.heal_all().await?;
        let slots = &mut self.plane.workers;
        for index in 0..slots.slots.len() {
            let id = slots.slots[index].worker.id().to_owned();
            slots.gate.free(&id);
            if let Some(parked) = slots.slots[index].parked.take() {
                parked.proceed();
            }
            slots.settle(index).await?;
        }
        for request in self.requests.clone() {
            if self
                .plane
                .services
                .delete_lease(&request.idempotency_key)
                .await?
            {
                self.recorder.fault(crate::fault::Effect::LeaseExpired {
                    key: request.idempotency_key.clone(),
                    held: true,
                });
            }
        }
        if self.plane.services.redis_restarted() {
            self.recover_queue().await?;
        }
        let active = self.plane.services.active_version().await?;
        // Bounded: each round either processes a delivery or ends the drain.
        let mut settled = false;
        for _ in 0..(4 * self.requests.len() + 4) {
            let mut progressed = false;
            let workers: Vec<Arc<dyn WorkerUnderTest>> = self
                .plane
                .workers
                .slots
                .iter()
                .map(|s| s.worker.clone())
                .collect();
            for worker in workers {
                if active
                    .as_deref()
                    .is_some_and(|v| v != worker.model_version())
                    || worker.is_draining()
                {
                    continue;
                }
                // (After healing, the workers' connections answer again: heal_all waited.)
                if let Some(delivery) = self.receive_for(worker.id()).await? {
                    if let Err(err) = worker.process(delivery).await {
                        self.recorder.observe(Observation::AttemptError {
                            worker: worker.id().to_owned(),
                            error: err.to_string(),
                        });
                    }
                    progressed = true;
                }
            }
            if !progressed {
                settled = true;
                break;
            }
        }
        self.recorder.observe(Observation::Drained { settled });
        Ok(())
    }

    /// Redis lost the stream: the sweeper re-enqueues every job the table says is unfinished.
    async fn recover_queue(&mut self) -> Result<()> {
        let admin = self.plane.services.admin().clone();
        let mut queue = Queue::open(admin.redis.clone(), &self.pipeline.keys).await?;
        for job in read_jobs(&admin.pg, self.pipeline.keys.prefix()).await? {
            if job.status().is_ok_and(|s| !s.is_terminal()) {
                let input = self
                    .requests
                    .iter()
                    .find(|r| r.request_id == job.request_id)
                    .map(|r| r.input.clone())
                    .unwrap_or_default();
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
                self.recorder.observe(Observation::Requeued {
                    key: job.idempotency_key.clone(),
                });
            }
        }
        Ok(())
    }

    /// The next delivery for a worker: a new job, else a redelivery of an unacknowledged one
    /// (its visibility timeout made to expire now, and recorded as such).
    async fn receive_for(&self, worker: &str) -> Result<Option<Delivery>> {
        let mut queue = self.queue.clone();
        if let Some(delivery) = queue.receive(worker, Duration::from_secs(3600)).await? {
            return Ok(Some(delivery));
        }
        let redelivery = queue.claim_stale(worker, Duration::ZERO).await?;
        if let Some(delivery) = &redelivery {
            self.recorder.observe(Observation::Redelivered {
                worker: worker.to_owned(),
                key: delivery.job.idempotency_key.clone(),
                receive_count: delivery.receive_count,
            });
        }
        Ok(redelivery)
    }

    async fn finish(self) -> Result<CaseResult> {
        let admin = self.plane.services.admin();
        let history = crate::history::collect(
            self.controller.bed,
            &admin.pg,
            self.pipeline.keys.prefix(),
            self.recorder.events(),
            self.requests.clone(),
        )
        .await?;
        Ok(CaseResult::judge(
            history,
            &self.controller.settings.invariants,
        ))
    }
}
