//! One line per round trip, for timelines and sequence diagrams: the command or statement in
//! short, the reply in short (`SET …:lock:k tok NX PX 60000 -> OK`, `UPDATE inference_jobs ->
//! UPDATE 1`, `POST /v1/infer -> 200`).

use super::{PgRequest, RedisReply, Reply, Request, RoundTrip};

/// Longest argument shown.
const ARG: usize = 40;

fn clip(text: &str, namespace: Option<&str>) -> String {
    let text = match namespace {
        Some(ns) if !ns.is_empty() => text.replace(ns, "…"),
        _ => text.to_owned(),
    };
    if text.chars().count() > ARG {
        let cut: String = text.chars().take(ARG - 1).collect();
        format!("{cut}…")
    } else {
        text
    }
}

fn redis_reply(reply: &RedisReply) -> String {
    match reply {
        RedisReply::Status(s) => s.clone(),
        RedisReply::Error(e) => format!("ERR {}", clip(e, None)),
        RedisReply::Int(n) => n.to_string(),
        RedisReply::Nil => "nil".into(),
        RedisReply::Bulk { text, .. } => format!("\"{}\"", clip(text, None)),
        RedisReply::Array { len, .. } => format!("[{len}]"),
        RedisReply::Map { len, .. } => format!("{{{len}}}"),
        RedisReply::Double(d) | RedisReply::BigNumber(d) => d.clone(),
        RedisReply::Bool(b) => b.to_string(),
    }
}

impl RoundTrip {
    /// The round trip in one line; `namespace` (a case's key prefix) is shown as `…`.
    pub fn describe(&self, namespace: Option<&str>) -> String {
        let request = match &self.request {
            Request::Redis(command) => {
                let mut out = command.name.clone();
                for arg in command.args.iter().take(6) {
                    out.push(' ');
                    out.push_str(&clip(arg, namespace));
                }
                if command.argc > 6 {
                    out.push_str(" …");
                }
                out
            }
            Request::Postgres(PgRequest::Startup(startup)) => format!(
                "startup {}@{}",
                startup.user.as_deref().unwrap_or("-"),
                startup.database.as_deref().unwrap_or("-")
            ),
            Request::Postgres(PgRequest::Cancel) => "cancel".into(),
            Request::Postgres(PgRequest::Batch(batch)) => {
                let parts: Vec<String> = batch
                    .statements
                    .iter()
                    .map(|s| {
                        if s.tables.is_empty() {
                            s.verb.clone()
                        } else {
                            format!("{} {}", s.verb, s.tables.join(","))
                        }
                    })
                    .collect();
                if parts.is_empty() {
                    "sync".into()
                } else {
                    parts.join("; ")
                }
            }
            Request::Http(http) => format!("{} {}", http.method, http.path),
        };
        let reply = match &self.reply {
            None => "(no reply)".to_owned(),
            Some(Reply::Redis(reply)) => redis_reply(reply),
            Some(Reply::Postgres(pg)) => match &pg.error {
                Some(error) => format!("ERROR {}", error.code),
                None => {
                    let tags = pg.tags.join("; ");
                    if tags.is_empty() { "ok".into() } else { tags }
                }
            },
            Some(Reply::Http(http)) => http.status.to_string(),
        };
        format!("{request} -> {reply}")
    }
}

impl RoundTrip {
    /// Whether the round trip changes nothing and decides nothing a checker or a schedule cares
    /// about: connection set-up (a PostgreSQL startup, `HELLO`, `AUTH`, `SELECT`, `CLIENT ...`),
    /// a pool's health check (`PING`, a lone `Sync`), a statement prepared but not executed, a
    /// script loaded or missing from the script cache (`SCRIPT LOAD`, a `NOSCRIPT` answer, after
    /// which the client sends the script itself). Which of these a run sends depends on what its
    /// connections already did, not on the schedule.
    pub fn is_effectless(&self) -> bool {
        let noscript = matches!(&self.reply,
            Some(Reply::Redis(RedisReply::Error(e))) if e.starts_with("NOSCRIPT"));
        noscript || self.request.is_effectless()
    }

    /// Whether the round trip acts on something one of `names` names (a request's id or input):
    /// an executed statement whose SQL or parameters hold it, an HTTP call whose body or path
    /// does, a Redis command whose arguments do.
    pub fn names_any(&self, names: &[&str]) -> bool {
        let named = |text: &str| names.iter().any(|n| text.contains(n));
        match &self.request {
            Request::Postgres(PgRequest::Batch(batch)) => batch.statements.iter().any(|s| {
                s.executed && (named(&s.sql) || s.params.iter().flatten().any(|p| named(p)))
            }),
            Request::Http(call) => named(&call.body) || named(&call.path),
            Request::Redis(command) => command.args.iter().any(|a| named(a)),
            _ => false,
        }
    }
}

impl Request {
    /// Whether the request changes nothing whatever its reply: connection set-up, health checks,
    /// statements only prepared (what [`RoundTrip::is_effectless`] says before the reply is known,
    /// and what a holder lets pass without holding).
    pub fn is_effectless(&self) -> bool {
        match self {
            Request::Postgres(PgRequest::Startup(_) | PgRequest::Cancel) => true,
            Request::Postgres(PgRequest::Batch(batch)) => {
                batch.statements.iter().all(|s| !s.executed)
            }
            Request::Redis(command) => matches!(
                command.name.as_str(),
                "PING"
                    | "HELLO"
                    | "AUTH"
                    | "SELECT"
                    | "CLIENT"
                    | "SCRIPT"
                    | "COMMAND"
                    | "INFO"
                    | "READONLY"
                    | "ECHO"
            ),
            Request::Http(_) => false,
        }
    }
}
