//! A blocking API for programs that are not async: a [`BlockingLocker`] whose calls
//! block the calling thread, and a [`BlockingLease`] released when dropped.
//!
//! The locker owns a small tokio runtime on a thread of its own, and every lock operation
//! and every watchdog renewal runs there. So renewals go on while the calling thread does
//! blocking work (file copies, `std::thread::sleep`, a synchronous database driver): a
//! watchdog lease stays valid however long the caller blocks, until it is released,
//! dropped or lost. Wrapping the async API in a `block_on` of one's own does not give
//! that: a current-thread runtime runs the renewals only while something blocks on it.
//!
//! The calls refuse (with `InvalidInput`, never a panic) to run inside an async task,
//! where blocking would stall the task's runtime: use the async [`Locker`] there.
//!
//! ```
//! use std::time::Duration;
//! use dlock::blocking::BlockingLocker;
//! use dlock::{LockName, LockOptions};
//!
//! # fn main() -> Result<(), dlock::LockError> {
//! let locker = BlockingLocker::connect("memory://blocking-docs")?;
//! let name = LockName::new("nightly-report")?;
//! let lease = locker.acquire(&name, &LockOptions::watchdog(Duration::from_secs(10)))?;
//! // ... blocking work, passing lease.token() with every write it makes ...
//! assert!(!lease.is_lost());
//! lease.release()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{FencingToken, Lease, LockError, LockInfo, LockName, LockOptions, Locker, LostReason};
use tokio::runtime::{Handle, Runtime};

/// The runtime every blocking locker and lease of one [`BlockingLocker`] runs on. It is
/// shut down without waiting, so that dropping the last handle never blocks or panics,
/// whatever thread it happens on.
struct Owned(Option<Runtime>);

impl Owned {
    fn runtime(&self) -> &Runtime {
        // Only `drop` takes the runtime out.
        self.0.as_ref().unwrap_or_else(|| unreachable!("the runtime lives until the last handle goes"))
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Refuses a blocking call from inside an async task.
fn outside_async(what: &str) -> Result<(), LockError> {
    if Handle::try_current().is_ok() {
        return Err(LockError::InvalidInput(format!(
            "dlock::blocking::{what} was called inside an async runtime, where blocking would stall it: \
             use the async Locker there"
        )));
    }
    Ok(())
}

/// A lock client whose calls block the calling thread; see the [module](self) docs.
#[derive(Clone)]
pub struct BlockingLocker {
    locker: Arc<dyn Locker>,
    runtime: Arc<Owned>,
}

impl std::fmt::Debug for BlockingLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingLocker").field("backend", &self.locker.backend_name()).finish_non_exhaustive()
    }
}

impl BlockingLocker {
    /// Connects to the backend `url` names (as [`connect`](crate::connect) does) on a
    /// runtime of its own.
    ///
    /// Fails as `connect` does, and with `InvalidInput` inside an async runtime or when
    /// the runtime's thread cannot be started.
    pub fn connect(url: &str) -> Result<Self, LockError> {
        outside_async("BlockingLocker::connect")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| LockError::InvalidInput(format!("cannot start the blocking API's runtime: {e}")))?;
        let locker = runtime.block_on(crate::connect(url))?;
        Ok(BlockingLocker { locker, runtime: Arc::new(Owned(Some(runtime))) })
    }

    /// Acquires `name`, blocking for at most the options' wait bound (`Timeout` after).
    pub fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<BlockingLease, LockError> {
        outside_async("BlockingLocker::acquire")?;
        let lease = self.runtime.runtime().block_on(self.locker.acquire(name, opts))?;
        Ok(BlockingLease { lease: Some(lease), runtime: self.runtime.clone() })
    }

    /// Acquires `name` if it is free now; `None` if someone holds it.
    pub fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<BlockingLease>, LockError> {
        outside_async("BlockingLocker::try_acquire")?;
        let lease = self.runtime.runtime().block_on(self.locker.try_acquire(name, opts))?;
        Ok(lease.map(|lease| BlockingLease { lease: Some(lease), runtime: self.runtime.clone() }))
    }

    /// The lock's holder and queue, as [`Locker::inspect`] reports them.
    pub fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        outside_async("BlockingLocker::inspect")?;
        self.runtime.runtime().block_on(self.locker.inspect(name))
    }

    /// The async locker underneath, for code that has a runtime after all. Leases it
    /// grants renew on the runtime that acquired them, not on this locker's.
    pub fn locker(&self) -> &Arc<dyn Locker> {
        &self.locker
    }
}

/// A held lock, renewed on the locker's runtime while the caller blocks, and released
/// when dropped (blocking for at most the operation timeout; the ttl frees the lock if
/// the backend cannot be reached).
pub struct BlockingLease {
    lease: Option<Lease>,
    runtime: Arc<Owned>,
}

impl std::fmt::Debug for BlockingLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlockingLease").field(&self.lease).finish()
    }
}

impl BlockingLease {
    fn lease(&self) -> &Lease {
        // Only `release` and `drop` take the lease out, and both consume the value.
        self.lease.as_ref().unwrap_or_else(|| unreachable!("a blocking lease keeps its lease until it ends"))
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.lease().name()
    }

    /// The fencing token: pass it with every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.lease().token()
    }

    /// How long the lease is still valid by this process's clock (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.lease().remaining()
    }

    /// Whether the lease was lost (expired, stolen, its renewals failed).
    pub fn is_lost(&self) -> bool {
        self.lease().is_lost()
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease().lost_reason()
    }

    /// Extends the lease by `ttl` from now, blocking until the backend answers.
    pub fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        outside_async("BlockingLease::extend")?;
        self.runtime.runtime().block_on(self.lease().extend(ttl))
    }

    /// Releases the lock, blocking until the backend answers; `NotHeld` if it was no
    /// longer ours.
    pub fn release(mut self) -> Result<(), LockError> {
        outside_async("BlockingLease::release")?;
        let lease = self.lease.take().unwrap_or_else(|| unreachable!("a blocking lease keeps its lease until it ends"));
        self.runtime.runtime().block_on(lease.release())
    }
}

impl Drop for BlockingLease {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        if Handle::try_current().is_ok() {
            // Inside a runtime blocking is not allowed: release in the background on the
            // locker's runtime instead.
            let _entered = self.runtime.runtime().enter();
            drop(lease);
            return;
        }
        let _ = self.runtime.runtime().block_on(lease.release());
    }
}
