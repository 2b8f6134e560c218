//! Container restarts: the "lock lost" fault. Takes the bed's exclusive lock.

use racecert::contract::Keys;
use racecert::env::containers::Network;
use racecert::env::{Target, TestBed};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

crate::tests!(restarting_redis_loses_every_lease_drops_every_socket_and_keeps_addresses);

async fn run_id(url: &str) -> anyhow::Result<String> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| anyhow::anyhow!("INFO server names no run_id"))
}

async fn restarting_redis_loses_every_lease_drops_every_socket_and_keeps_addresses(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _exclusive = bed.exclusive().await;
    let keys = Keys::namespaced(&crate::namespace("restart"));
    let worker_url = bed.redis_url();
    let client = redis::Client::open(worker_url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for job in ["job-1", "job-2", "job-3"] {
        let _: () = redis::cmd("SET")
            .arg(keys.lease(job))
            .arg("token")
            .arg("NX")
            .arg("PX")
            .arg(600_000)
            .query_async(&mut conn)
            .await?;
    }
    // A worker's socket through the proxy, proven open by a round trip.
    let mut socket = TcpStream::connect(bed.redis_proxy().listen()).await?;
    socket.write_all(b"PING\r\n").await?;
    let mut pong = [0u8; 7];
    socket.read_exact(&mut pong).await?;
    anyhow::ensure!(&pong == b"+PONG\r\n", "unexpected answer {pong:?}");
    let run_before = run_id(&bed.redis_direct_url()).await?;
    let direct_before = bed.redis_direct_url();

    let took = bed.restart(Target::Redis).await?;
    eprintln!(
        "    redis restarted in {took:.1?}; direct address {direct_before} -> {}",
        bed.redis_direct_url()
    );
    anyhow::ensure!(
        bed.redis_url() == worker_url,
        "the worker-facing address changed"
    );
    if bed.network() == Some(Network::Host) {
        anyhow::ensure!(
            bed.redis_direct_url() == direct_before,
            "on the host network Redis keeps its port across a restart"
        );
    }
    anyhow::ensure!(
        run_id(&bed.redis_direct_url()).await? != run_before,
        "the same Redis server answers after the restart"
    );
    // The old socket was closed by the restart: it reads end of stream (or a reset), not
    // silence. The bound only keeps a broken restart from hanging the test.
    let mut rest = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), socket.read(&mut rest)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => anyhow::bail!("the old socket read {n} bytes after the restart"),
        Err(_) => anyhow::bail!("the old socket is still open 10 s after the restart"),
    }
    // A fresh connection on the same worker address reaches the restarted Redis.
    let mut conn = client.get_multiplexed_async_connection().await?;
    for job in ["job-1", "job-2", "job-3"] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(keys.lease(job))
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(!exists, "lease of {job} survived the restart");
    }
    Ok(())
}
