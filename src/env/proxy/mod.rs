//! The fault proxy: every connection a worker makes goes through a Toxiproxy proxy, so faults
//! (latency, timeouts, resets, partitions) land on the wire and not in mocks.
//!
//! [`server`] is racecert's own Toxiproxy-API server on the noxious engine (embedded in-process
//! by default, or packaged as the proxy image); any real Toxiproxy can replace it. This module is
//! the client side: a thin async wrapper over the blocking `toxiproxy_rust` client that runs it
//! off the async runtime and checks every effect, because that client ignores HTTP status codes
//! and panics on transport errors. Two operations `toxiproxy_rust` lacks (changing a proxy's
//! upstream, and toxics it has no builder for, like `reset_peer`) go over plain HTTP to the
//! same API.

pub mod server;

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use toxiproxy_rust::client::Client;
use toxiproxy_rust::proxy::ProxyPack;

/// Which way a toxic acts: on bytes from the client to the server, or back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client -> server (requests).
    Upstream,
    /// Server -> client (responses).
    Downstream,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// A Toxiproxy toxic, with Toxiproxy's attribute units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toxic {
    /// Delay data by `latency_ms` +/- `jitter_ms`.
    Latency {
        /// Added delay, ms.
        latency_ms: u32,
        /// Jitter, ms.
        jitter_ms: u32,
    },
    /// Stop all data; close the connection after `timeout_ms` (0: never).
    Timeout {
        /// ms before closing; 0 keeps the connection hanging.
        timeout_ms: u32,
    },
    /// Reset the connection (TCP RST) after `timeout_ms`.
    ResetPeer {
        /// ms before the reset.
        timeout_ms: u32,
    },
    /// Limit throughput to `rate_kbps` KB/s.
    Bandwidth {
        /// KB/s.
        rate_kbps: u32,
    },
    /// Slice data into small packets of about `average_size` bytes, `delay_us` apart.
    Slicer {
        /// Average packet size, bytes.
        average_size: u32,
        /// +/- variation, bytes.
        size_variation: u32,
        /// Delay between packets, microseconds.
        delay_us: u32,
    },
    /// Close the connection after `bytes` bytes.
    LimitData {
        /// Byte budget of the connection.
        bytes: u32,
    },
}

impl Toxic {
    /// Toxiproxy's type name.
    pub fn kind(&self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::Timeout { .. } => "timeout",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::Bandwidth { .. } => "bandwidth",
            Toxic::Slicer { .. } => "slicer",
            Toxic::LimitData { .. } => "limit_data",
        }
    }

    fn attributes(&self) -> HashMap<String, u32> {
        let pairs: Vec<(&str, u32)> = match *self {
            Toxic::Latency {
                latency_ms,
                jitter_ms,
            } => vec![("latency", latency_ms), ("jitter", jitter_ms)],
            Toxic::Timeout { timeout_ms } | Toxic::ResetPeer { timeout_ms } => {
                vec![("timeout", timeout_ms)]
            }
            Toxic::Bandwidth { rate_kbps } => vec![("rate", rate_kbps)],
            Toxic::Slicer {
                average_size,
                size_variation,
                delay_us,
            } => vec![
                ("average_size", average_size),
                ("size_variation", size_variation),
                ("delay", delay_us),
            ],
            Toxic::LimitData { bytes } => vec![("bytes", bytes)],
        };
        pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// The name Toxiproxy clients give it: `{type}_{stream}`.
    pub fn name(&self, direction: Direction) -> String {
        format!("{}_{}", self.kind(), direction.as_str())
    }
}

/// A toxic as the server reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToxicInfo {
    /// Toxic name.
    pub name: String,
    /// Toxic type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Direction.
    pub stream: String,
    /// Probability it applies to a connection.
    pub toxicity: f32,
    /// Attributes.
    pub attributes: HashMap<String, serde_json::Value>,
}

/// A proxy as the server reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyInfo {
    /// Proxy name.
    pub name: String,
    /// Listen address.
    pub listen: String,
    /// Upstream address.
    pub upstream: String,
    /// Whether it accepts connections.
    pub enabled: bool,
    /// Installed toxics.
    #[serde(default)]
    pub toxics: Vec<ToxicInfo>,
}

/// A job for the client thread.
type Job = Box<dyn FnOnce(&Client) + Send>;

/// The blocking `toxiproxy_rust` client, owned by a thread of its own. Its reqwest blocking client
/// panics when created *or dropped* inside an async runtime, so it lives and dies on a plain
/// thread and async code sends it closures.
#[derive(Clone)]
struct ClientThread {
    jobs: std::sync::mpsc::Sender<Job>,
}

impl ClientThread {
    fn spawn(addr: SocketAddr) -> Result<ClientThread> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("toxiproxy-client".into())
            .spawn(move || {
                let client = Client::new(addr);
                // Ends when every FaultProxy clone is gone.
                for job in queue {
                    job(&client);
                }
            })
            .map_err(|err| Error::io("spawn the toxiproxy client thread", err))?;
        Ok(ClientThread { jobs })
    }

    /// Runs `call` on the client thread, turning its panics (the client panics on transport
    /// errors when creating toxics) into errors.
    async fn call<T, F>(&self, what: String, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Client) -> std::result::Result<T, String> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |client| {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(client)));
            let _ = reply.send(outcome);
        });
        self.jobs
            .send(job)
            .map_err(|_| Error::Proxy(format!("{what}: client thread is gone")))?;
        match answer.await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(message))) => Err(Error::Proxy(format!("{what}: {message}"))),
            Ok(Err(panic)) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "client panicked".to_owned());
                Err(Error::Proxy(format!("{what}: {message}")))
            }
            Err(_) => Err(Error::Proxy(format!("{what}: client thread is gone"))),
        }
    }
}

/// A connection to a Toxiproxy API server (racecert's own or a real Toxiproxy).
#[derive(Clone)]
pub struct FaultProxy {
    client: ClientThread,
    http: reqwest::Client,
    base: String,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("base", &self.base)
            .finish()
    }
}

impl FaultProxy {
    /// Connects to the API at `url` (`http://host:port`, or `host:port`).
    pub fn connect(url: &str) -> Result<FaultProxy> {
        let authority = url
            .trim_end_matches('/')
            .strip_prefix("http://")
            .unwrap_or(url.trim_end_matches('/'));
        let addr = authority
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                Error::Config(format!(
                    "TOXIPROXY_URL {url:?} is not an http://host:port address"
                ))
            })?;
        Ok(FaultProxy {
            client: ClientThread::spawn(addr)?,
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
        })
    }

    /// The API base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The server's version string.
    pub async fn version(&self) -> Result<String> {
        self.client
            .call("GET /version".into(), |client| client.version())
            .await
    }

    /// Creates (or replaces) a proxy listening on `listen` (port 0: the server picks one) in front
    /// of `upstream`, and returns it as the server reports it (with the concrete listen address).
    pub async fn create(&self, name: &str, listen: &str, upstream: &str) -> Result<Proxy> {
        let pack = ProxyPack::new(name.to_owned(), listen.to_owned(), upstream.to_owned());
        let created = self
            .client
            .call(format!("populate proxy {name}"), move |client| {
                client.populate(vec![pack]).map(|proxies| {
                    proxies
                        .into_iter()
                        .map(|p| {
                            (
                                p.proxy_pack.name.clone(),
                                p.proxy_pack.listen.clone(),
                                p.proxy_pack.upstream.clone(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await?;
        // populate's answer is not proof (the client ignores status codes): read it back.
        let info = self.info(name).await?;
        if !created.iter().any(|(n, _, _)| n == name) || info.upstream != upstream {
            return Err(Error::Proxy(format!(
                "proxy {name} was not created as asked (server reports {info:?})"
            )));
        }
        Proxy::from_info(self.clone(), info)
    }

    /// A proxy that exists on the server.
    pub async fn proxy(&self, name: &str) -> Result<Proxy> {
        let info = self.info(name).await?;
        Proxy::from_info(self.clone(), info)
    }

    /// Every proxy on the server.
    pub async fn all(&self) -> Result<Vec<ProxyInfo>> {
        let response = self
            .http
            .get(format!("{}/proxies", self.base))
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("GET /proxies: {err}")))?;
        let map: HashMap<String, ProxyInfo> = checked_json(response, "GET /proxies").await?;
        let mut proxies: Vec<ProxyInfo> = map.into_values().collect();
        proxies.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(proxies)
    }

    /// Enables every proxy and removes every toxic (Toxiproxy's `POST /reset`).
    pub async fn reset(&self) -> Result<()> {
        self.client
            .call("POST /reset".into(), |client| client.reset())
            .await?;
        for proxy in self.all().await? {
            if !proxy.enabled || !proxy.toxics.is_empty() {
                return Err(Error::Proxy(format!(
                    "reset did not take effect on proxy {} (enabled {}, {} toxics)",
                    proxy.name,
                    proxy.enabled,
                    proxy.toxics.len()
                )));
            }
        }
        Ok(())
    }

    /// Deletes a proxy (its listener and connections go away).
    pub async fn delete(&self, name: &str) -> Result<()> {
        let response = self
            .http
            .delete(format!("{}/proxies/{name}", self.base))
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("DELETE /proxies/{name}: {err}")))?;
        check_status(response, &format!("DELETE /proxies/{name}")).await?;
        Ok(())
    }

    /// Reads one proxy, with its toxics.
    pub async fn info(&self, name: &str) -> Result<ProxyInfo> {
        let response = self
            .http
            .get(format!("{}/proxies/{name}", self.base))
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("GET /proxies/{name}: {err}")))?;
        checked_json(response, &format!("GET /proxies/{name}")).await
    }
}

async fn check_status(response: reqwest::Response, what: &str) -> Result<reqwest::Response> {
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    Err(Error::Proxy(format!("{what}: HTTP {status}: {body}")))
}

async fn checked_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    what: &str,
) -> Result<T> {
    let response = check_status(response, what).await?;
    response
        .json()
        .await
        .map_err(|err| Error::Proxy(format!("{what}: unexpected answer: {err}")))
}

/// One proxy on the server: its fixed listen address is what workers connect to.
#[derive(Debug, Clone)]
pub struct Proxy {
    api: FaultProxy,
    name: String,
    listen: SocketAddr,
}

impl Proxy {
    fn from_info(api: FaultProxy, info: ProxyInfo) -> Result<Proxy> {
        let listen = info
            .listen
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                Error::Proxy(format!(
                    "proxy {} reports an unusable listen address {:?}",
                    info.name, info.listen
                ))
            })?;
        Ok(Proxy {
            api,
            name: info.name,
            listen,
        })
    }

    /// Proxy name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address clients connect to.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The proxy as the server reports it now.
    pub async fn info(&self) -> Result<ProxyInfo> {
        self.api.info(&self.name).await
    }

    /// The `toxiproxy_rust` handle of this proxy. The client builds handles only from server
    /// answers, so this is one blocking GET, cheap next to any fault we inject.
    fn client_proxy(
        client: &Client,
        name: &str,
    ) -> std::result::Result<toxiproxy_rust::proxy::Proxy, String> {
        client
            .find_proxy(name)
            .map_err(|err| format!("proxy {name} not found: {err}"))
    }

    /// Adds a toxic (applies to live and new connections) and checks the server really has it.
    pub async fn add_toxic(&self, toxic: Toxic, direction: Direction, toxicity: f32) -> Result<()> {
        let name = toxic.name(direction);
        let what = format!("add {name} toxic on proxy {}", self.name);
        // toxiproxy_rust ignores the server's 409 for a duplicate name, and the verification
        // below would then find the old toxic: check first, so a conflict is reported.
        if self.info().await?.toxics.iter().any(|t| t.name == name) {
            return Err(Error::Proxy(format!(
                "{what}: a toxic named {name} is already installed; remove it first"
            )));
        }
        let supported_by_client = !matches!(toxic, Toxic::ResetPeer { .. });
        if supported_by_client {
            let proxy_name = self.name.clone();
            self.api
                .client
                .call(what.clone(), move |client| {
                    let proxy = Proxy::client_proxy(client, &proxy_name)?;
                    let stream = direction.as_str().to_owned();
                    match toxic {
                        Toxic::Latency {
                            latency_ms,
                            jitter_ms,
                        } => proxy.with_latency(stream, latency_ms, jitter_ms, toxicity),
                        Toxic::Timeout { timeout_ms } => {
                            proxy.with_timeout(stream, timeout_ms, toxicity)
                        }
                        Toxic::Bandwidth { rate_kbps } => {
                            proxy.with_bandwidth(stream, rate_kbps, toxicity)
                        }
                        Toxic::Slicer {
                            average_size,
                            size_variation,
                            delay_us,
                        } => proxy.with_slicer(
                            stream,
                            average_size,
                            size_variation,
                            delay_us,
                            toxicity,
                        ),
                        Toxic::LimitData { bytes } => {
                            proxy.with_limit_data(stream, bytes, toxicity)
                        }
                        Toxic::ResetPeer { .. } => unreachable!("handled over plain HTTP"),
                    };
                    Ok(())
                })
                .await?;
        } else {
            let body = serde_json::json!({
                "name": name,
                "type": toxic.kind(),
                "stream": direction.as_str(),
                "toxicity": toxicity,
                "attributes": toxic.attributes(),
            });
            let response = self
                .api
                .http
                .post(format!("{}/proxies/{}/toxics", self.api.base, self.name))
                .json(&body)
                .send()
                .await
                .map_err(|err| Error::Proxy(format!("{what}: {err}")))?;
            check_status(response, &what).await?;
        }
        // toxiproxy_rust discards the answer: verify the toxic exists with our attributes.
        let info = self.info().await?;
        let installed = info.toxics.iter().find(|t| t.name == name);
        match installed {
            Some(t)
                if t.kind == toxic.kind()
                    && attributes_match(&t.attributes, &toxic.attributes()) =>
            {
                Ok(())
            }
            Some(t) => Err(Error::Proxy(format!(
                "{what}: the server holds a different toxic under that name: {t:?}"
            ))),
            None => Err(Error::Proxy(format!(
                "{what}: the server did not install it (toxics now: {:?})",
                info.toxics.iter().map(|t| &t.name).collect::<Vec<_>>()
            ))),
        }
    }

    /// Removes one toxic by the name [`Toxic::name`] gives it.
    pub async fn remove_toxic(&self, name: &str) -> Result<()> {
        let what = format!("remove toxic {name} from proxy {}", self.name);
        let response = self
            .api
            .http
            .delete(format!(
                "{}/proxies/{}/toxics/{name}",
                self.api.base, self.name
            ))
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("{what}: {err}")))?;
        check_status(response, &what).await?;
        Ok(())
    }

    /// Removes every toxic of this proxy.
    pub async fn clear_toxics(&self) -> Result<()> {
        let name = self.name.clone();
        self.api
            .client
            .call(format!("clear toxics of {name}"), move |client| {
                Proxy::client_proxy(client, &name)?.delete_all_toxics()
            })
            .await?;
        let left = self.info().await?.toxics;
        if !left.is_empty() {
            return Err(Error::Proxy(format!(
                "toxics of {} still installed after clearing: {left:?}",
                self.name
            )));
        }
        Ok(())
    }

    /// Disables the proxy: its listener closes and live connections drop, so clients fail fast
    /// (a partition).
    pub async fn disable(&self) -> Result<()> {
        self.set_enabled(false).await
    }

    /// Enables the proxy again on the same listen address.
    pub async fn enable(&self) -> Result<()> {
        self.set_enabled(true).await
    }

    async fn set_enabled(&self, enabled: bool) -> Result<()> {
        let verb = if enabled { "enable" } else { "disable" };
        let name = self.name.clone();
        self.api
            .client
            .call(format!("{verb} proxy {name}"), move |client| {
                let proxy = Proxy::client_proxy(client, &name)?;
                if enabled {
                    proxy.enable()
                } else {
                    proxy.disable()
                }
            })
            .await?;
        let info = self.info().await?;
        if info.enabled != enabled {
            return Err(Error::Proxy(format!(
                "{verb} proxy {}: the server still reports enabled={}",
                self.name, info.enabled
            )));
        }
        Ok(())
    }

    /// Points the proxy at a new upstream (after a container restart moved the service); the
    /// listen address, and so the address workers use, stays the same.
    pub async fn set_upstream(&self, upstream: SocketAddr) -> Result<()> {
        let what = format!("set upstream of proxy {} to {upstream}", self.name);
        let response = self
            .api
            .http
            .post(format!("{}/proxies/{}", self.api.base, self.name))
            .json(&serde_json::json!({ "upstream": upstream.to_string() }))
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("{what}: {err}")))?;
        check_status(response, &what).await?;
        let info = self.info().await?;
        if info.upstream != upstream.to_string() {
            return Err(Error::Proxy(format!(
                "{what}: the server still reports upstream {}",
                info.upstream
            )));
        }
        Ok(())
    }
}

fn attributes_match(
    installed: &HashMap<String, serde_json::Value>,
    wanted: &HashMap<String, u32>,
) -> bool {
    wanted.iter().all(|(key, value)| {
        installed
            .get(key)
            .and_then(|v| v.as_u64())
            .is_some_and(|v| v == u64::from(*value))
    })
}
