//! The lock scripts as a server runs them: each call is idempotent per request (a client
//! library that re-sends a call, or a retry after a broken connection, changes nothing
//! the second time), and the last release works when the server is out of memory.

mod support;

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::scripts::{scripts, AcquireReply, Invocation, ReleaseReply};
use dlock_redis::KeyLayout;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use redis::aio::MultiplexedConnection;

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    let addr = server.addr();
    redis::Client::open(format!("redis://{}:{}", addr.ip(), addr.port()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn count(conn: &mut MultiplexedConnection, hold: &str, owner: &str) -> Option<i64> {
    redis::cmd("HGET").arg(hold).arg(owner).query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_and_releases_sent_twice_count_once() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = KeyLayout::new("dlock").unwrap().lock(&LockName::new("resent").unwrap());
    let owner = "owner:job-7";
    let acquire = |grant: &str| support::acquire_call(&keys, owner, grant);
    let release = |grant: &str, token: u64| support::release_call(&keys, owner, grant, token);

    // One grant, its call delivered twice: one hold.
    let first = AcquireReply::parse(acquire("a:1").run(&mut conn).await.unwrap()).unwrap();
    let again = AcquireReply::parse(acquire("a:1").run(&mut conn).await.unwrap()).unwrap();
    let AcquireReply::Granted(token) = first else { panic!("not granted: {first:?}") };
    assert_eq!(again, AcquireReply::Granted(token));
    assert_eq!(count(&mut conn, &keys.hold, owner).await, Some(1));

    // A second grant of the same owner (re-entry), delivered twice: two holds.
    acquire("a:2").run(&mut conn).await.unwrap();
    acquire("a:2").run(&mut conn).await.unwrap();
    assert_eq!(count(&mut conn, &keys.hold, owner).await, Some(2));

    // The first grant's release, delivered twice, frees that grant only.
    let once = ReleaseReply::parse(release("a:1", token).run(&mut conn).await.unwrap()).unwrap();
    let twice = ReleaseReply::parse(release("a:1", token).run(&mut conn).await.unwrap()).unwrap();
    assert_eq!((once, twice), (ReleaseReply::Released, ReleaseReply::AlreadyReleased));
    assert_eq!(count(&mut conn, &keys.hold, owner).await, Some(1), "the other grant still holds the lock");

    // The last one frees the lock.
    let last = ReleaseReply::parse(release("a:2", token).run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(last, ReleaseReply::Released);
    let exists: bool = redis::cmd("EXISTS").arg(&keys.hold).query_async(&mut conn).await.unwrap();
    assert!(!exists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_given_back_is_not_made_by_a_late_delivery() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let mut conn = connection(&server).await;
    let keys = KeyLayout::new("dlock").unwrap().lock(&LockName::new("late").unwrap());
    let void = format!("{}:void:r:1", keys.hold);
    let give_back = Invocation::new(&scripts().give_back, &[&keys.hold, &void, &keys.queue, &keys.places])
        .arg("owner:r:1")
        .arg("grant:r:1")
        .arg(&keys.channel)
        .arg(30_000)
        .arg("r:1")
        .arg(&keys.wake_prefix);
    let acquire = support::acquire_call_placed(&keys, "owner:r:1", "r:1", ("2", 5_000));
    let given: i64 = redis::from_redis_value(give_back.run(&mut conn).await.unwrap()).unwrap();
    assert_eq!(given, 0, "nothing was granted yet");
    // The acquire arrives after its give-back (held up on another connection).
    let reply = AcquireReply::parse(acquire.run(&mut conn).await.unwrap()).unwrap();
    assert!(matches!(reply, AcquireReply::Busy { queued: false, .. }), "{reply:?}");
    let exists: bool = redis::cmd("EXISTS").arg(&keys.hold).query_async(&mut conn).await.unwrap();
    assert!(!exists, "a late acquire of a request given back made a hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_release_works_when_the_server_is_out_of_memory() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("out-of-memory").unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    // noeviction (the default) at a limit below what is used: every write that may grow
    // memory is refused with OOM.
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let released = lease.release().await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    released.expect("the release of the last hold works out of memory");
    assert!(locker.inspect(&name).await.unwrap().holder.is_none());
}
