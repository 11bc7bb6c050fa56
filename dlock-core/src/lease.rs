//! The guard of a held lock, and a clonable view of it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{LockError, LostReason};
use crate::name::{LockName, OwnerId};
use crate::options::{LeaseMode, MAX_DURATION, MIN_TTL};
use crate::outcome::{Release, Renewal};
use crate::renewal::Scheduler;
use crate::state::LeaseCore;
use crate::stats::InFlight;
use crate::stored::check_result;
use crate::token::FencingToken;

/// A held lock. Release it with [`Lease::release`]; dropping it stops its renewal at
/// once and releases it in the background.
///
/// The lease knows how long it is valid ([`remaining`](LeaseHandle::remaining), measured
/// on the monotonic clock from when the granting request was sent, minus a drift
/// allowance), and fires its lost signal ([`lost`](LeaseHandle::lost)) when it stops
/// being valid: the watchdog could not renew it in time, the backend reported it gone, or
/// a fixed lease ran out. Its read accessors are those of its [`LeaseHandle`].
///
/// A watchdog lease is renewed by a task on the tokio runtime that acquired it, so the
/// renewals need that runtime alive and running: on a current-thread runtime, they run
/// only while the thread is inside the runtime (awaiting); a thread that blocks outside
/// it (`std::thread::sleep`, synchronous I/O, a `block_on` that returned) renews nothing,
/// and the lease is lost once its ttl passes. A program that is not async should use the
/// `dlock` crate's `blocking` API, whose renewals run on a thread of their own.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let locker = MemoryStore::new().client();
/// let lease = locker.acquire(&LockName::new("stock/sku-1")?, &LockOptions::new()).await?;
/// assert!(lease.remaining() > Duration::from_secs(20));
/// tokio::select! {
///     reason = lease.lost() => println!("stop writing: {reason}"),
///     _ = tokio::time::sleep(Duration::from_millis(10)) => println!("work done"),
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a Lease releases the lock in the background"]
#[clippy::has_significant_drop]
pub struct Lease {
    handle: LeaseHandle,
    scheduler: Scheduler,
    finished: bool,
}

impl Lease {
    pub(crate) fn new(core: Arc<LeaseCore>, scheduler: Scheduler) -> Self {
        core.stats.lease_started();
        scheduler.register(core.clone());
        Lease { handle: LeaseHandle { core }, scheduler, finished: false }
    }

    /// A cheap, clonable view of this lease for tasks that need its token or lost signal.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Keeps the hold for `ttl` from now (it is never shortened). For a watchdog lease the
    /// new ttl also applies to later renewals.
    ///
    /// Fails with `NotHeld` when the hold is no longer ours: the backend says so (and the
    /// lost signal fires), or the lease was lost before the call or while the extension
    /// was under way (an extension that lands after the loss counts for nothing: nothing
    /// renews or watches the hold any more). `Unsupported` on backends that cannot extend,
    /// `InvalidInput` for a bad ttl.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        self.extend_unnamed(ttl).await.map_err(|err| err.named(&self.handle.core.name))
    }

    async fn extend_unnamed(&self, ttl: Duration) -> Result<(), LockError> {
        let core = &self.handle.core;
        if !core.extendable {
            return Err(LockError::Unsupported("extending a lease".into()));
        }
        if !(MIN_TTL..=MAX_DURATION).contains(&ttl) {
            return Err(LockError::InvalidInput(format!("ttl {ttl:?} is outside {MIN_TTL:?}..=365 days")));
        }
        if core.is_lost() {
            return Err(LockError::not_held());
        }
        let sent = Instant::now();
        match core.hold.renew(ttl).await? {
            // The scheduler gave the lease up while the extension was out: it no longer
            // renews or watches the hold, so the extension must not count.
            Renewal::Renewed if core.is_lost() => Err(LockError::not_held()),
            Renewal::Renewed => {
                core.extended(sent, ttl);
                Ok(())
            }
            Renewal::Lost(reason) => {
                core.fire_lost(reason);
                Err(LockError::not_held())
            }
        }
    }

    /// Stores `value` as this run's result under the lock's name, kept for `retention`
    /// ([`Locker::load_result`](crate::Locker::load_result) reads it). The backend checks,
    /// in the same atomic step, that this lease's hold is still the live one and that no
    /// result of a later holder is stored: a holder whose lease ran out while it was
    /// paused gets `NotHeld`, and the newer result stays. That check is the backend's,
    /// not this client's, so it holds however late the call arrives.
    ///
    /// `InvalidInput` for a value over [`MAX_RESULT_BYTES`](crate::MAX_RESULT_BYTES) or a
    /// retention outside 1 ms..=365 days; `Unsupported` on a backend without the
    /// `results` capability. [`idempotent`](crate::idempotent()) is built on it.
    pub async fn store_result(&self, value: &[u8], retention: Duration) -> Result<(), LockError> {
        check_result(value, retention)?;
        self.handle.core.hold.store_result(value, retention).await.map_err(|err| err.named(&self.handle.core.name))
    }

    /// Releases the hold, checking on the backend that it is still ours.
    ///
    /// `Err(NotHeld)` means it was not ours any more (it expired or was taken), and
    /// nothing of anyone else's was changed on the backend. A lease whose lost signal has
    /// fired answers `NotHeld` at once; what may remain of its hold on the backend is
    /// released in the background, owner-checked.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.finish();
        let core = self.handle.core.clone();
        Self::release_unnamed(&core).await.map_err(|err| err.named(&core.name))
    }

    async fn release_unnamed(core: &Arc<LeaseCore>) -> Result<(), LockError> {
        if core.is_lost() {
            release_in_background(core.clone());
            return Err(LockError::not_held());
        }
        let outcome = core.hold.release().await;
        core.stats.released();
        match outcome? {
            Release::Released => Ok(()),
            Release::NotHeld => {
                core.fire_lost(LostReason::Expired);
                Err(LockError::not_held())
            }
        }
    }

    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.scheduler.deregister(&self.handle.core);
            self.handle.core.stats.lease_ended(self.handle.core.granted_at.elapsed());
        }
    }
}

impl Deref for Lease {
    type Target = LeaseHandle;

    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

/// Releases a hold without waiting for the answer. Without a runtime the hold cannot be
/// released now; its ttl frees it.
fn release_in_background(core: Arc<LeaseCore>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let in_flight = InFlight::start(&core.stats);
        runtime.spawn(async move {
            let _in_flight = in_flight;
            let outcome = core.hold.release().await;
            core.stats.released();
            if let Err(err) = outcome {
                tracing::debug!(lock = %core.name, %err, "background release failed; the ttl will free the lock");
            }
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finish();
        release_in_background(self.handle.core.clone());
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = &self.handle.core;
        f.debug_struct("Lease")
            .field("name", &core.name)
            .field("owner", &core.owner)
            .field("token", &core.token)
            .field("mode", &core.mode)
            .field("remaining", &self.remaining())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

/// A clonable view of a [`Lease`]: its name, token, validity and lost signal. Holding a
/// handle does not keep the lock; the lease does.
#[derive(Clone)]
pub struct LeaseHandle {
    core: Arc<LeaseCore>,
}

impl LeaseHandle {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.core.name
    }

    /// The fencing token of this hold.
    pub fn token(&self) -> FencingToken {
        self.core.token
    }

    /// The owner identity the lock is held under.
    pub fn owner(&self) -> &OwnerId {
        &self.core.owner
    }

    /// The lease mode it was acquired with.
    pub fn mode(&self) -> LeaseMode {
        self.core.mode
    }

    /// How long the lease is certainly still valid (zero once lost). Conservative: it
    /// counts from when the granting request was sent and subtracts a drift allowance.
    pub fn remaining(&self) -> Duration {
        self.core.remaining()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.core.lost_reason()
    }

    /// Completes when the lease is lost, with the reason. Never completes for a lease
    /// that stays valid until it is released.
    pub async fn lost(&self) -> LostReason {
        self.core.lost().await
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle").field("name", &self.core.name).field("token", &self.core.token).finish()
    }
}
