//! A failure is its schedule: every counterexample of every runner is written as one kind of
//! schedule file (JSON) that `racecert run --schedule FILE` replays exactly, whatever seeds or
//! regression entries say later. The file names its runner and carries everything that runner
//! needs besides the test bed: for workers in process, the suite, workers, defects and timeouts;
//! for worker processes, the command as well, and the round trips each step released (a replay
//! that sees others has diverged); for a team's system, the system file, the seed and the case.

use crate::check::Invariant;
use crate::contract::defect::Defect;
use crate::contract::worker::WorkerSpec;
use crate::fault::FaultKind;
use crate::schedule::{Schedule, Step, WireStep, previous};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The format tag every schedule file starts with.
pub const FORMAT: &str = "racecert-schedule/2";

/// A schedule with the runner and settings it ran under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The runner that replays it, with its settings and steps.
    pub runner: RunnerSpec,
    /// Invariants checked.
    pub invariants: Vec<Invariant>,
    /// Where it was found (seed and case), if by a search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<Found>,
    /// The invariants it broke when it was written.
    #[serde(default)]
    pub violated: Vec<Invariant>,
}

/// The runner of a schedule file, and what it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum RunnerSpec {
    /// Workers in process (the reference worker) held at checkpoints.
    InProcess {
        /// The suite it came from (name), for people.
        suite: String,
        /// The workers of the case, in index order.
        workers: Vec<WorkerSpec>,
        /// Defects switched on in the reference worker.
        #[serde(default)]
        defects: Vec<Defect>,
        /// The workers' backend timeout, ms.
        backend_timeout_ms: u64,
        /// The steps.
        schedule: Schedule<Step>,
    },
    /// Worker processes of a command, held at their round trips.
    Wire {
        /// The command that starts one worker (`--worker-cmd` replaces it).
        command: String,
        /// The workers, in index order.
        workers: Vec<WorkerSpec>,
        /// Defects passed to the workers.
        #[serde(default)]
        defects: Vec<Defect>,
        /// Lease TTL, ms.
        lease_ttl_ms: u64,
        /// Visibility timeout, ms.
        visibility_timeout_ms: u64,
        /// Backend timeout, ms.
        backend_timeout_ms: u64,
        /// The steps.
        schedule: Schedule<WireStep>,
        /// Per step, the fingerprints of the round trips it released (a replay that sees others
        /// diverged; none for a file written by hand).
        #[serde(default)]
        trace: Vec<Vec<String>>,
    },
    /// A team's system, from its description.
    System {
        /// The system file.
        system: PathBuf,
        /// The run's seed (its case ids come from it).
        seed: u64,
        /// The case number.
        case: u32,
        /// The case: its request and the framework fault aimed at the worker that takes it.
        schedule: Schedule<FaultKind>,
    },
}

/// Where a search found a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Found {
    /// The search's seed.
    pub seed: u64,
    /// Its case number (0: a replayed regression).
    pub case: u32,
}

impl ScheduleFile {
    /// A file of `runner`'s schedule checking `invariants`.
    pub fn new(runner: RunnerSpec, invariants: Vec<Invariant>) -> ScheduleFile {
        ScheduleFile {
            format: FORMAT.to_owned(),
            runner,
            invariants,
            found: None,
            violated: Vec::new(),
        }
    }

    /// The runner's name, as files spell it.
    pub fn runner_name(&self) -> &'static str {
        match self.runner {
            RunnerSpec::InProcess { .. } => "in-process",
            RunnerSpec::Wire { .. } => "wire",
            RunnerSpec::System { .. } => "system",
        }
    }

    /// Reads a schedule file; a bad one is refused with `file:line:column` and what was wrong.
    /// A file of the previous release ([`previous`]) is converted on load.
    pub fn read(path: &Path) -> Result<ScheduleFile> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::io_at(path, err))?;
        /// Only the tag, to know which types to read the rest with.
        #[derive(Deserialize)]
        struct Tag {
            format: Option<String>,
        }
        let tag: Tag = parse_json(path, &text, "schedule file")?;
        let file: ScheduleFile = match tag.format.as_deref() {
            Some(FORMAT) => parse_json(path, &text, "schedule file")?,
            Some(old) if let Some(file) = previous::convert(path, &text, old) => file?,
            Some(other) => {
                return Err(Error::Config(format!(
                    "{}: format {other:?} is not one this release reads: it reads {FORMAT:?} and \
                     converts the previous release's {:?} and {:?}; replay it with the release \
                     that wrote it",
                    path.display(),
                    previous::IN_PROCESS,
                    previous::WIRE,
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "{}: no \"format\": not a racecert schedule file (they start with \
                     \"format\": {FORMAT:?})",
                    path.display()
                )));
            }
        };
        let (workers, steps) = match &file.runner {
            RunnerSpec::InProcess {
                workers, schedule, ..
            } => (workers.len(), schedule.steps.len()),
            RunnerSpec::Wire {
                workers, schedule, ..
            } => (workers.len(), schedule.steps.len()),
            RunnerSpec::System { schedule, .. } => (1, schedule.steps.len()),
        };
        if workers == 0 || steps == 0 {
            return Err(Error::Config(format!(
                "{}: a schedule file needs workers and steps",
                path.display()
            )));
        }
        Ok(file)
    }

    /// Writes it (pretty JSON), creating the directory.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_json(self, path, "schedule")
    }
}

/// Parses `text`, read from `path`, as a `what`; refused with `file:line:column`.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    what: &str,
) -> Result<T> {
    serde_json::from_str(text).map_err(|err| {
        Error::Config(format!(
            "{}:{}:{}: not a {what}: {err}",
            path.display(),
            err.line(),
            err.column()
        ))
    })
}

/// Writes `value` as pretty JSON, creating the directory.
pub(crate) fn write_json<T: serde::Serialize>(value: &T, path: &Path, what: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|err| Error::io_at(dir, err))?;
    }
    let text = serde_json::to_string_pretty(value)
        .map_err(|err| Error::other(format!("serialising a {what}: {err}")))?;
    std::fs::write(path, text + "\n").map_err(|err| Error::io_at(path, err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::checkpoint::Checkpoint;
    use crate::fault::Fault;
    use crate::schedule::RequestSpec;

    fn requests() -> Vec<RequestSpec> {
        vec![RequestSpec {
            request_id: "req-0".into(),
            input: "input-0".into(),
        }]
    }

    fn workers() -> Vec<WorkerSpec> {
        vec![
            WorkerSpec {
                id: "worker-a".into(),
                version: "v1".into(),
            },
            WorkerSpec {
                id: "worker-c".into(),
                version: "v2".into(),
            },
        ]
    }

    /// Writes `file`, reads it back, then breaks `word` in it: the error names the file.
    fn round_trip(file: &ScheduleFile, word: &str) {
        let dir = std::env::temp_dir().join(format!(
            "racecert-schedule-{}-{}",
            std::process::id(),
            file.runner_name()
        ));
        let path = dir.join("case.json");
        file.write(&path).unwrap();
        assert_eq!(&ScheduleFile::read(&path).unwrap(), file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(word), "{text}");
        std::fs::write(&path, text.replace(word, "\"sprint\"")).unwrap();
        let err = ScheduleFile::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("case.json:") && err.contains("sprint"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_runner_s_file_round_trips_and_bad_ones_name_the_place() {
        let mut file = ScheduleFile::new(
            RunnerSpec::InProcess {
                suite: "lease-expiry".into(),
                workers: workers(),
                defects: vec![Defect::UnfencedFinalWrite],
                backend_timeout_ms: 250,
                schedule: Schedule {
                    requests: requests(),
                    steps: vec![
                        Step::Run {
                            worker: 0,
                            to: Checkpoint::AfterLease,
                        },
                        Step::Fault(Fault::ExpireLease { request: 0 }),
                    ],
                },
            },
            Invariant::ALL.to_vec(),
        );
        file.found = Some(Found { seed: 7, case: 9 });
        file.violated = vec![Invariant::AtMostOneFinalWrite];
        round_trip(&file, "\"run\"");

        let wire = ScheduleFile::new(
            RunnerSpec::Wire {
                command: "python3 worker.py".into(),
                workers: workers(),
                defects: Vec::new(),
                lease_ttl_ms: 60_000,
                visibility_timeout_ms: 60_000,
                backend_timeout_ms: 3000,
                schedule: Schedule {
                    requests: requests(),
                    steps: vec![
                        WireStep::Until {
                            worker: 0,
                            before: "UPDATE inference_jobs".into(),
                        },
                        WireStep::Fault(Fault::ExpireLease { request: 0 }),
                        WireStep::Finish { worker: 1 },
                    ],
                },
                trace: vec![vec!["redis GET {ns}x".into()], vec![], vec![]],
            },
            Invariant::ALL.to_vec(),
        );
        round_trip(&wire, "\"until\"");

        let system = ScheduleFile::new(
            RunnerSpec::System {
                system: "examples/celery-worker/naive.toml".into(),
                seed: 1,
                case: 3,
                schedule: Schedule {
                    requests: requests(),
                    steps: vec![FaultKind::ForcedRestore],
                },
            },
            vec![Invariant::AtMostOneFinalWrite],
        );
        round_trip(&system, "\"forced-restore\"");
    }

    #[test]
    fn a_file_without_steps_or_of_another_format_is_refused() {
        let dir = std::env::temp_dir().join(format!("racecert-empty-{}", std::process::id()));
        let path = dir.join("case.json");
        let mut file = ScheduleFile::new(
            RunnerSpec::System {
                system: "s.toml".into(),
                seed: 1,
                case: 1,
                schedule: Schedule {
                    requests: requests(),
                    steps: Vec::new(),
                },
            },
            Vec::new(),
        );
        file.write(&path).unwrap();
        assert!(
            ScheduleFile::read(&path)
                .unwrap_err()
                .to_string()
                .contains("needs workers and steps")
        );
        file.format = "racecert-schedule/3".into();
        file.write(&path).unwrap();
        assert!(
            ScheduleFile::read(&path)
                .unwrap_err()
                .to_string()
                .contains("it reads \"racecert-schedule/2\"")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
