//! OpenAI's chat-completions wire types, as far as a backend reads and writes them
//! (<https://platform.openai.com/docs/api-reference/chat>). Fields racecert does not need
//! (`model`, `temperature`, `tools`, ...) are ignored in a call and left out of an answer.

use serde::{Deserialize, Serialize};

/// Where the calls go.
pub(super) const PATH: &str = "/v1/chat/completions";

/// A call: the conversation so far, and whether to stream the answer.
#[derive(Debug, Deserialize)]
pub(super) struct Request {
    messages: Vec<Message>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// A message's content: a string, or parts (text, images, ...).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

impl Request {
    /// The input the call asks about: the last `user` message's text (its text parts joined
    /// without a separator, other parts left out). Earlier turns are context a worker
    /// resends, not the request.
    pub(super) fn input(&self) -> Result<String, String> {
        let last = self
            .messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .ok_or("no message with role \"user\"")?;
        match &last.content {
            Some(Content::Text(text)) => Ok(text.clone()),
            Some(Content::Parts(parts)) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text.as_deref())
                    .collect();
                if texts.is_empty() {
                    Err("the last \"user\" message has no text part".to_owned())
                } else {
                    Ok(texts.concat())
                }
            }
            None => Err("the last \"user\" message has no content".to_owned()),
        }
    }

    /// How the call asked to be answered.
    pub(super) fn reply(&self) -> super::Reply {
        if self.stream == Some(true) {
            super::Reply::EventStream {
                usage: self
                    .stream_options
                    .as_ref()
                    .is_some_and(|o| o.include_usage),
            }
        } else {
            super::Reply::Json
        }
    }
}

/// One answer, from which both shapes are made.
pub(super) struct Answer<'a> {
    /// Named by the answer (so the same call gets the same id).
    id: String,
    created: u64,
    /// The version (as `openai-completions` answers name it).
    model: &'a str,
    output: &'a str,
    usage: Usage,
}

/// A whole answer (`chat.completion`).
#[derive(Serialize)]
pub(super) struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: Said<'a>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Said<'a> {
    role: &'static str,
    content: &'a str,
}

/// Counted in words, not tokens: no client checks them against its own tokenizer.
#[derive(Debug, Clone, Copy, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

/// One event of a streamed answer (`chat.completion.chunk`).
#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    /// Absent unless the call asked for usage; then `null` on every chunk but the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    finish_reason: Option<&'static str>,
}

#[derive(Default, Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl<'a> Answer<'a> {
    pub(super) fn new(input: &str, output: &'a str, version: &'a str) -> Answer<'a> {
        let words = |text: &str| text.split_whitespace().count();
        let (prompt, completion) = (words(input), words(output));
        Answer {
            id: format!(
                "chatcmpl-{}",
                &crate::contract::sha256_hex(&format!("{version}|{input}"))[..24]
            ),
            // As OpenAI stamps it; nothing racecert judges reads it.
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: version,
            output,
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: prompt + completion,
            },
        }
    }

    pub(super) fn completion(&self) -> Completion<'_> {
        Completion {
            id: &self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices: [Choice {
                index: 0,
                message: Said {
                    role: "assistant",
                    content: self.output,
                },
                finish_reason: "stop",
            }],
            usage: self.usage,
        }
    }

    /// The `text/event-stream` body OpenAI sends: the role, the output in one content chunk
    /// (the version it names stays in one piece on the wire), the finish reason, the usage
    /// when asked for, then `data: [DONE]`.
    pub(super) fn event_stream(&self, with_usage: bool) -> String {
        let chunk = |choices: Vec<ChunkChoice<'_>>, usage: Option<Usage>| {
            let chunk = Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model,
                choices,
                usage: with_usage.then_some(usage),
            };
            let json = serde_json::to_string(&chunk).expect("a chunk serialises");
            format!("data: {json}\n\n")
        };
        let choice = |delta: Delta<'a>, finish_reason: Option<&'static str>| {
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason,
            }]
        };
        let mut body = chunk(
            choice(
                Delta {
                    role: Some("assistant"),
                    content: Some(""),
                },
                None,
            ),
            None,
        );
        body += &chunk(
            choice(
                Delta {
                    role: None,
                    content: Some(self.output),
                },
                None,
            ),
            None,
        );
        body += &chunk(choice(Delta::default(), Some("stop")), None);
        if with_usage {
            body += &chunk(Vec::new(), Some(self.usage));
        }
        body + "data: [DONE]\n\n"
    }
}
