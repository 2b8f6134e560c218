//! Building a test bed ([`TestBedBuilder`]): where Redis and PostgreSQL come from (containers
//! or existing services), the proxy engine, the model backends, from the environment or in code.

use super::*;

/// Where Redis and PostgreSQL come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Services {
    /// Containers started for this test bed.
    Containers,
    /// Existing services (CI services, staging).
    External {
        redis_url: String,
        database_url: String,
    },
}

/// Where the Toxiproxy API comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProxySource {
    /// racecert's own server, in this process.
    Embedded,
    /// racecert's proxy image (or Shopify's, through `RACECERT_PROXY_IMAGE`), host network.
    Container,
    /// An existing Toxiproxy at this URL.
    External(String),
}

/// One model backend to start: name and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BackendSpec {
    pub(super) name: String,
    pub(super) version: String,
}

/// Builds a [`TestBed`]. Defaults: containers, embedded proxy, `model-backend-A` serving `v1` and
/// `model-backend-B` serving `v2`.
#[derive(Debug, Clone)]
pub struct TestBedBuilder {
    pub(super) services: Services,
    pub(super) proxy: ProxySource,
    pub(super) backends: Vec<BackendSpec>,
    pub(super) network: Option<NetworkChoice>,
}

impl Default for TestBedBuilder {
    fn default() -> Self {
        TestBedBuilder {
            services: Services::Containers,
            proxy: ProxySource::Embedded,
            backends: vec![
                BackendSpec {
                    name: "model-backend-A".into(),
                    version: "v1".into(),
                },
                BackendSpec {
                    name: "model-backend-B".into(),
                    version: "v2".into(),
                },
            ],
            network: None,
        }
    }
}

impl TestBedBuilder {
    /// Reads the environment: `REDIS_URL` and `DATABASE_URL` (both or neither) switch to external
    /// services, `TOXIPROXY_URL` to an external Toxiproxy, `RACECERT_PROXY=container` to the
    /// proxy image.
    pub fn from_env() -> Result<TestBedBuilder> {
        let mut builder = TestBedBuilder::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("REDIS_URL"), var("DATABASE_URL")) {
            (Some(redis_url), Some(database_url)) => {
                builder = builder.external_services(&redis_url, &database_url);
            }
            (None, None) => {}
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::Config(
                    "external mode needs both REDIS_URL and DATABASE_URL (or neither, for containers)"
                        .to_owned(),
                ));
            }
        }
        if let Some(url) = var("TOXIPROXY_URL") {
            builder = builder.external_proxy(&url);
        } else if let Some(mode) = var("RACECERT_PROXY") {
            builder = match mode.as_str() {
                "embedded" => builder,
                "container" => builder.container_proxy(),
                other => {
                    return Err(Error::Config(format!(
                        "RACECERT_PROXY={other:?}: expected \"embedded\" or \"container\""
                    )));
                }
            };
        }
        Ok(builder)
    }

    /// Uses existing Redis and PostgreSQL instead of containers. The database must carry the
    /// [`TEST_DATABASE_MARKER`] comment, or setup is refused.
    pub fn external_services(mut self, redis_url: &str, database_url: &str) -> Self {
        self.services = Services::External {
            redis_url: redis_url.to_owned(),
            database_url: database_url.to_owned(),
        };
        self
    }

    /// Uses an existing Toxiproxy API at `url` (`http://host:port`).
    pub fn external_proxy(mut self, url: &str) -> Self {
        self.proxy = ProxySource::External(url.to_owned());
        self
    }

    /// Runs the proxy as a container from the proxy image (host network, loopback only).
    pub fn container_proxy(mut self) -> Self {
        self.proxy = ProxySource::Container;
        self
    }

    /// How the Redis and PostgreSQL containers are reached. Unset, `RACECERT_NETWORK` decides
    /// (default: host networking on 127.0.0.1 where usable, else published ports).
    pub fn network(mut self, choice: NetworkChoice) -> Self {
        self.network = Some(choice);
        self
    }

    /// Replaces the model backends with `(name, version)` pairs.
    pub fn backends<'a>(mut self, backends: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        self.backends = backends
            .into_iter()
            .map(|(name, version)| BackendSpec {
                name: name.to_owned(),
                version: version.to_owned(),
            })
            .collect();
        self
    }

    fn validate(&self) -> Result<()> {
        if self.backends.is_empty() {
            return Err(Error::Config(
                "a test bed needs at least one model backend".into(),
            ));
        }
        for (i, backend) in self.backends.iter().enumerate() {
            if backend.version.is_empty() || backend.version.contains(':') {
                return Err(Error::Config(format!(
                    "backend {:?}: version {:?} must be non-empty and contain no ':'",
                    backend.name, backend.version
                )));
            }
            if self.backends[..i]
                .iter()
                .any(|b| b.version == backend.version)
            {
                return Err(Error::Config(format!(
                    "two backends serve version {:?}; one backend per version",
                    backend.version
                )));
            }
        }
        if let Services::External {
            redis_url,
            database_url,
        } = &self.services
        {
            parse_service_url(redis_url, "REDIS_URL", &["redis"])?;
            parse_service_url(database_url, "DATABASE_URL", &["postgres", "postgresql"])?;
        }
        if let ProxySource::External(url) = &self.proxy {
            FaultProxy::connect(url)?;
        }
        Ok(())
    }

    /// Starts everything and waits until every service answers through its proxy.
    pub async fn start(self) -> Result<TestBed> {
        self.validate()?;
        TestBed::start(self).await
    }
}
