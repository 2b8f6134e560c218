//! Container ownership labels and the reaper. Every container racecert starts carries labels that
//! name its owner process (pid, process start time, boot id), and every worker process carries
//! the same in its environment (`RACECERT_OWNER`). Drop removes containers and kills workers
//! normally; a run killed with SIGKILL skips Drop, so the next test bed reaps every racecert
//! container and worker process whose owner is gone, and `racecert clean` does the same on demand.

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

/// The environment variable of every worker process racecert starts: its owner
/// (`pid:start:boot`), so the next start finds the processes a killed run left behind.
pub const OWNER_ENV: &str = "RACECERT_OWNER";

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

    /// The owner as a worker process's environment carries it ([`OWNER_ENV`]).
    pub fn env_value(&self) -> String {
        format!("{}:{}:{}", self.pid, self.start, self.boot)
    }

    fn parse(value: &str) -> Option<Owner> {
        let mut parts = value.splitn(3, ':');
        Some(Owner {
            pid: parts.next()?.parse().ok()?,
            start: parts.next()?.to_owned(),
            boot: parts.next()?.to_owned(),
        })
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

/// The start time of a running process (a zombie, killed and not yet waited for, is gone).
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields resume after the
    // last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // after_comm starts at field 3 (the state); the start time is field 22.
    let mut fields = after_comm.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18).map(str::to_owned)
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

/// Kills the worker processes (with their process groups: a framework's forked children too)
/// whose owner is gone: a run killed with SIGKILL, or one that exited at once on a second signal,
/// leaves its workers polling services that are gone. Returns the pids killed.
pub fn reap_processes() -> Vec<u32> {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::{Pid, getpgid};
    let mut killed = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Another user's processes, and zombies, have no readable environment: not ours.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let Some(owner) = owner_in(&environ) else {
            continue;
        };
        if owner.is_alive() {
            continue;
        }
        let target = Pid::from_raw(pid as i32);
        let _ = if getpgid(Some(target)).ok() == Some(target) {
            killpg(target, Signal::SIGKILL)
        } else {
            kill(target, Signal::SIGKILL)
        };
        killed.push(pid);
    }
    killed
}

/// The owner named in a process's environment (`/proc/PID/environ`: NUL-separated).
fn owner_in(environ: &[u8]) -> Option<Owner> {
    let prefix = format!("{OWNER_ENV}=");
    environ
        .split(|byte| *byte == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(Owner::parse)
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
    fn a_worker_of_a_gone_owner_is_reaped_and_one_of_a_live_owner_is_not() {
        use std::os::unix::process::CommandExt;
        let live = Owner::current();
        assert_eq!(Owner::parse(&live.env_value()), Some(live.clone()));
        let environ = |owner: &Owner| {
            format!("PATH=/bin\0{OWNER_ENV}={}\0HOME=/root\0", owner.env_value()).into_bytes()
        };
        assert_eq!(owner_in(&environ(&live)), Some(live.clone()));
        assert_eq!(owner_in(b"PATH=/bin\0HOME=/root\0"), None);
        let gone = Owner {
            start: "1".into(),
            ..live.clone()
        };
        let spawn = |owner: &Owner| {
            std::process::Command::new("sleep")
                .arg("60")
                .env(OWNER_ENV, owner.env_value())
                .process_group(0)
                .spawn()
                .expect("sleep")
        };
        let (mut orphan, mut kept) = (spawn(&gone), spawn(&live));
        // Until it has exec'd, a child's environment is still its parent's.
        for child in [&orphan, &kept] {
            let environ = format!("/proc/{}/environ", child.id());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::fs::read(&environ)
                .ok()
                .and_then(|e| owner_in(&e))
                .is_none()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let reaped = reap_processes();
        assert!(reaped.contains(&orphan.id()), "{reaped:?}");
        assert!(!reaped.contains(&kept.id()));
        assert!(orphan.wait().is_ok());
        assert!(
            kept.try_wait().expect("kept").is_none(),
            "a live owner's worker stays"
        );
        let _ = kept.kill();
        let _ = kept.wait();
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
