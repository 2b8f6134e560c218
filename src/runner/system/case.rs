//! One case of a system run: the fleet shaped for its fault, the request submitted the way the
//! framework's clients do, the fault applied (through [`crate::fault::apply`]: this case is the
//! fault's [`Plane`]) once a worker took the request, then a drain.
//!
//! Why one file of ~1,000 lines: a case is one sequence (shape the fleet, submit, wait for a
//! taker, apply, drain) over one `CaseCtx`, and the `Plane` it implements is that context; the
//! sequence's steps and the plane's methods share its fields and are used by nothing else. The
//! system runner's move onto the driver (issue 45) replaces this file, not a split of it.

use super::fleet::{configure, open_links};
use super::judge::judge;
use super::settle::{drain, idle_fleet, prepare_fleet, stop_outside_transactions};
use super::{Arrow, Fleet, SystemCase, now_ms};
use crate::env::TestBed;
use crate::env::backends::{Behaviour, ModelBackend, ProgramGuard, release_all};
use crate::env::procs;
use crate::fault::{Effect, Fault, FaultKind, Plane};
use crate::history::Observation;
use crate::system::preset::{CELERY_PREFETCH_ENV, celery_keys};
use crate::system::{Framework, Submit, System};
use crate::wire::Holder;
use crate::{Error, Result};
use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use sqlx::PgConnection;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a partition outlasts the model call it began in: time for the worker to take the
/// answer to its database and meet the cut, and for a retry (Celery's backoff starts at 1 s) to
/// meet it again.
const PARTITION_AFTER_CALL: Duration = Duration::from_secs(2);

/// Holds every request on one link until released: a partition's traffic going nowhere. Other
/// links of the worker pass.
struct Blackhole {
    link: String,
    released: tokio::sync::watch::Receiver<bool>,
}

impl Holder for Blackhole {
    fn before(
        &self,
        link: &str,
        _conn: u64,
        _first: u64,
        _requests: &[crate::wire::Request],
    ) -> Option<BoxFuture<'static, crate::wire::Release>> {
        if link != self.link {
            return None;
        }
        let mut released = self.released.clone();
        Some(Box::pin(async move {
            let _ = released.wait_for(|r| *r).await;
            crate::wire::Release::Forward
        }))
    }
}

/// How long a submit command may run.
pub(super) const SUBMIT_BOUND: Duration = Duration::from_secs(60);

/// What a case works with.
pub(super) struct CaseCtx<'a, 'f> {
    pub(super) bed: &'a TestBed,
    pub(super) redis_db: u64,
    pub(super) database: String,
    pub(super) venv: String,
    pub(super) backends: &'a [ModelBackend],
    pub(super) system: &'a System,
    pub(super) fleet: &'a mut Fleet<'f>,
    pub(super) pg: &'a mut PgConnection,
    pub(super) rd: &'a mut redis::aio::MultiplexedConnection,
    pub(super) rng: StdRng,
    pub(super) prefix: String,
    pub(super) arrows: Vec<Arrow>,
    pub(super) t0: i64,
    pub(super) first: bool,
    /// Inputs of requests a case submits besides its own (the prefetch fault's slow task in
    /// front of it): their model calls are not the request's.
    pub(super) companions: Vec<String>,
    /// Requests the case's fault submitted as jobs of their own (id, input), judged with the
    /// case's request: a drain's next job.
    pub(super) judged_too: Vec<(String, String)>,
    /// What the case's fault aims at, once a worker took the request.
    pub(super) aim: Aim,
    /// What the case's faults did, each with when it began (Unix ms).
    pub(super) effects: Vec<(i64, Effect)>,
    /// What the case saw or did besides (submissions, a rollout's switch and stop signals),
    /// each with when (Unix ms).
    pub(super) observations: Vec<(i64, Observation)>,
    /// The origin of the wire's clock, Unix ms.
    pub(super) wire_origin_unix_ms: i64,
    /// Why the case's liveness cannot be judged, when it cannot: racecert's own backends still
    /// held a model call when the drain's bound ran out, so a request still running may be
    /// racecert's doing, not the system's.
    pub(super) liveness_blind: Option<String>,
    /// What the broker held before the case submitted anything (each message as it carries
    /// it): an earlier case's leftovers, which the drain does not wait for.
    pub(super) held_before: Vec<String>,
}

/// What a framework fault needs to know of its case: the delivery (Celery's tag), the slow model
/// programs holding the first attempt's call, and the framework's clocks.
#[derive(Default)]
pub(super) struct Aim {
    /// The worker that took the request (its first model call arrived).
    pub(super) taker: usize,
    /// The worker a redelivery should reach.
    pub(super) other: usize,
    /// Celery's delivery tag of the request's message, when racecert wrote it.
    pub(super) delivery_tag: Option<String>,
    /// Per version, the program that makes the model slow for this case.
    pub(super) slow_guards: Vec<ProgramGuard>,
    /// The broker's visibility timeout.
    pub(super) visibility: Duration,
    /// How long a worker that stopped heartbeating keeps its job (apalis, Dramatiq).
    pub(super) orphan: Duration,
    /// How long the first attempt's model call lasts.
    pub(super) slow: Duration,
    /// The case's request: its id and input (what a resubmission sends again).
    pub(super) request: Option<(String, String)>,
    /// When the request's first model call arrived.
    pub(super) call_started: Option<Instant>,
}

impl CaseCtx<'_, '_> {
    /// The model calls in flight on racecert's links now (sent by a worker or the submitter, not
    /// yet answered nor hung up): one entry per call, naming whose it is.
    pub(super) fn held_calls(&self) -> Vec<String> {
        self.fleet
            .workers
            .iter()
            .chain(&self.fleet.submitter)
            .flat_map(|w| {
                let calls = w.links.in_flight(&w.links.backend_links()).len();
                std::iter::repeat_n(w.id.clone(), calls)
            })
            .collect()
    }

    /// Restarts worker `index` after a kill of its own process, under the same name.
    async fn restart_killed(&mut self, index: usize) -> Result<()> {
        if self.system.framework == Framework::Celery {
            // Its delivery stays in `unacked`; kombu restores it at the first sweep after the
            // visibility timeout, which the restarted worker's start runs.
            tokio::time::sleep(self.aim.visibility + Duration::from_millis(300)).await;
        }
        self.fleet.start(index).await?;
        let id = self.worker_id(index);
        self.note(&id, &id, "restarted under the same name", "message");
        Ok(())
    }

    pub(super) fn note(&mut self, from: &str, to: &str, label: impl Into<String>, kind: &str) {
        self.arrows.push(Arrow {
            at_ms: now_ms() - self.t0,
            from: from.to_owned(),
            to: to.to_owned(),
            label: label.into(),
            kind: kind.to_owned(),
        });
    }

    /// Slows every version's model for this case's calls.
    pub(super) async fn slow_models(&self, delay: Duration) -> Result<Vec<ProgramGuard>> {
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
    pub(super) async fn calls(&self) -> Result<Vec<(String, usize)>> {
        let mut out = Vec::new();
        for backend in self.backends {
            let n = backend.journal(Some(&self.prefix)).await.len();
            out.push((backend.version().to_owned(), n));
        }
        Ok(out)
    }

    /// The model calls of this case, every version, as the backends' journals recorded them.
    pub(super) async fn journal(&self) -> Vec<crate::wire::JournalEntry> {
        let mut out = Vec::new();
        for backend in self.backends {
            out.extend(backend.journal(Some(&self.prefix)).await);
        }
        out
    }

    /// Model calls of the case's own request (its companions' left out), every version.
    pub(super) async fn request_calls(&self) -> usize {
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
    pub(super) async fn reset_broker(&mut self, index: usize) -> Result<()> {
        let id = self.fleet.workers[index].id.clone();
        let proxy = &self.fleet.workers[index].links.redis;
        if let Err(err) = proxy.reset_connections(Duration::from_millis(100)).await {
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
            let version = self.fleet.workers[index].version.clone();
            let addr = self
                .backends
                .iter()
                .find(|b| b.version() == version)
                .map(ModelBackend::addr)
                .ok_or_else(|| Error::other(format!("no model backend of {version}")))?;
            let links = open_links(self.bed, &self.fleet.wire, &id, &(version, addr)).await?;
            let worker = &mut self.fleet.workers[index];
            worker.model_url = links.backend_url(&worker.version).unwrap_or_default();
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

    /// Ages the delivery in kombu's unacked index so the next sweep restores it.
    pub(super) async fn age_delivery(&mut self, tag: &str) -> Result<bool> {
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

/// Runs case `number`: the fleet readied, the request submitted, `fault` applied once a worker
/// took it, a drain, the verdict.
pub(super) async fn run_case(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: FaultKind,
    venv: &str,
    redis_db: u64,
    database: &str,
) -> Result<SystemCase> {
    let system = ctx.system;
    let request_id = format!("{}-req", ctx.prefix);
    let input = format!("{} hello world {number}", ctx.prefix);
    let (vt, orphan, slow) = clocks(system, fault);
    let slow_guards = prepare_case(ctx, number, fault, vt, orphan, slow).await?;
    let delivery_tag = submit_request(ctx, number, fault, &request_id, &input).await?;
    let _ = (redis_db, venv, database);

    // Taken: a model call of this case arrived at some version's backend.
    let waited = Instant::now();
    let Some(taker) = wait_for_taker(ctx, waited).await? else {
        if ctx.first {
            return Err(no_consumer(ctx, &request_id, waited).await?);
        }
        release_all(slow_guards).await;
        let held = ctx.held_calls();
        if !held.is_empty() {
            // Busy with work racecert still holds: an untaken request is racecert's doing.
            ctx.liveness_blind = Some(format!(
                "no worker took the request: {} still in model call(s) racecert's backends held",
                held.join(", ")
            ));
        }
        return judge(ctx, number, fault, request_id, &input).await;
    };
    let call_started = Instant::now();
    let other = (taker + 1) % ctx.fleet.workers.len();

    ctx.aim.taker = taker;
    ctx.aim.other = other;
    ctx.aim.delivery_tag = delivery_tag;
    ctx.aim.slow_guards = slow_guards;
    ctx.aim.request = Some((request_id.clone(), input.clone()));
    ctx.aim.call_started = Some(call_started);
    let applied = apply_fault(ctx, fault, taker).await?;
    let slow_guards = std::mem::take(&mut ctx.aim.slow_guards);
    // The first attempt's model call may still be running: wait it out, then drain.
    let done_by = call_started + slow + Duration::from_millis(500);
    release_all(slow_guards).await;
    // The system's own recovery (a requeue after a heartbeat timeout) may end the request
    // later than the preset's bounds: liveness waits for whichever is longer.
    let recovery = vt.max(orphan).max(system.recovery_bound().0);
    drain(ctx, done_by, applied + recovery, recovery).await?;
    judge(ctx, number, fault, request_id, &input).await
}

/// The case's clocks: the broker's visibility timeout, how long a worker that stopped
/// heartbeating keeps its job, and how long the first attempt's model call lasts.
fn clocks(system: &System, fault: FaultKind) -> (Duration, Duration, Duration) {
    let vt = system
        .celery
        .as_ref()
        .map(|c| Duration::from_secs_f64(c.visibility_timeout_s))
        .unwrap_or(Duration::from_secs(5));
    // How long a worker that stopped heartbeating keeps its job: apalis' missed heartbeats,
    // Dramatiq's heartbeat timeout and the maintenance pass that requeues its messages.
    let orphan = match (&system.apalis, &system.dramatiq) {
        (Some(a), _) => Duration::from_secs_f64(a.heartbeat_s * f64::from(a.missed_heartbeats)),
        (None, Some(d)) => d.recovery(),
        (None, None) => Duration::from_secs(6),
    };
    // How long the first attempt's model call lasts: past what the fault needs, below the
    // worker's own model timeout (a slow model it waits for) unless the fault is that timeout.
    let slow = crate::system::preset::call_hold(
        fault,
        vt,
        orphan,
        system.model_timeout,
        system.time_limit(),
    );
    (vt, orphan, slow)
}

/// Readies the fleet for the case's fault, slows the models (their programs returned), notes
/// what the broker already held and the clocks the fault aims by.
async fn prepare_case(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: FaultKind,
    vt: Duration,
    orphan: Duration,
    slow: Duration,
) -> Result<Vec<ProgramGuard>> {
    idle_fleet(ctx).await?;
    prepare_fleet(ctx, fault).await?;
    let slow_guards = ctx.slow_models(slow).await?;
    ctx.held_before = super::settle::broker_holds(ctx)
        .await?
        .into_iter()
        .map(|h| h.carries)
        .collect();
    ctx.aim.visibility = vt;
    ctx.aim.orphan = orphan;
    ctx.aim.slow = slow;
    ctx.note(
        "racecert",
        "racecert",
        format!(
            "case {number}: fault {fault}, every model answers in {} ms",
            slow.as_millis()
        ),
        "message",
    );
    Ok(slow_guards)
}

/// Submits the case's request (behind a slow task for the prefetch fault); its Celery delivery
/// tag when racecert wrote it.
async fn submit_request(
    ctx: &mut CaseCtx<'_, '_>,
    number: u32,
    fault: FaultKind,
    request_id: &str,
    input: &str,
) -> Result<Option<String>> {
    if fault == FaultKind::PrefetchRestore {
        // A slow task first, then the request: the worker reserves the request behind it.
        let blocker = format!("{} blocker {number}", ctx.prefix);
        ctx.companions.push(blocker.clone());
        ctx.submit(&format!("{}-blk", ctx.prefix), &blocker).await?;
        ctx.submit(request_id, input).await
    } else {
        ctx.submit(request_id, input).await
    }
}

/// The worker whose version's backend got the case's first model call, waiting from `waited`
/// up to the start-up deadline (at most 30 s); `None` when none came.
async fn wait_for_taker(ctx: &CaseCtx<'_, '_>, waited: Instant) -> Result<Option<usize>> {
    loop {
        let calls = ctx.calls().await?;
        if let Some(index) = calls.iter().position(|(_, n)| *n > 0) {
            return Ok(Some(index));
        }
        if waited.elapsed() > ctx.fleet.deadline.min(Duration::from_secs(30)) {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The error of a first case no worker consumed: what the broker holds and the workers' last
/// lines, most likely a start command that does not consume the queue.
async fn no_consumer(
    ctx: &mut CaseCtx<'_, '_>,
    request_id: &str,
    waited: Instant,
) -> Result<Error> {
    let system = ctx.system;
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
    Ok(Error::Config(format!(
        "{}: no worker consumed request {request_id} (no model call within {:?}){queued}; the workers' last lines:{last}",
        system.place("start.command"),
        waited.elapsed()
    )))
}

/// Applies the case's fault to the worker that took the request and records what it did;
/// returns when it was applied.
async fn apply_fault(ctx: &mut CaseCtx<'_, '_>, fault: FaultKind, taker: usize) -> Result<Instant> {
    let taker_id = ctx.fleet.workers[taker].id.clone();
    let began = now_ms();
    let applied = Instant::now();
    let effect = crate::fault::apply(
        &Fault::Framework {
            kind: fault,
            worker: taker,
        },
        ctx,
    )
    .await?;
    if !matches!(effect, Effect::FrameworkFault { .. }) {
        // The fault did nothing (no delivery to age, no child to kill): the diagram says so
        // and the case is not counted as an application of it.
        ctx.note(&taker_id, &taker_id, effect.to_string(), "fault");
    }
    ctx.effects.push((began, effect));
    Ok(applied)
}

impl CaseCtx<'_, '_> {
    /// The slow-model program of worker `other`'s version, taken out of the case's programs so
    /// that its attempt answers fast and overtakes the slow first one.
    pub(super) fn restore_to_other(&mut self) -> Option<ProgramGuard> {
        let version = self.fleet.workers[self.aim.other].version.clone();
        let position = self.system.versions.iter().position(|(v, _)| *v == version);
        position
            .filter(|position| *position < self.aim.slow_guards.len())
            .map(|position| self.aim.slow_guards.remove(position))
    }

    /// Lets every later model call of the case answer at once (the slow programs released) and
    /// notes on the diagram what the held first call was: `detail`, returned for the effect.
    async fn later_calls_at_once(&mut self, worker: usize, detail: String) -> String {
        release_all(std::mem::take(&mut self.aim.slow_guards)).await;
        let id = self.worker_id(worker);
        let version = self.fleet.workers[worker].version.clone();
        self.note(
            &format!("model {version}"),
            &id,
            format!("{detail}: later calls answer at once"),
            "fault",
        );
        detail
    }

    /// Has worker `other` sweep: its start or a reconnect runs kombu's restore.
    pub(super) async fn sweep_by_other(&mut self) -> Result<()> {
        if self.aim.other != self.aim.taker {
            if let Some(program) = self.restore_to_other() {
                program.release().await;
            }
            self.reset_broker(self.aim.other).await?;
        }
        Ok(())
    }
}

impl Plane for CaseCtx<'_, '_> {
    fn worker_id(&self, worker: usize) -> String {
        self.fleet.workers[worker % self.fleet.workers.len()]
            .id
            .clone()
    }

    fn backend_timeout(&self) -> Duration {
        self.system.model_timeout
    }

    fn can_apply(&self, kind: FaultKind) -> std::result::Result<(), String> {
        if crate::system::preset::system_faults(self.system).contains(&kind) {
            Ok(())
        } else {
            Err(format!(
                "{kind} is not a fault of system {:?} (its faults: {})",
                self.system.name,
                crate::system::preset::fault_names(self.system.framework)
            ))
        }
    }

    async fn outlive_visibility(&mut self, worker: usize) -> Result<Option<String>> {
        // Real time: the delivery is older than the visibility timeout while its model call
        // still runs.
        let vt = self.aim.visibility;
        tokio::time::sleep(vt + Duration::from_millis(300)).await;
        let id = self.worker_id(worker);
        self.note(
            &id,
            &id,
            format!(
                "delivery older than visibility_timeout ({} ms), still in its model call",
                vt.as_millis()
            ),
            "fault",
        );
        self.sweep_by_other().await?;
        Ok(Some(format!(
            "delivery held past visibility_timeout ({} ms), then a restore sweep",
            vt.as_millis()
        )))
    }

    async fn force_restore(&mut self, _worker: usize) -> Result<Option<String>> {
        // Without the delivery's tag (a request submitted by the team's own command) there is
        // nothing to age: the fault did nothing, and says so.
        let Some(tag) = self.aim.delivery_tag.clone() else {
            return Ok(None);
        };
        if !self.age_delivery(&tag).await? {
            return Ok(None);
        }
        self.sweep_by_other().await?;
        Ok(Some(format!(
            "delivery {tag} aged in unacked_index, then a restore sweep"
        )))
    }

    async fn restore_prefetched(&mut self, worker: usize) -> Result<Option<String>> {
        // The taker runs the slow task in front and holds the request in its prefetch: both
        // deliveries are in `unacked`, their clocks running, the request never started.
        let vt = self.aim.visibility;
        let reserved_by = Instant::now() + Duration::from_secs(5);
        let mut reserved = false;
        while Instant::now() < reserved_by {
            let unacked: Vec<String> = redis::cmd("HKEYS")
                .arg(celery_keys::UNACKED)
                .query_async(self.rd)
                .await?;
            reserved = match &self.aim.delivery_tag {
                Some(tag) => unacked.contains(tag),
                None => unacked.len() >= 2,
            };
            if reserved {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let id = self.worker_id(worker);
        if !reserved {
            self.note(
                &id,
                &id,
                format!(
                    "the request was not prefetched within 5 s (does the command set \
                     --prefetch-multiplier itself? {CELERY_PREFETCH_ENV} is overridden by it)"
                ),
                "fault",
            );
            return Ok(None);
        }
        self.note(
            &id,
            &id,
            "the request is reserved (prefetched) behind the slow task, unacked",
            "fault",
        );
        tokio::time::sleep(vt + Duration::from_millis(300)).await;
        self.note(
            &id,
            &id,
            format!(
                "reserved delivery older than visibility_timeout ({} ms), never started",
                vt.as_millis()
            ),
            "fault",
        );
        let (taker, other) = (self.aim.taker, self.aim.other);
        if other != taker {
            // The stopped worker's start runs kombu's restore sweep.
            if let Some(program) = self.restore_to_other() {
                program.release().await;
            }
            self.fleet.start(other).await?;
            let other_id = self.worker_id(other);
            self.note(
                &other_id,
                "redis",
                "started: its consumer's restore sweep",
                "fault",
            );
        } else {
            self.reset_broker(taker).await?;
        }
        Ok(Some(
            "reserved delivery held past visibility_timeout, then a restore sweep".to_owned(),
        ))
    }

    async fn kill_pool_child(&mut self, worker: usize) -> Result<Option<String>> {
        let main = self.fleet.workers[worker].main_pid();
        let children = main.map(procs::children).unwrap_or_default();
        for child in &children {
            let _ = kill(Pid::from_raw(*child), Signal::SIGKILL);
        }
        release_all(std::mem::take(&mut self.aim.slow_guards)).await;
        if children.is_empty() {
            return Ok(None);
        }
        let id = self.worker_id(worker);
        let detail = format!("SIGKILL pool child {children:?} mid-call");
        self.note(&id, &id, detail.clone(), "fault");
        Ok(Some(detail))
    }

    async fn kill_main(&mut self, worker: usize) -> Result<Option<String>> {
        let id = self.worker_id(worker);
        self.fleet.kill(worker).await;
        self.note(
            &id,
            &id,
            "SIGKILL of the worker process (group) mid-call",
            "fault",
        );
        // A process outside the group (a child forked into a group or session of its own) may
        // still hold the call: the run says so, since the crash of that process is another kind.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let links = &self.fleet.workers[worker].links;
        let survivor = if links.in_flight(&links.backend_links()).is_empty() {
            ""
        } else {
            "; the process in its model call survived it (outside the worker's process group: \
             kill-holder is the crash of that process)"
        };
        if !survivor.is_empty() {
            self.note(&id, &id, survivor.trim_start_matches("; "), "fault");
        }
        release_all(std::mem::take(&mut self.aim.slow_guards)).await;
        self.restart_killed(worker).await?;
        Ok(Some(format!(
            "SIGKILL of the worker process mid-call, restarted under the same name{survivor}"
        )))
    }

    async fn kill_holder(&mut self, worker: usize) -> Result<Option<String>> {
        let id = self.worker_id(worker);
        let (holders, main) = {
            let w = &self.fleet.workers[worker];
            let Some(root) = w.pid() else {
                return Ok(None);
            };
            // The connections of its model links with the call in flight, and the processes
            // under its command that hold their client ends: the process that holds the job.
            let clients = w.links.in_flight(&w.links.backend_links());
            let holders: Vec<(i32, String)> = procs::owners_of(&clients, &procs::tree(root))
                .into_iter()
                .map(|pid| (pid, procs::describe(pid)))
                .collect();
            (holders, w.main_pid())
        };
        if holders.is_empty() {
            release_all(std::mem::take(&mut self.aim.slow_guards)).await;
            self.note(
                &id,
                &id,
                "no process of the worker holds a model call in flight",
                "fault",
            );
            return Ok(None);
        }
        for (pid, _) in &holders {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let named = holders
            .iter()
            .map(|(_, shown)| shown.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let detail = format!("SIGKILL of the process holding the model call: {named}");
        self.note(&id, &id, detail.clone(), "fault");
        release_all(std::mem::take(&mut self.aim.slow_guards)).await;
        // The worker's own process held it (a single-process worker): nothing of the worker is
        // left to recover the job, so it restarts as after `kill-main`. A child that held it
        // leaves its parent to do what the framework does with a lost child: carry on (RQ), or
        // stop the rest and exit (Dramatiq's main process notices within its 1 s join).
        let killed = Instant::now();
        while !self.fleet.exited(worker) && killed.elapsed() < Duration::from_millis(2500) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let main_held = main.is_some_and(|m| holders.iter().any(|(pid, _)| *pid == m));
        if main_held || self.fleet.exited(worker) {
            self.fleet.kill(worker).await;
            self.restart_killed(worker).await?;
            return Ok(Some(format!("{detail}; the worker restarted")));
        }
        Ok(Some(detail))
    }

    async fn warm_shutdown(&mut self, worker: usize) -> Result<Option<String>> {
        let id = self.worker_id(worker);
        let Some(pid) = self.fleet.workers[worker].main_pid() else {
            return Ok(None);
        };
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        self.note(&id, &id, "SIGTERM (warm shutdown) mid-task", "fault");
        let exited = Instant::now();
        while !self.fleet.exited(worker)
            && exited.elapsed() < self.aim.slow + Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.fleet.stop(worker, Duration::from_secs(1)).await;
        self.fleet.start(worker).await?;
        self.note(&id, &id, "restarted", "message");
        Ok(Some(
            "SIGTERM (warm shutdown) mid-task, then a restart".to_owned(),
        ))
    }

    async fn resubmit(&mut self, worker: usize) -> Result<Option<String>> {
        let Some((request_id, input)) = self.aim.request.clone() else {
            return Ok(None);
        };
        // The first attempt is in its model call (it arrived); the second one, on the other
        // worker's version, answers fast and overtakes it.
        if let Some(program) = self.restore_to_other() {
            program.release().await;
        }
        let id = self.worker_id(worker);
        self.note(
            "racecert",
            "racecert",
            format!("{request_id} submitted again (its API's client timed out) while {id} runs it"),
            "fault",
        );
        let command = match &self.system.submit {
            Submit::Command(command) => {
                Some(self.system.resubmit.clone().unwrap_or(command.clone()))
            }
            Submit::Preset { .. } => None,
        };
        let Some(command) = command else {
            self.submit(&request_id, &input).await?;
            return Ok(Some(format!(
                "request {request_id} submitted again, same key, while {id} ran its first attempt"
            )));
        };
        // The team's API may refuse a request it has seen: its command's failure is then the
        // system's answer (a protection), not the file's error.
        self.observations.push((
            now_ms(),
            Observation::Submitted {
                key: request_id.clone(),
            },
        ));
        let (shown, output) = self
            .run_team_command(
                &command,
                &[("request_id", &request_id), ("input", &input)],
                "submit",
                "resubmit command",
                SUBMIT_BOUND,
            )
            .await?;
        if output.status.success() {
            self.note(
                "racecert",
                "racecert",
                format!("submitted again with `{shown}`"),
                "message",
            );
            return Ok(Some(format!(
                "request {request_id} submitted again, same key, while {id} ran its first attempt"
            )));
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let why = format!("{}: {}", output.status, last.trim());
        self.note(
            "racecert",
            "racecert",
            format!("the API refused the request submitted again ({why})"),
            "fault",
        );
        self.observations.push((
            now_ms(),
            Observation::Refused {
                key: request_id.clone(),
                why: why.clone(),
            },
        ));
        Ok(Some(format!(
            "request {request_id} submitted again, same key, while {id} ran its first attempt: the API refused it ({why})"
        )))
    }

    async fn outlast_model_timeout(&mut self, worker: usize) -> Result<Option<String>> {
        // The call arrived with its answer held past the worker's timeout (the case's model
        // program): wait until the worker gave up on it, then let any later call (its retry,
        // another worker's) answer at once, while the first one is still being computed.
        let timeout = self.system.model_timeout;
        tokio::time::sleep(timeout + Duration::from_millis(300)).await;
        let detail = format!(
            "model answer held {} ms, past the worker's own timeout ({} ms)",
            self.aim.slow.as_millis(),
            timeout.as_millis()
        );
        Ok(Some(self.later_calls_at_once(worker, detail).await))
    }

    async fn exceed_time_limit(&mut self, worker: usize) -> Result<Option<String>> {
        // The call's answer is held past the job's time limit (the case's model program); once
        // it has been sent, let any later call (the retry) answer at once.
        let Some(started) = self.aim.call_started else {
            return Ok(None);
        };
        let limit = self.system.time_limit().unwrap_or_default().as_millis();
        tokio::time::sleep_until((started + self.aim.slow + Duration::from_millis(300)).into())
            .await;
        let detail = format!(
            "model answer held {} ms, past the job's time limit ({limit} ms), below the worker's own timeout ({} ms)",
            self.aim.slow.as_millis(),
            self.system.model_timeout.as_millis()
        );
        Ok(Some(self.later_calls_at_once(worker, detail).await))
    }

    async fn partition_worker(&mut self, worker: usize) -> Result<Option<String>> {
        // A partition as the network makes one: what the worker sends its database goes nowhere
        // (held at its proxy, seen on the wire, never forwarded) until the connection breaks.
        // Held past the model call's answer, so the write that answer leads to meets it; then
        // every connection of the link is cut, its held requests with it, and the link heals.
        let id = self.worker_id(worker);
        let link = self.fleet.workers[worker].links.postgres.name().to_owned();
        let (release, released) = tokio::sync::watch::channel(false);
        if !self.fleet.workers[worker]
            .links
            .hold(Some(Arc::new(Blackhole { link, released })))
        {
            return Ok(None);
        }
        let cut = Instant::now();
        self.note(
            &id,
            "db",
            "partition: its database link goes silent",
            "fault",
        );
        let until = self.aim.call_started.unwrap_or(cut) + self.aim.slow + PARTITION_AFTER_CALL;
        tokio::time::sleep_until(until.into()).await;
        // Cut first, release after: the held requests must go down with their connections, not
        // on to the database. The server ends the worker's sessions (its own server processes,
        // known from the wire), so a held statement has no session left to run in whatever the
        // proxy does with it; the proxy's listener is bounced so that no connection of the
        // worker outlives the partition.
        let pids = self.fleet.workers[worker].links.backend_pids();
        let ended: Vec<bool> =
            sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid")
                .bind(&pids)
                .fetch_all(&mut *self.pg)
                .await
                .map_err(|err| Error::other(format!("ending {id}'s database sessions: {err}")))?;
        let links = &self.fleet.workers[worker].links;
        links
            .postgres
            .reset_connections(Duration::from_millis(200))
            .await?;
        links.hold(None);
        let _ = release.send(true);
        let ended = ended.into_iter().filter(|e| *e).count();
        let held = cut.elapsed();
        self.note(
            &id,
            "db",
            "partition ends: its database connections cut, the link healed",
            "fault",
        );
        Ok(Some(format!(
            "database link silent for {} ms across the end of its model call, then its connections cut ({ended} session(s) ended)",
            held.as_millis()
        )))
    }

    async fn drain(&mut self, worker: usize) -> Result<Option<String>> {
        super::rollout::drain(self, worker).await
    }

    async fn switch_backend(&mut self, worker: usize) -> Result<Option<String>> {
        super::rollout::switch_backend(self, worker).await
    }

    async fn roll_out(&mut self, worker: usize, late: bool) -> Result<Option<String>> {
        super::rollout::roll_out(self, worker, late).await
    }

    async fn miss_heartbeats(&mut self, worker: usize) -> Result<Option<String>> {
        let id = self.worker_id(worker);
        let orphan = self.aim.orphan;
        let inside = stop_outside_transactions(self, worker).await;
        self.note(
            &id,
            &id,
            format!(
                "SIGSTOP mid-call, {inside} (heartbeat deadline {} ms)",
                orphan.as_millis()
            ),
            "fault",
        );
        if let Some(program) = self.restore_to_other() {
            program.release().await;
        }
        // Until the other worker ran the requeued job (its model call), bounded.
        let paused = Instant::now();
        let other_version = self.fleet.workers[self.aim.other].version.clone();
        // Generous: the requeue runs in the other worker's heartbeat, which a loaded machine
        // delays well past the deadline.
        let mut requeued = false;
        while paused.elapsed() < orphan + Duration::from_secs(30) {
            let calls = self.calls().await?;
            let total: usize = calls.iter().map(|(_, n)| n).sum();
            if total > 1 || calls.iter().any(|(v, n)| *v == other_version && *n > 0) {
                requeued = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.fleet.workers[worker].signal_group(Signal::SIGCONT);
        self.note(
            &id,
            &id,
            if requeued {
                "SIGCONT (its job ran elsewhere meanwhile)".to_owned()
            } else {
                format!("SIGCONT: no requeue within {:?}", paused.elapsed())
            },
            "fault",
        );
        Ok(Some(format!(
            "SIGSTOP mid-call {inside} past the heartbeat deadline, SIGCONT{}",
            if requeued {
                " after the requeued job ran"
            } else {
                " (no requeue seen)"
            }
        )))
    }
}
