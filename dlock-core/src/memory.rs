//! An in-process backend: the model every other backend is checked against, and what
//! users take for unit tests.
//!
//! A [`MemoryStore`] is the "server": shared state behind an `Arc`. Each
//! [`MemoryStore::client`] is an independent client over it, with its own link that
//! tests can cut or blackhole to play a network fault. It has every capability:
//! fencing tokens from a per-name counter that survives release, re-entrancy by owner,
//! strict FIFO grants with wake-up by notification (no polling), expiry by ttl, renewal.
//!
//! What it keeps per name goes once the name is idle: a sweep ([`Locker::sweep`](crate::Locker::sweep), or a
//! client's background sweep) removes a name nobody holds or waits for, whose stored
//! result has expired and which has not been used for the store's keep time
//! ([`MemoryStore::keep_idle_names_for`], an hour by default). Its counter goes too: the
//! store remembers the highest token it ever removed, and a name's new counter starts
//! there, so tokens never go back.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let store = MemoryStore::new();
//! let (a, b) = (store.client(), store.client());
//! let name = LockName::new("jobs/nightly")?;
//! let held = a.acquire(&name, &LockOptions::new()).await?;
//! assert!(b.try_acquire(&name, &LockOptions::new()).await?.is_none());
//! held.release().await?;
//! assert!(b.try_acquire(&name, &LockOptions::new()).await?.is_some());
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{lock_unpoisoned, Attempt, Backend, Client, ClientConfig, Release, Renewal, Request, RequestId};
#[cfg(feature = "bench")]
use crate::baseline::RawBaseline;
use crate::error::{LockError, LostReason};
use crate::info::{Capabilities, Holder, LockInfo};
use crate::name::{LockName, OwnerId};
use crate::options::{HoldKind, DEFAULT_KEEP_IDLE};
use crate::stored::StoredResult;
use crate::sweep::Swept;
use crate::token::FencingToken;
pub use crate::wire::Fault;
use crate::wire::{Switch, Wire};

/// A client of a [`MemoryStore`].
pub type MemoryLocker = Client<MemoryBackend>;

/// The shared state of the in-process backend; clone it to share it.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

struct Shared {
    locks: Mutex<Names>,
    down: AtomicBool,
    next_ticket: AtomicU64,
    /// How long an idle name is kept before a sweep may remove it, in nanoseconds.
    keep_idle: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            locks: Mutex::default(),
            down: AtomicBool::new(false),
            next_ticket: AtomicU64::new(0),
            keep_idle: AtomicU64::new(DEFAULT_KEEP_IDLE.as_nanos() as u64),
        }
    }
}

/// The names of a store, and the highest token of the names a sweep removed: a name's
/// counter starts there when it comes back, so its tokens never go back.
#[derive(Default)]
struct Names {
    slots: HashMap<LockName, Slot>,
    floor: u64,
}

struct Slot {
    /// The holds, oldest first: one exclusive hold, or any number of compatible ones.
    holds: Vec<Hold>,
    /// The last token granted; it survives release so tokens never restart.
    fence: u64,
    queue: VecDeque<Waiter>,
    /// The result a run stored, apart from the hold: releases and evictions keep it.
    result: Option<Kept>,
    /// The last grant, renewal, release or wait on the name, for the sweep.
    used_at: Instant,
}

struct Kept {
    token: u64,
    value: Vec<u8>,
    expires_at: Instant,
}

struct Hold {
    owner: OwnerId,
    token: u64,
    kind: HoldKind,
    /// The acquire calls that hold it (more than one when the owner re-entered): a
    /// release or give-back takes back exactly its own.
    grants: Vec<RequestId>,
    expires_at: Instant,
}

struct Waiter {
    id: u64,
    /// The acquire call that queued, so that giving back a call whose reply was lost
    /// also gives up its place.
    request: RequestId,
    notify: Arc<Notify>,
    /// A waiter that stops coming back (its client died) loses its place after this.
    expires_at: Instant,
}

impl Names {
    /// The slot of `name`, made if missing with its counter at the floor, and marked used.
    fn slot(&mut self, name: &LockName, now: Instant) -> &mut Slot {
        let floor = self.floor;
        let slot = self.slots.entry(name.clone()).or_insert_with(|| Slot {
            holds: Vec::new(),
            fence: floor,
            queue: VecDeque::new(),
            result: None,
            used_at: now,
        });
        slot.used_at = now;
        slot
    }

    /// Removes expired results, and the names idle for `keep_idle` with nothing held,
    /// queued or kept, raising the floor to their counters.
    fn sweep(&mut self, now: Instant, keep_idle: Duration) -> Swept {
        let mut removed = 0u64;
        let mut floor = self.floor;
        self.slots.retain(|_, slot| {
            slot.tidy(now);
            if slot.result.as_ref().is_some_and(|kept| kept.expires_at <= now) {
                slot.result = None;
                removed += 1;
            }
            let idle = slot.holds.is_empty()
                && slot.queue.is_empty()
                && slot.result.is_none()
                && now.saturating_duration_since(slot.used_at) >= keep_idle;
            if idle {
                floor = floor.max(slot.fence);
                removed += 1;
            }
            !idle
        });
        self.floor = floor;
        Swept { removed, more: false }
    }
}

impl Slot {
    /// Drops expired holds and waiters that stopped refreshing their place.
    fn tidy(&mut self, now: Instant) {
        let held = self.holds.len();
        self.holds.retain(|h| h.expires_at > now);
        self.queue.retain(|w| w.expires_at > now);
        if self.holds.is_empty() || self.holds.len() < held {
            self.wake_head();
        }
    }

    fn wake_head(&self) {
        if let Some(head) = self.queue.front() {
            head.notify.notify_one();
        }
    }

    /// Whether a new hold of `kind` may be granted beside every current hold.
    fn admits(&self, kind: HoldKind) -> bool {
        kind.joins(self.holds.iter().map(|h| h.kind))
    }

    /// The newest hold: the one an exclusive lock has, and for shared holds the latest.
    fn holder_info(&self, now: Instant) -> Option<Holder> {
        self.holds.last().map(|h| Holder {
            owner: h.owner.clone(),
            token: FencingToken::new(h.token),
            count: u32::try_from(h.grants.len()).unwrap_or(u32::MAX),
            remaining: Some(h.expires_at.saturating_duration_since(now)),
        })
    }

    /// Takes back one grant of a hold if it is `owner`'s with `token` (any token when
    /// `None`) and the grant is among its grants; ends the hold at its last grant.
    fn take_back(&mut self, owner: &OwnerId, token: Option<u64>, grant: &RequestId) -> Release {
        let found = self
            .holds
            .iter()
            .position(|h| h.owner == *owner && token.is_none_or(|t| t == h.token) && h.grants.contains(grant));
        let Some(at) = found else { return Release::NotHeld };
        let hold = &mut self.holds[at];
        hold.grants.retain(|g| g != grant);
        if hold.grants.is_empty() {
            self.holds.remove(at);
            self.wake_head();
        }
        Release::Released
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new independent client with the default [`ClientConfig`].
    pub fn client(&self) -> MemoryLocker {
        Client::new(self.backend())
    }

    /// A new independent client with the given settings.
    pub fn client_with(&self, config: ClientConfig) -> MemoryLocker {
        Client::with_config(self.backend(), config)
    }

    /// A new backend handle (one "connection") for building a [`Client`] by hand.
    pub fn backend(&self) -> MemoryBackend {
        MemoryBackend { shared: self.shared.clone(), wire: Wire::new("memory link") }
    }

    /// Keeps an idle name (nobody holds or waits for it, no result is kept, no grant,
    /// renewal or release for this long) until the next sweep, instead of an hour.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock_core::memory::MemoryStore;
    ///
    /// let store = MemoryStore::new().keep_idle_names_for(Duration::from_secs(10));
    /// assert_eq!(store.names_kept(""), 0);
    /// ```
    pub fn keep_idle_names_for(self, keep: Duration) -> Self {
        let nanos = u64::try_from(keep.as_nanos()).unwrap_or(u64::MAX);
        self.shared.keep_idle.store(nanos, Ordering::SeqCst);
        self
    }

    /// How many names whose text starts with `prefix` the store keeps anything for (a
    /// counter, a hold, a queue, a result), as an operator counting keys would.
    pub fn names_kept(&self, prefix: &str) -> usize {
        self.shared.lock_state().slots.keys().filter(|name| name.as_str().starts_with(prefix)).count()
    }

    /// Deletes a lock's hold as an operator would, waking its first waiter. The fence
    /// counter stays.
    pub fn evict(&self, name: &LockName) {
        let mut locks = self.shared.lock_state();
        if let Some(slot) = locks.slots.get_mut(name) {
            slot.holds.clear();
            slot.wake_head();
        }
    }

    /// The raw baseline of this store for `dlock bench`: the grant and release steps
    /// called directly, without a client's machinery.
    #[cfg(feature = "bench")]
    pub fn raw_baseline(&self) -> MemoryBaseline {
        MemoryBaseline { backend: self.backend() }
    }

    /// Takes the whole store down (every call fails with `Unavailable`) or brings it back
    /// with its state, like a server that restarts on persisted data.
    pub fn set_available(&self, available: bool) {
        self.shared.down.store(!available, Ordering::SeqCst);
    }
}

impl Shared {
    fn keep_idle(&self) -> Duration {
        Duration::from_nanos(self.keep_idle.load(Ordering::SeqCst))
    }

    fn lock_state(&self) -> MutexGuard<'_, Names> {
        lock_unpoisoned(&self.locks)
    }
}

/// One client's connection to a [`MemoryStore`].
pub struct MemoryBackend {
    shared: Arc<Shared>,
    wire: Wire,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").field("fault", &self.wire.fault()).finish_non_exhaustive()
    }
}

/// A switch on one [`MemoryBackend`]'s link, to play network faults in tests.
pub type MemoryLink = Switch;

impl MemoryBackend {
    /// The switch on this backend's link.
    pub fn link(&self) -> MemoryLink {
        self.wire.switch()
    }

    /// Sends one request over the link: `op` runs on the store when the request gets
    /// through (even if the caller has gone by then), and its answer comes back as the
    /// link lets it.
    async fn call<T, F>(&self, op: F) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: FnOnce(&Shared) -> T + Send + 'static,
    {
        let shared = self.shared.clone();
        self.wire.carry(move || async move { shared.reachable().map(|()| op(&shared)) }).await
    }
}

impl Shared {
    fn reachable(&self) -> Result<(), LockError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LockError::unavailable("memory store is down"));
        }
        Ok(())
    }

    fn attempt(&self, req: &Request, ticket: &mut Option<MemoryTicket>) -> Attempt<MemoryHold> {
        let now = Instant::now();
        let ttl = req.ttl();
        let mut locks = self.lock_state();
        let slot = locks.slot(&req.name, now);
        slot.tidy(now);
        let granted = |token| Attempt::Granted {
            hold: MemoryHold {
                name: req.name.clone(),
                owner: req.owner.clone(),
                token,
                kind: req.kind,
                grant: req.id.clone(),
            },
            token: FencingToken::new(token),
        };

        // An owner re-enters only the kind it holds; another kind waits for its own hold.
        if let Some(hold) = slot.holds.iter_mut().find(|h| h.owner == req.owner && h.kind == req.kind) {
            hold.grants.push(req.id.clone());
            // A re-entrant grant never shortens the existing hold.
            hold.expires_at = hold.expires_at.max(now + ttl);
            let token = hold.token;
            drop_ticket(slot, ticket);
            return granted(token);
        }
        // Our turn when nobody queues ahead of us (our own place may have lapsed if we
        // were slow to come back; then an empty queue still means nobody is ahead).
        let our_turn = slot.queue.front().is_none_or(|head| ticket.as_ref().is_some_and(|t| t.id == head.id));
        if our_turn && slot.admits(req.kind) {
            slot.fence += 1;
            let token = slot.fence;
            slot.holds.push(Hold {
                owner: req.owner.clone(),
                token,
                kind: req.kind,
                grants: vec![req.id.clone()],
                expires_at: now + ttl,
            });
            drop_ticket(slot, ticket);
            if req.kind != HoldKind::Exclusive {
                // The next waiter may be a reader (or permit) that can join us.
                slot.wake_head();
            }
            return granted(token);
        }

        // Busy: keep (or take) a place in the queue, refreshed on every attempt. It lapses
        // on its own short clock, not the lease's, so a dead waiter blocks nobody for long.
        let place_expires = now + req.place_lapse();
        match ticket {
            Some(t) => match slot.queue.iter_mut().find(|w| w.id == t.id) {
                Some(w) => w.expires_at = place_expires,
                None => slot.queue.push_back(Waiter {
                    id: t.id,
                    request: req.id.clone(),
                    notify: t.notify.clone(),
                    expires_at: place_expires,
                }),
            },
            None if req.blocking => {
                let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
                let notify = Arc::new(Notify::new());
                slot.queue.push_back(Waiter {
                    id,
                    request: req.id.clone(),
                    notify: notify.clone(),
                    expires_at: place_expires,
                });
                *ticket = Some(MemoryTicket { id, notify });
            }
            None => {}
        }
        let retry_after = match slot.holds.iter().map(|h| h.expires_at).min() {
            Some(first_end) => first_end.saturating_duration_since(now),
            // Free, but someone is ahead of us: they were woken; if they never come
            // back, their place lapses by then.
            None => slot.queue.front().map_or(Duration::ZERO, |w| w.expires_at.saturating_duration_since(now)),
        };
        Attempt::Busy { retry_after: Some(retry_after) }
    }

    fn renew(&self, hold: &MemoryHold, ttl: Duration) -> Renewal {
        let now = Instant::now();
        let mut locks = self.lock_state();
        let Some(slot) = locks.slots.get_mut(&hold.name) else { return Renewal::Lost(LostReason::Expired) };
        slot.tidy(now);
        slot.used_at = now;
        if let Some(h) = slot.holds.iter_mut().find(|h| h.owner == hold.owner && h.token == hold.token) {
            h.expires_at = h.expires_at.max(now + ttl);
            return Renewal::Renewed;
        }
        // Someone holds what ours would have excluded: it was taken, not just let go.
        if slot.holds.iter().any(|h| h.token > hold.token && !hold.kind.compatible(h.kind)) {
            Renewal::Lost(LostReason::Stolen)
        } else {
            Renewal::Lost(LostReason::Expired)
        }
    }

    fn release(&self, hold: &MemoryHold) -> Release {
        let mut locks = self.lock_state();
        let Some(slot) = locks.slots.get_mut(&hold.name) else { return Release::NotHeld };
        let now = Instant::now();
        slot.tidy(now);
        slot.used_at = now;
        slot.take_back(&hold.owner, Some(hold.token), &hold.grant)
    }

    fn give_back(&self, req: &Request) {
        let mut locks = self.lock_state();
        let Some(slot) = locks.slots.get_mut(&req.name) else { return };
        slot.take_back(&req.owner, None, &req.id);
        if let Some(place) = slot.queue.iter().find(|w| w.request == req.id) {
            slot.leave_queue(place.id);
        }
    }

    fn store_result(&self, hold: &MemoryHold, value: Vec<u8>, retention: Duration) -> Result<(), LockError> {
        let now = Instant::now();
        let mut locks = self.lock_state();
        let Some(slot) = locks.slots.get_mut(&hold.name) else { return Err(LockError::not_held()) };
        slot.tidy(now);
        // The grant itself must be live, not only the owner's hold: a re-entrant lease that
        // was released stores nothing, though its owner still holds through another.
        let ours =
            slot.holds.iter().any(|h| h.owner == hold.owner && h.token == hold.token && h.grants.contains(&hold.grant));
        let newer_kept = slot.result.as_ref().is_some_and(|kept| kept.expires_at > now && kept.token >= hold.token);
        if !ours || newer_kept {
            return Err(LockError::not_held());
        }
        slot.result = Some(Kept { token: hold.token, value, expires_at: now + retention });
        Ok(())
    }

    fn load_result(&self, name: &LockName) -> Option<StoredResult> {
        let now = Instant::now();
        let locks = self.lock_state();
        let kept = locks.slots.get(name)?.result.as_ref().filter(|kept| kept.expires_at > now)?;
        Some(StoredResult { token: FencingToken::new(kept.token), value: kept.value.clone() })
    }

    fn inspect(&self, name: &LockName) -> LockInfo {
        let now = Instant::now();
        let mut locks = self.lock_state();
        match locks.slots.get_mut(name) {
            Some(slot) => {
                slot.tidy(now);
                LockInfo { holder: slot.holder_info(now), waiters: Some(slot.queue.len()) }
            }
            None => LockInfo { holder: None, waiters: Some(0) },
        }
    }
}

impl Slot {
    fn leave_queue(&mut self, ticket: u64) {
        let was_head = self.queue.front().is_some_and(|w| w.id == ticket);
        self.queue.retain(|w| w.id != ticket);
        if was_head {
            self.wake_head();
        }
    }
}

/// A granted hold of the memory backend.
#[derive(Debug, Clone)]
pub struct MemoryHold {
    name: LockName,
    owner: OwnerId,
    token: u64,
    kind: HoldKind,
    grant: RequestId,
}

/// A waiter's place in a lock's FIFO queue.
#[derive(Debug)]
pub struct MemoryTicket {
    id: u64,
    notify: Arc<Notify>,
}

#[async_trait]
impl Backend for MemoryBackend {
    type Hold = MemoryHold;
    type Ticket = MemoryTicket;

    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// Every waiter has a place in the name's one queue, whichever client it came from.
    fn grants_in_request_order(&self, _req: &Request) -> bool {
        true
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<MemoryTicket>,
    ) -> Result<Attempt<MemoryHold>, LockError> {
        // The ticket travels with the request and comes back with the reply; a reply that
        // never comes loses it, and the give-back finds the place by the request id.
        let (req_sent, mut carried) = (req.clone(), ticket.take());
        let (attempt, carried) = self
            .call(move |shared| {
                let attempt = shared.attempt(&req_sent, &mut carried);
                (attempt, carried)
            })
            .await?;
        *ticket = carried;
        Ok(attempt)
    }

    async fn wait(&self, req: &Request, ticket: &mut Option<MemoryTicket>, until: Instant) -> Result<(), LockError> {
        // Come back three times per place lapse so our place in the queue does not lapse.
        let until = until.min(Instant::now() + req.place_lapse() / 3);
        match ticket {
            Some(t) => {
                let _ = tokio::time::timeout_at(until, t.notify.notified()).await;
            }
            None => tokio::time::sleep_until(until).await,
        }
        Ok(())
    }

    async fn abandon(&self, req: &Request, ticket: MemoryTicket) {
        if let Some(slot) = self.shared.lock_state().slots.get_mut(&req.name) {
            slot.leave_queue(ticket.id);
        }
    }

    async fn give_back(&self, req: &Request, _ticket: Option<MemoryTicket>) {
        let req = req.clone();
        let _ = self.call(move |shared| shared.give_back(&req)).await;
    }

    async fn renew(&self, hold: &MemoryHold, ttl: Duration) -> Result<Renewal, LockError> {
        let hold = hold.clone();
        self.call(move |shared| shared.renew(&hold, ttl)).await
    }

    async fn release(&self, hold: &MemoryHold) -> Result<Release, LockError> {
        let hold = hold.clone();
        self.call(move |shared| shared.release(&hold)).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let name = name.clone();
        self.call(move |shared| shared.inspect(&name)).await
    }

    async fn store_result(
        &self,
        hold: &MemoryHold,
        _token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let (hold, value) = (hold.clone(), value.to_vec());
        self.call(move |shared| shared.store_result(&hold, value, retention)).await?
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let name = name.clone();
        self.call(move |shared| shared.load_result(&name)).await
    }

    async fn sweep(&self) -> Result<Swept, LockError> {
        self.call(|shared| shared.lock_state().sweep(Instant::now(), shared.keep_idle())).await
    }

    fn target(&self) -> String {
        format!("memory@{:p}", Arc::as_ptr(&self.shared))
    }
}

fn drop_ticket(slot: &mut Slot, ticket: &mut Option<MemoryTicket>) {
    if let Some(t) = ticket.take() {
        slot.queue.retain(|w| w.id != t.id);
    }
}

/// The memory backend's raw baseline (see [`RawBaseline`]).
#[cfg(feature = "bench")]
pub struct MemoryBaseline {
    backend: MemoryBackend,
}

#[cfg(feature = "bench")]
impl std::fmt::Debug for MemoryBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBaseline").finish_non_exhaustive()
    }
}

#[cfg(feature = "bench")]
#[async_trait]
impl RawBaseline for MemoryBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        self.acquire_release_kind(name, HoldKind::Exclusive).await
    }

    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        let req = Request { kind, ..baseline_request(name)? };
        match self.backend.attempt(&req, &mut None).await? {
            Attempt::Granted { hold, .. } => self.backend.release(&hold).await.map(drop),
            Attempt::Busy { .. } => Err(LockError::timeout()),
        }
    }

    /// The grant, the store of the value under it and the release, called directly.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        match self.backend.attempt(&baseline_request(name)?, &mut None).await? {
            Attempt::Granted { hold, token } => {
                self.backend.store_result(&hold, token, value, crate::options::MAX_DURATION).await?;
                self.backend.release(&hold).await.map(drop)
            }
            Attempt::Busy { .. } => Err(LockError::timeout()),
        }
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let req = baseline_request(name)?;
        let hold = MemoryHold {
            name: name.clone(),
            owner: req.owner.clone(),
            token: 0,
            kind: req.kind,
            grant: req.id.clone(),
        };
        self.backend.renew(&hold, req.ttl()).await.map(drop)
    }
}

#[cfg(feature = "bench")]
fn baseline_request(name: &LockName) -> Result<Request, LockError> {
    Ok(Request {
        name: name.clone(),
        owner: OwnerId::new("raw-baseline")?,
        id: RequestId::new("raw-baseline", 0),
        mode: crate::LeaseMode::default(),
        blocking: false,
        fair: false,
        kind: HoldKind::Exclusive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &LockName, owner: &OwnerId, n: u64) -> Request {
        Request {
            name: name.clone(),
            owner: owner.clone(),
            id: RequestId::new("test-client", n),
            mode: crate::LeaseMode::Watchdog { ttl: Duration::from_secs(30) },
            blocking: false,
            fair: false,
            kind: HoldKind::Exclusive,
        }
    }

    fn granted(attempt: Attempt<MemoryHold>) -> (MemoryHold, FencingToken) {
        match attempt {
            Attempt::Granted { hold, token } => (hold, token),
            Attempt::Busy { .. } => panic!("the owner's own lock was busy"),
        }
    }

    /// A re-entrant grant that was released stores nothing, though its owner still holds
    /// the lock through another grant with the same token.
    #[tokio::test]
    async fn a_released_reentrant_grant_stores_nothing() {
        let backend = MemoryStore::new().backend();
        let (name, owner) = (LockName::new("reentrant").unwrap(), OwnerId::new("owner").unwrap());
        let (first, token) = granted(backend.attempt(&request(&name, &owner, 1), &mut None).await.unwrap());
        let (second, again) = granted(backend.attempt(&request(&name, &owner, 2), &mut None).await.unwrap());
        assert_eq!(token, again);
        assert!(matches!(backend.release(&second).await.unwrap(), Release::Released));
        let refused = backend.store_result(&second, token, b"late", Duration::from_secs(60)).await;
        assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a released grant stored: {refused:?}");
        backend.store_result(&first, token, b"kept", Duration::from_secs(60)).await.unwrap();
    }

    /// A swept name comes back above the highest token the store removed, and a name in
    /// use, or with a live result, is never swept.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_keeps_tokens_rising_and_names_in_use() {
        let store = MemoryStore::new().keep_idle_names_for(Duration::from_secs(10));
        let backend = store.backend();
        let owner = OwnerId::new("owner").unwrap();
        let (idle, held) = (LockName::new("idle").unwrap(), LockName::new("held").unwrap());
        let mut last = FencingToken::new(0);
        for n in 0..3 {
            let (hold, token) = granted(backend.attempt(&request(&idle, &owner, n), &mut None).await.unwrap());
            backend.release(&hold).await.unwrap();
            last = token;
        }
        let (kept, _) = granted(backend.attempt(&request(&held, &owner, 10), &mut None).await.unwrap());
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(backend.sweep().await.unwrap().removed, 1, "only the idle name goes");
        assert_eq!(store.names_kept(""), 1);
        let (hold, token) = granted(backend.attempt(&request(&idle, &owner, 20), &mut None).await.unwrap());
        assert!(token > last, "{token} after a sweep, {last} before");
        backend.release(&hold).await.unwrap();
        backend.release(&kept).await.unwrap();
    }
}
