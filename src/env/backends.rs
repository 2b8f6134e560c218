//! Model backends: one wiremock `MockServer` per model version. The output is a deterministic
//! function of (input, version) that names its version ([`crate::contract::model_output`]), so a
//! stored result proves which model produced it. A backend answers in the shape of a model API
//! ([`ModelApi`]): racecert's own `/v1/infer`, OpenAI-compatible `/v1/completions` and
//! `/v1/chat/completions` (whole or streamed as server-sent events), KServe v2, or a JSON template
//! of the team's.
//!
//! Behaviour is programmable per case with wiremock's own scoped mocks: a case's calls are
//! recognised by its key prefix in the request body ([`CaseCalls`]), and a program (a delay, HTTP
//! failures, the first N calls failing via `up_to_n_times`) is a set of scoped mocks that lasts as
//! long as its [`ProgramGuard`]. Every call a mock answers is written to the backend's journal
//! ([`ModelBackend::journal`]) for the checkers, and a case's entries are taken out of it when
//! its history is assembled ([`ModelBackend::take_journal`]). Not wiremock's own request recording: it keeps every
//! request for the server's lifetime and hands out a copy of all of them on each read, so a long
//! exploration grew by ~11 KiB a case and every case's read got slower.
//!
//! Every mock is mounted at wiremock's default priority, in order: wiremock 0.6 sorts its mocks
//! by priority in place while a scoped mock's guard remembers its index, so mixing priorities
//! makes dropping a guard switch off some other mock. With one priority the sort never moves a
//! mock and the first mounted match wins; the default answer is therefore told not to match a
//! case that has a program ([`Unprogrammed`]), and a case has one program at a time.
//!
//! Why one file of ~1,300 lines: ~390 of them are its tests (real mock servers, many cases on one
//! thread) and ~250 OpenAI chat's wire types (`mod chat`, which could be a file of its own); the
//! rest is one mechanism, programs, their guards and the responders they mount, that shares
//! private state (`Programs`) no other module should see.

use crate::contract::{InferRequest, InferResponse, model_output};
use crate::wire::JournalEntry;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{
    Match, Mock, MockBuilder, MockGuard, MockServer, Request, Respond, ResponseTemplate,
};

/// racecert's own inference endpoint (the contract's).
pub const INFER_PATH: &str = "/v1/infer";

/// The model API a backend speaks: where the input is in a request, where the output goes in the
/// answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "api", rename_all = "kebab-case")]
pub enum ModelApi {
    /// `POST /v1/infer` with [`InferRequest`], answered with [`InferResponse`] (the contract's).
    #[default]
    Racecert,
    /// OpenAI-compatible `POST /v1/completions` (`prompt` in, `choices[0].text` out).
    OpenaiCompletions,
    /// OpenAI-compatible `POST /v1/chat/completions`: the last `user` message in (its text parts
    /// joined), `choices[0].message.content` out, or, when the call asks for `"stream": true`,
    /// server-sent `chat.completion.chunk`s carrying it in `choices[0].delta.content`.
    OpenaiChat,
    /// KServe v2 `POST /v2/models/{name}/infer` (`inputs[0].data[0]` in, `outputs[0].data[0]`
    /// out).
    KserveV2,
    /// A team's own JSON API.
    Template {
        /// Request path (exact).
        path: String,
        /// JSON pointer to the input in the request (e.g. `/inputs/0/text`).
        input: String,
        /// JSON pointer where the answer carries the output (e.g. `/result/text`).
        output: String,
    },
}

impl ModelApi {
    /// The mock that recognises this API's calls.
    fn route(&self) -> MockBuilder {
        let post = Mock::given(method("POST"));
        match self {
            ModelApi::Racecert => post.and(path(INFER_PATH)),
            ModelApi::OpenaiCompletions => post.and(path("/v1/completions")),
            ModelApi::OpenaiChat => post.and(path(chat::PATH)),
            ModelApi::KserveV2 => post.and(path_regex(r"^/v2/models/[^/]+/infer$")),
            ModelApi::Template { path: p, .. } => post.and(path(p.as_str())),
        }
    }

    /// Whether a request path is one of this API's calls.
    fn is_call(&self, request_path: &str) -> bool {
        match self {
            ModelApi::Racecert => request_path == INFER_PATH,
            ModelApi::OpenaiCompletions => request_path == "/v1/completions",
            ModelApi::OpenaiChat => request_path == chat::PATH,
            ModelApi::KserveV2 => {
                request_path.starts_with("/v2/models/") && request_path.ends_with("/infer")
            }
            ModelApi::Template { path, .. } => request_path == path,
        }
    }

    /// The call as the journal keeps it: the input, and racecert's own fields when the API is
    /// the contract's.
    pub fn read(&self, body: &[u8]) -> std::result::Result<InferRequest, String> {
        self.call(body).map(|call| call.request)
    }

    /// The call as a backend answers it: what it asks, and how it asked to be answered.
    fn call(&self, body: &[u8]) -> std::result::Result<Call, String> {
        let unreadable = |err: serde_json::Error| err.to_string();
        let pointer = match self {
            ModelApi::Racecert => {
                return Ok(Call {
                    request: serde_json::from_slice(body).map_err(unreadable)?,
                    reply: Reply::Json,
                });
            }
            ModelApi::OpenaiChat => {
                let chat: chat::Request = serde_json::from_slice(body).map_err(unreadable)?;
                return Ok(Call {
                    request: input_only(chat.input()?),
                    reply: chat.reply(),
                });
            }
            ModelApi::OpenaiCompletions => "/prompt",
            ModelApi::KserveV2 => "/inputs/0/data/0",
            ModelApi::Template { input, .. } => input.as_str(),
        };
        let value: Value = serde_json::from_slice(body).map_err(unreadable)?;
        let input = match value.pointer(pointer) {
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => return Err(format!("no input at {pointer}")),
        };
        Ok(Call {
            request: input_only(input),
            reply: Reply::Json,
        })
    }

    /// The answer to `call` carrying `output` of `version`.
    fn answer(&self, call: &Call, output: &str, version: &str) -> ResponseTemplate {
        let body = match self {
            ModelApi::Racecert => json!(InferResponse {
                output: output.to_owned(),
                model_version: version.to_owned(),
            }),
            ModelApi::OpenaiCompletions => json!({
                "object": "text_completion",
                "model": version,
                "choices": [{"index": 0, "text": output, "finish_reason": "stop"}],
            }),
            ModelApi::OpenaiChat => {
                let answer = chat::Answer::new(&call.request.input, output, version);
                match call.reply {
                    Reply::Json => json!(answer.completion()),
                    Reply::EventStream { usage } => {
                        return ResponseTemplate::new(200)
                            .set_body_raw(answer.event_stream(usage), "text/event-stream");
                    }
                }
            }
            ModelApi::KserveV2 => json!({
                "model_name": "model",
                "model_version": version,
                "outputs": [{"name": "output", "datatype": "BYTES", "shape": [1], "data": [output]}],
            }),
            ModelApi::Template {
                output: pointer, ..
            } => {
                let mut answer = Value::Null;
                set_pointer(&mut answer, pointer, Value::String(output.to_owned()));
                answer
            }
        };
        ResponseTemplate::new(200).set_body_json(body)
    }
}

/// A call as a backend reads it.
struct Call {
    /// What the journal keeps of it.
    request: InferRequest,
    /// How it asked to be answered.
    reply: Reply,
}

/// How a call asked to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// One JSON body.
    Json,
    /// Server-sent events (OpenAI chat's `"stream": true`); `usage`: a last chunk carrying the
    /// usage (`stream_options.include_usage`).
    EventStream { usage: bool },
}

/// A call of an API other than the contract's: it carries the input, none of racecert's fields.
fn input_only(input: String) -> InferRequest {
    InferRequest {
        input,
        idempotency_key: String::new(),
        attempt: 0,
        worker_id: String::new(),
    }
}

/// Writes `value` at JSON `pointer` into `target`, creating objects (and arrays for numeric
/// segments) on the way.
fn set_pointer(target: &mut Value, pointer: &str, value: Value) {
    let mut slot = target;
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        if let Ok(index) = segment.parse::<usize>() {
            if !slot.is_array() {
                *slot = Value::Array(Vec::new());
            }
            let items = slot.as_array_mut().expect("just made an array");
            while items.len() <= index {
                items.push(Value::Null);
            }
            slot = &mut items[index];
        } else {
            if !slot.is_object() {
                *slot = Value::Object(serde_json::Map::new());
            }
            slot = slot
                .as_object_mut()
                .expect("just made an object")
                .entry(segment)
                .or_insert(Value::Null);
        }
    }
    *slot = value;
}

/// One model backend serving one version.
pub struct ModelBackend {
    server: MockServer,
    name: String,
    version: String,
    api: ModelApi,
    programs: Arc<Programs>,
    journal: Arc<Journal>,
}

/// The calls a backend answered, in arrival order, each with its sequence number and its body.
#[derive(Default)]
struct Journal {
    calls: Mutex<(usize, Vec<(usize, bytes::Bytes)>)>,
}

impl Journal {
    fn record(&self, body: &[u8]) {
        let mut calls = self.calls.lock().expect("poisoned");
        let seq = calls.0;
        calls.0 += 1;
        calls.1.push((seq, bytes::Bytes::copy_from_slice(body)));
    }
}

/// Writes each call it answers to the journal, then answers as `inner` does.
struct Journaled {
    journal: Arc<Journal>,
    api: ModelApi,
    inner: Box<dyn Respond>,
}

impl Respond for Journaled {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if self.api.is_call(request.url.path()) {
            self.journal.record(&request.body);
        }
        self.inner.respond(request)
    }
}

/// The cases that have a program, and its mocks (wiremock deactivates them when dropped).
#[derive(Default)]
struct Programs {
    next_id: AtomicU64,
    /// case prefix -> (program id, its scoped mocks).
    active: Mutex<HashMap<String, (u64, Vec<MockGuard>)>>,
}

/// Keeps a program active; dropping it removes the program (the case gets normal answers).
pub struct ProgramGuard {
    programs: Arc<Programs>,
    prefix: String,
    id: u64,
}

impl std::fmt::Debug for ProgramGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramGuard")
            .field("prefix", &self.prefix)
            .field("id", &self.id)
            .finish()
    }
}

impl ProgramGuard {
    /// Ends the program and returns once wiremock has unmounted its mocks, so the case's next
    /// call gets normal answers. Async code ends programs this way, never by dropping the guard
    /// (see [`unmount`]).
    pub async fn release(self) {
        let mocks = self.take();
        unmount(mocks).await;
    }

    /// Removes the program from the active ones, if it is still the case's (a newer program of
    /// the case replaces it), and hands back its mocks' guards.
    fn take(&self) -> Vec<MockGuard> {
        let mut active = self.programs.active.lock().expect("poisoned");
        match active.get(&self.prefix) {
            Some((id, _)) if *id == self.id => active
                .remove(&self.prefix)
                .map(|(_, mocks)| mocks)
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

/// Ends every program of `guards`, each as [`ProgramGuard::release`] does.
pub async fn release_all(guards: impl IntoIterator<Item = ProgramGuard>) {
    for guard in guards {
        guard.release().await;
    }
}

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // Reached only when a guard was not released (an error or panic unwound past it): the
        // mocks are unmounted on a thread of their own, a moment later, for the reason
        // `unmount` gives.
        let mocks = self.take();
        if !mocks.is_empty() {
            std::thread::spawn(move || drop(mocks));
        }
    }
}

/// Unmounts scoped mocks without blocking the async thread. Dropping a wiremock `MockGuard`
/// blocks its thread until it gets the server's state lock; on a thread that also polls other
/// cases, one of which was just granted that lock but cannot run until the thread is free, that
/// is a deadlock (seen: a certify run stuck for minutes, its main thread parked in the guard's
/// drop). So the guards are dropped on a blocking-pool thread while this task waits.
async fn unmount(mocks: Vec<MockGuard>) {
    if mocks.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            // A panic in wiremock's drop (a scoped mock's unmet expectation: racecert sets
            // none) is not ours to propagate from here.
            let _ = runtime.spawn_blocking(move || drop(mocks)).await;
        }
        Err(_) => drop(mocks),
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

/// Matches the calls of one case: its key prefix appears in the request body (racecert's
/// idempotency keys carry it, and inputs racecert submits to other systems do).
#[derive(Debug, Clone)]
pub struct CaseCalls {
    prefix: String,
}

impl Match for CaseCalls {
    fn matches(&self, request: &Request) -> bool {
        contains(&request.body, &self.prefix)
    }
}

/// Whether a call's body names a case's key prefix.
fn contains(body: &[u8], prefix: &str) -> bool {
    let needle = prefix.as_bytes();
    body.windows(needle.len()).any(|w| w == needle)
}

/// Matches calls of cases without a program: the default answer must not shadow a program (the
/// first mounted match wins).
struct Unprogrammed(Arc<Programs>);

impl Match for Unprogrammed {
    fn matches(&self, request: &Request) -> bool {
        let active = self.0.active.lock().expect("poisoned");
        !active.keys().any(|prefix| {
            CaseCalls {
                prefix: prefix.clone(),
            }
            .matches(request)
        })
    }
}

/// Answers like a model of `version` in the backend's API shape.
#[derive(Debug, Clone)]
struct ModelResponder {
    version: String,
    api: ModelApi,
}

impl Respond for ModelResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        match self.api.call(&request.body) {
            Ok(call) => {
                let output = model_output(&call.request.input, &self.version);
                self.api.answer(&call, &output, &self.version)
            }
            Err(err) => ResponseTemplate::new(400)
                .set_body_json(json!({ "error": format!("bad request: {err}") })),
        }
    }
}

/// What a backend does with one case's calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// Answer correctly, after `delay`.
    Delay(Duration),
    /// Answer correctly after `delay`, past the calling worker's timeout, and expire the caller's
    /// wait the moment the call arrives (`deadlines`, the controlled runner's): the worker times
    /// out after the backend received (and computed) the call, as with [`Behaviour::Delay`],
    /// without the wall-clock wait.
    Stall {
        /// How long the answer is held (past the worker's timeout).
        delay: Duration,
        /// Whose waits to expire, by the `worker_id` of the call.
        deadlines: Stalls,
    },
    /// Answer with HTTP `status` (5xx, 429, ...) on every call.
    Fail {
        /// The HTTP status.
        status: u16,
    },
    /// Answer at once as the model of `version` does (another version's backend now behind
    /// this URL: a rollout that switches what a shared model URL reaches).
    Serve {
        /// The version that answers.
        version: String,
    },
    /// Answer with HTTP `status` on the first `calls` calls, then correctly.
    FailFirst {
        /// The HTTP status.
        status: u16,
        /// How many calls fail.
        calls: u64,
    },
}

/// The caller-side deadlines a [`Behaviour::Stall`] expires (compared by identity).
#[derive(Debug, Clone)]
pub struct Stalls(pub crate::contract::checkpoint::Deadlines);

impl PartialEq for Stalls {
    fn eq(&self, other: &Stalls) -> bool {
        self.0.same_as(&other.0)
    }
}

impl ModelBackend {
    /// Starts a backend named `name` (e.g. `model-backend-A`) serving `version` on racecert's own
    /// API.
    pub async fn start(name: &str, version: &str) -> ModelBackend {
        ModelBackend::start_with(name, version, ModelApi::Racecert).await
    }

    /// Starts a backend serving `version` in the shape of `api`.
    pub async fn start_with(name: &str, version: &str, api: ModelApi) -> ModelBackend {
        let server = MockServer::builder()
            .disable_request_recording()
            .start()
            .await;
        let programs = Arc::new(Programs::default());
        let journal = Arc::new(Journal::default());
        api.route()
            .and(Unprogrammed(programs.clone()))
            .respond_with(Journaled {
                journal: journal.clone(),
                api: api.clone(),
                inner: Box::new(ModelResponder {
                    version: version.to_owned(),
                    api: api.clone(),
                }),
            })
            .named(format!("{name} serves {version}"))
            .mount(&server)
            .await;
        ModelBackend {
            server,
            name: name.to_owned(),
            version: version.to_owned(),
            api,
            programs,
            journal,
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

    /// The API it speaks.
    pub fn api(&self) -> &ModelApi {
        &self.api
    }

    /// Its direct address (workers reach it through its proxy instead).
    pub fn addr(&self) -> SocketAddr {
        *self.server.address()
    }

    /// Programs `behaviour` for the calls of the case whose key prefix is `case_prefix` (e.g.
    /// [`crate::contract::Keys::prefix`]). A case has one program at a time: a new one replaces
    /// the one before. It lasts as long as the returned guard.
    pub async fn program(&self, case_prefix: &str, behaviour: Behaviour) -> Result<ProgramGuard> {
        if case_prefix.is_empty() {
            return Err(Error::Backend(
                "a case program needs a non-empty key prefix".to_owned(),
            ));
        }
        if let Behaviour::Fail { status } | Behaviour::FailFirst { status, .. } = behaviour
            && !(400..=599).contains(&status)
        {
            return Err(Error::Backend(format!(
                "failure status must be 4xx or 5xx, got {status}"
            )));
        }
        // The case's previous program goes first, so no call meets both.
        let previous = self
            .programs
            .active
            .lock()
            .expect("poisoned")
            .remove(case_prefix);
        unmount(previous.map(|(_, mocks)| mocks).unwrap_or_default()).await;
        let case = || {
            self.api.route().and(CaseCalls {
                prefix: case_prefix.to_owned(),
            })
        };
        let journaled = |inner: Box<dyn Respond>| Journaled {
            journal: self.journal.clone(),
            api: self.api.clone(),
            inner,
        };
        let answer = ModelResponder {
            version: self.version.clone(),
            api: self.api.clone(),
        };
        let mut mocks = Vec::new();
        match behaviour {
            Behaviour::Delay(delay) => {
                mocks.push(
                    case().respond_with(journaled(Box::new(DelayedResponder(answer, delay)))),
                );
            }
            Behaviour::Stall { delay, deadlines } => {
                mocks.push(case().respond_with(journaled(Box::new(StallingResponder {
                    answer,
                    api: self.api.clone(),
                    delay,
                    deadlines: deadlines.0,
                }))));
            }
            Behaviour::Fail { status } => {
                mocks.push(case().respond_with(journaled(Box::new(error_template(status)))));
            }
            Behaviour::Serve { version } => {
                mocks.push(case().respond_with(journaled(Box::new(ModelResponder {
                    version,
                    api: self.api.clone(),
                }))));
            }
            Behaviour::FailFirst { status, calls } => {
                // Mounted first, so it answers until wiremock has counted `calls` of them.
                mocks.push(
                    case()
                        .respond_with(journaled(Box::new(error_template(status))))
                        .up_to_n_times(calls),
                );
                mocks.push(case().respond_with(journaled(Box::new(answer))));
            }
        }
        let mut guards = Vec::new();
        for mock in mocks {
            guards.push(mock.mount_as_scoped(&self.server).await);
        }
        let id = self.programs.next_id.fetch_add(1, Ordering::Relaxed);
        self.programs
            .active
            .lock()
            .expect("poisoned")
            .insert(case_prefix.to_owned(), (id, guards));
        Ok(ProgramGuard {
            programs: self.programs.clone(),
            prefix: case_prefix.to_owned(),
            id,
        })
    }

    /// Every call answered so far and not forgotten, optionally only those of one case.
    pub async fn journal(&self, case_prefix: Option<&str>) -> Vec<JournalEntry> {
        let calls = self.journal.calls.lock().expect("poisoned");
        calls
            .1
            .iter()
            .filter(|(_, body)| case_prefix.is_none_or(|prefix| contains(body, prefix)))
            .map(|(seq, body)| self.entry(*seq, body))
            .collect()
    }

    /// The calls of one case that is over, taken out of the journal, so that it holds the cases
    /// in flight and not every case so far.
    pub fn take_journal(&self, case_prefix: &str) -> Vec<JournalEntry> {
        let mut calls = self.journal.calls.lock().expect("poisoned");
        let (taken, kept) = std::mem::take(&mut calls.1)
            .into_iter()
            .partition(|(_, body)| contains(body, case_prefix));
        calls.1 = kept;
        taken
            .iter()
            .map(|(seq, body): &(usize, bytes::Bytes)| self.entry(*seq, body))
            .collect()
    }

    /// A journaled call as the checkers read it.
    fn entry(&self, seq: usize, body: &[u8]) -> JournalEntry {
        JournalEntry {
            seq,
            backend: self.name.clone(),
            model_version: self.version.clone(),
            request: self.api.read(body).ok(),
        }
    }
}

/// A correct answer after a delay (wiremock's own: the response is held, not the server).
struct DelayedResponder(ModelResponder, Duration);

impl Respond for DelayedResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.0.respond(request).set_delay(self.1)
    }
}

/// A correct answer held past the caller's timeout; the caller's wait expires on arrival.
struct StallingResponder {
    answer: ModelResponder,
    api: ModelApi,
    delay: Duration,
    deadlines: crate::contract::checkpoint::Deadlines,
}

impl Respond for StallingResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if let Ok(call) = self.api.read(&request.body) {
            self.deadlines.expire(&call.worker_id);
        }
        self.answer.respond(request).set_delay(self.delay)
    }
}

fn error_template(status: u16) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(json!({ "error": format!("injected HTTP {status}") }))
}

mod chat;

#[cfg(test)]
mod tests;
