//! What N answers add up to: the decisions of a grant round, a renewal, a release and an
//! inspect, as pure functions of the nodes' answers.

use std::collections::HashMap;
use std::time::Duration;

use dlock_core::{LockError, LostReason};
use redis::RedisError;

use crate::error::{is_transient, to_lock_error};
use crate::scripts::{GrantReply, HoldView, RenewReply};

/// What one node did with one call.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// No answer yet (the call is in flight, or the fan-out stopped early).
    Pending,
    /// No answer within the node timeout.
    TimedOut,
    /// The call failed.
    Failed(RedisError),
    /// The node answered.
    Replied(T),
}

impl<T> Answer<T> {
    pub(crate) fn replied(&self) -> Option<&T> {
        match self {
            Answer::Replied(reply) => Some(reply),
            _ => None,
        }
    }
}

/// The error of an operation that too few nodes answered: the first error that is not
/// about reaching a node (a misconfiguration shows as itself), else `Unavailable` when no
/// node answered at all, else `QuorumNotReached` with how many nodes did what was asked.
pub(crate) fn unreachable<T>(answers: &mut [Answer<T>], got: usize, needed: usize) -> LockError {
    let misconfigured = answers.iter().position(|a| matches!(a, Answer::Failed(err) if !is_transient(err)));
    if let Some(index) = misconfigured {
        if let Answer::Failed(err) = std::mem::replace(&mut answers[index], Answer::TimedOut) {
            return to_lock_error(err);
        }
    }
    let first = answers.iter().find_map(|a| match a {
        Answer::Failed(err) => Some(err.to_string()),
        _ => None,
    });
    if answers.iter().all(|a| a.replied().is_none()) {
        let why = first.unwrap_or_else(|| "no answer within the node timeout".into());
        return LockError::unavailable(format!("no RedLock node answered: {why}"));
    }
    LockError::QuorumNotReached { got, needed }
}

/// The replies to one grant round, one per node, with each node's fence counter.
pub(crate) type GrantAnswers = [Answer<(GrantReply, u64)>];

/// What a grant round came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantOutcome {
    /// A quorum holds the lock for this owner with this token.
    Won(u64),
    /// Too few nodes answered to decide; `got` granted.
    Unreachable {
        /// Nodes that granted (the largest group of one token).
        got: usize,
    },
    /// Enough nodes are free, but the proposal was not above all their counters: a round
    /// with a proposal above `max_fence` can win.
    Stale {
        /// The highest counter any node reported.
        max_fence: u64,
    },
    /// Other holders stand in the way.
    Busy {
        /// No one holder has a quorum of the answers: several clients are competing (a
        /// split vote), and all should retry after a random delay rather than at once
        /// (their give-backs would wake them all together). Otherwise the holder's release
        /// message is the signal to look again.
        split: bool,
        /// When enough of the other holders' holds will have expired to make a quorum
        /// possible, if known.
        retry_after: Option<Duration>,
    },
}

/// How many nodes granted each token (fresh grants and re-entries alike).
fn token_groups(answers: &GrantAnswers) -> HashMap<u64, usize> {
    let mut groups = HashMap::new();
    for (reply, _) in answers.iter().filter_map(Answer::replied) {
        if let GrantReply::Granted(token) | GrantReply::Reentered(token) = reply {
            *groups.entry(*token).or_insert(0) += 1;
        }
    }
    groups
}

/// The token a quorum granted, if one did: the fan-out can stop waiting.
pub(crate) fn grant_won(answers: &GrantAnswers, quorum: usize) -> Option<u64> {
    token_groups(answers).into_iter().find(|(_, count)| *count >= quorum).map(|(token, _)| token)
}

/// The highest fence counter among the replies.
pub(crate) fn max_fence(answers: &GrantAnswers) -> Option<u64> {
    answers.iter().filter_map(Answer::replied).map(|(_, fence)| *fence).max()
}

/// Decides a grant round of `proposal` once every node answered or the time ran out.
pub(crate) fn decide_grant(answers: &GrantAnswers, proposal: u64, quorum: usize) -> GrantOutcome {
    let groups = token_groups(answers);
    if let Some((&token, _)) = groups.iter().find(|(_, count)| **count >= quorum) {
        return GrantOutcome::Won(token);
    }
    let got = groups.values().copied().max().unwrap_or(0);
    let answered = answers.iter().filter(|a| a.replied().is_some()).count();
    if answered < quorum {
        return GrantOutcome::Unreachable { got };
    }
    let replies = || answers.iter().filter_map(Answer::replied).map(|(reply, _)| reply);
    let fresh = replies().filter(|r| **r == GrantReply::Granted(proposal)).count();
    let stale = replies().filter(|r| matches!(r, GrantReply::Stale(_))).count();
    if stale > 0 && fresh + stale >= quorum {
        return GrantOutcome::Stale { max_fence: max_fence(answers).unwrap_or(0) };
    }
    let mut holders: HashMap<u64, usize> = HashMap::new();
    for reply in replies() {
        if let GrantReply::Busy { token, .. } = reply {
            *holders.entry(*token).or_insert(0) += 1;
        }
    }
    let split = holders.values().all(|count| *count < quorum);
    // The lock can be won once enough other holds have expired to join the free nodes.
    let missing = quorum.saturating_sub(fresh + stale);
    let mut expiries: Vec<Option<Duration>> = replies()
        .filter_map(|r| match r {
            GrantReply::Busy { left, .. } => Some(*left),
            _ => None,
        })
        .collect();
    // Holds without expiry (None) sort last.
    expiries.sort_by_key(|left| left.unwrap_or(Duration::MAX));
    let retry_after = match missing {
        0 => Some(Duration::ZERO),
        k => expiries.get(k - 1).copied().flatten().map(|left| left + Duration::from_millis(1)),
    };
    GrantOutcome::Busy { split, retry_after }
}

/// What a renewal came to: `Ok(Some(..))` decided, `Ok(None)` undecided because too few
/// nodes answered (a transient failure the watchdog retries).
pub(crate) fn decide_renewal(answers: &[Answer<RenewReply>], quorum: usize) -> Option<dlock_core::backend::Renewal> {
    let renewed = answers.iter().filter(|a| matches!(a.replied(), Some(RenewReply::Renewed))).count();
    if renewed >= quorum {
        return Some(dlock_core::backend::Renewal::Renewed);
    }
    let unknown = answers.iter().filter(|a| a.replied().is_none()).count();
    if renewed + unknown >= quorum {
        return None;
    }
    let stolen = answers.iter().any(|a| matches!(a.replied(), Some(RenewReply::Stolen)));
    Some(dlock_core::backend::Renewal::Lost(if stolen { LostReason::Stolen } else { LostReason::Expired }))
}

/// Whether a renewal can stop waiting for more answers.
pub(crate) fn renewal_done(answers: &[Answer<RenewReply>], quorum: usize) -> bool {
    answers.iter().filter(|a| matches!(a.replied(), Some(RenewReply::Renewed))).count() >= quorum
}

/// What a release came to, as for [`decide_renewal`].
pub(crate) fn decide_release(answers: &[Answer<bool>], quorum: usize) -> Option<dlock_core::backend::Release> {
    let released = count_released(answers);
    if released >= quorum {
        return Some(dlock_core::backend::Release::Released);
    }
    let unknown = answers.iter().filter(|a| a.replied().is_none()).count();
    if released + unknown >= quorum {
        return None;
    }
    Some(dlock_core::backend::Release::NotHeld)
}

/// How many nodes released the hold.
pub(crate) fn count_released(answers: &[Answer<bool>]) -> usize {
    answers.iter().filter(|a| a.replied() == Some(&true)).count()
}

/// Whether an inspect can stop waiting: a quorum agrees on a holder, or a quorum answered
/// and the nodes still out could not make one.
pub(crate) fn inspect_done(answers: &[Answer<Option<HoldView>>], quorum: usize) -> bool {
    let mut groups: HashMap<(&str, u64), usize> = HashMap::new();
    for view in answers.iter().filter_map(Answer::replied).flatten() {
        *groups.entry((view.owner.as_str(), view.token)).or_default() += 1;
    }
    let largest = groups.values().copied().max().unwrap_or(0);
    let answered = answers.iter().filter(|a| a.replied().is_some()).count();
    let pending = answers.iter().filter(|a| matches!(a, Answer::Pending)).count();
    largest >= quorum || (answered >= quorum && largest + pending < quorum)
}

/// The holder a quorum agrees on, from the nodes' views: the owner and token, the count
/// and remaining time a quorum can vouch for (the quorum-th largest of each), or `None`
/// when no owner and token hold a quorum. `Err(got)` when too few nodes answered.
pub(crate) fn decide_inspect(answers: &[Answer<Option<HoldView>>], quorum: usize) -> Result<Option<HoldView>, usize> {
    let mut groups: HashMap<(&str, u64), Vec<&HoldView>> = HashMap::new();
    for view in answers.iter().filter_map(Answer::replied).flatten() {
        groups.entry((view.owner.as_str(), view.token)).or_default().push(view);
    }
    let largest = groups.values().map(Vec::len).max().unwrap_or(0);
    if let Some(views) = groups.into_values().find(|views| views.len() >= quorum) {
        let mut counts: Vec<u32> = views.iter().map(|v| v.count).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        // No expiry sorts first: it outlasts any ttl.
        let mut remaining: Vec<Option<Duration>> = views.iter().map(|v| v.remaining).collect();
        remaining.sort_unstable_by_key(|left| std::cmp::Reverse(left.unwrap_or(Duration::MAX)));
        return Ok(Some(HoldView {
            owner: views[0].owner.clone(),
            count: counts[quorum - 1],
            token: views[0].token,
            remaining: remaining[quorum - 1],
        }));
    }
    let answered = answers.iter().filter(|a| a.replied().is_some()).count();
    if answered < quorum {
        return Err(largest);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    fn replies(list: &[Option<GrantReply>]) -> Vec<Answer<(GrantReply, u64)>> {
        list.iter()
            .map(|r| match r {
                Some(reply) => {
                    let fence = match reply {
                        GrantReply::Granted(t) | GrantReply::Stale(t) => *t,
                        _ => 10,
                    };
                    Answer::Replied((*reply, fence))
                }
                None => Answer::TimedOut,
            })
            .collect()
    }

    use GrantReply::{Granted, Reentered, Stale};

    /// Held by the owner of token 5 for `left` more (`None`: no expiry).
    fn busy(left: Option<Duration>) -> GrantReply {
        GrantReply::Busy { left, token: 5 }
    }

    fn busy_by(token: u64, left: u64) -> GrantReply {
        GrantReply::Busy { left: ms(left), token }
    }

    #[test]
    fn a_grant_needs_a_quorum_of_one_token() {
        let answers = replies(&[Some(Granted(11)), Some(Granted(11)), Some(Granted(11)), None, None]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Won(11));
        assert_eq!(grant_won(&answers, 3), Some(11));
        // Re-entries count with the token they carry.
        let answers = replies(&[Some(Reentered(7)), Some(Reentered(7)), Some(Granted(11)), Some(Reentered(7)), None]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Won(7));
    }

    #[test]
    fn every_subset_of_unreachable_nodes() {
        // A free lock on 5 nodes: the grant is won exactly when at least 3 answer.
        for mask in 0u32..32 {
            let list: Vec<Option<GrantReply>> =
                (0..5).map(|i| if mask & (1 << i) != 0 { None } else { Some(Granted(11)) }).collect();
            let up = 5 - mask.count_ones() as usize;
            let outcome = decide_grant(&replies(&list), 11, 3);
            if up >= 3 {
                assert_eq!(outcome, GrantOutcome::Won(11), "{mask:05b}");
            } else {
                assert_eq!(outcome, GrantOutcome::Unreachable { got: up }, "{mask:05b}");
            }
        }
    }

    #[test]
    fn other_holders_make_it_busy_until_enough_holds_expire() {
        let answers = replies(&[Some(busy(ms(300))), Some(busy(ms(100))), Some(busy(ms(200))), None, None]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: false, retry_after: ms(301) });
        // Two nodes are free already (stale counters): one more expiry is enough.
        let answers =
            replies(&[Some(busy(ms(300))), Some(busy(ms(100))), Some(busy(ms(200))), Some(Stale(12)), Some(Stale(12))]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: false, retry_after: ms(101) });
        // A hold without expiry in the way.
        let answers = replies(&[Some(busy(None)), Some(busy(None)), Some(busy(ms(5))), None, Some(busy(None))]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: false, retry_after: None });
    }

    #[test]
    fn a_split_vote_is_busy_with_a_random_retry() {
        // Three competitors, 2-2-1: nobody has a quorum.
        let answers = replies(&[
            Some(Granted(11)),
            Some(Granted(11)),
            Some(busy_by(12, 50)),
            Some(busy_by(12, 50)),
            Some(busy_by(13, 50)),
        ]);
        assert!(matches!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: true, .. }));
        // One holder with a quorum: wait for its release instead.
        let answers = replies(&[
            Some(Granted(11)),
            Some(Granted(11)),
            Some(busy_by(12, 50)),
            Some(busy_by(12, 50)),
            Some(busy_by(12, 50)),
        ]);
        assert!(matches!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: false, .. }));
    }

    #[test]
    fn a_stale_proposal_on_free_nodes_asks_for_another_round() {
        let answers = replies(&[Some(Stale(20)), Some(Stale(25)), Some(Granted(11)), Some(busy(ms(5))), None]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Stale { max_fence: 25 });
        // Stale nodes alone cannot make a quorum with the busy ones in the way.
        let answers = replies(&[Some(Stale(20)), Some(busy(ms(5))), Some(busy(ms(5))), Some(busy(ms(5))), None]);
        assert!(matches!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { split: false, .. }));
    }

    #[test]
    fn a_mix_of_busy_and_down_is_busy_when_a_quorum_answered() {
        let answers = replies(&[Some(Granted(11)), Some(Granted(11)), Some(busy(ms(5))), None, None]);
        assert!(matches!(decide_grant(&answers, 11, 3), GrantOutcome::Busy { .. }));
        let answers = replies(&[Some(Granted(11)), Some(busy(ms(5))), None, None, None]);
        assert_eq!(decide_grant(&answers, 11, 3), GrantOutcome::Unreachable { got: 1 });
    }

    #[test]
    fn renewals_and_releases_need_a_quorum() {
        use RenewReply::{Gone, Renewed, Stolen};
        let renew = |list: &[Option<RenewReply>]| -> Vec<Answer<RenewReply>> {
            list.iter().map(|r| r.map_or(Answer::TimedOut, Answer::Replied)).collect()
        };
        let r = renew(&[Some(Renewed), Some(Renewed), Some(Renewed), None, None]);
        assert_eq!(decide_renewal(&r, 3), Some(dlock_core::backend::Renewal::Renewed));
        assert!(renewal_done(&r, 3));
        let r = renew(&[Some(Renewed), Some(Renewed), None, None, None]);
        assert_eq!(decide_renewal(&r, 3), None, "two renewed and three unknown: retry");
        let r = renew(&[Some(Renewed), Some(Gone), Some(Gone), Some(Stolen), None]);
        assert_eq!(decide_renewal(&r, 3), Some(dlock_core::backend::Renewal::Lost(LostReason::Stolen)));
        let r = renew(&[Some(Gone), Some(Gone), Some(Gone), None, None]);
        assert_eq!(decide_renewal(&r, 3), Some(dlock_core::backend::Renewal::Lost(LostReason::Expired)));

        let release = |list: &[Option<bool>]| -> Vec<Answer<bool>> {
            list.iter().map(|r| r.map_or(Answer::TimedOut, Answer::Replied)).collect()
        };
        assert_eq!(
            decide_release(&release(&[Some(true), Some(true), Some(true), Some(false), None]), 3),
            Some(dlock_core::backend::Release::Released)
        );
        assert_eq!(decide_release(&release(&[Some(true), Some(true), None, Some(false), None]), 3), None);
        assert_eq!(
            decide_release(&release(&[Some(false), Some(false), Some(false), Some(true), None]), 3),
            Some(dlock_core::backend::Release::NotHeld)
        );
    }

    #[test]
    fn inspect_reports_what_a_quorum_vouches_for() {
        let view = |owner: &str, token, count, left| {
            Answer::Replied(Some(HoldView { owner: owner.into(), count, token, remaining: ms(left) }))
        };
        let answers = vec![view("a", 7, 2, 900), view("a", 7, 2, 950), view("a", 7, 1, 800), view("b", 9, 1, 10), {
            Answer::TimedOut
        }];
        let holder = decide_inspect(&answers, 3).unwrap().unwrap();
        assert_eq!((holder.owner.as_str(), holder.token, holder.count, holder.remaining), ("a", 7, 1, ms(800)));

        let answers = vec![view("a", 7, 1, 900), view("a", 7, 1, 900), Answer::Replied(None), Answer::Replied(None)];
        assert_eq!(decide_inspect(&answers, 3), Ok(None));
        let answers = vec![view("a", 7, 1, 900), view("a", 7, 1, 900), Answer::TimedOut, Answer::TimedOut];
        assert_eq!(decide_inspect(&answers, 3), Err(2));

        let answers = vec![view("a", 7, 1, 900), view("a", 7, 1, 900), Answer::Replied(None), Answer::Pending];
        assert!(!inspect_done(&answers, 3), "the last node could still make a quorum for a");
        let answers = vec![view("a", 7, 1, 9), Answer::Replied(None), Answer::Replied(None), Answer::Pending];
        assert!(inspect_done(&answers, 3), "free on a quorum");
        let answers = vec![view("a", 7, 1, 9), view("a", 7, 1, 9), view("a", 7, 1, 9), Answer::Pending];
        assert!(inspect_done(&answers, 3));
    }

    #[test]
    fn errors_say_why_too_few_answered() {
        let mut none: Vec<Answer<bool>> = vec![Answer::TimedOut, Answer::TimedOut];
        assert!(matches!(unreachable(&mut none, 0, 2), LockError::Unavailable { .. }));
        let mut some = vec![Answer::Replied(true), Answer::TimedOut, Answer::TimedOut];
        assert!(matches!(unreachable(&mut some, 1, 2), LockError::QuorumNotReached { got: 1, needed: 2 }));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let wrong = RedisError::from((redis::ErrorKind::UnexpectedReturnType, "bad"));
        let mut mixed = vec![Answer::Failed(refused), Answer::Failed(wrong), Answer::<bool>::TimedOut];
        assert!(matches!(unreachable(&mut mixed, 0, 2), LockError::Backend(_)));
    }
}
