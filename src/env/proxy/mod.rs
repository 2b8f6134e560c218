//! The fault proxy: every connection a worker makes goes through a Toxiproxy proxy, so faults
//! (latency, timeouts, resets, partitions) land on the wire and not in mocks.
//!
//! [`server`] is racecert's own Toxiproxy-API server on the noxious engine (embedded in-process
//! by default, or packaged as the proxy image); any real Toxiproxy can replace it. This module is
//! the client side: async calls to the HTTP API in the serde types of [`json`], each checking the
//! answer's status and reading back the effect where it matters (a server may accept a call and
//! not apply it). Compatibility with the other Toxiproxy clients is proven by the server's tests,
//! which drive it with `toxiproxy_rust`.

pub mod json;
pub mod server;

use crate::{Error, Result};
use json::{NewProxy, NewToxic, ProxyUpdate};
pub use json::{ProxyInfo, ToxicInfo};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};

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

    fn engine(self) -> noxious::toxic::StreamDirection {
        match self {
            Direction::Upstream => noxious::toxic::StreamDirection::Upstream,
            Direction::Downstream => noxious::toxic::StreamDirection::Downstream,
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

/// A connection to a Toxiproxy API server (racecert's own or a real Toxiproxy), over its HTTP
/// API: every call checks the answer's status and reads it back where the effect matters.
#[derive(Clone)]
pub struct FaultProxy {
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
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
        })
    }

    /// The API base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response> {
        let response = request
            .send()
            .await
            .map_err(|err| Error::Proxy(format!("{what}: {err}")))?;
        check_status(response, what).await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T> {
        self.send(request, what)
            .await?
            .json()
            .await
            .map_err(|err| Error::Proxy(format!("{what}: unexpected answer: {err}")))
    }

    /// The server's version string.
    pub async fn version(&self) -> Result<String> {
        self.send(
            self.http.get(format!("{}/version", self.base)),
            "GET /version",
        )
        .await?
        .text()
        .await
        .map_err(|err| Error::Proxy(format!("GET /version: {err}")))
    }

    /// Creates (or replaces) a proxy listening on `listen` (port 0: the server picks one) in front
    /// of `upstream`, and returns it as the server reports it (with the concrete listen address).
    pub async fn create(&self, name: &str, listen: &str, upstream: &str) -> Result<Proxy> {
        let what = format!("populate proxy {name}");
        let spec = NewProxy {
            name: name.to_owned(),
            listen: listen.to_owned(),
            upstream: upstream.to_owned(),
            enabled: true,
        };
        #[derive(serde::Deserialize)]
        struct Populated {
            proxies: Vec<ProxyInfo>,
        }
        let populated: Populated = self
            .call(
                self.http
                    .post(format!("{}/populate", self.base))
                    .json(&[spec]),
                &what,
            )
            .await?;
        let info = populated
            .proxies
            .into_iter()
            .find(|p| p.name == name && p.upstream == upstream)
            .ok_or_else(|| Error::Proxy(format!("{what}: the server did not report it")))?;
        Proxy::from_info(self.clone(), info)
    }

    /// A proxy that exists on the server.
    pub async fn proxy(&self, name: &str) -> Result<Proxy> {
        let info = self.info(name).await?;
        Proxy::from_info(self.clone(), info)
    }

    /// Every proxy on the server.
    pub async fn all(&self) -> Result<Vec<ProxyInfo>> {
        let map: HashMap<String, ProxyInfo> = self
            .call(
                self.http.get(format!("{}/proxies", self.base)),
                "GET /proxies",
            )
            .await?;
        let mut proxies: Vec<ProxyInfo> = map.into_values().collect();
        proxies.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(proxies)
    }

    /// Enables every proxy and removes every toxic (Toxiproxy's `POST /reset`).
    pub async fn reset(&self) -> Result<()> {
        self.send(
            self.http.post(format!("{}/reset", self.base)),
            "POST /reset",
        )
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
        self.send(
            self.http.delete(format!("{}/proxies/{name}", self.base)),
            &format!("DELETE /proxies/{name}"),
        )
        .await?;
        Ok(())
    }

    /// Reads one proxy, with its toxics.
    pub async fn info(&self, name: &str) -> Result<ProxyInfo> {
        self.call(
            self.http.get(format!("{}/proxies/{name}", self.base)),
            &format!("GET /proxies/{name}"),
        )
        .await
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

    /// Adds a toxic (applies to live and new connections) and checks the server really has it.
    pub async fn add_toxic(&self, toxic: Toxic, direction: Direction, toxicity: f32) -> Result<()> {
        let name = toxic.name(direction);
        let what = format!("add {name} toxic on proxy {}", self.name);
        let request = NewToxic {
            name: Some(name.clone()),
            kind: toxic.kind().to_owned(),
            stream: Some(direction.engine()),
            toxicity: Some(toxicity),
            attributes: toxic
                .attributes()
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::from(v)))
                .collect(),
        };
        self.api
            .send(
                self.api
                    .http
                    .post(format!("{}/proxies/{}/toxics", self.api.base, self.name))
                    .json(&request),
                &what,
            )
            .await?;
        // A server may accept and still not apply (or hold another toxic under that name):
        // verify it exists with our attributes.
        let info = self.info().await?;
        match info.toxics.iter().find(|t| t.name == name) {
            Some(t)
                if t.kind == toxic.kind()
                    && toxic
                        .attributes()
                        .iter()
                        .all(|(k, v)| t.attribute(k) == Some(u64::from(*v))) =>
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
        self.api
            .send(
                self.api.http.delete(format!(
                    "{}/proxies/{}/toxics/{name}",
                    self.api.base, self.name
                )),
                &what,
            )
            .await?;
        Ok(())
    }

    /// Removes every toxic of this proxy.
    pub async fn clear_toxics(&self) -> Result<()> {
        for toxic in self.info().await?.toxics {
            self.remove_toxic(&toxic.name).await?;
        }
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
        self.update(
            ProxyUpdate {
                enabled: Some(false),
                ..ProxyUpdate::default()
            },
            "disable",
        )
        .await
    }

    /// Enables the proxy again on the same listen address.
    pub async fn enable(&self) -> Result<()> {
        self.update(
            ProxyUpdate {
                enabled: Some(true),
                ..ProxyUpdate::default()
            },
            "enable",
        )
        .await
    }

    /// Enables a proxy that was disabled, retrying for about a second: while its listener was
    /// closed, another process's probe for a free port can hold the port for a moment (seen with
    /// a `cargo test` beside a `certify`). The last error if it never listens again.
    pub async fn enable_again(&self) -> Result<()> {
        let mut enabled = self.enable().await;
        for _ in 0..10 {
            if enabled.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            enabled = self.enable().await;
        }
        enabled
    }

    /// Drops every live connection of the proxy and listens again on the same port after
    /// `closed` (clients see their connections end, and reconnect).
    pub async fn reset_connections(&self, closed: std::time::Duration) -> Result<()> {
        self.disable().await?;
        tokio::time::sleep(closed).await;
        self.enable_again().await
    }

    /// Points the proxy at a new upstream (after a container restart moved the service); the
    /// listen address, and so the address workers use, stays the same.
    pub async fn set_upstream(&self, upstream: SocketAddr) -> Result<()> {
        self.update(
            ProxyUpdate {
                upstream: Some(upstream.to_string()),
                ..ProxyUpdate::default()
            },
            "set upstream of",
        )
        .await
    }

    async fn update(&self, update: ProxyUpdate, verb: &str) -> Result<()> {
        let what = format!("{verb} proxy {}", self.name);
        self.api
            .send(
                self.api
                    .http
                    .post(format!("{}/proxies/{}", self.api.base, self.name))
                    .json(&update),
                &what,
            )
            .await?;
        let info = self.info().await?;
        let upstream_ok = update
            .upstream
            .as_ref()
            .is_none_or(|upstream| *upstream == info.upstream);
        if update.enabled.is_some_and(|e| e != info.enabled) || !upstream_ok {
            return Err(Error::Proxy(format!(
                "{what}: the server still reports enabled={} upstream={}",
                info.enabled, info.upstream
            )));
        }
        Ok(())
    }
}
