//! Lines from any reader, one at a time in a buffer of bounded size: a log of any length is read
//! in constant memory, and a line longer than [`super::MAX_LINE`] is measured and skipped
//! without being held (a 1 GB file with no newline costs one buffer, not a gigabyte).

use super::MAX_LINE;
use std::io::{BufRead, ErrorKind};

/// What the next line was.
pub(super) enum Next {
    /// A line, in [`Lines::line`] (without its `\n` or `\r\n`).
    Line,
    /// A line of this many bytes, over the limit: not kept.
    TooLong(usize),
    /// The end of the input.
    End,
}

/// A reader cut into lines.
pub(super) struct Lines<R> {
    reader: R,
    /// The current line's bytes.
    pub line: Vec<u8>,
    /// Its 1-based number.
    pub number: usize,
    /// Bytes read so far.
    pub bytes: u64,
}

impl<R: BufRead> Lines<R> {
    pub(super) fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            line: Vec::with_capacity(1024),
            number: 0,
            bytes: 0,
        }
    }

    /// Reads the next line.
    pub(super) fn next_line(&mut self) -> std::io::Result<Next> {
        self.line.clear();
        let mut length = 0usize;
        let mut any = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if available.is_empty() {
                if !any {
                    return Ok(Next::End);
                }
                break;
            }
            any = true;
            let (chunk, used, done) = match memchr::memchr(b'\n', available) {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            if length <= MAX_LINE {
                let room = MAX_LINE + 1 - length;
                self.line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            length = length.saturating_add(chunk.len());
            self.reader.consume(used);
            self.bytes += used as u64;
            if done {
                break;
            }
        }
        self.number += 1;
        if length > MAX_LINE {
            self.line.clear();
            return Ok(Next::TooLong(length));
        }
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(Next::Line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bytes: &[u8]) -> Vec<Result<String, usize>> {
        let mut lines = Lines::new(std::io::BufReader::with_capacity(7, bytes));
        let mut out = Vec::new();
        loop {
            match lines.next_line().unwrap() {
                Next::Line => out.push(Ok(String::from_utf8_lossy(&lines.line).into_owned())),
                Next::TooLong(n) => out.push(Err(n)),
                Next::End => return out,
            }
        }
    }

    #[test]
    fn lines_are_cut_at_newlines_whatever_the_buffer() {
        assert_eq!(
            all(b"one\r\ntwo words\n\nlast"),
            vec![
                Ok("one".into()),
                Ok("two words".into()),
                Ok(String::new()),
                Ok("last".into())
            ]
        );
        assert!(all(b"").is_empty());
        assert_eq!(all(b"x\n"), vec![Ok("x".into())]);
    }

    #[test]
    fn a_line_over_the_limit_is_measured_not_kept() {
        let mut bytes = vec![b'a'; MAX_LINE + 10];
        bytes.extend_from_slice(b"\nnext\n");
        assert_eq!(all(&bytes), vec![Err(MAX_LINE + 10), Ok("next".into())]);
    }
}
