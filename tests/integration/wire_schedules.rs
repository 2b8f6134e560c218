//! Wire schedules (issue 13): worker processes interleaved at their round trips, with no change to
//! the workers. A Python worker whose final transition is a read then a write is caught, shrunk
//! and replayed from its file; the safe Python worker and `racecert worker` pass; the seed's race
//! (an unfenced final write) is found the same way.

use racecert::contract::defect::Defects;
use racecert::env::TestBed;
use racecert::runner::wire::{WireSearch, WireSettings, run_wire, search};
use racecert::schedule::file::ScheduleFile;

crate::tests!(
    the_read_then_write_variant_is_caught_shrunk_and_replayed_from_its_file,
    the_safe_python_worker_and_the_reference_worker_pass_wire_schedules,
    the_seeds_unfenced_write_is_found_through_wire_schedules,
    races_of_three_ordered_steps_are_found_at_depth_three,
    a_killed_worker_is_replaced_by_its_spare_at_every_point_of_its_job,
);

async fn python_command() -> anyhow::Result<String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/python-worker/worker.py"
    );
    let requirements = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/python-worker/requirements.txt");
    let venv =
        tokio::task::spawn_blocking(move || racecert::env::python::Venv::ensure(&requirements))
            .await??;
    Ok(format!("{} {script}", venv.python().display()))
}

fn names(outcome: &racecert::runner::wire::WireOutcome) -> Vec<String> {
    let mut names: Vec<String> = outcome
        .case
        .violations
        .iter()
        .map(|v| v.invariant.name().to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Seeds the test runs (the benchmark runs ten: BENCHMARKS.md).
const SEEDS: std::ops::RangeInclusive<u64> = 1..=3;

async fn the_read_then_write_variant_is_caught_shrunk_and_replayed_from_its_file(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _python = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let command = format!("{} --read-then-write", python_command().await?);
    let settings = WireSettings::pair(&command);
    let dir = std::env::temp_dir().join(format!("racecert-wire-test-{}", std::process::id()));
    for seed in SEEDS {
        let report = search(bed, &settings, &WireSearch::default_for(seed), |_| {}).await?;
        let found = report.found.ok_or_else(|| {
            anyhow::anyhow!(
                "seed {seed}: not caught in {} wire cases ({:.1?})",
                report.cases_run,
                report.elapsed
            )
        })?;
        let broke = names(&found.shrunk);
        anyhow::ensure!(
            broke
                .iter()
                .any(|n| n == "at-most-one-final-write" || n == "generations-increase"),
            "seed {seed}: broke {broke:?}"
        );
        anyhow::ensure!(
            found.shrunk.schedule.steps.len() <= 8,
            "seed {seed}: shrunk to {} steps:\n{}",
            found.shrunk.schedule.steps.len(),
            found.shrunk.schedule
        );
        let path = dir.join(format!("seed-{seed}.json"));
        settings.file(&found.shrunk).write(&path)?;
        let file = ScheduleFile::read(&path)?;
        let (replayed, schedule, trace) = WireSettings::of_file(&file, Some(&command))
            .ok_or_else(|| anyhow::anyhow!("not a wire schedule file"))?;
        for replay in 1..=2 {
            let again = run_wire(bed, &replayed, schedule, Some(trace)).await?;
            anyhow::ensure!(
                again.divergence.is_none(),
                "seed {seed} replay {replay}: {}",
                again.text("replay")
            );
            anyhow::ensure!(
                names(&again) == broke,
                "seed {seed} replay {replay}: broke {:?}, the file says {broke:?}\n{}",
                names(&again),
                again.text("replay")
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

async fn the_safe_python_worker_and_the_reference_worker_pass_wire_schedules(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _python = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let reference = format!("{} worker", env!("CARGO_BIN_EXE_racecert"));
    for command in [python_command().await?, reference] {
        let settings = WireSettings::pair(&command);
        let mut plan = WireSearch::default_for(7);
        plan.cases = 20;
        plan.budget = std::time::Duration::from_secs(600);
        let report = search(bed, &settings, &plan, |_| {}).await?;
        if let Some(found) = &report.found {
            anyhow::bail!("{command} must pass:\n{}", found.shrunk.text("failed case"));
        }
        anyhow::ensure!(
            report.cases_run == 20,
            "{command}: {} cases",
            report.cases_run
        );
        // The cases did interleave the workers at their round trips, and no hold outlasted a
        // worker's patience.
        let last = report
            .last
            .ok_or_else(|| anyhow::anyhow!("{command}: no case"))?;
        anyhow::ensure!(
            last.trace.iter().flatten().count() >= 8 && last.divergence.is_none(),
            "{command}: the last case released too little:\n{}",
            last.text("last case")
        );
        anyhow::ensure!(
            report.timeouts == 0,
            "{command}: {} case(s) with a held worker that timed out",
            report.timeouts
        );
    }
    Ok(())
}

async fn the_seeds_unfenced_write_is_found_through_wire_schedules(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _python = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    let command = format!("{} --unfenced", python_command().await?);
    // Through certify's own entry point, so the report's counterexample is checked too.
    let (outcome, report) = racecert::suite::certify::certify_external_wire(
        bed,
        &command,
        &WireSearch::default_for(1),
        &Defects::none(),
        None,
        |_| {},
    )
    .await?;
    let found = report
        .found
        .ok_or_else(|| anyhow::anyhow!("not found in {} wire cases", report.cases_run))?;
    let broke = names(&found.shrunk);
    anyhow::ensure!(
        broke
            .iter()
            .any(|n| n == "at-most-one-final-write" || n == "generations-increase"),
        "broke {broke:?}"
    );
    // The report counts the wire steps it prints, not the (empty) controlled schedule.
    let shown = outcome
        .counterexample
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no counterexample in the report"))?;
    let steps = found.shrunk.schedule.steps.len();
    anyhow::ensure!(steps > 0, "an empty wire schedule broke {broke:?}");
    anyhow::ensure!(
        shown.size() == format!("{steps} wire steps"),
        "the report says {:?} for {steps} wire steps",
        shown.size()
    );
    anyhow::ensure!(
        shown
            .schedule_lines()
            .lines()
            .filter(|l| l.trim_start().starts_with("step "))
            .count()
            == steps,
        "the report's schedule:\n{}",
        shown.schedule_lines()
    );
    Ok(())
}

/// Two bugs that need three ordered steps of two workers (A takes the job; its lease expires and B
/// takes it; A acts again while B still holds it): a lease renewed with `SET XX` and no token
/// check overwrites B's live lease; a final write fenced on the status alone lands over B's
/// IN_PROGRESS row with a generation that does not increase; a lease checked with GET and then
/// extended with PEXPIRE extends B's lease. The depth-2 enumeration lets B finish before A goes
/// on, so none shows there; the depth-3 one finds them.
async fn races_of_three_ordered_steps_are_found_at_depth_three(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _python = crate::PYTHON_WORKERS.lock().await;
    let _shared = bed.shared().await;
    for (flag, invariant) in [
        ("--renew-without-check", "lease-discipline"),
        ("--fence-on-status", "generations-increase"),
        // A job longer than the depth-2 enumeration's first runs (a stage mirrored into a hash
        // at every step): the check and the renew sit past its 14th round trip, where only the
        // points of the whole job reach.
        ("--renew-after-get --progress-hash", "lease-discipline"),
    ] {
        let command = format!("{} {flag}", python_command().await?);
        let settings = WireSettings::pair(&command);
        let report = search(bed, &settings, &WireSearch::default_for(1), |_| {}).await?;
        let found = report.found.ok_or_else(|| {
            anyhow::anyhow!("{flag}: not found in {} wire cases", report.cases_run)
        })?;
        let broke = names(&found.shrunk);
        anyhow::ensure!(
            broke.iter().any(|n| n == invariant),
            "{flag} must break {invariant}, broke {broke:?}:\n{}",
            found.shrunk.text("found")
        );
        eprintln!(
            "    {flag:<34} found at case {} after {:.1?}: {} ({} steps)",
            found.found_after.0,
            found.found_after.1,
            broke.join(", "),
            found.shrunk.schedule.steps.len()
        );
    }
    Ok(())
}

/// A worker killed while the schedule holds its next request, at every point of its job from
/// its take to its ack: the process started ahead takes its place (one start recorded, at the
/// kill), its round trips are recorded from then on, and the case ends with every invariant
/// held. (That the killed process's held request never reaches its server is the gate's and the
/// proxy's part: `a_killed_workers_held_requests_are_aborted_never_forwarded`,
/// `an_aborted_held_set_never_reaches_redis`.)
async fn a_killed_worker_is_replaced_by_its_spare_at_every_point_of_its_job(
    bed: &TestBed,
) -> anyhow::Result<()> {
    use racecert::fault::Fault;
    use racecert::schedule::{RequestSpec, Schedule, WireStep};
    let _shared = bed.shared().await;
    let command = format!("{} worker", env!("CARGO_BIN_EXE_racecert"));
    let settings = WireSettings::pair(&command);
    let killed = settings.workers[0].id.clone();
    for trips in 1..=8 {
        let schedule = Schedule {
            requests: vec![RequestSpec {
                request_id: "req-0".into(),
                input: "hello".into(),
            }],
            steps: vec![
                WireStep::Run { worker: 0, trips },
                WireStep::Fault(Fault::CrashWorker { worker: 0 }),
                WireStep::Finish { worker: 1 },
                WireStep::Finish { worker: 0 },
            ],
        };
        let outcome = run_wire(bed, &settings, &schedule, None).await?;
        let text = || outcome.text("case");
        anyhow::ensure!(
            outcome.case.violations.is_empty(),
            "killed after {trips} round trip(s):\n{}",
            text()
        );
        let events = &outcome.case.history.events;
        let starts: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| started(e, &killed))
            .map(|(i, _)| i)
            .collect();
        let [kill] = starts[..] else {
            anyhow::bail!(
                "killed after {trips} round trip(s): {} start(s) of {killed}:\n{}",
                starts.len(),
                text()
            );
        };
        anyhow::ensure!(
            events[kill..].iter().any(|e| crashed(e, &killed)),
            "killed after {trips} round trip(s): no crash recorded after the start:\n{}",
            text()
        );
        let before: std::collections::HashSet<_> = events[..kill]
            .iter()
            .filter_map(|e| connection(e, &killed))
            .collect();
        let replacement = events[kill..]
            .iter()
            .filter_map(|e| connection(e, &killed))
            .filter(|conn| !before.contains(conn))
            .count();
        anyhow::ensure!(
            replacement > 0,
            "killed after {trips} round trip(s): no round trip of the replacement recorded:\n{}",
            text()
        );
    }
    Ok(())
}

fn started(event: &racecert::history::Event, worker: &str) -> bool {
    use racecert::history::{EventKind, Observation};
    matches!(&event.kind, EventKind::Harness(Observation::WorkerStarted { worker: w, .. }) if w == worker)
}

fn crashed(event: &racecert::history::Event, worker: &str) -> bool {
    use racecert::fault::Effect;
    use racecert::history::EventKind;
    matches!(&event.kind, EventKind::Fault(Effect::WorkerCrashed { worker: w, .. }) if w == worker)
}

/// The connection (link, number) of a round trip of `worker`.
fn connection(event: &racecert::history::Event, worker: &str) -> Option<(String, u64)> {
    match &event.kind {
        racecert::history::EventKind::Wire(wire) if wire.worker == worker => {
            Some((wire.trip.link.clone(), wire.trip.conn))
        }
        _ => None,
    }
}
