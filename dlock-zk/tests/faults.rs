//! Faults particular to ZooKeeper: a holder's session expiring, a server clamping the
//! session timeout, a client cut off in the middle of its create, and an ensemble
//! losing its leader while locks are held and waited on (by contending workers, and by
//! a queue of ten served in order).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ZkFixture, MARGIN, TTL};
use dlock_conformance::fixture::Link;
use dlock_conformance::history::{FencedRegister, History, Op, Phase};
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::Fault;
use dlock_core::{LockError, LockOptions, Locker, LostReason};
use dlock_testkit::supervisor::zookeeper::{ZooKeeperConfig, ZooKeeperEnsemble};
use dlock_zk::{ConnectConfig, ZkConfig};

/// The holder's connection is cut past its session timeout: its lost signal fires before
/// the server expires the session, the queued waiter then gets the lock with a higher
/// token, and the holder's client opens a new session and locks again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_session_expires() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let (holder, link) = fixture.proxied_client().await;
    let waiter = fixture.zk_client().await;
    let name = unique_name("session-expiry");
    let opts = LockOptions::watchdog(TTL).wait(MARGIN);
    let lease = holder.acquire(&name, &opts).await.expect("acquire");

    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let lease = waiter.acquire(&name, &LockOptions::watchdog(TTL).wait(TTL * 5)).await;
            (Instant::now(), lease)
        })
    };
    eventually("the waiter is queued", MARGIN, || async {
        waiter.inspect(&name).await.map(|info| info.waiters == Some(1)).unwrap_or(false)
    })
    .await;

    let cut = Instant::now();
    link.cut();
    let reason =
        tokio::time::timeout(TTL + MARGIN, lease.lost()).await.expect("the cut-off holder's lost signal fires");
    let lost_at = Instant::now();
    let lost_after = lost_at.duration_since(cut);
    assert!(matches!(reason, LostReason::BackendUnavailable | LostReason::SessionExpired), "lost reason {reason:?}");
    assert!(lost_after < TTL, "lost {lost_after:?} after the cut: not before the session could expire ({TTL:?})");

    let (granted_at, next) = queued.await.expect("waiter task");
    let next = next.expect("the waiter gets the lock once the holder's session expired");
    assert!(lost_at <= granted_at, "the waiter was granted before the holder's lost signal fired");
    assert!(next.token() > lease.token(), "token {} after {}", next.token(), lease.token());
    assert!(lease.is_lost() && lease.remaining().is_zero());
    assert!(matches!(lease.release().await, Err(LockError::NotHeld { .. })));

    // The holder comes back: its old session is over, a new one serves it.
    link.restore();
    let next_token = next.token();
    next.release().await.expect("release");
    let again = holder
        .acquire(&name, &LockOptions::watchdog(TTL).wait(TTL * 2 + MARGIN))
        .await
        .expect("the holder's client locks again on a new session");
    assert!(again.token() > next_token);
    again.release().await.expect("release");
}

/// A server that clamps the session timeout below the lease's ttl: the negotiated
/// timeout, not the requested ttl, bounds the hold. Cut off, the holder's lost signal
/// fires before the server can expire its session, although its 20 s lease would
/// otherwise count itself valid far longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_timeout_bounds_the_hold() {
    dlock_conformance::init_tracing();
    let clamp = Duration::from_secs(2);
    let fixture =
        ZkFixture::with_server_config(ZooKeeperConfig { max_session_timeout: clamp, ..ZooKeeperConfig::default() })
            .await;
    let (holder, link) = fixture.proxied_client().await;
    let other = fixture.zk_client().await;
    let name = unique_name("clamped");
    let long = Duration::from_secs(20);
    let lease = holder.acquire(&name, &LockOptions::watchdog(long).wait(MARGIN)).await.expect("acquire");
    let negotiated: Vec<Duration> = holder.backend().sessions().into_iter().map(|(_, n)| n).collect();
    assert!(negotiated.iter().all(|n| *n == clamp), "the server clamps the session timeout: {negotiated:?}");
    // The lease counts its validity from the negotiated timeout, not from its ttl.
    assert!(lease.remaining() < clamp, "a lease on a {clamp:?} session counts {:?} valid", lease.remaining());

    link.cut();
    let next = other
        .acquire(&name, &LockOptions::watchdog(TTL).wait(clamp + MARGIN))
        .await
        .expect("the lock frees when the clamped session expires, long before the ttl");
    assert!(lease.is_lost(), "another client was granted while the holder still counted itself valid");
    assert!(lease.remaining().is_zero());
    assert!(next.token() > lease.token());
    next.release().await.expect("release");
}

/// A client cut off while its create is in flight (the server applies the create, the
/// reply never arrives) leaves no node that blocks the queue: its session lives on, yet
/// a waiter queued behind the create gets the lock as soon as the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_cut_off_leaves_no_orphan() {
    dlock_conformance::init_tracing();
    let fixture = ZkFixture::standalone().await;
    let admin = fixture.admin().await;
    let holder = fixture.zk_client().await;
    let waiter = fixture.zk_client().await;
    let (cut_off, proxy) = fixture.fault_proxied_client().await;
    let name = unique_name("cut-create");
    let lock_path = fixture.config().lock_path(&name);
    // A long session, so the cut does not expire it: an orphan would live on.
    let long = LockOptions::watchdog(Duration::from_secs(30)).wait(MARGIN);
    let held = holder.acquire(&name, &LockOptions::watchdog(TTL).wait(MARGIN)).await.expect("acquire");
    let witness = cut_off.acquire(&unique_name("witness"), &long).await.expect("the cut-off client holds another lock");

    // Replies (and requests) reach the other side only after a delay: the create is
    // applied, and the link is cut before its reply comes back.
    proxy.set_fault(Fault::Delay(Duration::from_millis(400)));
    let attempt = {
        let (cut_off, name, long) = (cut_off.clone(), name.clone(), long.clone());
        tokio::spawn(async move { cut_off.acquire(&name, &long).await })
    };
    eventually("the cut-off client's create is applied", MARGIN, || async {
        common::queue(&admin, &lock_path).await.len() == 2
    })
    .await;
    proxy.set_fault(Fault::Cut);
    let outcome = attempt.await.expect("attempt task");
    assert!(matches!(outcome, Err(LockError::Unavailable { .. })), "the cut-off acquire: {outcome:?}");
    proxy.set_fault(Fault::None);

    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.acquire(&name, &LockOptions::watchdog(TTL).wait(MARGIN * 3)).await })
    };
    eventually("the waiter is queued", MARGIN, || async { waiter.stats().waiting == 1 }).await;
    held.release().await.expect("release");
    let next = queued.await.expect("waiter task").expect("no orphan node blocks the waiter");
    assert!(!witness.is_lost(), "the cut-off client's session must have lived on");
    let queue = common::queue(&admin, &lock_path).await;
    assert_eq!(queue.len(), 1, "only the new holder's node is left: {queue:?}");
    next.release().await.expect("release");
    witness.release().await.expect("the cut-off client's session is alive");
}

/// A 3-member ensemble and the client settings for it.
fn start_ensemble() -> (ZooKeeperEnsemble, ZkConfig) {
    let ensemble = tokio::task::block_in_place(|| ZooKeeperEnsemble::start(3, &ZooKeeperConfig::default()))
        .expect("start a 3-member ensemble");
    let config = ZkConfig::from_url(&ensemble.url())
        .expect("ensemble URL")
        .with_op_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(5));
    (ensemble, config)
}

/// kill -9 of the leader; returns once the others serve again under a new one.
fn kill_the_leader(ensemble: &mut ZooKeeperEnsemble) -> usize {
    let leader = ensemble.leader().expect("the ensemble has a leader");
    ensemble.kill(leader);
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| ensemble.wait_serving(Duration::from_secs(30))).expect("the rest elects a leader");
    tracing::info!(elected_after = ?killed_at.elapsed(), "new leader");
    leader
}

/// A 3-member ensemble loses a member (kill -9 of the leader) while one lock is held and
/// waited on by four clients: every wait completes, no two holders overlap, tokens
/// strictly increase across the new leader's epoch, and the fenced register accepts
/// every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_loses_a_member() {
    dlock_conformance::init_tracing();
    let (mut ensemble, config) = start_ensemble();
    let ttl = Duration::from_secs(4);
    let name = unique_name("ensemble");
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    const WORKERS: usize = 4;
    const ITERATIONS: usize = 25;

    let (progress_tx, mut progress) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let mut workers = Vec::new();
    for process in 0..WORKERS {
        let client = dlock_zk::connect(config.clone()).await.expect("connect to the ensemble");
        let (name, history, register, progress) =
            (name.clone(), history.clone(), register.clone(), progress_tx.clone());
        workers.push(tokio::spawn(async move {
            let opts = LockOptions::watchdog(ttl).wait(Duration::from_secs(30));
            let mut failures = 0;
            for round in 0..ITERATIONS {
                let lease = loop {
                    history.record(process, Op::Acquire, Phase::Invoke, None);
                    match client.acquire(&name, &opts).await {
                        Ok(lease) => break lease,
                        Err(err) => {
                            history.record(process, Op::Acquire, Phase::Fail, None);
                            failures += 1;
                            assert!(failures < 50, "worker {process}: acquire keeps failing: {err}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                };
                history.record(process, Op::Acquire, Phase::Ok, Some(lease.token()));
                tokio::select! {
                    _ = lease.lost() => history.record(process, Op::Lost, Phase::Ok, None),
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {
                        register.write(process, lease.token(), round as u64).expect("the register refused a holder");
                    }
                }
                history.record(process, Op::Release, Phase::Invoke, None);
                let _ = lease.release().await;
                let _ = progress.send(process);
            }
        }));
    }
    drop(progress_tx);

    // Let the workers get going, then kill the leader while the lock is busy.
    for _ in 0..WORKERS * 3 {
        progress.recv().await.expect("progress");
    }
    let leader = kill_the_leader(&mut ensemble);

    let finish = async {
        for worker in workers {
            worker.await.expect("worker");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), finish).await.expect("every wait completes");
    let report = history.check();
    assert_eq!(report.holds, WORKERS * ITERATIONS);
    assert!(report.is_clean(), "history: {report}");
    assert!(ensemble.leader().is_some_and(|l| l != leader), "a new leader took over");
}

/// Ten waiters queued in order behind a holder while the ensemble's leader is killed:
/// once a new leader serves and the holder releases, the waiters are granted in the
/// order they queued, each once, with strictly increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_a_queue_of_ten_serves_it_in_order() {
    dlock_conformance::init_tracing();
    let (mut ensemble, config) = start_ensemble();
    // Sessions outlive the election, so no waiter loses its place in the queue.
    let opts = LockOptions::watchdog(Duration::from_secs(10)).wait(Duration::from_secs(90));
    let name = unique_name("queue");
    const WAITERS: usize = 10;

    let holder_client = dlock_zk::connect(config.clone()).await.expect("connect to the ensemble");
    let holder = holder_client.acquire(&name, &opts).await.expect("the first holder");
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for place in 1..=WAITERS {
        let client = dlock_zk::connect(config.clone()).await.expect("connect to the ensemble");
        let (own_name, opts, granted) = (name.clone(), opts.clone(), granted_tx.clone());
        waiters.push(tokio::spawn(async move {
            let lease = client.acquire(&own_name, &opts).await.unwrap_or_else(|e| panic!("waiter {place}: {e}"));
            let _ = granted.send((place, lease.token()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            lease.release().await.unwrap_or_else(|e| panic!("waiter {place} releases: {e}"));
        }));
        // The next waiter queues only once this one is in the queue.
        eventually(&format!("waiter {place} queues"), Duration::from_secs(10), || {
            let (client, name) = (holder_client.clone(), name.clone());
            async move { client.inspect(&name).await.is_ok_and(|info| info.waiters == Some(place)) }
        })
        .await;
    }
    drop(granted_tx);

    kill_the_leader(&mut ensemble);
    assert!(!holder.is_lost(), "the holder's session outlives the election: {:?}", holder.lost_reason());
    let first_token = holder.token();
    holder.release().await.expect("the holder releases after the election");

    let mut order = Vec::new();
    while let Some(grant) = tokio::time::timeout(Duration::from_secs(60), granted.recv()).await.expect("grants go on") {
        order.push(grant);
    }
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    let places: Vec<usize> = order.iter().map(|(place, _)| *place).collect();
    assert_eq!(places, (1..=WAITERS).collect::<Vec<_>>(), "grants out of queue order");
    let mut last = first_token;
    for (place, token) in order {
        assert!(token > last, "waiter {place}'s token {token} after {last}");
        last = token;
    }
}
