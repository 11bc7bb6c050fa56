//! Shared holds and semaphore permits of the lease-table backend, kept in the holds table
//! beside the lease table (see [`HoldSql`] for the table and its locking).
//!
//! Each operation is one transaction that locks the name's lease row first, reads what it
//! needs, and decides here, once for every dialect: which holds are compatible is
//! [`HoldKind::admits`], the rule the reference backend applies too.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_core::{HoldKind, LockError};

use crate::db::{Answer, Args, Tx, Value};
use crate::dialect::{LeaseSql, Reply, Stmt, WAITING};

/// A live row of the holds table: a grant, or a waiting writer's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    pub(crate) owner: String,
    /// The hold's kind (its permit count is not kept: only the asking side's count
    /// matters), or `None` for a waiting writer's place.
    pub(crate) kind: Option<HoldKind>,
    pub(crate) fence: i64,
    pub(crate) remaining_us: i64,
}

impl Live {
    /// Every live row of an answer to [`HoldSql::live`](crate::dialect::HoldSql).
    pub(crate) fn parse_all(answer: &Answer) -> Result<Vec<Live>, LockError> {
        answer.rows.iter().map(|row| Live::parse(row)).collect()
    }

    fn parse(values: &[Value]) -> Result<Live, LockError> {
        let bad = || LockError::backend(format!("unexpected row from the holds table: {values:?}"));
        let kind = match values.get(2).and_then(Value::text).ok_or_else(bad)? {
            WAITING => None,
            "shared" => Some(HoldKind::Shared),
            // The count is not kept: a row bounds nobody but the asking side.
            "permit" => Some(HoldKind::Permit { permits: u32::MAX }),
            _ => return Err(bad()),
        };
        Ok(Live {
            owner: values.get(1).and_then(Value::text).ok_or_else(bad)?.to_string(),
            kind,
            fence: values.get(3).and_then(Value::int).ok_or_else(bad)?,
            remaining_us: values.get(4).and_then(Value::int).ok_or_else(bad)?,
        })
    }

    /// Whether this row is a hold of `kind` (whatever the permit counts).
    fn is_hold_of(&self, kind: HoldKind) -> bool {
        self.kind.is_some_and(|k| k.as_str() == kind.as_str())
    }
}

/// What a grant attempt decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A new hold, taking the next token.
    Grant,
    /// The owner's live hold of the same kind and this token, entered once more.
    ReEnter(i64),
    /// Not now: the first of the holds and places in the way ends after this long.
    Busy(Duration),
}

/// The exclusive hold in the lease row, if live: its remaining time in microseconds.
type Exclusive = Option<i64>;

/// Decides a request of `kind` by `owner` against the live exclusive hold and rows.
pub(crate) fn decide(kind: HoldKind, owner: &str, exclusive: Exclusive, rows: &[Live]) -> Decision {
    // An owner re-enters only the kind it holds; another kind waits for its own turn.
    if let Some(ours) = rows.iter().find(|r| r.owner == owner && r.is_hold_of(kind)) {
        return Decision::ReEnter(ours.fence);
    }
    // One hold per owner and token, however many grants re-entered it.
    let holds: BTreeMap<(&str, i64), HoldKind> =
        rows.iter().filter_map(|r| Some(((r.owner.as_str(), r.fence), r.kind?))).collect();
    let writer_waits = rows.iter().any(|r| r.kind.is_none());
    let compatible = kind.joins(holds.into_values().chain(exclusive.map(|_| HoldKind::Exclusive)));
    if compatible && !writer_waits {
        return Decision::Grant;
    }
    let first_end = rows.iter().map(|r| r.remaining_us).chain(exclusive).min().unwrap_or(0);
    Decision::Busy(Duration::from_micros(first_end.unsigned_abs()) + Duration::from_millis(1))
}

/// Locks the name's lease row (making it if missing) for the rest of the transaction and
/// returns its live exclusive hold, if any.
async fn lock(tx: &mut Tx, sql: &LeaseSql, args: Args<'_>) -> Result<Exclusive, LockError> {
    let mut answer = tx.run(&sql.holds.lock, args).await?;
    if let Some(read) = &sql.holds.locked {
        answer = tx.run(read, args).await?;
    }
    let row = answer.rows.first().ok_or_else(|| LockError::backend("the lease row was not locked"))?;
    let bad = || LockError::backend(format!("unexpected lease row: {row:?}"));
    let owner = row.first().ok_or_else(bad)?;
    let holds = row.get(1).and_then(Value::int).ok_or_else(bad)?;
    let remaining_us = row.get(2).and_then(Value::int).ok_or_else(bad)?;
    Ok((!matches!(owner, Value::Null) && holds > 0 && remaining_us > 0).then_some(remaining_us))
}

/// One grant attempt of a shared hold or a permit: the token granted, or when to look
/// again. `args` carry the name, owner, request id (as the grant), ttl and kind.
pub(crate) async fn attempt(
    tx: &mut Tx,
    sql: &LeaseSql,
    args: Args<'_>,
    kind: HoldKind,
) -> Result<Result<i64, Duration>, LockError> {
    let exclusive = lock(tx, sql, args).await?;
    let h = &sql.holds;
    tx.run(&h.sweep, args).await?;
    let rows = Live::parse_all(&tx.run(&h.live, args).await?)?;
    match decide(kind, args.owner, exclusive, &rows) {
        Decision::Busy(retry_after) => Ok(Err(retry_after)),
        Decision::Grant => {
            let answer = tx.run(&h.bump, args).await?;
            let fence = match h.bump.reply {
                Reply::Rows => answer.rows.first().and_then(|r| r.first()).and_then(Value::int),
                Reply::Done => i64::try_from(answer.last_id).ok().filter(|f| *f > 0),
            }
            .ok_or_else(|| LockError::backend("taking the next token answered nothing"))?;
            tx.run(&h.insert, Args { fence, ..args }).await?;
            Ok(Ok(fence))
        }
        Decision::ReEnter(fence) => {
            let args = Args { fence, ..args };
            tx.run(&h.insert, args).await?;
            // A re-entrant grant extends the whole hold, never shortening it.
            tx.run(&h.touch, args).await?;
            tx.run(&h.extend, args).await?;
            Ok(Ok(fence))
        }
    }
}

/// Keeps one hold for `args.ttl_us` more: whether it was live.
pub(crate) async fn renew(tx: &mut Tx, sql: &LeaseSql, args: Args<'_>) -> Result<bool, LockError> {
    lock(tx, sql, args).await?;
    let h = &sql.holds;
    if tx.run(&h.touch, args).await?.matched(h.touch.reply) == 0 {
        return Ok(false);
    }
    tx.run(&h.extend, args).await?;
    Ok(true)
}

/// Deletes the row `take` (the holds table's `release` or `give_back`) matches, and with
/// it brings the lease row's `shared_us` down to the holds left, announcing the change:
/// whether it deleted one.
pub(crate) async fn take_back(tx: &mut Tx, sql: &LeaseSql, take: &Stmt, args: Args<'_>) -> Result<bool, LockError> {
    lock(tx, sql, args).await?;
    if tx.run(take, args).await?.matched(take.reply) == 0 {
        return Ok(false);
    }
    tx.run(&sql.holds.recount, args).await?;
    if let Some(notify) = &sql.holds.notify {
        tx.run(notify, args).await?;
    }
    Ok(true)
}

/// Clears every hold of the name, exclusive or not, keeping the fence counter.
pub(crate) async fn evict(tx: &mut Tx, sql: &LeaseSql, args: Args<'_>) -> Result<(), LockError> {
    lock(tx, sql, args).await?;
    tx.run(&sql.holds.evict, args).await?;
    tx.run(&sql.evict, args).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(owner: &str, kind: Option<HoldKind>, fence: i64, remaining_us: i64) -> Live {
        Live { owner: owner.to_string(), kind, fence, remaining_us }
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        let shared = HoldKind::Shared;
        assert_eq!(decide(shared, "a", None, &[]), Decision::Grant);
        let reader = [row("b", Some(shared), 3, 500)];
        assert_eq!(decide(shared, "a", None, &reader), Decision::Grant);
        assert_eq!(decide(shared, "b", None, &reader), Decision::ReEnter(3));
        assert_eq!(decide(shared, "a", Some(2_000), &[]), Decision::Busy(Duration::from_micros(3_000)));
        let permit = HoldKind::Permit { permits: 5 };
        assert!(matches!(decide(permit, "a", None, &reader), Decision::Busy(_)));
    }

    #[test]
    fn a_waiting_writer_keeps_new_readers_out_but_not_reentry() {
        let shared = HoldKind::Shared;
        let rows = [row("b", Some(shared), 3, 5_000), row("w", None, 0, 1_000)];
        assert_eq!(decide(shared, "a", None, &rows), Decision::Busy(Duration::from_micros(2_000)));
        assert_eq!(decide(shared, "b", None, &rows), Decision::ReEnter(3));
    }

    #[test]
    fn permits_count_holds_by_the_requests_number() {
        let p = |permits| HoldKind::Permit { permits };
        // Two grants of one re-entered hold count once.
        let rows = [row("a", Some(p(1)), 1, 9), row("a", Some(p(1)), 1, 9), row("b", Some(p(1)), 2, 9)];
        assert!(matches!(decide(p(2), "c", None, &rows), Decision::Busy(_)));
        assert_eq!(decide(p(3), "c", None, &rows), Decision::Grant);
        assert_eq!(decide(p(1), "a", None, &rows), Decision::ReEnter(1));
        assert!(matches!(decide(HoldKind::Shared, "a", None, &rows), Decision::Busy(_)));
    }
}
