//! Clients through Sentinel follow a failover that raises no error on their connections:
//! the old master keeps running and taking writes until the Sentinel demotes it (8 s or
//! more later), and nothing but the Sentinel's announcement says that it is no longer the
//! master.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, RedisConfig, RedisLocker};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisSentinel, RedisServer};

/// How soon after the Sentinel names the new master every client must be granting there.
const FOLLOW_WITHIN: Duration = Duration::from_secs(5);

/// How many clients of `channel` the server at `addr` has.
fn subscribers(addr: SocketAddr, channel: &str) -> usize {
    let out = dlock_testkit::supervisor::redis::cli(addr, &["PUBSUB", "NUMSUB", channel]).unwrap_or_default();
    out.lines().nth(1).and_then(|count| count.trim().parse().ok()).unwrap_or(0)
}

/// The token of the hold of `name` on the server at `addr`, if it has one.
fn token_on(addr: SocketAddr, client: &RedisLocker, name: &LockName) -> Option<String> {
    let keys = client.backend().keys(name);
    let out = dlock_testkit::supervisor::redis::cli(addr, &["HGET", &keys.hold, "token"]).ok()?;
    Some(out.trim().to_string()).filter(|token| !token.is_empty())
}

/// Grants `probe` to `client` until a grant lands on `master`, or panics at `deadline`.
async fn grants_on(master: SocketAddr, who: &str, client: &RedisLocker, probe: &LockName, deadline: Instant) {
    loop {
        let lease = client.try_acquire(probe, &LockOptions::new()).await.unwrap().expect("nobody else holds the probe");
        if token_on(master, client, probe) == Some(lease.token().to_string()) {
            lease.release().await.unwrap();
            return;
        }
        // Granted on the old master: the release may find the client on the new one
        // already, where the hold is not (`NotHeld`); the ttl frees the old master's.
        let _ = lease.release().await;
        assert!(Instant::now() < deadline, "{who} still grants on the old master {FOLLOW_WITHIN:?} after the failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A master with two replicas behind a Sentinel, and three clients without replica
/// acknowledgement: A idle, C holding a lock with a long ttl, B waiting for it. After a
/// forced failover, A and C grant on the new master, B's subscription moves there, and
/// C's release there wakes B, who is granted on the new master too, all within
/// [`FOLLOW_WITHIN`]. B could not get there by its ttl timer: C's hold has 20 s or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_waiting_clients_follow_a_failover_without_errors() {
    let (master, replicas, sentinel) = tokio::task::spawn_blocking(|| {
        let master = RedisServer::start(&ServerConfig::default()).expect("start the master");
        let replicas = [(); 2].map(|_| RedisServer::start_replica_of(&master, &ServerConfig::default()).unwrap());
        let sentinel = RedisSentinel::start(master.addr(), "locks").expect("start the sentinel");
        sentinel.wait_for_replicas(2).expect("the sentinel finds the replicas");
        (master, replicas, sentinel)
    })
    .await
    .unwrap();
    let config = RedisConfig::from_url(&sentinel.url())
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(support::CONNECT_TIMEOUT);
    let connect = || dlock_redis::connect(config.clone());
    let (a, b, c) = (connect().await.unwrap(), connect().await.unwrap(), connect().await.unwrap());
    let old = master.addr();

    let name = LockName::new("contended-across-failover").unwrap();
    let held = c.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.acquire(&name, &LockOptions::new().wait(Duration::from_secs(20))).await })
    };
    let channel = b.backend().keys(&name).channel;
    dlock_conformance::properties::eventually("B waits on the old master", Duration::from_secs(5), || {
        let ok = subscribers(old, &channel) == 1;
        async move { ok }
    })
    .await;
    // Both replicas have C's hold, whichever is promoted.
    let acked = master.cli(&["WAIT", "2", "5000"]).unwrap();
    assert_eq!(acked.trim(), "2", "the replicas acknowledge the hold");

    let (new, sentinel) = tokio::task::spawn_blocking(move || sentinel.failover(old).map(|new| (new, sentinel)))
        .await
        .unwrap()
        .expect("failover");
    let deadline = Instant::now() + FOLLOW_WITHIN;
    assert!(replicas.iter().any(|r| r.addr() == new));

    grants_on(new, "the idle client A", &a, &LockName::new("probe/a").unwrap(), deadline).await;
    grants_on(new, "the holder C", &c, &LockName::new("probe/c").unwrap(), deadline).await;
    assert!(!waiting.is_finished(), "B was granted while C held the lock: {:?}", waiting.await);
    let within = deadline.saturating_duration_since(Instant::now());
    dlock_conformance::properties::eventually("B's subscription moves to the new master", within, || {
        let ok = subscribers(new, &channel) >= 1;
        async move { ok }
    })
    .await;

    let released = held.token();
    held.release().await.unwrap();
    // B may hold it there already.
    assert_ne!(token_on(new, &c, &name), Some(released.to_string()), "C's release freed the lock on the new master");
    let within = deadline.saturating_duration_since(Instant::now());
    let lease = match tokio::time::timeout(within, waiting).await {
        Ok(granted) => granted.unwrap().expect("B acquires after C's release"),
        Err(_) => panic!("B was not woken by C's release on the new master within {FOLLOW_WITHIN:?} of the failover"),
    };
    assert_eq!(token_on(new, &b, &name), Some(lease.token().to_string()), "B was granted on the new master");
    assert!(lease.token() > released, "the fence counter was replicated: {} after {released}", lease.token());
    assert_eq!(sentinel.master_addr().unwrap(), new);
    lease.release().await.unwrap();

    // A client listens on the Sentinel until it is dropped. (One that held leases keeps
    // its connections until the renewal scheduler next looks at them.)
    let listening = || {
        let out = dlock_testkit::supervisor::redis::cli(sentinel.addr(), &["CLIENT", "LIST", "TYPE", "pubsub"]);
        out.unwrap_or_default().lines().filter(|line| line.contains("sub=")).count()
    };
    let listening_are = |count: usize, what: &'static str| {
        dlock_conformance::properties::eventually(what, Duration::from_secs(5), move || {
            let ok = listening() == count;
            async move { ok }
        })
    };
    let d = connect().await.unwrap();
    listening_are(4, "one subscription on the Sentinel per client").await;
    drop(d);
    listening_are(3, "a dropped client stops listening").await;
    drop((a, b, c));
    drop(master);
}
