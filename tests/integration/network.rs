//! The bed stays on loopback: every address a worker, a checker or a proxy uses is 127.0.0.1. On
//! the host network Docker publishes no port (no userland-proxy hop) and the services listen where
//! the bed says; with published ports (the fallback) every binding is on 127.0.0.1, and restarts
//! still work.

use racecert::env::containers::{Network, NetworkChoice};
use racecert::env::{Target, TestBed, reaper};
use sqlx::Connection;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

crate::tests!(
    every_address_is_loopback_and_host_mode_publishes_no_port,
    published_ports_fallback_serves_restarts_and_stays_on_loopback,
    on_the_host_network_restarts_keep_every_port,
);

/// Every URL of the bed and every proxy's listen and upstream address is on 127.0.0.1.
async fn assert_loopback(bed: &TestBed) -> anyhow::Result<()> {
    let addresses = bed.addresses();
    let mut urls = vec![
        addresses.redis_url,
        addresses.database_url,
        addresses.redis_direct_url,
        addresses.database_direct_url,
        addresses.toxiproxy_url,
    ];
    urls.extend(addresses.backends.into_iter().map(|(_, _, url)| url));
    for url in urls {
        let host = reqwest::Url::parse(&url)?.host_str().map(str::to_owned);
        anyhow::ensure!(
            host.as_deref() == Some("127.0.0.1"),
            "{url} is not on 127.0.0.1"
        );
    }
    let proxies = bed.toxiproxy().all().await?;
    let mine: Vec<_> = proxies
        .iter()
        .filter(|p| p.name.starts_with(bed.id()))
        .collect();
    anyhow::ensure!(!mine.is_empty(), "the bed's proxies are not listed");
    for proxy in mine {
        for addr in [&proxy.listen, &proxy.upstream] {
            let parsed: SocketAddr = addr.parse()?;
            anyhow::ensure!(
                parsed.ip() == Ipv4Addr::LOCALHOST,
                "proxy {} uses {addr}, not 127.0.0.1",
                proxy.name
            );
        }
    }
    Ok(())
}

fn docker(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("docker").args(args).output()?;
    anyhow::ensure!(
        output.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The bed's Redis and PostgreSQL containers, as the engine describes them: network mode, the
/// ports it publishes, the server's arguments.
async fn assert_containers(bed: &TestBed, network: Network) -> anyhow::Result<()> {
    let prefix = format!("racecert-{}-", bed.id());
    let direct = [
        ("redis", bed.redis_direct_url()),
        ("postgres", bed.database_direct_url()),
    ];
    let containers: Vec<_> = reaper::list_managed()?
        .into_iter()
        .filter(|c| c.name.starts_with(&prefix))
        .collect();
    anyhow::ensure!(
        containers.len() == 2,
        "expected the bed's redis and postgres containers, found {containers:?}"
    );
    for (service, url) in direct {
        let container = containers
            .iter()
            .find(|c| c.service == service)
            .ok_or_else(|| anyhow::anyhow!("no {service} container among {containers:?}"))?;
        let port = reqwest::Url::parse(&url)?
            .port()
            .ok_or_else(|| anyhow::anyhow!("{url} names no port"))?;
        let id = container.id.clone();
        let (mode, published, args) = tokio::task::spawn_blocking(move || {
            anyhow::Ok((
                docker(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &id])?,
                docker(&["port", &id])?,
                docker(&["inspect", "--format", "{{json .Args}}", &id])?,
            ))
        })
        .await??;
        match network {
            Network::Host => {
                anyhow::ensure!(mode == "host", "{service} runs on network {mode:?}");
                anyhow::ensure!(
                    published.is_empty(),
                    "{service} publishes ports on the host network: {published}"
                );
                let listens = match service {
                    "redis" => {
                        args.contains(&format!("\"--port\",\"{port}\""))
                            && args.contains("\"--bind\",\"127.0.0.1\"")
                    }
                    _ => {
                        args.contains(&format!("\"port={port}\""))
                            && args.contains("\"listen_addresses=127.0.0.1\"")
                    }
                };
                anyhow::ensure!(
                    listens,
                    "{service} is reached at {url} but started with {args}"
                );
            }
            Network::Published => {
                anyhow::ensure!(mode != "host", "{service} runs on the host network");
                anyhow::ensure!(!published.is_empty(), "{service} publishes no port");
                for line in published.lines() {
                    anyhow::ensure!(
                        line.contains("-> 127.0.0.1:"),
                        "{service} publishes beyond loopback: {line}"
                    );
                }
                anyhow::ensure!(
                    published.contains(&format!("127.0.0.1:{port}")),
                    "{service} is reached at {url} but published as {published}"
                );
            }
        }
    }
    Ok(())
}

async fn every_address_is_loopback_and_host_mode_publishes_no_port(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    assert_loopback(bed).await?;
    match bed.network() {
        Some(network) => {
            eprintln!("    the bed's services run with {network} networking");
            assert_containers(bed, network).await
        }
        // External services: their addresses are the user's; the loopback check above is ours.
        None => Ok(()),
    }
}

/// Restarts Redis and PostgreSQL of a bed of their own: a key written before is gone, both
/// answer through their proxies after, and the bed stays on loopback. Returns the direct
/// addresses before and after.
async fn restart_both(bed: &TestBed) -> anyhow::Result<[(String, String); 2]> {
    let before = (bed.redis_direct_url(), bed.database_direct_url());
    let client = redis::Client::open(bed.redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg("network:lease")
        .arg("token")
        .query_async(&mut conn)
        .await?;
    bed.restart(Target::Redis).await?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let survived: bool = redis::cmd("EXISTS")
        .arg("network:lease")
        .query_async(&mut conn)
        .await?;
    anyhow::ensure!(!survived, "a key survived the Redis restart");

    // A container restart may move a published port; the proxies follow it.
    bed.restart(Target::Postgres).await?;
    let mut pg = sqlx::PgConnection::connect(&bed.database_url()).await?;
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut pg).await?;
    anyhow::ensure!(one == 1);
    assert_loopback(bed).await?;
    Ok([before, (bed.redis_direct_url(), bed.database_direct_url())])
}

/// Runs `check` on a bed of its own with `choice`, and removes the bed whatever the outcome.
async fn with_own_bed<F, Fut>(choice: NetworkChoice, check: F) -> anyhow::Result<()>
where
    F: FnOnce(TestBed) -> Fut,
    Fut: std::future::Future<Output = (TestBed, anyhow::Result<()>)>,
{
    let bed = TestBed::builder().network(choice).start().await?;
    let (bed, outcome) = check(bed).await;
    bed.shutdown().await;
    outcome
}

async fn published_ports_fallback_serves_restarts_and_stays_on_loopback(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    if bed.network().is_none() {
        // External services (REDIS_URL/DATABASE_URL): this run starts no containers.
        return Ok(());
    }
    with_own_bed(NetworkChoice::Published, |published| async move {
        let outcome = async {
            anyhow::ensure!(published.network() == Some(Network::Published));
            assert_loopback(&published).await?;
            assert_containers(&published, Network::Published).await?;
            restart_both(&published).await?;
            assert_containers(&published, Network::Published).await
        }
        .await;
        (published, outcome)
    })
    .await
}

async fn on_the_host_network_restarts_keep_every_port(bed: &TestBed) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    if bed.network() != Some(Network::Host) {
        // External services, or an engine without usable host networking (the shared bed fell
        // back to published ports): there is no host-network bed to restart here.
        eprintln!("    no host networking in this run; nothing to restart");
        return Ok(());
    }
    with_own_bed(NetworkChoice::Host, |host| async move {
        let outcome = async {
            anyhow::ensure!(host.network() == Some(Network::Host));
            let [before, after] = restart_both(&host).await?;
            anyhow::ensure!(
                before == after,
                "a service moved across its restart: {before:?} -> {after:?}"
            );
            assert_containers(&host, Network::Host).await
        }
        .await;
        (host, outcome)
    })
    .await
}
