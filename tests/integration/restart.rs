//! Container restarts: the "lock lost" fault. Takes the bed's exclusive lock.

use racecert::contract::Keys;
use racecert::env::{Target, TestBed};

crate::tests!(restarting_redis_loses_every_lease_and_workers_keep_their_address);

async fn restarting_redis_loses_every_lease_and_workers_keep_their_address(
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
