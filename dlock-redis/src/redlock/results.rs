//! Results on RedLock: every master keeps its own copy of the record, written by the
//! single server's store script (the same key, hold check and token check on each), and
//! a store or a load is decided by a quorum of the masters' answers.
//!
//! # Storing
//!
//! The store is sent to every master at once, as a release is. Each master checks, in
//! one script, that it holds the lock for this owner, token and grant, and that it keeps
//! no result of this token or a later one; then it writes its copy. Every copy of one
//! store carries the same call id. The store succeeds when a quorum of masters wrote
//! their copy; it is `NotHeld` when so many refused that a quorum can no longer write it
//! (with an odd number of masters: a majority refused), and `QuorumNotReached` (or
//! `Unavailable` when no master answered) when too few answered to tell. A store that
//! fails may still have left copies on a minority of masters: the masters that hold the
//! lock write, whatever the others answer.
//!
//! # Loading
//!
//! The result is the record of which a quorum of masters hold the very same copy (the
//! same token and the same store call): that store reached a quorum, and no later one
//! did, since a later one would have replaced the copies on a quorum of masters, and two
//! quorums share a master. A record found on fewer masters is the remains of a store
//! that failed, or of one whose other copies sit on masters that have not answered. So
//! the load waits, up to the operation's bound, while the masters yet to answer could
//! still complete a quorum of copies of some record, and fails with `QuorumNotReached`
//! if they do not answer in time; once no record can reach a quorum, it returns `None`.
//! It never returns the remains of a failed store, whatever their token.
//!
//! The price of that rule: a successful store's record is reported absent (`None`) once
//! fewer than a quorum of its copies are left, which takes a later store that reached
//! only some of those masters (its holder's lease was ending) or masters that lost their
//! data. Idempotent execution stores only after it loaded no result, so there this
//! takes two runs whose leases overlapped (the first one's ran out while it stored). A
//! lost copy is not repaired, and a master that was down while a result was stored
//! misses its copy for good: with a result on exactly a quorum of masters, one of them
//! down makes loads fail with `QuorumNotReached` until it is back.
//!
//! Each copy expires with the retention from the moment its master wrote it (on that
//! master's clock), so the copies of one store expire within the store's spread of a few
//! milliseconds of each other, and the result is reported absent from the first expiry
//! that leaves fewer than a quorum of copies.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{FencingToken, LockError, StoredResult};

use super::nodes::{fan_out, NodeLink};
use super::quorum::{unreachable, Answer};
use crate::hold::RedisHold;
use crate::keys::LockKeys;
use crate::results::{load_call, store_call, ResultRecord, StoreReply};

/// Stores `hold`'s result on every master, succeeding with a quorum of copies.
pub(super) async fn store(
    nodes: &[NodeLink],
    timeout: Duration,
    quorum: usize,
    hold: &RedisHold,
    token: FencingToken,
    value: &[u8],
    retention: Duration,
) -> Result<(), LockError> {
    let call = Arc::new(store_call(hold, token, value, retention)?);
    let mut answers = fan_out(
        nodes,
        timeout,
        |mut conn| {
            let call = call.clone();
            async move { StoreReply::parse(call.run(&mut conn).await?) }
        },
        |answers| decide_store(answers, quorum).is_some(),
    )
    .await;
    match decide_store(&answers, quorum) {
        Some(true) => Ok(()),
        Some(false) => {
            tracing::debug!(lock = %hold.keys.hold, %token, ?answers, "too many masters refused the result");
            Err(LockError::not_held())
        }
        None => {
            let stored = count_stored(&answers);
            Err(unreachable(&mut answers, stored, quorum))
        }
    }
}

/// The result a quorum of masters hold the same copy of, if any (see the module docs).
pub(super) async fn load(
    nodes: &[NodeLink],
    timeout: Duration,
    quorum: usize,
    keys: &LockKeys,
) -> Result<Option<StoredResult>, LockError> {
    let call = Arc::new(load_call(keys));
    let mut answers = fan_out(
        nodes,
        timeout,
        |mut conn| {
            let call = call.clone();
            async move { ResultRecord::parse(call.run(&mut conn).await?) }
        },
        |answers| decide_load(answers, quorum).is_ok(),
    )
    .await;
    match decide_load(&answers, quorum) {
        Ok(None) => Ok(None),
        Ok(Some(index)) => match answers.swap_remove(index) {
            Answer::Replied(Some(record)) => Ok(Some(record.into_stored())),
            _ => unreachable!("decide_load names an answer with a record"),
        },
        Err(got) => Err(unreachable(&mut answers, got, quorum)),
    }
}

/// How many masters stored the result.
fn count_stored(answers: &[Answer<StoreReply>]) -> usize {
    answers.iter().filter(|a| a.replied().is_some_and(|reply| reply.stored())).count()
}

/// What a store came to: `Some(true)` stored on a quorum, `Some(false)` refused by so
/// many that a quorum cannot store it, `None` undecided (too few answered).
pub(crate) fn decide_store(answers: &[Answer<StoreReply>], quorum: usize) -> Option<bool> {
    let stored = count_stored(answers);
    if stored >= quorum {
        return Some(true);
    }
    let unknown = answers.iter().filter(|a| a.replied().is_none()).count();
    if stored + unknown >= quorum {
        return None;
    }
    Some(false)
}

/// What a load came to: `Ok(Some(index))` the answer whose record a quorum of masters
/// hold the same copy of, `Ok(None)` no record can have a quorum of copies, `Err(got)`
/// undecided: too few masters answered (`got` of them), or the masters yet to answer could
/// still complete a quorum of copies (`got`: the most copies of one record so far).
pub(crate) fn decide_load(answers: &[Answer<Option<ResultRecord>>], quorum: usize) -> Result<Option<usize>, usize> {
    let records = || answers.iter().enumerate().filter_map(|(index, a)| a.replied()?.as_ref().map(|r| (index, r)));
    let copies = |record: &ResultRecord| {
        records().filter(|(_, other)| other.token == record.token && other.call == record.call).count()
    };
    let mut most = 0;
    for (index, record) in records() {
        let count = copies(record);
        // At most one record can have a quorum of copies: each master keeps one.
        if count >= quorum {
            return Ok(Some(index));
        }
        most = most.max(count);
    }
    let unanswered = answers.iter().filter(|a| a.replied().is_none()).count();
    let answered = answers.len() - unanswered;
    // Fewer answers than a quorum could miss every copy of a successful store.
    if answered < quorum {
        return Err(answered);
    }
    if most + unanswered >= quorum {
        return Err(most);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: u64, call: &str) -> ResultRecord {
        ResultRecord { token, value: format!("{token}/{call}").into_bytes(), call: call.to_string() }
    }

    fn copy(token: u64, call: &str) -> Answer<Option<ResultRecord>> {
        Answer::Replied(Some(record(token, call)))
    }

    fn empty() -> Answer<Option<ResultRecord>> {
        Answer::Replied(None)
    }

    fn chosen(answers: &[Answer<Option<ResultRecord>>]) -> Result<Option<(u64, String)>, usize> {
        decide_load(answers, answers.len() / 2 + 1).map(|index| {
            index.map(|i| {
                let record = answers[i].replied().unwrap().as_ref().unwrap();
                (record.token, record.call.clone())
            })
        })
    }

    #[test]
    fn a_store_needs_a_quorum_of_copies() {
        use StoreReply::{NotHeld, Stored, StoredBefore, Superseded};
        let replied = |list: &[Option<StoreReply>]| -> Vec<Answer<StoreReply>> {
            list.iter().map(|r| r.map_or(Answer::TimedOut, Answer::Replied)).collect()
        };
        assert_eq!(
            decide_store(&replied(&[Some(Stored), Some(StoredBefore), Some(Stored), None, None]), 3),
            Some(true)
        );
        assert_eq!(decide_store(&replied(&[Some(Stored), Some(Stored), None, None, Some(NotHeld)]), 3), None);
        assert_eq!(
            decide_store(&replied(&[Some(Stored), Some(Stored), Some(Superseded), Some(NotHeld), None]), 3),
            None
        );
        assert_eq!(
            decide_store(&replied(&[Some(Stored), Some(NotHeld), Some(Superseded), Some(NotHeld), None]), 3),
            Some(false)
        );
        // Four masters: two refusals leave no quorum of three.
        assert_eq!(decide_store(&replied(&[Some(Stored), Some(NotHeld), Some(NotHeld), None]), 3), Some(false));
        let mut none: Vec<Answer<StoreReply>> = vec![Answer::TimedOut, Answer::TimedOut, Answer::TimedOut];
        assert_eq!(decide_store(&none, 2), None);
        assert!(matches!(unreachable(&mut none, 0, 2), LockError::Unavailable { .. }));
    }

    #[test]
    fn a_load_returns_only_a_record_a_quorum_holds() {
        let a = || copy(10, "a");
        assert_eq!(chosen(&[a(), a(), a(), empty(), empty()]), Ok(Some((10, "a".into()))));
        // The remains of a later store that failed do not hide the result under them.
        assert_eq!(chosen(&[copy(20, "b"), a(), a(), a(), empty()]), Ok(Some((10, "a".into()))));
        // ... and are never a result themselves.
        assert_eq!(chosen(&[copy(20, "b"), empty(), empty(), empty(), empty()]), Ok(None));
        assert_eq!(chosen(&[copy(20, "b"), copy(20, "b"), empty(), empty(), empty()]), Ok(None));
        // The same token from another store call is another record.
        assert_eq!(chosen(&[copy(10, "a"), copy(10, "a"), copy(10, "c"), empty(), empty()]), Ok(None));
        // A successful store whose copies a failed one partly replaced: no record has a
        // quorum, and no answer can still give one.
        assert_eq!(chosen(&[a(), a(), copy(20, "b"), empty(), empty()]), Ok(None));
        assert_eq!(chosen(&[empty(), empty(), empty(), empty(), empty()]), Ok(None));
    }

    #[test]
    fn a_load_waits_for_the_masters_that_could_complete_a_quorum() {
        let a = || copy(10, "a");
        // The third copy may be on the silent master.
        assert_eq!(chosen(&[a(), a(), Answer::TimedOut, empty(), empty()]), Err(2));
        assert_eq!(chosen(&[a(), a(), Answer::Pending, empty(), copy(20, "b")]), Err(2));
        // One copy and one silent master cannot make three.
        assert_eq!(chosen(&[a(), Answer::TimedOut, empty(), empty(), copy(20, "b")]), Ok(None));
        // Too few answers could all have missed a result.
        assert_eq!(chosen(&[empty(), empty(), Answer::TimedOut, Answer::TimedOut, Answer::TimedOut]), Err(2));
        // A quorum of copies needs no more answers.
        assert_eq!(chosen(&[a(), a(), a(), Answer::Pending, Answer::Pending]), Ok(Some((10, "a".into()))));
    }

    /// Random histories of stores, each landing on the masters where its hold check
    /// passes and no later record is kept, read by every set of answering masters: a load
    /// returns only the record of a store that reached a quorum, and the latest such store
    /// (no successful store of a higher token exists); when every master answers and the
    /// latest successful store still has a quorum of copies, that is what it returns.
    #[test]
    fn a_load_never_returns_the_remains_of_a_failed_store() {
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut found_some, mut found_none) = (0, 0);
        for nodes in [3usize, 4, 5, 7] {
            let quorum = nodes / 2 + 1;
            for _ in 0..2000 {
                let mut kept: Vec<Option<ResultRecord>> = vec![None; nodes];
                // (token, call, copies written)
                let mut stores: Vec<(u64, String, usize)> = Vec::new();
                for store in 0..rng.usize(1..6) {
                    let token = rng.u64(1..12);
                    let call = format!("s{store}");
                    let mut landed = 0;
                    for slot in kept.iter_mut() {
                        let held = rng.u8(0..4) != 0;
                        if held && slot.as_ref().is_none_or(|r| r.token < token) {
                            *slot = Some(record(token, &call));
                            landed += 1;
                        }
                    }
                    stores.push((token, call, landed));
                }
                let successful =
                    |token: u64, call: &str| stores.iter().any(|(t, c, n)| *t == token && c == call && *n >= quorum);
                let newest_success = stores.iter().filter(|(_, _, n)| *n >= quorum).max_by_key(|(t, _, _)| *t);
                for answering in 0u32..(1 << nodes) {
                    let answers: Vec<Answer<Option<ResultRecord>>> = kept
                        .iter()
                        .enumerate()
                        .map(
                            |(i, r)| {
                                if answering & (1 << i) != 0 {
                                    Answer::Replied(r.clone())
                                } else {
                                    Answer::TimedOut
                                }
                            },
                        )
                        .collect();
                    let decided = decide_load(&answers, quorum);
                    found_none += usize::from(decided == Ok(None));
                    let Ok(Some(index)) = decided else {
                        if answering == (1 << nodes) - 1 {
                            if let Some((token, call, _)) = newest_success {
                                let intact =
                                    kept.iter().flatten().filter(|r| r.token == *token && r.call == *call).count();
                                assert!(intact < quorum, "a result with a quorum of copies was missed: {kept:?}");
                            }
                        }
                        continue;
                    };
                    found_some += 1;
                    let found = answers[index].replied().unwrap().as_ref().unwrap();
                    assert!(successful(found.token, &found.call), "returned a failed store: {found:?} of {stores:?}");
                    assert!(
                        stores.iter().all(|(t, _, n)| *n < quorum || *t <= found.token),
                        "returned {found:?} while a later store succeeded: {stores:?}"
                    );
                }
            }
        }
        assert!(found_some > 10_000 && found_none > 1_000, "{found_some} results, {found_none} none");
    }
}
