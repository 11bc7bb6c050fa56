//! The object-safe lock API every backend offers, and what it reports.

use std::future::Future;

use async_trait::async_trait;

use crate::error::LockError;
use crate::info::{Capabilities, LockInfo};
use crate::lease::{Lease, LeaseHandle};
use crate::name::LockName;
use crate::options::LockOptions;
use crate::stats::ClientStats;
use crate::stored::StoredResult;
use crate::sweep::Swept;

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
    ///
    /// # Order
    ///
    /// Acquires of one client for one name are granted in the order they were called,
    /// whatever the backend: where it grants in any order, they queue in the client and
    /// only the first contends at the backend, so a task that releases and asks again
    /// goes behind its neighbours. Across clients the order is the backend's: FIFO where
    /// [`Capabilities::fifo`] and `fair(true)` (always on ZooKeeper and etcd), any order
    /// otherwise. An acquire with an explicit owner does not queue in the client (it may
    /// be re-entering a lock its owner holds).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes gives back whatever it got: no hold, queue
    /// entry or renewal is left behind. An attempt already sent when the future is dropped
    /// finishes in the background, and a grant it brings back is released there.
    ///
    /// # Ambiguous outcomes
    ///
    /// An attempt that fails without a clear answer (its reply lost, or cut off by the
    /// operation timeout) may have been applied by the backend; the client then gives
    /// back exactly the grant it may have made, in the background, so no orphan hold
    /// blocks the lock for a ttl and no re-entrant count stays raised.
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Lease, LockError>;

    /// Acquires `name` if it is free now; never waits for a holder.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Locker::acquire): dropping the future leaves nothing behind.
    async fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<Lease>, LockError>;

    /// Reports the holder of `name` and its queue, without changing anything.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError>;

    /// The result a run stored under `name` with [`Lease::store_result`], while its
    /// retention lasts. `Unsupported` on a backend without the `results` capability.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_core::LockError> {
    /// let locker = MemoryStore::new().client();
    /// let name = LockName::new("orders/42/ship")?;
    /// assert!(locker.load_result(&name).await?.is_none());
    ///
    /// let lease = locker.acquire(&name, &LockOptions::new()).await?;
    /// lease.store_result(b"tracking 1Z999", Duration::from_secs(3600)).await?;
    /// let token = lease.token();
    /// lease.release().await?;
    ///
    /// let stored = locker.load_result(&name).await?.expect("stored");
    /// assert_eq!((stored.token, stored.value.as_slice()), (token, &b"tracking 1Z999"[..]));
    /// # Ok(()) }
    /// ```
    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError>;

    /// Removes what the backend keeps for names nobody uses any more (results past their
    /// retention, counters of names idle past the backend's keep time, lapsed holds and
    /// places) and says how much went. The client does it in the background too, every
    /// [`ClientConfig::sweep_every`](crate::ClientConfig::sweep_every); a sweep never lets
    /// a name's next token fall below one already given.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_core::LockError> {
    /// let store = MemoryStore::new().keep_idle_names_for(Duration::from_millis(20));
    /// let locker = store.client();
    /// let name = LockName::new("reports/2026-12-04")?;
    /// let first = locker.acquire(&name, &LockOptions::new()).await?;
    /// let token = first.token();
    /// first.release().await?;
    ///
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// assert_eq!(locker.sweep().await?.removed, 1);
    /// let again = locker.acquire(&name, &LockOptions::new()).await?;
    /// assert!(again.token() > token, "tokens never go back, even for a swept name");
    /// # Ok(()) }
    /// ```
    async fn sweep(&self) -> Result<Swept, LockError>;

    /// Which server, and which namespace on it, this client's locks live on, without
    /// credentials (for example `redis://10.0.0.5:6379/0 prefix dlock`). Two clients with
    /// the same target share their locks.
    fn target(&self) -> String;

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
/// future is dropped and the result is `Err(LockError::lost(reason))`; if the lease was
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
            Err(LockError::lost(reason).named(name))
        }
        Ok(value) => match lease.release().await {
            Ok(()) => Ok(value),
            Err(LockError::NotHeld { .. }) => {
                Err(LockError::lost(handle.lost_reason().unwrap_or(crate::LostReason::Expired)).named(name))
            }
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
