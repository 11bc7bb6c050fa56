//! Fair locks on one Redis server: only the head of the queue is woken, a waiter that
//! died loses its place within its own ttl, and non-fair acquires wait behind the queue.

mod support;

use std::time::Duration;

use dlock_conformance::properties::eventually;
use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::scripts::{scripts, AcquireReply, Invocation};
use dlock_redis::{KeyLayout, LockKeys};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use support::monitor::{client_commands, Monitor};
use tokio::time::Instant;

/// Queues a place for `place` the way a fair waiter's attempt does, for a waiter that
/// then never comes back.
async fn queue_dead_waiter(server: &RedisServer, keys: &LockKeys, place: &str, ttl: Duration) -> AcquireReply {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let void = format!("{}:void:{place}", keys.hold);
    let call = Invocation::new(&scripts().acquire, &[&keys.hold, &keys.fence, &void, &keys.queue, &keys.places])
        .arg(format!("owner:{place}"))
        .arg(ttl.as_millis() as u64)
        .arg(format!("grant:{place}"))
        .arg(place)
        .arg("2")
        .arg(&keys.wake_prefix);
    AcquireReply::parse(call.run(&mut conn).await.unwrap()).unwrap()
}

fn keys(name: &LockName) -> LockKeys {
    KeyLayout::new("dlock").unwrap().lock(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_head_of_the_queue_alone() {
    const WAITERS: usize = 3;
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let holder = dlock_redis::connect(config.clone()).await.unwrap();
    let name = LockName::new("fair/head").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true).wait(Duration::from_secs(20));
    let held = holder.acquire(&name, &opts).await.unwrap();

    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let waiter = dlock_redis::connect(config.clone()).await.unwrap();
        let (queued_name, opts, w) = (name.clone(), opts.clone(), waiter.clone());
        tasks.push(tokio::spawn(async move {
            let lease = w.acquire(&queued_name, &opts).await.unwrap();
            lease.release().await.unwrap();
        }));
        eventually("the waiter queues", Duration::from_secs(5), || async {
            holder.inspect(&name).await.unwrap().waiters == Some(i + 1) && waiter.stats().waiting == 1
        })
        .await;
    }
    let mut monitor = Monitor::start(&server).await;
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("every waiter is granted in turn").unwrap();
    }
    let sent = monitor.collect().await;

    let publishes: Vec<&str> =
        sent.iter().filter(|s| s.source == "lua" && s.command() == "publish").map(|s| s.args[1].as_str()).collect();
    let wake = keys(&name).wake_prefix;
    // One message per release: the holder's and each waiter's but the last go to the next
    // head's own channel; the last release, with nobody queued, goes to the lock's.
    assert_eq!(publishes.len(), WAITERS + 1, "{publishes:?}");
    assert!(publishes[..WAITERS].iter().all(|channel| channel.starts_with(&wake)), "{publishes:?}");
    assert_eq!(publishes[WAITERS], keys(&name).channel);
    let mut heads = publishes[..WAITERS].to_vec();
    heads.dedup();
    assert_eq!(heads.len(), WAITERS, "each head is woken once: {publishes:?}");
    // No herd: each waiter looked once more, when it was its turn.
    let acquire = scripts().acquire.get_hash();
    let tries = client_commands(&sent).iter().filter(|s| s.is_script(acquire)).count();
    assert_eq!(tries, WAITERS, "{:?}", client_commands(&sent));
    assert_eq!(holder.inspect(&name).await.unwrap().waiters, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped_within_its_ttl() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (holder, waiter) =
        (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let name = LockName::new("fair/dead").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true).wait(Duration::from_secs(20));
    let held = holder.acquire(&name, &opts).await.unwrap();
    let dead_ttl = Duration::from_millis(600);
    let queued = queue_dead_waiter(&server, &keys(&name), "dead:1", dead_ttl).await;
    assert!(matches!(queued, AcquireReply::Busy { queued: true, .. }), "{queued:?}");
    let placed = Instant::now();

    let task = {
        let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { waiter.acquire(&name, &opts).await })
    };
    eventually("the live waiter queues behind", Duration::from_secs(5), || async {
        holder.inspect(&name).await.unwrap().waiters == Some(2)
    })
    .await;
    held.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), task).await.expect("granted").unwrap().unwrap();
    let waited = placed.elapsed();
    assert!(waited >= dead_ttl - Duration::from_millis(50), "the dead waiter's place was skipped early: {waited:?}");
    assert!(waited < dead_ttl + Duration::from_millis(500), "the dead waiter held the queue up: {waited:?}");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_fair_acquires_wait_behind_the_queue() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("fair/mixed").unwrap();
    let plain = LockOptions::watchdog(Duration::from_secs(30));
    // A queued waiter that never comes for the lock once it is free.
    let held = locker.acquire(&name, &plain).await.unwrap();
    let place_ttl = Duration::from_millis(800);
    queue_dead_waiter(&server, &keys(&name), "slow:1", place_ttl).await;
    let placed = Instant::now();
    held.release().await.unwrap();
    assert_eq!(locker.inspect(&name).await.unwrap().waiters, Some(1));

    assert!(locker.try_acquire(&name, &plain).await.unwrap().is_none(), "a try overtook the queue");
    assert!(locker.try_acquire(&name, &plain.clone().fair(true)).await.unwrap().is_none());
    let lease = locker.acquire(&name, &plain.clone().wait(Duration::from_secs(5))).await.unwrap();
    let waited = placed.elapsed();
    assert!(waited >= place_ttl - Duration::from_millis(50), "granted ahead of the queue after {waited:?}");
    assert!(waited < place_ttl + Duration::from_millis(500), "the lapsed place held it up: {waited:?}");
    assert_eq!(locker.inspect(&name).await.unwrap().waiters, Some(0));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_giving_up_at_the_head_wakes_the_next() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let name = LockName::new("fair/give-up").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true);
    let held = a.acquire(&name, &opts).await.unwrap();
    // The first place lapses in 30 s: only its being given up lets the second waiter in.
    queue_dead_waiter(&server, &keys(&name), "first:1", Duration::from_secs(30)).await;
    let task = {
        let (b, name, opts) = (b.clone(), name.clone(), opts.clone().wait(Duration::from_secs(10)));
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    eventually("the second waiter queues", Duration::from_secs(5), || async {
        a.inspect(&name).await.unwrap().waiters == Some(2)
    })
    .await;
    held.release().await.unwrap();
    assert_eq!(a.inspect(&name).await.unwrap().waiters, Some(2), "the release woke the first place alone");
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let k = keys(&name);
    let gone: i64 = redis::from_redis_value(
        Invocation::new(&scripts().abandon, &[&k.hold, &k.queue, &k.places])
            .arg("first:1")
            .arg(&k.wake_prefix)
            .run(&mut conn)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(gone, 1);
    let lease = tokio::time::timeout(Duration::from_secs(2), task).await.expect("woken at once").unwrap().unwrap();
    lease.release().await.unwrap();
}
