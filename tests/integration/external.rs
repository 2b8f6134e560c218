//! External mode: existing services and an existing Toxiproxy instead of containers; and the
//! proxy packaged as a container.

use racecert::Error;
use racecert::env::proxy::{Direction, Toxic};
use racecert::env::{Target, TestBed};
use sqlx::Connection;
use std::time::{Duration, Instant};

crate::tests!(
    an_unmarked_database_is_refused_and_left_untouched_a_marked_one_is_set_up,
    the_proxy_image_serves_the_same_api_as_the_embedded_proxy,
);

async fn an_unmarked_database_is_refused_and_left_untouched_a_marked_one_is_set_up(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let name = crate::namespace("ext").replace('-', "_");
    let mut admin = sqlx::PgConnection::connect(&bed.database_direct_url()).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    let mut url = reqwest::Url::parse(&bed.database_direct_url())?;
    url.set_path(&format!("/{name}"));

    let external = || {
        TestBed::builder()
            .external_services(&bed.redis_direct_url(), url.as_str())
            .external_proxy(bed.toxiproxy().url())
            .start()
    };
    match external().await {
        Err(Error::Refused(message)) => {
            anyhow::ensure!(
                message.contains("COMMENT ON DATABASE"),
                "unhelpful refusal: {message}"
            )
        }
        Err(other) => anyhow::bail!("expected a refusal, got {other}"),
        Ok(_) => anyhow::bail!("an unmarked database was accepted"),
    }
    let mut target = sqlx::PgConnection::connect(url.as_str()).await?;
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('inference_jobs')::text")
        .fetch_one(&mut target)
        .await?;
    anyhow::ensure!(table.is_none(), "the refused setup created inference_jobs");

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "COMMENT ON DATABASE {name} IS '{}'",
        racecert::env::TEST_DATABASE_MARKER
    )))
    .execute(&mut admin)
    .await?;
    let marked = external().await?;
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('inference_jobs')::text")
        .fetch_one(&mut target)
        .await?;
    anyhow::ensure!(table.as_deref() == Some("inference_jobs"));
    let id = marked.id().to_owned();
    marked.shutdown().await;
    let left: Vec<String> = bed
        .toxiproxy()
        .all()
        .await?
        .into_iter()
        .map(|p| p.name)
        .filter(|n| n.starts_with(&format!("{id}-")))
        .collect();
    anyhow::ensure!(
        left.is_empty(),
        "external bed left proxies behind: {left:?}"
    );
    drop(target);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    Ok(())
}

async fn the_proxy_image_serves_the_same_api_as_the_embedded_proxy(
    bed: &TestBed,
) -> anyhow::Result<()> {
    let _shared = bed.shared().await;
    let contained = TestBed::builder()
        .external_services(&bed.redis_direct_url(), &bed.database_direct_url())
        .container_proxy()
        .start()
        .await?;
    let version = contained.toxiproxy().version().await?;
    anyhow::ensure!(!version.is_empty());
    let proxy = contained.dedicated_proxy(Target::Backend(0)).await?;
    proxy
        .add_toxic(
            Toxic::Latency {
                latency_ms: 200,
                jitter_ms: 0,
            },
            Direction::Downstream,
            1.0,
        )
        .await?;
    let started = Instant::now();
    reqwest::Client::new()
        .post(format!("http://{}/v1/infer", proxy.listen()))
        .json(&serde_json::json!({"input": "x", "idempotency_key": "k"}))
        .send()
        .await?
        .error_for_status()?;
    anyhow::ensure!(started.elapsed() >= Duration::from_millis(200));
    drop(proxy);
    contained.shutdown().await;
    Ok(())
}
