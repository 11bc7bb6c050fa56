//! The client's sessions, pooled by ttl bucket and closed when idle.
//!
//! Every session costs a connection, its pings and heartbeats, and a monitor task; the
//! server also caps connections per client address. So leases do not get a session per
//! exact ttl: ttls are rounded *down* to a ladder of buckets a factor of √2 apart
//! (anchored at [`DEFAULT_TTL`]), and all leases of a bucket share its session. Rounding
//! down keeps the promise that a crashed holder's lock frees within its ttl; the lease's
//! validity follows the session's timeout (see `Backend::effective_ttl`). A hundred
//! different ttls between 2 s and 7 s open four sessions.
//!
//! A session that holds no node and that nothing refers to (no hold, no waiter) for
//! [`IDLE_LINGER`] is closed; the default bucket's session, which `inspect` uses, stays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::{LockError, DEFAULT_TTL};

use crate::session::Session;
use crate::settings::Settings;

/// How long an unused session stays open, in case a lease of its bucket comes again.
pub(crate) const IDLE_LINGER: Duration = Duration::from_secs(10);

/// How often the pool looks for idle sessions.
const REAP_EVERY: Duration = Duration::from_secs(2);

/// The bucket of a ttl: the largest rung of `DEFAULT_TTL · √2^k` (k any integer) not
/// above it, in whole milliseconds.
pub(crate) fn bucket_for(ttl: Duration) -> Duration {
    let ratio = ttl.as_secs_f64() / DEFAULT_TTL.as_secs_f64();
    if !(ratio.is_finite() && ratio > 0.0) {
        return ttl;
    }
    let k = (2.0 * ratio.log2()).floor();
    let rung = |k: f64| Duration::from_millis((DEFAULT_TTL.as_secs_f64() * 2f64.powf(k / 2.0) * 1000.0).round() as u64);
    // Rounding to milliseconds may lift the rung just above the ttl: take the one below.
    let bucket = if rung(k) <= ttl { rung(k) } else { rung(k - 1.0) };
    bucket.clamp(Duration::from_millis(1), ttl)
}

#[derive(Default)]
struct Slot {
    live: Mutex<Option<Arc<Session>>>,
    opening: tokio::sync::Mutex<()>,
    /// Since when the session has been unused.
    idle_since: Mutex<Option<Instant>>,
}

impl Slot {
    fn current(&self) -> Option<Arc<Session>> {
        lock_unpoisoned(&self.live).clone().filter(|s| !s.is_ended())
    }
}

type Slots = Mutex<HashMap<Duration, Arc<Slot>>>;

/// The sessions of one backend, by bucket.
pub(crate) struct SessionPool {
    settings: Arc<Settings>,
    slots: Arc<Slots>,
}

impl SessionPool {
    /// An empty pool, and its reaper task (which ends with the pool).
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        let slots = Arc::new(Slots::default());
        tokio::spawn(reap(Arc::downgrade(&slots)));
        SessionPool { settings, slots }
    }

    /// The session for leases of `ttl`: its bucket's, opened when there is none (or it
    /// ended).
    pub(crate) async fn get(&self, ttl: Duration) -> Result<Arc<Session>, LockError> {
        let bucket = bucket_for(ttl);
        let slot = lock_unpoisoned(&self.slots).entry(bucket).or_default().clone();
        if let Some(session) = slot.current() {
            return Ok(session);
        }
        let _opening = slot.opening.lock().await;
        if let Some(session) = slot.current() {
            return Ok(session);
        }
        let session = Session::open(self.settings.clone(), bucket).await?;
        *lock_unpoisoned(&slot.live) = Some(session.clone());
        *lock_unpoisoned(&slot.idle_since) = None;
        Ok(session)
    }

    /// The live sessions.
    pub(crate) fn live(&self) -> Vec<Arc<Session>> {
        lock_unpoisoned(&self.slots).values().filter_map(|slot| slot.current()).collect()
    }

    /// `(bucket, negotiated session timeout)` of each live session, in order.
    pub(crate) fn describe(&self) -> Vec<(Duration, Duration)> {
        let slots = lock_unpoisoned(&self.slots);
        let mut out: Vec<_> =
            slots.iter().filter_map(|(bucket, slot)| slot.current().map(|s| (*bucket, s.negotiated()))).collect();
        out.sort();
        out
    }
}

/// Closes the sessions that stayed unused for [`IDLE_LINGER`], until the pool is gone.
async fn reap(slots: Weak<Slots>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let Some(slots) = slots.upgrade() else { return };
        let now = Instant::now();
        let mut closed = Vec::new();
        for (bucket, slot) in lock_unpoisoned(&slots).iter() {
            if *bucket == DEFAULT_TTL {
                continue;
            }
            let mut live = lock_unpoisoned(&slot.live);
            let mut idle_since = lock_unpoisoned(&slot.idle_since);
            // Under the slot's lock nobody can take a new reference: only the slot's own
            // means no hold, no waiter and no task of the session's uses it.
            let unused = live.as_ref().is_some_and(|s| Arc::strong_count(s) == 1 && s.is_idle());
            if !unused {
                *idle_since = None;
                continue;
            }
            match *idle_since {
                Some(since) if now.duration_since(since) >= IDLE_LINGER => {
                    *idle_since = None;
                    closed.extend(live.take());
                }
                Some(_) => {}
                None => *idle_since = Some(now),
            }
        }
        for session in closed {
            tracing::debug!(negotiated = ?session.negotiated(), "closing an idle ZooKeeper session");
            // Dropping the last reference closes the session on the server.
            drop(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_down_on_a_ladder() {
        assert_eq!(bucket_for(DEFAULT_TTL), DEFAULT_TTL);
        assert_eq!(bucket_for(Duration::from_secs(60)), Duration::from_secs(60));
        assert_eq!(bucket_for(Duration::from_secs(59)), Duration::from_millis(42_426));
        assert_eq!(bucket_for(Duration::from_secs(15)), Duration::from_secs(15));
        assert_eq!(bucket_for(Duration::from_secs(3)), Duration::from_millis(2_652));
        for ms in [10, 11, 999, 1_000, 1_001, 29_999, 30_001, 86_400_000] {
            let ttl = Duration::from_millis(ms);
            let bucket = bucket_for(ttl);
            assert!(bucket <= ttl && bucket * 3 / 2 > ttl, "{ttl:?} -> {bucket:?}");
        }
        let buckets: std::collections::BTreeSet<_> =
            (0..100).map(|i| bucket_for(Duration::from_millis(2_000 + 50 * i))).collect();
        assert_eq!(buckets.len(), 4, "{buckets:?}");
    }
}
