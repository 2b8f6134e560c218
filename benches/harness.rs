//! Harness benchmark: how fast controlled cases run against the real containers, how soon
//! exploration finds each defect, and how a hand-written stress test does with the same time.
//!
//! Why one file of ~850 lines: the benchmark's sections share the bed, the suites and the
//! printing helpers, and run in one sitting so their numbers compare. The baseline (section 3),
//! which shares only the bed and the detection results, is in `harness/baseline.rs`.
//!
//! `cargo bench --bench harness`. It prints numbers and asserts nothing:
//! 1. controlled cases per second of the reference worker on `lease-expiry` and `full-rollout`;
//! 2. per defect, cases and seconds until the first failing case (`found_after`, measured before
//!    any shrinking; shrinking is off here) over seeds 0..10, 256 cases at most;
//! 3. a baseline "of the kind teams write by hand": free-running workers of mixed versions,
//!    concurrent identical requests, seeded random sleeps between polls, a cutover half way for the
//!    cache defects, the same invariants checked at the end of each round, for the wall-clock
//!    budget exploration needed (at least 2 s) per defect and seed.
//!
//! The random sleeps of the baseline are the point of the baseline (that is how such tests find
//! races, when they do); nothing else here sleeps to synchronise.

#[path = "harness/baseline.rs"]
mod baseline;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use racecert::check::coverage::Coverage;
use racecert::check::{CaseResult, Violation};
use racecert::contract::defect::{Defect, Defects};
use racecert::env::TestBed;
use racecert::fault::FaultKind;
use racecert::history::{Event, EventKind};
use racecert::runner::controlled::Controller;
use racecert::runner::explore::{DEFAULT_CONCURRENCY, ExploreConfig, ExploreReport, explore};
use racecert::schedule::Schedule;
use racecert::suite::{Suite, builtin};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Cases per suite for the throughput measurement.
const THROUGHPUT_CASES: u32 = 200;
/// Cases slower than this get their own time breakdown.
const SLOW_CASE: Duration = Duration::from_millis(40);
/// Cases an exploration may use to find a defect (proptest's default).
const DETECTION_CASES: u32 = 256;
/// Seeds of the detection measurement.
const DETECTION_SEEDS: u64 = 10;
/// The least wall-clock budget a baseline gets per seed.
const MIN_BUDGET: Duration = Duration::from_secs(2);

/// The built-in suite that catches a defect.
fn suite_for(defect: Defect) -> &'static str {
    racecert::suite::catching(defect).suite
}

/// Whether the baseline exercises a defect with same-input traffic and a cutover.
fn is_cache_defect(defect: Defect) -> bool {
    suite_for(defect) == "stale-cache-at-cutover"
}

fn suite(name: &str) -> anyhow::Result<Suite> {
    builtin()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| anyhow::anyhow!("no built-in suite {name}"))
}

fn invariant_names(violations: &[Violation]) -> String {
    let names: BTreeSet<&str> = violations.iter().map(|v| v.invariant.name()).collect();
    names.into_iter().collect::<Vec<_>>().join(", ")
}

/// Runs an exploration from this (non-runtime) thread.
fn explore_with(
    rt: &Runtime,
    controller: &Controller<'_>,
    suite: &Suite,
    cases: u32,
    seed: u64,
) -> anyhow::Result<ExploreReport> {
    let config = ExploreConfig {
        cases,
        seed,
        // Detection time, not shrinking time: found_after is taken at the first failing case.
        max_shrink_iters: 0,
        ..ExploreConfig::default()
    };
    Ok(rt.block_on(explore(controller, &suite.space, &config))?)
}

// ---------------------------------------------------------------------------------------------
// 1. Throughput

/// The generator seed `explore` derives from a u64 seed (so seed 0 here means what it does there).
fn test_rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seed.wrapping_add(i as u64)).to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// What a schedule step (as the history describes it) is, for the time breakdown.
fn step_kind(description: &str) -> &'static str {
    let d = description;
    if d.starts_with("run") {
        "run-to-checkpoint"
    } else if d.starts_with("crash") {
        "crash"
    } else if d.starts_with("drain") {
        "drain"
    } else if d.contains("partition") {
        "partition"
    } else if d.contains("heal") {
        "heal"
    } else if d.contains("times out") {
        "upstream-timeout"
    } else if d.contains("fails") {
        "backend-failure"
    } else if d.contains("lease") {
        "lease-expiry"
    } else if d.contains("cutover") {
        "cutover"
    } else if d.contains("invalidation") {
        "cache-invalidation"
    } else if d.contains("restart") {
        "redis-restart"
    } else {
        "other"
    }
}

/// Time of one case by what it was spent on: steps by kind (from the history's step stamps), and
/// what lies outside the recorded span (setup of pipeline and workers, submissions, reading the
/// audit trail and journals, checking).
fn split_case(took: Duration, events: &[Event], into: &mut BTreeMap<&'static str, f64>) {
    for (description, span) in step_spans(events) {
        *into.entry(step_kind(description)).or_insert(0.0) += span as f64;
    }
    let end = events.last().map_or(0, |e| e.at_ms);
    *into.entry("setup+check (outside steps)").or_insert(0.0) += (ms(took) - end as f64).max(0.0);
}

/// Each step of a case with the milliseconds until the next step (the last: until the last event),
/// from the history's step stamps.
fn step_spans(events: &[Event]) -> Vec<(&str, u64)> {
    let end = events.last().map_or(0, |e| e.at_ms);
    let steps: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Step(description) => Some((e.at_ms, description.as_str())),
            _ => None,
        })
        .collect();
    steps
        .iter()
        .enumerate()
        .map(|(i, (at, description))| {
            let until = steps.get(i + 1).map_or(end, |(next, _)| *next);
            (*description, until.saturating_sub(*at))
        })
        .collect()
}

/// "1 run worker 0 to ...: 3; 2 ...: 250; ..." (steps of one case, as the history stamps them).
fn step_times(events: &[Event]) -> String {
    step_spans(events)
        .iter()
        .map(|(description, span)| format!("[{description}] {span}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// "kind ms, kind ms, ..." largest first, per case.
fn breakdown(split: &BTreeMap<&'static str, f64>, cases: f64) -> String {
    let mut parts: Vec<(&str, f64)> = split.iter().map(|(kind, total)| (*kind, *total)).collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    parts
        .iter()
        .filter(|(_, total)| *total / cases >= 0.05)
        .map(|(kind, total)| format!("{kind} {:.1}", total / cases))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The suites whose cases per second are compared across versions, each also with its schedules
/// holding workers at checkpoints only: those are the cases racecert drew before it could hold a
/// worker between two statements (a step kind that adds work to a case), so a before/after
/// comparison of the runner's own speed runs the same cases on both sides.
const CHECKPOINTS_ONLY_TOO: [(&str, bool); 4] = [
    ("lease-expiry", true),
    ("lease-expiry", false),
    ("full-rollout", true),
    ("full-rollout", false),
];

fn label(name: &str, between_statements: bool) -> String {
    if between_statements {
        name.to_owned()
    } else {
        format!("{name}/ckpt")
    }
}

/// What the throughput measurement saw over one suite's cases.
#[derive(Default)]
struct ThroughputRun {
    times: Vec<Duration>,
    coverage: Coverage,
    failures: Vec<String>,
    /// (message, schedule, time) of each case that ended in a harness error.
    errors: Vec<(String, String, Duration)>,
    split: BTreeMap<&'static str, f64>,
    // Cases over SLOW_CASE, and (for those over 1 s) which faults their schedules had.
    split_slow: BTreeMap<&'static str, f64>,
    slow_cases: usize,
    slowest: Option<(Duration, Vec<Event>)>,
    very_slow_faults: BTreeMap<&'static str, usize>,
    elapsed: Duration,
}

impl ThroughputRun {
    /// Counts one case: its time, and what its result (or error) says.
    fn record(
        &mut self,
        schedule: &Schedule,
        took: Duration,
        result: racecert::Result<CaseResult>,
    ) {
        if took > Duration::from_secs(1) {
            let kinds: BTreeSet<&'static str> = schedule
                .steps
                .iter()
                .map(|step| step_kind(&step.to_string()))
                .collect();
            for kind in kinds {
                *self.very_slow_faults.entry(kind).or_insert(0) += 1;
            }
        }
        self.times.push(took);
        match result {
            Ok(result) => {
                if self.slowest.as_ref().is_none_or(|(t, _)| took > *t) {
                    self.slowest = Some((took, result.history.events.clone()));
                }
                split_case(took, &result.history.events, &mut self.split);
                if took > SLOW_CASE {
                    self.slow_cases += 1;
                    split_case(took, &result.history.events, &mut self.split_slow);
                }
                self.coverage.merge(&result.coverage);
                if !result.violations.is_empty() {
                    self.failures.push(invariant_names(&result.violations));
                }
            }
            Err(err) => self
                .errors
                .push((err.to_string(), schedule.to_string(), took)),
        }
    }
}

fn throughput(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    println!(
        "\n## 1. Controlled cases per second, reference worker ({THROUGHPUT_CASES} generated cases each, seed 0; target 100 cases/s; /ckpt: held at checkpoints only)"
    );
    for (name, between) in CHECKPOINTS_ONLY_TOO {
        let mut suite = suite(name)?;
        suite.space.between_statements = between;
        let name = label(name, between);
        let run = throughput_run(rt, bed, &suite)?;
        print_rates(&name, &run);
        print_time_split(&run);
        print_errors_and_faults(&suite, &run);
    }
    Ok(())
}

/// Runs [`THROUGHPUT_CASES`] proptest-generated cases of one suite one at a time (not through
/// `explore`, so one harness error is counted and the run goes on, and every case is timed).
fn throughput_run(rt: &Runtime, bed: &TestBed, suite: &Suite) -> anyhow::Result<ThroughputRun> {
    let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
    let strategy = suite.space.strategy();
    let mut runner = TestRunner::new_with_rng(ProptestConfig::default(), test_rng(0));
    let mut run = ThroughputRun::default();
    let started = Instant::now();
    for _ in 0..THROUGHPUT_CASES {
        let schedule = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("generating a schedule: {e}"))?
            .current();
        let case_started = Instant::now();
        let result = rt.block_on(controller.run(&schedule));
        let took = case_started.elapsed();
        run.record(&schedule, took, result);
    }
    run.elapsed = started.elapsed();
    Ok(run)
}

/// Cases per second, and the spread of a case's time.
fn print_rates(name: &str, run: &ThroughputRun) {
    let times = &run.times;
    let secs = run.elapsed.as_secs_f64();
    println!(
        "{name:<14} cases {:>4}  seconds {:>6.2}  cases/s {:>6.1}  failures {}  harness errors {}",
        times.len(),
        secs,
        times.len() as f64 / secs,
        run.failures.len(),
        run.errors.len()
    );
    let mut sorted = times.clone();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)];
    let quarter = times.len() / 4;
    let mean = |slice: &[Duration]| {
        slice.iter().sum::<Duration>().as_secs_f64() * 1e3 / slice.len().max(1) as f64
    };
    println!(
        "{:<14} per case: mean {:.1} ms  p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms; first quarter mean {:.1} ms, last quarter mean {:.1} ms",
        "",
        mean(times),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(0.99)),
        ms(at(1.0)),
        mean(&times[..quarter]),
        mean(&times[times.len() - quarter..])
    );
}

/// Where the cases' time goes: all cases, the slow ones, the slowest one, those over 1 s.
fn print_time_split(run: &ThroughputRun) {
    let times = &run.times;
    let ok_cases = (times.len() - run.errors.len()).max(1) as f64;
    println!(
        "{:<14} where a case's time goes (ms per case, errored cases left out): {}",
        "",
        breakdown(&run.split, ok_cases)
    );
    if run.slow_cases > 0 {
        println!(
            "{:<14} {} cases over {SLOW_CASE:?}, their time (ms per case): {}",
            "",
            run.slow_cases,
            breakdown(&run.split_slow, run.slow_cases as f64)
        );
    }
    if let Some((took, events)) = &run.slowest {
        println!(
            "{:<14} slowest case ({:.0} ms), ms per step: {}",
            "",
            ms(*took),
            step_times(events)
        );
    }
    let slow: Vec<&Duration> = times
        .iter()
        .filter(|t| **t > Duration::from_secs(1))
        .collect();
    if !slow.is_empty() {
        println!(
            "{:<14} cases over 1 s: {} taking {:.1} s of the {:.1} s; step kinds in their schedules (cases): {}",
            "",
            slow.len(),
            slow.iter().map(|t| t.as_secs_f64()).sum::<f64>(),
            run.elapsed.as_secs_f64(),
            run.very_slow_faults
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The harness errors and invariant failures of a run, and how its faults landed.
fn print_errors_and_faults(suite: &Suite, run: &ThroughputRun) {
    let (times, errors, elapsed) = (&run.times, &run.errors, run.elapsed);
    let error_time: Duration = errors.iter().map(|(_, _, t)| *t).sum();
    if !errors.is_empty() {
        let ok = times.len() - errors.len();
        println!(
            "{:<14} without the errored cases: {ok} cases in {:.2} s = {:.1} cases/s",
            "",
            (elapsed - error_time).as_secs_f64(),
            ok as f64 / (elapsed - error_time).as_secs_f64()
        );
        let (message, schedule, took) = &errors[0];
        println!(
            "{:<14} first harness error ({:.1} s): {message}\n{:<14} its schedule: {}",
            "",
            took.as_secs_f64(),
            "",
            schedule.replace('\n', " | ")
        );
    }
    if !run.failures.is_empty() {
        println!(
            "{:<14} UNEXPECTED invariant failures: {}",
            "",
            run.failures.join("; ")
        );
    }
    let landed: Vec<String> = run
        .coverage
        .faults
        .iter()
        .map(|(kind, (applied, landed))| format!("{kind} {landed}/{applied}"))
        .collect();
    println!("{:<14} faults landed/applied: {}", "", landed.join(", "));
    if let Some((applied, _)) = run.coverage.faults.get(&FaultKind::UpstreamTimeout) {
        println!(
            "{:<14} {applied} upstream-timeout faults: a slowed call waits out the {:?} backend timeout (>= {:.1} s of this run if each slowed one call)",
            "",
            suite.settings.backend_timeout,
            f64::from(*applied) * suite.settings.backend_timeout.as_secs_f64()
        );
    }
}

/// Cases per second as `explore` runs them: generated by proptest, run `concurrency` at a time in
/// generation order, checked. This is the number `certify` and `cargo test` get.
fn explore_throughput(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    println!(
        "\n## 1b. Controlled cases per second through `explore` ({THROUGHPUT_CASES} cases, seed 0, by concurrency; default {DEFAULT_CONCURRENCY}; target 100 cases/s)"
    );
    let suites = [("retry-overlap", true)]
        .into_iter()
        .chain(CHECKPOINTS_ONLY_TOO);
    for (name, between) in suites {
        let mut suite = suite(name)?;
        suite.space.between_statements = between;
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let mut line = format!("{:<18}", label(name, between));
        for concurrency in [1, 2, 4, 8] {
            let config = ExploreConfig {
                cases: THROUGHPUT_CASES,
                seed: 0,
                concurrency,
                ..ExploreConfig::default()
            };
            let report = rt.block_on(explore(&controller, &suite.space, &config))?;
            let secs = report.elapsed.as_secs_f64();
            let verdict = match &report.found {
                None => String::new(),
                Some(found) => format!(
                    " UNEXPECTED failure: {}",
                    invariant_names(&found.shrunk.case.violations)
                ),
            };
            line.push_str(&format!(
                "  x{concurrency}: {:>6.1} cases/s ({} in {:.2} s){verdict}",
                f64::from(report.cases_run) / secs,
                report.cases_run,
                secs
            ));
        }
        println!("{line}");
    }
    Ok(())
}

/// Cases per second with every worker's round trips recorded (the default) and without: what the
/// wire witness costs. Runs alternate on and off, three times each, in one sitting.
fn wire_cost(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    println!(
        "\n## 1c. Recording round trips on and off ({THROUGHPUT_CASES} cases, seed 0, concurrency {DEFAULT_CONCURRENCY}, 3 runs each, alternating)"
    );
    for name in [
        "lease-expiry",
        "retry-overlap",
        "full-rollout",
        "stale-cache-at-cutover",
    ] {
        let mut rates: BTreeMap<bool, Vec<f64>> = BTreeMap::new();
        for _ in 0..3 {
            for wire in [true, false] {
                let mut suite = suite(name)?;
                suite.settings.wire = wire;
                let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
                let config = ExploreConfig {
                    cases: THROUGHPUT_CASES,
                    seed: 0,
                    concurrency: DEFAULT_CONCURRENCY,
                    ..ExploreConfig::default()
                };
                let report = rt.block_on(explore(&controller, &suite.space, &config))?;
                if let Some(found) = &report.found {
                    println!(
                        "{name}: UNEXPECTED failure (wire {wire}): {}",
                        invariant_names(&found.shrunk.case.violations)
                    );
                }
                rates
                    .entry(wire)
                    .or_default()
                    .push(f64::from(report.cases_run) / report.elapsed.as_secs_f64());
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (on, off) = (mean(&rates[&true]), mean(&rates[&false]));
        let show = |v: &[f64]| {
            v.iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{name:<24} on: {on:>6.1} cases/s ({})  off: {off:>6.1} cases/s ({})  on/off {:.0}%",
            show(&rates[&true]),
            show(&rates[&false]),
            100.0 * on / off
        );
    }
    Ok(())
}

/// Worker processes certified as a fleet in section 1d, run after run.
const FLEET_ROUNDS: u32 = 4;
/// Seeds of section 1d.
const FLEET_SEEDS: u64 = 10;

/// A worker command of section 1d: its label, the command line, the defects switched on, and the
/// invariant that should catch it.
type FleetCase = (String, String, Defects, &'static str);

/// The wire-only defects as processes: `racecert worker` with each defect switched on, and the
/// Python example with the flag that plants the same bug, certified as a fleet (up to
/// [`FLEET_ROUNDS`] runs) on seeds 1..=10; then the safe ones, run after run. What is printed: the
/// seeds that caught the bug, the run that caught it, and the invariants broken.
fn fleet_detection(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    let reference = env!("CARGO_BIN_EXE_racecert");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv =
        racecert::env::python::Venv::ensure(&root.join("examples/python-worker/requirements.txt"))?;
    let python = format!(
        "{} {}",
        venv.python().display(),
        root.join("examples/python-worker/worker.py").display()
    );
    println!(
        "\n## 1d. Wire-only defects as processes (seeds 1..={FLEET_SEEDS}, up to {FLEET_ROUNDS} fleet runs a seed)"
    );
    // `-- fleet WORD`: only the rows whose label holds WORD.
    let only = std::env::args().skip_while(|a| a != "fleet").nth(1);
    let wanted = |label: &str| only.as_deref().is_none_or(|w| label.contains(w));
    for case in fleet_cases(reference, &python) {
        if wanted(&case.0) {
            fleet_catch(rt, bed, case);
        }
    }
    for (label, command) in [
        ("racecert worker (safe)", format!("{reference} worker")),
        ("worker.py (safe)", python.clone()),
    ] {
        if wanted(label) {
            fleet_safe(rt, bed, label, &command);
        }
    }
    Ok(())
}

/// The planted-bug rows of section 1d: each wire-only defect of the reference worker, and the
/// Python example's flag for the same bug.
fn fleet_cases(reference: &str, python: &str) -> Vec<FleetCase> {
    vec![
        (
            "racecert worker".into(),
            format!("{reference} worker"),
            Defects::of([Defect::ReleaseWithoutTokenCheck]),
            "lease-discipline",
        ),
        (
            "racecert worker".into(),
            format!("{reference} worker"),
            Defects::of([Defect::LeaseWithoutNx]),
            "lease-discipline",
        ),
        (
            "racecert worker".into(),
            format!("{reference} worker"),
            Defects::of([Defect::CacheWriteActiveNamespace]),
            "no-cross-version-cache-entry",
        ),
        (
            "worker.py --release-without-check".into(),
            format!("{python} --release-without-check"),
            Defects::none(),
            "lease-discipline",
        ),
        (
            "worker.py --lease-without-nx".into(),
            format!("{python} --lease-without-nx"),
            Defects::none(),
            "lease-discipline",
        ),
        (
            "worker.py --cache-active-namespace".into(),
            format!("{python} --cache-active-namespace"),
            Defects::none(),
            "no-cross-version-cache-entry",
        ),
    ]
}

/// Certifies one planted-bug row on every seed and prints the seeds (and runs) that caught it.
fn fleet_catch(rt: &Runtime, bed: &TestBed, (label, command, defects, invariant): FleetCase) {
    use racecert::suite::certify::certify_external;
    let started = Instant::now();
    let mut caught = Vec::new();
    let mut runs = Vec::new();
    let mut errors = Vec::new();
    for seed in 1..=FLEET_SEEDS {
        let run = certify_external(bed, &command, FLEET_ROUNDS, seed, &defects, |_| {});
        let outcome = match rt.block_on(run) {
            Ok(outcome) => outcome,
            Err(err) => {
                // A harness error is no verdict: counted and shown, never a catch.
                errors.push(format!("seed {seed}: {err}"));
                continue;
            }
        };
        let broken: Vec<String> = outcome
            .counterexample
            .iter()
            .flat_map(|c| c.violations.iter().map(|v| v.invariant.clone()))
            .collect();
        if broken.iter().any(|b| b == invariant) {
            caught.push(seed);
            runs.push(outcome.cases_run);
        }
    }
    let defect = defects
        .iter()
        .next()
        .map_or(String::new(), |d| format!(" {d}"));
    let errors = if errors.is_empty() {
        String::new()
    } else {
        format!("; harness errors: {errors:?}")
    };
    println!(
        "{label:<36}{defect} -> {invariant}: caught on {}/{FLEET_SEEDS} seeds, in run {:?}, {:.0} s{errors}",
        caught.len(),
        runs,
        started.elapsed().as_secs_f64()
    );
}

/// Certifies a safe worker command 20 times, one run a seed, and prints how many runs passed.
fn fleet_safe(rt: &Runtime, bed: &TestBed, label: &str, command: &str) {
    use racecert::suite::certify::certify_external;
    let started = Instant::now();
    let mut held = 0;
    let mut broke = Vec::new();
    let safe = Defects::none();
    for seed in 1..=20 {
        let run = certify_external(bed, command, 1, seed, &safe, |_| {});
        match rt.block_on(run) {
            Ok(outcome) if outcome.held => held += 1,
            Ok(_) => broke.push(format!("seed {seed}")),
            Err(err) => broke.push(format!("seed {seed}: harness error {err}")),
        }
    }
    println!(
        "{label:<36} passed {held}/20 runs in a row (not passed: {broke:?}), {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Detection by exploration

struct Detection {
    defect: Defect,
    /// Per seed: (cases, time) to the first failing case, None if not found in the budget.
    found: Vec<Option<(u32, Duration)>>,
    invariants: BTreeSet<&'static str>,
    elapsed: Duration,
}

impl Detection {
    fn detected(&self) -> usize {
        self.found.iter().flatten().count()
    }

    /// Mean seconds to detection over the seeds that detected it.
    fn mean_secs(&self) -> Option<f64> {
        let found: Vec<f64> = self
            .found
            .iter()
            .flatten()
            .map(|(_, t)| t.as_secs_f64())
            .collect();
        (!found.is_empty()).then(|| found.iter().sum::<f64>() / found.len() as f64)
    }

    /// The baseline's budget: racecert's mean detection time, at least [`MIN_BUDGET`].
    fn budget(&self) -> Duration {
        let mean = self
            .mean_secs()
            .unwrap_or(self.elapsed.as_secs_f64() / DETECTION_SEEDS as f64);
        Duration::from_secs_f64(mean).max(MIN_BUDGET)
    }
}

fn detection(rt: &Runtime, bed: &TestBed) -> anyhow::Result<Vec<Detection>> {
    println!(
        "\n## 2. Exploration: first failing case per defect (seeds 0..{DETECTION_SEEDS}, <= {DETECTION_CASES} cases, no shrinking)"
    );
    println!(
        "{:<24} {:<22} {:>8} {:>10} {:>9} {:>10} {:>9}  invariants broken",
        "defect", "suite", "detected", "mean cases", "max cases", "mean s", "max s"
    );
    let mut out = Vec::new();
    for defect in Defect::ALL {
        let suite = suite(suite_for(defect))?.with_defects(Defects::of([defect]));
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let started = Instant::now();
        let mut found = Vec::new();
        let mut invariants = BTreeSet::new();
        let mut errors = Vec::new();
        for seed in 0..DETECTION_SEEDS {
            match explore_with(rt, &controller, &suite, DETECTION_CASES, seed) {
                Ok(report) => match &report.found {
                    Some(c) => {
                        found.push(Some(c.found_after));
                        invariants
                            .extend(c.shrunk.case.violations.iter().map(|v| v.invariant.name()));
                    }
                    None => found.push(None),
                },
                // A harness error is not a finding: count the seed as a miss and say why.
                Err(err) => {
                    found.push(None);
                    errors.push(format!("seed {seed}: {err}"));
                }
            }
        }
        let d = Detection {
            defect,
            found,
            invariants,
            elapsed: started.elapsed(),
        };
        let cases: Vec<u32> = d.found.iter().flatten().map(|(c, _)| *c).collect();
        let secs: Vec<f64> = d
            .found
            .iter()
            .flatten()
            .map(|(_, t)| t.as_secs_f64())
            .collect();
        let (mean_cases, max_cases, mean_s, max_s) = if cases.is_empty() {
            ("-".into(), "-".into(), "-".into(), "-".into())
        } else {
            (
                format!(
                    "{:.1}",
                    cases.iter().map(|&c| f64::from(c)).sum::<f64>() / cases.len() as f64
                ),
                cases.iter().max().copied().unwrap_or(0).to_string(),
                format!("{:.3}", d.mean_secs().unwrap_or(0.0)),
                format!("{:.3}", secs.iter().copied().fold(0.0, f64::max)),
            )
        };
        println!(
            "{:<24} {:<22} {:>5}/{:<2} {:>10} {:>9} {:>10} {:>9}  {}",
            defect.name(),
            suite.name,
            d.detected(),
            DETECTION_SEEDS,
            mean_cases,
            max_cases,
            mean_s,
            max_s,
            d.invariants.iter().copied().collect::<Vec<_>>().join(", ")
        );
        println!(
            "{:<24} per seed (cases): {}   ({:.1} s for all seeds)",
            "",
            d.found
                .iter()
                .map(|f| f.map_or("miss".to_string(), |(c, _)| c.to_string()))
                .collect::<Vec<_>>()
                .join(" "),
            d.elapsed.as_secs_f64()
        );
        for error in &errors {
            println!("{:<24} HARNESS ERROR {error}", "");
        }
        out.push(d);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------

/// `cargo bench --bench harness -- throughput` runs sections 1 and 1b only; `-- wire` section 1c
/// only; `-- fleet` section 1d only (worker processes; minutes); `-- detection` section 2 only.
fn run(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    if std::env::args().skip(1).any(|arg| arg == "wire") {
        return wire_cost(rt, bed);
    }
    if std::env::args().skip(1).any(|arg| arg == "fleet") {
        return fleet_detection(rt, bed);
    }
    if std::env::args().skip(1).any(|arg| arg == "detection") {
        return detection(rt, bed).map(drop);
    }
    let only_throughput = std::env::args().skip(1).any(|arg| arg == "throughput");
    throughput(rt, bed)?;
    explore_throughput(rt, bed)?;
    wire_cost(rt, bed)?;
    if only_throughput {
        return Ok(());
    }
    let detections = detection(rt, bed)?;
    baseline::baseline(rt, bed, &detections)
}

fn main() -> anyhow::Result<()> {
    println!("$ cargo bench --bench harness");
    println!("racecert harness benchmark (numbers only, no assertions)");
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let bed = rt.block_on(TestBed::builder().start())?;
    println!(
        "test bed up in {:.2?} (Redis, Postgres, fault proxy, backends v1 and v2)",
        bed.startup_time()
    );
    let outcome = run(&rt, &bed);
    rt.block_on(bed.shutdown());
    outcome?;
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
