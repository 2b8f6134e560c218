//! Certifying workers racecert did not write, from the outside: worker processes under the
//! contract's environment, with SIGKILL, SIGSTOP/SIGCONT and rolling restarts.

use racecert::contract::defect::{Defect, Defects};
use racecert::env::TestBed;
use racecert::fault::FaultKind;
use racecert::report::{SuiteOutcome, Verdict};
use racecert::runner::fleet::FleetSettings;
use racecert::suite::certify::{certify_external, certify_fleet};

crate::tests!(
    the_reference_worker_process_passes_and_its_unfenced_defect_is_caught,
    the_python_example_worker_passes_and_its_unfenced_variant_is_caught,
    the_python_examples_lease_and_cache_bugs_are_caught_on_the_wire,
    a_lease_no_pause_outlasts_leaves_lease_expiry_unlanded_and_the_run_inconclusive,
    a_job_lost_only_when_its_holder_is_killed_is_caught_by_the_aimed_crash,
);

/// The Python example's script and the interpreter of its own environment (the test provisions
/// it: created once, cached by its requirements).
async fn python_worker() -> anyhow::Result<(&'static str, String)> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python-worker/worker.py"
    );
    let requirements = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/python-worker/requirements.txt");
    let venv =
        tokio::task::spawn_blocking(move || racecert::env::python::Venv::ensure(&requirements))
            .await??;
    Ok((script, venv.python().display().to_string()))
}

fn broken(outcome: &SuiteOutcome) -> Vec<String> {
    let names: std::collections::BTreeSet<String> = outcome
        .counterexample
        .iter()
        .flat_map(|c| c.violations.iter().map(|v| v.invariant.clone()))
        .collect();
    names.into_iter().collect()
}

/// No worker process of this command may outlive its run.
fn leftovers(pattern: &str) -> anyhow::Result<Vec<String>> {
    let output = std::process::Command::new("pgrep")
        .arg("-af")
        .arg(pattern)
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(str::to_owned)
        .collect())
}

async fn check_pair(
    bed: &TestBed,
    command: &str,
    bad_command: &str,
    defects: Defects,
) -> anyhow::Result<()> {
    let good = certify_external(bed, command, 2, 1, &Defects::none(), |_| {}).await?;
    anyhow::ensure!(
        good.held && good.cases_run == 2,
        "{command} must pass: {:?}\n{}",
        broken(&good),
        good.counterexample
            .as_ref()
            .map(|c| c.timeline.as_str())
            .unwrap_or("")
    );
    anyhow::ensure!(
        !good.worker_outputs.is_empty()
            && good
                .worker_outputs
                .values()
                .any(|(out, _)| out.contains("status=")),
        "worker stdout is kept in the report"
    );
    let bad = certify_external(bed, bad_command, 4, 1, &defects, |_| {}).await?;
    let invariants = broken(&bad);
    anyhow::ensure!(
        invariants
            .iter()
            .any(|i| i == "at-most-one-final-write" || i == "generations-increase"),
        "{bad_command} must break at-most-one-final-write or generations-increase, broke {invariants:?} in {} run(s)",
        bad.cases_run
    );
    Ok(())
}

async fn the_reference_worker_process_passes_and_its_unfenced_defect_is_caught(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let command = format!("{} worker", env!("CARGO_BIN_EXE_racecert"));
    check_pair(
        bed,
        &command,
        &command,
        Defects::of([Defect::UnfencedFinalWrite]),
    )
    .await?;
    let left = leftovers(&command)?;
    anyhow::ensure!(
        left.is_empty(),
        "worker processes outlived their runs: {left:?}"
    );
    Ok(())
}

async fn the_python_example_worker_passes_and_its_unfenced_variant_is_caught(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _one_fleet = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let (script, python) = python_worker().await?;
    let command = format!("{python} {script}");
    check_pair(
        bed,
        &command,
        &format!("{command} --unfenced"),
        Defects::none(),
    )
    .await?;
    let left = leftovers(script)?;
    anyhow::ensure!(
        left.is_empty(),
        "python workers outlived their runs: {left:?}"
    );
    Ok(())
}

/// Bugs a worker's log cannot show (it still says `lease_acquired`, `lease_released`,
/// `cache_written`), caught from what it sent to Redis: each flag of the Python example against
/// the invariant it breaks.
async fn the_python_examples_lease_and_cache_bugs_are_caught_on_the_wire(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _one_fleet = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let (script, python) = python_worker().await?;
    for (flag, invariant) in [
        ("--release-without-check", "lease-discipline"),
        ("--lease-without-nx", "lease-discipline"),
        ("--cache-active-namespace", "no-cross-version-cache-entry"),
    ] {
        let command = format!("{python} {script} {flag}");
        // Up to 8 fleet runs: the chaos fleet finds these by timing (a paused worker waking
        // while another holds its job; a redelivery meeting a live lease), not by schedule.
        let outcome = certify_external(bed, &command, 8, 1, &Defects::none(), |_| {}).await?;
        let invariants = broken(&outcome);
        anyhow::ensure!(
            invariants.iter().any(|i| i == invariant),
            "{flag} must break {invariant}, broke {invariants:?} in {} run(s)",
            outcome.cases_run
        );
        eprintln!(
            "    {flag:<26} caught in run {}: {}",
            outcome.cases_run,
            invariants.join(", ")
        );
    }
    let left = leftovers(script)?;
    anyhow::ensure!(
        left.is_empty(),
        "python workers outlived their runs: {left:?}"
    );
    Ok(())
}

/// A worker whose leases last 20 minutes: the fleet's pauses (a few seconds) never outlast one, so
/// lease-expiry may be *sent* every run but never *lands*, and the run must say so: landed 0,
/// INCONCLUSIVE, not PASSED. (Counting the pause of a job holder as an expiry would pass it.) A
/// fleet of pauses only: with crashes as well, the same worker fails outright, its crashed
/// holder's job stuck behind a 20-minute lease (no-lost-job).
async fn a_lease_no_pause_outlasts_leaves_lease_expiry_unlanded_and_the_run_inconclusive(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _one_fleet = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let (script, python) = python_worker().await?;
    let command = format!("{python} {script} --long-lease");
    let mut settings = FleetSettings::mixed_fleet(&command, 1);
    settings.faults = vec![FaultKind::LeaseExpiry];
    let outcome = certify_fleet(bed, &settings, 1, |_| {}).await?;
    let lease = outcome
        .coverage
        .iter()
        .find(|row| row.fault == "lease-expiry")
        .ok_or_else(|| anyhow::anyhow!("no lease-expiry row: {:?}", outcome.coverage))?;
    anyhow::ensure!(
        outcome.held && lease.applied > 0 && lease.landed == 0,
        "lease-expiry must be applied and never land: {lease:?} (held: {})",
        outcome.held
    );
    anyhow::ensure!(
        outcome.verdict() == Verdict::Inconclusive
            && outcome.not_covered.contains(&"lease-expiry".to_owned()),
        "the verdict must be INCONCLUSIVE naming lease-expiry: {:?} {:?}",
        outcome.verdict(),
        outcome.not_covered
    );
    Ok(())
}

/// A worker that acks a job when it takes it: only a kill of the worker holding the job loses it.
/// The fleet's crash is aimed at a job holder, so one run finds it (no-lost-job).
async fn a_job_lost_only_when_its_holder_is_killed_is_caught_by_the_aimed_crash(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _one_fleet = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let (script, python) = python_worker().await?;
    let command = format!("{python} {script} --ack-on-receive");
    let outcome = certify_external(bed, &command, 2, 1, &Defects::none(), |_| {}).await?;
    let invariants = broken(&outcome);
    anyhow::ensure!(
        invariants.iter().any(|i| i == "no-lost-job"),
        "--ack-on-receive must break no-lost-job, broke {invariants:?} in {} run(s)",
        outcome.cases_run
    );
    let crash = outcome
        .coverage
        .iter()
        .find(|row| row.fault == "worker-crash");
    anyhow::ensure!(
        crash.is_some_and(|row| row.landed > 0),
        "the crash landed on a job holder: {crash:?}"
    );
    Ok(())
}
