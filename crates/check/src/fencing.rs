//! The fencing invariants on a team's own column ([`Fencing`]), from the audit trail: every
//! write's old and new value of the column and the worker whose connection carried it.
//!
//! - `generations-increase`: the fence never goes back. An increasing column never decreases
//!   (a write may keep it: the final write of the attempt that took it); a token, once replaced,
//!   never comes back.
//! - `no-non-owner-final-write`: a final write comes from the holder of the row's fence, the
//!   worker whose write set the value the row held when the final write came (or the final write
//!   sets a new value itself). Attempts are told apart by the worker that made them: two
//!   attempts of one worker share its holdership, so what this misses is a worker overwriting
//!   its own newer attempt.

use super::{Invariant, Violation, by_key};
use racecert_core::contract::fencing::{FenceOrder, Fencing};
use racecert_history::{AuditRow, History};

/// The fence value a row had before and after its write, as text.
fn fence(row: &AuditRow, order: FenceOrder) -> (Option<String>, Option<String>) {
    match order {
        FenceOrder::Increasing => (
            row.old_generation.map(|g| g.to_string()),
            row.new_generation.map(|g| g.to_string()),
        ),
        FenceOrder::Token => (row.old_lease_token.clone(), row.new_lease_token.clone()),
    }
}

/// Whether the row's write set the fence (an insert with a value, or a change of it).
fn sets_fence(row: &AuditRow, order: FenceOrder) -> bool {
    let (old, new) = fence(row, order);
    new.is_some() && (row.operation == "INSERT" || old != new)
}

/// `generations-increase` on a team's column.
pub(super) fn never_back(history: &History, fencing: &Fencing) -> Vec<Violation> {
    let column = &fencing.column;
    let mut violations = Vec::new();
    for (key, rows) in by_key(&history.audit) {
        match fencing.order {
            FenceOrder::Increasing => {
                for pair in rows.windows(2) {
                    let (before, after) = (pair[0], pair[1]);
                    if let (Some(was), Some(now)) = (before.new_generation, after.new_generation)
                        && now < was
                    {
                        violations.push(Violation {
                            invariant: Invariant::GenerationsIncrease,
                            observed: format!("key {key}: {column} went back from {was} to {now}"),
                            evidence: vec![before.describe(), after.describe()],
                        });
                    }
                }
            }
            FenceOrder::Token => {
                let mut held: Vec<(&str, &AuditRow)> = Vec::new();
                for row in rows {
                    let Some(new) = row.new_lease_token.as_deref() else {
                        continue;
                    };
                    if held.last().is_some_and(|(last, _)| *last == new) {
                        continue;
                    }
                    if let Some((_, first)) = held.iter().find(|(value, _)| *value == new) {
                        violations.push(Violation {
                            invariant: Invariant::GenerationsIncrease,
                            observed: format!(
                                "key {key}: {column} went back to {new}, a value it held before another replaced it"
                            ),
                            evidence: vec![first.describe(), row.describe()],
                        });
                    }
                    held.push((new, row));
                }
            }
        }
    }
    violations
}

/// `no-non-owner-final-write` on a team's column.
pub(super) fn final_writes_by_holders(history: &History, fencing: &Fencing) -> Vec<Violation> {
    let column = &fencing.column;
    let mut violations = Vec::new();
    for (key, rows) in by_key(&history.audit) {
        // The write that set the row's current fence, as the rows go.
        let mut taken: Option<&AuditRow> = None;
        for row in rows {
            if sets_fence(row, fencing.order) {
                taken = Some(row);
                if history.is_final(row) {
                    // Took a new fence and finished in one write: its own.
                    continue;
                }
            }
            if !history.is_final(row) {
                continue;
            }
            let Some(take) = taken else { continue };
            let (Some(writer), Some(holder)) = (row.writer.as_deref(), take.writer.as_deref())
            else {
                continue;
            };
            if writer != holder {
                let (value, _) = fence(row, fencing.order);
                violations.push(Violation {
                    invariant: Invariant::NoNonOwnerFinalWrite,
                    observed: format!(
                        "key {key}: final write by {writer} under {column} = {}, which {holder} took (audit#{})",
                        value.as_deref().unwrap_or("-"),
                        take.audit_id
                    ),
                    evidence: vec![take.describe(), row.describe()],
                });
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, op: &str, old: (&str, Option<i64>), new: (&str, i64), by: &str) -> AuditRow {
        AuditRow {
            audit_id: id,
            idempotency_key: "r".into(),
            operation: op.into(),
            old_status: (op == "UPDATE").then(|| old.0.to_owned()),
            new_status: new.0.into(),
            old_generation: old.1,
            new_generation: Some(new.1),
            old_model_version: None,
            new_model_version: None,
            old_lease_token: old.1.map(|g| format!("t{g}")),
            new_lease_token: Some(format!("t{}", new.1)),
            worker_id: None,
            attempt: 0,
            output: None,
            txid: None,
            backend_pid: None,
            recorded_us: None,
            writer: Some(by.into()),
        }
    }

    fn history(audit: Vec<AuditRow>, order: FenceOrder) -> History {
        History {
            audit,
            terminal: vec!["SUCCEEDED".into(), "FAILED".into()],
            fencing: Some(Fencing {
                column: "epoch".into(),
                order,
            }),
            ..History::default()
        }
    }

    /// Inserted by the submitter, taken by worker-a (1), then by worker-b (2).
    fn taken_twice() -> Vec<AuditRow> {
        vec![
            row(1, "INSERT", ("", None), ("PENDING", 0), "submitter"),
            row(
                2,
                "UPDATE",
                ("PENDING", Some(0)),
                ("RUNNING", 1),
                "worker-a",
            ),
            row(
                3,
                "UPDATE",
                ("RUNNING", Some(1)),
                ("RUNNING", 2),
                "worker-b",
            ),
        ]
    }

    #[test]
    fn the_holder_of_the_fence_may_finish_and_an_older_attempt_may_not() {
        for order in [FenceOrder::Increasing, FenceOrder::Token] {
            let mut rows = taken_twice();
            rows.push(row(
                4,
                "UPDATE",
                ("RUNNING", Some(2)),
                ("SUCCEEDED", 2),
                "worker-b",
            ));
            let fine = history(rows.clone(), order);
            assert!(final_writes_by_holders(&fine, fine.fencing.as_ref().unwrap()).is_empty());
            assert!(never_back(&fine, fine.fencing.as_ref().unwrap()).is_empty());
            // worker-a's late write under the fence worker-b took: the late-write bug.
            rows.push(row(
                5,
                "UPDATE",
                ("SUCCEEDED", Some(2)),
                ("SUCCEEDED", 2),
                "worker-a",
            ));
            let late = history(rows, order);
            let found = final_writes_by_holders(&late, late.fencing.as_ref().unwrap());
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0]
                    .observed
                    .contains("final write by worker-a under epoch = ")
                    && found[0].observed.contains("which worker-b took (audit#3)"),
                "{}",
                found[0].observed
            );
        }
    }

    #[test]
    fn a_fence_written_back_is_caught_and_one_kept_is_not() {
        let mut rows = taken_twice();
        // worker-a writes back the epoch it took (its own stale value), as `SET epoch = %s` does.
        rows.push(row(
            4,
            "UPDATE",
            ("RUNNING", Some(2)),
            ("SUCCEEDED", 1),
            "worker-a",
        ));
        for order in [FenceOrder::Increasing, FenceOrder::Token] {
            let back = history(rows.clone(), order);
            let found = never_back(&back, back.fencing.as_ref().unwrap());
            assert_eq!(found.len(), 1, "{order:?}: {found:?}");
            assert!(found[0].observed.starts_with("key r: epoch went back"));
        }
        // A take-and-finish in one write is its own holder's.
        let one = history(
            vec![
                row(1, "INSERT", ("", None), ("PENDING", 0), "submitter"),
                row(
                    2,
                    "UPDATE",
                    ("PENDING", Some(0)),
                    ("SUCCEEDED", 1),
                    "worker-a",
                ),
            ],
            FenceOrder::Increasing,
        );
        assert!(final_writes_by_holders(&one, one.fencing.as_ref().unwrap()).is_empty());
    }
}
