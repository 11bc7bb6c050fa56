//! The object-safe lock API every backend offers, and what it reports.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::LockError;
use crate::lease::{Lease, LeaseHandle};
use crate::name::{LockName, OwnerId};
use crate::options::LockOptions;
use crate::token::FencingToken;

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

/// Counters of one client, for metrics and for tests that prove nothing leaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Locks granted to this client.
    pub acquired: u64,
    /// Leases released (explicitly or by drop).
    pub released: u64,
    /// Successful renewals.
    pub renewals: u64,
    /// Renewals that failed with an error (and may have been retried).
    pub renewal_errors: u64,
    /// Leases whose lost signal fired.
    pub lost: u64,
    /// `Lease` values alive now.
    pub active_leases: u64,
    /// Leases the renewal scheduler is tracking now.
    pub scheduled: u64,
    /// Acquires blocked now, waiting for a holder to let go.
    pub waiting: u64,
    /// Acquires under way (including those finishing in the background after their caller
    /// gave up) and background releases of dropped leases.
    pub in_flight: u64,
}

/// A client of one lock backend. Object-safe: `Arc<dyn Locker>` is what
/// `dlock::connect` hands out.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let store = MemoryStore::new();
/// let locker = store.client();
/// let name = LockName::new("invoices/2026-11")?;
/// let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await?;
/// println!("holding {} with token {}", lease.name(), lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Locker: Send + Sync {
    /// Acquires `name`, waiting up to the options' wait bound (`Timeout` after it).
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Lease, LockError>;

    /// Acquires `name` if it is free now; never waits for a holder.
    async fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<Lease>, LockError>;

    /// Reports the holder of `name` and its queue, without changing anything.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError>;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// A short name of the backend, such as `"redis"` or `"memory"`.
    fn backend_name(&self) -> &'static str;

    /// This client's counters.
    fn stats(&self) -> ClientStats;
}

/// Runs `work` while holding `name`, and cancels it when the lease is lost.
///
/// The lock is released when the work finishes. If the lease is lost first, the work's
/// future is dropped and the result is `Err(LockError::Lost(reason))`; if the lease was
/// found lost at release, the work's result is discarded for the same error, since
/// the work did not run entirely under the lock.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{memory::MemoryStore, with_lock, LockName, LockOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let locker = MemoryStore::new().client();
/// let name = LockName::new("report")?;
/// let token = with_lock(&locker, &name, &LockOptions::new(), |lease| async move {
///     // ... work that must not run twice at once ...
///     lease.token()
/// })
/// .await?;
/// assert!(token.get() > 0);
/// # Ok(()) }
/// ```
pub async fn with_lock<L, F, Fut, T>(locker: &L, name: &LockName, opts: &LockOptions, work: F) -> Result<T, LockError>
where
    L: Locker + ?Sized,
    F: FnOnce(LeaseHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let lease = locker.acquire(name, opts).await?;
    let handle = lease.handle();
    let outcome = tokio::select! {
        biased;
        reason = handle.lost() => Err(reason),
        value = work(lease.handle()) => Ok(value),
    };
    match outcome {
        Err(reason) => {
            // Still owner-checked: if some part of the hold survived, free it.
            let _ = lease.release().await;
            Err(LockError::Lost(reason))
        }
        Ok(value) => match lease.release().await {
            Ok(()) => Ok(value),
            Err(LockError::NotHeld) => Err(LockError::Lost(handle.lost_reason().unwrap_or(crate::LostReason::Expired))),
            Err(other) => Err(other),
        },
    }
}

/// `with_lock` as a method of every [`Locker`].
pub trait LockerExt: Locker {
    /// See [`with_lock`].
    fn with_lock<'a, F, Fut, T>(
        &'a self,
        name: &'a LockName,
        opts: &'a LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T, LockError>> + Send + 'a
    where
        F: FnOnce(LeaseHandle) -> Fut + Send + 'a,
        Fut: Future<Output = T> + Send + 'a,
        T: Send + 'a,
    {
        with_lock(self, name, opts, work)
    }
}

impl<L: Locker + ?Sized> LockerExt for L {}
