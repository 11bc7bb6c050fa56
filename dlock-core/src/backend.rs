//! What a backend implements. [`Client`](crate::Client) turns a [`Backend`] into a
//! [`Locker`](crate::Locker) and supplies everything the backends share: validation, the
//! wait loop, cancellation safety, operation timeouts, the renewal scheduler, the lost
//! signal, tracing and statistics.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::{LockError, LostReason};
use crate::lease::LostSignal;
use crate::locker::{Capabilities, LockInfo};
use crate::name::{LockName, OwnerId};
use crate::options::LeaseMode;
use crate::token::FencingToken;

/// One acquisition as the backend sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The lock.
    pub name: LockName,
    /// Who acquires: the caller's explicit owner, or a fresh one per acquire.
    pub owner: OwnerId,
    /// The lease mode; its ttl is how long the backend keeps the hold without renewal.
    pub mode: LeaseMode,
    /// `false` for `try_acquire`: the backend need not queue the request.
    pub blocking: bool,
    /// Whether the caller demanded FIFO order.
    pub fair: bool,
}

impl Request {
    /// The ttl the backend keeps the hold for. Backends with coarser units round up,
    /// never down: the client's idea of validity must end before the backend's.
    pub fn ttl(&self) -> Duration {
        self.mode.ttl()
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug)]
pub enum Attempt<H> {
    /// The lock is ours.
    Granted {
        /// Whatever the backend needs to renew and release this hold.
        hold: H,
        /// The fencing token of the hold.
        token: FencingToken,
    },
    /// Someone else holds it (or is ahead in the queue).
    Busy {
        /// When to look again if no notification comes: the current hold's remaining
        /// ttl where the backend knows it. `None` means "only when notified" on
        /// notifying backends, and "after the backoff delay" on polling ones.
        retry_after: Option<Duration>,
    },
}

/// The outcome of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The hold now lasts at least the requested ttl from when the renewal was sent.
    Renewed,
    /// The hold is gone; the reason says how (`Expired` when nobody holds it,
    /// `Stolen` when someone else does).
    Lost(LostReason),
}

/// The outcome of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// One hold was released (the lock is free when the owner held it once).
    Released,
    /// The hold was not ours any more; nothing was changed.
    NotHeld,
}

/// The atomic operations of one backend, and its wake-up mechanism.
///
/// Every method must complete or fail on its own: the client wraps `attempt`, `renew`,
/// `release`, `inspect` and `abandon` in its operation timeout (turning an overrun into
/// [`LockError::Unavailable`]), but a backend that can bound them itself should, so
/// that a late reply is not taken for a lost one.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// What the backend keeps about a granted hold (a key and owner, a znode path).
    type Hold: Send + Sync + 'static;
    /// A waiter's place between attempts: a queue node, a subscription, or `()`.
    type Ticket: Send + 'static;

    /// A short name of the backend, such as `"redis"`.
    fn name(&self) -> &'static str;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// One attempt: grant the lock (free, or already held by `req.owner`), or report
    /// that it is busy. May create or update `ticket` so that later attempts and waits
    /// keep the waiter's place and its wake-up subscription.
    ///
    /// An attempt must be atomic: it either grants (and the hold exists on the backend)
    /// or it changes nothing but the ticket.
    async fn attempt(&self, req: &Request, ticket: &mut Option<Self::Ticket>)
        -> Result<Attempt<Self::Hold>, LockError>;

    /// Waits until the lock may have become free, or until `until`. Returning early is
    /// always allowed (the client just attempts again); missing a release is not.
    /// The default sleeps until `until`, which is right for backends that poll.
    async fn wait(&self, req: &Request, ticket: &mut Option<Self::Ticket>, until: Instant) -> Result<(), LockError> {
        let _ = (req, ticket);
        tokio::time::sleep_until(until.into()).await;
        Ok(())
    }

    /// The waiter gave up (timeout, `try_acquire`, cancellation): remove its place in the
    /// queue and anything it holds for waiting. Errors are logged, not returned.
    async fn abandon(&self, req: &Request, ticket: Self::Ticket) {
        let _ = (req, ticket);
    }

    /// Keeps the hold for `ttl` more from now (never shortening it), checking it is ours.
    async fn renew(&self, hold: &Self::Hold, ttl: Duration) -> Result<Renewal, LockError>;

    /// Releases one hold, checking it is ours, and wakes the next waiter.
    async fn release(&self, hold: &Self::Hold) -> Result<Release, LockError>;

    /// Reports the lock's holder and queue.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError>;

    /// The clock-drift allowance subtracted from a hold's validity: a lease of `ttl`
    /// granted (or renewed) by a request sent at `t` counts as valid until
    /// `t + ttl - clock_drift(ttl)`. The default is [`drift`](crate::drift) (1% + 2 ms);
    /// a backend may only make it larger.
    fn clock_drift(&self, ttl: Duration) -> Duration {
        crate::options::drift(ttl)
    }

    /// Called once for every granted hold, for backends that learn of a loss by a push
    /// (a session expiry event) rather than by renewing. The default ignores it.
    fn watch_hold(&self, hold: &Self::Hold, signal: LostSignal) {
        let _ = (hold, signal);
    }
}
