//! No leaked containers: leftovers of a run killed with SIGKILL (which skips Drop) are reaped.

use racecert::env::{TestBed, reaper};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

crate::tests!(containers_of_a_killed_run_are_reaped_and_live_ones_are_kept);

async fn containers_of_a_killed_run_are_reaped_and_live_ones_are_kept(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let pid = tokio::task::spawn_blocking(|| -> anyhow::Result<u32> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_racecert"))
            .args(["env", "up"])
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("TOXIPROXY_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped");
        let mut up = false;
        for line in BufReader::new(stdout).lines() {
            if line?.starts_with("test bed up") {
                up = true;
                break;
            }
        }
        // SIGKILL: the child gets no chance to run Drop.
        child.kill()?;
        child.wait()?;
        anyhow::ensure!(up, "racecert env up exited before its test bed was up");
        Ok(pid)
    })
    .await??;

    let orphans: Vec<_> = reaper::list_managed()?
        .into_iter()
        .filter(|c| c.owner.pid == pid)
        .collect();
    anyhow::ensure!(
        orphans.len() == 2,
        "expected the killed run's redis and postgres containers, found {orphans:?}"
    );
    anyhow::ensure!(orphans.iter().all(|c| !c.owner.is_alive()));
    // Postgres keeps its cluster on an anonymous volume: it must go with its container.
    let mut volumes = Vec::new();
    for orphan in &orphans {
        volumes.extend(volumes_of(&orphan.id)?);
    }
    anyhow::ensure!(
        !volumes.is_empty(),
        "the killed run's postgres container has no data volume"
    );

    let removed = tokio::task::spawn_blocking(|| reaper::reap(false)).await??;
    let me = reaper::Owner::current();
    anyhow::ensure!(
        removed.iter().all(|c| c.owner != me),
        "the reaper removed a container of a live run"
    );
    let left = reaper::list_managed()?;
    anyhow::ensure!(
        left.iter().all(|c| c.owner.pid != pid),
        "leftovers survived the reaper: {left:?}"
    );
    anyhow::ensure!(
        left.iter().filter(|c| c.owner == me).count() >= 2,
        "this run's own containers must survive"
    );
    for volume in &volumes {
        let inspect = Command::new("docker")
            .args(["volume", "inspect", volume])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(
            !inspect.success(),
            "volume {volume} of a reaped container survived the reaper"
        );
    }
    Ok(())
}

/// The names of the volumes mounted in container `id`.
fn volumes_of(id: &str) -> anyhow::Result<Vec<String>> {
    let output = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}",
            id,
        ])
        .stdin(Stdio::null())
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "docker inspect {id}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect())
}
