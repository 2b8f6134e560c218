//! Schedule files of the previous release, read into today's format on load, so a counterexample
//! a team kept from it still replays. That release wrote two formats: `racecert-schedule/1`
//! (workers in process; flat, no `runner`) and `racecert-wire-schedule/1` (worker processes; flat,
//! and three steps, `expire`, `kill` and `stop`, that are faults today). Their types are kept
//! here as that release spelled them, and each converts to a [`ScheduleFile`] of its runner.

use crate::Result;
use crate::check::Invariant;
use crate::contract::defect::Defect;
use crate::contract::worker::WorkerSpec;
use crate::fault::Fault;
use crate::schedule::file::{Found, RunnerSpec, ScheduleFile, parse_json};
use crate::schedule::{Schedule, Step, WireStep};
use serde::Deserialize;
use std::path::Path;

/// The previous release's file of workers in process.
pub const IN_PROCESS: &str = "racecert-schedule/1";
/// The previous release's file of worker processes held at their round trips.
pub const WIRE: &str = "racecert-wire-schedule/1";

/// `text`, read from `path`, converted to today's format, if `format` is one of the previous
/// release's (`None` if not); a file that does not parse as its format is refused at its line.
pub(crate) fn convert(path: &Path, text: &str, format: &str) -> Option<Result<ScheduleFile>> {
    let file = match format {
        IN_PROCESS => {
            parse_json::<InProcessFile>(path, text, "schedule file of the previous release")
                .map(ScheduleFile::from)
        }
        WIRE => parse_json::<WireFile>(path, text, "wire schedule file of the previous release")
            .map(ScheduleFile::from),
        _ => return None,
    };
    tracing::info!(
        file = %path.display(),
        format,
        "converting a schedule file of the previous release"
    );
    Some(file)
}

/// A file of format [`IN_PROCESS`]: the in-process runner's, with its settings at the top.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InProcessFile {
    format: String,
    suite: String,
    workers: Vec<WorkerSpec>,
    #[serde(default)]
    defects: Vec<Defect>,
    backend_timeout_ms: u64,
    invariants: Vec<Invariant>,
    #[serde(default)]
    found: Option<Found>,
    #[serde(default)]
    violated: Vec<Invariant>,
    // Its steps are today's minus `trips`, spelled the same.
    schedule: Schedule<Step>,
}

/// A file of format [`WIRE`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireFile {
    format: String,
    command: String,
    workers: Vec<WorkerSpec>,
    #[serde(default)]
    defects: Vec<Defect>,
    invariants: Vec<Invariant>,
    lease_ttl_ms: u64,
    visibility_timeout_ms: u64,
    backend_timeout_ms: u64,
    #[serde(default)]
    violated: Vec<Invariant>,
    schedule: Schedule<OldWireStep>,
    trace: Vec<Vec<String>>,
}

/// A wire step as the previous release wrote it.
#[derive(Debug, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case", deny_unknown_fields)]
enum OldWireStep {
    Run {
        worker: usize,
        trips: u32,
    },
    Until {
        worker: usize,
        before: String,
    },
    Finish {
        worker: usize,
    },
    /// The lease deleted and the delivery made idle: today's `expire_lease` fault on processes.
    Expire {
        request: usize,
    },
    /// SIGKILL and restart: today's `crash_worker` fault on processes.
    Kill {
        worker: usize,
    },
    /// SIGSTOP for `ms`, then SIGCONT: today's `pause_worker` fault on processes.
    Stop {
        worker: usize,
        ms: u64,
    },
    Fault(Fault),
}

impl From<OldWireStep> for WireStep {
    fn from(step: OldWireStep) -> WireStep {
        match step {
            OldWireStep::Run { worker, trips } => WireStep::Run { worker, trips },
            OldWireStep::Until { worker, before } => WireStep::Until { worker, before },
            OldWireStep::Finish { worker } => WireStep::Finish { worker },
            OldWireStep::Expire { request } => WireStep::Fault(Fault::ExpireLease { request }),
            OldWireStep::Kill { worker } => WireStep::Fault(Fault::CrashWorker { worker }),
            OldWireStep::Stop { worker, ms } => WireStep::Fault(Fault::PauseWorker { worker, ms }),
            OldWireStep::Fault(fault) => WireStep::Fault(fault),
        }
    }
}

impl From<InProcessFile> for ScheduleFile {
    fn from(old: InProcessFile) -> ScheduleFile {
        debug_assert_eq!(old.format, IN_PROCESS);
        let mut file = ScheduleFile::new(
            RunnerSpec::InProcess {
                suite: old.suite,
                workers: old.workers,
                defects: old.defects,
                backend_timeout_ms: old.backend_timeout_ms,
                schedule: old.schedule,
            },
            old.invariants,
        );
        file.found = old.found;
        file.violated = old.violated;
        file
    }
}

impl From<WireFile> for ScheduleFile {
    fn from(old: WireFile) -> ScheduleFile {
        debug_assert_eq!(old.format, WIRE);
        let mut file = ScheduleFile::new(
            RunnerSpec::Wire {
                command: old.command,
                workers: old.workers,
                defects: old.defects,
                lease_ttl_ms: old.lease_ttl_ms,
                visibility_timeout_ms: old.visibility_timeout_ms,
                backend_timeout_ms: old.backend_timeout_ms,
                schedule: Schedule {
                    requests: old.schedule.requests,
                    steps: old.schedule.steps.into_iter().map(WireStep::from).collect(),
                },
                trace: old.trace,
            },
            old.invariants,
        );
        file.violated = old.violated;
        file
    }
}

#[cfg(test)]
mod tests {
    use crate::check::Invariant;
    use crate::contract::checkpoint::Checkpoint;
    use crate::fault::Fault;
    use crate::schedule::file::{FORMAT, Found, RunnerSpec, ScheduleFile};
    use crate::schedule::{Step, WireStep};
    use std::path::{Path, PathBuf};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/schedules")
            .join(name)
    }

    #[test]
    fn an_in_process_file_of_format_1_converts_with_its_steps_and_provenance() {
        let file = ScheduleFile::read(&fixture("format-1-in-process.json")).unwrap();
        assert_eq!(file.format, FORMAT);
        assert_eq!(file.found, Some(Found { seed: 3, case: 17 }));
        assert_eq!(file.violated, vec![Invariant::AtMostOneFinalWrite]);
        assert_eq!(
            file.invariants.len(),
            9,
            "the invariants it was checked with"
        );
        let RunnerSpec::InProcess {
            suite,
            workers,
            defects,
            backend_timeout_ms,
            schedule,
        } = file.runner
        else {
            panic!("an in-process file converts to the in-process runner");
        };
        assert_eq!(suite, "lease-expiry");
        assert_eq!(workers.len(), 2);
        assert_eq!(defects.len(), 1);
        assert_eq!(backend_timeout_ms, 2000);
        assert_eq!(
            schedule.steps,
            vec![
                Step::Run {
                    worker: 0,
                    to: Checkpoint::BeforeFinalWrite
                },
                Step::Fault(Fault::ExpireLease { request: 0 }),
                Step::Run {
                    worker: 1,
                    to: Checkpoint::Done
                },
                Step::Run {
                    worker: 0,
                    to: Checkpoint::Done
                },
            ]
        );
    }

    #[test]
    fn a_wire_file_of_format_1_converts_its_expire_kill_and_stop_steps_into_faults() {
        let file = ScheduleFile::read(&fixture("format-1-wire.json")).unwrap();
        let RunnerSpec::Wire {
            command,
            lease_ttl_ms,
            schedule,
            trace,
            ..
        } = file.runner
        else {
            panic!("a wire file converts to the wire runner");
        };
        assert_eq!(command, "racecert worker");
        assert_eq!(lease_ttl_ms, 60_000);
        assert!(trace.is_empty());
        assert_eq!(
            schedule.steps,
            vec![
                WireStep::Run {
                    worker: 0,
                    trips: 3
                },
                WireStep::Fault(Fault::PauseWorker { worker: 0, ms: 200 }),
                WireStep::Fault(Fault::ExpireLease { request: 0 }),
                WireStep::Finish { worker: 1 },
                WireStep::Fault(Fault::CrashWorker { worker: 0 }),
                WireStep::Finish { worker: 0 },
            ]
        );
    }

    #[test]
    fn unknown_formats_and_broken_old_files_are_refused_naming_what_was_read() {
        let dir = std::env::temp_dir().join(format!("racecert-previous-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let refused = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            ScheduleFile::read(&path).unwrap_err().to_string()
        };
        let future = refused("future.json", r#"{"format": "racecert-schedule/9"}"#);
        assert!(
            future.contains("future.json")
                && future.contains("\"racecert-schedule/9\" is not one this release reads")
                && future.contains(super::WIRE),
            "{future}"
        );
        let none = refused("none.json", r#"{"suite": "x"}"#);
        assert!(none.contains("none.json: no \"format\""), "{none}");
        // A format-1 file with a step that release never wrote: its line and column.
        let text = std::fs::read_to_string(fixture("format-1-wire.json"))
            .unwrap()
            .replace("\"expire\"", "\"sprint\"");
        let broken = refused("broken.json", &text);
        assert!(
            broken.contains("broken.json:")
                && broken.contains("of the previous release")
                && broken.contains("sprint"),
            "{broken}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
