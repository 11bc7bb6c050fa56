//! The guard of a held lock, its validity clock and its lost signal.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{Release, Renewal};
use crate::error::{LockError, LostReason};
use crate::name::{LockName, OwnerId};
use crate::options::{drift, LeaseMode, MAX_DURATION, MIN_TTL};
use crate::renewal::Scheduler;
use crate::stats::{InFlight, Stats};
use crate::token::FencingToken;

/// The backend operations bound to one hold, with their timeouts and spans applied.
#[async_trait]
pub(crate) trait HoldOps: Send + Sync {
    async fn renew(&self, ttl: Duration) -> Result<Renewal, LockError>;
    async fn release(&self) -> Result<Release, LockError>;
    /// The backend's drift allowance for a hold of `ttl`.
    fn drift(&self, ttl: Duration) -> Duration;
}

struct Timing {
    ttl: Duration,
    valid_until: Instant,
}

/// What a lease, its handles and the renewal scheduler share.
pub(crate) struct LeaseCore {
    pub(crate) id: u64,
    name: LockName,
    owner: OwnerId,
    token: FencingToken,
    mode: LeaseMode,
    /// When the watchdog stops renewing, if `max_hold` was set.
    pub(crate) renew_deadline: Option<Instant>,
    extendable: bool,
    /// True while the renewal scheduler must keep this lease: from its grant until it is
    /// released, dropped or lost.
    tracked: AtomicBool,
    timing: Mutex<Timing>,
    lost: watch::Sender<Option<LostReason>>,
    pub(crate) hold: Arc<dyn HoldOps>,
    pub(crate) stats: Arc<Stats>,
}

pub(crate) struct LeaseSpec {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) owner: OwnerId,
    pub(crate) token: FencingToken,
    pub(crate) mode: LeaseMode,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) extendable: bool,
    /// When the granting attempt was sent: validity counts from there.
    pub(crate) attempt_started: Instant,
}

impl LeaseCore {
    pub(crate) fn new(spec: LeaseSpec, hold: Arc<dyn HoldOps>, stats: Arc<Stats>) -> Arc<Self> {
        let ttl = spec.mode.ttl();
        Arc::new(LeaseCore {
            id: spec.id,
            name: spec.name,
            owner: spec.owner,
            token: spec.token,
            mode: spec.mode,
            renew_deadline: spec.max_hold.map(|m| spec.attempt_started + m),
            extendable: spec.extendable,
            tracked: AtomicBool::new(true),
            timing: Mutex::new(Timing { ttl, valid_until: validity_end(&*hold, spec.attempt_started, ttl) }),
            lost: watch::channel(None).0,
            hold,
            stats,
        })
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.name
    }

    pub(crate) fn is_tracked(&self) -> bool {
        self.tracked.load(Ordering::Acquire)
    }

    /// Ends the scheduler's interest in this lease; true the first time only.
    pub(crate) fn untrack(&self) -> bool {
        let was = self.tracked.swap(false, Ordering::AcqRel);
        if was {
            self.stats.scheduled.fetch_sub(1, Ordering::Relaxed);
        }
        was
    }

    /// The first moment the scheduler must look at this lease: its first renewal, or the
    /// end of its validity for a lease that is not renewed.
    pub(crate) fn first_due(&self) -> Instant {
        let valid_until = self.valid_until();
        if self.is_watchdog() {
            valid_until.min(Instant::now() + self.ttl() / 3)
        } else {
            valid_until
        }
    }

    pub(crate) fn is_watchdog(&self) -> bool {
        self.mode.is_watchdog()
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.timing().ttl
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.timing().valid_until
    }

    /// A successful renewal sent at `sent` for `ttl`: validity never moves backwards,
    /// because backends never shorten a hold.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let mut timing = self.timing();
        timing.valid_until = timing.valid_until.max(validity_end(&*self.hold, sent, ttl));
    }

    fn timing(&self) -> std::sync::MutexGuard<'_, Timing> {
        // A poisoned lock only means a panic elsewhere; the data stays consistent.
        self.timing.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Fires the lost signal once; later calls keep the first reason.
    pub(crate) fn fire_lost(&self, reason: LostReason) {
        let fired = self.lost.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(reason);
                true
            } else {
                false
            }
        });
        if fired {
            self.untrack();
            self.stats.lost.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(lock = %self.name, token = %self.token, %reason, "lease lost");
        }
    }

    fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    async fn lost(&self) -> LostReason {
        let mut rx = self.lost.subscribe();
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(reason) => *reason,
            // The sender lives in `self`, so it cannot be dropped while we wait.
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

fn validity_end(hold: &dyn HoldOps, sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(hold.drift(ttl).max(drift(ttl)))
}

/// A held lock. Release it with [`Lease::release`]; dropping it stops its renewal at
/// once and releases it in the background.
///
/// The lease knows how long it is valid ([`Lease::remaining`], measured on the monotonic
/// clock from when the granting request was sent, minus a drift allowance), and fires
/// its lost signal ([`Lease::lost`]) when it stops being valid: the watchdog could not
/// renew it in time, the backend reported it gone, or a fixed lease ran out.
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
pub struct Lease {
    core: Arc<LeaseCore>,
    scheduler: Scheduler,
    finished: bool,
}

impl Lease {
    pub(crate) fn new(core: Arc<LeaseCore>, scheduler: Scheduler) -> Self {
        core.stats.acquired.fetch_add(1, Ordering::Relaxed);
        core.stats.active.fetch_add(1, Ordering::Relaxed);
        scheduler.register(core.clone());
        Lease { core, scheduler, finished: false }
    }

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
        *self.core.lost.borrow()
    }

    /// Completes when the lease is lost, with the reason. Never completes for a lease
    /// that stays valid until it is released.
    pub async fn lost(&self) -> LostReason {
        self.core.lost().await
    }

    /// A cheap, clonable view of this lease for tasks that need its token or lost signal.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle { core: self.core.clone() }
    }

    /// Keeps the hold for `ttl` from now (it is never shortened). For a watchdog lease the
    /// new ttl also applies to later renewals.
    ///
    /// Fails with `NotHeld` when the hold is no longer ours (and fires the lost signal),
    /// `Unsupported` on backends that cannot extend, `InvalidInput` for a bad ttl.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        if !self.core.extendable {
            return Err(LockError::Unsupported("extending a lease".into()));
        }
        if ttl < MIN_TTL || ttl > MAX_DURATION {
            return Err(LockError::InvalidInput(format!("ttl {ttl:?} is outside {MIN_TTL:?}..=365 days")));
        }
        if self.core.is_lost() {
            return Err(LockError::NotHeld);
        }
        let sent = Instant::now();
        match self.core.hold.renew(ttl).await? {
            Renewal::Renewed => {
                {
                    let mut timing = self.core.timing();
                    timing.ttl = ttl;
                }
                self.core.renewed(sent, ttl);
                Ok(())
            }
            Renewal::Lost(reason) => {
                self.core.fire_lost(reason);
                Err(LockError::NotHeld)
            }
        }
    }

    /// Releases the hold, checking on the backend that it is still ours.
    ///
    /// `Err(NotHeld)` means it was not ours any more (it expired or was taken), and
    /// nothing was changed on the backend.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.finish();
        let outcome = self.core.hold.release().await;
        self.core.stats.released.fetch_add(1, Ordering::Relaxed);
        match outcome? {
            Release::Released => Ok(()),
            Release::NotHeld => {
                self.core.fire_lost(LostReason::Expired);
                Err(LockError::NotHeld)
            }
        }
    }

    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.scheduler.deregister(&self.core);
            self.core.stats.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finish();
        let core = self.core.clone();
        // Without a runtime the hold cannot be released now; its ttl frees it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let in_flight = InFlight::start(&core.stats);
            runtime.spawn(async move {
                let _in_flight = in_flight;
                let outcome = core.hold.release().await;
                core.stats.released.fetch_add(1, Ordering::Relaxed);
                if let Err(err) = outcome {
                    tracing::debug!(lock = %core.name, %err, "background release failed; the ttl will free the lock");
                }
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.core.name)
            .field("owner", &self.core.owner)
            .field("token", &self.core.token)
            .field("mode", &self.core.mode)
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

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        self.core.token
    }

    /// See [`Lease::remaining`].
    pub fn remaining(&self) -> Duration {
        self.core.remaining()
    }

    /// Whether the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        *self.core.lost.borrow()
    }

    /// Completes when the lease is lost.
    pub async fn lost(&self) -> LostReason {
        self.core.lost().await
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle").field("name", &self.core.name).field("token", &self.core.token).finish()
    }
}

/// Lets a backend fire a lease's lost signal when it learns of the loss by a push
/// (a session expiry event), without keeping the lease alive.
#[derive(Clone)]
pub struct LostSignal {
    core: Weak<LeaseCore>,
}

impl LostSignal {
    pub(crate) fn new(core: &Arc<LeaseCore>) -> Self {
        LostSignal { core: Arc::downgrade(core) }
    }

    /// Fires the lost signal (the first reason wins).
    pub fn fire(&self, reason: LostReason) {
        if let Some(core) = self.core.upgrade() {
            core.fire_lost(reason);
        }
    }

    /// Whether the lease is gone or already lost, so the signal can be forgotten.
    pub fn is_closed(&self) -> bool {
        self.core.upgrade().is_none_or(|core| core.is_lost())
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal").field("closed", &self.is_closed()).finish()
    }
}
