//! Per-client counters, and the snapshot of them a client reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) acquired: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) renewal_errors: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) scheduled: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) in_flight: AtomicU64,
}

impl Stats {
    pub(crate) fn snapshot(&self) -> ClientStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClientStats {
            acquired: get(&self.acquired),
            released: get(&self.released),
            renewals: get(&self.renewals),
            renewal_errors: get(&self.renewal_errors),
            lost: get(&self.lost),
            active_leases: get(&self.active),
            scheduled: get(&self.scheduled),
            waiting: get(&self.waiting),
            in_flight: get(&self.in_flight),
        }
    }
}

/// Counts one operation in flight for as long as it lives.
pub(crate) struct InFlight(Arc<Stats>);

impl InFlight {
    pub(crate) fn start(stats: &Arc<Stats>) -> Self {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(stats.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
