//! Where a worker's log lines go: kept in memory for the checkers and tests, echoed
//! as logfmt or JSON when asked, and mirrored as `tracing` events with the same fields.

use super::{Level, LogLine, timestamp_now};
use std::sync::{Arc, Mutex};

/// How lines are echoed to stdout (a worker process logs there, as the contract says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Not echoed.
    Off,
    /// logfmt, as in the seed.
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// Called with every line as it is emitted (a recorder keeps them in real order with faults).
pub type Listener = Arc<dyn Fn(&LogLine) + Send + Sync>;

/// A shared, append-only log of lines.
#[derive(Clone)]
pub struct LogSink {
    lines: Arc<Mutex<Vec<LogLine>>>,
    echo: Echo,
    listener: Option<Listener>,
}

impl std::fmt::Debug for LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogSink")
            .field("echo", &self.echo)
            .field("listened", &self.listener.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for LogSink {
    fn default() -> Self {
        LogSink::new(Echo::Off)
    }
}

impl LogSink {
    /// An empty log.
    pub fn new(echo: Echo) -> LogSink {
        LogSink {
            lines: Arc::new(Mutex::new(Vec::new())),
            echo,
            listener: None,
        }
    }

    /// An empty log that also hands every line to `listener` as it is emitted.
    pub fn with_listener(echo: Echo, listener: Listener) -> LogSink {
        LogSink {
            listener: Some(listener),
            ..LogSink::new(echo)
        }
    }

    /// Appends a line stamped now.
    pub fn emit(&self, level: Level, fields: Vec<(String, String)>) {
        let line = LogLine {
            ts: timestamp_now(),
            level,
            fields,
        };
        match self.echo {
            Echo::Off => {}
            Echo::Logfmt => println!("{}", line.to_logfmt()),
            Echo::Json => println!("{}", line.to_json()),
        }
        tracing::debug!(target: "racecert::worker", line = %line.to_logfmt());
        // Under the lines' lock, so listeners see lines in the order the sink keeps them.
        let mut lines = self.lines.lock().expect("poisoned");
        if let Some(listener) = &self.listener {
            listener(&line);
        }
        lines.push(line);
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines.lock().expect("poisoned").clone()
    }

    /// Lines whose `field` equals `value`.
    pub fn matching(&self, field: &str, value: &str) -> Vec<LogLine> {
        self.lines
            .lock()
            .expect("poisoned")
            .iter()
            .filter(|l| l.get(field) == Some(value))
            .cloned()
            .collect()
    }

    /// The status words so far, in order.
    pub fn statuses(&self) -> Vec<String> {
        self.lines
            .lock()
            .expect("poisoned")
            .iter()
            .filter_map(|l| l.status().map(str::to_owned))
            .collect()
    }
}
