//! The wire runner: deterministic interleavings of worker *processes* in any language, made at
//! the round trips their connections already carry. Every worker runs behind links of its own; a
//! gate (the links' [`crate::wire::Holder`]) holds each of its effectful requests (a
//! Redis command, a SQL round trip, a backend call) before it reaches the server, and the
//! schedule ([`WireStep`]s) says whose request goes next. Connection set-up and health checks
//! pass without holding.
//!
//! A step lets a worker complete some round trips, runs it until it is about to touch a table or
//! key, or applies a fault: a lease expiry also makes the delivery idle past the visibility
//! timeout (the time-driven events of a long pause, made to happen by the schedule), a crash is
//! a SIGKILL and a restart, a pause SIGSTOP and SIGCONT. Round trips that decide nothing (an
//! empty queue poll, a script-cache miss) are let through while their worker runs and are not
//! counted, so a schedule means the same whatever a worker did before the case.
//!
//! Cases come from the one search ([`crate::schedule::search::rounds`]: the depth-bounded
//! enumeration, then PCT plans) and failures shrink with the one shrinker. Every released round
//! trip leaves a fingerprint; a replay that sees other fingerprints than its file recorded
//! reports a *divergence* (the worker sent something else), which is neither a pass nor a
//! failure.
//!
//! Holds are short: a request held longer than [`WireSettings::max_hold`] goes on by itself
//! (below the clients' own socket timeouts), and the outcome says so, as it says when a held
//! request's connection ended (the worker's own timeout gave up on it).

mod case;
#[cfg(test)]
mod tests;

use crate::Result;
use crate::check::Invariant;
use crate::contract::defect::Defects;
use crate::env::TestBed;
use crate::fault::Fault;
use crate::schedule::file::{RunnerSpec, ScheduleFile};
use crate::schedule::search::rounds::{PctPlan, RoundSource, Rounds};
use crate::schedule::search::{
    Case as Planned, Outcome, Pct, Progress, Runner, SearchConfig, SearchReport, explore,
};
use crate::schedule::{RequestSpec, Schedule, WireStep, WorkerSpec};
use case::{Case, Released};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::time::Duration;

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
    /// The schedule file of a wire outcome run under these settings (what a replay needs: the
    /// command, workers, timeouts, steps and the fingerprints each step released).
    pub fn file(&self, outcome: &WireOutcome) -> ScheduleFile {
        let mut file = ScheduleFile::new(
            RunnerSpec::Wire {
                command: self.command.clone(),
                workers: self.workers.clone(),
                defects: self.defects.iter().collect(),
                lease_ttl_ms: self.lease_ttl.as_millis() as u64,
                visibility_timeout_ms: self.visibility_timeout.as_millis() as u64,
                backend_timeout_ms: self.backend_timeout.as_millis() as u64,
                schedule: outcome.schedule.clone(),
                trace: outcome.trace.clone(),
            },
            self.invariants.clone(),
        );
        file.violated = violated(outcome);
        file
    }

    /// The settings, steps and recorded trace of a wire schedule file, its workers started with
    /// `command` (None: the file's own) (None: the file is another runner's).
    pub fn of_file<'f>(
        file: &'f ScheduleFile,
        command: Option<&str>,
    ) -> Option<(WireSettings, &'f Schedule<WireStep>, Trace<'f>)> {
        match &file.runner {
            RunnerSpec::Wire {
                command: recorded,
                workers,
                defects,
                lease_ttl_ms,
                visibility_timeout_ms,
                backend_timeout_ms,
                schedule,
                trace,
            } => {
                let command = command.unwrap_or(recorded);
                Some((
                    WireSettings {
                        command: command.to_owned(),
                        workers: workers.clone(),
                        defects: Defects::of(defects.iter().copied()),
                        invariants: file.invariants.clone(),
                        lease_ttl: Duration::from_millis(*lease_ttl_ms),
                        visibility_timeout: Duration::from_millis(*visibility_timeout_ms),
                        backend_timeout: Duration::from_millis(*backend_timeout_ms),
                        ..WireSettings::pair(command)
                    },
                    schedule,
                    trace,
                ))
            }
            _ => None,
        }
    }

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
            invariants: Invariant::own(),
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

/// Per step, the fingerprints of the round trips it released.
pub type Trace<'f> = &'f [Vec<String>];

/// A wire schedule's outcome.
pub type WireOutcome = Outcome<WireStep>;

/// Runs one wire case: `schedule` on fresh processes of `settings.command`. With `expected`, the
/// fingerprints a file recorded per step, the outcome says where the run diverged from them.
pub async fn run_wire(
    bed: &TestBed,
    settings: &WireSettings,
    schedule: &Schedule<WireStep>,
    expected: Option<&[Vec<String>]>,
) -> Result<WireOutcome> {
    // Spares cost a start each: worth it only where the schedule kills a worker.
    let kills = schedule
        .steps
        .iter()
        .any(|step| matches!(step, WireStep::Fault(Fault::CrashWorker { .. })));
    let mut case = Case::open(bed, settings, kills).await?;
    let outcome = run_on(&mut case, bed, schedule, expected).await;
    case.stop().await;
    outcome
}

/// Runs `schedule` on the processes of `case`.
async fn run_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    schedule: &Schedule<WireStep>,
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

/// Runs one PCT case of `plan` over `requests` on the processes of `case`: at every decision the
/// highest-priority runnable worker releases its next round trip. Before the round trip that
/// reaches a change point (counting the round trips the plan counts: those on what a job writes,
/// once the search knows a job), the worker about to send it drops below everyone and the plan's
/// fault may land. The outcome's schedule is the steps taken (runs of one worker grouped),
/// replayable as a fixed case.
async fn pct_on(
    case: &mut Case<'_>,
    bed: &TestBed,
    requests: &[RequestSpec],
    plan: &PctPlan,
) -> Result<WireOutcome> {
    let mut priority = plan.priority.clone();
    case.begin(requests).await?;
    let mut taken = Taken::default();
    let (mut released, mut counted) = (0u32, 0u32);
    // The worker whose held round trip was counted already (it reached a change point, was
    // lowered, and is not counted again when it next runs).
    let mut counted_pending: Option<usize> = None;
    // Where a PCT case's time goes (`RUST_LOG=racecert::runner::wire=debug`): choosing, releasing.
    let (mut choosing, mut releasing, mut decisions) = (Duration::ZERO, Duration::ZERO, 0u32);
    let result: Result<()> = async {
        while released < plan.bound() {
            let decided = std::time::Instant::now();
            if crate::interrupt::requested().is_some() {
                break;
            }
            let chosen = highest_runnable(case, &priority).await?;
            choosing += decided.elapsed();
            let Some((worker, print)) = chosen else { break };
            decisions += 1;
            if counted_pending != Some(worker) && plan.counts(&print) {
                counted += 1;
                counted_pending = Some(worker);
                if let Some(i) = plan.change_at(counted) {
                    priority[worker] = plan.lowered(i);
                    taken.flush(case);
                    if let Some(fault) = plan.step_at(i, worker) {
                        case.step(&fault).await?;
                        taken.steps.push(fault);
                        // A crash replaced the worker: its held round trip is a new one.
                        counted_pending = None;
                    }
                    continue;
                }
            }
            if taken.run.as_ref().is_some_and(|(w, _, _)| *w != worker) {
                taken.flush(case);
            }
            let started = std::time::Instant::now();
            let outcome = case.release(worker).await;
            releasing += started.elapsed();
            if counted_pending == Some(worker) {
                counted_pending = None;
            }
            if let Released::Trips(prints) = outcome {
                released += 1;
                let entry = taken.run.get_or_insert((worker, 0, Vec::new()));
                entry.1 += 1;
                entry.2.extend(prints);
            }
        }
        taken.flush(case);
        Ok(())
    }
    .await;
    tracing::debug!(
        decisions,
        released,
        counted,
        choosing_us = choosing.as_micros() as u64,
        releasing_us = releasing.as_micros() as u64,
        "wire pct case"
    );
    let requests = requests.to_vec();
    let steps = taken.steps;
    let outcome = case.finish(bed, Schedule { requests, steps }, None).await?;
    result.map(|()| outcome)
}

/// The highest-priority runnable worker of `case` and the fingerprint of its held round trip.
async fn highest_runnable(
    case: &mut Case<'_>,
    priority: &[usize],
) -> Result<Option<(usize, String)>> {
    let mut candidates: Vec<usize> = (0..case.workers()).collect();
    candidates.sort_by_key(|w| std::cmp::Reverse(priority[*w]));
    for worker in candidates {
        if let Ok(print) = case.runnable(worker).await? {
            return Ok(Some((worker, print)));
        }
    }
    Ok(None)
}

/// The steps a PCT case took so far, and the run of one worker in progress (its worker, counted
/// round trips, fingerprints).
#[derive(Default)]
struct Taken {
    steps: Vec<WireStep>,
    run: Option<(usize, u32, Vec<String>)>,
}

impl Taken {
    /// Ends the run in progress: a `Run` step, recorded with its fingerprints.
    fn flush(&mut self, case: &mut Case<'_>) {
        if let Some((worker, trips, prints)) = self.run.take() {
            let step = WireStep::Run { worker, trips };
            self.steps.push(step.clone());
            case.record_generated(step, prints);
        }
    }
}

/// The wire runner over one set of processes, shared by the cases of a search (one at a time:
/// they share the processes).
pub struct WireRunner<'b> {
    bed: &'b TestBed,
    case: tokio::sync::Mutex<Case<'b>>,
}

impl<'b> WireRunner<'b> {
    /// Starts the processes of `settings` (each comes to its gate before this returns).
    pub async fn open(bed: &'b TestBed, settings: &WireSettings) -> Result<WireRunner<'b>> {
        Ok(WireRunner {
            bed,
            case: tokio::sync::Mutex::new(Case::open(bed, settings, true).await?),
        })
    }

    /// Stops the processes.
    pub async fn stop(self) {
        self.case.into_inner().stop().await;
    }
}

impl Runner for WireRunner<'_> {
    type Step = WireStep;

    fn run(&self, planned: Planned<WireStep>) -> BoxFuture<'_, Result<WireOutcome>> {
        async move {
            let mut case = self.case.lock().await;
            match planned {
                Planned::Fixed(schedule) => run_on(&mut case, self.bed, &schedule, None).await,
                Planned::Pct { requests, plan } => {
                    pct_on(&mut case, self.bed, &requests, &plan).await
                }
            }
        }
        .boxed()
    }
}

/// How a wire search goes.
#[derive(Debug, Clone)]
pub struct WireSearch {
    /// Seed (PCT plans, the order of the enumeration).
    pub seed: u64,
    /// Wall-clock budget of the search (shrinking excluded); the enumerations run to their end
    /// past it, up to [`BUDGET_STRETCH`](crate::schedule::search::BUDGET_STRETCH) times it.
    pub budget: Duration,
    /// Most cases (by default none: the budget ends the search, as it ends a certification's
    /// suites; set it to reproduce a search exactly).
    pub cases: u32,
    /// Requests per case.
    pub requests: usize,
    /// Enumerate depth-2 schedules up to this many round trips of the preempted worker first
    /// (0: PCT only).
    pub depth_two_steps: u32,
    /// Then enumerate depth-3 schedules (two preemptions around a lease expiry) at the conflict
    /// points of a job's round trips.
    pub depth_three: bool,
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
            // Counts past a job's end are skipped once one came short, so this bounds long
            // jobs, not the cases of short ones.
            depth_two_steps: 40,
            depth_three: true,
            // Bugs of three ordered steps of two workers need two change points.
            pct: Pct {
                depth: 3,
                steps: 24,
            },
            shrink_runs: 40,
        }
    }
}

/// Searches wire schedules with the one search: the depth-2 enumeration (in a seeded order) for
/// small cases, then PCT, until a case breaks an invariant or the budget ends; a failure is
/// shrunk.
pub async fn search(
    bed: &TestBed,
    settings: &WireSettings,
    search: &WireSearch,
    progress: impl Fn(u32) + Send + Sync + 'static,
) -> Result<SearchReport<WireStep>> {
    let mut source = RoundSource::new(Rounds {
        seed: search.seed,
        cases: search.cases,
        requests: search.requests,
        depth_two_steps: search.depth_two_steps,
        pct: search.pct,
        workers: settings.workers.len(),
        depth_three: search.depth_three,
    });
    let config = SearchConfig {
        seed: search.seed,
        time_budget: Some(search.budget),
        concurrency: 1,
        max_shrink_iters: search.shrink_runs,
        progress: Some(Progress(std::sync::Arc::new(progress))),
    };
    let runner = WireRunner::open(bed, settings).await?;
    let report = explore(&runner, &mut source, &config).await;
    runner.stop().await;
    report
}

/// The invariants a wire outcome broke, in name order.
pub fn violated(outcome: &WireOutcome) -> Vec<Invariant> {
    crate::check::broken(&outcome.case.violations)
        .into_iter()
        .collect()
}
