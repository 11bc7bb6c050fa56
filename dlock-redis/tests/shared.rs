//! Readers' shares and semaphore permits on one Redis server, beyond what the shared
//! suite checks: each lease lapses on its own (and the writer waiting on the hold hash is
//! not held up by leases that ended), waiters are woken by the releases' messages, a
//! permit keeps its number of permits, which bounds who joins it, and an owner's permits
//! of different numbers are holds of their own, the scripts are idempotent per request
//! and give back exactly one grant, a lost share says whether it was taken, and results
//! and inspect work for every kind.

mod support;

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions, Locker, OwnerId};
use dlock_redis::scripts::{scripts, AcquireReply, Invocation, ReleaseReply, RenewReply};
use dlock_redis::{KeyLayout, LockKeys};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use redis::aio::MultiplexedConnection;
use support::monitor::{Monitor, Sent};

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

fn keys(name: &str) -> LockKeys {
    KeyLayout::new("dlock").unwrap().lock(&LockName::new(name).unwrap())
}

/// The acquire call of a reader's share (`permits == 0`) or a permit, as the backend
/// sends it for a try.
fn acquire_shared(keys: &LockKeys, owner: &str, request: &str, ttl_ms: u64, permits: u32) -> Invocation {
    let void = format!("{}:void:{request}", keys.hold);
    let kind = if permits == 0 { "shared" } else { "permit" };
    Invocation::new(
        &scripts().acquire_shared,
        &[&keys.hold, &keys.fence, &void, &keys.queue, &keys.places, &keys.leases],
    )
    .arg(owner)
    .arg(ttl_ms)
    .arg(request)
    .arg(request)
    .arg("0")
    .arg(&keys.wake_prefix)
    .arg(kind)
    .arg(permits)
    .arg(5_000)
    .arg(support::KEEP_MS)
}

fn renew_shared(keys: &LockKeys, owner: &str, request: &str, token: u64, kind: &str) -> Invocation {
    Invocation::new(&scripts().renew_shared, &[&keys.hold, &keys.leases, &keys.fence])
        .arg(owner)
        .arg(token.to_string())
        .arg(30_000)
        .arg(request)
        .arg(kind)
        .arg(support::KEEP_MS)
}

fn release_shared(keys: &LockKeys, owner: &str, request: &str, token: u64) -> Invocation {
    Invocation::new(&scripts().release_shared, &[&keys.hold, &keys.queue, &keys.places, &keys.leases, &keys.fence])
        .arg(owner)
        .arg(token.to_string())
        .arg(&keys.channel)
        .arg(request)
        .arg(&keys.wake_prefix)
        .arg(support::KEEP_MS)
}

async fn granted(conn: &mut MultiplexedConnection, call: &Invocation) -> u64 {
    match AcquireReply::parse(call.run(conn).await.unwrap()).unwrap() {
        AcquireReply::Granted(token) => token,
        busy => panic!("not granted: {busy:?}"),
    }
}

async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_calls_sent_twice_count_once_and_release_one_grant() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = keys("shared/resent");

    let first = granted(&mut conn, &acquire_shared(&keys, "job", "c:1", 30_000, 0)).await;
    assert_eq!(granted(&mut conn, &acquire_shared(&keys, "job", "c:1", 30_000, 0)).await, first, "sent twice");
    // The same owner re-enters its share: the same token, two grants.
    assert_eq!(granted(&mut conn, &acquire_shared(&keys, "job", "c:2", 30_000, 0)).await, first);
    let count: Option<i64> = redis::cmd("HGET").arg(&keys.hold).arg("count:job").query_async(&mut conn).await.unwrap();
    assert_eq!(count, Some(2));
    // Another reader takes a token of its own from the name's one counter.
    let other = granted(&mut conn, &acquire_shared(&keys, "other", "d:1", 30_000, 0)).await;
    assert_eq!(other, first + 1);

    let release = |request: &str, token| release_shared(&keys, "job", request, token);
    let once = ReleaseReply::parse(release("c:1", first).run(&mut conn).await.unwrap()).unwrap();
    let twice = ReleaseReply::parse(release("c:1", first).run(&mut conn).await.unwrap()).unwrap();
    assert_eq!((once, twice), (ReleaseReply::Released, ReleaseReply::AlreadyReleased));
    let wrong_token = ReleaseReply::parse(release("c:2", other).run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(wrong_token, ReleaseReply::NotOurs);
    assert_eq!(
        ReleaseReply::parse(release("c:2", first).run(&mut conn).await.unwrap()).unwrap(),
        ReleaseReply::Released
    );
    assert!(exists(&mut conn, &keys.hold).await, "the other reader still holds");
    let last = release_shared(&keys, "other", "d:1", other);
    assert_eq!(ReleaseReply::parse(last.run(&mut conn).await.unwrap()).unwrap(), ReleaseReply::Released);
    assert!(
        !exists(&mut conn, &keys.hold).await && !exists(&mut conn, &keys.leases).await,
        "the last reader frees all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_share_is_stolen_only_by_a_hold_it_excludes() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = keys("shared/lost");
    let renew = |conn: &mut MultiplexedConnection, owner: &'static str, request: &'static str, token, kind| {
        let call = renew_shared(&keys, owner, request, token, kind);
        let mut conn = conn.clone();
        async move { RenewReply::parse(call.run(&mut conn).await.unwrap()).unwrap() }
    };

    let short = granted(&mut conn, &acquire_shared(&keys, "short", "s:1", 200, 0)).await;
    let long = granted(&mut conn, &acquire_shared(&keys, "long", "l:1", 30_000, 0)).await;
    assert_eq!(renew(&mut conn, "short", "s:1", short, "shared").await, RenewReply::Renewed);
    assert_eq!(renew(&mut conn, "short", "s:9", short, "shared").await, RenewReply::Gone, "another grant's renewal");
    // Renewed for 30 s, "short" stays; an expired reader among readers is only expired.
    let expiring = granted(&mut conn, &acquire_shared(&keys, "expiring", "e:1", 100, 0)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(renew(&mut conn, "expiring", "e:1", expiring, "shared").await, RenewReply::Gone);
    let pttl: i64 = redis::cmd("PTTL").arg(&keys.hold).query_async(&mut conn).await.unwrap();
    assert!(pttl > 25_000, "the hold lapses with its last lease: {pttl} ms");

    // Both readers gone, a writer holds: a reader's lease was taken.
    for (owner, request, token) in [("short", "s:1", short), ("long", "l:1", long)] {
        let released = release_shared(&keys, owner, request, token).run(&mut conn).await.unwrap();
        assert_eq!(ReleaseReply::parse(released).unwrap(), ReleaseReply::Released);
    }
    let writer = granted(&mut conn, &support::acquire_call(&keys, "owner:w", "w:1")).await;
    assert!(writer > long);
    assert_eq!(renew(&mut conn, "long", "l:1", long, "shared").await, RenewReply::Stolen);
    // A permit granted after the writer left excludes a reader too, but not a permit.
    let released = support::release_call(&keys, "owner:w", "w:1", writer).run(&mut conn).await.unwrap();
    assert_eq!(ReleaseReply::parse(released).unwrap(), ReleaseReply::Released);
    granted(&mut conn, &acquire_shared(&keys, "p", "p:1", 30_000, 2)).await;
    assert_eq!(renew(&mut conn, "long", "l:1", long, "shared").await, RenewReply::Stolen);
    assert_eq!(renew(&mut conn, "old", "o:1", 1, "permit").await, RenewReply::Gone);
    // The writer's renewal: readers and permits after it took its hold.
    let renew_writer = Invocation::new(&scripts().renew, &[&keys.hold, &keys.fence])
        .arg("owner:w")
        .arg(writer.to_string())
        .arg(30_000)
        .arg("grant:w:1")
        .arg(support::KEEP_MS);
    assert_eq!(RenewReply::parse(renew_writer.run(&mut conn).await.unwrap()).unwrap(), RenewReply::Stolen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_given_back_is_not_made_by_a_late_delivery() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = keys("shared/late");
    let give_back = |request: &str| {
        let void = format!("{}:void:{request}", keys.hold);
        Invocation::new(&scripts().give_back_shared, &[&keys.hold, &void, &keys.queue, &keys.places, &keys.leases])
            .arg("job")
            .arg(request)
            .arg(&keys.channel)
            .arg(30_000)
            .arg(request)
            .arg(&keys.wake_prefix)
    };
    let kept = granted(&mut conn, &acquire_shared(&keys, "job", "c:1", 30_000, 2)).await;
    granted(&mut conn, &acquire_shared(&keys, "job", "c:2", 30_000, 2)).await;
    // The give-back of c:2 takes back c:2 alone; the owner keeps its hold through c:1.
    let given: i64 = redis::from_redis_value(give_back("c:2").run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(given, 1);
    let count: Option<i64> = redis::cmd("HGET").arg(&keys.hold).arg("count:job").query_async(&mut conn).await.unwrap();
    assert_eq!(count, Some(1));
    // A give-back that arrives before its acquire: the acquire then grants nothing.
    let given: i64 = redis::from_redis_value(give_back("c:3").run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(given, 0);
    let late = AcquireReply::parse(acquire_shared(&keys, "job", "c:3", 30_000, 2).run(&mut conn).await.unwrap());
    assert!(matches!(late, Ok(AcquireReply::Busy { queued: false, .. })), "{late:?}");
    let released = release_shared(&keys, "job", "c:1", kept).run(&mut conn).await.unwrap();
    assert_eq!(ReleaseReply::parse(released).unwrap(), ReleaseReply::Released);
    assert!(!exists(&mut conn, &keys.hold).await);
}

/// A permit's number of permits is kept beside it and bounds every hold that joins it; a
/// permit that an older client wrote without its number bounds nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_keep_their_number_and_bound_who_joins() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = keys("shared/numbers");
    let busy = |reply: redis::Value| matches!(AcquireReply::parse(reply), Ok(AcquireReply::Busy { .. }));

    granted(&mut conn, &acquire_shared(&keys, "older", "o:1", 30_000, 5)).await;
    // As an older client left it: no number beside the hold.
    let _: i64 = redis::cmd("HDEL").arg(&keys.hold).arg("permits:older").query_async(&mut conn).await.unwrap();
    granted(&mut conn, &acquire_shared(&keys, "two\u{0}2", "t:1", 30_000, 2)).await;
    let kept: Option<String> =
        redis::cmd("HGET").arg(&keys.hold).arg("permits:two\u{0}2").query_async(&mut conn).await.unwrap();
    assert_eq!(kept.as_deref(), Some("2"));
    // Two holds are out: a third is beside the holder that asked for two at most, whatever
    // the newcomer asks for.
    assert!(busy(acquire_shared(&keys, "three\u{0}3", "h:1", 30_000, 3).run(&mut conn).await.unwrap()));
    assert!(busy(acquire_shared(&keys, "five\u{0}5", "f:1", 30_000, 5).run(&mut conn).await.unwrap()));
    // Without the holder of two, the number-less permit admits the newcomer's own bound.
    let two: String = redis::cmd("HGET").arg(&keys.hold).arg("holder:two\u{0}2").query_async(&mut conn).await.unwrap();
    let released = release_shared(&keys, "two\u{0}2", "t:1", two.parse().unwrap()).run(&mut conn).await.unwrap();
    assert_eq!(ReleaseReply::parse(released).unwrap(), ReleaseReply::Released);
    granted(&mut conn, &acquire_shared(&keys, "three\u{0}3", "h:2", 30_000, 3)).await;
    granted(&mut conn, &acquire_shared(&keys, "more\u{0}3", "m:1", 30_000, 3)).await;
    assert!(busy(acquire_shared(&keys, "last\u{0}9", "l:1", 30_000, 9).run(&mut conn).await.unwrap()));
}

/// An owner re-enters a permit only with the same number of permits; another number is
/// another hold, with a token of its own, and inspect names either by the owner alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_number_of_permits_is_a_hold_of_its_own() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let mut conn = connection(&server).await;
    let name = LockName::new("shared/owner-numbers").unwrap();
    let opts =
        |permits| LockOptions::watchdog(Duration::from_secs(30)).owner(OwnerId::new("pool").unwrap()).permits(permits);
    let three = locker.acquire(&name, &opts(3)).await.unwrap();
    let again = locker.acquire(&name, &opts(3)).await.unwrap();
    let four = locker.acquire(&name, &opts(4)).await.unwrap();
    assert_eq!(again.token(), three.token());
    assert!(four.token() > three.token());
    let keys = keys("shared/owner-numbers");
    let count = |id: &str| redis::cmd("HGET").arg(&keys.hold).arg(format!("count:{id}")).clone();
    let (of_three, of_four): (Option<i64>, Option<i64>) = (
        count("pool\u{0}3").query_async(&mut conn).await.unwrap(),
        count("pool\u{0}4").query_async(&mut conn).await.unwrap(),
    );
    assert_eq!((of_three, of_four), (Some(2), Some(1)));
    let holder = locker.inspect(&name).await.unwrap().holder.expect("held");
    assert_eq!((holder.owner.as_str(), holder.token, holder.count), ("pool", four.token(), 1));
    for lease in [three, again, four] {
        lease.release().await.unwrap();
    }
    assert!(locker.inspect(&name).await.unwrap().holder.is_none());
}

/// A reader whose holder died lapses by its own ttl, even when a longer lease ended
/// first: the writer waiting on the hold hash is granted at the dead reader's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_share_lapses_by_its_own_ttl() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (a, b, w) = (
        dlock_redis::connect(config.clone()).await.unwrap(),
        dlock_redis::connect(config.clone()).await.unwrap(),
        dlock_redis::connect(config).await.unwrap(),
    );
    let name = LockName::new("shared/dead").unwrap();
    let long = a.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30)).read()).await.unwrap();
    // A fixed lease is never renewed: its holder might as well have died.
    let dead_ttl = Duration::from_millis(800);
    let _dead = b.acquire(&name, &LockOptions::fixed(dead_ttl).read()).await.unwrap();
    let granted_dead = Instant::now();
    long.release().await.unwrap();
    let writer = w.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30)).wait(Duration::from_secs(10))).await;
    let waited = granted_dead.elapsed();
    let writer = writer.expect("the writer is granted once the dead reader's share lapsed");
    assert!(waited >= dead_ttl - Duration::from_millis(50), "granted beside a live share: {waited:?}");
    assert!(waited < dead_ttl + Duration::from_secs(1), "the dead share held the writer up: {waited:?}");
    writer.release().await.unwrap();
}

/// A writer waiting for readers is woken by the last reader's release, and readers that
/// come meanwhile wait behind it; a permit waiter is woken by a permit's release. Each
/// waiter has a place, so the release's message goes to its client's wake-up channel
/// (a waiter also looks again on its own every quarter of its place lapse, so the message
/// itself is what shows the wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (a, b, w) = (
        dlock_redis::connect(config.clone()).await.unwrap(),
        dlock_redis::connect(config.clone()).await.unwrap(),
        dlock_redis::connect(config).await.unwrap(),
    );
    let long = |wait| LockOptions::watchdog(Duration::from_secs(30)).wait(wait);
    let woken = |sent: &[Sent], keys: &LockKeys| {
        sent.iter()
            .filter(|s| s.source == "lua" && s.command() == "publish")
            .any(|s| s.args.get(1).is_some_and(|channel| channel.starts_with(&keys.wake_prefix)))
    };
    let name = LockName::new("shared/woken").unwrap();
    let reader = a.acquire(&name, &long(Duration::ZERO).read()).await.unwrap();
    let writing = {
        let (w, name) = (w.clone(), name.clone());
        tokio::spawn(async move { w.acquire(&name, &long(Duration::from_secs(20))).await })
    };
    dlock_conformance::properties::eventually("the writer queues", Duration::from_secs(5), || async {
        a.inspect(&name).await.unwrap().waiters == Some(1)
    })
    .await;
    assert!(b.try_acquire(&name, &long(Duration::ZERO).read()).await.unwrap().is_none(), "a reader overtook");
    let mut monitor = Monitor::start(&server).await;
    reader.release().await.unwrap();
    let sent = monitor.collect().await;
    assert!(woken(&sent, &keys("shared/woken")), "the last reader's release woke nobody: {sent:#?}");
    let writer = tokio::time::timeout(Duration::from_secs(5), writing).await.expect("woken").unwrap().unwrap();
    writer.release().await.unwrap();

    let pool = LockName::new("shared/pool").unwrap();
    let one = move |wait| long(wait).permits(1);
    let permit = a.acquire(&pool, &one(Duration::ZERO)).await.unwrap();
    let waiting = {
        let (b, pool) = (b.clone(), pool.clone());
        tokio::spawn(async move { b.acquire(&pool, &one(Duration::from_secs(20))).await })
    };
    dlock_conformance::properties::eventually("the permit waiter queues", Duration::from_secs(5), || async {
        b.stats().waiting == 1 && a.inspect(&pool).await.unwrap().waiters == Some(1)
    })
    .await;
    let mut monitor = Monitor::start(&server).await;
    permit.release().await.unwrap();
    let sent = monitor.collect().await;
    assert!(woken(&sent, &keys("shared/pool")), "a permit's release woke nobody: {sent:#?}");
    let next = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap().unwrap();
    next.release().await.unwrap();
}

/// Inspect names the newest reader and counts the queue; results are stored under a
/// reader's share or a permit as under the lock, refused once the hold is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_results_for_readers_and_permits() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let name = LockName::new("shared/inspect").unwrap();
    let read = LockOptions::watchdog(Duration::from_secs(30)).owner(OwnerId::new("first").unwrap()).read();
    let first = a.acquire(&name, &read).await.unwrap();
    let again = a.acquire(&name, &read).await.unwrap();
    assert_eq!(again.token(), first.token(), "re-entered");
    let holder = b.inspect(&name).await.unwrap().holder.expect("held by a reader");
    assert_eq!((holder.owner.as_str(), holder.token, holder.count), ("first", first.token(), 2));
    assert!(holder.remaining.is_some_and(|left| left > Duration::from_secs(25)));
    let second = b.acquire(&name, &LockOptions::watchdog(Duration::from_secs(5)).read()).await.unwrap();
    let holder = a.inspect(&name).await.unwrap().holder.expect("held by readers");
    assert_eq!((holder.token, holder.count), (second.token(), 1), "the newest reader");
    assert!(holder.remaining.is_some_and(|left| left <= Duration::from_secs(5)));

    first.store_result(b"first", Duration::from_secs(60)).await.expect("a reader stores");
    second.store_result(b"second", Duration::from_secs(60)).await.expect("a later reader stores");
    assert!(matches!(first.store_result(b"again", Duration::from_secs(60)).await, Err(LockError::NotHeld { .. })));
    let stored = a.load_result(&name).await.unwrap().expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (second.token(), &b"second"[..]));
    for lease in [first, again, second] {
        lease.release().await.unwrap();
    }
    assert!(a.inspect(&name).await.unwrap().holder.is_none());

    let pool = LockName::new("shared/inspect-pool").unwrap();
    let permit = a.acquire(&pool, &LockOptions::watchdog(Duration::from_secs(30)).permits(2)).await.unwrap();
    let holder = b.inspect(&pool).await.unwrap().holder.expect("a permit is out");
    assert_eq!(holder.token, permit.token());
    permit.store_result(b"permit", Duration::from_secs(60)).await.expect("a permit stores");
    permit.release().await.unwrap();
    assert!(b.inspect(&pool).await.unwrap().holder.is_none());
    assert_eq!(b.load_result(&pool).await.unwrap().expect("kept").value, b"permit");
}

/// The raw baseline of `dlock bench` sends a reader's and a permit's uncontended
/// acquire and release as the library does, and leaves the lock free.
#[cfg(feature = "bench")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_covers_readers_and_permits() {
    use dlock_core::{HoldKind, RawBaseline};

    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let raw = dlock_redis::raw_baseline(config.clone()).await.unwrap();
    let locker = dlock_redis::connect(config).await.unwrap();
    let name = LockName::new("shared/raw").unwrap();
    for kind in [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit { permits: 4 }] {
        raw.acquire_release_kind(&name, kind).await.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert!(locker.inspect(&name).await.unwrap().holder.is_none(), "{kind:?} left a hold");
    }
}
