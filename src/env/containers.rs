//! Redis and PostgreSQL containers, started with testcontainers from the locally built images.
//! Ports are published on 127.0.0.1 only, readiness comes from wait conditions (a log line, then
//! a real query), and every container carries the reaper's ownership labels.

use crate::env::images::ImageRef;
use crate::env::reaper::Owner;
use crate::{Error, Result};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use testcontainers::bollard::models::PortBinding;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// Port Redis listens on inside its container.
pub const REDIS_PORT: u16 = 6379;
/// Port PostgreSQL listens on inside its container.
pub const POSTGRES_PORT: u16 = 5432;
/// Database user in the container.
pub const POSTGRES_USER: &str = "racecert";
/// Database name in the container.
pub const POSTGRES_DB: &str = "racecert";

/// A running service container.
pub struct ServiceContainer {
    container: ContainerAsync<GenericImage>,
    service: &'static str,
    internal_port: u16,
}

impl std::fmt::Debug for ServiceContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceContainer")
            .field("service", &self.service)
            .field("id", &self.container.id())
            .finish()
    }
}

impl ServiceContainer {
    /// The container id.
    pub fn id(&self) -> &str {
        self.container.id()
    }

    /// The service name.
    pub fn service(&self) -> &'static str {
        self.service
    }

    /// Where the service is published on the host (127.0.0.1). Ask again after a restart: the
    /// engine may publish it on another port.
    pub async fn host_addr(&self) -> Result<SocketAddr> {
        let port = self
            .container
            .get_host_port_ipv4(self.internal_port)
            .await
            .map_err(|source| Error::Container {
                service: self.service,
                source,
            })?;
        Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    /// Stops the container (SIGTERM, then SIGKILL after `grace`) and starts it again. Volatile
    /// state is lost; the caller waits for readiness and re-points the proxy.
    pub async fn restart(&self, grace: Duration) -> Result<()> {
        let err = |source| Error::Container {
            service: self.service,
            source,
        };
        self.container
            .stop_with_timeout(Some(grace.as_secs() as i32))
            .await
            .map_err(err)?;
        self.container.start().await.map_err(err)
    }

    /// Removes the container now and waits for it.
    pub async fn remove(self) {
        let id = self.container.id().to_owned();
        if let Err(err) = self.container.rm().await {
            tracing::warn!(%id, service = self.service, %err, "could not remove container");
        }
    }
}

/// Publishes exactly `port` on 127.0.0.1 at a port the engine picks: a test bed must not be
/// reachable from other machines.
fn loopback_only(port: u16) -> impl Fn(&mut testcontainers::bollard::models::HostConfig) {
    move |host_config| {
        let binding = PortBinding {
            host_ip: Some(Ipv4Addr::LOCALHOST.to_string()),
            host_port: Some(String::new()),
        };
        host_config.publish_all_ports = Some(false);
        host_config.port_bindings = Some(HashMap::from([(
            format!("{port}/tcp"),
            Some(vec![binding]),
        )]));
    }
}

/// Starts Redis without persistence; ready when it logs that it accepts connections.
pub async fn start_redis(image: &ImageRef, owner: &Owner) -> Result<ServiceContainer> {
    let container = GenericImage::new(&image.name, &image.tag)
        .with_exposed_port(REDIS_PORT.tcp())
        .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
        .with_cmd([
            "redis-server",
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .with_labels(owner.labels("redis"))
        .with_host_config_modifier(loopback_only(REDIS_PORT))
        .with_startup_timeout(Duration::from_secs(60))
        .start()
        .await
        .map_err(|source| Error::Container {
            service: "redis",
            source,
        })?;
    Ok(ServiceContainer {
        container,
        service: "redis",
        internal_port: REDIS_PORT,
    })
}

/// Starts PostgreSQL with `password` and durability off (a test bed needs speed, not crash
/// safety); ready when it logs that it accepts connections. The official image logs that line
/// twice (once from its temporary init server), so callers also wait for a real query.
pub async fn start_postgres(
    image: &ImageRef,
    owner: &Owner,
    password: &str,
) -> Result<ServiceContainer> {
    let container = GenericImage::new(&image.name, &image.tag)
        .with_exposed_port(POSTGRES_PORT.tcp())
        .with_wait_for(WaitFor::message_on_either_std(
            "database system is ready to accept connections",
        ))
        .with_env_var("POSTGRES_USER", POSTGRES_USER)
        .with_env_var("POSTGRES_PASSWORD", password)
        .with_env_var("POSTGRES_DB", POSTGRES_DB)
        .with_cmd([
            "postgres",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
        ])
        .with_labels(owner.labels("postgres"))
        .with_host_config_modifier(loopback_only(POSTGRES_PORT))
        .with_startup_timeout(Duration::from_secs(120))
        .start()
        .await
        .map_err(|source| Error::Container {
            service: "postgres",
            source,
        })?;
    Ok(ServiceContainer {
        container,
        service: "postgres",
        internal_port: POSTGRES_PORT,
    })
}

/// Starts the fault-proxy image on the host network, its API on a free loopback port, and
/// returns it with the API URL. Host networking lets the proxies it creates listen on loopback
/// ports and reach the published ports of the other containers, exactly like the embedded server.
/// The arguments suit both racecert's image and Shopify's toxiproxy (Go flags accept `--name=value`).
pub async fn start_proxy(image: &ImageRef, owner: &Owner) -> Result<(ServiceContainer, String)> {
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map_err(|err| Error::io("find a free port for the proxy API", err))?
        .port();
    let container = GenericImage::new(&image.name, &image.tag)
        .with_wait_for(WaitFor::Nothing)
        .with_network("host")
        .with_cmd(["--host=127.0.0.1".to_owned(), format!("--port={port}")])
        .with_labels(owner.labels("toxiproxy"))
        .start()
        .await
        .map_err(|source| Error::Container {
            service: "toxiproxy",
            source,
        })?;
    Ok((
        ServiceContainer {
            container,
            service: "toxiproxy",
            internal_port: port,
        },
        format!("http://127.0.0.1:{port}"),
    ))
}

/// Waits until `probe` succeeds, retrying with a short backoff until `timeout`. This is a
/// readiness condition (a real command against the service), not a sleep standing in for one.
pub async fn wait_ready<F, Fut, T, E>(service: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, E>>,
    E: std::fmt::Display,
{
    let started = Instant::now();
    let mut backoff = Duration::from_millis(10);
    loop {
        match probe().await {
            Ok(value) => return Ok(value),
            Err(err) if started.elapsed() >= timeout => {
                return Err(Error::NotReady {
                    service: service.to_owned(),
                    waited_ms: started.elapsed().as_millis(),
                    last_error: err.to_string(),
                });
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}
