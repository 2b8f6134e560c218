//! Leases: `SET inference:lock:{key} {token} NX PX ttl` through the Redis proxy.

use racecert::contract::Keys;
use racecert::env::TestBed;
use std::time::Duration;

crate::tests!(two_contenders_exactly_one_wins_and_the_lease_frees_after_its_ttl);

async fn try_lease(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: &str,
    ttl_ms: u64,
) -> anyhow::Result<bool> {
    let reply: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(conn)
        .await?;
    Ok(reply.is_some())
}

async fn two_contenders_exactly_one_wins_and_the_lease_frees_after_its_ttl(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let keys = Keys::namespaced(&crate::namespace("lease"));
    let lease = keys.lease("job-1");
    let client = redis::Client::open(bed.redis_url())?;
    // Two separate connections, as two workers would have, racing for the same lease.
    let mut a = client.get_multiplexed_async_connection().await?;
    let mut b = client.get_multiplexed_async_connection().await?;
    let (won_a, won_b) = tokio::join!(
        try_lease(&mut a, &lease, "token-a", 300),
        try_lease(&mut b, &lease, "token-b", 300)
    );
    let (won_a, won_b) = (won_a?, won_b?);
    anyhow::ensure!(
        won_a ^ won_b,
        "exactly one contender must win, got a={won_a} b={won_b}"
    );
    let (winner, loser, loser_conn) = if won_a {
        ("token-a", "token-b", &mut b)
    } else {
        ("token-b", "token-a", &mut a)
    };
    let holder: String = redis::cmd("GET")
        .arg(&lease)
        .query_async(loser_conn)
        .await?;
    anyhow::ensure!(holder == winner, "lease holds {holder}, expected {winner}");
    anyhow::ensure!(
        !try_lease(loser_conn, &lease, loser, 300).await?,
        "a second SET NX must fail while the lease is held"
    );

    // The lease expires on Redis's clock: wait for that event (the key disappearing), bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&lease)
            .query_async(loser_conn)
            .await?;
        if ttl == -2 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "lease still present 5 s after a 300 ms TTL (PTTL {ttl})"
        );
        tokio::time::sleep(Duration::from_millis(ttl.clamp(1, 50) as u64)).await;
    }
    anyhow::ensure!(
        try_lease(loser_conn, &lease, loser, 300).await?,
        "after the TTL the lease must be free for the other contender"
    );
    Ok(())
}
