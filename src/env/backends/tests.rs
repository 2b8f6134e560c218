//! The backends' own tests: every API shape answers, programs scope to their case, the journal
//! records what was answered.

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

/// Many cases on one thread (as `explore` runs them) program, call and release the same
/// backend at once. Dropping wiremock's guards on that thread could park it for good while
/// another case on it had been granted the server's lock; releasing never blocks it.
#[test]
fn cases_sharing_a_thread_program_and_release_without_blocking_each_other() {
    // On a thread of its own: a parked thread ignores timers, so the test thread watches.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(cases_on_one_thread());
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("eight cases on one thread finished 25 rounds each within a minute");
}

async fn cases_on_one_thread() {
    let backend = ModelBackend::start("model-backend-A", "v1").await;
    let case = |n: usize| {
        let backend = &backend;
        async move {
            let prefix = format!("case-{n}:");
            let key = format!("{prefix}k");
            for round in 0..25 {
                let failing = backend
                    .program(&prefix, Behaviour::Fail { status: 503 })
                    .await
                    .unwrap();
                assert_eq!(infer(backend, &key).await.0, 503, "case {n} round {round}");
                let replaced = backend
                    .program(&prefix, Behaviour::Fail { status: 500 })
                    .await
                    .unwrap();
                failing.release().await;
                assert_eq!(infer(backend, &key).await.0, 500, "case {n} round {round}");
                replaced.release().await;
                assert_eq!(infer(backend, &key).await.0, 200, "case {n} round {round}");
            }
        }
    };
    futures::future::join_all((0..8).map(case)).await;
}

#[tokio::test(flavor = "multi_thread")]
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
    // A new program of the case replaces the old; releasing the old guard then changes
    // nothing.
    let failing = backend
        .program("case-2:", Behaviour::Fail { status: 500 })
        .await
        .unwrap();
    guard.release().await;
    assert_eq!(infer(&backend, "case-2:k").await.0, 500);
    failing.release().await;
    assert_eq!(infer(&backend, "case-2:k").await.0, 200, "program gone");

    let journal = backend.journal(Some("case-2:")).await;
    assert_eq!(journal.len(), 5);
    assert!(journal.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(backend.journal(None).await.len(), 7);
    // Once a case's history is read, its calls leave the journal; the others stay.
    assert_eq!(backend.take_journal("case-2:"), journal);
    assert!(backend.journal(Some("case-2:")).await.is_empty());
    assert_eq!(backend.journal(None).await.len(), 2);
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

#[tokio::test(flavor = "multi_thread")]
async fn other_api_shapes_answer_with_outputs_naming_their_version() {
    let client = reqwest::Client::new();
    let openai = ModelBackend::start_with("m", "v1", ModelApi::OpenaiCompletions).await;
    let answer: Value = client
        .post(format!("http://{}/v1/completions", openai.addr()))
        .json(&json!({"model": "m", "prompt": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["text"],
        json!(model_output("hi", "v1"))
    );

    let kserve = ModelBackend::start_with("m", "v2", ModelApi::KserveV2).await;
    let answer: Value = client
        .post(format!("http://{}/v2/models/m/infer", kserve.addr()))
        .json(&json!({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["outputs"][0]["data"][0],
        json!(model_output("hi", "v2"))
    );
    assert_eq!(
        kserve.journal(None).await[0]
            .request
            .as_ref()
            .unwrap()
            .input,
        "hi"
    );

    let template = ModelBackend::start_with(
        "m",
        "v3",
        ModelApi::Template {
            path: "/predict".into(),
            input: "/query/text".into(),
            output: "/result/0/text".into(),
        },
    )
    .await;
    let answer: Value = client
        .post(format!("http://{}/predict", template.addr()))
        .json(&json!({"query": {"text": "hi"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["result"][0]["text"], json!(model_output("hi", "v3")));
}

/// The `data:` events of a server-sent-events body, `[DONE]` included.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| event.strip_prefix("data: ").expect("a data event"))
        .collect()
}

async fn chat(backend: &ModelBackend, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", backend.addr()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_chat_answers_the_last_user_message_whole_or_streamed() {
    let backend = ModelBackend::start_with("m", "v1", ModelApi::OpenaiChat).await;
    let output = model_output("hi", "v1");
    let conversation = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "v1:0000000000000000"},
        {"role": "user", "content": "hi"},
    ]);
    let response = chat(&backend, json!({"model": "m", "messages": conversation})).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], "v1");
    assert!(answer["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(answer["created"].is_u64());
    assert_eq!(answer["choices"][0]["index"], 0);
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    assert_eq!(answer["choices"][0]["message"]["content"], json!(output));
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(answer["usage"]["total_tokens"], 2, "{answer}");

    // Content as parts: the text parts, joined; an image part is no input.
    let parts = json!([{"role": "user", "content": [
        {"type": "text", "text": "h"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "i"},
    ]}]);
    let answer: Value = chat(&backend, json!({"model": "m", "messages": parts}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], json!(output));

    // `"stream": true`: chunks, the output in their deltas, then [DONE].
    let streamed = json!({"model": "m", "messages": conversation, "stream": true});
    let response = chat(&backend, streamed).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let body = response.text().await.unwrap();
    let streamed = events(&body);
    assert_eq!(streamed.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = streamed[..streamed.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "{body}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let said: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(said, output);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));

    // Usage asked for: `null` on every chunk, then one more chunk with no choices.
    let with_usage = json!({"messages": conversation, "stream": true,
        "stream_options": {"include_usage": true}});
    let body = chat(&backend, with_usage).await.text().await.unwrap();
    let chunks: Vec<Value> = events(&body)
        .iter()
        .filter(|event| **event != "[DONE]")
        .map(|event| serde_json::from_str(event).unwrap())
        .collect();
    let (last, before) = chunks.split_last().unwrap();
    assert!(before.iter().all(|c| c["usage"].is_null()), "{body}");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 1);

    // A call without a user message is refused, as a malformed one is.
    let response = chat(
        &backend,
        json!({"messages": [{"role": "system", "content": "x"}]}),
    )
    .await;
    assert_eq!(response.status(), 400);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("no message with role \\\"user\\\"")
    );

    // The journal keeps each call's input, the refused one without it.
    let inputs: Vec<Option<String>> = backend
        .journal(None)
        .await
        .into_iter()
        .map(|e| e.request.map(|r| r.input))
        .collect();
    let hi = Some("hi".to_owned());
    assert_eq!(inputs, vec![hi.clone(), hi.clone(), hi.clone(), hi, None]);
}

/// The backend's faults reach chat calls as they reach every other shape: a case's program
/// recognises its calls by the prefix in their body, and its answers keep the call's shape.
#[tokio::test(flavor = "multi_thread")]
async fn programs_apply_to_openai_chat_calls_whole_and_streamed() {
    let backend = ModelBackend::start_with("m", "v1", ModelApi::OpenaiChat).await;
    let call = |input: &str, stream: bool| json!({"messages": [{"role": "user", "content": input}], "stream": stream});
    let failing = backend
        .program(
            "case-1:",
            Behaviour::FailFirst {
                status: 503,
                calls: 1,
            },
        )
        .await
        .unwrap();
    assert_eq!(chat(&backend, call("case-1:a", true)).await.status(), 503);
    assert_eq!(chat(&backend, call("case-2:a", true)).await.status(), 200);
    let body = chat(&backend, call("case-1:a", true))
        .await
        .text()
        .await
        .unwrap();
    assert!(body.contains(&model_output("case-1:a", "v1")), "{body}");
    failing.release().await;

    let delay = Duration::from_millis(300);
    let slow = backend
        .program("case-1:", Behaviour::Delay(delay))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let response = chat(&backend, call("case-1:b", true)).await;
    assert!(started.elapsed() >= delay, "held {:?}", started.elapsed());
    assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    slow.release().await;

    let switched = backend
        .program(
            "case-1:",
            Behaviour::Serve {
                version: "v2".into(),
            },
        )
        .await
        .unwrap();
    let answer: Value = chat(&backend, call("case-1:c", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        json!(model_output("case-1:c", "v2"))
    );
    switched.release().await;

    let journal = backend.take_journal("case-1:");
    let inputs: Vec<&str> = journal
        .iter()
        .map(|e| e.request.as_ref().unwrap().input.as_str())
        .collect();
    assert_eq!(inputs, ["case-1:a", "case-1:a", "case-1:b", "case-1:c"]);
    assert_eq!(backend.journal(None).await.len(), 1, "case-2's call stays");
}
