//! Harness benchmark: how fast controlled cases run against the real containers, how soon
//! exploration finds each defect, and how a hand-written stress test does with the same time.
//!
//! Why one file of ~1,000 lines: the benchmark's sections share the bed, the suites and the
//! printing helpers, and run in one sitting so their numbers compare.
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

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use racecert::check::coverage::Coverage;
use racecert::check::{Invariant, Violation, check};
use racecert::contract::checkpoint::Checkpoints;
use racecert::contract::defect::{Defect, Defects};
use racecert::contract::log::LogSink;
use racecert::contract::log::Status;
use racecert::env::TestBed;
use racecert::fault::FaultKind;
use racecert::history::{Event, EventKind, History, SubmittedRequest, read_jobs, read_rows};
use racecert::reference::Pipeline;
use racecert::reference::queue::Queue;
use racecert::reference::submit::InferenceRequest;
use racecert::reference::worker::Worker;
use racecert::runner::controlled::Controller;
use racecert::runner::explore::{DEFAULT_CONCURRENCY, ExploreConfig, ExploreReport, explore};
use racecert::suite::{Suite, builtin};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
/// Seeds of the baseline.
const BASELINE_SEEDS: u64 = 3;
/// The least wall-clock budget a baseline gets per seed.
const MIN_BUDGET: Duration = Duration::from_secs(2);
/// Budget of the baseline's calibration on the correct worker.
const CALIBRATION_BUDGET: Duration = Duration::from_secs(5);
/// A longer budget for defects the baseline missed on every seed, to tell "too little time" from
/// "cannot reach the race".
const EXTENDED_BUDGET: Duration = Duration::from_secs(15);
const EXTENDED_SEED: u64 = 100;

/// Baseline: concurrent submissions of one request.
const IDENTICAL_REQUESTS: usize = 4;
/// Baseline (cache defects): other request ids with the same input, spread over a round.
const SAME_INPUT_REQUESTS: usize = 6;
/// Baseline (cache defects): the window in which submissions and the cutover happen.
const CACHE_ROUND_WINDOW: Duration = Duration::from_millis(600);
/// Baseline: longest random sleep between two polls of a worker.
const MAX_POLL_PAUSE_MS: u64 = 40;
/// Baseline: how long a round may wait for its jobs to end terminal and its deliveries to be
/// acknowledged (a declined delivery comes back after the 1.5 s visibility timeout).
const SETTLE_CAP: Duration = Duration::from_secs(3);
const BASE_VISIBILITY: Duration = Duration::from_millis(1500);
const BASE_BACKEND_TIMEOUT: Duration = Duration::from_secs(1);
const BASE_LEASE: Duration = Duration::from_secs(2);
const BASE_WORKERS: [(&str, &str); 4] = [
    ("worker-a", "v1"),
    ("worker-b", "v1"),
    ("worker-c", "v2"),
    ("worker-d", "v2"),
];

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
fn breakdown(split: BTreeMap<&'static str, f64>, cases: f64) -> String {
    let mut parts: Vec<(&str, f64)> = split.into_iter().collect();
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

/// Runs proptest-generated cases one at a time (not through `explore`, so one harness error is
/// counted and the run goes on, and every case is timed).
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

fn throughput(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    println!(
        "\n## 1. Controlled cases per second, reference worker ({THROUGHPUT_CASES} generated cases each, seed 0; target 100 cases/s; /ckpt: held at checkpoints only)"
    );
    for (name, between) in CHECKPOINTS_ONLY_TOO {
        let mut suite = suite(name)?;
        suite.space.between_statements = between;
        let name = label(name, between);
        let controller = rt.block_on(Controller::new(bed, suite.settings.clone()))?;
        let strategy = suite.space.strategy();
        let mut runner = TestRunner::new_with_rng(ProptestConfig::default(), test_rng(0));
        let mut times = Vec::new();
        let mut coverage = Coverage::default();
        let mut failures = Vec::new();
        let mut errors: Vec<(String, String, Duration)> = Vec::new();
        let mut split: BTreeMap<&'static str, f64> = BTreeMap::new();
        // Cases over SLOW_CASE, and (for those over 1 s) which faults their schedules had.
        let mut split_slow: BTreeMap<&'static str, f64> = BTreeMap::new();
        let mut slow_cases = 0usize;
        let mut slowest: Option<(Duration, Vec<Event>)> = None;
        let mut very_slow_faults: BTreeMap<&'static str, usize> = BTreeMap::new();
        let started = Instant::now();
        for _ in 0..THROUGHPUT_CASES {
            let schedule = strategy
                .new_tree(&mut runner)
                .map_err(|e| anyhow::anyhow!("generating a schedule: {e}"))?
                .current();
            let case_started = Instant::now();
            let result = rt.block_on(controller.run(&schedule));
            let took = case_started.elapsed();
            if took > Duration::from_secs(1) {
                let kinds: BTreeSet<&'static str> = schedule
                    .steps
                    .iter()
                    .map(|step| step_kind(&step.to_string()))
                    .collect();
                for kind in kinds {
                    *very_slow_faults.entry(kind).or_insert(0) += 1;
                }
            }
            times.push(took);
            match result {
                Ok(result) => {
                    if slowest.as_ref().is_none_or(|(t, _)| took > *t) {
                        slowest = Some((took, result.history.events.clone()));
                    }
                    split_case(took, &result.history.events, &mut split);
                    if took > SLOW_CASE {
                        slow_cases += 1;
                        split_case(took, &result.history.events, &mut split_slow);
                    }
                    coverage.merge(&result.coverage);
                    if !result.violations.is_empty() {
                        failures.push(invariant_names(&result.violations));
                    }
                }
                Err(err) => errors.push((err.to_string(), schedule.to_string(), took)),
            }
        }
        let elapsed = started.elapsed();
        let secs = elapsed.as_secs_f64();
        println!(
            "{name:<14} cases {:>4}  seconds {:>6.2}  cases/s {:>6.1}  failures {}  harness errors {}",
            times.len(),
            secs,
            times.len() as f64 / secs,
            failures.len(),
            errors.len()
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
            mean(&times),
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(0.99)),
            ms(at(1.0)),
            mean(&times[..quarter]),
            mean(&times[times.len() - quarter..])
        );
        let ok_cases = (times.len() - errors.len()).max(1) as f64;
        println!(
            "{:<14} where a case's time goes (ms per case, errored cases left out): {}",
            "",
            breakdown(split, ok_cases)
        );
        if slow_cases > 0 {
            println!(
                "{:<14} {slow_cases} cases over {SLOW_CASE:?}, their time (ms per case): {}",
                "",
                breakdown(split_slow, slow_cases as f64)
            );
        }
        if let Some((took, events)) = &slowest {
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
                secs,
                very_slow_faults
                    .iter()
                    .map(|(kind, n)| format!("{kind} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
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
        if !failures.is_empty() {
            println!(
                "{:<14} UNEXPECTED invariant failures: {}",
                "",
                failures.join("; ")
            );
        }
        let landed: Vec<String> = coverage
            .faults
            .iter()
            .map(|(kind, (applied, landed))| format!("{kind} {landed}/{applied}"))
            .collect();
        println!("{:<14} faults landed/applied: {}", "", landed.join(", "));
        if let Some((applied, _)) = coverage.faults.get(&FaultKind::UpstreamTimeout) {
            println!(
                "{:<14} {applied} upstream-timeout faults: a slowed call waits out the {:?} backend timeout (>= {:.1} s of this run if each slowed one call)",
                "",
                suite.settings.backend_timeout,
                f64::from(*applied) * suite.settings.backend_timeout.as_secs_f64()
            );
        }
    }
    Ok(())
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

/// The wire-only defects as processes: `racecert worker` with each defect switched on, and the
/// Python example with the flag that plants the same bug, certified as a fleet (up to
/// [`FLEET_ROUNDS`] runs) on seeds 1..=10; then the safe ones, run after run. What is printed: the
/// seeds that caught the bug, the run that caught it, and the invariants broken.
fn fleet_detection(rt: &Runtime, bed: &TestBed) -> anyhow::Result<()> {
    use racecert::suite::certify::certify_external;
    const FLEET_ROUNDS: u32 = 4;
    const FLEET_SEEDS: u64 = 10;
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
    let cases: Vec<(String, String, Defects, &str)> = vec![
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
    ];
    // `-- fleet WORD`: only the rows whose label holds WORD.
    let only = std::env::args().skip_while(|a| a != "fleet").nth(1);
    let wanted = |label: &str| only.as_deref().is_none_or(|w| label.contains(w));
    for (label, command, defects, invariant) in cases {
        if !wanted(&label) {
            continue;
        }
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
    for (label, command) in [
        ("racecert worker (safe)", format!("{reference} worker")),
        ("worker.py (safe)", python.clone()),
    ] {
        if !wanted(label) {
            continue;
        }
        let started = Instant::now();
        let mut held = 0;
        let mut broke = Vec::new();
        let safe = Defects::none();
        for seed in 1..=20 {
            let run = certify_external(bed, &command, 1, seed, &safe, |_| {});
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
    Ok(())
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
// 3. Baseline: a free-running stress test with random sleeps

/// What one baseline round saw.
struct Round {
    violations: Vec<Violation>,
    /// Deliveries handed out again after the visibility timeout (`retry_dispatched`): the only
    /// way a free-running round can overlap two attempts of one job.
    redeliveries: usize,
    /// Whether every job ended terminal with every delivery acknowledged before the cap.
    settled: bool,
    /// What was left when a round did not settle.
    unsettled: Option<String>,
    worker_errors: usize,
}

/// Something the coordinator of a round does at an offset from the round's start.
enum Action {
    Submit(String),
    Cutover,
    Invalidate,
}

async fn baseline_round(
    bed: &TestBed,
    defects: &Defects,
    cache_traffic: bool,
    namespace: &str,
    seed: u64,
) -> anyhow::Result<Round> {
    let mut rng = StdRng::seed_from_u64(seed);
    let pipeline = Pipeline::on(bed, namespace, LogSink::default()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for (i, (id, version)) in BASE_WORKERS.iter().enumerate() {
        let config = pipeline
            .worker_config(id, version)
            .backend_timeout(BASE_BACKEND_TIMEOUT)
            .upstream_warn_after(BASE_BACKEND_TIMEOUT / 2)
            .visibility_timeout(BASE_VISIBILITY)
            .lease_ttl(BASE_LEASE)
            .defects(defects.clone())
            .seed(seed)
            .build()?;
        let worker: Worker = pipeline.worker(config, Checkpoints::free()).await?;
        let stop = stop.clone();
        let mut pauses = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i as u64 + 1));
        workers.spawn(async move {
            let mut errors = 0usize;
            while !stop.load(Ordering::SeqCst) {
                if worker.poll_once().await.is_err() {
                    errors += 1;
                }
                let pause = pauses.random_range(0..=MAX_POLL_PAUSE_MS);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            errors
        });
    }

    // The coordinator's plan: N identical submissions at once, and for the cache defects the
    // same input under other request ids at random times, a cutover half way and the (late)
    // invalidation of the old cache entries a little after it.
    let mut plan: Vec<(Duration, Action)> = Vec::new();
    if cache_traffic {
        for r in 1..=SAME_INPUT_REQUESTS {
            let at = rng.random_range(0..CACHE_ROUND_WINDOW.as_millis() as u64);
            plan.push((
                Duration::from_millis(at),
                Action::Submit(format!("req-{r}")),
            ));
        }
        let half = CACHE_ROUND_WINDOW / 2;
        plan.push((half, Action::Cutover));
        let lag = rng.random_range(0..=CACHE_ROUND_WINDOW.as_millis() as u64 / 4);
        plan.push((half + Duration::from_millis(lag), Action::Invalidate));
    }
    plan.sort_by_key(|(at, _)| *at);

    let started = tokio::time::Instant::now();
    let mut submissions = tokio::task::JoinSet::new();
    for _ in 0..IDENTICAL_REQUESTS {
        let mut api = pipeline.api.clone();
        submissions.spawn(async move {
            api.submit(&InferenceRequest {
                request_id: "req-0".into(),
                input: "input-0".into(),
            })
            .await
            .map(|s| ("req-0".to_string(), s.idempotency_key))
        });
    }
    let mut cutover = None;
    for (at, action) in plan {
        tokio::time::sleep_until(started + at).await;
        match action {
            Action::Submit(request_id) => {
                let mut api = pipeline.api.clone();
                submissions.spawn(async move {
                    api.submit(&InferenceRequest {
                        request_id: request_id.clone(),
                        input: "input-0".into(),
                    })
                    .await
                    .map(|s| (request_id, s.idempotency_key))
                });
            }
            Action::Cutover => cutover = Some(pipeline.cutover("v2", defects).await?),
            Action::Invalidate => {
                if let Some(cutover) = cutover.as_mut() {
                    pipeline.invalidate(cutover).await?;
                }
            }
        }
    }
    let mut requests: Vec<SubmittedRequest> = Vec::new();
    while let Some(joined) = submissions.join_next().await {
        let (request_id, idempotency_key) = joined??;
        if !requests
            .iter()
            .any(|r| r.idempotency_key == idempotency_key)
        {
            // Every request of the baseline has the same input.
            requests.push(SubmittedRequest {
                request_id,
                idempotency_key,
                input: "input-0".into(),
            });
        }
    }

    // End of the round: every job terminal and every delivery acknowledged, or the cap.
    let prefix = pipeline.keys.prefix().to_owned();
    let mut queue = Queue::open(pipeline.infra.redis.clone(), &pipeline.keys).await?;
    let settle_deadline = tokio::time::Instant::now() + SETTLE_CAP;
    let mut settled = false;
    while tokio::time::Instant::now() < settle_deadline {
        let jobs = read_jobs(&pipeline.infra.pg, &prefix).await?;
        let terminal = requests.iter().all(|r| {
            jobs.iter().any(|j| {
                j.idempotency_key == r.idempotency_key
                    && matches!(j.status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED")
            })
        });
        if terminal && queue.pending_count().await? == 0 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut worker_errors = 0;
    while let Some(joined) = workers.join_next().await {
        worker_errors += joined?;
    }

    let events = pipeline
        .log
        .lines()
        .into_iter()
        .map(|line| Event {
            step: 0,
            at_ms: 0,
            kind: EventKind::Worker(line),
        })
        .collect();
    let mut journal = Vec::new();
    for version in bed.versions() {
        journal.extend(bed.backend(version)?.journal(Some(&prefix)).await);
    }
    let (audit, jobs) = read_rows(&pipeline.infra.pg, &prefix).await?;
    let history = History {
        events,
        audit,
        journal,
        jobs,
        requests,
        lease_ttl_ms: Some(BASE_LEASE.as_millis() as u64),
        namespace: Some(prefix.clone()),
        wire_recorded: false,
        layout: racecert::contract::layout::KeyLayout::contract(&prefix),
        ..History::default()
    };
    let violations = check(&history, &Invariant::ALL);
    let redeliveries = history.with_status(Status::RetryDispatched).count();
    // A round that did not settle: say what was left, so a missed cap is told from a stuck job.
    let unsettled = if settled {
        None
    } else {
        let pending = queue.pending_count().await?;
        let stuck: Vec<String> = history
            .jobs
            .iter()
            .filter(|j| !matches!(j.status.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED"))
            .map(|j| {
                let trail: Vec<String> = history
                    .events
                    .iter()
                    .filter_map(|e| e.line())
                    .filter(|line| line.get("idempotency_key") == Some(j.idempotency_key.as_str()))
                    .map(|line| {
                        format!(
                            "{}:{}",
                            line.get("worker_id").unwrap_or("-"),
                            line.status().unwrap_or("-")
                        )
                    })
                    .collect();
                format!("{} {} [{}]", j.request_id, j.status, trail.join(" "))
            })
            .collect();
        Some(format!(
            "{namespace}: {pending} deliveries unacknowledged; not terminal: {}",
            if stuck.is_empty() {
                "none".to_string()
            } else {
                stuck.join("; ")
            }
        ))
    };
    pipeline.infra.pg.close().await;
    Ok(Round {
        violations,
        redeliveries,
        settled,
        unsettled,
        worker_errors,
    })
}

/// One seed of the baseline: rounds until a violation or the budget is spent (a round started
/// within the budget runs to its end).
struct BaselineRun {
    rounds: u32,
    /// (round, seconds) of the first round with a violation.
    found: Option<(u32, f64)>,
    invariants: String,
    elapsed: f64,
    unsettled: u32,
    unsettled_details: Vec<String>,
    worker_errors: usize,
    redeliveries: usize,
    errors: Vec<String>,
}

fn baseline_seed(
    rt: &Runtime,
    bed: &TestBed,
    label: &str,
    defects: &Defects,
    cache_traffic: bool,
    seed: u64,
    budget: Duration,
) -> anyhow::Result<BaselineRun> {
    let started = Instant::now();
    let mut run = BaselineRun {
        rounds: 0,
        found: None,
        invariants: String::new(),
        elapsed: 0.0,
        unsettled: 0,
        unsettled_details: Vec::new(),
        worker_errors: 0,
        redeliveries: 0,
        errors: Vec::new(),
    };
    while started.elapsed() < budget {
        let round = run.rounds;
        let namespace = format!("{label}-base{seed}r{round}");
        let round_seed = seed.wrapping_mul(1_000_003).wrapping_add(u64::from(round));
        let result = rt.block_on(baseline_round(
            bed,
            defects,
            cache_traffic,
            &namespace,
            round_seed,
        ));
        run.rounds += 1;
        let result = match result {
            Ok(result) => result,
            // A round the harness could not run is not a finding: count it and go on.
            Err(err) => {
                run.errors.push(format!("round {round}: {err}"));
                continue;
            }
        };
        run.unsettled += u32::from(!result.settled);
        run.unsettled_details.extend(result.unsettled.clone());
        run.worker_errors += result.worker_errors;
        run.redeliveries += result.redeliveries;
        if !result.violations.is_empty() {
            run.found = Some((run.rounds, started.elapsed().as_secs_f64()));
            run.invariants = invariant_names(&result.violations);
            break;
        }
    }
    run.elapsed = started.elapsed().as_secs_f64();
    Ok(run)
}

fn baseline(rt: &Runtime, bed: &TestBed, detections: &[Detection]) -> anyhow::Result<()> {
    println!(
        "\n## 3. Baseline stress test: {} workers (2 on v1, 2 on v2, free running, sleeps 0-{MAX_POLL_PAUSE_MS} ms between polls),",
        BASE_WORKERS.len()
    );
    println!(
        "##    {IDENTICAL_REQUESTS} concurrent identical requests per round (+{SAME_INPUT_REQUESTS} same-input requests and a cutover to v2 half way for the cache defects),"
    );
    println!(
        "##    visibility {BASE_VISIBILITY:?}, backend timeout {BASE_BACKEND_TIMEOUT:?}, lease {BASE_LEASE:?}; invariants checked at the end of each round; seeds 0..{BASELINE_SEEDS}"
    );
    println!(
        "##    budget per seed = racecert's mean detection time, at least {MIN_BUDGET:?}; a round started within the budget runs to its end"
    );

    // Calibration: the correct worker must not trip the baseline's own checks.
    for (cache_traffic, what) in [(false, "plain rounds"), (true, "cutover rounds")] {
        let run = baseline_seed(
            rt,
            bed,
            if cache_traffic { "refcut" } else { "ref" },
            &Defects::none(),
            cache_traffic,
            0,
            CALIBRATION_BUDGET,
        )?;
        println!(
            "reference worker, {what:<14}: {} rounds in {:.2} s, {} (redeliveries {}, unsettled rounds {}, worker errors {})",
            run.rounds,
            run.elapsed,
            match run.found {
                Some((round, _)) => format!("FALSE ALARM in round {round}: {}", run.invariants),
                None => "no violation".into(),
            },
            run.redeliveries,
            run.unsettled,
            run.worker_errors
        );
        for error in &run.errors {
            println!("  round error: {error}");
        }
        for detail in &run.unsettled_details {
            println!("  unsettled round {detail}");
        }
    }

    println!(
        "{:<24} {:>7}  {:<58} {:>9} {:>9} {:>9}",
        "defect",
        "budget",
        "baseline per seed (yes/late: round/seconds)",
        "in budget",
        "+overrun",
        "racecert"
    );
    let mut never = Vec::new();
    for d in detections {
        let budget = d.budget();
        let defects = Defects::of([d.defect]);
        let mut cells = Vec::new();
        let (mut in_budget, mut with_overrun) = (0, 0);
        let mut redeliveries = 0;
        let mut notes = BTreeSet::new();
        let mut details = Vec::new();
        for seed in 0..BASELINE_SEEDS {
            let run = baseline_seed(
                rt,
                bed,
                d.defect.name(),
                &defects,
                is_cache_defect(d.defect),
                seed,
                budget,
            )?;
            redeliveries += run.redeliveries;
            details.extend(run.unsettled_details.iter().cloned());
            let on_time = run
                .found
                .is_some_and(|(_, secs)| secs <= budget.as_secs_f64());
            in_budget += usize::from(on_time);
            with_overrun += usize::from(run.found.is_some());
            cells.push(match run.found {
                Some((round, secs)) => format!(
                    "s{seed}:{} r{round}/{secs:.2}s",
                    if on_time { "yes" } else { "late" },
                ),
                None => format!("s{seed}:no {}r/{:.1}s", run.rounds, run.elapsed),
            });
            if !run.invariants.is_empty() {
                notes.insert(run.invariants.clone());
            }
            if run.unsettled > 0 {
                notes.insert(format!("s{seed}: {} unsettled round(s)", run.unsettled));
            }
            if let Some(first) = run.errors.first() {
                notes.insert(format!(
                    "s{seed}: {} round error(s), first: {first}",
                    run.errors.len()
                ));
            }
        }
        if with_overrun == 0 {
            never.push(d.defect);
        }
        println!(
            "{:<24} {:>6.2}s  {:<58} {:>7}/{:<1} {:>7}/{:<1} {:>6}/{:<2}  redeliveries {redeliveries}{}{}",
            d.defect.name(),
            budget.as_secs_f64(),
            cells.join("  "),
            in_budget,
            BASELINE_SEEDS,
            with_overrun,
            BASELINE_SEEDS,
            d.detected(),
            DETECTION_SEEDS,
            if notes.is_empty() { "" } else { "; " },
            notes.into_iter().collect::<Vec<_>>().join("; ")
        );
        for detail in details {
            println!("  unsettled round {detail}");
        }
    }

    // Is a miss a matter of time? Give the baseline a much longer budget where it always missed.
    if !never.is_empty() {
        println!(
            "extended baseline, seed {EXTENDED_SEED}, budget {EXTENDED_BUDGET:?}, for the defects it missed on every seed:"
        );
    }
    for defect in never {
        let run = baseline_seed(
            rt,
            bed,
            &format!("{}-ext", defect.name()),
            &Defects::of([defect]),
            is_cache_defect(defect),
            EXTENDED_SEED,
            EXTENDED_BUDGET,
        )?;
        println!(
            "{:<24} {} rounds in {:.1} s: {} (redeliveries {}, worker errors {}, round errors {})",
            defect.name(),
            run.rounds,
            run.elapsed,
            match run.found {
                Some((round, secs)) => {
                    format!("found in round {round} at {secs:.2} s: {}", run.invariants)
                }
                None => "no violation".into(),
            },
            run.redeliveries,
            run.worker_errors,
            run.errors.len()
        );
        for detail in &run.unsettled_details {
            println!("  unsettled round {detail}");
        }
    }
    Ok(())
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
    baseline(rt, bed, &detections)
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
