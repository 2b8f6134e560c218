//! Wire schedules benchmark (issue 13): how many wire schedules per second the Python example
//! worker runs at, and, per defect of the Python example, how soon wire schedules find it against
//! the free-running chaos fleet given the same time.
//!
//! `cargo bench --bench wire [-- [LAST [FIRST]] [FLAG..] [--no-rate] [--full]]`: seeds FIRST..=LAST
//! (1..=10 by default), only the defects whose flag is given (`unfenced`, `read-then-write`),
//! without part 1 with `--no-rate`, part 1 over the default search's whole 90 s (not its first 60
//! cases) with `--full`. It prints numbers and asserts nothing:
//! 0. what one start of the Python worker costs, wall and CPU (each case that crashes a worker
//!    waits for its restart);
//! 1. wire schedules per second of the safe Python worker (the default search: depth-2 enumeration,
//!    depth-3 schedules at the conflict points, then PCT at depth 3), on processes kept from case
//!    to case, and of the same search on the reference worker (`racecert worker`), which starts
//!    in milliseconds: the harness's own rate;
//! 2. per defect (`--read-then-write`, `--unfenced`) and seed: cases and seconds to the first
//!    failing wire case, the shrunk schedule's length, and whether its file replays with the same
//!    violation 10 times out of 10;
//! 3. the chaos fleet (`certify --worker-cmd` without wire schedules) on the same defect and seeds,
//!    one fleet run each (a run takes longer than the wire search's whole time to a failure).

use racecert::env::TestBed;
use racecert::runner::fleet::{FleetSettings, run_fleet};
use racecert::runner::wire::{WireSearch, WireSettings, run_wire, search};
use racecert::schedule::file::ScheduleFile;
use std::time::{Duration, Instant};

fn names(case: &racecert::check::CaseResult) -> Vec<String> {
    let mut names: Vec<String> = case
        .violations
        .iter()
        .map(|v| v.invariant.name().to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What to run: seeds, defects (flags of the example), whether to measure the rate.
struct Plan {
    seeds: std::ops::RangeInclusive<u64>,
    flags: Vec<&'static str>,
    rate: bool,
    /// Cases of the rate's search (0: the default search's whole time budget).
    rate_cases: u32,
}

async fn run(bed: &TestBed, plan: Plan) -> anyhow::Result<()> {
    let requirements = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/python-worker/requirements.txt");
    let venv = racecert::env::python::Venv::ensure(&requirements)?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python-worker/worker.py"
    );
    let python = format!("{} {script}", venv.python().display());

    if plan.rate {
        python_start(&venv.python(), std::path::Path::new(script))?;
        rate(bed, "safe Python worker", &python, plan.rate_cases).await?;
        // The same search on a worker that starts in milliseconds: what the harness itself runs
        // at, apart from the worker's start.
        let reference = format!("{} worker", env!("CARGO_BIN_EXE_racecert"));
        rate(
            bed,
            "reference worker (`racecert worker`, Rust)",
            &reference,
            plan.rate_cases,
        )
        .await?;
    }
    table(bed, &python, &plan).await
}

/// What one start of the Python worker costs, which every case that crashes a worker waits for
/// (its restart): wall and CPU time of `worker.py --help` (every import, then argparse exits),
/// over 5 starts.
fn python_start(python: &std::path::Path, script: &std::path::Path) -> anyhow::Result<()> {
    use nix::sys::resource::{UsageWho, getrusage};
    let cpu = || -> anyhow::Result<f64> {
        let usage = getrusage(UsageWho::RUSAGE_CHILDREN)?;
        let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
    };
    const STARTS: u32 = 5;
    let (cpu_before, started) = (cpu()?, Instant::now());
    for _ in 0..STARTS {
        let status = std::process::Command::new(python)
            .arg(script)
            .arg("--help")
            .stdout(std::process::Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "{} --help: {status}", script.display());
    }
    println!(
        "\n## 0. one start of the Python worker (its imports; {STARTS} starts): {:.0} ms wall, {:.0} ms CPU",
        started.elapsed().as_secs_f64() * 1e3 / f64::from(STARTS),
        (cpu()? - cpu_before) * 1e3 / f64::from(STARTS)
    );
    Ok(())
}

/// The machine's CPU time so far, busy and idle, in clock ticks (the first line of /proc/stat).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    Some((at(0) + at(1) + at(2) + at(5) + at(6) + at(7), at(3) + at(4)))
}

async fn rate(bed: &TestBed, worker: &str, command: &str, cases: u32) -> anyhow::Result<()> {
    println!(
        "\n## 1. wire schedules per second, {worker} (2 workers, 1 request; {})",
        if cases > 0 {
            format!("the first {cases} cases of the default search")
        } else {
            "the default search's whole budget, as `certify --worker-cmd` runs it".to_owned()
        }
    );
    let settings = WireSettings::pair(command);
    let mut plan = WireSearch::default_for(1);
    if cases > 0 {
        plan.cases = cases;
        plan.budget = Duration::from_secs(300);
    }
    let (started, ticks) = (Instant::now(), machine_ticks());
    // When each case ended, to show where the time goes: most cases are quick, and a few that end
    // with a job left open (its holder crashed or held it) wait for time to pass.
    let ends = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let report = {
        let ends = ends.clone();
        search(bed, &settings, &plan, move |_| {
            ends.lock().expect("case clock").push(Instant::now())
        })
        .await?
    };
    let wall = started.elapsed();
    println!(
        "{} cases in {:.1} s (search {:.1} s, with process start): {:.1} schedules/s; {} crashed a worker; failures: {}",
        report.cases_run,
        wall.as_secs_f64(),
        report.elapsed.as_secs_f64(),
        f64::from(report.cases_run) / report.elapsed.as_secs_f64(),
        report
            .coverage
            .faults
            .get(&racecert::fault::FaultKind::WorkerCrash)
            .map_or(0, |(applied, _)| *applied),
        report.found.is_some()
    );
    // How busy the whole machine was (workers, Redis, Postgres, the harness): how much of the
    // cores a faster search could still use.
    if let (Some((busy0, idle0)), Some((busy1, idle1))) = (ticks, machine_ticks()) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let share = (busy1 - busy0) as f64 / ((busy1 - busy0) + (idle1 - idle0)).max(1) as f64;
        println!(
            "machine busy over those {:.1} s: {:.2} of {cores} cores ({:.1} CPU-s)",
            wall.as_secs_f64(),
            share * cores,
            share * cores * wall.as_secs_f64()
        );
    }
    let ends = ends.lock().expect("case clock");
    let mut durations: Vec<Duration> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    durations.sort();
    if let (Some(median), Some(max)) = (durations.get(durations.len() / 2), durations.last()) {
        let slow: Vec<&Duration> = durations
            .iter()
            .filter(|d| **d >= Duration::from_millis(300))
            .collect();
        println!(
            "per case (from the end of one to the end of the next, {} cases): median {:.0} ms, 90th percentile {:.0} ms, max {:.0} ms; {} cases of 300 ms or more took {:.1} s of {:.1} s",
            durations.len(),
            median.as_secs_f64() * 1e3,
            durations[durations.len() * 9 / 10].as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            slow.len(),
            slow.into_iter().sum::<Duration>().as_secs_f64(),
            durations.iter().sum::<Duration>().as_secs_f64(),
        );
    }
    Ok(())
}

async fn table(bed: &TestBed, python: &str, plan: &Plan) -> anyhow::Result<()> {
    println!("\n## 2./3. time to the first failure per defect: wire schedules vs chaos fleet");
    println!(
        "| defect | seed | wire: cases | wire: s to failure | shrunk steps | replays same | invariants | fleet (1 run): found | fleet s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let dir = std::env::temp_dir().join(format!("racecert-wire-bench-{}", std::process::id()));
    for flag in &plan.flags {
        let command = format!("{python} {flag}");
        let settings = WireSettings::pair(&command);
        for seed in plan.seeds.clone() {
            let report = search(bed, &settings, &WireSearch::default_for(seed), |_| {}).await?;
            let (cases, after, steps, same, broke) = match &report.found {
                None => (report.cases_run, None, 0, 0, Vec::new()),
                Some(found) => {
                    let path = dir.join(format!("{}-{seed}.json", flag.trim_start_matches('-')));
                    settings.file(&found.shrunk).write(&path)?;
                    let file = ScheduleFile::read(&path)?;
                    let (replayed, schedule, trace) =
                        WireSettings::of_file(&file, Some(&command)).expect("a wire schedule file");
                    let broke = names(&found.shrunk.case);
                    let mut same = 0;
                    for _ in 0..10 {
                        let again = run_wire(bed, &replayed, schedule, Some(trace)).await?;
                        if again.divergence.is_none() && names(&again.case) == broke {
                            same += 1;
                        } else {
                            eprintln!(
                                "replay of {flag} seed {seed} differed: {:?} {:?}; notes {:?}",
                                again.divergence,
                                names(&again.case),
                                again.notes
                            );
                        }
                    }
                    (
                        found.found_after.0,
                        Some(found.found_after.1),
                        found.shrunk.schedule.steps.len(),
                        same,
                        broke,
                    )
                }
            };
            let fleet_started = Instant::now();
            let mut fleet = FleetSettings::mixed_fleet(&command, seed);
            fleet.defects = racecert::contract::defect::Defects::none();
            let result = run_fleet(bed, &fleet).await?;
            let fleet_found = names(&result.case);
            println!(
                "| {flag} | {seed} | {cases} | {} | {steps} | {same}/10 | {} | {} | {:.1} |",
                after
                    .map(|a| format!("{:.1}", a.as_secs_f64()))
                    .unwrap_or_else(|| "not found".into()),
                broke.join(", "),
                if fleet_found.is_empty() {
                    "no".to_owned()
                } else {
                    fleet_found.join(", ")
                },
                fleet_started.elapsed().as_secs_f64()
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let last = numbers.first().copied().unwrap_or(10);
    let first = numbers.get(1).copied().unwrap_or(1);
    let mut flags: Vec<&'static str> = ["--read-then-write", "--unfenced"]
        .into_iter()
        .filter(|f| args.iter().any(|a| a == f.trim_start_matches('-')))
        .collect();
    if flags.is_empty() {
        flags = vec!["--read-then-write", "--unfenced"];
    }
    let plan = Plan {
        seeds: first..=last,
        flags,
        rate: !args.iter().any(|a| a == "--no-rate"),
        rate_cases: if args.iter().any(|a| a == "--full") {
            0
        } else {
            60
        },
    };
    // RUST_LOG=racecert::runner::wire=debug shows each step's and each case end's time.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    println!("$ cargo bench --bench wire");
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Ctrl-C or SIGTERM stops the search after its case and cleans up (processes, containers).
    rt.block_on(async { racecert::cli::stop_on_signals() })?;
    let bed = rt.block_on(TestBed::builder().start())?;
    println!("test bed up in {:.2?}", bed.startup_time());
    let outcome = rt.block_on(run(&bed, plan));
    rt.block_on(bed.shutdown());
    outcome?;
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
