//! A fault-injecting TCP proxy server that speaks Shopify Toxiproxy's HTTP API (v2, JSON) on top of
//! the `noxious` proxy engine, so racecert can put latency, timeouts, bandwidth limits, connection
//! resets and outages between the services under test and their clients, driven by the usual
//! Toxiproxy clients (`toxiproxy_rust`, toxiproxy-cli, the Go client) without shipping the Go
//! binary. The engine is racecert's patched copy (`vendor/noxious`), which adds `reset_peer`.
//!
//! - [`store`](self): the proxies and their engine runs (one lock, toxics as the source of truth);
//! - `api`: the HTTP handlers, speaking Toxiproxy's JSON through [`super::json`]'s serde types;
//! - `listen`: listen addresses (Go-style `:port`, free ports below the ephemeral range).

mod api;
mod listen;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::Error;
use api::*;
use store::Shared;

/// Reported by `GET /version`: the Toxiproxy API level this server follows, and what it really is.
const VERSION: &str = "2.12.0-racecert-noxious";

/// How long shutdown lets open API connections finish their request before dropping them.
const API_GRACE: Duration = Duration::from_secs(5);

/// A running Toxiproxy-compatible API server, serving on the tokio runtime it was started on.
///
/// Dropping it stops the API and every proxy without waiting; [`ProxyServer::shutdown`] waits.
pub struct ProxyServer {
    addr: SocketAddr,
    store: Shared,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ProxyServer {
    /// Binds the HTTP API on `listen` (port 0 allowed) and serves it on the current tokio runtime.
    pub async fn start(listen: SocketAddr) -> crate::Result<ProxyServer> {
        let listener = bind_api(listen).await?;
        let addr = listener.local_addr().map_err(|err| {
            Error::io(
                format!("reading the address of the proxy API on {listen}"),
                err,
            )
        })?;
        info!(%addr, version = VERSION, "toxiproxy API listening");
        let store = Shared::default();
        let (shutdown, signal) = oneshot::channel::<()>();
        let serving = run_api(listener, store.clone(), async move {
            // A dropped sender means the server handle is gone: shut down as well.
            let _ = signal.await;
        });
        let task = tokio::spawn(async move {
            if let Err(err) = serving.await {
                error!(%err, "toxiproxy API server failed");
            }
        });
        Ok(ProxyServer {
            addr,
            store,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// The bound address of the HTTP API.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. "http://127.0.0.1:8474".
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Attaches `tap` to proxy `name` (None removes it): from now on the tap sees (and may hold)
    /// every connection of that proxy. This is in process only: the Toxiproxy API has no such
    /// thing, so a proxy served elsewhere cannot be tapped.
    pub async fn set_tap(
        &self,
        name: &str,
        tap: Option<std::sync::Arc<dyn noxious::tap::Tap>>,
    ) -> crate::Result<()> {
        let mut proxies = self.store.proxies.lock().await;
        let entry = proxies
            .get_mut(name)
            .ok_or_else(|| Error::Proxy(format!("tap proxy {name}: no such proxy")))?;
        entry
            .set_tap(tap)
            .await
            .map_err(|err| Error::Proxy(format!("tap proxy {name}: {}", err.message)))
    }

    /// Stops the API and every proxy (closing their listeners and connections), and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(err) = task.await
        {
            warn!(%err, "toxiproxy API task ended abnormally");
        }
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        // The API task stops every proxy on its way out, but only while the runtime still runs;
        // signalling the engines here closes their listeners at once even if it is going away.
        if let Ok(proxies) = self.store.proxies.try_lock() {
            for run in proxies.values().filter_map(|entry| entry.run.as_ref()) {
                run.stopper.clone().stop();
            }
        }
    }
}

impl fmt::Debug for ProxyServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Serve until `shutdown` resolves (used by `racecert proxy serve` in the container image).
pub async fn serve(
    listen: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let listener = bind_api(listen).await?;
    let addr = listener.local_addr().unwrap_or(listen);
    info!(%addr, version = VERSION, "toxiproxy API listening");
    run_api(listener, Shared::default(), shutdown)
        .await
        .map_err(|err| Error::Proxy(format!("serving the proxy API on {addr}: {err}")))
}

async fn bind_api(listen: SocketAddr) -> crate::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|err| Error::io(format!("binding the proxy API on {listen}"), err))
}

/// Serves the API until `shutdown` (or until the HTTP server fails), then stops every proxy.
async fn run_api(
    listener: tokio::net::TcpListener,
    store: Shared,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The signal is needed twice (graceful stop, then a deadline for it), so fan it out.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut graceful_rx = stop_rx.clone();
    let mut deadline_rx = stop_rx;
    let server = axum::serve(listener, router(store.clone())).with_graceful_shutdown(async move {
        let _ = graceful_rx.wait_for(|stop| *stop).await;
    });
    let trigger = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        std::future::pending::<()>().await
    };
    let deadline = async move {
        let _ = deadline_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(API_GRACE).await;
    };
    let served = tokio::select! {
        result = server.into_future() => result,
        () = deadline => {
            warn!(grace = ?API_GRACE, "API connections still open after shutdown; dropping them");
            Ok(())
        }
        () = trigger => Ok(()),
    };
    store.stop_all().await;
    info!("toxiproxy API stopped");
    served
}

fn router(store: Shared) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/reset", post(reset))
        .route("/populate", post(populate))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route(
            "/proxies/{proxy}",
            get(show_proxy)
                .post(update_proxy)
                .patch(update_proxy)
                .delete(delete_proxy),
        )
        .route(
            "/proxies/{proxy}/toxics",
            get(list_toxics).post(create_toxic),
        )
        .route(
            "/proxies/{proxy}/toxics/{toxic}",
            get(show_toxic)
                .post(update_toxic)
                .patch(update_toxic)
                .delete(delete_toxic),
        )
        .fallback(unknown_route)
        .layer(middleware::from_fn(log_request))
        .with_state(store)
}

async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    debug!(%method, %path, status = response.status().as_u16(), "toxiproxy API request");
    response
}
