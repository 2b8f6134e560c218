//! The test bed every suite stands on: real Redis and PostgreSQL (containers started with
//! testcontainers, or existing services in external mode), a Toxiproxy proxy in front of every
//! connection a worker makes, and one wiremock model backend per model version.
//!
//! Why one file of ~900 lines: the TestBed's start, restart, links and shutdown keep one set of
//! invariants (which proxy points where after a restart); the parts with their own concerns are
//! already submodules (containers, images, proxy, backends, wire, links).
//!
//! One test bed serves all cases of a suite. Cases are isolated by fresh key namespaces
//! ([`crate::contract::Keys::namespaced`]) and, when they inject network faults, by proxies of their
//! own ([`TestBed::dedicated_proxy`]); containers are never restarted between cases (a restart is a
//! fault, [`TestBed::restart`]).
//!
//! ```no_run
//! # async fn demo() -> racecert::Result<()> {
//! let bed = racecert::env::TestBed::builder().start().await?;
//! println!("workers use redis at {} and postgres at {}", bed.redis_url(), bed.database_url());
//! bed.shutdown().await;
//! # Ok(()) }
//! ```

pub mod backends;
mod builder;
pub mod containers;
pub mod images;
pub mod links;
pub mod procs;
pub mod proxy;
pub mod python;
pub mod reaper;

use crate::contract::SCHEMA_SQL;
use crate::wire;
use crate::{Error, Result};
use backends::ModelBackend;
pub use builder::TestBedBuilder;
use builder::{ProxySource, Services};
use containers::{Network, NetworkChoice, ServiceContainer, wait_ready};
use images::{ImageConfig, Service};
pub use links::{CaseLinks, DedicatedProxy};
use proxy::server::ProxyServer;
use proxy::{FaultProxy, Proxy};
use reaper::Owner;
use reqwest::Url;
use sqlx::Connection;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The comment that marks a database as safe for racecert's destructive setup. Containers get it
/// automatically; an external database must carry it (`COMMENT ON DATABASE db IS '...'`).
pub const TEST_DATABASE_MARKER: &str = "racecert-test-database";

/// How long a service may take to answer after start or restart.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a test bed is made of, for `racecert env up` and reports.
#[derive(Debug, Clone)]
pub struct Addresses {
    /// Redis URL workers use (through the proxy).
    pub redis_url: String,
    /// PostgreSQL URL workers use (through the proxy).
    pub database_url: String,
    /// Model backends: name, version, URL workers use (through the proxy).
    pub backends: Vec<(String, String, String)>,
    /// Toxiproxy API URL.
    pub toxiproxy_url: String,
    /// Direct Redis URL (checkers, benchmarks).
    pub redis_direct_url: String,
    /// Direct PostgreSQL URL (checkers, benchmarks).
    pub database_direct_url: String,
}

/// A service behind the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Redis.
    Redis,
    /// PostgreSQL.
    Postgres,
    /// The model backend with this index (0: first version).
    Backend(usize),
    /// A model backend outside the bed, at this address (a team's system's own backends).
    Upstream(SocketAddr),
}

impl Target {
    fn label(self) -> String {
        match self {
            Target::Redis => "redis".into(),
            Target::Postgres => "postgres".into(),
            Target::Backend(i) => format!("backend{i}"),
            Target::Upstream(_) => "model".into(),
        }
    }
}

struct Backend {
    server: ModelBackend,
    proxy: Proxy,
}

static BED_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The running test bed. Drop (or [`TestBed::shutdown`]) removes its containers and proxies.
pub struct TestBed {
    id: String,
    owner: Owner,
    redis_container: Option<ServiceContainer>,
    postgres_container: Option<ServiceContainer>,
    proxy_container: Option<ServiceContainer>,
    proxy_server: Option<ProxyServer>,
    api: FaultProxy,
    redis_upstream: Mutex<SocketAddr>,
    postgres_upstream: Mutex<SocketAddr>,
    redis_direct_url: Url,
    database_direct_url: Url,
    redis_proxy: Proxy,
    postgres_proxy: Proxy,
    backends: Vec<Backend>,
    dedicated: Mutex<Vec<(Target, String)>>,
    lock: tokio::sync::RwLock<()>,
    startup: Duration,
    external_proxy: bool,
    network: Option<Network>,
    /// The origin of recorded round trips' times.
    clock: Instant,
    /// Service restarts so far ([`TestBed::restarts`]).
    restarts: AtomicU64,
}

impl std::fmt::Debug for TestBed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBed")
            .field("id", &self.id)
            .field("redis", &self.redis_direct_url.as_str())
            .field("toxiproxy", &self.api.url())
            .finish()
    }
}

fn parse_service_url(url: &str, origin: &str, schemes: &[&str]) -> Result<Url> {
    let parsed = Url::parse(url)
        .map_err(|err| Error::Config(format!("{origin}: {url:?} is not a URL: {err}")))?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(Error::Config(format!(
            "{origin}: scheme {:?} not supported, expected {}",
            parsed.scheme(),
            schemes.join(" or ")
        )));
    }
    if parsed.host_str().is_none() {
        return Err(Error::Config(format!("{origin}: {url:?} names no host")));
    }
    Ok(parsed)
}

fn url_addr(url: &Url, default_port: u16) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port().unwrap_or(default_port);
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Config(format!("cannot resolve {host}:{port} (from {url})")))
}

/// `url` with its host and port replaced by `addr` (same credentials, database, options).
fn via(url: &Url, addr: SocketAddr) -> Url {
    let mut out = url.clone();
    let _ = out.set_host(Some(&addr.ip().to_string()));
    let _ = out.set_port(Some(addr.port()));
    out
}

fn random_password() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..24)
        .map(|_| {
            let chars = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
            chars[rng.random_range(0..chars.len())] as char
        })
        .collect()
}

/// Redis and PostgreSQL as the bed reaches them directly (not through its proxies): its own
/// containers, or services the caller runs.
struct DirectServices {
    redis_url: Url,
    database_url: Url,
    redis_container: Option<ServiceContainer>,
    postgres_container: Option<ServiceContainer>,
    network: Option<Network>,
}

/// The bed's proxies: Redis, PostgreSQL, and one per model backend.
struct BedLinks {
    redis_proxy: Proxy,
    postgres_proxy: Proxy,
    backends: Vec<Backend>,
}

/// Before any container starts: leftovers of killed runs removed, and the images the bed needs
/// built if missing.
async fn prepare_images(spec: &TestBedBuilder, image_config: &ImageConfig) -> Result<()> {
    let needs_containers =
        spec.services == Services::Containers || spec.proxy == ProxySource::Container;
    if needs_containers {
        // Leftovers of killed runs go first; then the images we need, built if missing.
        let wanted: Vec<Service> = match (&spec.services, &spec.proxy) {
            (Services::Containers, ProxySource::Container) => Service::ALL.to_vec(),
            (Services::Containers, _) => vec![Service::Redis, Service::Postgres],
            (_, _) => vec![Service::Proxy],
        };
        let config = image_config.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            reaper::reap(false)?;
            let killed = reaper::reap_processes();
            if !killed.is_empty() {
                tracing::info!(?killed, "killed worker processes a killed run left");
            }
            images::ensure_images(&config, &wanted, false)?;
            Ok(())
        })
        .await
        .map_err(|err| Error::other(format!("image preparation panicked: {err}")))??;
    }
    Ok(())
}

/// Starts the bed's Redis and PostgreSQL containers (a fresh password, the network `spec` or the
/// environment chooses), or checks the URLs of external ones.
async fn direct_services(
    spec: &TestBedBuilder,
    image_config: &ImageConfig,
    owner: &Owner,
    id: &str,
) -> Result<DirectServices> {
    match &spec.services {
        Services::Containers => {
            let password = random_password();
            let choice = match spec.network {
                Some(choice) => choice,
                None => NetworkChoice::from_env()?,
            };
            let services = containers::start_services(
                choice,
                &image_config.redis,
                &image_config.postgres,
                owner,
                &password,
                &format!("racecert-{id}"),
            )
            .await?;
            let network = Some(services.network);
            let (redis, postgres) = (services.redis, services.postgres);
            let redis_url = Url::parse(&format!("redis://{}/", redis.host_addr().await?))
                .map_err(|e| Error::other(e.to_string()))?;
            let database_url = Url::parse(&format!(
                "postgres://{}:{password}@{}/{}",
                containers::POSTGRES_USER,
                postgres.host_addr().await?,
                containers::POSTGRES_DB
            ))
            .map_err(|e| Error::other(e.to_string()))?;
            Ok(DirectServices {
                redis_url,
                database_url,
                redis_container: Some(redis),
                postgres_container: Some(postgres),
                network,
            })
        }
        Services::External {
            redis_url,
            database_url,
        } => Ok(DirectServices {
            redis_url: parse_service_url(redis_url, "REDIS_URL", &["redis"])?,
            database_url: parse_service_url(
                database_url,
                "DATABASE_URL",
                &["postgres", "postgresql"],
            )?,
            redis_container: None,
            postgres_container: None,
            network: None,
        }),
    }
}

/// The fault proxy `spec` asks for (embedded, a container, or the caller's), once its API
/// answers: the embedded server or the container if the bed runs one, and the API client.
async fn fault_proxy(
    spec: &TestBedBuilder,
    image_config: &ImageConfig,
    owner: &Owner,
) -> Result<(Option<ProxyServer>, Option<ServiceContainer>, FaultProxy)> {
    let (proxy_server, proxy_container, api) = match &spec.proxy {
        ProxySource::Embedded => {
            let server = ProxyServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            let api = FaultProxy::connect(&server.url())?;
            (Some(server), None, api)
        }
        ProxySource::Container => {
            let (container, url) = containers::start_proxy(&image_config.proxy, owner).await?;
            (None, Some(container), FaultProxy::connect(&url)?)
        }
        ProxySource::External(url) => (None, None, FaultProxy::connect(url)?),
    };
    let version = wait_ready("toxiproxy API", READY_TIMEOUT, || api.version()).await?;
    tracing::debug!(%version, url = api.url(), "fault proxy API ready");
    Ok((proxy_server, proxy_container, api))
}

/// Creates the bed's proxies, named after the bed `id`: to Redis, to PostgreSQL, and to each
/// model backend of `spec`, started here.
async fn create_links(
    api: &FaultProxy,
    id: &str,
    redis_upstream: SocketAddr,
    postgres_upstream: SocketAddr,
    spec: &TestBedBuilder,
) -> Result<BedLinks> {
    let listen = "127.0.0.1:0";
    let redis_proxy = api
        .create(&format!("{id}-redis"), listen, &redis_upstream.to_string())
        .await?;
    let postgres_proxy = api
        .create(
            &format!("{id}-postgres"),
            listen,
            &postgres_upstream.to_string(),
        )
        .await?;
    let mut backends = Vec::new();
    for (i, backend) in spec.backends.iter().enumerate() {
        let server = ModelBackend::start(&backend.name, &backend.version).await;
        let proxy = api
            .create(
                &format!("{id}-backend{i}"),
                listen,
                &server.addr().to_string(),
            )
            .await?;
        backends.push(Backend { server, proxy });
    }
    Ok(BedLinks {
        redis_proxy,
        postgres_proxy,
        backends,
    })
}

impl TestBed {
    /// A builder with the defaults (containers, embedded proxy, backends A/v1 and B/v2).
    pub fn builder() -> TestBedBuilder {
        TestBedBuilder::default()
    }

    async fn start(spec: TestBedBuilder) -> Result<TestBed> {
        let started = Instant::now();
        let owner = Owner::current();
        let id = format!(
            "rc{}x{}",
            owner.pid,
            BED_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let image_config = ImageConfig::from_env()?;
        prepare_images(&spec, &image_config).await?;
        let DirectServices {
            redis_url: redis_direct_url,
            database_url: database_direct_url,
            redis_container,
            postgres_container,
            network,
        } = direct_services(&spec, &image_config, &owner, &id).await?;
        let (proxy_server, proxy_container, api) =
            fault_proxy(&spec, &image_config, &owner).await?;

        let redis_upstream = url_addr(&redis_direct_url, 6379)?;
        let postgres_upstream = url_addr(&database_direct_url, 5432)?;
        let BedLinks {
            redis_proxy,
            postgres_proxy,
            backends,
        } = create_links(&api, &id, redis_upstream, postgres_upstream, &spec).await?;

        let mut bed = TestBed {
            id,
            owner,
            redis_container,
            postgres_container,
            proxy_container,
            proxy_server,
            external_proxy: matches!(spec.proxy, ProxySource::External(_)),
            api,
            redis_upstream: Mutex::new(redis_upstream),
            postgres_upstream: Mutex::new(postgres_upstream),
            redis_direct_url,
            database_direct_url,
            redis_proxy,
            postgres_proxy,
            backends,
            dedicated: Mutex::new(Vec::new()),
            lock: tokio::sync::RwLock::new(()),
            startup: Duration::ZERO,
            network,
            clock: started,
            restarts: AtomicU64::new(0),
        };
        bed.wait_services_ready().await?;
        bed.prepare_database(spec.services == Services::Containers)
            .await?;
        bed.startup = started.elapsed();
        Ok(bed)
    }

    /// Waits until Redis and PostgreSQL answer a real command through their proxies.
    async fn wait_services_ready(&self) -> Result<()> {
        self.wait_redis_ready().await?;
        self.wait_postgres_ready().await
    }

    async fn wait_redis_ready(&self) -> Result<()> {
        let redis_url = self.redis_url();
        wait_ready("redis", READY_TIMEOUT, || {
            let redis_url = redis_url.clone();
            async move {
                let client = redis::Client::open(redis_url)?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            }
        })
        .await?;
        Ok(())
    }

    async fn wait_postgres_ready(&self) -> Result<()> {
        let database_url = self.database_url();
        wait_ready("postgres", READY_TIMEOUT, || {
            let database_url = database_url.clone();
            async move {
                let mut conn = sqlx::PgConnection::connect(&database_url).await?;
                sqlx::query_scalar::<_, i32>("SELECT 1")
                    .fetch_one(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    /// Applies the contract schema. Our own containers are marked as test databases first; an
    /// external database must already carry the marker, or nothing is touched.
    async fn prepare_database(&self, owned: bool) -> Result<()> {
        let mut conn = sqlx::PgConnection::connect(self.database_direct_url.as_str()).await?;
        if owned {
            // Both names are constants of ours, not input.
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "COMMENT ON DATABASE {} IS '{TEST_DATABASE_MARKER}'",
                containers::POSTGRES_DB
            )))
            .execute(&mut conn)
            .await?;
        }
        let marker: Option<String> = sqlx::query_scalar(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await?;
        if marker.as_deref() != Some(TEST_DATABASE_MARKER) {
            let name: String = sqlx::query_scalar("SELECT current_database()")
                .fetch_one(&mut conn)
                .await?;
            return Err(Error::Refused(format!(
                "database {name:?} at {} is not marked for tests, so racecert will not create tables or write to it; \
                 if it is a disposable test database, mark it with: COMMENT ON DATABASE \"{name}\" IS '{TEST_DATABASE_MARKER}'",
                redact(&self.database_direct_url)
            )));
        }
        // One simple-protocol query: Postgres runs it as one implicit transaction, so a failing
        // statement leaves no half-applied schema.
        sqlx::raw_sql(SCHEMA_SQL).execute(&mut conn).await?;
        Ok(())
    }

    /// Unique id of this test bed (prefix of its proxy names).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The origin of the wire's clock: round trips are stamped in microseconds since it.
    pub fn wire_origin(&self) -> Instant {
        self.clock
    }

    /// The origin of the wire's clock in Unix milliseconds.
    pub fn wire_origin_unix_ms(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        now - self.clock.elapsed().as_millis() as i64
    }

    /// How long [`TestBedBuilder::start`] took (images present or built, containers, schema).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// How the bed's Redis and PostgreSQL containers are reached (`None` for external services).
    pub fn network(&self) -> Option<Network> {
        self.network
    }

    /// The process that owns this bed's containers.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Redis URL for workers: through the proxy.
    pub fn redis_url(&self) -> String {
        via(&self.redis_direct_url, self.redis_proxy.listen()).to_string()
    }

    /// PostgreSQL URL for workers: through the proxy.
    pub fn database_url(&self) -> String {
        via(&self.database_direct_url, self.postgres_proxy.listen()).to_string()
    }

    /// Redis URL for the harness's own connections: straight to the service where its address
    /// survives every restart the bed makes (the host network; external services are never
    /// restarted), else through the shared proxy, whose address stays when a restart moves a
    /// published port. The shared proxy carries no fault, so going around it changes nothing a
    /// case sees, and spares every harness round trip a hop through the proxy.
    pub fn harness_redis_url(&self) -> String {
        if self.addresses_survive_restarts() {
            self.redis_direct_url()
        } else {
            self.redis_url()
        }
    }

    /// PostgreSQL URL for the harness's own connections (see [`TestBed::harness_redis_url`]).
    pub fn harness_database_url(&self) -> String {
        if self.addresses_survive_restarts() {
            self.database_direct_url()
        } else {
            self.database_url()
        }
    }

    /// Whether the services keep their addresses across restarts: on the host network each one
    /// listens on its own fixed port; external services are not restarted at all.
    fn addresses_survive_restarts(&self) -> bool {
        self.network != Some(Network::Published)
    }

    /// Redis URL straight to the service, bypassing faults (checkers, benchmarks).
    pub fn redis_direct_url(&self) -> String {
        let addr = *self.redis_upstream.lock().expect("poisoned");
        via(&self.redis_direct_url, addr).to_string()
    }

    /// PostgreSQL URL straight to the service, bypassing faults (checkers, benchmarks).
    pub fn database_direct_url(&self) -> String {
        let addr = *self.postgres_upstream.lock().expect("poisoned");
        via(&self.database_direct_url, addr).to_string()
    }

    /// The Toxiproxy API.
    pub fn toxiproxy(&self) -> &FaultProxy {
        &self.api
    }

    /// The shared proxy in front of Redis.
    pub fn redis_proxy(&self) -> &Proxy {
        &self.redis_proxy
    }

    /// The shared proxy in front of PostgreSQL.
    pub fn postgres_proxy(&self) -> &Proxy {
        &self.postgres_proxy
    }

    /// The model versions served, in backend order.
    pub fn versions(&self) -> Vec<&str> {
        self.backends.iter().map(|b| b.server.version()).collect()
    }

    fn backend_index(&self, version: &str) -> Result<usize> {
        self.backends
            .iter()
            .position(|b| b.server.version() == version)
            .ok_or_else(|| {
                Error::Config(format!(
                    "no model backend serves version {version:?} (served: {})",
                    self.versions().join(", ")
                ))
            })
    }

    /// The backend serving `version`.
    pub fn backend(&self, version: &str) -> Result<&ModelBackend> {
        Ok(&self.backends[self.backend_index(version)?].server)
    }

    /// The calls of a case that is over (its key prefix), taken out of every backend's journal:
    /// the journals hold the cases in flight, not every case so far.
    pub fn take_journals(&self, case_prefix: &str) -> Vec<crate::wire::JournalEntry> {
        self.backends
            .iter()
            .flat_map(|b| b.server.take_journal(case_prefix))
            .collect()
    }

    /// The shared proxy in front of the backend serving `version`.
    pub fn backend_proxy(&self, version: &str) -> Result<&Proxy> {
        Ok(&self.backends[self.backend_index(version)?].proxy)
    }

    /// Base URL workers of `version` call (through the proxy), e.g. `http://127.0.0.1:40123`.
    pub fn backend_url(&self, version: &str) -> Result<String> {
        Ok(format!("http://{}", self.backend_proxy(version)?.listen()))
    }

    /// Every address of the bed.
    pub fn addresses(&self) -> Addresses {
        Addresses {
            redis_url: self.redis_url(),
            database_url: self.database_url(),
            backends: self
                .backends
                .iter()
                .map(|b| {
                    (
                        b.server.name().to_owned(),
                        b.server.version().to_owned(),
                        format!("http://{}", b.proxy.listen()),
                    )
                })
                .collect(),
            toxiproxy_url: self.api.url().to_owned(),
            redis_direct_url: self.redis_direct_url(),
            database_direct_url: self.database_direct_url(),
        }
    }

    fn upstream(&self, target: Target) -> Result<SocketAddr> {
        Ok(match target {
            Target::Redis => *self.redis_upstream.lock().expect("poisoned"),
            Target::Postgres => *self.postgres_upstream.lock().expect("poisoned"),
            Target::Backend(i) => self
                .backends
                .get(i)
                .ok_or_else(|| Error::Config(format!("no backend #{i}")))?
                .server
                .addr(),
            Target::Upstream(addr) => addr,
        })
    }

    /// A fresh proxy in front of `target` for one case, so the case's toxics and partitions touch
    /// no other case. Deleted when dropped; follows container restarts like the shared ones.
    pub async fn dedicated_proxy(&self, target: Target) -> Result<DedicatedProxy> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{}-{}-c{}",
            self.id,
            target.label(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let upstream = self.upstream(target)?;
        let proxy = self
            .api
            .create(&name, "127.0.0.1:0", &upstream.to_string())
            .await?;
        self.dedicated
            .lock()
            .expect("poisoned")
            .push((target, name));
        Ok(DedicatedProxy {
            proxy,
            api: self.api.clone(),
        })
    }

    /// Proxies of a case's own in front of Redis, Postgres and, with `backends`, every backend
    /// (not recorded).
    pub async fn case_links(&self, backends: bool) -> Result<CaseLinks> {
        self.links(backends, false).await
    }

    /// Proxies of one worker's (or case's) own in front of Redis, Postgres and, with `backends`,
    /// every backend; with `record`, every round trip through them is framed and delivered to
    /// whoever [`CaseLinks::record`] names (when the proxy runs in process: a proxy served
    /// elsewhere cannot be tapped, and the links then record nothing).
    pub async fn links(&self, backends: bool, record: bool) -> Result<CaseLinks> {
        self.links_with(backends, record, false).await
    }

    /// [`TestBed::links`], and with `holdable` (recorded links only) every request through them
    /// can be held before it reaches its server ([`CaseLinks::hold`]): the wire scheduler's links.
    pub async fn links_with(
        &self,
        backends: bool,
        record: bool,
        holdable: bool,
    ) -> Result<CaseLinks> {
        let models: Vec<(String, Target)> = if backends {
            self.backends
                .iter()
                .enumerate()
                .map(|(i, backend)| (backend.server.version().to_owned(), Target::Backend(i)))
                .collect()
        } else {
            Vec::new()
        };
        self.links_over(models, record, holdable).await
    }

    /// Links in front of Redis, Postgres and the given model backends outside the bed (version,
    /// address): a team's system's own, whose calls are then framed like the bed's; `holdable` as
    /// for [`TestBed::links_with`].
    pub async fn links_to(
        &self,
        models: &[(String, SocketAddr)],
        record: bool,
        holdable: bool,
    ) -> Result<CaseLinks> {
        let models = models
            .iter()
            .map(|(version, addr)| (version.clone(), Target::Upstream(*addr)))
            .collect();
        self.links_over(models, record, holdable).await
    }

    async fn links_over(
        &self,
        models: Vec<(String, Target)>,
        record: bool,
        holdable: bool,
    ) -> Result<CaseLinks> {
        let redis = self.dedicated_proxy(Target::Redis).await?;
        let postgres = self.dedicated_proxy(Target::Postgres).await?;
        let mut proxies = std::collections::BTreeMap::new();
        for (version, target) in models {
            proxies.insert(version, self.dedicated_proxy(target).await?);
        }
        let route = match (&self.proxy_server, record) {
            (Some(server), true) => {
                let route = std::sync::Arc::new(if holdable {
                    links::WireRoute::holdable()
                } else {
                    links::WireRoute::default()
                });
                let clock = wire::Clock::new(self.clock);
                let mut taps: Vec<(&DedicatedProxy, wire::Protocol, String)> = vec![
                    (&redis, wire::Protocol::Redis, "redis".to_owned()),
                    (&postgres, wire::Protocol::Postgres, "postgres".to_owned()),
                ];
                for (version, proxy) in &proxies {
                    taps.push((proxy, wire::Protocol::Http, format!("backend:{version}")));
                }
                for (proxy, protocol, service) in taps {
                    let mut tap = wire::WireTap::builder(proxy.name(), protocol)
                        .clock(clock)
                        .shared_sink(route.sink(service));
                    if holdable {
                        tap = tap.holder(route.holder());
                    }
                    let tap = tap.build();
                    server.set_tap(proxy.name(), Some(tap)).await?;
                }
                Some(route)
            }
            _ => None,
        };
        Ok(CaseLinks {
            redis_url: via(&self.redis_direct_url, redis.listen()).to_string(),
            database_url: via(&self.database_direct_url, postgres.listen()).to_string(),
            redis,
            postgres,
            backends: proxies,
            route,
        })
    }

    /// Whether workers' round trips can be recorded: only racecert's own proxy engine (embedded)
    /// frames them; a proxy container or an external Toxiproxy passes bytes unseen.
    pub fn records_wire(&self) -> bool {
        self.proxy_server.is_some()
    }

    /// Shared access for a case: many at once, none during an exclusive section.
    pub async fn shared(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.lock.read().await
    }

    /// Exclusive access, for faults that hit every case (a container restart).
    pub async fn exclusive(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.lock.write().await
    }

    /// Restarts Redis (its server process) or the PostgreSQL container; volatile state is lost:
    /// for Redis, every lease and stream, and every client's socket. Re-points every proxy in
    /// front of it if the engine moved its port (published mode; on the host network and for a
    /// Redis restart the port stays), and waits until it answers through the proxy again.
    /// Workers keep their addresses.
    pub async fn restart(&self, target: Target) -> Result<Duration> {
        let started = Instant::now();
        let (container, slot) = match target {
            Target::Redis => (self.redis_container.as_ref(), &self.redis_upstream),
            Target::Postgres => (self.postgres_container.as_ref(), &self.postgres_upstream),
            Target::Backend(_) | Target::Upstream(_) => {
                return Err(Error::Config(
                    "model backends run in-process; program a failure instead of a restart".into(),
                ));
            }
        };
        let container = container.ok_or_else(|| {
            Error::Config("restarting a service needs container mode, not external services".into())
        })?;
        // Counted before it happens: a connection that outlives it must be found stale even if
        // this returns an error.
        self.restarts.fetch_add(1, Ordering::SeqCst);
        container.restart(Duration::from_secs(1)).await?;
        let new_addr = container.host_addr().await?;
        let old_addr = std::mem::replace(&mut *slot.lock().expect("poisoned"), new_addr);
        if new_addr != old_addr {
            tracing::debug!(service = container.service(), %old_addr, %new_addr, "service moved; re-pointing its proxies");
            let mut names = vec![match target {
                Target::Redis => self.redis_proxy.name().to_owned(),
                _ => self.postgres_proxy.name().to_owned(),
            }];
            names.extend(
                self.dedicated
                    .lock()
                    .expect("poisoned")
                    .iter()
                    .filter(|(t, _)| *t == target)
                    .map(|(_, name)| name.clone()),
            );
            for name in names {
                match self.api.proxy(&name).await {
                    Ok(proxy) => proxy.set_upstream(new_addr).await?,
                    // A dedicated proxy whose case ended in between.
                    Err(_) => continue,
                }
            }
        }
        match target {
            Target::Redis => self.wait_redis_ready().await?,
            _ => self.wait_postgres_ready().await?,
        }
        Ok(started.elapsed())
    }

    /// How many times a service of the bed was restarted so far: a connection opened (or last
    /// seen answering) before the count moved may have seen its socket die.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Removes containers and proxies now, waiting for it (Drop does the same without waiting).
    pub async fn shutdown(mut self) {
        for container in [
            self.redis_container.take(),
            self.postgres_container.take(),
            self.proxy_container.take(),
        ]
        .into_iter()
        .flatten()
        {
            container.remove().await;
        }
        if self.external_proxy {
            self.delete_own_proxies().await;
        }
        if let Some(server) = self.proxy_server.take() {
            server.shutdown().await;
        }
    }

    async fn delete_own_proxies(&self) {
        if let Ok(all) = self.api.all().await {
            for proxy in all.iter().filter(|p| p.name.starts_with(&self.id)) {
                let _ = self.api.delete(&proxy.name).await;
            }
        }
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        let containers: Vec<ServiceContainer> = [
            self.redis_container.take(),
            self.postgres_container.take(),
            self.proxy_container.take(),
        ]
        .into_iter()
        .flatten()
        .collect();
        if containers.is_empty() {
            return;
        }
        // testcontainers removes a container on drop through the current tokio runtime; a bed
        // dropped outside one (end of main, a panic unwinding) gets a runtime of its own, so no
        // container is left behind.
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(containers);
        } else if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            let _guard = rt.enter();
            drop(containers);
        }
    }
}

/// A URL without its password, for messages.
fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}
