//! Per-client counters, and the snapshot of them a client reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::LostReason;

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
    /// Attempts sent to the backend by acquires (each a request; one per master on
    /// RedLock). Over `acquired`, what a grant costs the server: a herd of waiters that all
    /// wake on every release shows as many attempts per grant.
    pub attempts: u64,
}

/// The counters of one client, and its metrics.
///
/// Every change goes through a method here, which updates the client's own counter (for
/// [`ClientStats`]) and the matching metric (see the crate's "Metrics" section) in one
/// place.
#[derive(Debug)]
pub(crate) struct Stats {
    backend: &'static str,
    acquired: AtomicU64,
    released: AtomicU64,
    renewals: AtomicU64,
    renewal_errors: AtomicU64,
    lost: AtomicU64,
    active: AtomicU64,
    scheduled: AtomicU64,
    waiting: AtomicU64,
    in_flight: AtomicU64,
    attempts: AtomicU64,
}

/// How an acquire call ended, as the `outcome` label of `dlock_acquires_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    Busy,
    Timeout,
    Cancelled,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

fn reason_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::RenewalFailed => "renewal_failed",
        LostReason::SessionExpired => "session_expired",
        LostReason::Stolen => "stolen",
        LostReason::BackendUnavailable => "backend_unavailable",
    }
}

impl Stats {
    pub(crate) fn new(backend: &'static str) -> Self {
        let zero = || AtomicU64::new(0);
        Stats {
            backend,
            acquired: zero(),
            released: zero(),
            renewals: zero(),
            renewal_errors: zero(),
            lost: zero(),
            active: zero(),
            scheduled: zero(),
            waiting: zero(),
            in_flight: zero(),
            attempts: zero(),
        }
    }

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
            attempts: get(&self.attempts),
        }
    }

    /// An acquire sent an attempt to the backend.
    pub(crate) fn attempted(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// An acquire call ended.
    pub(crate) fn acquire_ended(&self, outcome: Outcome) {
        metrics::counter!("dlock_acquires_total", "backend" => self.backend, "outcome" => outcome.label()).increment(1);
    }

    /// The backend granted a hold `waited` after the call began; `handed_off` when the
    /// caller had found the lock held and waited for its holder to let go.
    pub(crate) fn granted(&self, waited: Duration, handed_off: bool) {
        metrics::histogram!("dlock_acquire_wait_seconds", "backend" => self.backend).record(waited.as_secs_f64());
        if handed_off {
            metrics::counter!("dlock_handoffs_total", "backend" => self.backend).increment(1);
        }
    }

    /// A lease came to life.
    pub(crate) fn lease_started(&self) {
        self.acquired.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("dlock_active_leases", "backend" => self.backend).increment(1.0);
    }

    /// A lease was released or dropped (its hold released, or left to its ttl).
    pub(crate) fn lease_ended(&self, held: Duration) {
        self.active.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("dlock_active_leases", "backend" => self.backend).decrement(1.0);
        metrics::histogram!("dlock_hold_seconds", "backend" => self.backend).record(held.as_secs_f64());
    }

    /// The backend answered a release.
    pub(crate) fn released(&self) {
        self.released.fetch_add(1, Ordering::Relaxed);
    }

    /// One call of the backend's `renew_many` came back after `took`.
    pub(crate) fn renewal_round(&self, took: Duration) {
        metrics::histogram!("dlock_renewal_seconds", "backend" => self.backend).record(took.as_secs_f64());
    }

    /// One lease's renewal succeeded (`true`) or failed with an error.
    pub(crate) fn renewal(&self, renewed: bool) {
        let (counter, outcome) = if renewed { (&self.renewals, "renewed") } else { (&self.renewal_errors, "error") };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("dlock_renewals_total", "backend" => self.backend, "outcome" => outcome).increment(1);
    }

    /// A lease's lost signal fired.
    pub(crate) fn lost(&self, reason: LostReason) {
        self.lost.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("dlock_leases_lost_total", "backend" => self.backend, "reason" => reason_label(reason))
            .increment(1);
    }

    /// The renewal scheduler began (`true`) or stopped (`false`) tracking a lease.
    pub(crate) fn tracking(&self, now: bool) {
        if now {
            self.scheduled.fetch_add(1, Ordering::Relaxed);
        } else {
            self.scheduled.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// An acquire began (`true`) or stopped (`false`) waiting for a holder to let go.
    pub(crate) fn waiting(&self, now: bool) {
        let gauge = metrics::gauge!("dlock_waiting", "backend" => self.backend);
        if now {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            gauge.increment(1.0);
        } else {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            gauge.decrement(1.0);
        }
    }
}

/// Counts one operation in flight for as long as it lives.
pub(crate) struct InFlight(Arc<Stats>);

impl InFlight {
    pub(crate) fn start(stats: &Arc<Stats>) -> Self {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("dlock_in_flight", "backend" => stats.backend).increment(1.0);
        InFlight(stats.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("dlock_in_flight", "backend" => self.0.backend).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use crate::memory::MemoryStore;
    use crate::{LockName, LockOptions, Locker, LostReason};

    /// Runs `work` on a current-thread runtime with a recorder of its own, and returns
    /// every metric it recorded as `name{label=value,...}`.
    fn recorded(work: impl std::future::Future<Output = ()>) -> HashMap<String, DebugValue> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
            runtime.unwrap().block_on(work);
        });
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let (_, key) = key.into_parts();
                let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
                labels.sort();
                (format!("{}{{{}}}", key.name(), labels.join(",")), value)
            })
            .collect()
    }

    fn counter(metrics: &HashMap<String, DebugValue>, key: &str) -> u64 {
        match metrics.get(key) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{key}: {other:?} in {:?}", metrics.keys()),
        }
    }

    fn samples(metrics: &HashMap<String, DebugValue>, key: &str) -> usize {
        match metrics.get(key) {
            Some(DebugValue::Histogram(values)) => values.len(),
            other => panic!("{key}: {other:?} in {:?}", metrics.keys()),
        }
    }

    #[test]
    fn acquires_hand_offs_holds_renewals_and_losses_are_recorded_by_backend() {
        let metrics = recorded(async {
            let store = MemoryStore::new();
            let (a, b) = (store.client(), store.client());
            let name = LockName::new("metrics").unwrap();
            let opts = LockOptions::watchdog(Duration::from_secs(3)).wait(Duration::from_secs(10));
            let held = a.acquire(&name, &opts).await.unwrap();
            assert!(b.try_acquire(&name, &opts).await.unwrap().is_none());
            let waiter = tokio::spawn(async move { b.acquire(&name, &opts).await });
            tokio::time::sleep(Duration::from_secs(2)).await;
            held.release().await.unwrap();
            let second = waiter.await.unwrap().unwrap();
            let short = LockOptions::fixed(Duration::from_secs(1));
            let fixed = a.acquire(&LockName::new("metrics/fixed").unwrap(), &short).await.unwrap();
            assert_eq!(fixed.lost().await, LostReason::Expired);
            second.release().await.unwrap();
        });
        let of = |name: &str, labels: &str| format!("{name}{{backend=memory{labels}}}");
        assert_eq!(counter(&metrics, &of("dlock_acquires_total", ",outcome=granted")), 3);
        assert_eq!(counter(&metrics, &of("dlock_acquires_total", ",outcome=busy")), 1);
        assert_eq!(counter(&metrics, &of("dlock_handoffs_total", "")), 1);
        assert_eq!(samples(&metrics, &of("dlock_acquire_wait_seconds", "")), 3);
        assert_eq!(samples(&metrics, &of("dlock_hold_seconds", "")), 3);
        assert!(counter(&metrics, &of("dlock_renewals_total", ",outcome=renewed")) >= 1);
        assert!(samples(&metrics, &of("dlock_renewal_seconds", "")) >= 1);
        assert_eq!(counter(&metrics, &of("dlock_leases_lost_total", ",reason=expired")), 1);
        assert!(matches!(metrics.get(&of("dlock_in_flight", "")), Some(DebugValue::Gauge(_))));
    }
}
