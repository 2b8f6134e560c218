//! A failure is its schedule: every counterexample is written as a schedule file (JSON) that
//! `racecert run --schedule FILE` replays exactly, whatever seeds or regression entries say
//! later. A file carries everything the run needs besides the test bed: the workers and their
//! versions, the defects switched on, the timeouts, the invariants, and the steps.

use crate::check::Invariant;
use crate::contract::defect::{Defect, Defects};
use crate::contract::worker::WorkerSpec;
use crate::schedule::Schedule;
use crate::schedule::controlled::CaseSettings;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The format tag every schedule file starts with.
pub const FORMAT: &str = "racecert-schedule/1";

/// A controlled schedule with the settings it ran under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The suite it came from (name), for people.
    pub suite: String,
    /// The workers of the case, in index order.
    pub workers: Vec<WorkerSpec>,
    /// Defects switched on in the reference worker.
    #[serde(default)]
    pub defects: Vec<Defect>,
    /// The workers' backend timeout, ms.
    pub backend_timeout_ms: u64,
    /// Invariants checked.
    pub invariants: Vec<Invariant>,
    /// Where it was found (seed and case), if by exploration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<Found>,
    /// The invariants it broke when it was written.
    #[serde(default)]
    pub violated: Vec<Invariant>,
    /// The steps.
    pub schedule: Schedule,
}

/// Where an exploration found a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Found {
    /// The exploration's seed.
    pub seed: u64,
    /// Its case number (0: a replayed regression).
    pub case: u32,
}

impl ScheduleFile {
    /// The file of `schedule`, run under `settings` (the reference worker's, or any worker's:
    /// only the reference can be replayed from the file alone).
    pub fn new(suite: &str, settings: &CaseSettings, schedule: Schedule) -> ScheduleFile {
        ScheduleFile {
            format: FORMAT.to_owned(),
            suite: suite.to_owned(),
            workers: settings.workers.clone(),
            defects: settings.defects.iter().collect(),
            backend_timeout_ms: settings.backend_timeout.as_millis() as u64,
            invariants: settings.invariants.clone(),
            found: None,
            violated: Vec::new(),
            schedule,
        }
    }

    /// The case settings to replay it with the reference worker.
    pub fn settings(&self) -> CaseSettings {
        CaseSettings {
            workers: self.workers.clone(),
            defects: Defects::of(self.defects.iter().copied()),
            invariants: self.invariants.clone(),
            backend_timeout: Duration::from_millis(self.backend_timeout_ms),
            factory: Arc::new(crate::reference::ReferenceFactory),
            wire: true,
        }
    }

    /// Reads a schedule file; a bad one is refused with `file:line:column` and what was wrong.
    pub fn read(path: &Path) -> Result<ScheduleFile> {
        let file: ScheduleFile = read_json(path, "schedule file")?;
        if file.format != FORMAT {
            return Err(Error::Config(format!(
                "{}: format {:?}, expected {FORMAT:?}",
                path.display(),
                file.format
            )));
        }
        if file.workers.is_empty() || file.schedule.steps.is_empty() {
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

/// Reads a JSON file of `what`; a bad one is refused with `file:line:column`.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|err| Error::io_at(path, err))?;
    serde_json::from_str(&text).map_err(|err| {
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
    use crate::schedule::{RequestSpec, Step};

    #[test]
    fn a_schedule_file_round_trips_and_bad_ones_name_the_place() {
        let mut settings = CaseSettings::seed_pair();
        settings.defects = Defects::of([Defect::UnfencedFinalWrite]);
        let mut file = ScheduleFile::new(
            "lease-expiry",
            &settings,
            Schedule {
                requests: vec![RequestSpec {
                    request_id: "req-0".into(),
                    input: "input-0".into(),
                }],
                steps: vec![
                    Step::Run {
                        worker: 0,
                        to: Checkpoint::AfterLease,
                    },
                    Step::Fault(Fault::ExpireLease { request: 0 }),
                    Step::Run {
                        worker: 1,
                        to: Checkpoint::AfterTake,
                    },
                ],
            },
        );
        file.found = Some(Found { seed: 7, case: 9 });
        file.violated = vec![Invariant::AtMostOneFinalWrite];
        let dir = std::env::temp_dir().join(format!("racecert-schedule-{}", std::process::id()));
        let path = dir.join("lease-expiry.json");
        file.write(&path).unwrap();
        let back = ScheduleFile::read(&path).unwrap();
        assert_eq!(back, file);
        assert_eq!(back.settings().defects, settings.defects);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"unfenced-final-write\""), "{text}");
        std::fs::write(&path, text.replace("\"run\"", "\"sprint\"")).unwrap();
        let err = ScheduleFile::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("lease-expiry.json:") && err.contains("sprint"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
