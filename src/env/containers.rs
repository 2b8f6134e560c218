//! Redis and PostgreSQL containers, started with testcontainers from the locally built images, and
//! the fault-proxy container. Readiness comes from wait conditions (a log line, then a real query),
//! and every container carries the reaper's ownership labels.
//!
//! Why one file of ~870 lines: about 65 lines are tests; the rest is one container life cycle
//! (image, network mode, wait, labels) shared by Redis, Postgres and the proxy container.
//!
//! Networking ([`Network`]): by default the services run on the host network, bound to 127.0.0.1
//! on free ports, so a round trip skips Docker's userland proxy (docker-proxy roughly halves a
//! single client's round trip) and still never leaves loopback. Where host networking is not
//! usable, their ports are published on 127.0.0.1 instead. `RACECERT_NETWORK` chooses
//! ([`NetworkChoice`]). Test traffic never goes to a container's bridge address.

use crate::env::images::ImageRef;
use crate::env::reaper::Owner;
use crate::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::io::AsyncBufReadExt;

/// Port Redis listens on inside its container (published mode).
pub const REDIS_PORT: u16 = 6379;
/// Port PostgreSQL listens on inside its container (published mode).
pub const POSTGRES_PORT: u16 = 5432;
/// Database user in the container.
pub const POSTGRES_USER: &str = "racecert";
/// Database name in the container.
pub const POSTGRES_DB: &str = "racecert";

/// The environment variable that chooses the network ([`NetworkChoice`]).
pub const NETWORK_ENV: &str = "RACECERT_NETWORK";

/// How many free ports a host-mode service tries before giving up (see [`free_port`]).
const PORT_ATTEMPTS: usize = 4;
/// How long a host-mode service may take to answer on 127.0.0.1 once it logged that it listens.
/// It answers within milliseconds where host networking works; past this, it is not usable.
const HOST_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a restarted Redis server may take to log that it is ready.
const RESTART_TIMEOUT: Duration = Duration::from_secs(60);

/// The line Redis logs once it accepts connections (racecert's and the official image).
const REDIS_READY: &str = "Ready to accept connections";
/// What a server logs when its port is taken (Redis and PostgreSQL both say it this way).
const PORT_TAKEN: &str = "Address already in use";

/// Runs redis-server under a loop so that the `redis-restart` fault restarts the server process
/// (`SHUTDOWN NOSAVE`, which exits 0) without restarting the container: that is tens of
/// milliseconds instead of the engine's stop and start, the port stays, and it is still a real
/// restart (a new process: no key survives, every client socket is closed). A server that exits
/// on its own (port taken, crash) exits non-zero, ends the loop and with it the container, so a
/// failure shows instead of looping. The official image's entrypoint execs any command that is
/// not `redis-server` as it is, so the same command works there (as root instead of `redis`).
const REDIS_SUPERVISOR: &str = r#"while redis-server "$@"; do :; done; exit 1"#;

/// How the bed's Redis and PostgreSQL are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Host network: each service bound to 127.0.0.1 on a port of its own; no userland proxy.
    Host,
    /// Container network: the service port published on 127.0.0.1 through Docker's userland proxy.
    Published,
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Network::Host => "host",
            Network::Published => "published",
        })
    }
}

/// Which [`Network`] to use: `RACECERT_NETWORK=auto|host|published`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkChoice {
    /// Host networking where it is usable, else published ports (the default). Host networking is
    /// given up when the engine refuses a host-network container, or when a service that logged
    /// it listens on 127.0.0.1 does not answer a real query there (Docker Desktop, or a rootless
    /// engine, whose "host" network is not this machine's loopback). Given up once per process.
    #[default]
    Auto,
    /// Host networking, or an error saying why it is not usable.
    Host,
    /// Published ports, as before host networking existed.
    Published,
}

impl std::str::FromStr for NetworkChoice {
    type Err = Error;

    fn from_str(value: &str) -> Result<NetworkChoice> {
        match value.trim() {
            "" | "auto" => Ok(NetworkChoice::Auto),
            "host" => Ok(NetworkChoice::Host),
            "published" => Ok(NetworkChoice::Published),
            other => Err(Error::Config(format!(
                "{NETWORK_ENV}={other:?}: expected \"auto\", \"host\" or \"published\""
            ))),
        }
    }
}

impl NetworkChoice {
    /// Reads [`NETWORK_ENV`]; unset means [`NetworkChoice::Auto`].
    pub fn from_env() -> Result<NetworkChoice> {
        std::env::var(NETWORK_ENV)
            .map(|value| value.parse())
            .unwrap_or(Ok(NetworkChoice::Auto))
    }
}

/// A running service container.
pub struct ServiceContainer {
    container: ContainerAsync<GenericImage>,
    service: &'static str,
    network: Network,
    /// Host mode: the port the service listens on at 127.0.0.1. Published mode: its port inside
    /// the container.
    port: u16,
    /// Redis only: its ready lines, counted, so a restart waits for the new server's.
    ready_lines: Option<ReadyLines>,
}

impl std::fmt::Debug for ServiceContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceContainer")
            .field("service", &self.service)
            .field("id", &self.container.id())
            .field("network", &self.network)
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

    /// How the service is reached.
    pub fn network(&self) -> Network {
        self.network
    }

    /// Where the service listens on the host (always 127.0.0.1). In host mode the port never
    /// changes; in published mode ask again after a container restart: the engine may publish it
    /// on another port.
    pub async fn host_addr(&self) -> Result<SocketAddr> {
        let port = match self.network {
            Network::Host => self.port,
            Network::Published => {
                self.container
                    .get_host_port_ipv4(self.port)
                    .await
                    .map_err(|source| Error::Container {
                        service: self.service,
                        source,
                    })?
            }
        };
        Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    /// Restarts the service; volatile state is lost. Redis: its server process, at once (see
    /// [`REDIS_SUPERVISOR`]; without persistence a kill loses exactly what a graceful stop
    /// does), returning once the new server logged that it is ready. Others: the container
    /// (SIGTERM, then SIGKILL after `grace`, then start). The caller waits for a real query, and
    /// in published mode re-points the proxies if the port moved.
    pub async fn restart(&self, grace: Duration) -> Result<()> {
        if let Some(lines) = &self.ready_lines {
            return self.restart_redis_server(lines).await;
        }
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

    async fn restart_redis_server(&self, lines: &ReadyLines) -> Result<()> {
        let seen = lines.seen();
        let addr = self.host_addr().await?;
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        // Success closes the connection without a reply; a reply is the server refusing.
        match redis::cmd("SHUTDOWN")
            .arg("NOSAVE")
            .query_async::<()>(&mut conn)
            .await
        {
            Err(err) if err.code().is_some() => return Err(err.into()),
            Ok(()) => return Err(Error::other("redis answered SHUTDOWN and kept running")),
            Err(_) => {}
        }
        lines.wait_beyond(seen, RESTART_TIMEOUT).await
    }

    /// Removes the container now and waits for it.
    pub async fn remove(self) {
        let id = self.container.id().to_owned();
        if let Err(err) = self.container.rm().await {
            tracing::warn!(%id, service = self.service, %err, "could not remove container");
        }
    }
}

/// Redis and PostgreSQL of one bed, and how they are reached.
#[derive(Debug)]
pub struct BedServices {
    /// The Redis container.
    pub redis: ServiceContainer,
    /// The PostgreSQL container.
    pub postgres: ServiceContainer,
    /// How both are reached.
    pub network: Network,
}

/// Why host networking was given up in this process ([`NetworkChoice::Auto`]), so later beds do
/// not pay for the attempt again.
static HOST_UNUSABLE: OnceLock<String> = OnceLock::new();

/// Starts Redis and PostgreSQL (`name` prefixes the container names) on the network `choice`
/// asks for, falling back from host networking to published ports in [`NetworkChoice::Auto`].
pub async fn start_services(
    choice: NetworkChoice,
    redis: &ImageRef,
    postgres: &ImageRef,
    owner: &Owner,
    password: &str,
    name: &str,
) -> Result<BedServices> {
    let published = || start_published(redis, postgres, owner, password, name);
    match choice {
        NetworkChoice::Published => published().await,
        NetworkChoice::Host => start_host(redis, postgres, owner, password, name)
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "{NETWORK_ENV}=host, but host networking is not usable here: {err}; \
                     unset it (or set {NETWORK_ENV}=published) to publish ports on 127.0.0.1 instead"
                ))
            }),
        NetworkChoice::Auto => {
            if let Some(reason) = HOST_UNUSABLE.get() {
                tracing::debug!(%reason, "host networking unusable in this process; publishing ports");
                return published().await;
            }
            match start_host(redis, postgres, owner, password, name).await {
                Ok(services) => Ok(services),
                Err(err) => {
                    tracing::warn!(error = %err, "host networking is not usable; publishing ports on 127.0.0.1 instead (set {NETWORK_ENV}=published to skip the attempt)");
                    let _ = HOST_UNUSABLE.set(err.to_string());
                    published().await
                }
            }
        }
    }
}

async fn start_published(
    redis: &ImageRef,
    postgres: &ImageRef,
    owner: &Owner,
    password: &str,
    name: &str,
) -> Result<BedServices> {
    let (redis, postgres) = tokio::join!(
        start_redis(
            redis,
            owner,
            Network::Published,
            REDIS_PORT,
            format!("{name}-redis")
        ),
        start_postgres(
            postgres,
            owner,
            password,
            Network::Published,
            POSTGRES_PORT,
            format!("{name}-postgres")
        )
    );
    both(redis, postgres, Network::Published).await
}

async fn start_host(
    redis: &ImageRef,
    postgres: &ImageRef,
    owner: &Owner,
    password: &str,
    name: &str,
) -> Result<BedServices> {
    let (redis, postgres) = tokio::join!(
        on_free_port("redis", |port, attempt| start_redis(
            redis,
            owner,
            Network::Host,
            port,
            format!("{name}-redis-h{attempt}")
        )),
        on_free_port("postgres", |port, attempt| start_postgres(
            postgres,
            owner,
            password,
            Network::Host,
            port,
            format!("{name}-postgres-h{attempt}")
        ))
    );
    both(redis, postgres, Network::Host).await
}

/// Both services, or the first error after removing whichever did start.
async fn both(
    redis: std::result::Result<ServiceContainer, StartError>,
    postgres: std::result::Result<ServiceContainer, StartError>,
    network: Network,
) -> Result<BedServices> {
    match (redis, postgres) {
        (Ok(redis), Ok(postgres)) => Ok(BedServices {
            redis,
            postgres,
            network,
        }),
        (redis, postgres) => {
            let mut first = None;
            for outcome in [redis, postgres] {
                match outcome {
                    Ok(container) => container.remove().await,
                    Err(err) => {
                        first.get_or_insert(err.into_error());
                    }
                }
            }
            Err(first.expect("one of the two failed"))
        }
    }
}

/// Why a container did not come up.
enum StartError {
    /// The service could not bind its host port: someone took it after [`free_port`] released it.
    PortTaken(Error),
    /// Anything else.
    Failed(Error),
}

impl StartError {
    fn into_error(self) -> Error {
        match self {
            StartError::PortTaken(err) | StartError::Failed(err) => err,
        }
    }
}

/// A port that was free on 127.0.0.1 a moment ago. Binding port 0 and releasing it races with
/// every other process choosing ports the same way, and the engine's container start leaves a
/// window of a few hundred milliseconds: [`on_free_port`] retries with another port when the
/// service reports that its port is taken, [`PORT_ATTEMPTS`] times at most.
fn free_port() -> Result<u16> {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|err| Error::io("find a free port on 127.0.0.1", err))
}

/// Runs `start(port, attempt)` on a free port, again on another one when the port was taken.
async fn on_free_port<T, F, Fut>(
    service: &'static str,
    mut start: F,
) -> std::result::Result<T, StartError>
where
    F: FnMut(u16, usize) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, StartError>>,
{
    let mut last = None;
    for attempt in 1..=PORT_ATTEMPTS {
        let port = free_port().map_err(StartError::Failed)?;
        match start(port, attempt).await {
            Err(StartError::PortTaken(err)) => {
                tracing::debug!(
                    service,
                    port,
                    attempt,
                    "port taken before the service bound it; trying another"
                );
                last = Some(err);
            }
            outcome => return outcome,
        }
    }
    Err(StartError::Failed(Error::other(format!(
        "{service}: {PORT_ATTEMPTS} free ports in a row were taken before the service could bind them; last: {}",
        last.map(|err| err.to_string()).unwrap_or_default()
    ))))
}

/// Publishes exactly `port` on 127.0.0.1 at a port the engine picks: a test bed must not be
/// reachable from other machines.
fn loopback_only(port: u16) -> impl Fn(&mut HostConfig) {
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

/// Publishes nothing (testcontainers asks to publish the image's exposed ports by default; the
/// engine would ignore that on the host network, but the container should say what it does).
fn nothing_published(host_config: &mut HostConfig) {
    host_config.publish_all_ports = Some(false);
    host_config.port_bindings = None;
}

/// Where a service listens and how that is set up for `network`: host mode binds 127.0.0.1 on
/// `port` of the host network; published mode binds every interface of the container network on
/// `internal` and publishes it on 127.0.0.1.
fn networked(
    request: testcontainers::ContainerRequest<GenericImage>,
    network: Network,
    internal: u16,
) -> testcontainers::ContainerRequest<GenericImage> {
    match network {
        Network::Host => request
            .with_network("host")
            .with_host_config_modifier(nothing_published),
        Network::Published => request.with_host_config_modifier(loopback_only(internal)),
    }
}

/// Classifies a failed start: the log lines of a container that exited before it was ready
/// say whether its port was taken.
async fn start_failed(
    service: &'static str,
    name: &str,
    source: testcontainers::TestcontainersError,
) -> StartError {
    use testcontainers::core::error::WaitContainerError;
    use testcontainers::core::logs::WaitLogError;
    let port_taken = matches!(
        &source,
        testcontainers::TestcontainersError::WaitContainer(WaitContainerError::WaitLog(
            WaitLogError::EndOfStream(lines),
        )) if lines.iter().any(|line| String::from_utf8_lossy(line).contains(PORT_TAKEN))
    );
    // A container the engine created but could not start (or that timed out) is not removed by
    // testcontainers: remove it by name, so no failed attempt is left behind.
    remove_by_name(name).await;
    let err = Error::Container { service, source };
    if port_taken {
        StartError::PortTaken(err)
    } else {
        StartError::Failed(err)
    }
}

async fn remove_by_name(name: &str) {
    let name = name.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        // "No such container" is the usual answer: testcontainers removed it already.
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", "-v", &name])
            .stdin(std::process::Stdio::null())
            .output();
    })
    .await;
}

/// Starts Redis without persistence under [`REDIS_SUPERVISOR`]; ready when it logs that it
/// accepts connections and, in host mode, answers PING on 127.0.0.1.
async fn start_redis(
    image: &ImageRef,
    owner: &Owner,
    network: Network,
    port: u16,
    name: String,
) -> std::result::Result<ServiceContainer, StartError> {
    let (bind, port) = match network {
        Network::Host => (Ipv4Addr::LOCALHOST.to_string(), port),
        Network::Published => ("0.0.0.0".to_owned(), REDIS_PORT),
    };
    let mut cmd: Vec<String> = ["sh", "-c", REDIS_SUPERVISOR, "racecert-redis", "--bind"]
        .map(str::to_owned)
        .to_vec();
    cmd.push(bind);
    cmd.push("--port".to_owned());
    cmd.push(port.to_string());
    cmd.extend(["--protected-mode", "no", "--save", "", "--appendonly", "no"].map(str::to_owned));
    let mut image = GenericImage::new(&image.name, &image.tag)
        .with_wait_for(WaitFor::message_on_stdout(REDIS_READY));
    if network == Network::Published {
        image = image.with_exposed_port(REDIS_PORT.tcp());
    }
    let request = image
        .with_cmd(cmd)
        .with_labels(owner.labels("redis"))
        .with_container_name(&name)
        .with_startup_timeout(Duration::from_secs(60));
    let container = networked(request, network, REDIS_PORT).start().await;
    let container = match container {
        Ok(container) => container,
        Err(source) => return Err(start_failed("redis", &name, source).await),
    };
    let ready_lines = ReadyLines::follow(&container, "redis", REDIS_READY);
    let service = ServiceContainer {
        container,
        service: "redis",
        network,
        port,
        ready_lines: None,
    };
    // The line testcontainers waited for is in the log: once the follower has counted it, every
    // later one is a restarted server's.
    if let Err(err) = ready_lines.wait_beyond(0, RESTART_TIMEOUT).await {
        service.remove().await;
        return Err(StartError::Failed(err));
    }
    let service = ServiceContainer {
        ready_lines: Some(ready_lines),
        ..service
    };
    if network == Network::Host {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let probe = wait_ready(
            "redis on the host network",
            HOST_PROBE_TIMEOUT,
            || async move {
                let client = redis::Client::open(format!("redis://{addr}/"))?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            },
        )
        .await;
        if let Err(err) = probe {
            service.remove().await;
            return Err(StartError::Failed(err));
        }
    }
    Ok(service)
}

/// Starts PostgreSQL with `password` and durability off (a test bed needs speed, not crash
/// safety). Published mode: ready when it logs that it accepts connections; the official image
/// logs that line twice (once from its temporary init server), so callers also wait for a real
/// query. Host mode: ready when it logs that it listens on 127.0.0.1 at its port (the official
/// image's init server listens on no TCP address, so only the real server logs that) and answers
/// a query there.
async fn start_postgres(
    image: &ImageRef,
    owner: &Owner,
    password: &str,
    network: Network,
    port: u16,
    name: String,
) -> std::result::Result<ServiceContainer, StartError> {
    let mut cmd: Vec<String> = [
        "postgres",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        // Every worker of every concurrent case has links (and a small pool) of its own.
        "max_connections=800",
    ]
    .map(str::to_owned)
    .to_vec();
    let image = GenericImage::new(&image.name, &image.tag);
    let (image, port) = match network {
        Network::Host => {
            // Both entrypoints put their own listen_addresses before these arguments, and the
            // last setting of a parameter wins.
            cmd.extend([
                "-c".to_owned(),
                "listen_addresses=127.0.0.1".to_owned(),
                "-c".to_owned(),
                format!("port={port}"),
            ]);
            (
                image.with_wait_for(WaitFor::message_on_either_std(format!(
                    "listening on IPv4 address \"127.0.0.1\", port {port}"
                ))),
                port,
            )
        }
        Network::Published => (
            image.with_exposed_port(POSTGRES_PORT.tcp()).with_wait_for(
                WaitFor::message_on_either_std("database system is ready to accept connections"),
            ),
            POSTGRES_PORT,
        ),
    };
    let request = image
        .with_env_var("POSTGRES_USER", POSTGRES_USER)
        .with_env_var("POSTGRES_PASSWORD", password)
        .with_env_var("POSTGRES_DB", POSTGRES_DB)
        // Every new session authenticates, and partitions make workers reconnect often: SCRAM's
        // key stretching costs both sides about twice what the whole md5 exchange does (pgbench
        // here: 8.3 ms against 4.1 ms a connection), and a throwaway bed on loopback needs a
        // password check, not resistance to an offline attack on a stolen hash.
        .with_env_var("POSTGRES_HOST_AUTH_METHOD", "md5")
        .with_cmd(cmd)
        .with_labels(owner.labels("postgres"))
        .with_container_name(&name)
        .with_startup_timeout(Duration::from_secs(120));
    let container = match networked(request, network, POSTGRES_PORT).start().await {
        Ok(container) => container,
        Err(source) => return Err(start_failed("postgres", &name, source).await),
    };
    let service = ServiceContainer {
        container,
        service: "postgres",
        network,
        port,
        ready_lines: None,
    };
    if network == Network::Host {
        let url = format!("postgres://{POSTGRES_USER}:{password}@127.0.0.1:{port}/{POSTGRES_DB}");
        let probe = wait_ready("postgres on the host network", HOST_PROBE_TIMEOUT, || {
            let url = url.clone();
            async move {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                sqlx::query_scalar::<_, i32>("SELECT 1")
                    .fetch_one(&mut conn)
                    .await
            }
        })
        .await;
        if let Err(err) = probe {
            service.remove().await;
            return Err(StartError::Failed(err));
        }
    }
    Ok(service)
}

/// What a container's log said so far: how many ready lines, whether it ended, its last lines.
#[derive(Debug, Default)]
struct LogProgress {
    ready: u64,
    ended: bool,
    tail: VecDeque<String>,
}

/// How many lines of a container's log an error quotes.
const TAIL_LINES: usize = 20;

/// Follows a container's stdout and counts the lines that contain a marker: an explicit event
/// for "the restarted server is ready", with no polling of the engine.
struct ReadyLines {
    progress: tokio::sync::watch::Receiver<LogProgress>,
    task: tokio::task::AbortHandle,
    service: &'static str,
}

impl Drop for ReadyLines {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReadyLines {
    fn follow(
        container: &ContainerAsync<GenericImage>,
        service: &'static str,
        marker: &'static str,
    ) -> ReadyLines {
        let (tx, progress) = tokio::sync::watch::channel(LogProgress::default());
        let mut lines = container.stdout(true).lines();
        let task = tokio::spawn(async move {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) => tx.send_modify(|p| {
                        if line.contains(marker) {
                            p.ready += 1;
                        }
                        if p.tail.len() == TAIL_LINES {
                            p.tail.pop_front();
                        }
                        p.tail.push_back(line);
                    }),
                    // The container stopped (or was removed).
                    Ok(None) | Err(_) => {
                        tx.send_modify(|p| p.ended = true);
                        break;
                    }
                }
            }
        });
        ReadyLines {
            progress,
            task: task.abort_handle(),
            service,
        }
    }

    /// Ready lines counted so far.
    fn seen(&self) -> u64 {
        self.progress.borrow().ready
    }

    /// Waits until more than `seen` ready lines were logged; fails at once if the container
    /// stopped, and after `timeout` otherwise, quoting the log's last lines.
    async fn wait_beyond(&self, seen: u64, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let mut progress = self.progress.clone();
        let why =
            match tokio::time::timeout(timeout, progress.wait_for(|p| p.ready > seen || p.ended))
                .await
            {
                Ok(Ok(state)) if state.ready > seen => return Ok(()),
                // Ended, or the follower is gone with the container.
                Ok(_) => "the container stopped",
                Err(_) => "no ready line yet",
            };
        let tail = self
            .progress
            .borrow()
            .tail
            .iter()
            .cloned()
            .collect::<Vec<_>>();
        Err(Error::NotReady {
            service: self.service.to_owned(),
            waited_ms: started.elapsed().as_millis(),
            last_error: format!("{why}; last log lines:\n{}", tail.join("\n")),
        })
    }
}

/// Starts the fault-proxy image on the host network, its API on a free loopback port, and
/// returns it with the API URL. Host networking lets the proxies it creates listen on loopback
/// ports and reach the other services' loopback ports, exactly like the embedded server.
/// The arguments suit both racecert's image and Shopify's toxiproxy (Go flags accept `--name=value`).
pub async fn start_proxy(image: &ImageRef, owner: &Owner) -> Result<(ServiceContainer, String)> {
    let port = free_port()?;
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
            network: Network::Host,
            port,
            ready_lines: None,
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
    // From 1 ms: a connection that answers again right after a heal is seen at once.
    let mut backoff = Duration::from_millis(1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_choice_parses_its_three_words_and_refuses_others() {
        assert_eq!("".parse::<NetworkChoice>().unwrap(), NetworkChoice::Auto);
        assert_eq!(
            "auto".parse::<NetworkChoice>().unwrap(),
            NetworkChoice::Auto
        );
        assert_eq!(
            "host".parse::<NetworkChoice>().unwrap(),
            NetworkChoice::Host
        );
        assert_eq!(
            " published ".parse::<NetworkChoice>().unwrap(),
            NetworkChoice::Published
        );
        let err = "bridge".parse::<NetworkChoice>().unwrap_err().to_string();
        assert!(err.contains(NETWORK_ENV) && err.contains("bridge"), "{err}");
    }

    fn taken() -> StartError {
        StartError::PortTaken(Error::other(PORT_TAKEN))
    }

    #[tokio::test]
    async fn a_taken_port_is_retried_on_another_free_port() {
        let mut tried = Vec::new();
        let outcome = on_free_port("redis", |port, attempt| {
            tried.push((port, attempt));
            let result = if attempt < 3 { Err(taken()) } else { Ok(port) };
            async move { result }
        })
        .await;
        let port = outcome.unwrap_or_else(|err| panic!("{}", err.into_error()));
        assert_eq!(tried.iter().map(|t| t.1).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(tried.last().map(|t| t.0), Some(port));
        assert!(tried.iter().all(|t| t.0 != 0));
    }

    #[tokio::test]
    async fn port_retries_are_bounded_and_other_failures_are_not_retried() {
        let mut attempts = 0;
        let outcome: std::result::Result<u16, _> = on_free_port("postgres", |_, _| {
            attempts += 1;
            async { Err(taken()) }
        })
        .await;
        assert_eq!(attempts, PORT_ATTEMPTS);
        let message = outcome.map(|_| ()).unwrap_err().into_error().to_string();
        assert!(
            message.contains("postgres") && message.contains(PORT_TAKEN),
            "{message}"
        );

        let mut attempts = 0;
        let outcome: std::result::Result<u16, _> = on_free_port("redis", |_, _| {
            attempts += 1;
            async { Err(StartError::Failed(Error::other("engine refused"))) }
        })
        .await;
        assert_eq!(attempts, 1);
        assert!(matches!(outcome, Err(StartError::Failed(_))));
    }
}
