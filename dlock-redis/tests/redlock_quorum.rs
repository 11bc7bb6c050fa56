//! Quorums, in the style of redsync's tests: for every subset of the five masters made
//! unreachable through the fault proxies, an acquire succeeds exactly when a quorum
//! remains, and otherwise fails at once (far under the ttl) instead of waiting.

mod support;

use std::time::{Duration, Instant};

use dlock_conformance::properties::eventually;
use dlock_conformance::{Fixture, Link};
use dlock_core::{LockError, LockName, LockOptions, Locker, OwnerId};
use dlock_redis::redlock::{self, RedLockLocker};
use dlock_redis::ConnectConfig;
use support::redlock::{RedLockFixture, MASTERS};

/// A ttl far above the per-node timeout, so that "failed well under the ttl" shows that
/// the acquire did not wait for anything.
const TTL: Duration = Duration::from_secs(10);
/// The suite's RedLock node timeout: short, but with room for a test process starved by
/// its neighbours (250 ms was missed by all three reachable masters once, under the full
/// suite on two cores).
const NODE_TIMEOUT: Duration = support::redlock::NODE_TIMEOUT;
/// Failing in under this long is failing fast: a few per-node timeouts, nowhere near the ttl.
const FAST: Duration = Duration::from_secs(3);

const QUORUM: usize = MASTERS / 2 + 1;

/// A client whose link to each master goes through a proxy of its own.
async fn proxied_client(fixture: &RedLockFixture) -> (RedLockLocker, Vec<dlock_testkit::proxy::ProxyLink>) {
    let (config, links) = fixture.proxied().await;
    let locker = redlock::connect(config.with_node_timeout(NODE_TIMEOUT)).await.expect("connect");
    (locker, links)
}

/// Waits until the client reaches every master again (a restored link reconnects on the
/// client's next command).
async fn all_reachable(locker: &RedLockLocker) {
    eventually("every master answers the client again", Duration::from_secs(10), || async {
        locker.backend().ping_nodes().await.iter().all(Result::is_ok)
    })
    .await;
}

/// Whether no master has a hold of `name` at all.
async fn holds_nowhere(fixture: &RedLockFixture, name: &LockName) -> bool {
    let hold = fixture.config().prefix().to_string();
    let key = dlock_redis::KeyLayout::new(&hold).unwrap().lock(name).hold;
    for index in 0..MASTERS {
        let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut fixture.admin(index).await).await.unwrap();
        if exists {
            return false;
        }
    }
    true
}

fn subset(mask: u32) -> Vec<usize> {
    (0..MASTERS).filter(|i| mask & (1 << i) != 0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_exactly_when_a_quorum_is_reachable() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let (locker, links) = proxied_client(&fixture).await;
    let name = LockName::new("quorum/every-subset").unwrap();
    // A wait bound far beyond the ttl: a failure that comes fast did not wait.
    let opts = LockOptions::watchdog(TTL).wait(TTL * 3);
    let mut last = None;
    for mask in 0u32..(1 << MASTERS) {
        let cut = subset(mask);
        cut.iter().for_each(|&i| links[i].cut());
        let reachable = MASTERS - cut.len();
        let started = Instant::now();
        let acquired = locker.acquire(&name, &opts).await;
        let took = started.elapsed();
        if reachable >= QUORUM {
            let lease = acquired.unwrap_or_else(|e| panic!("nodes {cut:?} cut, {reachable} reachable: {e}"));
            assert!(last < Some(lease.token()), "nodes {cut:?} cut: token {} after {last:?}", lease.token());
            last = Some(lease.token());
            lease.release().await.unwrap_or_else(|e| panic!("nodes {cut:?} cut: release: {e}"));
        } else {
            match acquired {
                Err(LockError::QuorumNotReached { got, needed: QUORUM }) if got == reachable && reachable > 0 => {}
                Err(LockError::Unavailable { .. }) if reachable == 0 => {}
                other => panic!("nodes {cut:?} cut, {reachable} reachable: expected a quorum failure, got {other:?}"),
            }
            assert!(took < FAST, "nodes {cut:?} cut: the failure took {took:?} (ttl {TTL:?})");
        }
        cut.iter().for_each(|&i| links[i].restore());
        all_reachable(&locker).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_masters_cost_the_node_timeout_not_the_ttl() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let (locker, links) = proxied_client(&fixture).await;
    let other = fixture.client().await;
    let name = LockName::new("quorum/blackholed").unwrap();
    let opts = LockOptions::watchdog(TTL).wait(TTL * 3);

    for silent in [vec![3, 4], vec![0, 2]] {
        silent.iter().for_each(|&i| links[i].blackhole());
        let started = Instant::now();
        let lease = locker.acquire(&name, &opts).await.unwrap_or_else(|e| panic!("{silent:?} silent: {e}"));
        assert!(started.elapsed() < FAST, "{silent:?} silent: the grant took {:?}", started.elapsed());
        // The holder keeps the lock through renewals on the three that answer.
        let busy = other.try_acquire(&name, &LockOptions::watchdog(TTL)).await.expect("try_acquire");
        assert!(busy.is_none(), "{silent:?} silent: another client got a held lock");
        lease.release().await.expect("release on the three that answer");
        silent.iter().for_each(|&i| links[i].restore());
        all_reachable(&locker).await;
        // The stalled grant and its release reach the silent nodes in order: nothing stays.
        eventually("the lock is free on every node", FAST, || holds_nowhere(&fixture, &name)).await;
    }

    let silent = [0, 1, 2];
    silent.iter().for_each(|&i| links[i].blackhole());
    let started = Instant::now();
    let failed = locker.acquire(&name, &opts).await;
    let took = started.elapsed();
    assert!(
        matches!(failed, Err(LockError::QuorumNotReached { got: 2, needed: QUORUM })),
        "three silent masters: {failed:?}"
    );
    assert!(took < FAST, "three silent masters: the failure took {took:?} (ttl {TTL:?})");
    silent.iter().for_each(|&i| links[i].restore());
    all_reachable(&locker).await;
    // What the failed attempt sent into the silence was given back: the lock is free.
    eventually("the lock is free on every node", FAST, || holds_nowhere(&fixture, &name)).await;
    let next = other.try_acquire(&name, &LockOptions::watchdog(TTL)).await.expect("try_acquire");
    let next = next.expect("the lock is free after the failed attempt gave back its partial grant");
    next.release().await.expect("release");
}

/// A hold that a lost lease left on a minority of the masters is not kept alive by its
/// owner's later acquires: the re-entry that the winning round gives back on those
/// masters puts their hold back to the expiry it had, where before each attempt
/// lengthened it by the attempt's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_given_back_leaves_a_leftover_hold_its_expiry() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let owner = OwnerId::new("leftover-owner").unwrap();
    let name = LockName::new("quorum/leftover").unwrap();
    let keys = dlock_redis::KeyLayout::new(fixture.config().prefix()).unwrap().lock(&name);
    let (first, second) = (fixture.client().await, fixture.client().await);
    let short = Duration::from_secs(3);
    let lost = first.acquire(&name, &LockOptions::fixed(short).owner(owner.clone())).await.expect("acquire");

    // The hold goes from a majority, as empty restarts would take it: the lease is lost,
    // and what is left of it sits on masters 0 and 1.
    let leftover = [0, 1];
    for index in QUORUM - 1..MASTERS {
        let _: i64 = redis::cmd("DEL").arg(&keys.hold).query_async(&mut fixture.admin(index).await).await.unwrap();
    }

    // The owner takes the lock again: the other masters grant a new token and the round
    // gives back its re-entries of the leftover.
    let again = second.acquire(&name, &LockOptions::fixed(TTL * 6).owner(owner)).await.expect("acquire again");
    assert_ne!(again.token(), lost.token(), "the leftover alone cannot be a quorum");
    let count_field = format!("{}{}", dlock_redis::keys::OWNER_FIELD_PREFIX, "leftover-owner");
    for index in leftover {
        eventually("the round gave its re-entry back", Duration::from_secs(10), || async {
            let count: Option<i64> = redis::cmd("HGET")
                .arg(&keys.hold)
                .arg(&count_field)
                .query_async(&mut fixture.admin(index).await)
                .await
                .unwrap();
            count == Some(1)
        })
        .await;
        let pttl: i64 = redis::cmd("PTTL").arg(&keys.hold).query_async(&mut fixture.admin(index).await).await.unwrap();
        assert!(
            pttl <= short.as_millis() as i64,
            "master {index}: the leftover of a {short:?} lease now lasts {pttl} ms more"
        );
    }
    again.release().await.expect("release");
}
