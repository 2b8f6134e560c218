//! The HTTP handlers of the Toxiproxy API. Bodies are read and written through the serde types of
//! [`crate::env::proxy::json`]; toxic kinds and their attributes are the engine's own types.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use noxious::toxic::{StreamDirection, Toxic, ToxicKind};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::VERSION;
use super::listen::listen_matches;
use super::store::{ProxyEntry, Shared};
use crate::env::proxy::json::{
    NewProxy, NewToxic, ProxyInfo, ProxyUpdate, ToxicInfo, ToxicUpdate, toxic_kind,
};

/// Toxic attributes are milliseconds, KB/s or bytes; bounding them keeps the engine's arithmetic
/// (e.g. latency + jitter) from overflowing, and fits the u32 values `toxiproxy_rust` reads.
const MAX_ATTRIBUTE: u64 = u32::MAX as u64;

/// A request body in one of the API's types; a body that is not gets a 400 naming the problem.
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("bad request body: {err}")))
}

/// `position` names the proxy in a populate list, for error messages.
fn validate_new_proxy(spec: &NewProxy, position: Option<usize>) -> Result<(), ApiError> {
    let at = position
        .map(|i| format!(" at proxy {}", i + 1))
        .unwrap_or_default();
    for (field, value) in [("name", &spec.name), ("upstream", &spec.upstream)] {
        if value.is_empty() {
            return Err(ApiError::bad_request(format!(
                "missing required field: {field}{at}"
            )));
        }
    }
    Ok(())
}

/// A new toxic with Toxiproxy's defaults: downstream, toxicity 1, name `{type}_{stream}`.
fn new_toxic(request: NewToxic) -> Result<Toxic, ApiError> {
    if request.kind.is_empty() {
        return Err(ApiError::bad_request("missing required field: type"));
    }
    let direction = request.stream.unwrap_or(StreamDirection::Downstream);
    let kind = checked_kind(&request.kind, &request.attributes)?;
    let name = match request.name {
        Some(name) if !name.is_empty() => name,
        _ => format!("{}_{direction}", request.kind),
    };
    if name.contains('\0') {
        return Err(ApiError::bad_request("toxic names cannot contain NUL"));
    }
    Ok(Toxic {
        kind,
        name,
        toxicity: request.toxicity.unwrap_or(1.0),
        direction,
    })
}

/// A toxic update: given attributes are merged into the current ones, toxicity replaced if given.
fn updated_toxic(current: &Toxic, update: ToxicUpdate) -> Result<Toxic, ApiError> {
    let mut attributes = ToxicInfo::of(current).attributes;
    attributes.extend(update.attributes);
    Ok(Toxic {
        kind: checked_kind(current.kind.get_name(), &attributes)?,
        name: current.name.clone(),
        toxicity: update.toxicity.unwrap_or(current.toxicity),
        direction: current.direction,
    })
}

fn checked_kind(
    kind: &str,
    attributes: &serde_json::Map<String, serde_json::Value>,
) -> Result<ToxicKind, ApiError> {
    for (key, value) in attributes {
        if let Some(number) = value.as_u64()
            && number > MAX_ATTRIBUTE
        {
            return Err(ApiError::bad_request(format!(
                "bad request body: {kind} attribute {key} is above {MAX_ATTRIBUTE}: {number}"
            )));
        }
    }
    let kind = toxic_kind(kind, attributes).map_err(ApiError::bad_request)?;
    validate_kind(&kind)?;
    Ok(kind)
}

/// Rejects values the engine would mishandle (overflow panics, endless slicing).
fn validate_kind(kind: &ToxicKind) -> Result<(), ApiError> {
    match *kind {
        ToxicKind::Latency { latency, jitter } if jitter > latency => Err(ApiError::bad_request(
            "bad request body: latency jitter cannot exceed latency with this engine",
        )),
        ToxicKind::Slicer {
            average_size: 0, ..
        } => Err(ApiError::bad_request(
            "bad request body: slicer average_size must be at least 1",
        )),
        ToxicKind::Slicer {
            average_size,
            size_variation,
            ..
        } if size_variation >= average_size => Err(ApiError::bad_request(
            "bad request body: slicer size_variation must be less than average_size",
        )),
        _ => Ok(()),
    }
}

/// An API error as Toxiproxy sends it: `{"error": "...", "status": N}`.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    pub(super) message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub(super) fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    pub(super) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    fn proxy_not_found() -> ApiError {
        ApiError::not_found("proxy not found")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            let status = self.status.as_u16();
            warn!(status, error = %self.message, "toxiproxy API request failed");
        }
        json_response(
            self.status,
            &serde_json::json!({ "error": self.message, "status": self.status.as_u16() }),
        )
    }
}

type ApiResult = Result<Response, ApiError>;

fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_string(value).unwrap_or_else(|err| {
        format!(r#"{{"error":"serialising the answer: {err}","status":500}}"#)
    });
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub(super) async fn version() -> Response {
    ([(header::CONTENT_TYPE, "text/plain")], VERSION).into_response()
}

pub(super) async fn unknown_route() -> ApiError {
    ApiError::not_found("not found")
}

/// Enables every proxy and removes all toxics.
pub(super) async fn reset(State(store): State<Shared>) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let mut failures = Vec::new();
    // Keep going past a failing proxy: a reset between tests should clean up all it can.
    for entry in proxies.values_mut() {
        let cleared = entry.clear_toxics().await;
        if let Err(err) = cleared.and(entry.start().await) {
            failures.push(format!("{}: {}", entry.name, err.message));
        }
    }
    if failures.is_empty() {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::internal(failures.join("; ")))
    }
}

/// Creates or replaces the given proxies; others are left alone.
pub(super) async fn populate(State(store): State<Shared>, body: Bytes) -> ApiResult {
    let specs: Vec<NewProxy> = parse_body(&body)?;
    // Validate the whole request before changing anything.
    for (position, spec) in specs.iter().enumerate() {
        validate_new_proxy(spec, Some(position))?;
        if specs[..position].iter().any(|seen| seen.name == spec.name) {
            return Err(ApiError::bad_request(format!(
                "duplicate proxy name {:?}",
                spec.name
            )));
        }
    }

    let mut proxies = store.proxies.lock().await;
    let mut populated = Vec::with_capacity(specs.len());
    for spec in specs {
        if let Some(existing) = proxies.get_mut(&spec.name)
            && existing.upstream == spec.upstream
            && listen_matches(&spec.listen, existing.listen).await
        {
            // Like Toxiproxy, an unchanged proxy keeps its toxics and live connections.
            existing.set_enabled(spec.enabled).await?;
            populated.push(existing.info());
            continue;
        }
        if let Some(mut replaced) = proxies.remove(&spec.name) {
            replaced.stop().await;
        }
        let entry = ProxyEntry::create(spec).await?;
        populated.push(entry.info());
        proxies.insert(entry.name.clone(), entry);
    }
    Ok(json_response(
        StatusCode::CREATED,
        &serde_json::json!({ "proxies": populated }),
    ))
}

pub(super) async fn list_proxies(State(store): State<Shared>) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let listing: BTreeMap<&String, ProxyInfo> = proxies
        .iter()
        .map(|(name, entry)| (name, entry.info()))
        .collect();
    Ok(json_response(StatusCode::OK, &listing))
}

pub(super) async fn create_proxy(State(store): State<Shared>, body: Bytes) -> ApiResult {
    let spec: NewProxy = parse_body(&body)?;
    validate_new_proxy(&spec, None)?;
    let mut proxies = store.proxies.lock().await;
    if proxies.contains_key(&spec.name) {
        return Err(ApiError::conflict("proxy already exists"));
    }
    let entry = ProxyEntry::create(spec).await?;
    let created = entry.info();
    proxies.insert(entry.name.clone(), entry);
    Ok(json_response(StatusCode::CREATED, &created))
}

pub(super) async fn show_proxy(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    Ok(json_response(StatusCode::OK, &entry.info()))
}

pub(super) async fn update_proxy(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let update: ProxyUpdate = parse_body(&body)?;
    if update.upstream.as_deref() == Some("") {
        return Err(ApiError::bad_request(
            "bad request body: upstream cannot be empty",
        ));
    }
    entry
        .update(
            update.listen.as_deref(),
            update.upstream.as_deref(),
            update.enabled,
        )
        .await?;
    Ok(json_response(StatusCode::OK, &entry.info()))
}

pub(super) async fn delete_proxy(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let mut entry = proxies
        .remove(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    entry.stop().await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn list_toxics(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    Ok(json_response(StatusCode::OK, &entry.toxic_infos()))
}

pub(super) async fn create_toxic(
    State(store): State<Shared>,
    Path(proxy): Path<String>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let toxic = new_toxic(parse_body(&body)?)?;
    let created = ToxicInfo::of(&toxic);
    entry.add_toxic(toxic).await?;
    Ok(json_response(StatusCode::OK, &created))
}

pub(super) async fn show_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
) -> ApiResult {
    let proxies = store.proxies.lock().await;
    let entry = proxies.get(&proxy).ok_or_else(ApiError::proxy_not_found)?;
    let toxic = entry
        .toxic(&toxic)
        .ok_or_else(|| ApiError::not_found("toxic not found"))?;
    Ok(json_response(StatusCode::OK, &ToxicInfo::of(toxic)))
}

pub(super) async fn update_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    let current = entry
        .toxic(&toxic)
        .ok_or_else(|| ApiError::not_found("toxic not found"))?;
    let updated = updated_toxic(current, parse_body(&body)?)?;
    let shown = ToxicInfo::of(&updated);
    entry.update_toxic(updated).await?;
    Ok(json_response(StatusCode::OK, &shown))
}

pub(super) async fn delete_toxic(
    State(store): State<Shared>,
    Path((proxy, toxic)): Path<(String, String)>,
) -> ApiResult {
    let mut proxies = store.proxies.lock().await;
    let entry = proxies
        .get_mut(&proxy)
        .ok_or_else(ApiError::proxy_not_found)?;
    entry.remove_toxic(&toxic).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
