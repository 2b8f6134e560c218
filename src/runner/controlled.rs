//! The controlled runner: runs one [`Schedule`] against workers under test on the real test bed,
//! one step at a time. Every worker is held by a [`Gate`], so only the worker a step names moves,
//! and only as far as the step says: to a named checkpoint, or (a [`Step::Trips`]) round trip by
//! round trip through its own links, held between two statements where no checkpoint is (the
//! same link gate the wire runner holds processes with). Faults land between steps, through
//! [`crate::fault::apply`];
//! time-driven events (lease TTL, visibility timeout) happen when the schedule says, never by
//! sleeping. The same schedule gives the same history (wall-clock stamps aside).
//!
//! The runner owns apply -> check: it records everything through one [`Recorder`], then judges
//! the history with the checkers and the coverage, as every runner does.

use crate::check::{CaseResult, Invariant};
use crate::contract::Keys;
use crate::contract::checkpoint::{Arrival, Checkpoint, Gate};
use crate::contract::defect::Defects;
use crate::contract::delivery::{Delivery, JobMessage};
use crate::contract::log::Echo;
use crate::contract::worker::{Infra, WorkerContext, WorkerFactory, WorkerUnderTest};
use crate::env::TestBed;
use crate::fault::{Fault, apply};
use crate::history::{Observation, Recorder, SubmittedRequest, read_jobs};
use crate::reference::ReferenceFactory;
use crate::reference::queue::Queue;
use crate::reference::submit::InferenceRequest;
use crate::runner::link_gate::Gate as LinkGate;
use crate::runner::plane::{
    BackendControl, CasePlane, RestartScope, Services, WorkerLink, Workers,
};
use crate::schedule::file::{RunnerSpec, ScheduleFile};
use crate::schedule::search::{Case, Outcome, Runner};
use crate::schedule::{Schedule, ScheduleSpace, Step, WorkerSpec};
use crate::{Error, Result};
use futures::FutureExt;
use futures::future::BoxFuture;
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
    /// Records every round trip the workers make (the wire checks need it). Off, links carry
    /// bytes untouched and cost nothing extra.
    pub wire: bool,
}

impl CaseSettings {
    /// The schedule file of `schedule` run under these settings, found in suite `suite` (the
    /// reference worker's settings, or any worker's: only the reference can be replayed from the
    /// file alone).
    pub fn file(&self, suite: &str, schedule: Schedule) -> ScheduleFile {
        ScheduleFile::new(
            RunnerSpec::InProcess {
                suite: suite.to_owned(),
                workers: self.workers.clone(),
                defects: self.defects.iter().collect(),
                backend_timeout_ms: self.backend_timeout.as_millis() as u64,
                schedule,
            },
            self.invariants.clone(),
        )
    }

    /// The settings and steps of an in-process schedule file, to replay it with the reference
    /// worker (None: the file is another runner's).
    pub fn of_file(file: &ScheduleFile) -> Option<(CaseSettings, &Schedule)> {
        match &file.runner {
            RunnerSpec::InProcess {
                workers,
                defects,
                backend_timeout_ms,
                schedule,
                ..
            } => Some((
                CaseSettings {
                    workers: workers.clone(),
                    defects: Defects::of(defects.iter().copied()),
                    invariants: file.invariants.clone(),
                    backend_timeout: Duration::from_millis(*backend_timeout_ms),
                    factory: Arc::new(ReferenceFactory),
                    wire: true,
                },
                schedule,
            )),
            _ => None,
        }
    }

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
            invariants: Invariant::own(),
            backend_timeout: Duration::from_millis(250),
            factory: Arc::new(ReferenceFactory),
            wire: true,
        }
    }
}

/// Runs controlled cases on one test bed.
pub struct Controller<'a> {
    bed: &'a TestBed,
    /// The harness's own connections (patient).
    admin: Infra,
    settings: CaseSettings,
    /// Per worker index, links not in use by a case (each case takes one per worker and gives it
    /// back: links and their connections outlive cases, so a case costs no set-up), each with the
    /// bed's count of restarts when it was given back ([`TestBed::restarts`]).
    pools: Vec<std::sync::Mutex<Vec<Pooled>>>,
    run_id: String,
    cases: AtomicU64,
    /// Cases may run concurrently (each in its own namespace, on its own proxies when it cuts a
    /// link); one that restarts the Redis process hits every case, so it runs alone.
    turns: tokio::sync::RwLock<()>,
    /// Cases whose `redis-restart` still restarts the server process; the rest restart their
    /// own namespace ([`RestartScope::Namespace`]) and run alongside others.
    process_restarts: AtomicU64,
}

/// The lease TTL the workers of controlled cases are given (leases expire when the schedule
/// says, so it only has to outlast a case).
const LEASE_TTL: Duration = Duration::from_secs(60);

/// How long a job may wait for its lease to run out once its holder is gone: twice the TTL the
/// workers were given. A lease set to outlive it (the wrong unit, no expiry) strands the job.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(120);

/// How long a released request of a worker held between statements may take to be answered
/// before the step lets the worker go on freely (a cut link, a slowed backend).
const RELEASE_ANSWER: Duration = Duration::from_secs(5);

/// How long a worker moving between statements may take to reach its next request or
/// checkpoint before the step ends with it running freely.
const HELD_ARRIVAL: Duration = Duration::from_secs(10);

/// Cases per controller whose Redis restart is a real process restart: the first, so every
/// exploration that restarts Redis exercises the real one once; the rest are scoped to their
/// namespace and cost a few round trips instead of a server start and a turn alone.
pub const PROCESS_RESTARTS: u64 = 1;

impl Runner for Controller<'_> {
    type Step = Step;

    fn run(&self, case: Case<Step>) -> BoxFuture<'_, Result<Outcome<Step>>> {
        async move {
            let Case::Fixed(schedule) = case else {
                return Err(Error::other(
                    "the controlled runner runs fixed schedules, not PCT plans",
                ));
            };
            let started = std::time::Instant::now();
            let result = Controller::run(self, &schedule).await?;
            Ok(Outcome::of(schedule, result, started.elapsed()))
        }
        .boxed()
    }
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
        let admin =
            Infra::connect_harness(&bed.harness_redis_url(), &bed.harness_database_url()).await?;
        let served = bed.versions();
        for spec in &settings.workers {
            if !served.contains(&spec.version.as_str()) {
                return Err(Error::Config(format!(
                    "worker {} runs {} but the test bed serves {}",
                    spec.id,
                    spec.version,
                    served.join(", ")
                )));
            }
        }
        Ok(Controller {
            bed,
            admin,
            pools: settings
                .workers
                .iter()
                .map(|_| std::sync::Mutex::new(Vec::new()))
                .collect(),
            settings,
            run_id: format!(
                "r{}x{}",
                std::process::id(),
                RUNS.fetch_add(1, Ordering::Relaxed)
            ),
            cases: AtomicU64::new(0),
            turns: tokio::sync::RwLock::new(()),
            process_restarts: AtomicU64::new(PROCESS_RESTARTS),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &CaseSettings {
        &self.settings
    }

    /// `space` as this controller can run it: no steps between statements unless its workers'
    /// links are recorded by racecert's own proxy (a bed on a proxy in a container or an
    /// external one cannot hold a round trip), so a search never draws a step it cannot run.
    pub fn fit(&self, space: &ScheduleSpace) -> ScheduleSpace {
        ScheduleSpace {
            between_statements: space.between_statements
                && self.settings.wire
                && self.bed.records_wire(),
            ..space.clone()
        }
    }

    /// Runs one schedule as a fresh case (its own key namespace) and checks it. Cases may run
    /// concurrently on one controller.
    pub async fn run(&self, schedule: &Schedule) -> Result<CaseResult> {
        let restarts = schedule
            .steps
            .iter()
            .any(|step| matches!(step, Step::Fault(Fault::RestartRedis)));
        let whole = restarts
            && self
                .process_restarts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok();
        let _turn = if whole {
            (None, Some(self.turns.write().await))
        } else {
            (Some(self.turns.read().await), None)
        };
        let scope = if whole {
            RestartScope::Process
        } else {
            RestartScope::Namespace
        };
        let case = self.cases.fetch_add(1, Ordering::Relaxed);
        let namespace = format!("{}c{case}", self.run_id);
        // A harness error says in which phase of which case it happened.
        let during = |phase: &str| {
            let namespace = namespace.clone();
            let phase = phase.to_owned();
            move |err: Error| Error::other(format!("case {namespace}, {phase}: {err}"))
        };
        let mut run = CaseRun::start(self, schedule, &namespace, scope)
            .await
            .map_err(during("setting up"))?;
        let outcome = run
            .execute(schedule)
            .await
            .map_err(during("running the steps"));
        // Whatever happened, leave nothing running or held.
        let drained = run.drain().await.map_err(during("draining"));
        outcome?;
        drained?;
        run.finish().await.map_err(during("collecting the history"))
    }

    /// Links for worker `index` of a case: a pooled one (its Redis connection answering again if
    /// a restart broke it while it waited), or new ones.
    async fn take_link(&self, index: usize) -> Result<(WorkerLink, Option<Arc<LinkGate>>)> {
        let pooled = self.pools[index].lock().expect("poisoned").pop();
        match pooled {
            // Given back since the last restart, by a case whose drain healed it: it answers,
            // and a check would only cost a round trip through its proxy.
            Some((link, gate, restarts)) if restarts == self.bed.restarts() => Ok((link, gate)),
            Some((link, gate, _)) => {
                crate::env::containers::wait_ready(
                    "redis (pooled worker link)",
                    Duration::from_secs(10),
                    crate::runner::plane::ping(&link.infra()?.redis),
                )
                .await?;
                Ok((link, gate))
            }
            // Recorded links can hold requests too: steps between statements need it. Open
            // until a step holds it: checkpoints alone move the worker.
            None => {
                let wire = self.settings.wire;
                let link = WorkerLink::open_with(self.bed, wire, true, wire).await?;
                let gate = link.links.is_recorded().then(|| {
                    let id = &self.settings.workers[index].id;
                    let gate = LinkGate::new(id, "", Duration::from_secs(20));
                    gate.open();
                    gate
                });
                Ok((link, gate))
            }
        }
    }

    /// Gives a case's links (and their gates) back for the next cases (healed by the case's
    /// drain).
    fn give_back(&self, links: Vec<WorkerLink>, gates: Vec<Option<Arc<LinkGate>>>) {
        let restarts = self.bed.restarts();
        for (index, (link, gate)) in links.into_iter().zip(gates).enumerate() {
            self.pools[index]
                .lock()
                .expect("poisoned")
                .push((link, gate, restarts));
        }
    }
}

/// Links not in use by a case: the links, their gate (recorded links: it numbers their
/// connections' round trips, so it stays with them), and the bed's count of restarts when they
/// were given back.
type Pooled = (WorkerLink, Option<Arc<LinkGate>>, u64);

/// A worker's place in the case.
struct Slot {
    worker: Arc<dyn WorkerUnderTest>,
    task: Option<JoinHandle<Result<()>>>,
    parked: Option<Arrival>,
    /// Held at its links before a request (a [`Step::Trips`] ended there).
    held: bool,
    /// The last checkpoint it passed in its current delivery.
    last: Option<Checkpoint>,
    /// Its links' gate (None: the links are not recorded, so cannot hold).
    links: Option<Arc<LinkGate>>,
    /// The job queue as this worker sees it (through its own link, possibly cut).
    queue: Queue,
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
        slot.held = false;
        slot.last = None;
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

    async fn pause(&mut self, _worker: usize, _pause: Duration) -> Result<Option<Duration>> {
        // No clock runs here: a pause is a worker held at its checkpoint while the schedule moves
        // others, which `Run` steps express already.
        Ok(None)
    }
}

/// The state of one running case.
struct CaseRun<'c, 'a> {
    controller: &'c Controller<'a>,
    keys: Keys,
    /// Whether every worker's round trips are recorded.
    wire_recorded: bool,
    plane: CasePlane<'a, Slots>,
    recorder: Arc<Recorder>,
    requests: Vec<SubmittedRequest>,
    /// Steps in the schedule (the drain is numbered after them).
    steps: usize,
}

impl<'c, 'a> CaseRun<'c, 'a> {
    async fn start(
        controller: &'c Controller<'a>,
        schedule: &Schedule,
        namespace: &str,
        restart: RestartScope,
    ) -> Result<CaseRun<'c, 'a>> {
        let bed = controller.bed;
        let recorder = Recorder::new();
        let keys = Keys::namespaced(namespace);
        let settings = &controller.settings;
        let mut links = Vec::new();
        let mut link_gates = Vec::new();
        for index in 0..settings.workers.len() {
            let (link, gate) = controller.take_link(index).await?;
            if let Some(gate) = &gate {
                gate.rename(namespace);
                gate.begin(Vec::new());
            }
            links.push(link);
            link_gates.push(gate);
        }
        // The case's stream and consumer group, made by the harness before any worker reads.
        let harness_queue = Queue::open(controller.admin.redis.clone(), &keys).await?;
        let log = recorder.log_sink(Echo::Off);
        let gate = Arc::new(Gate::new(Duration::from_secs(20)));
        let mut slots = Vec::new();
        for (index, spec) in settings.workers.iter().enumerate() {
            gate.hold(&spec.id);
            let link = &links[index];
            let infra = link.infra()?.clone();
            let worker = settings
                .factory
                .start(WorkerContext {
                    spec,
                    index,
                    infra: infra.clone(),
                    keys: keys.clone(),
                    backends: &link.backends,
                    checkpoints: gate.checkpoints(),
                    log: log.clone(),
                    backend_timeout: settings.backend_timeout,
                    // Time-driven events come from the schedule: keep the clock out of the way.
                    lease_ttl: LEASE_TTL,
                    defects: settings.defects.clone(),
                })
                .await?;
            slots.push(Slot {
                worker,
                task: None,
                parked: None,
                held: false,
                last: None,
                links: link_gates[index].clone(),
                // The harness receives on the worker's behalf, through the worker's own link.
                queue: Queue::over(infra.redis.clone(), &keys),
            });
        }
        // The API side submits through the harness's connections: a client retries its submit,
        // and the faults under test are the workers'.
        let mut api = crate::reference::submit::Api::new(
            controller.admin.pg.clone(),
            harness_queue,
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
        let mut services = Services::new(
            bed,
            keys.clone(),
            controller.admin.clone(),
            links,
            BackendControl::Programs,
            settings.defects.clone(),
            settings.backend_timeout,
        );
        // Upstream timeouts happen when the slowed backend receives the call, not after the
        // workers' timeout in wall time.
        services.deadlines = Some(gate.deadlines());
        services.restart = restart;
        let mut wire_recorded = true;
        for (index, spec) in settings.workers.iter().enumerate() {
            match &slots[index].links {
                Some(gate) => {
                    let listener = {
                        let (recorder, gate) = (recorder.wire_listener(), gate.clone());
                        Arc::new(move |event: crate::wire::WireEvent| {
                            gate.trip(&event);
                            recorder(event);
                        })
                    };
                    wire_recorded &= services.record_to(index, &spec.id, listener);
                    if !services.hold(index, gate.clone()) {
                        // A remote proxy cannot hold: steps between statements are refused.
                        slots[index].links = None;
                    }
                }
                None => wire_recorded &= services.record(index, &spec.id, &recorder),
            }
        }
        services.requests = requests.iter().map(|r| r.idempotency_key.clone()).collect();
        Ok(CaseRun {
            controller,
            keys,
            wire_recorded,
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
            steps: schedule.steps.len(),
        })
    }

    async fn execute(&mut self, schedule: &Schedule) -> Result<()> {
        for (i, step) in schedule.steps.iter().enumerate() {
            self.recorder.step(i + 1, step.to_string());
            tracing::debug!(step = i + 1, %step, "controlled step");
            match step {
                Step::Run { worker, to } => self.run_worker(*worker, *to).await?,
                Step::Trips { worker, trips } => self.trips(*worker, *trips).await?,
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

    /// Starts worker `index` on a delivery if it is idle; whether it is running one now.
    async fn start_if_idle(&mut self, index: usize) -> Result<bool> {
        let slots = &self.plane.workers;
        if slots.slots[index].task.is_some() {
            return Ok(true);
        }
        let slot_worker = slots.slots[index].worker.clone();
        if slot_worker.is_draining() {
            return Ok(false);
        }
        let delivery = match self.receive_for(index).await {
            Ok(delivery) => delivery,
            Err(err) => {
                // The worker could not reach its queue (a partition): its step does nothing.
                self.recorder.observe(Observation::AttemptError {
                    worker: slot_worker.id().to_owned(),
                    error: err.to_string(),
                });
                return Ok(false);
            }
        };
        let Some(delivery) = delivery else {
            return Ok(false);
        };
        let slot = &mut self.plane.workers.slots[index];
        let runner = slot.worker.clone();
        slot.task = Some(tokio::spawn(async move { runner.process(delivery).await }));
        Ok(true)
    }

    async fn run_worker(&mut self, worker: usize, to: Checkpoint) -> Result<()> {
        let index = self.plane.workers.index(worker);
        if !self.start_if_idle(index).await? {
            return Ok(());
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
        let slot = &mut slots.slots[index];
        if slot.held {
            // Held between statements past `to` already: it stays. Else its request goes on.
            if slot.last.is_some_and(|last| last >= to) {
                return Ok(());
            }
            slot.held = false;
            if let Some(links) = &slot.links {
                links.open();
            }
        }
        loop {
            let arrival = slots.gate.next(&id).await?;
            slots.slots[index].last = Some(arrival.at);
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

    /// Lets worker `worker` complete `trips` counted round trips through its links, passing
    /// whatever checkpoints it meets, then holds it before its next request (or it finishes its
    /// delivery first).
    async fn trips(&mut self, worker: usize, trips: u32) -> Result<()> {
        let index = self.plane.workers.index(worker);
        let Some(links) = self.plane.workers.slots[index].links.clone() else {
            return Err(Error::Config(
                "steps between statements need the workers' links recorded, and a proxy in \
                 process to hold them"
                    .into(),
            ));
        };
        if !self.start_if_idle(index).await? {
            return Ok(());
        }
        let slots = &mut self.plane.workers;
        let id = slots.slots[index].worker.id().to_owned();
        links.close();
        let mut left = trips;
        if slots.slots[index].held {
            // The request it is held before is the first of these.
            slots.slots[index].held = false;
            left -= 1;
            if links.release(RELEASE_ANSWER).await.is_none() {
                return Ok(());
            }
        }
        if let Some(parked) = slots.slots[index].parked.take() {
            parked.proceed();
        }
        let mut notes = Vec::new();
        loop {
            // The worker is sequential: it is either at a checkpoint or at its links, never both.
            let held = tokio::select! {
                arrival = slots.gate.next(&id) => {
                    let arrival = arrival?;
                    tracing::debug!(worker = %id, at = %arrival.at, "between statements: checkpoint");
                    slots.slots[index].last = Some(arrival.at);
                    let done = arrival.at == Checkpoint::Done;
                    arrival.proceed();
                    if done {
                        links.open();
                        slots.settle(index).await?;
                        return Ok(());
                    }
                    continue;
                }
                held = links.arrival(HELD_ARRIVAL, &mut notes) => held,
            };
            tracing::debug!(worker = %id, ?held, left, "between statements: at the links");
            let Some((before, _)) = held else {
                // Neither a checkpoint nor a request: blocked (a cut link). It goes on freely.
                links.open();
                return Ok(());
            };
            if left == 0 {
                slots.slots[index].held = true;
                slots.recorder.observe(Observation::Held {
                    worker: id.clone(),
                    before,
                });
                return Ok(());
            }
            left -= 1;
            if links.release(RELEASE_ANSWER).await.is_none() {
                // Released but unanswered (a cut or slowed link): the worker waits on it.
                links.open();
                return Ok(());
            }
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
        tracing::debug!("controlled drain");
        // Held requests go first: healing checks each link answers, and a request held on a
        // connection keeps everything behind it waiting.
        for slot in &self.plane.workers.slots {
            if let Some(links) = &slot.links {
                links.open();
            }
        }
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
        let keys: Vec<String> = self
            .requests
            .iter()
            .map(|r| r.idempotency_key.clone())
            .collect();
        // Time passes for the leases, up to the liveness bound: a lease set to outlive it (a
        // TTL in the wrong unit) keeps its job waiting, which the drain does not repair.
        let (held, outliving) = self
            .plane
            .services
            .expire_leases_within(&keys, LIVENESS_BOUND)
            .await?;
        for (key, held) in keys.into_iter().zip(held) {
            if held {
                self.recorder
                    .fault(crate::fault::Effect::LeaseExpired { key, held: true });
            }
        }
        for (key, ttl_ms) in outliving {
            self.recorder.observe(Observation::LeaseOutlivesBound {
                key,
                ttl_ms,
                bound_ms: LIVENESS_BOUND.as_millis() as u64,
            });
        }
        if self.plane.services.redis_restarted() {
            self.recover_queue().await?;
        }
        // Nothing left to deliver (the common end of a case): settled without asking every
        // worker's queue through its link, which would only hear "nothing" from each.
        let mut harness_queue = Queue::over(self.plane.services.admin().redis.clone(), &self.keys);
        let (active, backlog) = tokio::try_join!(
            self.plane.services.active_version(),
            harness_queue.backlog()
        )?;
        let rounds = if backlog == Some(0) {
            0
        } else {
            4 * self.requests.len() + 4
        };
        // Bounded: each round either processes a delivery or ends the drain.
        let mut settled = rounds == 0;
        for _ in 0..rounds {
            let mut progressed = false;
            let workers: Vec<Arc<dyn WorkerUnderTest>> = self
                .plane
                .workers
                .slots
                .iter()
                .map(|s| s.worker.clone())
                .collect();
            for (index, worker) in workers.into_iter().enumerate() {
                if active
                    .as_deref()
                    .is_some_and(|v| v != worker.model_version())
                    || worker.is_draining()
                {
                    continue;
                }
                // (After healing, the workers' connections answer again: heal_all waited.)
                if let Some(delivery) = self.receive_for(index).await? {
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
        // What the queue still holds: a delivery left unacknowledged is never done.
        for (key, deliveries) in harness_queue.pending().await? {
            self.recorder.observe(Observation::Pending {
                key,
                deliveries,
                held: None,
            });
        }
        self.recorder.observe(Observation::Drained { settled });
        Ok(())
    }

    /// Redis lost the stream: the sweeper re-enqueues every job the table says is unfinished.
    async fn recover_queue(&mut self) -> Result<()> {
        let admin = self.plane.services.admin().clone();
        let mut queue = Queue::open(admin.redis.clone(), &self.keys).await?;
        for job in read_jobs(&admin.pg, self.keys.prefix()).await? {
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

    /// The next delivery for worker `index`: a new job, else a redelivery of an unacknowledged
    /// one (its visibility timeout made to expire now, and recorded as such).
    async fn receive_for(&self, index: usize) -> Result<Option<Delivery>> {
        let slot = &self.plane.workers.slots[index];
        let worker = slot.worker.id();
        let mut queue = slot.queue.clone();
        // No delivery's visibility timeout runs out by itself here (the schedule expires them,
        // below), so a receive is a read of new entries alone.
        if let Some(delivery) = queue.read_new(worker).await? {
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

    async fn finish(mut self) -> Result<CaseResult> {
        let connections = self.plane.connections();
        // The drain healed every link: they serve the next case.
        let gates = self
            .plane
            .workers
            .slots
            .iter()
            .map(|slot| slot.links.clone())
            .collect();
        self.controller
            .give_back(self.plane.services.release_links(), gates);
        let admin = self.plane.services.admin();
        let mut history = crate::history::collect(
            self.controller.bed.take_journals(self.keys.prefix()),
            &admin.pg,
            self.keys.prefix(),
            self.recorder.events(),
            self.requests.clone(),
            connections,
        )
        .await?;
        history.epoch_unix_ms = Some(self.recorder.started_unix_ms());
        history.wire_origin_ms = Some(self.recorder.offset_of(self.controller.bed.wire_origin()));
        history.wire_recorded = self.wire_recorded;
        // The history is read: the case's Redis keys go, so the keyspace holds the cases in
        // flight and not every case run so far. Whatever walks it (a late cache invalidation,
        // a namespace restart) then costs the same in the thousandth case as in the first;
        // kept, they made full-rollout slower the longer an exploration ran, and slower with
        // more cases at once.
        self.plane.services.flush_namespace().await?;
        Ok(CaseResult::judge(
            history,
            &self.controller.settings.invariants,
        ))
    }
}
