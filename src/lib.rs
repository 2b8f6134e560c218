//! # racecert
//!
//! A fault-injection test harness that certifies inference workers (API -> queue -> worker ->
//! model backend -> cache -> result store) against the races of a model-backend rollout: version
//! skew between workers, retries without dedupe, late writes that overwrite newer results, stale
//! caches. Workers run against **real** Redis and PostgreSQL in containers, every connection goes
//! through a Toxiproxy fault proxy, and each model version is a wiremock backend.
//!
//! ## Map of the modules
//! - [`contract`]: what every worker under test agrees to: schema (jobs table + audit trigger),
//!   Redis key names, job state machine, log lines, backend API, and the [`contract::worker`]
//!   trait a team implements to plug its own worker in.
//! - [`env`](mod@env): the test bed: images built offline, containers, external services, the
//!   Toxiproxy-API fault proxy and its client, the wiremock model backends, the container reaper.
//! - [`reference`](mod@reference): the seed's pipeline done right (submit, queue, worker, cutover), with a switch
//!   per root cause ([`reference::defects`]) and checkpoints a harness can hold.
//! - [`fault`]: the fault vocabulary.
//! - [`schedule`]: schedules, the deterministic controlled runner, the chaos runner, proptest
//!   exploration with shrinking.
//! - [`history`]: what happened: worker events, the audit trail, the backend journals.
//! - [`check`]: the invariants, each with a report.
//! - [`suite`]: suite files and the certify runner.
//! - [`report`]: terminal, JSON, JUnit XML and HTML/SVG reports.
//! - [`replay`]: incident logs -> reconstruction, diagnosis, a schedule that replays the race.
//! - [`system`]: system descriptions (TOML file or Rust builder) of workers racecert did not
//!   write, and the framework presets (Celery, apalis).
//! - [`smoke`]: the smoke scenario behind `racecert smoke`.
//! - [`error`]: the library error type.
//!
//! ## The test bed in one example
//! ```no_run
//! use racecert::env::{TestBed, proxy::{Direction, Toxic}};
//!
//! # async fn demo() -> racecert::Result<()> {
//! let bed = TestBed::builder().start().await?;          // builds images on first use
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
