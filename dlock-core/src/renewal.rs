//! The renewal scheduler: one task and one timer for all the leases of a client.
//!
//! Each lease has two deadlines: when its watchdog should next renew (every ttl/3, until
//! `max_hold`), and when its validity ends. The scheduler sleeps until the earliest
//! deadline of all leases, starts the renewals that are due (concurrently, up to a
//! bound), and fires the lost signal of any lease whose validity ran out or whose
//! renewal the backend refused. A failed renewal is retried until the validity ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::Notify;

use crate::backend::Renewal;
use crate::error::{LockError, LostReason};
use crate::lease::LeaseCore;
use crate::stats::Stats;

/// Renewals in flight at once per client; more wait for a free slot.
const MAX_IN_FLIGHT: usize = 1024;

/// New leases the loop picks up at the latest when this many are waiting for it.
const DRAIN_AFTER: usize = 1024;

/// Finished leases the loop forgets at the latest when this many have accumulated.
const SWEEP_AFTER: usize = 1024;

/// The handle leases and the client use to reach the scheduler task, which is started on
/// the first registration (so that a client can be built outside a runtime).
///
/// Registering and deregistering a lease cost no message and usually no wake-up: a new
/// lease waits in a list until the loop next looks at its timers (it is woken only if
/// the new lease is due before that), and a finished lease only flips a flag that the
/// loop honours when it next meets the lease. Acquire and release stay free of
/// cross-task hand-offs.
#[derive(Clone)]
pub(crate) struct Scheduler {
    shared: Arc<Shared>,
}

struct Shared {
    incoming: Mutex<Vec<Arc<LeaseCore>>>,
    wake: Arc<Notify>,
    /// When the loop will next look, in nanoseconds since `epoch` (`u64::MAX`: no timer).
    next_look: AtomicU64,
    epoch: Instant,
    /// Leases finished since the loop last swept them out.
    finished: AtomicUsize,
    unstarted: Mutex<bool>,
    stats: Arc<Stats>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The client and every lease are gone: let the loop see it and end.
        self.wake.notify_one();
    }
}

impl Shared {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX - 1)
    }
}

impl Scheduler {
    pub(crate) fn new(stats: Arc<Stats>) -> Self {
        Scheduler {
            shared: Arc::new(Shared {
                incoming: Mutex::new(Vec::new()),
                wake: Arc::new(Notify::new()),
                next_look: AtomicU64::new(u64::MAX),
                epoch: Instant::now(),
                finished: AtomicUsize::new(0),
                unstarted: Mutex::new(true),
                stats,
            }),
        }
    }

    pub(crate) fn register(&self, core: Arc<LeaseCore>) {
        let shared = &self.shared;
        shared.stats.scheduled.fetch_add(1, Ordering::Relaxed);
        let due = shared.nanos(core.first_due());
        let waiting = {
            let mut incoming = shared.incoming.lock().unwrap_or_else(|p| p.into_inner());
            incoming.push(core);
            incoming.len()
        };
        self.start_if_needed();
        if waiting >= DRAIN_AFTER || due < shared.next_look.load(Ordering::SeqCst) {
            shared.wake.notify_one();
        }
    }

    /// The lease is released or dropped: it must not be renewed again.
    pub(crate) fn deregister(&self, core: &LeaseCore) {
        if core.untrack() && self.shared.finished.fetch_add(1, Ordering::Relaxed) + 1 >= SWEEP_AFTER {
            self.shared.wake.notify_one();
        }
    }

    fn start_if_needed(&self) {
        let mut unstarted = self.shared.unstarted.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut *unstarted) {
            let (weak, wake) = (Arc::downgrade(&self.shared), self.shared.wake.clone());
            tokio::spawn(RenewalLoop::new(self.shared.stats.clone()).run(weak, wake));
        }
    }
}

struct Entry {
    core: Arc<LeaseCore>,
    next_renew: Option<Instant>,
    renewing: bool,
    /// The reason to report if validity runs out while renewals keep failing.
    failing: Option<LostReason>,
    /// The one live timer of this entry; older heap items for it are stale.
    wake: Option<Instant>,
}

type Done = (u64, Instant, Duration, Result<Renewal, LockError>);

struct RenewalLoop {
    entries: HashMap<u64, Entry>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: FuturesUnordered<BoxFuture<'static, Done>>,
    queued: VecDeque<u64>,
    stats: Arc<Stats>,
}

impl RenewalLoop {
    fn new(stats: Arc<Stats>) -> Self {
        RenewalLoop {
            entries: HashMap::new(),
            timers: BinaryHeap::new(),
            in_flight: FuturesUnordered::new(),
            queued: VecDeque::new(),
            stats,
        }
    }

    async fn run(mut self, shared: Weak<Shared>, wake: Arc<Notify>) {
        loop {
            let next_timer = {
                // Every lease and the client are gone: nothing left to renew.
                let Some(shared) = shared.upgrade() else { return };
                let incoming = std::mem::take(&mut *shared.incoming.lock().unwrap_or_else(|p| p.into_inner()));
                for core in incoming {
                    self.register(core);
                }
                if shared.finished.load(Ordering::Relaxed) >= SWEEP_AFTER {
                    shared.finished.store(0, Ordering::Relaxed);
                    self.sweep();
                }
                let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
                shared.next_look.store(next_timer.map_or(u64::MAX, |at| shared.nanos(at)), Ordering::SeqCst);
                // A lease registered after the list was emptied but before `next_look` was
                // published may not have woken us: look again before sleeping.
                if !shared.incoming.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                    continue;
                }
                next_timer
            };
            tokio::select! {
                _ = wake.notified() => {}
                _ = sleep_until(next_timer), if next_timer.is_some() => self.fire_due_timers(),
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => self.renewal_done(done),
            }
        }
    }

    /// Forgets finished leases and their timers.
    fn sweep(&mut self) {
        self.entries.retain(|_, entry| entry.core.is_tracked());
        let entries = &self.entries;
        self.timers.retain(|Reverse((_, id))| entries.contains_key(id));
    }

    fn register(&mut self, core: Arc<LeaseCore>) {
        if !core.is_tracked() {
            return;
        }
        let id = core.id;
        let next_renew =
            if core.is_watchdog() { within_max_hold(&core, Instant::now() + core.ttl() / 3) } else { None };
        self.entries.insert(id, Entry { core, next_renew, renewing: false, failing: None, wake: None });
        self.evaluate(id, Instant::now());
    }

    fn fire_due_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let live = self.entries.get_mut(&id).is_some_and(|e| {
                if e.wake == Some(at) {
                    e.wake = None;
                    true
                } else {
                    false
                }
            });
            if live {
                self.evaluate(id, now);
            }
        }
    }

    /// Decides what a lease needs now: lost, a renewal, or a later look.
    fn evaluate(&mut self, id: u64, now: Instant) {
        let Some(entry) = self.entries.get_mut(&id) else { return };
        if !entry.core.is_tracked() {
            self.entries.remove(&id);
            return;
        }
        let valid_until = entry.core.valid_until();
        if now >= valid_until {
            // A renewal still out when the validity ends did not come back in time.
            let unanswered = entry.renewing.then_some(LostReason::BackendUnavailable);
            entry.core.fire_lost(entry.failing.or(unanswered).unwrap_or(LostReason::Expired));
            self.entries.remove(&id);
            return;
        }
        let mut start = false;
        if let Some(at) = entry.next_renew {
            if at <= now && !entry.renewing {
                entry.renewing = true;
                start = true;
            }
        }
        let wake = match entry.next_renew {
            Some(at) if !entry.renewing => at.min(valid_until),
            _ => valid_until,
        };
        if entry.wake.is_none_or(|current| wake < current) {
            entry.wake = Some(wake);
            self.timers.push(Reverse((wake, id)));
        }
        if start {
            if self.in_flight.len() < MAX_IN_FLIGHT {
                self.start_renewal(id);
            } else {
                self.queued.push_back(id);
            }
        }
    }

    fn start_renewal(&mut self, id: u64) {
        let Some(entry) = self.entries.get(&id) else { return };
        let core = entry.core.clone();
        let ttl = core.ttl();
        self.in_flight.push(
            async move {
                let sent = Instant::now();
                let outcome = core.hold.renew(ttl).await;
                (id, sent, ttl, outcome)
            }
            .boxed(),
        );
    }

    fn renewal_done(&mut self, (id, sent, ttl, outcome): Done) {
        let now = Instant::now();
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let Some(next) = self.queued.pop_front() else { break };
            self.start_renewal(next);
        }
        let Some(entry) = self.entries.get_mut(&id) else { return };
        entry.renewing = false;
        if !entry.core.is_tracked() {
            self.entries.remove(&id);
            return;
        }
        match outcome {
            Ok(Renewal::Renewed) => {
                self.stats.renewals.fetch_add(1, Ordering::Relaxed);
                entry.core.renewed(sent, ttl);
                entry.failing = None;
                entry.next_renew = within_max_hold(&entry.core, sent + entry.core.ttl() / 3);
            }
            Ok(Renewal::Lost(reason)) => {
                entry.core.fire_lost(reason);
                self.entries.remove(&id);
                return;
            }
            Err(err) => {
                self.stats.renewal_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(lock = %entry.core.name(), %err, "renewal failed; retrying until the lease runs out");
                entry.failing =
                    Some(if err.is_transient() { LostReason::BackendUnavailable } else { LostReason::RenewalFailed });
                let retry = now + (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(2));
                entry.next_renew = within_max_hold(&entry.core, retry);
            }
        }
        self.evaluate(id, now);
    }
}

/// The watchdog renews only until `max_hold` after the grant.
fn within_max_hold(core: &LeaseCore, at: Instant) -> Option<Instant> {
    match core.renew_deadline {
        Some(deadline) if at > deadline => None,
        _ => Some(at),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
