//! logfmt, as the seed writes it and as Go's and Python's loggers do: a leading timestamp (one
//! word, or Python's date and time) and level, then `key=value` pairs (values quoted with `"` and
//! `\` escapes, or bare); bare words are the message.

use super::fields::{Raw, level_of};

/// A logfmt line: leading timestamp (one word, or Python's date and time) and level, then
/// key=value pairs; bare words are the message.
pub(super) fn logfmt(text: &str) -> Result<Raw, String> {
    let (pairs, bare) = logfmt_fields(text)?;
    if pairs.is_empty() {
        return Err("no key=value fields".into());
    }
    let mut raw = Raw::default();
    let mut bare = bare.into_iter().peekable();
    // Only words before the first pair can be the head; logfmt_fields keeps their order.
    if let Some(first) = bare.peek()
        && first.0 == 0
        && first.1.starts_with(|c: char| c.is_ascii_digit())
    {
        let (_, word) = bare.next().unwrap_or_default();
        raw.ts = Some(word);
        if let Some(next) = bare.peek()
            && next.0 == 1
            && next.1.len() >= 8
            && next.1.as_bytes()[2] == b':'
            && next.1.starts_with(|c: char| c.is_ascii_digit())
            && let Some(ts) = raw.ts.as_mut()
        {
            ts.push(' ');
            ts.push_str(&next.1);
            bare.next();
        }
    }
    if let Some(next) = bare.peek()
        && next.0 <= 2
        && level_of(&next.1).is_some()
    {
        raw.level = bare.next().map(|(_, w)| w);
    }
    let message: Vec<String> = bare.map(|(_, w)| w).collect();
    raw.fields = pairs;
    if !message.is_empty() {
        raw.fields.push(("msg".to_owned(), message.join(" ")));
    }
    Ok(raw)
}

/// key=value pairs (values quoted with `"` and `\` escapes, or bare) and bare words with their
/// position among the tokens.
#[allow(clippy::type_complexity)]
pub(super) fn logfmt_fields(
    text: &str,
) -> Result<(Vec<(String, String)>, Vec<(usize, String)>), String> {
    let mut fields = Vec::new();
    let mut bare = Vec::new();
    let mut token = 0;
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut key_end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key_end = i + c.len_utf8();
            chars.next();
        }
        let key = &text[start..key_end];
        if !matches!(chars.peek(), Some(&(_, '='))) {
            bare.push((token, key.to_owned()));
            token += 1;
            continue;
        }
        chars.next();
        if key.is_empty() {
            return Err("empty key before '='".into());
        }
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
        token += 1;
    }
    Ok((fields, bare))
}
