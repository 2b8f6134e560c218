//! Integration tests against the real test bed: Redis and PostgreSQL in containers, every
//! connection through the fault proxy, wiremock model backends.
//!
//! One binary, one test bed: `main` starts it once, runs every test (in parallel, isolated by key
//! namespaces and dedicated proxies; container restarts take the bed's exclusive lock), then
//! removes the bed and checks that no container of this process is left. libtest-mimic gives the
//! usual `cargo test` interface (filters, --list, --test-threads) with a main of our own, which
//! the built-in harness cannot offer: statics are never dropped, so a bed shared through one would
//! leak its containers.

mod backends;
mod browser;
mod ci_docs;
mod cleanup;
mod cli;
mod errors;
mod external;
mod fenced_write;
mod fleet;
mod harness;
mod lease;
mod network;
mod pipeline;
mod proxy_faults;
mod replay;
mod restart;
mod signals;
mod systems;
mod wire;
mod wire_schedules;

use libtest_mimic::{Arguments, Failed, Trial};
use racecert::env::{TestBed, TestBedBuilder, reaper};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A test: an async function over the shared bed.
pub type TestFn =
    for<'a> fn(&'a TestBed) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// Lists tests of a module as (name, function).
#[macro_export]
macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        pub fn tests() -> Vec<(&'static str, $crate::TestFn)> {
            vec![$((
                concat!(module_path!(), "::", stringify!($name)),
                (|bed| Box::pin($name(bed))) as $crate::TestFn,
            )),*]
        }
    };
}

/// Tests that start the Python example's `worker.py` processes run one at a time: the fleet
/// tests count leftover `worker.py` processes by name, and another test's live workers would be
/// taken for leftovers (seen in CI: a fleet test beside a wire-schedule test).
pub static PYTHON_WORKERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A namespace unique to one test, for its Redis keys and idempotency keys.
pub fn namespace(test: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{test}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The long tier: every framework variant, repeats, long runs, the apalis example's own `cargo
/// test`. `cargo test` skips them (they show as ignored); `cargo test -- --include-ignored` runs
/// them too, and CI does (README, "Tests and CI"). What stays in the fast tier covers each runner
/// and each framework once, the CLI, signals and errors.
const LONG: &[&str] = &[
    "harness::every_defect_is_caught_within_256_cases",
    "harness::the_reference_worker_passes_every_suite",
    "harness::running_cases_concurrently_finds_and_shrinks_the_same_failure",
    "harness::a_chaos_run_of_the_reference_fleet_holds_every_invariant",
    "replay::a_logfmt_double_write_reproduces",
    "replay::a_json_lease_expiry_with_a_truncated_line_reproduces",
    "replay::a_nested_json_stale_cache_after_cutover_reproduces",
    "replay::a_celery_visibility_timeout_double_execution_reproduces",
    "replay::a_lost_job_reproduces",
    "replay::a_retry_under_a_new_job_id_reproduces",
    "replay::given_defects_replace_each_causes_own",
    "fleet::the_python_example_worker_passes_and_its_unfenced_variant_is_caught",
    "fleet::the_python_examples_lease_and_cache_bugs_are_caught_on_the_wire",
    "wire_schedules::the_read_then_write_variant_is_caught_shrunk_and_replayed_from_its_file",
    "wire_schedules::the_safe_python_worker_and_the_reference_worker_pass_wire_schedules",
    "wire_schedules::races_of_three_ordered_steps_are_found_at_depth_three",
    "systems::celery_fenced_passes_every_celery_fault",
    "systems::celery_prefetch_restore_catches_naive_and_fenced_passes",
    "systems::celery_incident_log_replays_on_the_team_system",
    "systems::celery_lock_takeover_is_caught_on_the_wire_by_its_lock_keys",
    "systems::apalis_example_certifies_itself_from_its_own_cargo_test_and_its_files",
    "systems::celery_fenced_but_acked_loses_a_job_when_its_pool_child_is_killed",
    "systems::celery_submitted_by_the_teams_own_command_with_spaces_in_the_input",
    "systems::celery_retry_after_an_upstream_timeout_or_a_resubmission_writes_twice_and_fenced_passes",
    "systems::celery_a_worker_that_keeps_consuming_after_its_stop_signal_is_caught_and_fenced_drains",
    "systems::celery_a_late_invalidation_is_caught_and_the_versioned_cache_passes_every_rollout_fault",
    "systems::celery_a_stale_cache_incident_log_replays_on_the_team_system",
    "systems::celery_a_backend_switch_under_a_running_worker_is_caught_where_the_row_keeps_its_own_version",
    "systems::dramatiq_a_timed_out_actor_without_retries_loses_its_job_and_one_retrying_at_once_passes",
    "systems::dramatiq_the_time_limit_drops_a_late_answer_the_safe_actor_retries_and_the_lost_one_loses_it",
    "systems::celery_a_late_attempt_retrying_its_refused_write_for_ever_is_a_stuck_delivery",
    "ci_docs::the_gitlab_parallel_job_in_docs_ci_runs_and_merges",
];

struct Fixture {
    runtime: tokio::runtime::Runtime,
    bed: TestBed,
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let all: Vec<(&'static str, TestFn)> = [
        lease::tests(),
        pipeline::tests(),
        fenced_write::tests(),
        harness::tests(),
        proxy_faults::tests(),
        backends::tests(),
        replay::tests(),
        restart::tests(),
        network::tests(),
        external::tests(),
        fleet::tests(),
        cleanup::tests(),
        cli::tests(),
        signals::tests(),
        errors::tests(),
        ci_docs::tests(),
        wire::tests(),
        wire_schedules::tests(),
        systems::tests(),
    ]
    .into_iter()
    .flatten()
    .map(|(name, f)| (name.trim_start_matches("integration::"), f))
    .collect();

    let long = |name: &str| LONG.contains(&name);
    // A name in the long tier that names no test would quietly move nothing.
    if let Some(stray) = LONG
        .iter()
        .find(|l| !all.iter().any(|(name, _)| name == *l))
    {
        eprintln!("LONG names no test: {stray}");
        return std::process::ExitCode::FAILURE;
    }
    if args.list {
        let trials = all
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())).with_ignored_flag(long(name)))
            .collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let bed = match runtime.block_on(async { TestBedBuilder::from_env()?.start().await }) {
        Ok(bed) => bed,
        Err(err) => {
            eprintln!("cannot start the test bed: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    eprintln!(
        "test bed {} up in {:.1?} ({})",
        bed.id(),
        bed.startup_time(),
        bed.toxiproxy().url()
    );
    let fixture = Arc::new(Fixture { runtime, bed });

    let trials = all
        .into_iter()
        .map(|(name, test)| {
            let fixture = fixture.clone();
            Trial::test(name, move || {
                let Fixture { runtime, bed } = &*fixture;
                let started = std::time::Instant::now();
                let outcome = runtime
                    .block_on(test(bed))
                    .map_err(|err| Failed::from(format!("{err:#}")));
                // Where the time goes, for the tiers (README, "Tests and CI").
                let took = started.elapsed();
                if took > std::time::Duration::from_secs(10) {
                    eprintln!("    {name} took {:.0} s", took.as_secs_f64());
                }
                outcome
            })
            .with_ignored_flag(long(name))
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);

    let Ok(Fixture { runtime, bed }) = Arc::try_unwrap(fixture) else {
        eprintln!("a test still holds the test bed");
        return std::process::ExitCode::FAILURE;
    };
    runtime.block_on(bed.shutdown());
    // The whole run must leave no container of this process behind.
    let me = reaper::Owner::current();
    match reaper::list_managed() {
        Ok(left) => {
            let mine: Vec<_> = left.iter().filter(|c| c.owner == me).collect();
            if !mine.is_empty() {
                eprintln!("containers left behind by this run: {mine:?}");
                return std::process::ExitCode::FAILURE;
            }
        }
        Err(err) => {
            eprintln!("cannot list containers after the run: {err}");
            return std::process::ExitCode::FAILURE;
        }
    }
    conclusion.exit_code()
}
