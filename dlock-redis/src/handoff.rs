//! Hand-offs inside one client: a release names the client's own waiters that queue for
//! the lock, and when the head of the queue is one of them the release script grants the
//! lock to it on the spot (see the release script). The waiter then takes its grant from
//! here, without a wake-up message and without an acquire call of its own: a hand-off
//! between two tasks of one client costs the release's one round trip.
//!
//! A release whose reply was lost (an error, a reply to its second sending, which finds
//! the lock gone, or a call given up by a timeout or its caller) wakes every named waiter
//! to look again with an acquire, which answers a grant made for its request: else the
//! waiter handed the lock would find out only at its next place refresh, and the lock
//! would idle until then.
//!
//! A waiter that gives up while registered gives back whatever grant its request may have
//! (the give-back script), since a release may have handed it the lock meanwhile. A
//! grant handed to a waiter that got it by its own acquire already (the acquire answers a
//! grant made for its request) is the same grant, and is simply not taken twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dlock_core::backend::{lock_unpoisoned, Request};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::keys::{grant_field, owner_field, LockKeys};
use crate::scripts::Invocation;

/// The most waiters one release names.
const MAX_NAMED: usize = 16;

/// Each lock's registered waiters, by the lock's hold key.
type ByLock = Arc<Mutex<HashMap<String, Vec<Arc<Waiter>>>>>;

/// This client's waiters that queue for a lock, by the lock's hold key.
#[derive(Debug, Default)]
pub(crate) struct LocalWaiters {
    by_lock: ByLock,
}

/// One waiting request, as a release names it, and the grant a release handed it.
#[derive(Debug)]
pub(crate) struct Waiter {
    place: String,
    owner_field: String,
    grant_field: String,
    ttl_ms: u64,
    /// The token handed over, and when the release that granted it was sent.
    handed: Mutex<Option<(u64, Instant)>>,
    notify: Notify,
}

/// A waiter's registration; dropping it takes the waiter out.
#[derive(Debug)]
pub(crate) struct Entry {
    by_lock: ByLock,
    hold_key: String,
    waiter: Arc<Waiter>,
}

impl LocalWaiters {
    /// Registers `req`, which has a place in the queue of `keys`' lock, as a waiter a
    /// release by this client may hand the lock to.
    pub(crate) fn enter(&self, keys: &LockKeys, req: &Request, ttl_ms: u64) -> Entry {
        let fields = (owner_field(&req.owner), grant_field(&req.id));
        self.enter_place(&keys.hold, req.id.as_str(), fields, ttl_ms)
    }

    /// Registers the waiter of `place` (with its owner and grant fields and its ttl) on the
    /// lock whose hold key is `hold_key`.
    fn enter_place(&self, hold_key: &str, place: &str, fields: (String, String), ttl_ms: u64) -> Entry {
        let (owner_field, grant_field) = fields;
        let waiter = Arc::new(Waiter {
            place: place.to_string(),
            owner_field,
            grant_field,
            ttl_ms,
            handed: Mutex::new(None),
            notify: Notify::new(),
        });
        lock_unpoisoned(&self.by_lock).entry(hold_key.to_string()).or_default().push(waiter.clone());
        Entry { by_lock: self.by_lock.clone(), hold_key: hold_key.to_string(), waiter }
    }

    /// `call` (a release of the lock whose hold key is `hold_key`) naming this client's
    /// waiters of that lock.
    pub(crate) fn name_waiters(&self, hold_key: &str, mut call: Invocation) -> Invocation {
        let by_lock = lock_unpoisoned(&self.by_lock);
        for waiter in by_lock.get(hold_key).into_iter().flatten().take(MAX_NAMED) {
            call = call.arg(&waiter.place).arg(&waiter.owner_field).arg(&waiter.grant_field).arg(waiter.ttl_ms);
        }
        call
    }

    /// A guard over a release of the lock whose hold key is `hold_key` that names this
    /// client's waiters: unless [settled](Unsettled::settle), which the release does once
    /// a reply told it whom the lock went to, dropping it wakes every waiter of that lock
    /// to look again. A release whose reply was lost (an error, a second sending that
    /// found the lock gone, or the call given up by a timeout or its caller) may have
    /// handed one of them a grant that nobody will hand it.
    pub(crate) fn unsettled(&self, hold_key: &str) -> Unsettled {
        Unsettled { by_lock: Some(self.by_lock.clone()), hold_key: hold_key.to_string() }
    }

    /// Hands the grant of `token`, made by a release sent at `sent`, to the waiter of
    /// `place`, if it still waits (else it took the grant itself, or gives it back).
    pub(crate) fn hand(&self, hold_key: &str, place: &str, token: u64, sent: Instant) {
        let by_lock = lock_unpoisoned(&self.by_lock);
        if let Some(waiter) = by_lock.get(hold_key).into_iter().flatten().find(|w| w.place == place) {
            *lock_unpoisoned(&waiter.handed) = Some((token, sent));
            waiter.notify.notify_one();
        }
    }
}

/// See [`LocalWaiters::unsettled`].
#[derive(Debug)]
pub(crate) struct Unsettled {
    /// `None` once settled.
    by_lock: Option<ByLock>,
    hold_key: String,
}

impl Unsettled {
    /// The release learnt where the lock went: nobody needs waking.
    pub(crate) fn settle(mut self) {
        self.by_lock = None;
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(by_lock) = self.by_lock.take() {
            let by_lock = lock_unpoisoned(&by_lock);
            by_lock.get(&self.hold_key).into_iter().flatten().for_each(|waiter| waiter.notify.notify_one());
        }
    }
}

impl Entry {
    /// The grant a release handed this waiter, if one did: its token and when the
    /// release was sent.
    pub(crate) fn take_handed(&self) -> Option<(u64, Instant)> {
        lock_unpoisoned(&self.waiter.handed).take()
    }

    /// Resolves when a release hands this waiter a grant.
    pub(crate) async fn handed(&self) {
        self.waiter.notify.notified().await
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut by_lock = lock_unpoisoned(&self.by_lock);
        if let Some(waiters) = by_lock.get_mut(&self.hold_key) {
            waiters.retain(|w| !Arc::ptr_eq(w, &self.waiter));
            if waiters.is_empty() {
                by_lock.remove(&self.hold_key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fields(place: &str) -> (String, String) {
        (format!("owner:{place}"), format!("grant:{place}"))
    }

    /// A release whose reply was lost wakes the waiters it named at once, rather than
    /// leaving them to their next place refresh; one whose reply told where the lock went
    /// wakes nobody but the waiter handed it.
    #[tokio::test(start_paused = true)]
    async fn a_release_whose_reply_was_lost_wakes_its_waiters_at_once() {
        let local = LocalWaiters::default();
        let (first, second) = (
            local.enter_place("h", "c:1", fields("c:1"), 30_000),
            local.enter_place("h", "c:2", fields("c:2"), 30_000),
        );
        let other = local.enter_place("other", "c:3", fields("c:3"), 30_000);
        let soon = Duration::from_millis(1);

        local.unsettled("h").settle();
        assert!(tokio::time::timeout(soon, first.handed()).await.is_err(), "a settled release woke a waiter");

        drop(local.unsettled("h"));
        for entry in [&first, &second] {
            tokio::time::timeout(soon, entry.handed()).await.expect("the lost reply wakes every waiter it named");
            assert_eq!(entry.take_handed(), None, "woken to look again, not handed anything");
        }
        assert!(tokio::time::timeout(soon, other.handed()).await.is_err(), "a waiter of another lock was woken");

        let sent = Instant::now();
        local.hand("h", "c:2", 7, sent);
        tokio::time::timeout(soon, second.handed()).await.expect("the waiter handed the lock is woken");
        assert_eq!(second.take_handed(), Some((7, sent)));
    }
}
