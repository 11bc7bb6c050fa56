//! Clients through Sentinel follow a failover that raises no error on their connections:
//! the old master keeps running and taking writes until the Sentinel demotes it (8 s or
//! more later), and nothing but the Sentinels (their announcement, or their answer when
//! asked) says that it is no longer the master. A frozen Sentinel stalls no lookup, and
//! Sentinels that still name the old master are outweighed by the newer configuration.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_conformance::Fault;
use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, RedisConfig, RedisLocker};
use dlock_testkit::proxy::FaultProxy;
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
/// A failed attempt (the old master demoted meanwhile answers `READONLY`) is tried again.
async fn grants_on(master: SocketAddr, who: &str, client: &RedisLocker, probe: &LockName, deadline: Instant) {
    loop {
        match client.try_acquire(probe, &LockOptions::new()).await {
            Ok(lease) => {
                let lease = lease.expect("nobody else holds the probe");
                if token_on(master, client, probe) == Some(lease.token().to_string()) {
                    lease.release().await.unwrap();
                    return;
                }
                // Granted on the old master: the release may find the client on the new
                // one already, where the hold is not (`NotHeld`); the ttl frees the old
                // master's.
                let _ = lease.release().await;
                assert!(
                    Instant::now() < deadline,
                    "{who} still grants on the old master {FOLLOW_WITHIN:?} after the failover"
                );
            }
            Err(err) => {
                assert!(Instant::now() < deadline, "{who} cannot grant {FOLLOW_WITHIN:?} after the failover: {err}")
            }
        }
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

/// A connect timeout below the second that each Sentinel in turn could take before (the
/// Sentinel client of the `redis` crate gives a connection to a Sentinel 1 s), so that a
/// frozen Sentinel asked first made every lookup miss it.
const SHORT_CONNECT: Duration = Duration::from_millis(900);

/// A client of `config` (with [`SHORT_CONNECT`]), in one of five attempts: on a loaded
/// machine one connect (scripts loaded one by one) may miss so short a bound, while a
/// connect that waits a second for a frozen Sentinel misses it every time.
async fn connect_quickly(config: &RedisConfig, what: &str) -> RedisLocker {
    let mut failed = Vec::new();
    for _ in 0..5 {
        match dlock_redis::connect(config.clone()).await {
            Ok(client) => return client,
            Err(err) => failed.push(err.to_string()),
        }
    }
    panic!("{what}: no connect within {SHORT_CONNECT:?} in five attempts: {failed:?}")
}

/// A master, its replica and two Sentinels, the first of which freezes (SIGSTOP: it
/// accepts connections and never answers, as a frozen host). A client connects within
/// [`SHORT_CONNECT`] all the same, and it and a client that connected before the freeze
/// follow a failover run by the other Sentinel. They reach that Sentinel through a proxy
/// that is cut while the failover runs, so they miss its announcements and must ask the
/// Sentinels when they reach them again (each subscription made again asks); the old
/// master meanwhile keeps running as a master, so only the Sentinels' answer can move
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_sentinel_stalls_neither_a_connect_nor_a_lookup_after_a_failover() {
    let (master, replica, mut frozen, sentinel) = tokio::task::spawn_blocking(|| {
        let master = RedisServer::start(&ServerConfig::default()).expect("start the master");
        let replica = RedisServer::start_replica_of(&master, &ServerConfig::default()).expect("start the replica");
        let frozen = RedisSentinel::start(master.addr(), "locks").expect("start the first sentinel");
        let sentinel = RedisSentinel::start(master.addr(), "locks").expect("start the second sentinel");
        sentinel.wait_for_replicas(1).expect("the sentinel finds the replica");
        (master, replica, frozen, sentinel)
    })
    .await
    .unwrap();
    let front = FaultProxy::start(sentinel.addr()).await.unwrap();
    let url = format!("redis+sentinel://{},{}/locks", frozen.addr(), front.addr());
    let config =
        RedisConfig::from_url(&url).unwrap().with_op_timeout(support::OP_TIMEOUT).with_connect_timeout(SHORT_CONNECT);
    let before = connect_quickly(&config, "with both Sentinels up").await;
    frozen.process().pause().expect("freeze the first sentinel");

    let after = connect_quickly(&config, "with the first Sentinel frozen").await;
    let old = master.addr();
    let soon = Instant::now() + FOLLOW_WITHIN;
    grants_on(old, "the client connected before the freeze", &before, &LockName::new("probe/before").unwrap(), soon)
        .await;
    grants_on(old, "the client connected after the freeze", &after, &LockName::new("probe/after").unwrap(), soon).await;

    front.set_fault(Fault::Cut);
    let (new, sentinel) = tokio::task::spawn_blocking(move || {
        let new = sentinel.failover(old).expect("failover");
        // Its announcement of the switch (the last) has gone by once its own record of the
        // master names the new one.
        let deadline = Instant::now() + Duration::from_secs(10);
        while sentinel.master_info().ok().and_then(|info| Some(format!("{}:{}", info.get("ip")?, info.get("port")?)))
            != Some(new.to_string())
        {
            assert!(Instant::now() < deadline, "the sentinel does not switch to {new}");
            std::thread::sleep(Duration::from_millis(50));
        }
        (new, sentinel)
    })
    .await
    .unwrap();
    assert_eq!(new, replica.addr());
    assert_eq!(master.cli(&["ROLE"]).unwrap().lines().next(), Some("master"), "the old master still runs as a master");
    front.set_fault(Fault::None);

    let deadline = Instant::now() + FOLLOW_WITHIN;
    grants_on(
        new,
        "the client connected before the freeze",
        &before,
        &LockName::new("probe/before").unwrap(),
        deadline,
    )
    .await;
    grants_on(new, "the client connected after the freeze", &after, &LockName::new("probe/after").unwrap(), deadline)
        .await;
    frozen.process().resume().expect("thaw the first sentinel");
    drop((before, after, sentinel));
}

/// Two Sentinels that came up with the configuration from before a failover (config
/// epoch 0, naming the old master) and never learn the newer one (their user on the old
/// master may not use pub/sub, where Sentinels hear each other), listed first and
/// outnumbering the Sentinel that ran the failover (config epoch 1). The old master still
/// runs as a master (it cannot be demoted: its `REPLICAOF` is disabled) and answers as
/// one. A client connects to the master of the newest configuration all the same, and
/// does not move back when a lookup hears only the stale Sentinels (the other one killed,
/// and a stale one restarted: the client's subscription to it, made again, looks up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_follows_the_newest_configuration_over_sentinels_naming_the_old_master() {
    let (master, new, mut sentinel, stale) = tokio::task::spawn_blocking(|| {
        let undemotable = ServerConfig {
            extra_args: ["--rename-command", "REPLICAOF", "", "--rename-command", "SLAVEOF", ""]
                .map(String::from)
                .into(),
            ..Default::default()
        };
        let master = RedisServer::start(&undemotable).expect("start the master");
        let replica = RedisServer::start_replica_of(&master, &ServerConfig::default()).expect("start the replica");
        let sentinel = RedisSentinel::start(master.addr(), "locks").expect("start the sentinel");
        sentinel.wait_for_replicas(1).expect("the sentinel finds the replica");
        let new = sentinel.failover(master.addr()).expect("failover");
        assert_eq!(new, replica.addr());
        master.cli(&["ACL", "SETUSER", "stale", "on", ">stale", "~*", "resetchannels", "+@all"]).unwrap();
        let stale = [(); 2].map(|_| {
            let auth = ["sentinel auth-user locks stale", "sentinel auth-pass locks stale"];
            RedisSentinel::start_with_config(master.addr(), "locks", 1, &auth).expect("start a stale sentinel")
        });
        (master, replica, sentinel, stale)
    })
    .await
    .unwrap();
    let (old, new_addr) = (master.addr(), new.addr());
    let record = |sentinel: &RedisSentinel| {
        let info = sentinel.master_info().unwrap();
        let named = format!("{}:{}", info["ip"], info["port"]);
        (info["config-epoch"].parse::<u64>().unwrap(), named, info["flags"].clone())
    };
    for s in &stale {
        let (stale_epoch, named, flags) = record(s);
        assert_eq!((stale_epoch, named), (0, old.to_string()), "a stale sentinel names the old master at epoch 0");
        assert!(!flags.contains("down"), "a stale sentinel sees the old master up: {flags}");
    }
    assert!(record(&sentinel).0 >= 1, "the failover raised the config epoch");
    assert_eq!(sentinel.master_addr().unwrap(), new_addr);
    assert_eq!(master.cli(&["ROLE"]).unwrap().lines().next(), Some("master"), "the old master answers as a master");

    let url = format!("redis+sentinel://{},{},{}/locks", stale[0].addr(), stale[1].addr(), sentinel.addr());
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .with_op_timeout(support::OP_TIMEOUT)
        .with_connect_timeout(support::CONNECT_TIMEOUT);
    let client = dlock_redis::connect(config).await.expect("connect");
    let name = LockName::new("newest-configuration").unwrap();
    let lease = client.try_acquire(&name, &LockOptions::new()).await.unwrap().expect("free");
    let token = Some(lease.token().to_string());
    assert_eq!(token_on(old, &client, &name), None, "granted on the old master, which the stale Sentinels name");
    assert_eq!(token_on(new_addr, &client, &name), token, "granted on the new master");
    lease.release().await.unwrap();

    sentinel.kill();
    let [mut first, second] = stale;
    let first = tokio::task::spawn_blocking(move || {
        first.kill();
        first.start_again().expect("restart a stale sentinel");
        first
    })
    .await
    .unwrap();
    let asked = || {
        let clients = dlock_testkit::supervisor::redis::cli(first.addr(), &["CLIENT", "LIST"]).unwrap_or_default();
        clients.contains("cmd=sentinel|")
    };
    dlock_conformance::properties::eventually(
        "the client asks the restarted Sentinel",
        Duration::from_secs(10),
        || {
            let ok = asked();
            async move { ok }
        },
    )
    .await;
    // Moving back would follow the stale answers at once; a few grants over a moment show
    // that none lands on the old master.
    for _ in 0..5 {
        let lease = client.try_acquire(&name, &LockOptions::new()).await.unwrap().expect("free");
        let token = Some(lease.token().to_string());
        assert_eq!(token_on(old, &client, &name), None, "moved back to the old master after a stale lookup");
        assert_eq!(token_on(new_addr, &client, &name), token, "stays on the new master");
        lease.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((client, new, second));
}
