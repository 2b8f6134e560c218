//! The prefixes orchestrators put before each line when they merge several containers' output,
//! which name the worker when the line does not:
//! - `kubectl logs --prefix`: `[pod/NAME/CONTAINER] LINE`;
//! - `stern`'s default template `{{.PodName}} {{.ContainerName}} {{.Message}}`: `POD CONTAINER LINE`
//!   (colours stripped; told from a line's own words by Kubernetes' naming: the pod name is a
//!   DNS label with a `-` and a digit, as a Deployment's or StatefulSet's pods are named);
//! - `docker compose logs`: `SERVICE-1  | LINE`;
//! - and, behind any of them or alone, the RFC 3339 timestamp that `kubectl logs --timestamps`
//!   and `docker logs --timestamps` add before a JSON record.

use regex::Regex;
use std::borrow::Cow;
use std::sync::LazyLock;

static COMPOSE_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([A-Za-z0-9][\w.@-]*)\s+\|\s?(.*)$").expect("valid regex"));
static ANSI: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\x1b\[[0-9;]*[A-Za-z]").expect("valid regex"));

/// Which prefix a line had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prefix {
    Kubectl,
    Stern,
    Compose,
}

impl Prefix {
    pub(super) fn shape(self) -> &'static str {
        match self {
            Prefix::Kubectl => "kubectl logs --prefix",
            Prefix::Stern => "stern",
            Prefix::Compose => "docker compose logs",
        }
    }
}

/// A line's prefix: the worker it names (the pod, or the compose service) and which prefix.
pub(super) struct Source<'a> {
    pub name: &'a str,
    pub prefix: Prefix,
}

/// Terminal colours out (stern colours its prefixes; a log piped from a terminal keeps them).
pub(super) fn strip_colours(text: &str) -> Cow<'_, str> {
    if text.contains('\x1b') {
        ANSI.replace_all(text, "")
    } else {
        Cow::Borrowed(text)
    }
}

/// Splits an orchestrator's prefix off a line.
pub(super) fn split_source(text: &str) -> (Option<Source<'_>>, &str) {
    if let Some((name, rest)) = kubectl(text) {
        let source = Source {
            name,
            prefix: Prefix::Kubectl,
        };
        return (Some(source), rest);
    }
    if text.contains('|')
        && let Some(captures) = COMPOSE_PREFIX.captures(text)
        && let (Some(name), Some(rest)) = (captures.get(1), captures.get(2))
    {
        let source = Source {
            name: name.as_str(),
            prefix: Prefix::Compose,
        };
        return (Some(source), rest.as_str());
    }
    if let Some((pod, rest)) = stern(text)
        && starts_a_record(rest)
    {
        let source = Source {
            name: pod,
            prefix: Prefix::Stern,
        };
        return (Some(source), rest);
    }
    (None, text)
}

/// `[pod/NAME/CONTAINER] LINE` (one optional whitespace after the bracket): the pod and the
/// line. Split by hand, not by a regex with captures: every line of a kubectl export goes
/// through here, and the grammar is two separators.
fn kubectl(text: &str) -> Option<(&str, &str)> {
    let inside = text.strip_prefix("[pod/")?;
    let (bracket, rest) = inside.split_once(']')?;
    let (name, container) = bracket.split_once('/')?;
    let clean = |part: &str| !part.contains(char::is_whitespace);
    if name.is_empty() || !clean(name) || !clean(container) {
        return None;
    }
    let rest = match rest.chars().next() {
        Some(c) if c.is_whitespace() => &rest[c.len_utf8()..],
        _ => rest,
    };
    Some((name, rest))
}

/// stern's `POD CONTAINER LINE`, the pod a Kubernetes pod name and the container a DNS label:
/// the pod and the line.
fn stern(text: &str) -> Option<(&str, &str)> {
    let (pod, rest) = text.split_once(' ')?;
    let (container, rest) = rest.split_once(' ')?;
    let label = |part: &str, dots: bool| {
        part.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && part.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
            })
    };
    (is_pod_name(pod) && label(pod, true) && label(container, false)).then_some((pod, rest))
}

/// A Kubernetes pod name as controllers make them: a DNS label with a `-` and a digit
/// (`worker-7d9f8c6b5-x2k4q`, `worker-0`), so a line's own first words (`job received`) are not
/// taken for a pod and a container.
fn is_pod_name(name: &str) -> bool {
    name.len() <= 253
        && name.contains('-')
        && name.bytes().any(|b| b.is_ascii_digit())
        && !name.starts_with(|c: char| c.is_ascii_digit() && name.as_bytes().get(4) == Some(&b'-'))
}

/// Whether what follows a stern prefix is a record: a JSON object, a Celery bracket, a
/// timestamp, or a logfmt pair.
fn starts_a_record(rest: &str) -> bool {
    let bytes = rest.as_bytes();
    match bytes.first() {
        Some(b'{') => true,
        Some(b'[') => bytes.get(1).is_some_and(u8::is_ascii_digit),
        Some(b) if b.is_ascii_digit() => true,
        Some(b) if b.is_ascii_alphabetic() => rest
            .split_whitespace()
            .next()
            .and_then(|word| word.split_once('='))
            .is_some_and(|(key, _)| {
                !key.is_empty()
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            }),
        _ => false,
    }
}

/// A leading RFC 3339 timestamp before a JSON record (`--timestamps`, or a log viewer's download
/// of `TIMESTAMP<tab>LINE`): the timestamp and the record.
pub(super) fn split_timestamp(body: &str) -> Option<(&str, &str)> {
    let (first, rest) = body.split_once([' ', '\t'])?;
    let rest = rest.trim_start();
    if rest.starts_with('{')
        && first.len() >= 20
        && first.as_bytes()[4] == b'-'
        && first.as_bytes()[10] == b'T'
        && super::fields::read_timestamp(first).is_some()
    {
        Some((first, rest))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> (Option<(&str, Prefix)>, &str) {
        let (source, rest) = split_source(text);
        (source.map(|s| (s.name, s.prefix)), rest)
    }

    #[test]
    fn kubectl_prefixes_name_the_pod() {
        let pod = "infer-v1-7c9d8f6b5-kq2xz";
        assert_eq!(
            split("[pod/infer-v1-7c9d8f6b5-kq2xz/worker] {\"a\":1}"),
            (Some((pod, Prefix::Kubectl)), "{\"a\":1}")
        );
        assert_eq!(
            split("[pod/infer-v1-7c9d8f6b5-kq2xz/worker]{}"),
            (Some((pod, Prefix::Kubectl)), "{}")
        );
        // Not a prefix: no container separator, whitespace inside, an empty pod.
        for text in [
            "[pod/worker] x",
            "[pod/a b/c] x",
            "[pod//c] x",
            "[pod/a/c x",
        ] {
            assert_eq!(split(text), (None, text), "{text}");
        }
    }

    #[test]
    fn stern_prefixes_need_a_pod_name_and_a_record() {
        assert_eq!(
            split("worker-7d9f8c6b5-x2k4q worker {\"a\":1}"),
            (Some(("worker-7d9f8c6b5-x2k4q", Prefix::Stern)), "{\"a\":1}")
        );
        assert_eq!(
            split("worker-0 app request_id=r-1 status=job_received"),
            (
                Some(("worker-0", Prefix::Stern)),
                "request_id=r-1 status=job_received"
            )
        );
        // A line's own words are no pod and container; an upper-case container is no label.
        for text in [
            "job received for request r-1",
            "worker-0 App {\"a\":1}",
            "2026-06-26 10:15:21 INFO started",
            "worker-0 app free text",
        ] {
            assert_eq!(split(text), (None, text), "{text}");
        }
    }
}
