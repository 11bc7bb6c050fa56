//! Shared holds and semaphore permits of the lease-table backend, kept in the holds table
//! beside the lease table (see [`HoldSql`](crate::dialect::HoldSql) for the table and its
//! locking).
//!
//! Each operation is one transaction that locks the name's lease row first, reads what it
//! needs, and decides here, once for every dialect: which holds may be held together is
//! [`HoldKind::joins`], the rule the reference backend applies too. Each permit's row keeps
//! the number of permits it was granted under, so that a later grant never gives a holder
//! more company than it asked for.
//!
//! Without a queue, waiters keep their order by places in the same table: a blocking
//! writer's place keeps new readers and permits out, and a blocking permit request's place
//! keeps out later requests for more permits than it asks for, so that a request for more
//! never overtakes one waiting for fewer. A place lapses [`Request::place_lapse`] after its
//! last refresh, so a waiter that died keeps nobody out for long.
//!
//! [`Request::place_lapse`]: dlock_core::backend::Request::place_lapse

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_core::{HoldKind, LockError, MAX_PERMITS};

use crate::db::{Answer, Args, Tx, Value};
use crate::dialect::{LeaseSql, Reply, Stmt, CLOCK_SLACK_US, WAITING};

/// The `kind` a hold of `kind` is written with in the holds table: `shared`, or
/// `permit:<n>` with the number of permits the grant asked for.
pub(crate) fn kind_text(kind: HoldKind) -> String {
    match kind {
        HoldKind::Permit { permits } => format!("permit:{permits}"),
        other => other.as_str().to_string(),
    }
}

/// The kind of a hold that a holds-table row's `kind` names. A plain `permit`, written by
/// an earlier version that kept no count, bounds only the requests beside it.
fn parse_kind(text: &str) -> Option<HoldKind> {
    match text {
        "shared" => Some(HoldKind::Shared),
        "permit" => Some(HoldKind::Permit { permits: u32::MAX }),
        _ => {
            let permits = text.strip_prefix("permit:")?.parse::<u32>().ok()?;
            (1..=MAX_PERMITS).contains(&permits).then_some(HoldKind::Permit { permits })
        }
    }
}

/// A live row of the holds table: a grant, or a waiter's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    pub(crate) request: String,
    pub(crate) owner: String,
    /// The hold's kind, or `None` for a waiter's place.
    pub(crate) kind: Option<HoldKind>,
    /// What a place waits for: `Exclusive` for a writer, `Permit` with the number of
    /// permits of a permit request; `None` for a hold.
    pub(crate) place: Option<HoldKind>,
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
        let fence = values.get(3).and_then(Value::int).ok_or_else(bad)?;
        let (kind, place) = match values.get(2).and_then(Value::text).ok_or_else(bad)? {
            // A waiting writer's place has no count; a permit request's keeps its count
            // where a hold keeps its token.
            WAITING if fence <= 0 => (None, Some(HoldKind::Exclusive)),
            WAITING => {
                let permits = u32::try_from(fence).map_err(|_| bad())?.min(MAX_PERMITS);
                (None, Some(HoldKind::Permit { permits }))
            }
            text => (Some(parse_kind(text).ok_or_else(bad)?), None),
        };
        Ok(Live {
            request: values.first().and_then(Value::text).ok_or_else(bad)?.to_string(),
            owner: values.get(1).and_then(Value::text).ok_or_else(bad)?.to_string(),
            kind,
            place,
            fence,
            remaining_us: values.get(4).and_then(Value::int).ok_or_else(bad)?,
        })
    }

    /// Whether this place keeps a new request of `kind` out: a writer's keeps out every
    /// reader and permit, a permit request's keeps out requests for more permits.
    fn keeps_out(&self, kind: HoldKind) -> bool {
        match (self.place, kind) {
            (Some(HoldKind::Exclusive), _) => true,
            (Some(HoldKind::Permit { permits: waits_for }), HoldKind::Permit { permits }) => permits > waits_for,
            _ => false,
        }
    }
}

/// What a grant attempt decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A new hold, taking the next token.
    Grant,
    /// The owner's live hold of the same kind (and number of permits) and this token,
    /// entered once more.
    ReEnter(i64),
    /// Not now: the first of the holds and places in the way ends after this long.
    Busy(Duration),
}

/// The exclusive hold in the lease row, if live: its remaining time in microseconds.
type Exclusive = Option<i64>;

/// Decides a request of `kind` by `owner` (its request id `request`) against the live
/// exclusive hold and rows.
pub(crate) fn decide(kind: HoldKind, owner: &str, request: &str, exclusive: Exclusive, rows: &[Live]) -> Decision {
    // An owner re-enters only the kind it holds, a permit only with the same number of
    // permits; anything else waits for its own turn.
    if let Some(ours) = rows.iter().find(|r| r.owner == owner && r.kind == Some(kind)) {
        return Decision::ReEnter(ours.fence);
    }
    // One hold per owner and token, however many grants re-entered it.
    let holds: BTreeMap<(&str, i64), HoldKind> =
        rows.iter().filter_map(|r| Some(((r.owner.as_str(), r.fence), r.kind?))).collect();
    // A request's own place never keeps it out.
    let waited_for = rows.iter().any(|r| r.request != request && r.keeps_out(kind));
    let joins = kind.joins(holds.into_values().chain(exclusive.map(|_| HoldKind::Exclusive)));
    if joins && !waited_for {
        return Decision::Grant;
    }
    let first_end = rows.iter().map(|r| r.remaining_us).chain(exclusive).min().unwrap_or(0);
    Decision::Busy(Duration::from_micros(first_end.unsigned_abs()) + Duration::from_millis(1))
}

/// What [`attempt`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempted {
    /// Granted (or re-entered) with this token.
    Granted(i64),
    /// Busy: when to look again, and whether the request holds a place now.
    Busy { retry_after: Duration, placed: bool },
}

/// The name's lease row, locked for the rest of the transaction.
struct Locked {
    /// The exclusive hold, if live.
    exclusive: Exclusive,
    /// The database's clock when it was locked, in microseconds.
    now_us: i64,
}

/// Locks the name's lease row (making it if missing) for the rest of the transaction.
async fn lock(tx: &mut Tx, sql: &LeaseSql, args: Args<'_>) -> Result<Locked, LockError> {
    let mut answer = tx.run(&sql.holds.lock, args).await?;
    if let Some(read) = &sql.holds.locked {
        answer = tx.run(read, args).await?;
    }
    let row = answer.rows.first().ok_or_else(|| LockError::backend("the lease row was not locked"))?;
    let bad = || LockError::backend(format!("unexpected lease row: {row:?}"));
    let owner = row.first().ok_or_else(bad)?;
    let holds = row.get(1).and_then(Value::int).ok_or_else(bad)?;
    let remaining_us = row.get(2).and_then(Value::int).ok_or_else(bad)?;
    let now_us = row.get(4).and_then(Value::int).ok_or_else(bad)?;
    let exclusive = (!matches!(owner, Value::Null) && holds > 0 && remaining_us > 0).then_some(remaining_us);
    Ok(Locked { exclusive, now_us })
}

/// The expiry of a grant or renewal for `args.ttl_us` made in a transaction that locked the
/// lease row at `now_us`. The row and the lease row's `shared_us` both get this one value,
/// so `shared_us` is never below a live row's expiry. It counts from the lock, which comes
/// after the client sent its request: the client's own count of the hold never outlasts it.
fn expiry(now_us: i64, args: Args<'_>) -> i64 {
    now_us.saturating_add(args.ttl_us).saturating_add(CLOCK_SLACK_US)
}

/// One grant attempt of a shared hold or a permit: the token granted, or when to look
/// again. `args` carry the name, owner, request id (as the grant), ttl, kind (as written
/// in the table) and the lapse of a place; a blocking permit request that is refused keeps
/// (or refreshes) its place, with its number of permits.
pub(crate) async fn attempt(
    tx: &mut Tx,
    sql: &LeaseSql,
    args: Args<'_>,
    kind: HoldKind,
    blocking: bool,
) -> Result<Attempted, LockError> {
    let locked = lock(tx, sql, args).await?;
    let h = &sql.holds;
    let rows = Live::parse_all(&tx.run(&h.live, args).await?)?;
    let expires_us = expiry(locked.now_us, args);
    match decide(kind, args.owner, args.grant, locked.exclusive, &rows) {
        Decision::Busy(retry_after) => {
            let placed = match kind {
                HoldKind::Permit { permits } if blocking => {
                    tx.run(&h.wait, Args { fence: i64::from(permits), ..args }).await?;
                    true
                }
                _ => false,
            };
            Ok(Attempted::Busy { retry_after, placed })
        }
        Decision::Grant => {
            let args = Args { expires_us, ..args };
            let answer = tx.run(&h.bump, args).await?;
            let fence = match h.bump.reply {
                Reply::Rows => answer.rows.first().and_then(|r| r.first()).and_then(Value::int),
                Reply::Done => i64::try_from(answer.last_id).ok().filter(|f| *f > 0),
            }
            .ok_or_else(|| LockError::backend("taking the next token answered nothing"))?;
            // Written over the request's own place, if it kept one.
            tx.run(&h.insert, Args { fence, ..args }).await?;
            Ok(Attempted::Granted(fence))
        }
        Decision::ReEnter(fence) => {
            let args = Args { fence, expires_us, ..args };
            tx.run(&h.insert, args).await?;
            // A re-entrant grant extends the whole hold, never shortening it.
            tx.run(&h.touch, args).await?;
            tx.run(&h.extend, args).await?;
            Ok(Attempted::Granted(fence))
        }
    }
}

/// Keeps one hold for `args.ttl_us` more: whether it was live.
pub(crate) async fn renew(tx: &mut Tx, sql: &LeaseSql, args: Args<'_>) -> Result<bool, LockError> {
    let locked = lock(tx, sql, args).await?;
    let h = &sql.holds;
    let args = Args { expires_us: expiry(locked.now_us, args), ..args };
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
        let request = format!("{owner}-{fence}");
        Live { request, owner: owner.to_string(), kind, place: None, fence, remaining_us }
    }

    fn place(request: &str, waits_for: HoldKind, remaining_us: i64) -> Live {
        Live {
            request: request.to_string(),
            owner: request.to_string(),
            kind: None,
            place: Some(waits_for),
            fence: 0,
            remaining_us,
        }
    }

    fn p(permits: u32) -> HoldKind {
        HoldKind::Permit { permits }
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        let shared = HoldKind::Shared;
        assert_eq!(decide(shared, "a", "r", None, &[]), Decision::Grant);
        let reader = [row("b", Some(shared), 3, 500)];
        assert_eq!(decide(shared, "a", "r", None, &reader), Decision::Grant);
        assert_eq!(decide(shared, "b", "r", None, &reader), Decision::ReEnter(3));
        assert_eq!(decide(shared, "a", "r", Some(2_000), &[]), Decision::Busy(Duration::from_micros(3_000)));
        assert!(matches!(decide(p(5), "a", "r", None, &reader), Decision::Busy(_)));
    }

    #[test]
    fn a_waiting_writer_keeps_new_readers_out_but_not_reentry() {
        let shared = HoldKind::Shared;
        let rows = [row("b", Some(shared), 3, 5_000), place("w", HoldKind::Exclusive, 1_000)];
        assert_eq!(decide(shared, "a", "r", None, &rows), Decision::Busy(Duration::from_micros(2_000)));
        assert_eq!(decide(shared, "b", "r", None, &rows), Decision::ReEnter(3));
        assert!(matches!(decide(p(9), "a", "r", None, &rows), Decision::Busy(_)));
    }

    #[test]
    fn permits_bound_by_every_holders_count() {
        // Two grants of one re-entered hold count once.
        let rows = [row("a", Some(p(3)), 1, 9), row("a", Some(p(3)), 1, 9), row("b", Some(p(3)), 2, 9)];
        assert!(matches!(decide(p(2), "c", "r", None, &rows), Decision::Busy(_)));
        assert_eq!(decide(p(3), "c", "r", None, &rows), Decision::Grant);
        assert_eq!(decide(p(3), "a", "r", None, &rows), Decision::ReEnter(1));
        assert!(matches!(decide(HoldKind::Shared, "a", "r", None, &rows), Decision::Busy(_)));
        // A holder of two has company enough with one beside it, whatever the request says.
        let rows = [row("a", Some(p(2)), 1, 9)];
        assert_eq!(decide(p(2), "c", "r", None, &rows), Decision::Grant);
        assert_eq!(decide(p(3), "c", "r", None, &rows), Decision::Grant);
        let rows = [row("a", Some(p(2)), 1, 9), row("b", Some(p(5)), 2, 9)];
        assert!(matches!(decide(p(5), "c", "r", None, &rows), Decision::Busy(_)), "the holder of two is crowded");
        // A permit of an earlier version, without its count, bounds only the request.
        let rows = [row("a", Some(p(u32::MAX)), 1, 9), row("b", Some(p(u32::MAX)), 2, 9)];
        assert_eq!(decide(p(3), "c", "r", None, &rows), Decision::Grant);
        assert!(matches!(decide(p(2), "c", "r", None, &rows), Decision::Busy(_)));
    }

    #[test]
    fn a_permit_reenters_only_with_its_own_count() {
        let rows = [row("a", Some(p(3)), 7, 9)];
        assert_eq!(decide(p(3), "a", "r", None, &rows), Decision::ReEnter(7));
        assert_eq!(decide(p(4), "a", "r", None, &rows), Decision::Grant, "another count takes another permit");
        assert!(matches!(decide(p(1), "a", "r", None, &rows), Decision::Busy(_)), "one permit allows no company");
    }

    #[test]
    fn a_waiting_permit_request_keeps_out_requests_for_more_only() {
        let rows = [row("a", Some(p(2)), 1, 9_000), place("c", p(1), 2_000)];
        assert!(matches!(decide(p(3), "d", "d", None, &rows), Decision::Busy(_)), "more overtook fewer");
        assert!(matches!(decide(p(1), "e", "e", None, &rows), Decision::Busy(_)), "the holder allows none");
        // Its own place never keeps a request out, nor one of the same or fewer permits.
        let rows = [place("c", p(2), 2_000), place("d", p(3), 2_000)];
        assert_eq!(decide(p(2), "c", "c", None, &rows), Decision::Grant);
        assert_eq!(decide(p(1), "e", "e", None, &rows), Decision::Grant);
        assert_eq!(decide(p(3), "d", "d", None, &rows), Decision::Busy(Duration::from_micros(3_000)));
        // Readers are not permits: a permit request's place is no writer's.
        assert_eq!(decide(HoldKind::Shared, "e", "e", None, &rows), Decision::Grant);
    }

    #[test]
    fn kinds_are_written_with_their_count() {
        for kind in [HoldKind::Shared, p(1), p(MAX_PERMITS)] {
            assert_eq!(parse_kind(&kind_text(kind)), Some(kind));
        }
        assert_eq!(parse_kind("permit"), Some(p(u32::MAX)));
        for bad in ["permit:0", "permit:-1", "permit:x", "permit:", "exclusive", "Shared", "permit:1000001"] {
            assert_eq!(parse_kind(bad), None, "{bad}");
        }
    }

    #[test]
    fn places_keep_their_count_in_the_fence() {
        let parse = |kind: &str, fence: i64| {
            Live::parse(&[
                Value::Text("r".into()),
                Value::Text("o".into()),
                Value::Text(kind.into()),
                Value::Int(fence),
                Value::Int(5),
            ])
        };
        assert_eq!(parse(WAITING, 0).unwrap().place, Some(HoldKind::Exclusive));
        assert_eq!(parse(WAITING, 4).unwrap().place, Some(p(4)));
        assert_eq!(parse("permit:4", 9).unwrap().kind, Some(p(4)));
        assert!(parse("permit:four", 9).is_err());
    }
}
