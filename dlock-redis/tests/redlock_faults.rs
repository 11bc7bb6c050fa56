//! Masters killed (kill -9) and restarted under held locks: a minority lost changes
//! nothing, a majority lost ends the holder's lease, and fencing tokens keep increasing
//! across holders while masters come and go (with persistence on).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::history::{FencedRegister, History, Op, Phase};
use dlock_conformance::{Fixture, Timing};
use dlock_core::{LockError, LockName, LockOptions, LostReason};
use dlock_redis::ConnectConfig;
use support::redlock::{RedLockFixture, MASTERS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_masters_down_keep_the_lock_three_lose_it() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    // One lease renewed: a short ttl keeps the test short.
    let timing = Timing { ttl: Duration::from_secs(2), ..fixture.timing() };
    let (holder, other) = (fixture.client().await, fixture.client().await);
    let name = LockName::new("faults/minority-and-majority").unwrap();
    let lease = holder.acquire(&name, &LockOptions::watchdog(timing.ttl)).await.expect("acquire");

    fixture.with_masters_mut("killing masters", |m| [0, 1].into_iter().for_each(|i| m.kill(i)));
    let renewals = holder.stats().renewals;
    // For three ttls nobody else gets in, and the watchdog keeps renewing on the other three.
    let started = Instant::now();
    let denied = other.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl * 3)).await;
    assert!(matches!(denied, Err(LockError::Timeout { .. })), "with two masters down: {denied:?}");
    assert!(started.elapsed() >= timing.ttl * 3);
    assert!(!lease.is_lost(), "the holder lost the lock with three masters up: {:?}", lease.lost_reason());
    assert!(holder.stats().renewals >= renewals + 3, "the watchdog stopped renewing on the three left");

    fixture.with_masters_mut("killing a third master", |m| m.kill(2));
    let reason = tokio::time::timeout(timing.ttl + timing.margin, lease.lost())
        .await
        .expect("the holder's lost signal fires when a majority is down");
    assert_eq!(reason, LostReason::BackendUnavailable);
    let started = Instant::now();
    let failed = other.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl * 3)).await;
    assert!(
        matches!(failed, Err(LockError::QuorumNotReached { needed: 3, .. })),
        "with three masters down: {failed:?}"
    );
    assert!(started.elapsed() < timing.ttl, "the failure took {:?}", started.elapsed());

    let before = lease.token();
    drop(lease);
    fixture.with_masters_mut("restarting masters", |m| {
        (0..3).for_each(|i| m.start_again(i).expect("restart a master"));
    });
    let give_up = Instant::now() + timing.ttl * 2 + timing.margin * 2;
    let next = loop {
        match other.acquire(&name, &LockOptions::watchdog(timing.ttl).wait(timing.ttl + timing.margin)).await {
            Ok(lease) => break lease,
            Err(e) => {
                assert!(Instant::now() < give_up, "the lock is not usable after the restarts: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(next.token() > before, "token {} after {before}", next.token());
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_200_holders_while_masters_restart() {
    dlock_conformance::init_tracing();
    const HOLDERS: usize = 200;
    const WORKERS: usize = 4;
    let fixture = Arc::new(RedLockFixture::new());
    let name = LockName::new("faults/200-holders").unwrap();
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    let holds = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // Chaos: every few tens of milliseconds, kill a random master (at most two down at
    // once, so that a quorum stays) or restart one that is down, on its own data.
    let chaos = {
        let (fixture, stop) = (fixture.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let mut down: Vec<usize> = Vec::new();
            let mut events = 0;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(20..60)));
                fixture.with_masters_mut("chaos", |m| {
                    if down.len() < 2 && fastrand::bool() || down.is_empty() {
                        let victim = fastrand::usize(0..MASTERS);
                        if !down.contains(&victim) {
                            m.kill(victim);
                            down.push(victim);
                        }
                    } else {
                        let back = down.swap_remove(fastrand::usize(0..down.len()));
                        m.start_again(back).expect("restart a master");
                    }
                });
                events += 1;
            }
            fixture.with_masters_mut("chaos", |m| down.iter().for_each(|&i| m.start_again(i).expect("restart")));
            events
        })
    };

    let mut workers = Vec::new();
    for process in 0..WORKERS {
        let client = fixture.client().await;
        let (name, history, register, holds, failures) =
            (name.clone(), history.clone(), register.clone(), holds.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            let opts = LockOptions::watchdog(Duration::from_secs(2)).wait(Duration::from_secs(10));
            while holds.load(Ordering::SeqCst) < HOLDERS {
                history.record(process, Op::Acquire, Phase::Invoke, None);
                let lease = match client.acquire(&name, &opts).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        // Nodes just restarted, or a quorum briefly out of reach: try again.
                        history.record(process, Op::Acquire, Phase::Fail, None);
                        assert!(e.is_transient() || matches!(e, LockError::Timeout { .. }), "acquire: {e}");
                        failures.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                history.record(process, Op::Acquire, Phase::Ok, Some(lease.token()));
                let n = holds.fetch_add(1, Ordering::SeqCst) as u64;
                register.write(process, lease.token(), n).expect("the register refused the current holder");
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..3))).await;
                if lease.is_lost() {
                    history.record(process, Op::Lost, Phase::Ok, None);
                }
                history.record(process, Op::Release, Phase::Invoke, None);
                let phase = if lease.release().await.is_ok() { Phase::Ok } else { Phase::Fail };
                history.record(process, Op::Release, phase, None);
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    stop.store(true, Ordering::SeqCst);
    let events = chaos.await.expect("chaos");

    let report = history.check();
    assert!(report.holds >= HOLDERS, "{report}");
    assert!(report.is_clean(), "{report}");
    assert!(events >= 10, "only {events} kills and restarts happened meanwhile");
    println!(
        "{report}; {events} kills and restarts; {} acquires failed and were retried",
        failures.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_below_the_counters_is_refused_and_the_next_goes_above() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let client = fixture.client().await;
    let name = LockName::new("faults/counters-ahead").unwrap();
    let fence = dlock_redis::KeyLayout::new(fixture.config().prefix()).unwrap().lock(&name).fence;
    // Counters far above any clock-based proposal, on a majority of the masters (as
    // grants this client never saw would leave them), and a lower one on another.
    let ahead: u64 = 1 << 60;
    for (index, value) in [(0, ahead), (1, ahead + 5), (2, ahead + 2), (3, 7)] {
        let _: () =
            redis::cmd("SET").arg(&fence).arg(value).query_async(&mut fixture.admin(index).await).await.unwrap();
    }
    let lease = client.acquire(&name, &LockOptions::watchdog(Duration::from_secs(5))).await.expect("acquire");
    assert_eq!(lease.token().get(), ahead + 6, "the second round proposes the highest counter plus one");
    for index in 0..MASTERS {
        let counter: u64 = redis::cmd("GET").arg(&fence).query_async(&mut fixture.admin(index).await).await.unwrap();
        assert!(counter <= lease.token().get(), "node {index}: counter {counter} above the granted token");
    }
    let granted = lease.token();
    lease.release().await.expect("release");
    let next = client.acquire(&name, &LockOptions::watchdog(Duration::from_secs(5))).await.expect("acquire");
    assert!(next.token() > granted);
    next.release().await.expect("release");
}
