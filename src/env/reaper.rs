//! Container ownership labels and the reaper. Every container racecert starts carries labels that
//! name its owner process (pid, process start time, boot id). Drop removes containers normally;
//! a run killed with SIGKILL skips Drop, so the next test bed reaps every racecert container
//! whose owner is gone, and `racecert clean` does the same on demand.

use crate::Result;
use crate::env::images::docker;

/// Marks a container as racecert's.
pub const MANAGED_LABEL: &str = "racecert.managed";
/// The owning process id.
pub const OWNER_PID_LABEL: &str = "racecert.owner.pid";
/// The owning process's start time (clock ticks since boot), so a reused pid is not mistaken for
/// the owner.
pub const OWNER_START_LABEL: &str = "racecert.owner.start";
/// The kernel boot id of the owner's machine: after a reboot every old owner is gone.
pub const OWNER_BOOT_LABEL: &str = "racecert.owner.boot";
/// Which service the container runs.
pub const SERVICE_LABEL: &str = "racecert.service";

/// Identity of a process as the reaper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start: String,
    /// Kernel boot id.
    pub boot: String,
}

impl Owner {
    /// The current process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start: process_start(pid).unwrap_or_default(),
            boot: boot_id(),
        }
    }

    /// Whether this owner is still running on this machine.
    pub fn is_alive(&self) -> bool {
        self.boot == boot_id() && process_start(self.pid).is_some_and(|start| start == self.start)
    }

    /// The labels to put on a container owned by this process.
    pub fn labels(&self, service: &str) -> Vec<(String, String)> {
        vec![
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            (OWNER_PID_LABEL.to_owned(), self.pid.to_string()),
            (OWNER_START_LABEL.to_owned(), self.start.clone()),
            (OWNER_BOOT_LABEL.to_owned(), self.boot.clone()),
            (SERVICE_LABEL.to_owned(), service.to_owned()),
        ]
    }
}

fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields resume after the
    // last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // after_comm starts at field 3; the start time is field 22.
    after_comm.split_whitespace().nth(19).map(str::to_owned)
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

/// A racecert container as listed by the engine.
#[derive(Debug, Clone)]
pub struct ManagedContainer {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Service label.
    pub service: String,
    /// Its owner.
    pub owner: Owner,
}

/// Lists every racecert-labelled container, running or not.
pub fn list_managed() -> Result<Vec<ManagedContainer>> {
    let format = format!(
        "{{{{.ID}}}}\t{{{{.Names}}}}\t{{{{.Label \"{SERVICE_LABEL}\"}}}}\t{{{{.Label \"{OWNER_PID_LABEL}\"}}}}\t{{{{.Label \"{OWNER_START_LABEL}\"}}}}\t{{{{.Label \"{OWNER_BOOT_LABEL}\"}}}}"
    );
    let output = docker(
        &[
            "ps",
            "-a",
            "--filter",
            &format!("label={MANAGED_LABEL}=true"),
            "--format",
            &format,
        ],
        "ps",
    )?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            if fields.len() < 6 {
                return None;
            }
            Some(ManagedContainer {
                id: fields[0].to_owned(),
                name: fields[1].to_owned(),
                service: fields[2].to_owned(),
                owner: Owner {
                    pid: fields[3].parse().unwrap_or(0),
                    start: fields[4].to_owned(),
                    boot: fields[5].to_owned(),
                },
            })
        })
        .collect())
}

/// Removes racecert containers whose owner process is gone (or all of them with `all`).
/// Returns the removed containers.
pub fn reap(all: bool) -> Result<Vec<ManagedContainer>> {
    let doomed: Vec<ManagedContainer> = list_managed()?
        .into_iter()
        .filter(|c| all || !c.owner.is_alive())
        .collect();
    if !doomed.is_empty() {
        remove(&doomed)?;
        for container in &doomed {
            tracing::info!(id = %container.id, name = %container.name, service = %container.service, owner_pid = container.owner.pid, "removed leftover racecert container");
        }
    }
    Ok(doomed)
}

/// Removes the containers. Another racecert process may be reaping the same leftovers, or the
/// engine may still be finishing a removal its owner asked for as it exited: a container that is
/// already gone or already being removed is what we wanted, not an error.
fn remove(doomed: &[ManagedContainer]) -> Result<()> {
    let mut args = vec!["rm", "-f", "-v"];
    args.extend(doomed.iter().map(|c| c.id.as_str()));
    let output = std::process::Command::new("docker")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|err| crate::Error::Docker(format!("docker rm: {err}")))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || only_removals_under_way(&stderr) {
        return Ok(());
    }
    Err(crate::Error::Docker(format!(
        "`docker {}` failed ({}):\n{}",
        args.join(" "),
        output.status,
        stderr.trim_end()
    )))
}

/// Whether every error `docker rm` printed says the container is gone or already being removed.
fn only_removals_under_way(stderr: &str) -> bool {
    let errors: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    !errors.is_empty()
        && errors.iter().all(|line| {
            line.contains("is already in progress") || line.contains("No such container")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_already_under_way_are_not_errors_and_other_failures_are() {
        let racing = "Error response from daemon: removal of container a66392460dc6 is already in progress\n";
        assert!(only_removals_under_way(racing));
        let gone = "Error response from daemon: No such container: 42bbe4d1c672\n";
        assert!(only_removals_under_way(&format!("{racing}{gone}")));
        let denied = "Error response from daemon: permission denied\n";
        assert!(!only_removals_under_way(&format!("{racing}{denied}")));
        assert!(
            !only_removals_under_way(""),
            "a failure with no message is a failure"
        );
    }

    #[test]
    fn current_process_is_alive_and_a_dead_one_is_not() {
        let me = Owner::current();
        assert!(!me.start.is_empty());
        assert!(me.is_alive());
        let reused_pid = Owner {
            start: "1".to_owned(),
            ..me.clone()
        };
        assert!(!reused_pid.is_alive(), "same pid, other start time");
        let rebooted = Owner {
            boot: "another-boot".to_owned(),
            ..me
        };
        assert!(!rebooted.is_alive());
    }
}
