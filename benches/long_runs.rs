//! Long runs: does racecert stay clean and flat when it runs for a long time?
//!
//! `cargo bench --bench long_runs [-- --cases N --fleet-runs M]` (defaults 10,000 and 20). On one
//! test bed, in one process:
//! 1. N controlled cases of the reference worker across the shipped suites (N split evenly, in
//!    name order; the suites' time budgets lifted so every case runs), counting violations;
//! 2. M consecutive `certify --worker-cmd` fleet runs of the safe Python example worker
//!    (`examples/python-worker/worker.py`, in the environment `env::python` provisions), each one
//!    round with its own seed, counting violations and worker processes left after each run;
//! 3. the bed removed, then racecert containers of this process left, and worker processes left.
//!
//! The process's resident memory (VmRSS) and its live heap (bytes allocated and not yet freed,
//! counted by a wrapper around the system allocator) are sampled at the start, after the bed is
//! up, after each suite and each fleet run, and at the end. The two together tell a leak (the
//! live heap grows: something is kept) from the allocator's high water (RSS grows over a flat
//! live heap: freed memory the allocator keeps for reuse). It prints numbers and asserts nothing;
//! BENCHMARKS.md has the results with the command.

use racecert::contract::defect::Defects;
use racecert::env::{TestBed, python::Venv, reaper};
use racecert::suite::certify::{CertifyOptions, certify, certify_external};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Bytes allocated and not yet freed, process-wide.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes.
struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; the counter only observes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The live heap, MiB.
fn heap_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Processes whose command line contains `needle` (this process excepted).
fn processes(needle: &str) -> Vec<String> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then(|| format!("{pid} {cmdline}"))
        })
        .collect()
}

fn arg(name: &str, default: u32) -> u32 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// RSS and live heap (MiB) sampled after each step of a phase.
#[derive(Default)]
struct Samples {
    rss: Vec<f64>,
    heap: Vec<f64>,
}

impl Samples {
    /// Takes one sample of each.
    fn take(&mut self) {
        self.rss.push(rss_mib());
        self.heap.push(heap_mib());
    }
}

fn main() -> anyhow::Result<()> {
    let total_cases = arg("--cases", 10_000);
    let fleet_runs = arg("--fleet-runs", 20);
    let rss_start = rss_mib();
    let heap_start = heap_mib();
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let bed = runtime.block_on(async { TestBed::builder().start().await })?;
    let rss_bed = rss_mib();
    let heap_bed = heap_mib();
    println!(
        "long runs: {total_cases} reference cases, {fleet_runs} fleet runs; test bed {} up in {:.1?}; RSS {rss_start:.1} MiB at start, {rss_bed:.1} MiB with the bed; live heap {heap_start:.1} and {heap_bed:.1} MiB",
        bed.id(),
        bed.startup_time()
    );

    let cases = reference_cases(&runtime, &bed, total_cases)?;

    // 2. Consecutive fleet runs of the safe Python worker.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = Venv::ensure(&root.join("examples/python-worker/requirements.txt"))?;
    let script = root.join("examples/python-worker/worker.py");
    let command = format!("{} {}", venv.python().display(), script.display());
    let needle = script.display().to_string();
    let fleet = safe_fleet_runs(&runtime, &bed, &command, &needle, fleet_runs)?;

    // 3. Leftovers once the bed is gone.
    let me = reaper::Owner::current();
    runtime.block_on(bed.shutdown());
    let containers = reaper::list_managed()?
        .into_iter()
        .filter(|c| c.owner == me)
        .count();
    let workers_left = processes(&needle).len();
    let rss_end = rss_mib();
    let heap_end = heap_mib();
    let first = |v: &[f64]| v.first().copied().unwrap_or(0.0);
    let last = |v: &[f64]| v.last().copied().unwrap_or(0.0);
    println!(
        "after: {containers} containers of this process, {workers_left} worker processes; total {:.0}s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "RSS MiB: start {rss_start:.1}, bed up {rss_bed:.1}, after the first suite {:.1}, after the last suite {:.1}, after the first fleet run {:.1}, after the last fleet run {:.1}, end {rss_end:.1}",
        first(&cases.rss),
        last(&cases.rss),
        first(&fleet.rss),
        last(&fleet.rss)
    );
    println!(
        "live heap MiB: start {heap_start:.1}, bed up {heap_bed:.1}, after the first suite {:.1}, after the last suite {:.1}, after the first fleet run {:.1}, after the last fleet run {:.1}, end {heap_end:.1}",
        first(&cases.heap),
        last(&cases.heap),
        first(&fleet.heap),
        last(&fleet.heap)
    );
    Ok(())
}

/// 1. Reference cases across the shipped suites; memory sampled after each suite.
fn reference_cases(
    runtime: &tokio::runtime::Runtime,
    bed: &TestBed,
    total_cases: u32,
) -> anyhow::Result<Samples> {
    let mut suites = racecert::suite::shipped();
    suites.sort_by(|a, b| a.suite.name.cmp(&b.suite.name));
    let per = total_cases / suites.len() as u32;
    let extra = total_cases % suites.len() as u32;
    let (mut cases_run, mut violations) = (0u32, 0usize);
    let mut samples = Samples::default();
    let phase = Instant::now();
    for (index, mut loaded) in suites.into_iter().enumerate() {
        let cases = per + u32::from((index as u32) < extra);
        // Every case runs: a fixed case count spends no time budget.
        loaded.time_budget = None;
        let options = CertifyOptions {
            cases: Some(cases),
            ..CertifyOptions::default()
        };
        let suite_started = Instant::now();
        let report = runtime.block_on(certify(
            bed,
            std::slice::from_ref(&loaded),
            &options,
            |_, _| {},
        ))?;
        for outcome in &report.suites {
            cases_run += outcome.cases_run;
            let broken = outcome
                .counterexample
                .as_ref()
                .map_or(0, |c| c.violations.len());
            violations += broken;
            println!(
                "  {:<24} {:>6} cases {:>7.1}s  violations {broken}{}  RSS {:.1} MiB  heap {:.1} MiB",
                outcome.name,
                outcome.cases_run,
                suite_started.elapsed().as_secs_f64(),
                outcome
                    .error
                    .as_ref()
                    .map(|e| format!(" (harness error: {e})"))
                    .unwrap_or_default(),
                rss_mib(),
                heap_mib()
            );
        }
        samples.take();
    }
    let cases_secs = phase.elapsed().as_secs_f64();
    println!(
        "reference: {cases_run} cases in {cases_secs:.0}s ({:.1} cases/s), {violations} violations",
        f64::from(cases_run) / cases_secs
    );
    Ok(samples)
}

/// `fleet_runs` consecutive one-round fleet runs of `command`, each with its own seed, counting
/// violations and the worker processes (command lines holding `needle`) left after each;
/// memory sampled after each run.
fn safe_fleet_runs(
    runtime: &tokio::runtime::Runtime,
    bed: &TestBed,
    command: &str,
    needle: &str,
    fleet_runs: u32,
) -> anyhow::Result<Samples> {
    let (mut fleet_violations, mut fleet_left, mut fleet_held) = (0usize, 0usize, 0u32);
    let mut samples = Samples::default();
    let phase = Instant::now();
    for run in 0..fleet_runs {
        let run_started = Instant::now();
        let outcome = runtime.block_on(certify_external(
            bed,
            command,
            1,
            1 + u64::from(run),
            &Defects::none(),
            |_| {},
        ))?;
        let broken: Vec<String> = outcome
            .counterexample
            .iter()
            .flat_map(|c| c.violations.iter().map(|v| v.invariant.clone()))
            .collect();
        fleet_violations += broken.len();
        fleet_held += u32::from(outcome.held);
        let left = processes(needle);
        fleet_left += left.len();
        samples.take();
        println!(
            "  fleet run {:>2}: {:>5.1}s  {}  worker processes left {}  RSS {:.1} MiB  heap {:.1} MiB",
            run + 1,
            run_started.elapsed().as_secs_f64(),
            if broken.is_empty() {
                "held".to_owned()
            } else {
                format!("violated {broken:?}")
            },
            left.len(),
            rss_mib(),
            heap_mib()
        );
    }
    let fleet_secs = phase.elapsed().as_secs_f64();
    println!(
        "fleet: {fleet_runs} runs in {fleet_secs:.0}s, {fleet_held} held, {fleet_violations} violations, {fleet_left} worker processes left over all runs"
    );
    Ok(samples)
}
