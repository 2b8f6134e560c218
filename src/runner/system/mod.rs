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
//! - every framework: SIGKILL of the worker mid-call and a restart; a model answer past the
//!   worker's own timeout; the request submitted again; the worker's database link cut mid-job;
//!   and the rollout as the file's `[rollout]` says (`rollout`): a drain, a cutover with the
//!   same input asked of the new version after it, the team's invalidation step run late, the
//!   backend behind a shared model URL switched under a running worker.
//!
//! Modules: `case` (one case: fleet shape, submission, the fault as a [`crate::fault::Plane`]),
//! `rollout` (the rollout faults), `fleet` (worker processes and their links), `judge` (the
//! case's history, verdict and sequence diagram).

mod case;
mod fleet;
mod judge;
mod rollout;
mod settle;
mod submit;
#[cfg(test)]
mod tests;

pub use judge::sequence_text;

use crate::check::coverage::{Coverage, Scope};
use crate::check::{Invariant, Verdict, Violation};
use crate::env::TestBed;
use crate::env::backends::ModelBackend;
use crate::env::python::Venv;
use crate::fault::{Effect, FaultKind};
use crate::history::AuditRow;
use crate::system::preset::audit_sql;
use crate::system::{Submit, System};
use crate::wire::WireEvent;
use crate::{Error, Result};
use case::{Aim, CaseCtx, run_case};
use fleet::{Fleet, Worker, configure, open_links, with_path};
use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::Command;

/// The lane and the writer name of a `[submit] command`'s writes.
pub use crate::history::SUBMITTER;

/// The default budget per fault kind in scope: a system case lasts 5-20 s (a model call held
/// past the worker's own timeout, the longest, about 18 s in the examples), 10-12 s on average.
const BUDGET_PER_KIND: Duration = Duration::from_secs(15);

/// The budget per case when cases are asked for without a budget (`--cases N`): twice the
/// longest case, so that N cases run unless one hangs (the budget is then a guard, not a cut).
pub const BUDGET_PER_CASE: Duration = Duration::from_secs(40);

/// Settings of a system run.
#[derive(Debug, Clone)]
pub struct SystemSettings {
    /// Cases at most.
    pub cases: u32,
    /// The run's seed: case `n`'s fault and ids come from `(seed, n)`.
    pub seed: u64,
    /// Wall-clock budget for the cases (start-up and setup not counted).
    pub budget: Duration,
    /// With it, the budget is at least this much per fault kind in scope: a system whose file
    /// puts more kinds in scope (a rollout's invalidation step, a shared model URL) gets the time
    /// to land each of them. None: `budget` as it is (a budget the user gave).
    pub budget_per_kind: Option<Duration>,
    /// With it, the budget is at least this much per case of `cases`: cases were asked for and
    /// no budget was given, so the count decides, not a default budget. None: no such floor.
    pub budget_per_case: Option<Duration>,
    /// Faults run in turn, case 1 the first (empty: drawn from the framework's own by the seed).
    pub faults: Vec<FaultKind>,
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
    pub faults: Vec<FaultKind>,
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
                    .any(|v| self.breaks.iter().any(|b| b == v.invariant.name()))
        })
    }
}

/// Whether a case with `fault` can still meet a goal (always, without goals).
fn still_needed(goals: &[Goal], fault: FaultKind, cases: &[SystemCase]) -> bool {
    goals.is_empty()
        || goals
            .iter()
            .any(|goal| goal.faults.contains(&fault) && !goal.met(cases))
}

impl SystemSettings {
    /// The budget of a run with `kinds` fault kinds in scope (and `cases` cases, when they were
    /// asked for without a budget).
    pub fn budget_for(&self, kinds: usize) -> Duration {
        let by_kinds = self.budget_per_kind.map_or(self.budget, |per_kind| {
            self.budget.max(per_kind * kinds as u32)
        });
        self.budget_per_case
            .map_or(by_kinds, |per_case| by_kinds.max(per_case * self.cases))
    }

    /// The faults a run of `system` with these settings draws from: those asked for, each one
    /// the system has, or every kind of the system's. A fault it does not have is the
    /// settings' error, said before anything starts.
    pub fn faults_of(&self, system: &System) -> Result<Vec<FaultKind>> {
        let kinds = crate::system::preset::system_faults(system);
        if let Some(bad) = self.faults.iter().find(|f| !kinds.contains(f)) {
            let why = match bad {
                FaultKind::CacheInvalidationLag => {
                    " (it runs the team's invalidation step late: [rollout] has none)"
                }
                FaultKind::BackendSwitch => {
                    " (it switches a model URL the workers share: [rollout] backend_switch is not set)"
                }
                _ => "",
            };
            return Err(Error::Config(format!(
                "fault {bad} does not apply to system {:?}{why} (its faults: {})",
                system.name,
                kinds
                    .iter()
                    .map(|f| f.name())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(if self.faults.is_empty() {
            kinds
        } else {
            self.faults.clone()
        })
    }

    /// The fault kinds a run of `system` with these settings has in scope: the faults asked
    /// for, or every kind of the system's.
    pub fn kinds_in_scope(&self, system: &System) -> usize {
        self.faults_of(system)
            .map_or(0, |faults| scope_kinds(&faults).len())
    }

    /// Up to 20 cases in 15 s per fault kind in scope (at least 120 s), stopping at the first
    /// failure: time for one case of each kind (the Celery preset's eleven landed within
    /// 100-156 s on 2 cores, one upstream timeout of the examples' 15 s among them), and a few
    /// more.
    pub fn certify(seed: u64) -> SystemSettings {
        SystemSettings {
            cases: 20,
            seed,
            budget: Duration::from_secs(120),
            budget_per_kind: Some(BUDGET_PER_KIND),
            budget_per_case: None,
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

/// One case of a system run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemCase {
    /// Its number (replay with `--case`).
    pub number: u32,
    /// The fault injected.
    pub fault: FaultKind,
    /// The request submitted.
    pub request: String,
    /// Every write of the request's row, in order, each attributed to the worker whose
    /// connection carried it.
    pub writes: Vec<AuditRow>,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Invariants the system's description gives nothing to judge by (no generation or lease
    /// token column, no `[keys]`): reported, never counted as held.
    #[serde(default)]
    pub not_judged: Vec<Invariant>,
    /// What the case's fault did (None: it never came, no worker took the request).
    #[serde(default)]
    pub effect: Option<Effect>,
    /// Whether the fault landed on its target, judged from the case's history (the wire, the
    /// audit trail), not from its having been sent.
    #[serde(default)]
    pub landed: bool,
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
    /// Why the case's liveness ([`Invariant::LIVENESS`]) was not judged, when it was not:
    /// racecert itself still held the request's work when the case had to end.
    #[serde(default)]
    pub liveness_blind: Option<String>,
    /// How the team's API refused the request when it was submitted again, if it did (its
    /// submit command failed): a protection against duplicates the report shows.
    #[serde(default)]
    pub refused: Option<String>,
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
    /// The fault kinds the run applies (its scope: each must land for a PASS).
    #[serde(default)]
    pub kinds: Vec<FaultKind>,
    /// What a case's liveness verdicts waited for besides the held calls: the system's
    /// recovery bound and where it comes from.
    #[serde(default)]
    pub recovery: String,
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
    pub fn held(&self) -> bool {
        self.cases.iter().all(|c| c.violations.is_empty())
    }

    /// Landed / applied per fault kind over the cases, from each case's evidence.
    pub fn coverage(&self) -> Coverage {
        let mut coverage = Coverage::default();
        for case in &self.cases {
            match &case.effect {
                Some(Effect::NotApplicable { kind, why }) => {
                    coverage
                        .not_applicable
                        .entry(*kind)
                        .or_insert_with(|| why.clone());
                }
                Some(_) => coverage.applied_kind(case.fault, case.landed),
                None => {}
            }
        }
        coverage
    }

    /// What a PASS needs: every kind the run applies lands at least once.
    pub fn scope(&self) -> Scope {
        Scope::of(&self.kinds)
    }

    /// The run's verdict: FAILED on a broken invariant, INCONCLUSIVE when a kind in scope never
    /// landed or a case's liveness could not be judged, PASSED otherwise.
    pub fn verdict(&self) -> Verdict {
        if !self.held() {
            Verdict::Failed
        } else if !self.scope().unlanded(&self.coverage()).is_empty()
            || self.cases.iter().any(|c| c.liveness_blind.is_some())
        {
            Verdict::Inconclusive
        } else {
            Verdict::Passed
        }
    }

    /// Whether the run earned a PASS.
    pub fn passed(&self) -> bool {
        self.verdict() == Verdict::Passed
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

/// Runs a system against `bed` and judges every case from the audit trail.
pub async fn run_system(
    bed: &TestBed,
    system: &System,
    settings: &SystemSettings,
) -> Result<SystemOutcome> {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let faults = settings.faults_of(system)?;
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
    faults: &[FaultKind],
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
    run_with_backends(
        bed, system, settings, faults, venv, database, redis_db, run, &backends,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn run_with_backends(
    bed: &TestBed,
    system: &System,
    settings: &SystemSettings,
    faults: &[FaultKind],
    venv: &str,
    database: &str,
    redis_db: u64,
    run: u64,
    backends: &[ModelBackend],
) -> Result<SystemOutcome> {
    let run = Run {
        bed,
        system,
        settings,
        faults,
        venv,
        database,
        redis_db,
        run,
        backends,
    };
    let (mut pg, mut rd) = run.connect_stores().await?;
    let lines: Lines = Arc::default();
    let wire: Wire = Arc::default();
    let mut workers = Vec::new();
    for i in 0..system.versions.len() {
        let id = format!("worker-{}", (b'a' + i as u8) as char);
        workers.push(run.open_worker(&wire, id, i).await?);
    }
    let submitter = match &system.submit {
        Submit::Command(_) => Some(run.open_worker(&wire, SUBMITTER.to_owned(), 0).await?),
        Submit::Preset { .. } => None,
    };
    if let Some(setup) = &system.start.setup {
        run_setup(system, setup).await?;
    }
    let mut fleet = Fleet {
        system,
        ready: system.start.ready.clone(),
        workers,
        submitter,
        lines: lines.clone(),
        wire: wire.clone(),
        readers: Vec::new(),
        deadline: settings.startup_deadline,
        tag: format!("rs{}x{}", std::process::id(), run.run),
    };
    let (startup_ms, mut result) = start_fleet(&mut fleet).await;
    let mut cases = Vec::new();
    let mut first_failure_ms = None;
    if result.is_ok() {
        (cases, first_failure_ms, result) = run.run_cases(&mut fleet, &mut pg, &mut rd).await;
    }
    stop_fleet(&mut fleet).await;
    result?;
    if let Some(message) = terminal_matches_nothing(system, &cases) {
        return Err(Error::Config(format!(
            "{}: {message}",
            system.place("results.terminal")
        )));
    }
    let (outputs, log) = worker_output(&lines);
    Ok(SystemOutcome {
        system: system.name.clone(),
        seed: settings.seed,
        cases,
        startup_ms,
        first_failure_ms,
        outputs,
        log,
        kinds: scope_kinds(faults),
        recovery: {
            let (bound, source) = system.recovery_bound();
            format!("{} ms, {source}", bound.as_millis())
        },
    })
}

/// What one run was given: the bed, the system and its settings, the faults it draws from, and
/// the environment, databases and model backends made for it.
struct Run<'a> {
    bed: &'a TestBed,
    system: &'a System,
    settings: &'a SystemSettings,
    faults: &'a [FaultKind],
    venv: &'a str,
    database: &'a str,
    redis_db: u64,
    run: u64,
    backends: &'a [ModelBackend],
}

impl Run<'_> {
    /// The harness's own connections to the run's database (its results table prepared) and to
    /// its Redis database (flushed).
    async fn connect_stores(&self) -> Result<(PgConnection, redis::aio::MultiplexedConnection)> {
        let db_url = with_path(&self.bed.database_direct_url(), self.database);
        let mut pg = PgConnection::connect(&db_url).await?;
        prepare_results(&mut pg, self.system).await?;
        let redis_url = with_path(&self.bed.redis_direct_url(), &self.redis_db.to_string());
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
        Ok((pg, rd))
    }

    /// Worker `id` of the system's version `i`, its links open and its variables set.
    async fn open_worker(&self, wire: &Wire, id: String, i: usize) -> Result<Worker> {
        let (version, _) = &self.system.versions[i];
        // Its own proxies, its version's model among them: every call it makes is recorded as
        // its own.
        let links = open_links(
            self.bed,
            wire,
            &id,
            &(version.clone(), self.backends[i].addr()),
        )
        .await?;
        let mut worker = Worker::new(id, version, links);
        configure(
            self.system,
            &mut worker,
            self.redis_db,
            self.database,
            self.venv,
        );
        Ok(worker)
    }

    /// Runs the cases until the budget, the case count or the first failure (if asked) ends
    /// them: the cases run, when the first failing one ended, and the error that stopped them.
    async fn run_cases(
        &self,
        fleet: &mut Fleet<'_>,
        pg: &mut PgConnection,
        rd: &mut redis::aio::MultiplexedConnection,
    ) -> (Vec<SystemCase>, Option<u64>, Result<()>) {
        let settings = self.settings;
        let faults = self.faults;
        let mut cases = Vec::new();
        let mut first_failure_ms = None;
        let began = Instant::now();
        // The framework's kinds in an order of the seed's: the budget goes to each of them first.
        let mut rotation = scope_kinds(faults);
        rotation.shuffle(&mut StdRng::seed_from_u64(settings.seed));
        let budget = settings.budget_for(rotation.len());
        let numbers: Vec<u32> = match settings.only_case {
            Some(n) => vec![n],
            None => (1..=settings.cases).collect(),
        };
        for number in numbers {
            if crate::interrupt::requested().is_some()
                || (settings.only_case.is_none() && began.elapsed() >= budget)
            {
                break;
            }
            let mut rng = StdRng::seed_from_u64(settings.seed ^ (u64::from(number) << 32));
            let drawn = rng.random_range(0..faults.len());
            let fault = if settings.faults.is_empty() {
                next_fault(faults, &rotation, &cases, number, settings.only_case, drawn)
            } else {
                // Faults given: each in turn, so every one is exercised.
                faults[(number as usize - 1) % faults.len()]
            };
            if !still_needed(&settings.goals, fault, &cases) {
                continue;
            }
            let mut ctx = self.case_ctx(fleet, pg, rd, rng, number);
            let started = Instant::now();
            match run_case(
                &mut ctx,
                number,
                fault,
                self.venv,
                self.redis_db,
                self.database,
            )
            .await
            {
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
                Err(err) => return (cases, first_failure_ms, Err(err)),
            }
        }
        (cases, first_failure_ms, Ok(()))
    }

    /// The context of case `number`, nothing of it recorded yet.
    fn case_ctx<'c, 'f>(
        &'c self,
        fleet: &'c mut Fleet<'f>,
        pg: &'c mut PgConnection,
        rd: &'c mut redis::aio::MultiplexedConnection,
        rng: StdRng,
        number: u32,
    ) -> CaseCtx<'c, 'f> {
        CaseCtx {
            bed: self.bed,
            redis_db: self.redis_db,
            database: self.database.to_owned(),
            venv: self.venv.to_owned(),
            backends: self.backends,
            system: self.system,
            fleet,
            pg,
            rd,
            rng,
            prefix: format!("rs{}x{}c{number}", std::process::id(), self.run),
            arrows: Vec::new(),
            t0: now_ms(),
            first: number == 1 || self.settings.only_case.is_some(),
            companions: Vec::new(),
            judged_too: Vec::new(),
            aim: Aim::default(),
            effects: Vec::new(),
            observations: Vec::new(),
            wire_origin_unix_ms: self.bed.wire_origin_unix_ms(),
            liveness_blind: None,
            held_before: Vec::new(),
        }
    }
}

/// Runs the system's `setup` command, failing with its stderr's tail if it fails.
async fn run_setup(system: &System, setup: &str) -> Result<()> {
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
    Ok(())
}

/// Starts the fleet's workers: how long each took to be ready, and the error that stopped the
/// start-up, if one did.
async fn start_fleet(fleet: &mut Fleet<'_>) -> (BTreeMap<String, u64>, Result<()>) {
    let mut startup_ms = BTreeMap::new();
    // One at a time: two start-ups at once share the machine's cores and would each look slower.
    for index in 0..fleet.workers.len() {
        match fleet.start(index).await {
            Ok(took) => {
                startup_ms.insert(fleet.workers[index].id.clone(), took.as_millis() as u64);
            }
            Err(err) => return (startup_ms, Err(err)),
        }
    }
    (startup_ms, Ok(()))
}

/// Stops the fleet's workers (and any of their processes that outlived them), waits for their
/// output's readers and stops recording their links.
async fn stop_fleet(fleet: &mut Fleet<'_>) {
    for index in 0..fleet.workers.len() {
        fleet.stop(index, Duration::from_secs(5)).await;
    }
    let strays = fleet.reap_strays();
    if strays > 0 {
        tracing::info!(
            strays,
            "killed worker processes that outlived their workers"
        );
    }
    for reader in std::mem::take(&mut fleet.readers) {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    for worker in fleet.workers.iter().chain(&fleet.submitter) {
        worker.links.stop_recording();
    }
}

/// What the workers printed: per process start, its output; and every line, in time order.
fn worker_output(lines: &Lines) -> (BTreeMap<String, String>, Vec<WorkerLine>) {
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
    (outputs, log)
}

/// The fault of case `number` when the framework's own are drawn: every kind in `rotation`
/// first, then, until each has landed once, the kinds that have not (a kind that was applied
/// three times without landing yields its turn: the run will say INCONCLUSIVE for it), then
/// draws weighted as the preset weighs them (`drawn`). A rerun of one case alone takes its turn
/// in the rotation.
fn next_fault(
    faults: &[FaultKind],
    rotation: &[FaultKind],
    cases: &[SystemCase],
    number: u32,
    only_case: Option<u32>,
    drawn: usize,
) -> FaultKind {
    if only_case.is_some() || cases.len() < rotation.len() {
        let turn = if only_case.is_some() {
            number as usize - 1
        } else {
            cases.len()
        };
        return rotation[turn % rotation.len()];
    }
    let unlanded = rotation.iter().copied().find(|kind| {
        let mine = cases.iter().filter(|c| c.fault == *kind);
        let (tried, landed) = mine.fold((0, false), |(n, l), c| (n + 1, l || c.landed));
        !landed && tried < 3
    });
    unlanded.unwrap_or(faults[drawn])
}

/// The distinct kinds of a run's fault list, in order: its scope.
fn scope_kinds(faults: &[FaultKind]) -> Vec<FaultKind> {
    let mut kinds = Vec::new();
    for kind in faults {
        if !kinds.contains(kind) {
            kinds.push(*kind);
        }
    }
    kinds
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
        ("fencing.column", system.fencing.as_ref().map(|f| &f.column)),
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
    sqlx::raw_sql(AssertSqlSafe(audit_sql(results, system.fencing.as_ref())))
        .execute(&mut *pg)
        .await?;
    Ok(())
}

/// A `terminal` list that names no status the system writes makes every request look lost. The
/// evidence that it is the list, not the system: no write of the run set a terminal status, yet
/// writes stored an output (a result is written with the status that ends the job). Says which
/// statuses were written, those with an output first.
fn terminal_matches_nothing(system: &System, cases: &[SystemCase]) -> Option<String> {
    let writes = || cases.iter().flat_map(|c| c.writes.iter());
    if cases.is_empty() || writes().any(|w| system.results.terminal.contains(&w.new_status)) {
        return None;
    }
    let with_output: BTreeSet<&str> = writes()
        .filter(|w| w.output.as_deref().is_some_and(|o| !o.is_empty()))
        .map(|w| w.new_status.as_str())
        .collect();
    if with_output.is_empty() {
        return None;
    }
    let others: BTreeSet<&str> = writes()
        .map(|w| w.new_status.as_str())
        .filter(|s| !with_output.contains(s))
        .collect();
    let list = |set: &BTreeSet<&str>| {
        set.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "`terminal` = {:?} matches no status the system wrote in {} case(s), so every request would \
         look lost: the writes that stored an output set {}{}. List the statuses that end a job \
         in `terminal`",
        system.results.terminal,
        cases.len(),
        list(&with_output),
        if others.is_empty() {
            String::new()
        } else {
            format!(" (other statuses written: {})", list(&others))
        }
    ))
}

/// The command that reruns exactly case `number` of `file` with `seed`.
pub fn replay_command(file: &Path, seed: u64, number: u32, fault: FaultKind) -> String {
    format!(
        "racecert replay --system {} --seed {seed} --case {number} --fault {fault}",
        file.display()
    )
}
