//! How bytes from the wire become short, printable text in round trips.

/// `bytes` as text of at most about `limit` bytes: UTF-8 as is when it is UTF-8 (a character cut
/// at the limit is dropped), otherwise `0x` and hex of the first `limit / 2` bytes; `…` marks a cut.
pub fn text(bytes: &[u8], limit: usize) -> String {
    let head = &bytes[..bytes.len().min(limit)];
    let cut = head.len() < bytes.len();
    let utf8 = match std::str::from_utf8(head) {
        Ok(s) => Some(s),
        // Only a character split by the cut may be invalid.
        Err(err) if cut && err.error_len().is_none() => {
            Some(std::str::from_utf8(&head[..err.valid_up_to()]).unwrap_or_default())
        }
        Err(_) => None,
    };
    match utf8 {
        Some(s) if cut => format!("{s}…"),
        Some(s) => s.to_owned(),
        None => {
            let n = bytes.len().min(limit / 2);
            let mut out = format!("0x{}", hex::encode(&bytes[..n]));
            if n < bytes.len() {
                out.push('…');
            }
            out
        }
    }
}

/// `s` with every run of whitespace replaced by one space, trimmed, cut at about `limit` bytes.
pub(crate) fn collapse(s: &str, limit: usize) -> String {
    let mut out = String::with_capacity(s.len().min(limit + 4));
    for word in s.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        if out.len() > limit {
            let mut end = limit;
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            out.push('…');
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_kept_and_cut_on_a_character_boundary() {
        assert_eq!(text(b"hello", 10), "hello");
        assert_eq!(text(b"hello world", 5), "hello…");
        assert_eq!(text("héllo".as_bytes(), 2), "h…");
    }

    #[test]
    fn binary_becomes_hex() {
        assert_eq!(text(&[0xff, 0x00, 0x01], 10), "0xff0001");
        assert_eq!(text(&[0xff; 10], 4), "0xffff…");
    }

    #[test]
    fn whitespace_collapses() {
        assert_eq!(collapse("  SELECT *\n\tFROM   t  ", 100), "SELECT * FROM t");
        assert_eq!(collapse("SELECT aaaa", 8), "SELECT a…");
    }
}
