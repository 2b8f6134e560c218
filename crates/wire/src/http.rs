//! HTTP/1.1 framing (the model backends are reached through the proxy): request and response
//! heads by `httparse`, bodies by Content-Length or chunked coding (or until close for a
//! response that has neither), keep-alive and pipelining (replies in request order).

use super::conn::{Ev, Framer};
use super::text::text;
use super::{HttpRequest, HttpResponse, MAX_BODY, MAX_ITEMS, MAX_VALUE, Reply, Request};
use std::collections::VecDeque;

/// A head larger than this is not HTTP a model backend exchanges.
const HEAD_MAX: usize = 64 * 1024;
/// Headers parsed per head.
const HEADERS: usize = 64;
/// A chunk-size or trailer line longer than this is garbage.
const CHUNK_LINE_MAX: usize = 4096;

/// Headers never recorded.
fn secret(name: &str) -> bool {
    matches!(
        name,
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie" | "x-api-key"
    )
}

fn headers(raw: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    raw.iter()
        .map(|h| h.name.to_ascii_lowercase())
        .zip(raw.iter())
        .filter(|(name, _)| !secret(name))
        .take(MAX_ITEMS)
        .map(|(name, h)| (name, text(h.value, MAX_VALUE)))
        .collect()
}

#[derive(Debug)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// How a message's body is delimited, from its headers.
fn framing(raw: &[httparse::Header<'_>]) -> Result<Option<Framing>, String> {
    let mut length = None;
    for h in raw {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            if value.split(',').any(|v| v.trim() == "chunked") {
                return Ok(Some(Framing::Chunked));
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or("a bad Content-Length")?;
            length = Some(value);
        }
    }
    Ok(length.map(Framing::Length))
}

#[derive(Debug)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd(u8),
    Trailer,
}

/// Reads one body, keeping its first [`MAX_BODY`] bytes.
#[derive(Debug)]
struct Body {
    framing: Framing,
    chunk: Chunk,
    line: Vec<u8>,
    kept: Vec<u8>,
    total: u64,
}

impl Body {
    fn new(framing: Framing) -> Body {
        Body {
            framing,
            chunk: Chunk::Size,
            line: Vec::new(),
            kept: Vec::new(),
            total: 0,
        }
    }

    fn keep(&mut self, data: &[u8]) {
        let room = MAX_BODY.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
        self.total += data.len() as u64;
    }

    fn text(&self) -> String {
        let mut s = text(&self.kept, MAX_BODY);
        if self.total > self.kept.len() as u64 && !s.ends_with('…') {
            s.push('…');
        }
        s
    }

    /// Consumes body bytes; returns how many, and whether the body ended.
    fn feed(&mut self, data: &[u8]) -> Result<(usize, bool), String> {
        match &mut self.framing {
            Framing::None => Ok((0, true)),
            Framing::UntilClose => {
                self.keep(data);
                Ok((data.len(), false))
            }
            Framing::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                *left -= n as u64;
                let done = *left == 0;
                self.keep(&data[..n]);
                Ok((n, done))
            }
            Framing::Chunked => {
                let mut i = 0;
                while i < data.len() {
                    match &mut self.chunk {
                        Chunk::Size | Chunk::Trailer => {
                            let rest = &data[i..];
                            let Some(p) = rest.iter().position(|b| *b == b'\n') else {
                                self.line.extend_from_slice(rest);
                                if self.line.len() > CHUNK_LINE_MAX {
                                    return Err("a chunk line too long".into());
                                }
                                return Ok((data.len(), false));
                            };
                            self.line.extend_from_slice(&rest[..=p]);
                            i += p + 1;
                            let line = std::mem::take(&mut self.line);
                            if matches!(self.chunk, Chunk::Trailer) {
                                if line == b"\r\n" || line == b"\n" {
                                    return Ok((i, true));
                                }
                                continue;
                            }
                            match httparse::parse_chunk_size(&line) {
                                Ok(httparse::Status::Complete((_, 0))) => {
                                    self.chunk = Chunk::Trailer
                                }
                                Ok(httparse::Status::Complete((_, size))) => {
                                    self.chunk = Chunk::Data(size)
                                }
                                _ => return Err("a bad chunk size".into()),
                            }
                        }
                        Chunk::Data(left) => {
                            let n = usize::try_from(*left)
                                .unwrap_or(usize::MAX)
                                .min(data.len() - i);
                            *left -= n as u64;
                            let end = *left == 0;
                            let bytes = &data[i..i + n];
                            i += n;
                            if end {
                                self.chunk = Chunk::DataEnd(0);
                            }
                            self.keep(bytes);
                        }
                        Chunk::DataEnd(seen) => {
                            let expect = if *seen == 0 { b'\r' } else { b'\n' };
                            if data[i] != expect {
                                return Err("a chunk not ended by CRLF".into());
                            }
                            i += 1;
                            *seen += 1;
                            if *seen == 2 {
                                self.chunk = Chunk::Size;
                            }
                        }
                    }
                }
                Ok((i, false))
            }
        }
    }
}

#[derive(Debug, Default)]
enum Side {
    /// Between messages.
    #[default]
    Idle,
    /// Reading a head (buffered here).
    Head(Vec<u8>),
    /// Reading a body.
    Body(Body),
}

/// Frames one HTTP/1.1 connection.
#[derive(Debug, Default)]
pub(crate) struct HttpFramer {
    client: Side,
    server: Side,
    /// The request being read (its body not yet complete).
    request: Option<HttpRequest>,
    /// The response being read.
    response: Option<HttpResponse>,
    /// Methods of requests not yet answered, oldest first.
    methods: VecDeque<String>,
}

enum Head<T> {
    Partial,
    Complete(T, usize, Framing),
}

fn request_head(buf: &[u8]) -> Result<Head<HttpRequest>, String> {
    let mut raw = [httparse::EMPTY_HEADER; HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(Head::Partial),
        Ok(httparse::Status::Complete(n)) => {
            let method = req.method.unwrap_or_default().to_owned();
            if method.eq_ignore_ascii_case("CONNECT")
                || req
                    .headers
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case("upgrade"))
            {
                return Err("an upgrade or CONNECT: no longer HTTP".into());
            }
            let framing = framing(req.headers)?.unwrap_or(Framing::None);
            Ok(Head::Complete(
                HttpRequest {
                    method,
                    path: text(req.path.unwrap_or_default().as_bytes(), MAX_VALUE),
                    headers: headers(req.headers),
                    body: String::new(),
                    body_len: 0,
                },
                n,
                framing,
            ))
        }
        Err(err) => Err(format!("a bad request head: {err}")),
    }
}

fn response_head(buf: &[u8], method: Option<&str>) -> Result<Head<HttpResponse>, String> {
    let mut raw = [httparse::EMPTY_HEADER; HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(Head::Partial),
        Ok(httparse::Status::Complete(n)) => {
            let status = resp.code.unwrap_or_default();
            let bodyless = method == Some("HEAD") || status < 200 || status == 204 || status == 304;
            let framing = if bodyless {
                Framing::None
            } else {
                framing(resp.headers)?.unwrap_or(Framing::UntilClose)
            };
            Ok(Head::Complete(
                HttpResponse {
                    status,
                    headers: headers(resp.headers),
                    body: String::new(),
                    body_len: 0,
                },
                n,
                framing,
            ))
        }
        Err(err) => Err(format!("a bad response head: {err}")),
    }
}

impl HttpFramer {
    fn finish_request(&mut self, body: Option<&Body>, ev: &mut Vec<Ev>) {
        if let Some(mut req) = self.request.take() {
            if let Some(body) = body {
                req.body = body.text();
                req.body_len = body.total;
            }
            ev.push(Ev::Done(Some(Request::Http(req))));
        }
    }

    fn finish_response(&mut self, body: Option<&Body>, ev: &mut Vec<Ev>) {
        if let Some(mut resp) = self.response.take() {
            if let Some(body) = body {
                resp.body = body.text();
                resp.body_len = body.total;
            }
            self.methods.pop_front();
            ev.push(Ev::Reply(Reply::Http(resp)));
        }
    }
}

impl Framer for HttpFramer {
    fn client(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut i = 0;
        while i < data.len() {
            match &mut self.client {
                Side::Idle => {
                    // Empty lines between requests are allowed (RFC 9112, 2.2).
                    while i < data.len() && matches!(data[i], b'\r' | b'\n') {
                        i += 1;
                    }
                    if i < data.len() {
                        ev.push(Ev::Start(i));
                        self.client = Side::Head(Vec::new());
                    }
                }
                Side::Head(buf) => {
                    let before = buf.len();
                    buf.extend_from_slice(&data[i..]);
                    match request_head(buf) {
                        Err(err) => return ev.push(Ev::Opaque(err)),
                        Ok(Head::Partial) => {
                            if buf.len() > HEAD_MAX {
                                return ev.push(Ev::Opaque("a request head over 64 KiB".into()));
                            }
                            return;
                        }
                        Ok(Head::Complete(req, n, framing)) => {
                            i += n - before;
                            self.methods.push_back(req.method.clone());
                            ev.push(Ev::Ready(Request::Http(req.clone())));
                            self.request = Some(req);
                            if matches!(framing, Framing::None) {
                                self.client = Side::Idle;
                                self.finish_request(None, ev);
                            } else {
                                self.client = Side::Body(Body::new(framing));
                            }
                        }
                    }
                }
                Side::Body(body) => match body.feed(&data[i..]) {
                    Err(err) => return ev.push(Ev::Opaque(err)),
                    Ok((n, done)) => {
                        i += n;
                        if done {
                            let Side::Body(body) = std::mem::take(&mut self.client) else {
                                unreachable!("in a body")
                            };
                            self.finish_request(Some(&body), ev);
                        }
                    }
                },
            }
        }
    }

    fn server(&mut self, data: &[u8], ev: &mut Vec<Ev>) {
        let mut i = 0;
        while i < data.len() {
            match &mut self.server {
                Side::Idle => self.server = Side::Head(Vec::new()),
                Side::Head(buf) => {
                    let before = buf.len();
                    buf.extend_from_slice(&data[i..]);
                    let method = self.methods.front().map(String::as_str);
                    match response_head(buf, method) {
                        Err(err) => return ev.push(Ev::Opaque(err)),
                        Ok(Head::Partial) => {
                            if buf.len() > HEAD_MAX {
                                return ev.push(Ev::Opaque("a response head over 64 KiB".into()));
                            }
                            return;
                        }
                        Ok(Head::Complete(resp, n, framing)) => {
                            i += n - before;
                            self.server = Side::Idle;
                            if resp.status == 101 {
                                return ev.push(Ev::Opaque("101 Switching Protocols".into()));
                            }
                            if resp.status < 200 {
                                // An interim response (100 Continue) answers nothing yet.
                                continue;
                            }
                            self.response = Some(resp);
                            if matches!(framing, Framing::None) {
                                self.finish_response(None, ev);
                            } else {
                                self.server = Side::Body(Body::new(framing));
                            }
                        }
                    }
                }
                Side::Body(body) => match body.feed(&data[i..]) {
                    Err(err) => return ev.push(Ev::Opaque(err)),
                    Ok((n, done)) => {
                        i += n;
                        if done {
                            let Side::Body(body) = std::mem::take(&mut self.server) else {
                                unreachable!("in a body")
                            };
                            self.finish_response(Some(&body), ev);
                        }
                    }
                },
            }
        }
    }

    fn closed(&mut self, ev: &mut Vec<Ev>) {
        // A response delimited by the close ends now.
        if let Side::Body(body) = std::mem::take(&mut self.server)
            && matches!(body.framing, Framing::UntilClose)
        {
            self.finish_response(Some(&body), ev);
        }
    }
}
