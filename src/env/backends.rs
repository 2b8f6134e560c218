//! Model backends: one wiremock `MockServer` per model version answering `POST /v1/infer`. The
//! output is a deterministic function of (input, version) that names its version
//! ([`crate::contract::model_output`]), so a stored result proves which model produced it.
//!
//! Behaviour is programmable per case: a case's requests are recognised by the namespace prefix of
//! their idempotency key, and a case-scoped mock (delay, HTTP failure, fail the first N calls)
//! overrides the default answer for that case only, so cases sharing one backend never see each
//! other's faults. The request journal is wiremock's own, read back for the checkers.

use crate::contract::{InferRequest, InferResponse, model_output};
use crate::{Error, Result};
use std::net::SocketAddr;
use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Match, Mock, MockGuard, MockServer, Request, Respond, ResponseTemplate};

/// The inference endpoint every backend serves.
pub const INFER_PATH: &str = "/v1/infer";

/// Priority of case-scoped mocks: wiremock answers with the matching mock of lowest number.
const CASE_PRIORITY: u8 = 1;
/// Priority of the default deterministic answer.
const DEFAULT_PRIORITY: u8 = 10;

/// One model backend serving one version.
pub struct ModelBackend {
    server: MockServer,
    name: String,
    version: String,
}

impl std::fmt::Debug for ModelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelBackend")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("uri", &self.server.uri())
            .finish()
    }
}

/// Answers like a model of `version`, after an optional delay.
#[derive(Debug, Clone)]
struct InferResponder {
    version: String,
    delay: Option<Duration>,
}

impl Respond for InferResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let template = match serde_json::from_slice::<InferRequest>(&request.body) {
            Ok(infer) => ResponseTemplate::new(200).set_body_json(InferResponse {
                output: model_output(&infer.input, &self.version),
                model_version: self.version.clone(),
            }),
            Err(err) => ResponseTemplate::new(400)
                .set_body_json(serde_json::json!({ "error": format!("bad request: {err}") })),
        };
        match self.delay {
            Some(delay) => template.set_delay(delay),
            None => template,
        }
    }
}

/// Matches requests of one case: the idempotency key starts with the case's namespace.
#[derive(Debug, Clone)]
struct CaseScope(String);

impl Match for CaseScope {
    fn matches(&self, request: &Request) -> bool {
        serde_json::from_slice::<InferRequest>(&request.body)
            .is_ok_and(|infer| infer.idempotency_key.starts_with(&self.0))
    }
}

/// What a backend does with one case's calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// Answer correctly, after `delay`.
    Delay(Duration),
    /// Answer with HTTP `status` (5xx, 429, ...) on every call.
    Fail {
        /// The HTTP status.
        status: u16,
    },
    /// Answer with HTTP `status` on the first `calls` calls, then correctly.
    FailFirst {
        /// The HTTP status.
        status: u16,
        /// How many calls fail.
        calls: u64,
    },
}

/// One call as the backend received it.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Position in the backend's journal (arrival order).
    pub seq: usize,
    /// The backend's name.
    pub backend: String,
    /// The version it serves.
    pub model_version: String,
    /// The parsed request (None if the body was not a valid infer request).
    pub request: Option<InferRequest>,
}

impl ModelBackend {
    /// Starts a backend named `name` (e.g. `model-backend-A`) serving `version`.
    pub async fn start(name: &str, version: &str) -> ModelBackend {
        let server = MockServer::builder().start().await;
        Mock::given(method("POST"))
            .and(path(INFER_PATH))
            .respond_with(InferResponder {
                version: version.to_owned(),
                delay: None,
            })
            .with_priority(DEFAULT_PRIORITY)
            .named(format!("{name} serves {version}"))
            .mount(&server)
            .await;
        ModelBackend {
            server,
            name: name.to_owned(),
            version: version.to_owned(),
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version it serves.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Its direct address (workers reach it through its proxy instead).
    pub fn addr(&self) -> SocketAddr {
        *self.server.address()
    }

    /// Programs `behaviour` for the calls of the case whose idempotency keys start with
    /// `case_prefix`. The program lasts as long as the returned guard.
    pub async fn program(&self, case_prefix: &str, behaviour: Behaviour) -> Result<MockGuard> {
        if case_prefix.is_empty() {
            return Err(Error::Backend(
                "a case program needs a non-empty idempotency-key prefix".to_owned(),
            ));
        }
        let mock = Mock::given(method("POST"))
            .and(path(INFER_PATH))
            .and(CaseScope(case_prefix.to_owned()));
        let mock = match behaviour {
            Behaviour::Delay(delay) => mock.respond_with(InferResponder {
                version: self.version.clone(),
                delay: Some(delay),
            }),
            Behaviour::Fail { status } => mock.respond_with(error_template(status)?),
            Behaviour::FailFirst { status, calls } => mock
                .respond_with(error_template(status)?)
                .up_to_n_times(calls),
        }
        .with_priority(CASE_PRIORITY);
        Ok(mock.mount_as_scoped(&self.server).await)
    }

    /// Every call received so far, optionally only those of one case.
    pub async fn journal(&self, case_prefix: Option<&str>) -> Vec<JournalEntry> {
        let requests = self.server.received_requests().await.unwrap_or_default();
        requests
            .iter()
            .filter(|r| r.url.path() == INFER_PATH)
            .map(|r| serde_json::from_slice::<InferRequest>(&r.body).ok())
            .enumerate()
            .filter(|(_, request)| match (case_prefix, request) {
                (None, _) => true,
                (Some(prefix), Some(request)) => request.idempotency_key.starts_with(prefix),
                (Some(_), None) => false,
            })
            .map(|(seq, request)| JournalEntry {
                seq,
                backend: self.name.clone(),
                model_version: self.version.clone(),
                request,
            })
            .collect()
    }
}

fn error_template(status: u16) -> Result<ResponseTemplate> {
    if !(400..=599).contains(&status) {
        return Err(Error::Backend(format!(
            "failure status must be 4xx or 5xx, got {status}"
        )));
    }
    Ok(ResponseTemplate::new(status)
        .set_body_json(serde_json::json!({ "error": format!("injected HTTP {status}") })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::output_version;

    async fn infer(backend: &ModelBackend, key: &str) -> (u16, Option<InferResponse>) {
        let response = reqwest::Client::new()
            .post(format!("http://{}{INFER_PATH}", backend.addr()))
            .json(&InferRequest {
                input: "hello".into(),
                idempotency_key: key.into(),
                attempt: 1,
                worker_id: "w".into(),
            })
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.ok())
    }

    #[tokio::test]
    async fn answers_name_their_version_and_programs_are_per_case() {
        let backend = ModelBackend::start("model-backend-B", "v2").await;
        let (status, answer) = infer(&backend, "case-1:k").await;
        assert_eq!(status, 200);
        let answer = answer.unwrap();
        assert_eq!(answer.output, model_output("hello", "v2"));
        assert_eq!(output_version(&answer.output), Some("v2"));

        let guard = backend
            .program(
                "case-2:",
                Behaviour::FailFirst {
                    status: 503,
                    calls: 2,
                },
            )
            .await
            .unwrap();
        assert_eq!(infer(&backend, "case-2:k").await.0, 503);
        assert_eq!(
            infer(&backend, "case-1:k").await.0,
            200,
            "other cases unaffected"
        );
        assert_eq!(infer(&backend, "case-2:k").await.0, 503);
        assert_eq!(
            infer(&backend, "case-2:k").await.0,
            200,
            "only the first two fail"
        );
        drop(guard);

        let journal = backend.journal(Some("case-2:")).await;
        assert_eq!(journal.len(), 3);
        assert!(journal.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(backend.journal(None).await.len(), 5);
        assert!(
            backend
                .program("", Behaviour::Fail { status: 500 })
                .await
                .is_err()
        );
        assert!(
            backend
                .program("c:", Behaviour::Fail { status: 200 })
                .await
                .is_err()
        );
    }
}
