//! What a name keeps between uses: its fence counter lasts the keep time from the name's
//! last grant, renewal or release, and a grant that finds it gone starts it again from
//! the server's clock in microseconds, so tokens never go back. On RedLock the same holds
//! on every master, and a master without a counter reports its clock (plus a lead) so
//! that a look at such a name takes one round.

mod support;

use std::time::Duration;

use dlock_core::{HoldKind, LockName, LockOptions, Locker};
use dlock_redis::redlock::{self, TokenSource};
use dlock_redis::{ConnectConfig, KeyLayout, Node};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters, RedisServer};
use redis::aio::MultiplexedConnection;

async fn connection(url: String) -> MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// The server's clock in microseconds.
async fn server_micros(conn: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

fn fence_key(name: &LockName) -> String {
    KeyLayout::new("dlock").unwrap().lock(name).fence
}

/// The counter's remaining time right after a use is about the keep time; a while after
/// one, it is less by that while.
fn fresh(left: i64, keep: Duration) -> bool {
    let keep = keep.as_millis() as i64;
    left > keep - 500 && left <= keep
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_renewal_and_release_keeps_the_counter_for_the_keep_time() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let keep = Duration::from_secs(5);
    let locker = dlock_redis::connect(support::client_config(server.addr()).with_keep_idle(keep)).await.unwrap();
    let mut admin = connection(server.url()).await;
    // Long enough to tell a refreshed counter from one that is only counting down.
    let pause = Duration::from_millis(1500);
    for (kind, name) in [
        (HoldKind::Exclusive, "fence/exclusive"),
        (HoldKind::Shared, "fence/shared"),
        (HoldKind::Permit { permits: 2 }, "fence/permit"),
    ] {
        let name = LockName::new(name).unwrap();
        let fence = fence_key(&name);
        let lease = locker.acquire(&name, &LockOptions::fixed(Duration::from_secs(30)).kind(kind)).await.unwrap();
        assert!(fresh(pttl(&mut admin, &fence).await, keep), "{kind:?}: the grant kept the counter");
        tokio::time::sleep(pause).await;
        assert!(!fresh(pttl(&mut admin, &fence).await, keep), "{kind:?}: the counter counts down between uses");
        lease.extend(Duration::from_secs(30)).await.unwrap();
        assert!(fresh(pttl(&mut admin, &fence).await, keep), "{kind:?}: the renewal kept the counter");
        tokio::time::sleep(pause).await;
        lease.release().await.unwrap();
        assert!(fresh(pttl(&mut admin, &fence).await, keep), "{kind:?}: the release kept the counter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_expired_starts_again_from_the_servers_clock() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let keep = Duration::from_millis(500);
    let locker = dlock_redis::connect(support::client_config(server.addr()).with_keep_idle(keep)).await.unwrap();
    let mut admin = connection(server.url()).await;
    let name = LockName::new("fence/expired").unwrap();

    let before = server_micros(&mut admin).await;
    let first = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    let after = server_micros(&mut admin).await;
    let first_token = first.token();
    assert!((before..=after).contains(&first_token.get()), "a new name starts at the clock: {first_token}");
    first.release().await.unwrap();
    let again = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    let again_token = again.token();
    assert_eq!(again_token.get(), first_token.get() + 1, "a live counter counts up by one");
    again.release().await.unwrap();

    tokio::time::sleep(keep * 3).await;
    let keys = support::count_keys(&mut admin, "dlock", "fence/expired").await;
    assert_eq!(keys, 0, "the idle name left keys behind");
    let floor = server_micros(&mut admin).await;
    let third = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    assert!(third.token().get() >= floor, "{} is below the clock {floor}", third.token());
    assert!(third.token() > again_token);
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_left_without_a_ttl_goes_on_and_gets_one() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let keep = Duration::from_secs(5);
    let locker = dlock_redis::connect(support::client_config(server.addr()).with_keep_idle(keep)).await.unwrap();
    let mut admin = connection(server.url()).await;
    let name = LockName::new("fence/older").unwrap();
    let fence = fence_key(&name);
    // As a client that kept counters forever left it.
    let _: () = redis::cmd("SET").arg(&fence).arg(41).query_async(&mut admin).await.unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    assert_eq!(lease.token().get(), 42);
    assert!(fresh(pttl(&mut admin, &fence).await, keep));
    lease.release().await.unwrap();
}

fn masters(count: usize) -> RedisMasters {
    RedisMasters::start(count, &ServerConfig::default()).expect("start redis-servers")
}

fn redlock_config(masters: &RedisMasters) -> redlock::RedLockConfig {
    let nodes: Vec<Node> = masters.addrs().iter().map(|a| Node::new(a.ip().to_string(), a.port())).collect();
    support::redlock::config_for(&nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_counters_expire_on_every_master_and_tokens_still_rise() {
    let masters = masters(3);
    let keep = Duration::from_millis(800);
    let mut admins = Vec::new();
    for server in masters.nodes() {
        admins.push(connection(server.url()).await);
    }
    let name = LockName::new("fence/redlock").unwrap();
    let fence = fence_key(&name);
    let mut last = 0;
    for source in [TokenSource::Clock, TokenSource::ReadFirst, TokenSource::Clock] {
        let config = redlock_config(&masters).with_keep_idle(keep).with_token_source(source);
        let locker = redlock::connect(config).await.unwrap();
        let mut floor = u64::MAX;
        for admin in &mut admins {
            floor = floor.min(server_micros(admin).await);
        }
        let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
        let token = lease.token().get();
        assert!(token > last, "{source:?}: {token} after {last}");
        assert!(token > floor, "{source:?}: {token} is below the masters' clocks {floor}");
        let mut counters = 0;
        for admin in &mut admins {
            let left = pttl(admin, &fence).await;
            assert!(left <= keep.as_millis() as i64, "{source:?}: a counter kept for {left} ms");
            counters += usize::from(left > 0);
        }
        assert!(counters >= 2, "{source:?}: a quorum of masters keeps the counter");
        lease.release().await.unwrap();
        last = token;
        // Idle past the keep time: every master drops the counter, and the next grant
        // starts again from the clock.
        tokio::time::sleep(keep * 3).await;
        for admin in &mut admins {
            assert_eq!(support::count_keys(admin, "dlock", "fence/redlock").await, 0, "{source:?}: keys left");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_renewals_and_releases_keep_the_counters() {
    let masters = masters(3);
    let keep = Duration::from_secs(5);
    let locker = redlock::connect(redlock_config(&masters).with_keep_idle(keep)).await.unwrap();
    let mut admins = Vec::new();
    for server in masters.nodes() {
        admins.push(connection(server.url()).await);
    }
    let name = LockName::new("fence/redlock-kept").unwrap();
    let fence = fence_key(&name);
    let lease = locker.acquire(&name, &LockOptions::fixed(Duration::from_secs(30))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lease.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lease.release().await.unwrap();
    // The release returns at a quorum; the last master may still be on its way.
    let what = "every master keeps the counter from the release";
    dlock_conformance::properties::eventually(what, Duration::from_secs(5), || {
        let admins = admins.clone();
        let fence = fence.clone();
        async move {
            let mut all = true;
            for mut admin in admins {
                all &= fresh(pttl(&mut admin, &fence).await, keep);
            }
            all
        }
    })
    .await;
}
