//! What a lease, its handles and the renewal scheduler share: the validity clock, the
//! lost signal, and the backend operations bound to one hold.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::lock_unpoisoned;
use crate::error::{LockError, LostReason};
use crate::name::{LockName, OwnerId};
use crate::options::LeaseMode;
use crate::outcome::{Release, Renewal};
use crate::stats::Stats;
use crate::token::FencingToken;

/// The backend operations bound to one hold, with their timeouts and spans applied.
#[async_trait]
pub(crate) trait HoldOps: Send + Sync + Any {
    /// One renewal, bounded by the operation timeout (for `extend`).
    async fn renew(&self, ttl: Duration) -> Result<Renewal, LockError>;
    /// Renews the holds of `batch` (this client's leases, all due together, all asking
    /// for `ttl`) in one call of the backend, bounded by `deadline`; one answer per lease.
    async fn renew_batch(
        &self,
        batch: &[Arc<LeaseCore>],
        ttl: Duration,
        deadline: Instant,
    ) -> Vec<Result<Renewal, LockError>>;
    async fn release(&self) -> Result<Release, LockError>;
    /// Stores the run's result, checked against the hold on the backend, bounded by the
    /// operation timeout.
    async fn store_result(&self, value: &[u8], retention: Duration) -> Result<(), LockError>;
    /// Until when a grant or renewal sent at `sent` for `ttl` keeps the hold, on the
    /// client's clock (conservative), and the ttl the backend really applies.
    fn validity(&self, sent: Instant, ttl: Duration) -> (Instant, Duration);
}

struct Timing {
    /// The ttl asked of the backend on every renewal.
    ttl: Duration,
    /// The ttl the backend really applies (the renewal period is a third of it).
    effective: Duration,
    valid_until: Instant,
}

/// What a lease, its handles and the renewal scheduler share.
pub(crate) struct LeaseCore {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) owner: OwnerId,
    pub(crate) token: FencingToken,
    pub(crate) mode: LeaseMode,
    /// When the granting request was sent: the first renewal is timed from there.
    pub(crate) granted_at: Instant,
    /// When the watchdog stops renewing, if `max_hold` was set.
    pub(crate) renew_deadline: Option<Instant>,
    pub(crate) extendable: bool,
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
        let (valid_until, effective) = hold.validity(spec.attempt_started, ttl);
        Arc::new(LeaseCore {
            id: spec.id,
            name: spec.name,
            owner: spec.owner,
            token: spec.token,
            mode: spec.mode,
            granted_at: spec.attempt_started,
            renew_deadline: spec.max_hold.map(|m| spec.attempt_started + m),
            extendable: spec.extendable,
            tracked: AtomicBool::new(true),
            timing: Mutex::new(Timing { ttl, effective, valid_until }),
            lost: watch::channel(None).0,
            hold,
            stats,
        })
    }

    pub(crate) fn is_tracked(&self) -> bool {
        self.tracked.load(Ordering::Acquire)
    }

    /// Ends the scheduler's interest in this lease; true the first time only.
    pub(crate) fn untrack(&self) -> bool {
        let was = self.tracked.swap(false, Ordering::AcqRel);
        if was {
            self.stats.tracking(false);
        }
        was
    }

    pub(crate) fn is_watchdog(&self) -> bool {
        self.mode.is_watchdog()
    }

    /// The ttl asked of the backend on each renewal.
    pub(crate) fn ttl(&self) -> Duration {
        self.timing().ttl
    }

    /// How often the watchdog renews: a third of the ttl the backend applies.
    pub(crate) fn renew_period(&self) -> Duration {
        self.timing().effective / 3
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.timing().valid_until
    }

    /// A successful renewal (or extension) sent at `sent` for `ttl`: validity never moves
    /// backwards, because backends never shorten a hold.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let (until, effective) = self.hold.validity(sent, ttl);
        let mut timing = self.timing();
        if until > timing.valid_until {
            timing.valid_until = until;
            timing.effective = effective;
        }
    }

    /// An extension to `ttl` succeeded: later renewals ask for it too.
    pub(crate) fn extended(&self, sent: Instant, ttl: Duration) {
        self.timing().ttl = ttl;
        self.renewed(sent, ttl);
    }

    fn timing(&self) -> MutexGuard<'_, Timing> {
        lock_unpoisoned(&self.timing)
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
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
            self.stats.lost(reason);
            tracing::warn!(lock = %self.name, token = %self.token, %reason, "lease lost");
        }
    }

    pub(crate) fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    pub(crate) async fn lost(&self) -> LostReason {
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
