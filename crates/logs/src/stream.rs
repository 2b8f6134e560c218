//! Lines from any reader, one at a time in a buffer of bounded size: a log of any length is read
//! in constant memory, and a line longer than [`super::MAX_LINE`] is measured and skipped
//! without being held (a 1 GB file with no newline costs one buffer, not a gigabyte).

use super::document::Position;
use super::{MAX_DOCUMENT, MAX_LINE};
use std::io::{BufRead, ErrorKind, Read};
use std::rc::Rc;

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

/// The input from the current line on, as bytes for a reader of whole documents: it moves the
/// shared [`Position`] byte by byte, keeps the physical line being read (so that, if the
/// document breaks, that line can be read on its own), and stops with [`TooBig`] once one value
/// held whole passes [`MAX_DOCUMENT`].
pub(super) struct Rest<'a, R> {
    lines: &'a mut Lines<R>,
    /// The current line and its newline, given first.
    replay: Vec<u8>,
    given: usize,
    pub at: Rc<Position>,
    /// The bytes of the physical line being read, up to [`MAX_LINE`].
    pub current: Vec<u8>,
}

/// The error [`Rest`] stops with when one value held whole grows past [`MAX_DOCUMENT`].
#[derive(Debug)]
pub(super) struct TooBig;

impl std::fmt::Display for TooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a JSON value over {} MB held whole", MAX_DOCUMENT >> 20)
    }
}

impl std::error::Error for TooBig {}

impl<'a, R: BufRead> Rest<'a, R> {
    pub(super) fn new(lines: &'a mut Lines<R>) -> Rest<'a, R> {
        let mut replay = std::mem::take(&mut lines.line);
        replay.push(b'\n');
        let at = Rc::new(Position::default());
        at.line.set(lines.number);
        Rest {
            lines,
            replay,
            given: 0,
            at,
            current: Vec::new(),
        }
    }

    /// Back to reading lines: the line the document broke on, whole, in [`Lines::line`] (or
    /// [`Next::End`] when the input ended). Lines read since stay counted.
    pub(super) fn resume(self) -> std::io::Result<Next> {
        let Rest {
            lines,
            replay,
            given,
            at,
            mut current,
        } = self;
        if given < replay.len() {
            // Broken on the first line: the rest of it was never given out.
            current.extend_from_slice(&replay[given..replay.len() - 1]);
            lines.number = at.line.get();
            lines.line = current;
            return Ok(Next::Line);
        }
        lines.number = at.line.get() - 1;
        let next = lines.next_line()?;
        if let Next::Line = next {
            current.extend_from_slice(&lines.line);
            lines.line = current;
        } else if !current.is_empty() {
            lines.line = current;
            return Ok(Next::Line);
        }
        Ok(next)
    }

    /// Lines read, once the document has ended.
    pub(super) fn finish(self) {
        let line = self.at.line.get();
        self.lines.number = if self.current.is_empty() {
            line - 1
        } else {
            line
        };
    }

    fn given(&mut self, byte: u8) -> std::io::Result<()> {
        if byte == b'\n' {
            self.at.line.set(self.at.line.get() + 1);
            self.current.clear();
        } else if self.current.len() <= MAX_LINE {
            self.current.push(byte);
        }
        let held = self.at.held.get() + 1;
        self.at.held.set(held);
        if held > MAX_DOCUMENT as u64 {
            return Err(std::io::Error::other(TooBig));
        }
        Ok(())
    }
}

impl<R: BufRead> Read for Rest<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // serde_json reads one byte at a time: one is given per call, so the position is exact
        // when a visitor reads it.
        let byte = if self.given < self.replay.len() {
            self.given += 1;
            self.replay[self.given - 1]
        } else {
            let available = loop {
                match self.lines.reader.fill_buf() {
                    Ok(available) => break available,
                    Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                    Err(err) => return Err(err),
                }
            };
            let Some(&byte) = available.first() else {
                return Ok(0);
            };
            self.lines.reader.consume(1);
            self.lines.bytes += 1;
            byte
        };
        self.given(byte)?;
        buf[0] = byte;
        Ok(1)
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
