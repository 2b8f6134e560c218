//! # racecert
//!
//! A fault-injection test harness that certifies inference workers (API -> queue -> worker ->
//! model backend -> cache -> result store) against the races of a model-backend rollout: version
//! skew between workers, retries without dedupe, late writes that overwrite newer results, stale
//! caches. Workers run against **real** Redis and PostgreSQL in containers, every connection goes
//! through a Toxiproxy fault proxy, and each model version is a wiremock backend.
//!
//! ## Map of the modules, bottom layer first
//! No module imports a layer above it (the `layering` test below checks it).
//! - [`contract`]: what every worker under test agrees to: schema (jobs table + audit trigger),
//!   Redis key names ([`contract::layout`]), job statuses and log lines ([`contract::log`]),
//!   checkpoints, deliveries, defects, and the [`contract::worker`] trait a team implements.
//! - [`fault`]: the fault vocabulary and the one place faults are applied ([`fault::apply`]).
//! - [`env`](mod@env): the test bed: images built offline, containers, the fault proxy (Toxiproxy's
//!   API on the vendored noxious engine), the wiremock model backends, per-worker links whose round
//!   trips are framed on the wire ([`env::wire`], [`env::links`]), Python environments, the reaper.
//! - [`reference`](mod@reference): the seed's pipeline done right (submit, queue, worker,
//!   cutover), one implementation of the contract, with a switch per root cause.
//! - [`history`]: what happened, in real order: the one [`history::Recorder`] every runner uses,
//!   the audit trail, the backend journals, the wire events.
//! - [`check`]: the invariants, each with the evidence that proves a violation; fault coverage.
//! - [`schedule`]: runners that produce a history: controlled (deterministic, at checkpoints),
//!   chaos (free-running, in process), fleet (worker processes); proptest exploration with
//!   shrinking; schedule files.
//! - [`report`]: terminal, JSON, JUnit XML and HTML/SVG reports.
//! - [`system`]: system descriptions (TOML file or Rust builder) of workers racecert did not
//!   write, and the framework presets (Celery, apalis).
//! - [`suite`]: suite files and the certify runner.
//! - [`replay`]: incident logs -> story, diagnoses with their lines, schedules that reproduce them.
//! - [`smoke`]: the smoke scenario behind `racecert smoke`; [`error`], [`interrupt`]: the error
//!   type and Ctrl-C / SIGTERM handling.
//!
//! ## Where to find it, in one hop
//! | looking for | here |
//! |---|---|
//! | a fault (what a schedule can inject) | [`fault::Fault`], its kinds [`fault::FaultKind`] |
//! | an invariant (what must hold) | [`check::Invariant`], judged by [`check::check`] |
//! | a checkpoint (where the controller can hold a worker) | [`contract::checkpoint::Checkpoint`] |
//! | a root cause planted in the reference worker | [`contract::defect::Defect`] |
//! | a suite (workers, faults, budget, invariants) | [`suite::Suite`], files in [`suite::file`] |
//! | a runner | [`schedule::controlled::Controller`], [`schedule::explore::explore`], [`schedule::chaos::run_chaos`], [`schedule::fleet::run_fleet`] |
//! | a schedule and its file | [`schedule::Schedule`], [`schedule::file::ScheduleFile`] |
//! | the recorded history | [`history::History`] |
//! | plugging in a worker | [`contract::worker::WorkerUnderTest`], [`contract::worker::WorkerFactory`] |
//!
//! ## Certifying a worker
//! `examples/custom_worker.rs` certifies a team's worker written against the contract
//! (`cargo run --example custom_worker`, and `-- --unfenced` to see a counterexample). With the
//! reference worker, a shipped suite is certified like this:
//! ```no_run
//! use racecert::env::TestBed;
//! use racecert::schedule::controlled::Controller;
//! use racecert::schedule::explore::{ExploreConfig, explore};
//!
//! # fn demo() -> anyhow::Result<()> {
//! let runtime = tokio::runtime::Runtime::new()?;
//! let bed = runtime.block_on(TestBed::builder().start())?; // builds images on first use
//! let suite = racecert::suite::builtin()
//!     .into_iter()
//!     .find(|s| s.name == "lease-expiry")
//!     .expect("a shipped suite");
//! // suite.settings.factory = Arc::new(YourFactory); // your WorkerUnderTest instead
//! let controller = runtime.block_on(Controller::new(&bed, suite.settings.clone()))?;
//! let config = ExploreConfig { cases: 64, seed: 1, ..ExploreConfig::default() };
//! let report = explore(runtime.handle(), &controller, &suite.space, &config)?;
//! if let Some(found) = &report.counterexample {
//!     println!("{}", racecert::report::counterexample_text(found, 1, "cargo test"));
//! }
//! runtime.block_on(bed.shutdown());
//! # Ok(()) }
//! ```
//!
//! ## The test bed and a fault
//! ```no_run
//! use racecert::env::{TestBed, proxy::{Direction, Toxic}};
//!
//! # async fn demo() -> racecert::Result<()> {
//! let bed = TestBed::builder().start().await?;
//! let backend = bed.backend_proxy("v1")?;                 // model-backend-A behind its proxy
//! backend
//!     .add_toxic(Toxic::Latency { latency_ms: 300, jitter_ms: 0 }, Direction::Downstream, 1.0)
//!     .await?;                                            // every v1 call now takes >= 300 ms
//! bed.shutdown().await;                                   // containers removed
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod check;
pub mod contract;
pub mod env;
pub mod error;
pub mod fault;
pub mod history;
pub mod interrupt;
pub mod reference;
pub mod replay;
pub mod report;
pub mod schedule;
pub mod smoke;
pub mod suite;
pub mod system;

pub use error::{Error, Result};

/// The layering, checked: no module imports a layer above it (ARCHITECTURE.md). A scan of the
/// `crate::` paths in every source file against the allowed order is enough to keep it honest.
#[cfg(test)]
mod layering {
    /// Layers bottom up; a module may use modules of its own rank or lower.
    const RANKS: &[(&str, u32)] = &[
        ("error", 0),
        ("interrupt", 0),
        ("contract", 0),
        ("fault", 5),
        ("env", 10),
        ("reference", 20),
        ("system", 25),
        ("history", 30),
        ("check", 40),
        ("schedule", 50),
        ("report", 60),
        ("suite", 65),
        ("replay", 70),
        ("smoke", 75),
    ];

    fn rank(module: &str) -> Option<u32> {
        RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
    }

    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn no_module_imports_a_layer_above_it() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut upward = Vec::new();
        let mut unknown = Vec::new();
        for file in &files {
            let relative = file.strip_prefix(&src).expect("under src");
            let top = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .unwrap_or_default()
                .trim_end_matches(".rs");
            if top == "lib" || top == "main" {
                continue;
            }
            let Some(own) = rank(top) else {
                unknown.push(top.to_owned());
                continue;
            };
            let text = std::fs::read_to_string(file).expect("read source");
            for (number, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for (at, _) in line.match_indices("crate::") {
                    let used: String = line[at + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if let Some(theirs) = rank(&used)
                        && theirs > own
                    {
                        upward.push(format!(
                            "{}:{}: {top} uses {used}: {}",
                            relative.display(),
                            number + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "modules with no layer in RANKS: {unknown:?}"
        );
        assert!(
            upward.is_empty(),
            "imports that reach a layer above:\n{}",
            upward.join("\n")
        );
    }
}
