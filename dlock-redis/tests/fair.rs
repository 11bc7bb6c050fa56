//! Fair locks on one Redis server: only the head of the queue is woken, a waiter that
//! died loses its place within its place lapse (its ttl, at most a few seconds), and
//! non-fair acquires wait behind the queue.

mod support;

use std::time::Duration;

use dlock_conformance::properties::eventually;
use dlock_core::wire::Fault;
use dlock_core::{Lease, LockError, LockName, LockOptions, Locker};
use dlock_redis::scripts::{scripts, AcquireReply, Invocation};
use dlock_redis::{KeyLayout, LockKeys};
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use support::monitor::{client_commands, Monitor, Sent};
use tokio::task::JoinHandle;
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
        .arg(&keys.wake_prefix)
        .arg(dlock_core::place_lapse(ttl).as_millis() as u64)
        .arg(support::KEEP_MS);
    AcquireReply::parse(call.run(&mut conn).await.unwrap()).unwrap()
}

/// Releases `held` and waits for the waiters' `tasks`, each granted in turn: what was
/// sent to the server meanwhile.
async fn release_to_waiters(server: &RedisServer, held: Lease, tasks: Vec<JoinHandle<()>>) -> Vec<Sent> {
    let mut monitor = Monitor::start(server).await;
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("every waiter is granted in turn").unwrap();
    }
    monitor.collect().await
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
    let sent = release_to_waiters(&server, held, tasks).await;

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

/// A waiter's place lapses a few seconds after its last look, whatever lease it asks for
/// (one of an hour here): a waiter that died keeps nobody waiting for long. So does the
/// place a blocking permit request takes when it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_place_lapses_within_seconds_whatever_its_lease() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (holder, waiter) =
        (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let mut admin = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let hour = Duration::from_secs(3600);
    for (name, held, waiting) in [
        ("fair/place-lapse", LockOptions::new(), LockOptions::fixed(hour).fair(true)),
        ("fair/permit-place-lapse", LockOptions::new().permits(1), LockOptions::fixed(hour).permits(1)),
    ] {
        let name = LockName::new(name).unwrap();
        let held = holder.acquire(&name, &held).await.unwrap();
        let task = {
            let (waiter, name, opts) = (waiter.clone(), name.clone(), waiting.wait(Duration::from_secs(60)));
            tokio::spawn(async move { waiter.acquire(&name, &opts).await })
        };
        eventually("the waiter queues", Duration::from_secs(5), || async {
            holder.inspect(&name).await.unwrap().waiters == Some(1)
        })
        .await;
        let keys = keys(&name);
        let places: Vec<(String, u64)> = redis::cmd("HGETALL").arg(&keys.places).query_async(&mut admin).await.unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
        let now_ms = secs * 1000 + micros / 1000;
        let [(_, lapses)] = places[..] else { panic!("one place expected: {places:?}") };
        assert!(lapses > now_ms && lapses - now_ms <= 5_000, "{name}: the place lapses in {} ms", lapses - now_ms);
        for key in [&keys.queue, &keys.places] {
            let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut admin).await.unwrap();
            assert!(pttl > 0 && pttl <= 5_000, "{key} lasts {pttl} ms");
        }
        task.abort();
        let _ = task.await;
        held.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_waiter_of_its_own_client_in_one_call() {
    const WAITERS: usize = 3;
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("fair/in-client").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true).wait(Duration::from_secs(20));
    let held = locker.acquire(&name, &opts).await.unwrap();
    let first = held.token();

    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (task_locker, task_name, opts, granted_tx) =
            (locker.clone(), name.clone(), opts.clone(), granted_tx.clone());
        tasks.push(tokio::spawn(async move {
            let lease = task_locker.acquire(&task_name, &opts).await.unwrap();
            granted_tx.send((i, lease.token())).unwrap();
            lease.release().await.unwrap();
        }));
        eventually("the waiter queues", Duration::from_secs(5), || async {
            locker.inspect(&name).await.unwrap().waiters == Some(i + 1) && locker.stats().waiting == i as u64 + 1
        })
        .await;
    }
    let sent = release_to_waiters(&server, held, tasks).await;

    let mut order = Vec::new();
    let mut last = first;
    while let Ok((i, token)) = granted.try_recv() {
        assert!(token > last, "tokens go up with every hand-off: {token} after {last}");
        order.push(i);
        last = token;
    }
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "granted in the order they queued");
    // Each release granted the next waiter itself: no waiter asked again, nobody was
    // woken, and only the last release (with nobody queued) published.
    let acquire = scripts().acquire.get_hash();
    let client = client_commands(&sent);
    assert_eq!(client.iter().filter(|s| s.is_script(acquire)).count(), 0, "{client:?}");
    assert_eq!(client.iter().filter(|s| s.is_script(scripts().release.get_hash())).count(), WAITERS + 1, "{client:?}");
    let publishes: Vec<&str> =
        sent.iter().filter(|s| s.source == "lua" && s.command() == "publish").map(|s| s.args[1].as_str()).collect();
    assert_eq!(publishes, [keys(&name).channel.as_str()]);
    assert_eq!(locker.inspect(&name).await.unwrap().waiters, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_giving_up_as_its_client_hands_it_the_lock_leaves_it_free() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("fair/give-up-handed").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true);
    let patience = Duration::from_millis(40);
    // The release races the waiter's deadline, landing on either side of it by turns.
    for round in 0..40u64 {
        let held = locker.acquire(&name, &opts).await.unwrap();
        let started = Instant::now();
        let waiter = {
            let (waiting, name, opts) = (locker.clone(), name.clone(), opts.clone().wait(patience));
            tokio::spawn(async move { waiting.acquire(&name, &opts).await })
        };
        // On a loaded machine the waiter may give up before it is seen waiting: then the
        // lock must be free all the same.
        eventually("the waiter queues or gives up", Duration::from_secs(5), || async {
            locker.stats().waiting == 1 || waiter.is_finished()
        })
        .await;
        tokio::time::sleep_until(
            started + patience + Duration::from_micros(round % 8 * 500) - Duration::from_millis(2),
        )
        .await;
        held.release().await.unwrap();
        match waiter.await.unwrap() {
            Ok(lease) => lease.release().await.unwrap(),
            Err(dlock_core::LockError::Timeout { .. }) => {
                let info = locker.inspect(&name).await.unwrap();
                assert!(
                    info.holder.is_none(),
                    "round {round}: a grant handed to a waiter that gave up stayed: {info:?}"
                );
            }
            Err(err) => panic!("round {round}: {err}"),
        }
        assert_eq!(locker.inspect(&name).await.unwrap().waiters, Some(0), "round {round}");
    }
}

/// A release that handed the lock to a waiter of its own client but whose reply was lost
/// cannot tell the waiter; the waiter still goes on, holding the grant the release made
/// for it: the lost reply wakes it to look again (the `handoff` module's own tests show
/// the wake-up, which comes sooner than its next place refresh), and its look answers
/// that grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_handed_the_lock_by_a_release_whose_reply_was_lost_goes_on() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let locker = dlock_redis::connect(support::client_config(proxy.addr())).await.unwrap();
    let observer = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("fair/lost-hand-off").unwrap();
    let opts = LockOptions::watchdog(Duration::from_secs(30)).fair(true).wait(Duration::from_secs(20));
    let held = locker.acquire(&name, &opts).await.unwrap();
    let held_token = held.token();
    let waiter = {
        let (waiting, name, opts) = (locker.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { waiting.acquire(&name, &opts).await })
    };
    eventually("the waiter queues", Duration::from_secs(5), || async {
        locker.stats().waiting == 1 && observer.inspect(&name).await.unwrap().waiters == Some(1)
    })
    .await;

    proxy.set_fault(Fault::DropReplies);
    let releasing = tokio::spawn(async move { held.release().await });
    eventually("the release hands the lock on", Duration::from_secs(5), || async {
        observer.inspect(&name).await.unwrap().holder.is_some_and(|h| h.token > held_token)
    })
    .await;
    let handed = observer.inspect(&name).await.unwrap().holder.unwrap().token;
    proxy.set_fault(Fault::None);
    let released = releasing.await.unwrap();
    assert!(matches!(released, Ok(()) | Err(LockError::Unavailable { .. })), "{released:?}");

    let lease = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter handed the lock goes on")
        .unwrap()
        .expect("the waiter is granted");
    assert_eq!(lease.token(), handed, "the waiter holds the grant the release made");
    lease.release().await.unwrap();
    assert!(observer.inspect(&name).await.unwrap().holder.is_none());
}
