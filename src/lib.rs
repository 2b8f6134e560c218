//! # racecert
//!
//! A fault-injection test harness that certifies inference workers (API -> queue -> worker ->
//! model backend -> cache -> result store) against the races of a model-backend rollout: version
//! skew between workers, retries without dedupe, late writes that overwrite newer results, stale
//! caches. Workers run against **real** Redis and PostgreSQL in containers, every connection goes
//! through a Toxiproxy fault proxy, and each model version is a wiremock backend.
//!
//! ## Map of the modules, bottom layer first
//! No module imports a layer above it, and the evidence the judge reads lives below the test bed
//! (the `layering` test below checks both). The floors below the test bed are crates of their
//! own, so the compiler keeps their order: `racecert-core` ([`contract`], [`fault`], [`error`],
//! [`interrupt`]), `racecert-logs` ([`logs`]) and `racecert-wire` ([`wire`]) beside each other,
//! `racecert-history` ([`history`]), `racecert-check` ([`check`]: no runtime, no containers).
//! Each is re-exported here under the name it has always had. Cut there because those floors
//! already imported nothing above them (the first step of a workspace that moves only files),
//! and because the judge then compiles without tokio, sqlx or the test bed; the floors above
//! (test bed, planes, driver) follow as crates of their own.
//! - [`contract`]: what every worker under test agrees to: schema (jobs table + audit trigger),
//!   Redis key names ([`contract::layout`]), job statuses and log lines ([`contract::log`]),
//!   checkpoints, deliveries, defects, and the [`contract::worker`] trait a team implements.
//! - [`fault`]: the one fault vocabulary (network, backend, process, rollout and framework kinds)
//!   and the one place faults are applied ([`fault::apply`]) over a runner's [`fault::Plane`].
//! - [`wire`]: the evidence on the wire: Redis (RESP2/3), PostgreSQL v3 and HTTP framed into
//!   round trips ([`wire::RoundTrip`], attributed as [`wire::WireEvent`]s), backend journal
//!   entries, and the holder interface that lets a schedule hold a round trip.
//! - [`history`]: what happened, in real order: the one [`history::Recorder`] every runner uses,
//!   the audit trail (each write attributed to the connection that carried it), the backend
//!   journals, the wire events.
//! - [`logs`]: incident logs read as teams' platforms export them (logfmt, JSON, Celery's
//!   format, orchestrator prefixes, journald, OTLP, Loki, CloudWatch, CSV exports), streamed.
//! - [`check`]: the one judge: the invariants, each with the evidence that proves a violation,
//!   and fault coverage (which faults landed on their target), both read off a history.
//! - [`env`](mod@env): the test bed: images built offline, containers, the fault proxy (Toxiproxy's
//!   API on the vendored noxious engine), the wiremock model backends, per-worker links whose round
//!   trips are framed ([`env::links`]), Python environments, the reaper.
//! - [`reference`](mod@reference): the seed's pipeline done right (submit, queue, worker,
//!   cutover), one implementation of the contract, with a switch per root cause.
//! - [`system`]: system descriptions (TOML file or Rust builder) of workers racecert did not
//!   write, and the framework presets (Celery, apalis, Dramatiq): which fault kinds each has.
//! - [`schedule`]: the one schedule type ([`schedule::Schedule`], generic over a runner's steps),
//!   the one search ([`schedule::search`]: proptest generation, corpus mutation, depth-bounded
//!   enumeration, PCT), the aimed schedules every search starts with ([`schedule::aimed`]: one
//!   per fault kind, built to land on its target), the one shrinker ([`schedule::shrink`]) and
//!   the one schedule file ([`schedule::file`]).
//! - [`runner`]: the planes the search drives, each handing a history to the judge: controlled
//!   (in process, at checkpoints), chaos (in process, free running), fleet (worker processes),
//!   wire (worker processes held at their round trips), system (a team's own worker).
//! - [`report`]: terminal, JSON, JUnit XML and HTML/SVG reports.
//! - [`suite`]: suite files and the certify runner.
//! - [`replay`]: incident logs -> story, diagnoses with their lines, schedules that reproduce them.
//! - [`smoke`]: the smoke scenario behind `racecert smoke`; [`cli`]: the commands of the binary;
//!   [`error`], [`interrupt`]: the error type and Ctrl-C / SIGTERM handling.
//!
//! ## Where to find it, in one hop
//! | looking for | here |
//! |---|---|
//! | a fault (what a schedule can inject) | [`fault::Fault`], its kinds [`fault::FaultKind`] |
//! | an invariant (what must hold) | [`check::Invariant`], judged by [`check::check`] |
//! | a checkpoint (where the controller can hold a worker) | [`contract::checkpoint::Checkpoint`] |
//! | a root cause planted in the reference worker | [`contract::defect::Defect`] |
//! | a suite (workers, faults, budget, invariants) | [`suite::Suite`], files in [`suite::file`] |
//! | a runner | [`runner::controlled::Controller`], [`runner::chaos::run_chaos`], [`runner::fleet::run_fleet`], [`runner::wire::WireRunner`], [`runner::system::run_system`] |
//! | the search and the shrinker | [`schedule::search::explore`] ([`runner::explore::explore`] for a suite), [`schedule::shrink::shrink`] |
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
//! use racecert::runner::controlled::Controller;
//! use racecert::runner::explore::{ExploreConfig, explore};
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
//! let report = runtime.block_on(explore(&controller, &suite.space, &config))?;
//! if let Some(found) = &report.found {
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

// The layers below the test bed are crates of their own (`crates/`), re-exported here under the
// names they have always had, so `racecert::wire::RoundTrip` and `crate::history::History` read
// as before.
pub use racecert_check as check;
pub use racecert_core::{contract, error, fault, interrupt};
pub use racecert_history as history;
/// The incident-log readers (`racecert-logs`): lines and whole documents as teams' platforms
/// export them.
pub use racecert_logs as logs;
pub use racecert_wire as wire;

pub mod cli;
pub mod env;
pub mod reference;
pub mod replay;
pub mod report;
pub mod runner;
pub mod schedule;
pub mod smoke;
pub mod suite;
pub mod system;

pub use error::{Error, Result};

/// The layering, checked: no module imports a layer above it (ARCHITECTURE.md). The layers that
/// are crates of their own (`crates/`) are kept in order by the compiler, given manifests that
/// name only crates below; the second test reads the manifests. In this crate, a scan of the
/// `crate::` paths in every source file against the allowed order keeps it honest.
#[cfg(test)]
mod layering {
    /// Layers bottom up; a module may use modules of its own rank or lower.
    const RANKS: &[(&str, u32)] = &[
        ("error", 0),
        ("interrupt", 0),
        ("contract", 0),
        ("fault", 5),
        ("wire", 7),
        ("logs", 8),
        ("env", 10),
        ("reference", 20),
        ("system", 25),
        ("history", 30),
        ("check", 40),
        ("schedule", 50),
        ("runner", 55),
        ("report", 60),
        ("suite", 65),
        ("replay", 70),
        ("smoke", 75),
        ("cli", 80),
    ];

    /// Imports the ranks alone would allow but the architecture forbids: the evidence the judge
    /// reads lives below the test bed, so `history` and `check` are pure data over it; a system
    /// description knows the test bed, never racecert's own worker.
    const FORBIDDEN: &[(&str, &[&str])] = &[
        (
            "history",
            &[
                "env",
                "reference",
                "system",
                "schedule",
                "runner",
                "suite",
                "report",
                "replay",
            ],
        ),
        (
            "check",
            &[
                "env",
                "reference",
                "system",
                "schedule",
                "runner",
                "suite",
                "report",
                "replay",
            ],
        ),
        ("system", &["reference"]),
    ];

    fn forbidden(module: &str, used: &str) -> bool {
        FORBIDDEN
            .iter()
            .any(|(m, banned)| *m == module && banned.contains(&used))
    }

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
                        && (theirs > own || forbidden(top, &used))
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
    /// The workspace's crates bottom up: a crate may depend on crates of a lower floor only.
    const CRATES: &[(&str, u32)] = &[
        ("racecert-core", 0),
        ("racecert-logs", 1),
        ("racecert-wire", 1),
        ("racecert-history", 2),
        ("racecert-check", 3),
    ];

    /// What the judge must never depend on: it reads a history, it runs nothing.
    const NOT_IN_CHECK: &[&str] = &[
        "tokio",
        "sqlx",
        "redis",
        "testcontainers",
        "noxious",
        "wiremock",
        "reqwest",
        "nix",
    ];

    #[test]
    fn the_crates_depend_only_on_crates_below_them_and_the_judge_on_no_runtime() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut wrong = Vec::new();
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(root.join("crates")).expect("read crates") {
            let manifest = entry.expect("dir entry").path().join("Cargo.toml");
            let text = std::fs::read_to_string(&manifest).expect("read a manifest");
            let table: toml::Table = text.parse().expect("a manifest parses");
            let name = table["package"]["name"]
                .as_str()
                .expect("a name")
                .to_owned();
            let Some((_, floor)) = CRATES.iter().find(|(n, _)| *n == name) else {
                wrong.push(format!("{name}: no floor in CRATES"));
                continue;
            };
            seen.push(name.clone());
            let deps = table
                .get("dependencies")
                .and_then(toml::Value::as_table)
                .cloned()
                .unwrap_or_default();
            for dep in deps.keys() {
                if let Some((_, theirs)) = CRATES.iter().find(|(n, _)| n == dep)
                    && theirs >= floor
                {
                    wrong.push(format!(
                        "{name} (floor {floor}) depends on {dep} (floor {theirs})"
                    ));
                }
                if name == "racecert-check" && NOT_IN_CHECK.contains(&dep.as_str()) {
                    wrong.push(format!("{name} depends on {dep}: the judge runs nothing"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert_eq!(seen.len(), CRATES.len(), "crates found: {seen:?}");
    }

    /// `cargo build` resolves features without the dev-dependencies, `cargo test` with them; a
    /// crate the two resolve with different features is compiled twice, with everything above
    /// it (one hashbrown feature rebuilt all 512 units, 4 minutes). Pins in the manifest keep
    /// the two sets equal; this says which crate to pin when a dependency changes them.
    #[test]
    fn build_and_test_resolve_every_shared_crate_with_one_feature_set() {
        let tree = |edges: Option<&str>| -> std::collections::BTreeSet<String> {
            let mut cmd = std::process::Command::new(env!("CARGO"));
            cmd.args(["tree", "--frozen", "-p", "racecert", "--prefix", "none"])
                .args(["-f", "{p} [{f}]"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if let Some(edges) = edges {
                cmd.args(["-e", edges]);
            }
            let out = cmd.output().expect("cargo tree runs");
            assert!(
                out.status.success(),
                "cargo tree: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|line| line.trim_end_matches(" (*)").to_owned())
                .collect()
        };
        let build = tree(Some("no-dev"));
        let test = tree(None);
        let package = |line: &str| line.split(" [").next().unwrap_or_default().to_owned();
        let differ: Vec<String> = build
            .iter()
            .filter(|line| !test.contains(*line))
            .map(|line| {
                let theirs = test
                    .iter()
                    .find(|t| package(t) == package(line))
                    .map_or("absent", String::as_str);
                format!("build: {line}\n test: {theirs}")
            })
            .collect();
        assert!(
            differ.is_empty(),
            "crates whose features differ between `cargo build` and `cargo test` (declare the \
             test's features in the racecert crate's [dependencies]):\n{}",
            differ.join("\n")
        );
    }
}
