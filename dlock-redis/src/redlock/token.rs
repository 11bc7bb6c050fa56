//! Fencing tokens over N independent counters: what a client proposes, and why the
//! tokens of successive holders strictly increase whatever it proposes.
//!
//! Each node keeps a fence counter per lock (the `:fence` key). The grant script accepts
//! a proposal `p` only if the lock is free on that node and `p` is above the node's
//! counter, and then sets the counter to `p`; a grant counts only when a quorum
//! (N/2 + 1) of nodes accepted the same `p`.
//!
//! # Why tokens strictly increase across successive holders
//!
//! Let holder A be granted token `a` by the quorum `QA`, and holder B, the next holder
//! after A, be granted `b` by the quorum `QB`. Two quorums of the same N nodes share at
//! least one node `n`. On `n`, the counter never decreases (it is persisted) and every
//! accepted proposal is above the counter at that moment, so the proposals `n` accepts
//! strictly increase in the order it accepts them. It remains to see that `n` accepted
//! `a` before `b`:
//!
//! - if `n` had accepted `b` first, B's hold would have been on `n` when A's proposal
//!   arrived, and `n` grants only while the lock is free there. B's hold leaves `n` only
//!   when B releases it (after B's grant, so after A's, which is absurd for B's own
//!   successful attempt) or when its ttl runs out on `n`. A hold that runs out before
//!   A's grant completed, and so before B's grant completed, is one that B's attempt
//!   outlived: B's validity (ttl − time since the attempt started − drift) was gone when
//!   its quorum was complete, and the client gives such a grant back instead of using it.
//!
//! So `b` > counter of `n` at B's grant ≥ `a`. Nothing in this argument depends on how
//! `b` was chosen: a proposer whose read of the counters missed a higher one (on a node
//! outside the quorum it read, or written after its read) proposes too low, is refused
//! by every node whose counter is higher, and can only win a quorum of nodes that all
//! had lower counters, a quorum that still meets `QA` in a node that accepted `a` before.
//! Proposing well is a matter of speed (one round trip instead of two), never of safety.
//!
//! A re-entrant acquire returns the holder's token: it is not a new holder.
//!
//! # Counters that expire
//!
//! A node keeps a name's counter for the keep time (`keep_idle`) after the name's last
//! grant, renewal or release there, so that idle names leave nothing behind. A node
//! without a counter accepts only proposals above its clock in microseconds, and the
//! argument above still holds as long as that floor is above every proposal the node
//! accepted before: the last one was accepted at least the keep time earlier (by the
//! node's clock, which expired the counter), and proposals run ahead of the clocks they
//! were made from by at most the lead ([`RedLockConfig::lead`](super::RedLockConfig::lead),
//! at most half the keep time). So tokens still strictly increase unless a node's clock
//! steps back by the keep time, or a client's or node's clock runs ahead of a node's by
//! more than half of it.
//!
//! Such a node reports its clock plus the lead as its counter (in a refusal, or to a
//! read): a proposal made above it reaches the node within the lead, so a clock that
//! moves on cannot refuse the second round of a look again and again.
//!
//! # What breaks it
//!
//! The argument needs every node's counter to survive a restart. A node that comes back
//! without its data (no persistence, or `appendfsync everysec` losing the last second)
//! has a counter that went back: with `QA = {n, x, y}` and `n` restarted empty, a proposer
//! reading `{n, z, w}` (none of which saw `a`) proposes `a` or less and wins, and the same
//! or a lower token goes to a later holder. The same restart also drops A's hold on `n`,
//! which can let B in while A still holds the lock (the RedLock crash problem). The
//! remedy the RedLock description gives: persistence with `appendonly yes` and
//! `appendfsync always` (counters and holds survive a kill -9), and, where that cannot be
//! had, delaying a crashed node's restart by more than the longest ttl in use, so that
//! every hold it knew of has expired on the other nodes before it votes again (this keeps
//! mutual exclusion; only fsync-always persistence keeps the counters, hence the tokens).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::TokenSource;

/// Locks whose last seen counter a client remembers; beyond this the memory is cleared.
const MAX_HINTS: usize = 4096;

/// Picks the tokens a client proposes.
pub(crate) struct Proposer {
    source: TokenSource,
    /// How far ahead of the clock proposals from the clock are, in µs.
    lead: u64,
    /// The highest counter seen per fence key: proposals start above it.
    hints: Mutex<HashMap<String, u64>>,
}

impl Proposer {
    pub(crate) fn new(source: TokenSource, lead: Duration) -> Self {
        Proposer { source, lead: micros(lead), hints: Mutex::new(HashMap::new()) }
    }

    /// The lead, in µs, that nodes without a counter add to the clock they report.
    pub(crate) fn lead_micros(&self) -> u64 {
        self.lead
    }

    /// The clock in µs plus the lead.
    fn ahead(&self) -> u64 {
        clock_micros().saturating_add(self.lead)
    }

    /// Whether each look reads the counters before its first round.
    pub(crate) fn reads_first(&self) -> bool {
        self.source == TokenSource::ReadFirst
    }

    /// The proposal of a first round, or `None` when the counters must be read first.
    pub(crate) fn first(&self, fence_key: &str) -> Option<u64> {
        match self.source {
            TokenSource::ReadFirst => None,
            TokenSource::Clock => {
                let hint = self.hints().get(fence_key).copied().unwrap_or(0);
                Some(hint.saturating_add(1).max(self.ahead()))
            }
        }
    }

    /// The proposal after learning that the highest counter is `max_fence`.
    pub(crate) fn above(&self, max_fence: u64) -> u64 {
        let next = max_fence.saturating_add(1);
        match self.source {
            TokenSource::ReadFirst => next,
            TokenSource::Clock => next.max(self.ahead()),
        }
    }

    /// Remembers that a node's counter for `fence_key` is at least `fence`.
    pub(crate) fn observe(&self, fence_key: &str, fence: u64) {
        if self.source == TokenSource::ReadFirst {
            return;
        }
        let mut hints = self.hints();
        match hints.get_mut(fence_key) {
            Some(hint) => *hint = (*hint).max(fence),
            None => {
                if hints.len() >= MAX_HINTS {
                    hints.clear();
                }
                hints.insert(fence_key.to_string(), fence);
            }
        }
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        dlock_core::backend::lock_unpoisoned(&self.hints)
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it). Only a guess that is
/// usually above every counter: a wrong clock costs a second round, never safety.
fn clock_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(micros).unwrap_or(0)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_proposals_start_above_what_was_seen() {
        let proposer = Proposer::new(TokenSource::Clock, Duration::from_millis(300));
        let now = clock_micros();
        assert!(proposer.first("k").unwrap() >= now + 300_000, "a proposal from the clock leads it");
        let ahead = now + 3_600_000_000;
        proposer.observe("k", ahead);
        assert_eq!(proposer.first("k"), Some(ahead + 1));
        proposer.observe("k", 5);
        assert_eq!(proposer.first("k"), Some(ahead + 1), "a lower counter never lowers the hint");
        assert!(proposer.above(7) >= now);
        assert_eq!(proposer.above(ahead), ahead + 1);
    }

    #[test]
    fn read_first_proposes_the_maximum_plus_one() {
        let proposer = Proposer::new(TokenSource::ReadFirst, Duration::from_millis(300));
        assert_eq!(proposer.first("k"), None);
        proposer.observe("k", 40);
        assert_eq!(proposer.above(41), 42);
    }

    #[test]
    fn hints_stay_bounded() {
        let proposer = Proposer::new(TokenSource::Clock, Duration::ZERO);
        for i in 0..MAX_HINTS * 2 {
            proposer.observe(&format!("k{i}"), i as u64);
        }
        assert!(proposer.hints().len() <= MAX_HINTS);
    }
}
