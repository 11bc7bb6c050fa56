//! The renewal scheduler: one task and one timer for all the leases of a client.
//!
//! Each lease has two deadlines: when its watchdog should next renew (every ttl/3, until
//! `max_hold`), and when its validity ends. The scheduler sleeps until the earliest
//! deadline of all leases, starts the renewals that are due (concurrently, up to a
//! bound), and fires the lost signal of any lease whose validity ran out or whose
//! renewal the backend refused. A failed renewal is retried until the validity ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::mpsc;

use crate::backend::Renewal;
use crate::error::{LockError, LostReason};
use crate::lease::LeaseCore;
use crate::stats::Stats;

/// Renewals in flight at once per client; more wait for a free slot.
const MAX_IN_FLIGHT: usize = 1024;

enum Msg {
    Register(Arc<LeaseCore>),
    Deregister(u64),
}

/// What the scheduler task needs when it starts.
type Unstarted = (mpsc::UnboundedReceiver<Msg>, Arc<Stats>);

/// The handle leases and the client use to reach the scheduler task, which is started
/// on the first registration (so that a client can be built outside a runtime).
#[derive(Clone)]
pub(crate) struct Scheduler {
    tx: mpsc::UnboundedSender<Msg>,
    pending_start: Arc<Mutex<Option<Unstarted>>>,
}

impl Scheduler {
    pub(crate) fn new(stats: Arc<Stats>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Scheduler { tx, pending_start: Arc::new(Mutex::new(Some((rx, stats)))) }
    }

    pub(crate) fn register(&self, core: Arc<LeaseCore>) {
        self.start_if_needed();
        let _ = self.tx.send(Msg::Register(core));
    }

    pub(crate) fn deregister(&self, id: u64) {
        let _ = self.tx.send(Msg::Deregister(id));
    }

    fn start_if_needed(&self) {
        let mut slot = self.pending_start.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((rx, stats)) = slot.take() {
            tokio::spawn(RenewalLoop::new(stats).run(rx));
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

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Register(core)) => self.register(core),
                    Some(Msg::Deregister(id)) => self.remove(id),
                    // Every lease and the client are gone: nothing left to renew.
                    None => return,
                },
                _ = sleep_until(next_timer), if next_timer.is_some() => self.fire_due_timers(),
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => self.renewal_done(done),
            }
            self.stats.scheduled.store(self.entries.len() as u64, Ordering::Relaxed);
        }
    }

    fn register(&mut self, core: Arc<LeaseCore>) {
        let id = core.id;
        let next_renew =
            if core.is_watchdog() { within_max_hold(&core, Instant::now() + core.ttl() / 3) } else { None };
        self.entries.insert(id, Entry { core, next_renew, renewing: false, failing: None, wake: None });
        self.evaluate(id, Instant::now());
    }

    fn remove(&mut self, id: u64) {
        self.entries.remove(&id);
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
        if entry.core.is_lost() {
            self.entries.remove(&id);
            return;
        }
        let valid_until = entry.core.valid_until();
        if now >= valid_until {
            entry.core.fire_lost(entry.failing.unwrap_or(LostReason::Expired));
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
