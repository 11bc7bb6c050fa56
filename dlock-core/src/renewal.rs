//! The renewal scheduler: one task and one timer for all the leases of a client.
//!
//! Each lease has two deadlines: when its watchdog should next renew (every third of its
//! ttl, counted from when the granting request was sent, until `max_hold`), and when its
//! validity ends. The scheduler sleeps until the earliest deadline of all leases, hands
//! the renewals that are due together to the backend in one call per ttl
//! ([`Backend::renew_many`](crate::backend::Backend::renew_many)), and fires the lost
//! signal of any lease whose validity ran out or whose renewal the backend refused.
//!
//! A renewal is bounded by the lease's validity, not by the operation timeout: a reply
//! that comes late but in time still counts. One that stays unanswered for an operation
//! timeout gets another renewal beside it (a hung request on a dead connection must not
//! cost the lease while a new one would get through), and a failed one is retried, until
//! the validity ends.
//!
//! The task is started by the first lease and started again by the next lease if it
//! ended (its runtime shut down, or it panicked); when it ends, every lease it kept fires
//! its lost signal, so a lease is never left unrenewed without knowing it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::lock_unpoisoned;
use crate::error::{LockError, LostReason};
use crate::outcome::Renewal;
use crate::state::LeaseCore;
use crate::stats::Stats;

/// Leases being renewed at once per client; more wait for a free slot.
const MAX_IN_FLIGHT: usize = 1024;

/// The most leases handed to the backend in one call.
const MAX_BATCH: usize = 512;

/// Renewals of one lease that may be out at once (each unanswered one gets another
/// beside it after an operation timeout).
const MAX_OUTSTANDING: u32 = 4;

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
    /// The loop's task, once started.
    running: Mutex<Option<JoinHandle<()>>>,
    /// How long a renewal may stay unanswered before another is sent beside it.
    hang_retry: Duration,
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
    /// A scheduler whose renewals get a second one beside them after `hang_retry`
    /// without an answer (the client's operation timeout).
    pub(crate) fn new(stats: Arc<Stats>, hang_retry: Duration) -> Self {
        Scheduler {
            shared: Arc::new(Shared {
                incoming: Mutex::new(Vec::new()),
                wake: Arc::new(Notify::new()),
                next_look: AtomicU64::new(u64::MAX),
                epoch: Instant::now(),
                finished: AtomicUsize::new(0),
                running: Mutex::new(None),
                hang_retry,
                stats,
            }),
        }
    }

    pub(crate) fn register(&self, core: Arc<LeaseCore>) {
        let shared = &self.shared;
        shared.stats.tracking(true);
        let due = shared.nanos(first_due(&core));
        let waiting = {
            let mut incoming = lock_unpoisoned(&shared.incoming);
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

    /// Starts the loop if it never ran or has ended (its runtime shut down, or it
    /// panicked): the leases it kept have fired their lost signals, new ones need a loop.
    fn start_if_needed(&self) {
        let mut running = lock_unpoisoned(&self.shared.running);
        if running.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (weak, wake) = (Arc::downgrade(&self.shared), self.shared.wake.clone());
                let renewal_loop = RenewalLoop::new(self.shared.stats.clone(), self.shared.hang_retry, weak.clone());
                // The loop is looking from scratch: whatever `next_look` said was the old loop's.
                self.shared.next_look.store(0, Ordering::SeqCst);
                *running = Some(runtime.spawn(renewal_loop.run(weak, wake)));
            }
            Err(_) => {
                // Nothing can renew without a runtime: the leases waiting must know.
                drop(running);
                for core in std::mem::take(&mut *lock_unpoisoned(&self.shared.incoming)) {
                    core.fire_lost(LostReason::RenewalFailed);
                }
            }
        }
    }
}

/// The first moment the scheduler must look at a lease: its first renewal (a third of its
/// ttl after the granting request was sent), or the end of its validity.
fn first_due(core: &LeaseCore) -> Instant {
    let valid_until = core.valid_until();
    if core.is_watchdog() {
        valid_until.min(core.granted_at + core.renew_period())
    } else {
        valid_until
    }
}

struct Entry {
    core: Arc<LeaseCore>,
    /// When to send the next renewal (`None`: never again, past `max_hold` or `Fixed`).
    next_renew: Option<Instant>,
    /// Renewals sent and not yet answered.
    outstanding: u32,
    /// When the latest successful renewal was sent: answers to older ones change nothing.
    renewed_from: Instant,
    /// The reason to report if validity runs out while renewals keep failing.
    failing: Option<LostReason>,
    /// The one live timer of this entry; older heap items for it are stale.
    wake: Option<Instant>,
}

/// The leases of one backend call, when it was sent, the ttl asked, and the answers.
type Done = (Vec<u64>, Instant, Duration, Vec<Result<Renewal, LockError>>);

struct RenewalLoop {
    entries: HashMap<u64, Entry>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: FuturesUnordered<BoxFuture<'static, Done>>,
    /// Leases in the calls of `in_flight`.
    in_flight_leases: usize,
    /// Leases due for a renewal, waiting for a slot.
    queued: VecDeque<u64>,
    stats: Arc<Stats>,
    hang_retry: Duration,
    shared: Weak<Shared>,
}

impl RenewalLoop {
    fn new(stats: Arc<Stats>, hang_retry: Duration, shared: Weak<Shared>) -> Self {
        RenewalLoop {
            entries: HashMap::new(),
            timers: BinaryHeap::new(),
            in_flight: FuturesUnordered::new(),
            in_flight_leases: 0,
            queued: VecDeque::new(),
            stats,
            hang_retry,
            shared,
        }
    }

    async fn run(mut self, shared: Weak<Shared>, wake: Arc<Notify>) {
        loop {
            let next_timer = {
                // Every lease and the client are gone: nothing left to renew.
                let Some(shared) = shared.upgrade() else { return };
                let incoming = std::mem::take(&mut *lock_unpoisoned(&shared.incoming));
                let now = Instant::now();
                for core in incoming {
                    self.register(core, now);
                }
                if shared.finished.load(Ordering::Relaxed) >= SWEEP_AFTER {
                    shared.finished.store(0, Ordering::Relaxed);
                    self.sweep();
                }
                self.start_queued();
                let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
                shared.next_look.store(next_timer.map_or(u64::MAX, |at| shared.nanos(at)), Ordering::SeqCst);
                // A lease registered after the list was emptied but before `next_look` was
                // published may not have woken us: look again before sleeping.
                if !lock_unpoisoned(&shared.incoming).is_empty() {
                    continue;
                }
                next_timer
            };
            tokio::select! {
                _ = wake.notified() => {}
                _ = sleep_until(next_timer), if next_timer.is_some() => self.fire_due_timers(),
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => self.renewals_done(done),
            }
        }
    }

    /// Forgets finished leases and their timers.
    fn sweep(&mut self) {
        self.entries.retain(|_, entry| entry.core.is_tracked());
        let entries = &self.entries;
        self.timers.retain(|Reverse((_, id))| entries.contains_key(id));
        self.queued.retain(|id| entries.contains_key(id));
    }

    fn register(&mut self, core: Arc<LeaseCore>, now: Instant) {
        if !core.is_tracked() {
            return;
        }
        let id = core.id;
        let next_renew =
            if core.is_watchdog() { within_max_hold(&core, core.granted_at + core.renew_period()) } else { None };
        let renewed_from = core.granted_at;
        self.entries.insert(id, Entry { core, next_renew, outstanding: 0, renewed_from, failing: None, wake: None });
        self.evaluate(id, now);
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
        self.start_queued();
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
            let unanswered = (entry.outstanding > 0).then_some(LostReason::BackendUnavailable);
            entry.core.fire_lost(entry.failing.or(unanswered).unwrap_or(LostReason::Expired));
            self.entries.remove(&id);
            return;
        }
        if let Some(at) = entry.next_renew {
            if at <= now {
                if entry.outstanding < MAX_OUTSTANDING {
                    entry.outstanding += 1;
                    self.queued.push_back(id);
                    // The next look is set when this renewal actually goes out.
                    entry.next_renew = None;
                } else {
                    entry.next_renew = within_max_hold(&entry.core, now + self.hang_retry);
                }
            }
        }
        self.arm(id);
    }

    /// Sets the entry's timer to its next renewal or the end of its validity.
    fn arm(&mut self, id: u64) {
        let Some(entry) = self.entries.get_mut(&id) else { return };
        let valid_until = entry.core.valid_until();
        let wake = entry.next_renew.map_or(valid_until, |at| at.min(valid_until));
        if entry.wake.is_none_or(|current| wake < current) {
            entry.wake = Some(wake);
            self.timers.push(Reverse((wake, id)));
        }
    }

    /// Starts the queued renewals while slots are free, one backend call per ttl.
    fn start_queued(&mut self) {
        while self.in_flight_leases < MAX_IN_FLIGHT && !self.queued.is_empty() {
            let room = (MAX_IN_FLIGHT - self.in_flight_leases).min(MAX_BATCH);
            let now = Instant::now();
            let mut by_ttl: HashMap<Duration, Vec<Arc<LeaseCore>>> = HashMap::new();
            let mut taken = 0;
            while taken < room {
                let Some(id) = self.queued.pop_front() else { break };
                match self.entries.get_mut(&id) {
                    Some(entry) if entry.core.is_tracked() => {
                        by_ttl.entry(entry.core.ttl()).or_default().push(entry.core.clone());
                        // If this renewal is not answered in time, send another beside it.
                        entry.next_renew = within_max_hold(&entry.core, now + self.hang_retry);
                        self.arm(id);
                        taken += 1;
                    }
                    _ => {
                        self.entries.remove(&id);
                    }
                }
            }
            for (ttl, batch) in by_ttl {
                self.start_batch(batch, ttl);
            }
        }
    }

    fn start_batch(&mut self, batch: Vec<Arc<LeaseCore>>, ttl: Duration) {
        let Some(first) = batch.first() else { return };
        let hold = first.hold.clone();
        let ids: Vec<u64> = batch.iter().map(|core| core.id).collect();
        // Past the earliest validity in the batch, an answer is too late for that lease.
        let deadline = batch.iter().map(|core| core.valid_until()).min().unwrap_or_else(Instant::now);
        self.in_flight_leases += batch.len();
        self.in_flight.push(
            async move {
                let sent = Instant::now();
                let renewed = AssertUnwindSafe(hold.renew_batch(&batch, ttl, deadline)).catch_unwind().await;
                let answers = renewed.unwrap_or_else(|_| {
                    tracing::error!("a renewal panicked; its leases count it as failed");
                    batch.iter().map(|_| Err(LockError::Backend("the backend's renewal panicked".into()))).collect()
                });
                (ids, sent, ttl, answers)
            }
            .boxed(),
        );
    }

    fn renewals_done(&mut self, (ids, sent, ttl, answers): Done) {
        self.in_flight_leases -= ids.len();
        let now = Instant::now();
        self.stats.renewal_round(now - sent);
        let mut answers = answers.into_iter();
        for id in ids {
            let answer = answers
                .next()
                .unwrap_or_else(|| Err(LockError::Backend("the backend answered fewer renewals than asked".into())));
            self.renewal_done(id, sent, ttl, answer, now);
        }
        self.start_queued();
    }

    fn renewal_done(
        &mut self,
        id: u64,
        sent: Instant,
        ttl: Duration,
        answer: Result<Renewal, LockError>,
        now: Instant,
    ) {
        let Some(entry) = self.entries.get_mut(&id) else { return };
        entry.outstanding = entry.outstanding.saturating_sub(1);
        if !entry.core.is_tracked() {
            self.entries.remove(&id);
            return;
        }
        match answer {
            Ok(Renewal::Renewed) => {
                self.stats.renewal(true);
                entry.core.renewed(sent, ttl);
                if sent >= entry.renewed_from {
                    entry.renewed_from = sent;
                    entry.failing = None;
                    entry.next_renew = within_max_hold(&entry.core, sent + entry.core.renew_period());
                }
            }
            Ok(Renewal::Lost(reason)) => {
                // The backend checked the hold when it applied this renewal and found it
                // gone; a renewal never brings a hold back, so this is final whatever the
                // order in which answers arrive.
                entry.core.fire_lost(reason);
                self.entries.remove(&id);
                return;
            }
            Err(err) => {
                self.stats.renewal(false);
                // A renewal older than the latest success says nothing about the hold now.
                if sent >= entry.renewed_from {
                    tracing::debug!(lock = %entry.core.name, %err, "renewal failed; retrying until the lease runs out");
                    entry.failing = Some(if err.is_transient() {
                        LostReason::BackendUnavailable
                    } else {
                        LostReason::RenewalFailed
                    });
                    let retry = now + (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(2));
                    let sooner = entry.next_renew.map_or(retry, |at| at.min(retry));
                    entry.next_renew = within_max_hold(&entry.core, sooner);
                }
            }
        }
        self.evaluate(id, now);
    }
}

impl Drop for RenewalLoop {
    /// The loop ends when its client and leases are gone (then nothing is tracked), or
    /// when its runtime shuts down or it panics: then every lease it kept, and every
    /// lease still waiting to be picked up, learns that nobody renews it any more.
    fn drop(&mut self) {
        let waiting = self.shared.upgrade().map(|shared| std::mem::take(&mut *lock_unpoisoned(&shared.incoming)));
        let kept = self.entries.drain().map(|(_, entry)| entry.core);
        for core in kept.chain(waiting.into_iter().flatten()) {
            if core.is_tracked() {
                tracing::warn!(lock = %core.name, "the renewal scheduler stopped (its runtime shut down or it panicked)");
                core.fire_lost(LostReason::RenewalFailed);
            }
        }
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
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, Instant};

    use crate::memory::Fault;
    use crate::testing::{probe_client, Renewals};
    use crate::{LockName, LockOptions, Locker, LostReason};

    const OP: Duration = Duration::from_secs(1);
    const TTL: Duration = Duration::from_secs(9);

    fn name(i: usize) -> LockName {
        LockName::new(format!("renewal/{i}")).unwrap()
    }

    fn watchdog() -> LockOptions {
        LockOptions::watchdog(TTL)
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_due_together_go_in_one_call() {
        let (client, probe) = probe_client(OP);
        let start = Instant::now();
        let mut leases = Vec::new();
        for i in 0..10 {
            leases.push(client.acquire(&name(i), &watchdog()).await.unwrap());
        }
        sleep(TTL / 3 + Duration::from_millis(10)).await;
        assert_eq!(probe.calls(), vec![(start + TTL / 3, 10)]);
        assert!(leases.iter().all(|lease| !lease.is_lost()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_renewal_is_timed_from_when_the_grant_was_sent() {
        let (client, probe) = probe_client(Duration::from_secs(5));
        probe.link().set(Fault::Delay(Duration::from_secs(1)));
        let start = Instant::now();
        let _lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(2), "the grant took a round trip of two delays");
        probe.link().restore();
        sleep_until_after(start + TTL / 3).await;
        assert_eq!(probe.calls()[0].0, start + TTL / 3);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_past_the_in_flight_bound_wait_for_a_slot() {
        let (client, probe) = probe_client(OP);
        let mut leases = Vec::new();
        for i in 0..1100 {
            leases.push(client.acquire(&name(i), &watchdog()).await.unwrap());
        }
        let start = Instant::now();
        probe.link().set(Fault::DelayReplies(Duration::from_millis(500)));
        sleep(TTL / 3 + Duration::from_secs(2)).await;
        assert_eq!(probe.max_in_flight(), super::MAX_IN_FLIGHT);
        let calls = probe.calls();
        assert_eq!(calls.iter().map(|(_, n)| n).sum::<usize>(), 1100, "every lease renewed once: {calls:?}");
        assert!(calls.iter().all(|(_, n)| *n <= super::MAX_BATCH));
        let late = calls.iter().filter(|(at, _)| *at >= start + TTL / 3 + Duration::from_millis(500)).count();
        assert_eq!(late, 1, "the leases past the bound went out when the first call came back: {calls:?}");
        assert!(leases.iter().all(|lease| !lease.is_lost()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_stops_at_max_hold() {
        let (client, probe) = probe_client(OP);
        let start = Instant::now();
        let lease = client.acquire(&name(0), &watchdog().max_hold(TTL * 2)).await.unwrap();
        assert_eq!(lease.lost().await, LostReason::Expired);
        let held = start.elapsed();
        assert!(held >= TTL * 2 && held <= TTL * 3, "lost after {held:?}");
        assert_eq!(probe.calls().len(), 6, "renewals every ttl/3 up to max_hold");
    }

    #[tokio::test(start_paused = true)]
    async fn each_way_of_losing_a_lease_has_its_reason() {
        let (client, probe) = probe_client(OP);

        // Someone else holds it now.
        let lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        probe.store.evict(&name(0));
        let thief = probe.store.client().acquire(&name(0), &watchdog()).await.unwrap();
        assert_eq!(lease.lost().await, LostReason::Stolen);
        drop(thief);

        // Nobody holds it.
        let lease = client.acquire(&name(1), &watchdog()).await.unwrap();
        probe.store.evict(&name(1));
        assert_eq!(lease.lost().await, LostReason::Expired);

        // A fixed lease ran out.
        let start = Instant::now();
        let lease = client.acquire(&name(2), &LockOptions::fixed(TTL)).await.unwrap();
        assert_eq!(lease.lost().await, LostReason::Expired);
        assert!(start.elapsed() < TTL && start.elapsed() > TTL * 9 / 10, "{:?}", start.elapsed());

        // Renewals refused by the backend until the lease ran out.
        let lease = client.acquire(&name(3), &watchdog()).await.unwrap();
        probe.set(Renewals::Fail);
        assert_eq!(lease.lost().await, LostReason::RenewalFailed);

        // Renewals that never came back.
        probe.set(Renewals::Hang);
        let lease = client.acquire(&name(4), &watchdog()).await.unwrap();
        assert_eq!(lease.lost().await, LostReason::BackendUnavailable);

        // The backend out of reach.
        probe.set(Renewals::Pass);
        let lease = client.acquire(&name(5), &watchdog()).await.unwrap();
        probe.link().cut();
        assert_eq!(lease.lost().await, LostReason::BackendUnavailable);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_gets_another_beside_it() {
        let (client, probe) = probe_client(OP);
        let start = Instant::now();
        let lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        probe.set(Renewals::HangOnce);
        sleep(TTL * 2).await;
        assert!(!lease.is_lost(), "lost: {:?}", lease.lost_reason());
        let calls = probe.calls();
        assert_eq!(calls[0].0, start + TTL / 3);
        assert_eq!(calls[1].0, start + TTL / 3 + OP, "the second renewal goes out an operation timeout later");
    }

    #[tokio::test(start_paused = true)]
    async fn replies_late_but_within_validity_keep_the_lease() {
        let (client, probe) = probe_client(OP);
        let lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        probe.link().set(Fault::DelayReplies(OP * 3 / 2));
        sleep(TTL * 3).await;
        assert!(!lease.is_lost(), "lost: {:?}", lease.lost_reason());
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_renewal_neither_stops_the_scheduler_nor_loses_the_lease() {
        let (client, probe) = probe_client(OP);
        let lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        probe.set(Renewals::PanicOnce);
        sleep(TTL * 2).await;
        assert!(!lease.is_lost(), "lost: {:?}", lease.lost_reason());
        let later = client.acquire(&name(1), &watchdog()).await.unwrap();
        sleep(TTL * 2).await;
        assert!(!later.is_lost(), "lost: {:?}", later.lost_reason());
    }

    #[test]
    fn leases_learn_when_the_scheduler_dies_and_the_next_lease_gets_a_new_one() {
        let runtime =
            || tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let (client, _probe) = probe_client(OP);
        let first = runtime();
        let lease = first.block_on(client.acquire(&name(0), &watchdog())).unwrap();
        // The runtime that ran the scheduler goes away with it.
        drop(first);
        assert_eq!(lease.lost_reason(), Some(LostReason::RenewalFailed));
        drop(lease);

        runtime().block_on(async {
            let lease = client.acquire(&name(1), &watchdog()).await.unwrap();
            sleep(TTL * 2).await;
            assert!(!lease.is_lost(), "lost: {:?}", lease.lost_reason());
            assert!(client.stats().renewals >= 5);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_that_lands_after_the_loss_does_not_count() {
        let (client, probe) = probe_client(TTL * 2);
        let lease = client.acquire(&name(0), &watchdog()).await.unwrap();
        // Every reply now comes after the lease's validity has ended.
        probe.link().set(Fault::DelayReplies(TTL + OP));
        let extended = lease.extend(TTL * 2).await;
        assert!(lease.is_lost());
        assert!(matches!(extended, Err(crate::LockError::NotHeld { .. })), "{extended:?}");
    }

    async fn sleep_until_after(at: Instant) {
        tokio::time::sleep_until(at + Duration::from_millis(10)).await;
    }
}
