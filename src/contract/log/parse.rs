//! Reading incident logs: logfmt lines in the seed's shape (`TIMESTAMP LEVEL key=value ...`) and
//! JSON lines, in any field order, with extra fields and unrelated lines mixed in. A line that is
//! neither is counted as malformed with its number; the parser never panics, whatever the bytes.

use super::{Level, LogLine};

/// Lines longer than this are refused (a log line is not a data dump).
pub const MAX_LINE: usize = 64 * 1024;

/// One parsed line and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedLine {
    /// 1-based line number in the input.
    pub line_no: usize,
    /// The line.
    pub line: LogLine,
}

/// A line that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// 1-based line number.
    pub line_no: usize,
    /// Why.
    pub reason: String,
}

/// What a log file held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Lines with at least a status or a request id.
    pub lines: Vec<ParsedLine>,
    /// Lines that could not be read.
    pub malformed: Vec<Malformed>,
    /// Well-formed lines unrelated to inference requests (no request id, job id or status).
    pub unrelated: usize,
    /// Blank lines.
    pub blank: usize,
}

/// Parses a whole log (any bytes).
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let segments: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let last = segments.len().saturating_sub(1);
    for (index, raw) in segments.into_iter().enumerate() {
        let line_no = index + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            // What follows the final newline is not a line.
            if index != last || !raw.is_empty() {
                parsed.blank += 1;
            }
            continue;
        }
        if raw.len() > MAX_LINE {
            parsed.malformed.push(Malformed {
                line_no,
                reason: format!("line of {} bytes exceeds {MAX_LINE}", raw.len()),
            });
            continue;
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            parsed.malformed.push(Malformed {
                line_no,
                reason: "not UTF-8 text".into(),
            });
            continue;
        };
        match parse_line(text) {
            Ok(line) => {
                let relevant = ["request_id", "job_id", "idempotency_key", "status"]
                    .iter()
                    .any(|k| line.get(k).is_some());
                if relevant {
                    parsed.lines.push(ParsedLine { line_no, line });
                } else {
                    parsed.unrelated += 1;
                }
            }
            Err(reason) => parsed.malformed.push(Malformed { line_no, reason }),
        }
    }
    parsed
}

/// Parses one line, JSON or logfmt.
pub fn parse_line(text: &str) -> Result<LogLine, String> {
    let trimmed = text.trim();
    if trimmed.starts_with('{') {
        return parse_json(trimmed);
    }
    parse_logfmt(trimmed)
}

fn level_of(word: &str) -> Option<Level> {
    match word.to_ascii_uppercase().as_str() {
        "INFO" | "DEBUG" | "TRACE" => Some(Level::Info),
        "WARN" | "WARNING" => Some(Level::Warn),
        "ERROR" | "FATAL" | "CRITICAL" => Some(Level::Error),
        _ => None,
    }
}

fn parse_json(text: &str) -> Result<LogLine, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|err| format!("invalid JSON: {err}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| "JSON line is not an object".to_owned())?;
    let mut ts = String::new();
    let mut level = Level::Info;
    let mut fields = Vec::new();
    for (key, value) in object {
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        match key.as_str() {
            "ts" | "time" | "timestamp" | "@timestamp" => ts = text,
            "level" | "severity" | "lvl" => level = level_of(&text).unwrap_or(Level::Info),
            _ => fields.push((key.clone(), text)),
        }
    }
    Ok(LogLine { ts, level, fields })
}

fn parse_logfmt(text: &str) -> Result<LogLine, String> {
    let mut rest = text;
    let mut ts = String::new();
    let mut level = Level::Info;
    // Optional leading timestamp and level, as in the seed's lines.
    let first = next_word(rest);
    if let Some((word, after)) = first
        && !word.contains('=')
    {
        if let Some(l) = level_of(word) {
            level = l;
            rest = after;
        } else {
            ts = word.to_owned();
            rest = after;
            if let Some((word, after)) = next_word(rest)
                && !word.contains('=')
                && let Some(l) = level_of(word)
            {
                level = l;
                rest = after;
            }
        }
    }
    let mut fields = Vec::new();
    let mut message: Vec<String> = Vec::new();
    let mut chars = rest.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        // key
        let mut key_end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key_end = i + c.len_utf8();
            chars.next();
        }
        let key = &rest[start..key_end];
        match chars.peek() {
            Some(&(_, '=')) => {
                chars.next();
            }
            _ => {
                // A bare word: free message text, kept under `msg` (logfmt loggers mix both).
                message.push(key.to_owned());
                continue;
            }
        }
        if key.is_empty() {
            return Err("empty key before '='".into());
        }
        // value
        let value = match chars.peek() {
            Some(&(_, '"')) => {
                chars.next();
                let mut value = String::new();
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some((_, escaped)) => value.push(escaped),
                            None => break,
                        },
                        '"' => {
                            closed = true;
                            break;
                        }
                        other => value.push(other),
                    }
                }
                if !closed {
                    return Err(format!("unterminated quoted value of {key}"));
                }
                value
            }
            _ => {
                let mut value = String::new();
                while let Some(&(_, c)) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
                value
            }
        };
        fields.push((key.to_owned(), value));
    }
    if fields.is_empty() {
        return Err("no key=value fields".into());
    }
    if !message.is_empty() {
        fields.push(("msg".to_owned(), message.join(" ")));
    }
    Ok(LogLine { ts, level, fields })
}

fn next_word(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((&text[..end], &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_seed_shape_json_and_shuffled_fields() {
        let line = parse_line("2026-06-26T10:15:24.031Z WARN request_id=req-91 attempt=1 status=timeout_waiting_upstream").unwrap();
        assert_eq!(line.ts, "2026-06-26T10:15:24.031Z");
        assert_eq!(line.level, Level::Warn);
        assert_eq!(line.get("status"), Some("timeout_waiting_upstream"));
        let shuffled =
            parse_line("status=cache_miss note=\"two words \\\"quoted\\\"\" request_id=req-9")
                .unwrap();
        assert_eq!(shuffled.get("request_id"), Some("req-9"));
        assert_eq!(shuffled.get("note"), Some("two words \"quoted\""));
        let json = parse_line(
            r#"{"level":"info","ts":"t","request_id":"r","attempt":2,"status":"late_success"}"#,
        )
        .unwrap();
        assert_eq!(json.get("attempt"), Some("2"));
        assert!(parse_line("just some words").is_err());
        assert!(parse_line("key=\"unterminated").is_err());
    }

    #[test]
    fn garbage_is_counted_with_line_numbers() {
        let mut input = b"2026 INFO request_id=r status=cache_miss\n\xff\xfe\x00binary\n".to_vec();
        input.extend(vec![b'a'; MAX_LINE + 1]);
        input.extend(b"\nno fields here\nservice started port=80\n");
        let parsed = parse(&input);
        assert_eq!(parsed.lines.len(), 1);
        assert_eq!(parsed.unrelated, 1);
        let numbers: Vec<usize> = parsed.malformed.iter().map(|m| m.line_no).collect();
        assert_eq!(numbers, vec![2, 3, 4]);
        assert_eq!(parse(b""), Parsed::default());
        assert_eq!(parse(b"\n\n").blank, 2);
    }

    proptest! {
        #[test]
        fn never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let parsed = parse(&bytes);
            prop_assert!(parsed.lines.len() + parsed.malformed.len() + parsed.unrelated <= bytes.len() + 1);
        }

        #[test]
        fn round_trips_what_racecert_writes(
            fields in proptest::collection::vec(("[a-z_]{1,12}", "[ -~]{0,20}"), 1..8)
        ) {
            let line = LogLine { ts: "2026-01-01T00:00:00.000Z".into(), level: Level::Info, fields };
            prop_assert_eq!(parse_line(&line.to_logfmt()).unwrap(), line.clone());
            let json = parse_line(&line.to_json()).unwrap();
            for (key, _) in &line.fields {
                if ["ts", "time", "timestamp", "level", "severity", "lvl"].contains(&key.as_str()) {
                    continue;
                }
                // A JSON object keeps the last of duplicate keys.
                let last = line.fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
                prop_assert_eq!(json.get(key), last);
            }
        }
    }
}
