//! Faults on the wire: toxics and partitions on proxies dedicated to each test.

use racecert::contract::InferRequest;
use racecert::env::proxy::{Direction, Toxic};
use racecert::env::{Target, TestBed};
use sqlx::Connection;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

crate::tests!(
    latency_toxic_of_300ms_on_a_backend_proxy_delays_the_call_by_at_least_that,
    timeout_toxic_makes_a_client_with_a_200ms_timeout_fail,
    disabled_postgres_proxy_fails_fast_and_enabling_it_restores_service,
    toxics_are_verified_and_errors_surface,
    reset_peer_toxic_resets_a_redis_connection_and_its_removal_heals_it,
    a_request_caught_by_a_cut_is_reset_even_when_the_link_heals_before_the_reset,
);

fn infer_body(namespace: &str) -> InferRequest {
    InferRequest {
        input: "hello".into(),
        idempotency_key: format!("{namespace}:job"),
        attempt: 1,
        worker_id: "test".into(),
    }
}

async fn latency_toxic_of_300ms_on_a_backend_proxy_delays_the_call_by_at_least_that(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Backend(0)).await?;
    let url = format!("http://{}/v1/infer", proxy.listen());
    let http = reqwest::Client::new();
    let body = infer_body(&crate::namespace("latency"));
    http.post(&url)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    proxy
        .add_toxic(
            Toxic::Latency {
                latency_ms: 300,
                jitter_ms: 0,
            },
            Direction::Downstream,
            1.0,
        )
        .await?;
    let started = Instant::now();
    http.post(&url)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        elapsed >= Duration::from_millis(300),
        "call took {elapsed:?} with a 300 ms latency toxic"
    );
    Ok(())
}

async fn timeout_toxic_makes_a_client_with_a_200ms_timeout_fail(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Backend(1)).await?;
    let url = format!("http://{}/v1/infer", proxy.listen());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()?;
    let body = infer_body(&crate::namespace("timeout"));
    http.post(&url)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    // timeout 0: data stops and the connection hangs until the toxic goes, like a stuck upstream.
    proxy
        .add_toxic(Toxic::Timeout { timeout_ms: 0 }, Direction::Upstream, 1.0)
        .await?;
    let result = http.post(&url).json(&body).send().await;
    match result {
        Err(err) if err.is_timeout() => {}
        other => anyhow::bail!("expected the client's 200 ms timeout, got {other:?}"),
    }
    proxy.clear_toxics().await?;
    http.post(&url)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

async fn disabled_postgres_proxy_fails_fast_and_enabling_it_restores_service(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Postgres).await?;
    let url = bed.database_url().replace(
        &bed.postgres_proxy().listen().to_string(),
        &proxy.listen().to_string(),
    );
    let mut live = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("SELECT 1").execute(&mut live).await?;

    proxy.disable().await?;
    // A connection open across the partition breaks...
    let broken = sqlx::query("SELECT 1").execute(&mut live).await;
    anyhow::ensure!(
        broken.is_err(),
        "a query on a connection through a disabled proxy succeeded"
    );
    // ...and a new one is refused at once instead of hanging until some timeout.
    let started = Instant::now();
    let refused = sqlx::PgConnection::connect(&url).await;
    let took = started.elapsed();
    match refused {
        Err(sqlx::Error::Io(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => anyhow::bail!(
            "expected connection refused after {took:?}, got {:?}",
            other.map(|_| "a connection")
        ),
    }
    eprintln!("    postgres through a disabled proxy: refused in {took:?}");

    proxy.enable().await?;
    let mut again = sqlx::PgConnection::connect(&url).await?;
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut again).await?;
    anyhow::ensure!(one == 1);
    Ok(())
}

async fn toxics_are_verified_and_errors_surface(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Redis).await?;
    let toxics = [
        Toxic::Latency {
            latency_ms: 10,
            jitter_ms: 2,
        },
        Toxic::Bandwidth { rate_kbps: 100 },
        Toxic::Slicer {
            average_size: 64,
            size_variation: 8,
            delay_us: 10,
        },
        Toxic::LimitData { bytes: 4096 },
        Toxic::ResetPeer { timeout_ms: 5_000 },
    ];
    for toxic in toxics {
        proxy.add_toxic(toxic, Direction::Downstream, 1.0).await?;
    }
    let installed: Vec<String> = proxy
        .info()
        .await?
        .toxics
        .into_iter()
        .map(|t| t.name)
        .collect();
    for toxic in toxics {
        let name = toxic.name(Direction::Downstream);
        anyhow::ensure!(
            installed.contains(&name),
            "{name} missing from {installed:?}"
        );
    }
    // The same toxic twice is a conflict the server reports, and we surface.
    let duplicate = proxy
        .add_toxic(
            Toxic::Bandwidth { rate_kbps: 100 },
            Direction::Downstream,
            1.0,
        )
        .await;
    anyhow::ensure!(
        duplicate.is_err(),
        "a duplicate toxic was accepted silently"
    );
    proxy.clear_toxics().await?;
    anyhow::ensure!(proxy.info().await?.toxics.is_empty());

    // A server that is not there: errors, not panics.
    let nowhere = racecert::env::proxy::FaultProxy::connect("http://127.0.0.1:9")?;
    anyhow::ensure!(nowhere.version().await.is_err());
    anyhow::ensure!(
        nowhere
            .create("x", "127.0.0.1:0", "127.0.0.1:1")
            .await
            .is_err()
    );
    let unknown = bed.toxiproxy().proxy("no-such-proxy").await;
    anyhow::ensure!(unknown.is_err(), "an unknown proxy was found");
    Ok(())
}

/// One inline RESP PING over a raw socket, so the test sees the socket error itself rather than a
/// client library's translation of it.
async fn ping(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    conn.write_all(b"PING\r\n").await?;
    let mut reply = vec![0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut reply))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply in 5 s"))??;
    Ok(reply)
}

async fn reset_peer_toxic_resets_a_redis_connection_and_its_removal_heals_it(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Redis).await?;
    let mut conn = TcpStream::connect(proxy.listen()).await?;
    anyhow::ensure!(ping(&mut conn).await? == b"+PONG\r\n");

    proxy
        .add_toxic(Toxic::ResetPeer { timeout_ms: 0 }, Direction::Upstream, 1.0)
        .await?;
    // The live connection and a new one are both reset on their next request.
    let mut fresh = TcpStream::connect(proxy.listen()).await?;
    for (which, conn) in [("live", &mut conn), ("new", &mut fresh)] {
        match ping(conn).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => anyhow::bail!("{which} connection: expected a reset, got {other:?}"),
        }
    }

    proxy
        .remove_toxic(&Toxic::ResetPeer { timeout_ms: 0 }.name(Direction::Upstream))
        .await?;
    let mut healed = TcpStream::connect(proxy.listen()).await?;
    anyhow::ensure!(ping(&mut healed).await? == b"+PONG\r\n");
    Ok(())
}

/// A partition heals while a request it caught is still inside the reset toxic (here held 300 ms
/// before the reset): the connection must still be reset. Before the fix the proxy rebuilt the
/// connection without the toxic and without the request's bytes, which the toxic had swallowed,
/// and the client waited for a reply until its own timeout: a worker's Redis reconnect that began
/// just before a heal hung for its 1 s connection timeout, and full-rollout's drains with it.
async fn a_request_caught_by_a_cut_is_reset_even_when_the_link_heals_before_the_reset(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let proxy = bed.dedicated_proxy(Target::Redis).await?;
    let cut = Toxic::ResetPeer { timeout_ms: 300 };
    proxy.add_toxic(cut, Direction::Upstream, 1.0).await?;
    let mut caught = TcpStream::connect(proxy.listen()).await?;
    caught.write_all(b"PING\r\n").await?;
    // The toxic has the bytes (it swallows the first chunk, then waits 300 ms to reset).
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.remove_toxic(&cut.name(Direction::Upstream)).await?;
    let started = Instant::now();
    let mut reply = [0u8; 7];
    let read = tokio::time::timeout(Duration::from_secs(3), caught.read(&mut reply)).await;
    match read {
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(Ok(0)) => {}
        other => anyhow::bail!(
            "the caught request must end its connection, got {other:?} after {:?}",
            started.elapsed()
        ),
    }
    // The healed link serves new connections.
    let mut healed = TcpStream::connect(proxy.listen()).await?;
    anyhow::ensure!(ping(&mut healed).await? == b"+PONG\r\n");
    Ok(())
}
