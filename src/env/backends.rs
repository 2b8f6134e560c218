//! Model backends: one wiremock `MockServer` per model version answering `POST /v1/infer`. The
//! output is a deterministic function of (input, version) that names its version
//! ([`crate::contract::model_output`]), so a stored result proves which model produced it.
//!
//! Behaviour is programmable per case: a case's requests are recognised by the key prefix of their
//! idempotency key, and a program (delay, HTTP failure, fail the first N calls) changes the answer
//! for that case only, so cases sharing one backend never see each other's faults. The request
//! journal is wiremock's own, read back for the checkers.
//!
//! Programs live in a table the one mounted responder consults, not in scoped wiremock mocks:
//! wiremock 0.6 sorts its mocks by priority in place while scoped-mock guards remember their
//! index, so dropping a high-priority scoped mock can switch off the default one.

use crate::contract::{InferRequest, InferResponse, model_output};
use crate::{Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// The inference endpoint every backend serves.
pub const INFER_PATH: &str = "/v1/infer";

/// One model backend serving one version.
pub struct ModelBackend {
    server: MockServer,
    name: String,
    version: String,
    programs: Arc<Programs>,
}

/// Per-case programs, newest first wins.
#[derive(Debug, Default)]
struct Programs {
    next_id: AtomicU64,
    entries: Mutex<Vec<Program>>,
}

#[derive(Debug)]
struct Program {
    id: u64,
    prefix: String,
    behaviour: Behaviour,
    /// Failures left for [`Behaviour::FailFirst`].
    failures_left: u64,
}

/// Keeps a program active; dropping it removes the program.
#[derive(Debug)]
pub struct ProgramGuard {
    programs: Arc<Programs>,
    id: u64,
}

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        if let Ok(mut entries) = self.programs.entries.lock() {
            entries.retain(|p| p.id != self.id);
        }
    }
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

/// Answers like a model of `version`, unless a program of the request's case says otherwise.
#[derive(Debug, Clone)]
struct InferResponder {
    version: String,
    programs: Arc<Programs>,
}

impl InferResponder {
    fn answer(&self, infer: &InferRequest) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(InferResponse {
            output: model_output(&infer.input, &self.version),
            model_version: self.version.clone(),
        })
    }
}

impl Respond for InferResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let infer = match serde_json::from_slice::<InferRequest>(&request.body) {
            Ok(infer) => infer,
            Err(err) => {
                return ResponseTemplate::new(400)
                    .set_body_json(serde_json::json!({ "error": format!("bad request: {err}") }));
            }
        };
        let mut entries = self.programs.entries.lock().expect("poisoned");
        let program = entries
            .iter_mut()
            .rev()
            .find(|p| infer.idempotency_key.starts_with(&p.prefix));
        let Some(program) = program else {
            return self.answer(&infer);
        };
        match program.behaviour {
            Behaviour::Delay(delay) => self.answer(&infer).set_delay(delay),
            Behaviour::Fail { status } => error_template(status),
            Behaviour::FailFirst { status, .. } if program.failures_left > 0 => {
                program.failures_left -= 1;
                error_template(status)
            }
            Behaviour::FailFirst { .. } => self.answer(&infer),
        }
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
        let programs = Arc::new(Programs::default());
        Mock::given(method("POST"))
            .and(path(INFER_PATH))
            .respond_with(InferResponder {
                version: version.to_owned(),
                programs: programs.clone(),
            })
            .named(format!("{name} serves {version}"))
            .mount(&server)
            .await;
        ModelBackend {
            server,
            name: name.to_owned(),
            version: version.to_owned(),
            programs,
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
    /// `case_prefix` (a case's key prefix, e.g. [`crate::contract::Keys::prefix`]). The newest
    /// program of a case wins; it lasts as long as the returned guard.
    pub async fn program(&self, case_prefix: &str, behaviour: Behaviour) -> Result<ProgramGuard> {
        if case_prefix.is_empty() {
            return Err(Error::Backend(
                "a case program needs a non-empty idempotency-key prefix".to_owned(),
            ));
        }
        let failures_left = match behaviour {
            Behaviour::Fail { status } | Behaviour::FailFirst { status, .. }
                if !(400..=599).contains(&status) =>
            {
                return Err(Error::Backend(format!(
                    "failure status must be 4xx or 5xx, got {status}"
                )));
            }
            Behaviour::FailFirst { calls, .. } => calls,
            _ => 0,
        };
        let id = self.programs.next_id.fetch_add(1, Ordering::Relaxed);
        self.programs
            .entries
            .lock()
            .expect("poisoned")
            .push(Program {
                id,
                prefix: case_prefix.to_owned(),
                behaviour,
                failures_left,
            });
        Ok(ProgramGuard {
            programs: self.programs.clone(),
            id,
        })
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

fn error_template(status: u16) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(serde_json::json!({ "error": format!("injected HTTP {status}") }))
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
