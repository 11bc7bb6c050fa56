//! What a backend can do, and what it reports about a lock.

use std::time::Duration;

use crate::name::OwnerId;
use crate::token::FencingToken;
#[cfg(doc)]
use crate::{Lease, LockError, Locker};

/// What a backend can do. Asking for something it cannot do fails with
/// [`LockError::Unsupported`]; nothing is silently weakened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// An owner that already holds a lock can acquire it again (explicit owners).
    pub reentrant: bool,
    /// Waiters are granted in request order (`LockOptions::fair(true)` is accepted).
    pub fifo: bool,
    /// Waiters are woken by a notification from the backend, not by polling.
    pub notify: bool,
    /// Holds expire by ttl on their own; without it the connection is the lease.
    pub ttl: bool,
    /// `Fixed(ttl)` leases are honoured.
    pub fixed: bool,
    /// [`Lease::extend`] works.
    pub extend: bool,
    /// [`Locker::inspect`] reports how many waiters are queued.
    pub queue_length: bool,
    /// Results can be stored under a lock's name ([`Lease::store_result`],
    /// [`Locker::load_result`]), which [`idempotent`](crate::idempotent()) execution needs.
    pub results: bool,
    /// Shared holds are granted beside each other (`LockOptions::read`): read-write locks.
    pub shared: bool,
    /// Semaphore permits are granted (`LockOptions::permits`).
    pub permits: bool,
}

impl Capabilities {
    /// Every capability.
    pub const ALL: Capabilities = Capabilities {
        reentrant: true,
        fifo: true,
        notify: true,
        ttl: true,
        fixed: true,
        extend: true,
        queue_length: true,
        results: true,
        shared: true,
        permits: true,
    };
}

/// The current holder of a lock, as [`Locker::inspect`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Who holds it.
    pub owner: OwnerId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// How many times the owner holds it (re-entrancy), when the backend counts.
    pub count: u32,
    /// How long the hold lasts without renewal, when the backend knows.
    pub remaining: Option<Duration>,
}

/// A snapshot of one lock.
///
/// ```
/// use dlock_core::LockInfo;
///
/// let free = LockInfo::default();
/// assert!(free.holder.is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder, or `None` when the lock is free.
    pub holder: Option<Holder>,
    /// How many acquirers are queued behind the holder, where the backend knows.
    pub waiters: Option<usize>,
}
