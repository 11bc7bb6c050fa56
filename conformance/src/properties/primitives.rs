//! The mutex's neighbours: read-write locks (shared holds beside an exclusive writer)
//! and semaphores (permits). A backend that does not claim the capability must refuse
//! both kinds of request with `Unsupported`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{HoldKind, LockName, LockOptions, Locker, OwnerId};

use super::{assert_unsupported, eventually, unique_name, watchdog};
use crate::fixture::{Faults, Fixture};
use crate::history::{History, Op, Phase};

/// Whether the backend grants `kind`; if it does not, checks that it says so, for both
/// a blocking and a non-blocking request.
async fn grants(locker: &dyn Locker, name: &LockName, kind: HoldKind) -> bool {
    let caps = locker.capabilities();
    let claimed = match kind {
        HoldKind::Exclusive => true,
        HoldKind::Shared => caps.shared,
        HoldKind::Permit { .. } => caps.permits,
    };
    if !claimed {
        let opts = LockOptions::new().kind(kind).wait(Duration::ZERO);
        assert_unsupported(&format!("acquire {kind:?}"), locker.acquire(name, &opts).await);
        assert_unsupported(&format!("try_acquire {kind:?}"), locker.try_acquire(name, &opts).await);
    }
    claimed
}

/// How many hold at once, and the most that ever did.
#[derive(Debug)]
struct Gauge {
    now: tokio::sync::watch::Sender<usize>,
    most: AtomicUsize,
}

impl Gauge {
    fn new() -> Arc<Self> {
        Arc::new(Gauge { now: tokio::sync::watch::channel(0).0, most: AtomicUsize::new(0) })
    }

    /// Counts one more holder; returns how many hold now.
    fn enter(&self) -> usize {
        let mut now = 0;
        self.now.send_modify(|n| {
            *n += 1;
            now = *n;
        });
        self.most.fetch_max(now, Ordering::SeqCst);
        now
    }

    fn leave(&self) {
        self.now.send_modify(|n| *n -= 1);
    }

    fn current(&self) -> usize {
        *self.now.borrow()
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// Waits, at most `bound`, until another holder holds too. A hold that lingers so
    /// gives the others a chance to join it however slow each grant is on a loaded
    /// machine, so that a backend that admits several is seen admitting several.
    async fn company(&self, bound: Duration) {
        let mut seen = self.now.subscribe();
        let _ = tokio::time::timeout(bound, seen.wait_for(|n| *n > 1)).await;
    }
}

fn read(f: &dyn Fixture, wait: Duration) -> LockOptions {
    watchdog(f, wait).read()
}

fn write(f: &dyn Fixture, wait: Duration) -> LockOptions {
    watchdog(f, wait).write()
}

/// Readers on different clients hold together; a writer waits for all of them and,
/// once in, keeps readers out; its token is above every reader's.
pub async fn rwlock_readers_share_and_a_writer_excludes(f: &dyn Fixture) {
    let (a, b, w) = (f.client().await, f.client().await, f.client().await);
    let name = unique_name("rw-share");
    if !grants(&*a, &name, HoldKind::Shared).await {
        return;
    }
    let first =
        a.try_acquire(&name, &read(f, Duration::ZERO)).await.expect("read").expect("a free lock admits a reader");
    let second = b
        .try_acquire(&name, &read(f, Duration::ZERO))
        .await
        .expect("read")
        .expect("a second reader on another client is admitted beside the first");
    let (first_token, second_token) = (first.token(), second.token());
    assert_ne!(first_token, second_token, "every grant takes its own token");
    assert!(
        w.try_acquire(&name, &write(f, Duration::ZERO)).await.expect("write").is_none(),
        "a writer was granted beside two readers"
    );
    first.release().await.expect("release");
    assert!(
        w.try_acquire(&name, &write(f, Duration::ZERO)).await.expect("write").is_none(),
        "a writer was granted beside a reader"
    );
    second.release().await.expect("release");
    let writer =
        w.acquire(&name, &write(f, f.timing().margin)).await.expect("the writer is granted once the readers are gone");
    let writer_token = writer.token();
    assert!(writer_token > first_token && writer_token > second_token, "the writer's token is not above the readers'");
    assert!(
        a.try_acquire(&name, &read(f, Duration::ZERO)).await.expect("read").is_none(),
        "a reader was granted beside a writer"
    );
    assert!(
        b.try_acquire(&name, &write(f, Duration::ZERO)).await.expect("write").is_none(),
        "a second writer was granted"
    );
    writer.release().await.expect("release");
    let after = a.acquire(&name, &read(f, f.timing().margin)).await.expect("a reader after the writer");
    assert!(after.token() > writer_token);
    after.release().await.expect("release");
}

/// Writer preference: while a writer waits, a new reader waits too, even though only
/// readers hold; when the readers leave, the writer goes first.
pub async fn rwlock_waiting_writer_keeps_new_readers_out(f: &dyn Fixture) {
    let (a, b, w) = (f.client().await, f.client().await, f.client().await);
    let name = unique_name("rw-prefer");
    if !grants(&*a, &name, HoldKind::Shared).await {
        return;
    }
    let margin = f.timing().margin;
    let reader = a.acquire(&name, &read(f, margin)).await.expect("read");
    let writing = tokio::spawn({
        let (w, name, opts) = (w.clone(), name.clone(), write(f, margin * 4));
        async move { w.acquire(&name, &opts).await }
    });
    eventually("the writer waits", margin, || {
        let w = w.clone();
        async move { w.stats().waiting > 0 }
    })
    .await;
    assert!(
        b.try_acquire(&name, &read(f, Duration::ZERO)).await.expect("read").is_none(),
        "a new reader overtook a waiting writer: readers could starve writers"
    );
    let late_reader = tokio::spawn({
        let (b, name, opts) = (b.clone(), name.clone(), read(f, margin * 4));
        async move { b.acquire(&name, &opts).await }
    });
    let reader_token = reader.token();
    reader.release().await.expect("release");
    let writer = writing.await.expect("join").expect("the waiting writer is granted when the reader leaves");
    let writer_token = writer.token();
    assert!(writer_token > reader_token);
    assert!(!late_reader.is_finished(), "a reader was granted while the writer holds");
    writer.release().await.expect("release");
    let late = late_reader.await.expect("join").expect("the reader that waited is granted after the writer");
    assert!(late.token() > writer_token, "the reader that waited was granted before the writer");
    late.release().await.expect("release");
}

/// Readers and writers on several clients take turns for a while: a writer never holds
/// beside anyone, readers do hold together, and tokens of writers exceed every grant
/// before them.
pub async fn rwlock_writers_never_hold_beside_anyone(f: &dyn Fixture) {
    let name = unique_name("rw-mix");
    let probe = f.client().await;
    if !grants(&*probe, &name, HoldKind::Shared).await {
        return;
    }
    let (readers, writers, writes) = (Gauge::new(), Gauge::new(), Arc::new(AtomicUsize::new(0)));
    let until = Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (client, name) = (f.client().await, name.clone());
        let (readers, writers, writes) = (readers.clone(), writers.clone(), writes.clone());
        let (rd, wr) = (read(f, Duration::from_secs(30)), write(f, Duration::from_secs(30)));
        tasks.push(tokio::spawn(async move {
            let mut round = 0usize;
            while Instant::now() < until {
                round += 1;
                // Two of the six clients write every third round; the rest read.
                if i < 2 && round.is_multiple_of(3) {
                    let lease = client.acquire(&name, &wr).await.expect("write");
                    assert_eq!(writers.enter(), 1, "two writers held together");
                    assert_eq!(readers.current(), 0, "a writer held beside a reader");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers.leave();
                    writes.fetch_add(1, Ordering::SeqCst);
                    lease.release().await.expect("release");
                } else {
                    let lease = client.acquire(&name, &rd).await.expect("read");
                    readers.enter();
                    assert_eq!(writers.current(), 0, "a reader held beside a writer");
                    readers.company(Duration::from_millis(50)).await;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    assert_eq!(writers.current(), 0, "a reader held beside a writer");
                    readers.leave();
                    lease.release().await.expect("release");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a client broke the read-write rule");
    }
    assert!(writes.load(Ordering::SeqCst) > 0, "no writer got in: readers starved the writers");
    assert!(readers.most() > 1, "readers never held together");
}

/// At most N permits are out at once; with N out, one more waits until one comes back.
pub async fn semaphore_admits_at_most_n(f: &dyn Fixture) {
    let name = unique_name("sem");
    let clients = [f.client().await, f.client().await, f.client().await, f.client().await];
    if !grants(&*clients[0], &name, HoldKind::Permit { permits: 3 }).await {
        return;
    }
    let margin = f.timing().margin;
    let three = |wait| watchdog(f, wait).permits(3);
    let mut held = Vec::new();
    for client in &clients[..3] {
        held.push(client.try_acquire(&name, &three(Duration::ZERO)).await.expect("permit").expect("a free permit"));
    }
    let tokens: std::collections::BTreeSet<_> = held.iter().map(|lease| lease.token()).collect();
    assert_eq!(tokens.len(), 3, "every permit takes its own token");
    assert!(
        clients[3].try_acquire(&name, &three(Duration::ZERO)).await.expect("permit").is_none(),
        "a fourth permit of three was granted"
    );
    let waiting = tokio::spawn({
        let (client, name, opts) = (clients[3].clone(), name.clone(), three(margin * 4));
        async move { client.acquire(&name, &opts).await }
    });
    eventually("the fourth waits", margin, || {
        let client = clients[3].clone();
        async move { client.stats().waiting > 0 }
    })
    .await;
    held.remove(0).release().await.expect("release");
    let fourth = waiting.await.expect("join").expect("a permit given back goes to the waiter");
    assert!(fourth.token() > *tokens.last().expect("tokens"));
    for lease in held {
        assert!(!lease.is_lost(), "a holder lost its permit when another came and went");
        lease.release().await.expect("release");
    }
    fourth.release().await.expect("release");

    // Many clients competing never have more than N out at once.
    let out = Gauge::new();
    let until = Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for client in [clients.clone(), clients.clone()].concat() {
        let (name, opts, out) = (name.clone(), three(Duration::from_secs(30)), out.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let lease = client.acquire(&name, &opts).await.expect("permit");
                let now = out.enter();
                assert!(now <= 3, "{now} permits of three out at once");
                out.company(Duration::from_millis(50)).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
                out.leave();
                lease.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("more than N permits were out");
    }
    assert!(out.most() > 1, "permits were never out together");
}

/// The number of permits travels with each request, and no holder ever gets more
/// company than its own number allows: a request for fewer permits than are out waits,
/// and so does one for more while holders of a smaller number are out; once they are
/// gone, the larger number admits as many as it says.
pub async fn semaphore_permits_change_at_run_time(f: &dyn Fixture) {
    let name = unique_name("sem-resize");
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    if !grants(&*a, &name, HoldKind::Permit { permits: 2 }).await {
        return;
    }
    let opts = |permits| watchdog(f, Duration::ZERO).permits(permits);
    let first = a.try_acquire(&name, &opts(2)).await.expect("permit").expect("permit");
    let second = b.try_acquire(&name, &opts(2)).await.expect("permit").expect("permit");
    assert!(c.try_acquire(&name, &opts(1)).await.expect("permit").is_none(), "granted past a lowered count");
    assert!(c.try_acquire(&name, &opts(2)).await.expect("permit").is_none(), "granted past the count");
    assert!(
        c.try_acquire(&name, &opts(3)).await.expect("permit").is_none(),
        "a third holder was granted beside two that asked for at most two"
    );
    second.release().await.expect("release");
    let third = c.try_acquire(&name, &opts(3)).await.expect("permit").expect("a second permit of two is free");
    first.release().await.expect("release");
    let fourth = a.try_acquire(&name, &opts(3)).await.expect("permit").expect("three admit a second");
    let fifth = b
        .try_acquire(&name, &opts(3))
        .await
        .expect("permit")
        .expect("once the holders of two are gone, three admit three");
    for lease in [third, fourth, fifth] {
        assert!(!lease.is_lost(), "changing the count broke a holder");
        lease.release().await.expect("release");
    }
}

/// Permit requests with different counts on one name, from several clients: a request
/// for more permits never overtakes an earlier one waiting for fewer, and no holder is
/// ever beside more holders than its own count allows (the history checker judges every
/// grant against the count of each holder it joined). The tokens of the grants rise in
/// the order they were made.
pub async fn semaphore_mixed_counts_never_crowd_a_holder(f: &dyn Fixture) {
    let name = unique_name("sem-mixed");
    let clients = [f.client().await, f.client().await, f.client().await];
    if !grants(&*clients[0], &name, HoldKind::Permit { permits: 2 }).await {
        return;
    }
    let margin = f.timing().margin;
    let history = History::new();
    let (two, one, three) = (0, 1, 2);
    let kinds = [HoldKind::Permit { permits: 2 }, HoldKind::Permit { permits: 1 }, HoldKind::Permit { permits: 3 }];
    for (process, kind) in kinds.iter().enumerate() {
        history.set_kind(process, *kind);
    }
    let opts = |kind: HoldKind| watchdog(f, margin * 6).kind(kind);

    history.record(two, Op::Acquire, Phase::Invoke, None);
    let first = clients[two].acquire(&name, &opts(kinds[two])).await.expect("a free semaphore");
    history.record(two, Op::Acquire, Phase::Ok, Some(first.token()));

    // Each waiter holds a while once granted, so that a later grant beside it shows.
    let waiter = |process: usize| {
        let (client, name, opts, history) =
            (clients[process].clone(), name.clone(), opts(kinds[process]), history.clone());
        tokio::spawn(async move {
            history.record(process, Op::Acquire, Phase::Invoke, None);
            let lease = client.acquire(&name, &opts).await.expect("a waiting permit is granted");
            history.record(process, Op::Acquire, Phase::Ok, Some(lease.token()));
            let granted = (Instant::now(), lease.token());
            tokio::time::sleep(Duration::from_millis(300)).await;
            history.record(process, Op::Release, Phase::Invoke, None);
            lease.release().await.expect("release");
            granted
        })
    };
    let smaller = waiter(one);
    eventually("the request for one permit waits", margin, || {
        let client = clients[one].clone();
        async move { client.stats().waiting > 0 }
    })
    .await;
    let larger = waiter(three);
    eventually("the request for three permits waits or is granted", margin, || {
        let (client, larger) = (clients[three].clone(), &larger);
        async move { client.stats().waiting > 0 || larger.is_finished() }
    })
    .await;
    history.record(two, Op::Release, Phase::Invoke, None);
    first.release().await.expect("release");

    let (smaller_at, smaller_token) = smaller.await.expect("join");
    let (larger_at, larger_token) = larger.await.expect("join");
    assert!(
        smaller_at < larger_at,
        "a request for three permits was granted before an earlier one that waited for one"
    );
    assert!(smaller_token < larger_token, "tokens of the grants do not rise in the order they were made");
    let report = history.check();
    assert!(report.is_clean(), "a permit holder had more company than its count allows: {report}");
}

/// An owner that holds a permit and asks for a permit with another count takes another
/// permit (another token), and re-enters its permit when it asks with the same count,
/// the same way on every backend.
pub async fn semaphore_reentry_with_another_count_takes_another_permit(f: &dyn Fixture) {
    let name = unique_name("sem-reenter");
    let client = f.client().await;
    if !grants(&*client, &name, HoldKind::Permit { permits: 3 }).await {
        return;
    }
    let owner = OwnerId::new(format!("sem-owner-{:016x}", fastrand::u64(..))).expect("owner");
    let opts = |permits| watchdog(f, Duration::ZERO).permits(permits).owner(owner.clone());
    if !client.capabilities().reentrant {
        assert_unsupported("an explicit owner", client.try_acquire(&name, &opts(3)).await);
        return;
    }
    let first = client.try_acquire(&name, &opts(3)).await.expect("permit").expect("a free semaphore");
    let again = client.try_acquire(&name, &opts(3)).await.expect("permit").expect("the owner re-enters its permit");
    assert_eq!(again.token(), first.token(), "a re-entry with the same count keeps the permit's token");
    let other = client.try_acquire(&name, &opts(4)).await.expect("permit").expect("another count takes another permit");
    assert_ne!(other.token(), first.token(), "a request with another count re-entered a permit of three");
    assert!(other.token() > first.token());
    for lease in [other, again, first] {
        assert!(!lease.is_lost());
        lease.release().await.expect("release");
    }
    assert!(client.inspect(&name).await.expect("inspect").holder.is_none(), "a permit stayed after its releases");
}

/// Semaphores and read-write locks refuse bad input, and the kinds keep apart: a
/// permit is not granted beside an exclusive hold or a reader.
pub async fn hold_kinds_exclude_each_other(f: &dyn Fixture) {
    let client = f.client().await;
    let other = f.client().await;
    let name = unique_name("kinds");
    assert!(
        matches!(
            client.try_acquire(&name, &LockOptions::new().permits(0)).await,
            Err(dlock_core::LockError::InvalidInput(_))
        ),
        "zero permits must be refused as invalid input"
    );
    let caps = client.capabilities();
    let mutex = client.acquire(&name, &watchdog(f, Duration::ZERO)).await.expect("lock");
    if caps.permits {
        assert!(
            other.try_acquire(&name, &watchdog(f, Duration::ZERO).permits(5)).await.expect("permit").is_none(),
            "a permit was granted beside an exclusive hold"
        );
    }
    if caps.shared {
        assert!(
            other.try_acquire(&name, &read(f, Duration::ZERO)).await.expect("read").is_none(),
            "a reader was granted beside an exclusive hold"
        );
    }
    mutex.release().await.expect("release");
    if caps.shared && caps.permits {
        let reader = client.acquire(&name, &read(f, Duration::ZERO)).await.expect("read");
        assert!(
            other.try_acquire(&name, &watchdog(f, Duration::ZERO).permits(5)).await.expect("permit").is_none(),
            "a permit was granted beside a reader"
        );
        reader.release().await.expect("release");
    }
}

/// A permit whose holder vanished comes back within the ttl; the holder learns first.
pub async fn semaphore_permit_of_a_vanished_holder_comes_back(f: &dyn Faults) {
    let timing = f.timing();
    let faulty = f.faulty_client().await;
    let other = f.client().await;
    let name = unique_name("sem-vanish");
    if !grants(&*other, &name, HoldKind::Permit { permits: 1 }).await {
        return;
    }
    let one = |wait| LockOptions::watchdog(timing.ttl).wait(wait).permits(1);
    let lease = faulty.locker.acquire(&name, &one(timing.margin)).await.expect("permit");
    let cut_at = Instant::now();
    faulty.link.cut();
    let next = other.acquire(&name, &one(timing.ttl + timing.margin * 2)).await.expect("the permit comes back");
    assert!(lease.remaining().is_zero(), "the permit was granted again while its cut-off holder counted it valid");
    let after = cut_at.elapsed();
    assert!(
        after < timing.ttl + timing.margin,
        "the permit came back {after:?} after the cut; ttl is {:?}",
        timing.ttl
    );
    assert!(next.token() > lease.token());
    next.release().await.expect("release");
}

/// A reader that gives up waiting (a timeout) leaves no place behind: once the writer
/// it waited for leaves, the lock is free for a writer at once.
pub async fn cancelled_reader_leaves_nothing(f: &dyn Fixture) {
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    let name = unique_name("rw-cancel");
    if !grants(&*a, &name, HoldKind::Shared).await {
        return;
    }
    let writer = a.acquire(&name, &write(f, Duration::ZERO)).await.expect("write");
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), b.acquire(&name, &read(f, Duration::from_secs(30)))).await;
    assert!(gave_up.is_err(), "the reader was granted beside a writer");
    let timed_out = b.acquire(&name, &read(f, Duration::from_millis(50))).await;
    assert!(matches!(timed_out, Err(dlock_core::LockError::Timeout { .. })), "a bounded reader's wait: {timed_out:?}");
    writer.release().await.expect("release");
    let margin = f.timing().margin;
    eventually("the lock is free once the writer left", margin, || {
        let c = c.clone();
        let name = name.clone();
        async move {
            match c.try_acquire(&name, &LockOptions::watchdog(Duration::from_secs(5)).write()).await.expect("write") {
                Some(lease) => {
                    lease.release().await.expect("release");
                    true
                }
                None => false,
            }
        }
    })
    .await;
}

/// Four clients take turns as writers, readers and holders of one of two permits, and
/// two of them are frozen (their links black-holed) in the middle of a hold for longer
/// than the ttl: the history checker finds no writer beside anyone, never more permits
/// than their count, no permit beside a reader or writer, and tokens increasing between
/// holds of which one excludes the other.
pub async fn hold_kinds_survive_frozen_holders(f: &dyn Faults) {
    let name = unique_name("kinds-frozen");
    let probe = f.client().await;
    if !grants(&*probe, &name, HoldKind::Shared).await | !grants(&*probe, &name, HoldKind::Permit { permits: 2 }).await
    {
        return;
    }
    let timing = f.timing();
    let history = History::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(f.faulty_client().await);
    }
    let holding: Arc<[AtomicBool; 4]> = Arc::new(Default::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (process, client) in clients.iter().enumerate() {
        let (locker, name, history, holding, stop) =
            (client.locker.clone(), name.clone(), history.clone(), holding.clone(), stop.clone());
        // The two clients that get frozen hold long enough to be caught holding.
        let hold = if process < 2 { timing.ttl / 4 } else { Duration::from_millis(5) };
        workers.push(tokio::spawn(async move {
            let mut round = 0usize;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let kind = match (process + round) % 4 {
                    0 => HoldKind::Exclusive,
                    2 => HoldKind::Permit { permits: 2 },
                    _ => HoldKind::Shared,
                };
                history.set_kind(process, kind);
                history.record(process, Op::Acquire, Phase::Invoke, None);
                let opts = LockOptions::watchdog(timing.ttl).wait(timing.ttl).kind(kind);
                let lease = match locker.acquire(&name, &opts).await {
                    Ok(lease) => lease,
                    Err(_) => {
                        history.record(process, Op::Acquire, Phase::Fail, None);
                        continue;
                    }
                };
                history.record(process, Op::Acquire, Phase::Ok, Some(lease.token()));
                holding[process].store(true, Ordering::SeqCst);
                let lost = tokio::select! {
                    _ = lease.lost() => true,
                    _ = tokio::time::sleep(hold) => false,
                };
                holding[process].store(false, Ordering::SeqCst);
                if lost || lease.is_lost() {
                    history.record(process, Op::Lost, Phase::Ok, None);
                } else {
                    history.record(process, Op::Release, Phase::Invoke, None);
                }
                let _ = lease.release().await;
            }
        }));
    }
    for frozen in &clients[..2] {
        let process = clients.iter().position(|c| std::ptr::eq(c, frozen)).expect("a client");
        eventually("the client to freeze holds", timing.ttl * 4 + timing.margin, || {
            let holding = holding.clone();
            async move { holding[process].load(Ordering::SeqCst) }
        })
        .await;
        frozen.link.blackhole();
        tokio::time::sleep(timing.ttl + timing.ttl / 2).await;
        frozen.link.restore();
    }
    tokio::time::sleep(timing.ttl / 2).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    let report = history.check();
    assert!(report.holds >= 8, "too few holds to judge: {report}");
    assert!(report.is_clean(), "history: {report}");
}
