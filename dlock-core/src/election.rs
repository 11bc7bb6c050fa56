//! Leader election on any backend that stores results: a candidate leads while it holds
//! the election's lock, its term is the lease's fencing token, and its value is stored
//! under the lock's name with the token, so observers read who leads and since which term.

use std::time::Duration;

use futures::Stream;

use crate::error::{LockError, LostReason};
use crate::lease::Lease;
use crate::locker::Locker;
use crate::name::LockName;
use crate::options::{HoldKind, LockOptions, MAX_DURATION};
use crate::token::FencingToken;

/// How often an [`Observer`] looks by default.
pub const DEFAULT_OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// A leader as observers see it: the value it campaigned with and its term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader campaigned with (an address, a host name).
    pub value: Vec<u8>,
    /// Its term: the fencing token of its lease, higher for every later leader.
    pub term: FencingToken,
}

/// This candidate's leadership: it leads until it resigns or its lease is lost.
///
/// The lease's lost signal is the end of the term: it fires before another candidate can
/// be elected, as for any lock, so a leader that stops on it never overlaps the next one.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
}

impl Leadership {
    /// The term: strictly higher than every earlier leader's. Pass it with every write a
    /// leader makes so that the resource can refuse a deposed leader's writes.
    pub fn term(&self) -> FencingToken {
        self.lease.token()
    }

    /// The lease this leadership stands on (remaining validity, `is_lost`).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Resolves when the leadership is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Gives up leadership, so that the next candidate is elected at once.
    pub async fn resign(self) -> Result<(), LockError> {
        self.lease.release().await
    }
}

/// Blocks until this candidate leads `name`, then returns its leadership. `opts` is the
/// lease (a watchdog by default) and bounds the wait; `value` (at most
/// [`MAX_RESULT_BYTES`](crate::MAX_RESULT_BYTES)) is what observers see.
///
/// `Unsupported` on a backend without the `results` capability, where the value has
/// nowhere to live; `InvalidInput` for options that would let two candidates lead at
/// once (`read()`, `permits(n)`). A candidate whose lease is lost between its grant and
/// the store of its value gets `NotHeld` and leads nothing.
///
/// A store whose outcome is unknown (its reply was lost) is confirmed by reading the
/// value back, and stored again if it is not there, while the lease lasts: observers
/// report a candidate only once its value is stored under its term, so a candidate that
/// gives up has made sure first that its value is not stored, or has released its lease.
///
/// The value is kept for [`MAX_DURATION`] (a year), since a term may last that long: an
/// election's name keeps one small record for a year after its last term, then sweeps
/// remove it. Elections are few names, unlike idempotency keys.
///
/// ```
/// use dlock_core::{campaign, memory::MemoryStore, observe, LockName, LockOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let store = MemoryStore::new();
/// let name = LockName::new("scheduler")?;
/// let leading = campaign(&store.client(), &name, b"10.0.0.7:8080", &LockOptions::new()).await?;
///
/// let watcher = store.client();
/// let mut observer = observe(&watcher, &name);
/// let leader = observer.changed().await?.expect("a leader");
/// assert_eq!(leader.value, b"10.0.0.7:8080");
/// assert_eq!(leader.term, leading.term());
///
/// leading.resign().await?;
/// assert_eq!(observer.changed().await?, None);
/// # Ok(()) }
/// ```
pub async fn campaign<L: Locker + ?Sized>(
    locker: &L,
    name: &LockName,
    value: &[u8],
    opts: &LockOptions,
) -> Result<Leadership, LockError> {
    if opts.hold_kind() != HoldKind::Exclusive {
        return Err(LockError::InvalidInput(format!(
            "a campaign needs an exclusive lease: a {} hold would let several candidates lead at once",
            opts.hold_kind().as_str()
        )));
    }
    if !locker.capabilities().results {
        return Err(LockError::Unsupported("leader election (the backend stores no values)".into()));
    }
    crate::stored::check_result(value, MAX_DURATION)?;
    let lease = locker.acquire(name, opts).await?;
    match publish(locker, name, &lease, value).await {
        Ok(()) => Ok(Leadership { lease }),
        Err(err) => {
            // Owner-checked: frees the hold if it is still there, so that no observer
            // keeps seeing a value this candidate did not confirm.
            let _ = lease.release().await;
            Err(err)
        }
    }
}

/// Stores the candidate's value under its term. A store whose reply was lost may have
/// been applied: the value is read back, and stored again when it is not there, until
/// the lease runs out. `NotHeld` when the lease was lost first.
async fn publish<L: Locker + ?Sized>(
    locker: &L,
    name: &LockName,
    lease: &Lease,
    value: &[u8],
) -> Result<(), LockError> {
    // The value outlives any term; observers tell a stale one by its token.
    let mut last = match lease.store_result(value, MAX_DURATION).await {
        Ok(()) => return Ok(()),
        Err(err @ (LockError::NotHeld { .. } | LockError::InvalidInput(_) | LockError::Unsupported(_))) => {
            return Err(err)
        }
        Err(err) => err,
    };
    let mut pause = Duration::from_millis(10);
    while !lease.is_lost() && !lease.remaining().is_zero() {
        match locker.load_result(name).await {
            Ok(Some(stored)) if stored.token == lease.token() => return Ok(()),
            Ok(Some(stored)) if stored.token > lease.token() => return Err(LockError::not_held()),
            Ok(_) => match lease.store_result(value, MAX_DURATION).await {
                Ok(()) => return Ok(()),
                Err(LockError::NotHeld { .. }) => {
                    // Refused: either a store of ours landed after all (an equal token is
                    // never replaced), or the hold is gone. The next look tells which.
                    last = LockError::not_held();
                }
                Err(err) => last = err,
            },
            Err(err) => last = err,
        }
        tokio::time::sleep(pause.min(lease.remaining())).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Err(if lease.is_lost() { LockError::not_held() } else { last })
}

/// Watches who leads `name`; see [`Observer`].
pub fn observe<'a, L: Locker + ?Sized>(locker: &'a L, name: &LockName) -> Observer<'a, L> {
    Observer { locker, name: name.clone(), every: DEFAULT_OBSERVE_EVERY, last: None, highest: None }
}

/// Reports changes of leadership of one election, in term order.
///
/// It looks (the holder and the stored value, two reads) every
/// [`DEFAULT_OBSERVE_EVERY`] or as set by [`every`](Observer::every). Terms it reports
/// only increase, and the current leader is always reported; a term that begins and ends
/// between two looks is not seen, as with etcd's `Observe`.
#[derive(Debug)]
pub struct Observer<'a, L: Locker + ?Sized> {
    locker: &'a L,
    name: LockName,
    every: Duration,
    /// What was reported last: `None` before the first report.
    last: Option<Option<Leader>>,
    /// The highest term reported so far: a look showing a lower one is out of date.
    highest: Option<FencingToken>,
}

impl<'a, L: Locker + ?Sized> Observer<'a, L> {
    /// Looks this often (at least 1 ms).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(1));
        self
    }

    /// Who leads now (`None`: nobody), read from the backend. A candidate just elected
    /// is reported once its value is stored; until then this looks again.
    pub async fn current(&self) -> Result<Option<Leader>, LockError> {
        loop {
            if let Some(now) = self.look().await? {
                return Ok(now);
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// One look: `None` while the holder's value is not stored under its token yet
    /// (just elected, or lost its lease in between).
    async fn look(&self) -> Result<Option<Option<Leader>>, LockError> {
        if !self.locker.capabilities().results {
            return Err(LockError::Unsupported("leader election (the backend stores no values)".into()));
        }
        let info = self.locker.inspect(&self.name).await?;
        let Some(holder) = info.holder else { return Ok(Some(None)) };
        Ok(match self.locker.load_result(&self.name).await? {
            Some(stored) if stored.token == holder.token => {
                Some(Some(Leader { value: stored.value, term: stored.token }))
            }
            _ => None,
        })
    }

    /// The first call returns who leads now; each later call waits until that changes
    /// and returns the new state (`None` once nobody leads).
    pub async fn changed(&mut self) -> Result<Option<Leader>, LockError> {
        loop {
            if let Some(now) = self.look().await? {
                let older = matches!((&now, self.highest), (Some(now), Some(highest)) if now.term < highest);
                if self.last.as_ref() != Some(&now) && !older {
                    if let Some(leader) = &now {
                        self.highest = Some(leader.term);
                    }
                    self.last = Some(now.clone());
                    return Ok(now);
                }
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// The changes as a stream; it ends at the first error, after yielding it.
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>, LockError>> + 'a {
        futures::stream::unfold(Some(self), |state| async move {
            let mut observer = state?;
            let next = observer.changed().await;
            let more = next.is_ok().then_some(observer);
            Some((next, more))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::backend::lock_unpoisoned;
    use crate::info::{Capabilities, Holder, LockInfo};
    use crate::name::OwnerId;
    use crate::stats::ClientStats;
    use crate::stored::StoredResult;

    /// Answers each look (an inspect, then a load) with the next scripted term, `None`
    /// meaning nobody holds; acquiring is not needed by an observer.
    struct Looks(Mutex<VecDeque<Option<u64>>>, Mutex<Option<u64>>);

    #[async_trait]
    impl Locker for Looks {
        async fn acquire(&self, _: &LockName, _: &LockOptions) -> Result<Lease, LockError> {
            Err(LockError::Unsupported("scripted".into()))
        }
        async fn try_acquire(&self, _: &LockName, _: &LockOptions) -> Result<Option<Lease>, LockError> {
            Err(LockError::Unsupported("scripted".into()))
        }
        async fn inspect(&self, _: &LockName) -> Result<LockInfo, LockError> {
            let term = lock_unpoisoned(&self.0).pop_front().unwrap_or(None);
            *lock_unpoisoned(&self.1) = term;
            let holder = term.map(|t| Holder {
                owner: OwnerId::new(format!("o{t}")).expect("owner"),
                token: FencingToken::new(t),
                count: 1,
                remaining: None,
            });
            Ok(LockInfo { holder, waiters: None })
        }
        async fn load_result(&self, _: &LockName) -> Result<Option<StoredResult>, LockError> {
            let term = *lock_unpoisoned(&self.1);
            Ok(term.map(|t| StoredResult { token: FencingToken::new(t), value: vec![t as u8] }))
        }
        async fn sweep(&self) -> Result<crate::Swept, LockError> {
            Ok(crate::Swept::default())
        }
        fn target(&self) -> String {
            "scripted".into()
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::ALL
        }
        fn backend_name(&self) -> &'static str {
            "scripted"
        }
        fn stats(&self) -> ClientStats {
            ClientStats::default()
        }
    }

    /// A look that shows an ended term again, even after a look that found nobody, is
    /// out of date and is not reported: terms reported only increase.
    #[tokio::test(start_paused = true)]
    async fn a_term_lower_than_one_reported_is_never_reported_again() {
        let script = [Some(1), Some(2), None, Some(1), Some(2), Some(3), None];
        let looks = Looks(Mutex::new(script.into_iter().collect()), Mutex::new(None));
        let name = LockName::new("elect").expect("name");
        let mut observer = observe(&looks, &name).every(Duration::from_millis(1));
        let mut reported = Vec::new();
        for _ in 0..5 {
            reported.push(observer.changed().await.expect("observe").map(|l| l.term.get()));
        }
        assert_eq!(reported, [Some(1), Some(2), None, Some(2), Some(3)]);
    }
}
