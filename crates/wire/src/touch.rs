//! What a round trip touches, read back from its [`Fingerprint`](crate::Fingerprint) text: the
//! keys or tables, and whether it writes them. The schedule search's partial-order reduction
//! stops a worker only before round trips that touch something a job writes, so this errs on
//! the side of a write: a Redis command not known to only read counts as a write, and so does
//! any SQL statement but a plain `SELECT`.

use crate::commands::{REDIS_POLLS, redis_reads_only};

/// One thing a round trip touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    /// A Redis key, a table, or a pseudo-resource (`redis EXEC`, `postgres COMMIT`) for the
    /// moment a transaction's effects land, which conflicts with everything.
    pub resource: String,
    /// Whether the round trip may change it.
    pub write: bool,
}

/// What the round trip whose fingerprint text is `print` touches (nothing for set-up, queue
/// polls, HTTP calls and statements on no table).
pub fn touches(print: &str) -> Vec<Touch> {
    if let Some(rest) = print.strip_prefix("redis ") {
        return redis(rest);
    }
    if let Some(rest) = print.strip_prefix("postgres [") {
        return postgres(rest);
    }
    Vec::new()
}

fn redis(rest: &str) -> Vec<Touch> {
    let mut words = rest.split_whitespace();
    let Some(name) = words.next() else {
        return Vec::new();
    };
    if name == "EXEC" {
        return vec![Touch {
            resource: "redis EXEC".to_owned(),
            write: true,
        }];
    }
    if REDIS_POLLS.contains(&name) {
        return Vec::new();
    }
    let write = !redis_reads_only(name);
    words
        .filter(|word| *word != "(queued)")
        .map(|key| Touch {
            resource: key.to_owned(),
            write,
        })
        .collect()
}

/// `rest`: the statements of a batch after the first `[`, each `VERB[ (prepare)] tables | sql`,
/// joined by `] [`. SQL that itself holds `] [` splits wrongly; what it may add is a resource
/// that nothing else names, never a missed write of a table that was named.
fn postgres(rest: &str) -> Vec<Touch> {
    let mut out = Vec::new();
    for statement in rest.strip_suffix(']').unwrap_or(rest).split("] [") {
        let (head, sql) = statement.split_once(" | ").unwrap_or((statement, ""));
        // Prepared, not executed: it changes nothing yet.
        if head.contains("(prepare)") {
            continue;
        }
        let mut words = head.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let tables: Vec<&str> = words
            .flat_map(|w| w.split(','))
            .filter(|t| !t.is_empty())
            .collect();
        if matches!(verb, "COMMIT" | "END") {
            out.push(Touch {
                resource: "postgres COMMIT".to_owned(),
                write: true,
            });
            continue;
        }
        let upper = sql.to_ascii_uppercase();
        let write = verb != "SELECT"
            || upper.contains(" FOR UPDATE")
            || upper.contains(" FOR NO KEY UPDATE")
            || upper.contains(" FOR SHARE");
        out.extend(tables.into_iter().map(|table| Touch {
            resource: table.to_owned(),
            write,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(print: &str) -> Vec<(String, bool)> {
        touches(print)
            .into_iter()
            .map(|t| (t.resource, t.write))
            .collect()
    }

    #[test]
    fn redis_commands_not_known_to_read_only_are_writes() {
        assert_eq!(of("redis GET {ns}lock"), vec![("{ns}lock".into(), false)]);
        for write in [
            "SET", "HSET", "INCR", "LPUSH", "ZADD", "EVALSHA", "PEXPIRE", "NEWCMD",
        ] {
            assert_eq!(
                of(&format!("redis {write} k")),
                vec![("k".into(), true)],
                "{write}"
            );
        }
        assert_eq!(
            of("redis SET a (queued)"),
            vec![("a".into(), true)],
            "a queued command touches its key"
        );
        assert_eq!(of("redis EXEC"), vec![("redis EXEC".into(), true)]);
        assert!(of("redis XREADGROUP {ns}jobs").is_empty());
        assert!(of("redis BRPOP celery").is_empty());
        assert!(of("redis PING").is_empty());
    }

    #[test]
    fn statements_of_a_batch_each_touch_their_tables() {
        assert_eq!(
            of("postgres [SELECT jobs | SELECT status FROM jobs WHERE k = $1]"),
            vec![("jobs".into(), false)]
        );
        assert_eq!(
            of("postgres [SELECT jobs | SELECT * FROM jobs WHERE k = $1 FOR UPDATE]"),
            vec![("jobs".into(), true)]
        );
        assert_eq!(
            of(
                "postgres [BEGIN  | BEGIN] [UPDATE jobs,epochs | UPDATE jobs SET s = $1] [COMMIT  | COMMIT]"
            ),
            vec![
                ("jobs".into(), true),
                ("epochs".into(), true),
                ("postgres COMMIT".into(), true)
            ]
        );
        assert!(of("postgres [UPDATE (prepare) jobs | UPDATE jobs SET s = $1]").is_empty());
        assert!(of("postgres sync").is_empty());
        assert!(of("postgres startup u@d").is_empty());
        assert!(of("http POST /v1/infer").is_empty());
    }
}
