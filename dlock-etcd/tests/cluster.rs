//! Faults on a 3-member etcd cluster: the leader killed while a lock is held and waited
//! for, a holder frozen past its ttl whose guarded write is refused when it wakes, the
//! holder's member partitioned from the majority, and the leader partitioned while grants
//! are in flight.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::history::{FencedRegister, History, Op, Phase};
use dlock_conformance::properties::{eventually, unique_name};
use dlock_conformance::Link;
use dlock_core::{FencingToken, LockError, LockName, LockOptions, Locker, LostReason};
use dlock_etcd::EtcdLocker;
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::etcd::{EtcdCluster, EtcdConfig as ServerConfig};
use etcd_client::TxnOp;

const MARGIN: Duration = Duration::from_secs(5);

async fn start_cluster() -> EtcdCluster {
    tokio::task::spawn_blocking(|| {
        let mut cluster = EtcdCluster::start(3, &ServerConfig::default())?;
        cluster.wait_for_leader(Duration::from_secs(20))?;
        Ok::<_, std::io::Error>(cluster)
    })
    .await
    .expect("spawn_blocking")
    .expect("start a 3-member etcd cluster")
}

async fn connect(url: &str) -> EtcdLocker {
    dlock_etcd::connect(common::config(url)).await.expect("connect to the cluster")
}

/// Holds `name` once for `hold`, recording the hold (and a loss) in `history` and writing
/// the register with the token while it holds.
async fn hold_once(
    process: usize,
    client: &EtcdLocker,
    name: &LockName,
    opts: &LockOptions,
    history: &History,
    register: &FencedRegister,
    hold: Duration,
) -> Result<FencingToken, LockError> {
    history.record(process, Op::Acquire, Phase::Invoke, None);
    let lease = match client.acquire(name, opts).await {
        Ok(lease) => lease,
        Err(err) => {
            history.record(process, Op::Acquire, Phase::Fail, None);
            return Err(err);
        }
    };
    let token = lease.token();
    history.record(process, Op::Acquire, Phase::Ok, Some(token));
    tokio::select! {
        _ = lease.lost() => {
            history.record(process, Op::Lost, Phase::Ok, None);
            return Ok(token);
        }
        // The work done under the lock.
        _ = tokio::time::sleep(hold) => {}
    }
    let _ = register.write(process, token, token.get());
    history.record(process, Op::Release, Phase::Invoke, None);
    let _ = lease.release().await;
    Ok(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_and_waited_for() {
    dlock_conformance::init_tracing();
    let mut cluster = start_cluster().await;
    let url = cluster.url();
    let admin = connect(&url).await;
    let name = unique_name("leader-killed");
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    // A ttl that outlasts an election, so the holder can keep the lock through it.
    let opts = LockOptions::watchdog(Duration::from_secs(3)).wait(Duration::from_secs(60));

    let holder = connect(&url).await;
    history.record(0, Op::Acquire, Phase::Invoke, None);
    let lease = holder.acquire(&name, &opts).await.expect("acquire");
    history.record(0, Op::Acquire, Phase::Ok, Some(lease.token()));

    const WAITERS: usize = 3;
    let mut waiters = Vec::new();
    for process in 1..=WAITERS {
        let client = connect(&url).await;
        let (name, opts, history, register) = (name.clone(), opts.clone(), history.clone(), register.clone());
        waiters.push(tokio::spawn(async move {
            hold_once(process, &client, &name, &opts, &history, &register, Duration::from_millis(50)).await
        }));
    }
    eventually("every waiter is queued", MARGIN, || async {
        admin.inspect(&name).await.is_ok_and(|info| info.waiters == Some(WAITERS))
    })
    .await;

    let leader = cluster.leader().expect("a leader");
    tokio::task::block_in_place(|| cluster.member(leader).kill());
    let new_leader = tokio::task::block_in_place(|| cluster.wait_for_leader(Duration::from_secs(20)))
        .expect("the survivors elect a leader");
    assert_ne!(new_leader, leader);

    // The holder lets go after the election, if it kept the lock through it.
    if lease.is_lost() {
        history.record(0, Op::Lost, Phase::Ok, None);
    } else {
        let _ = register.write(0, lease.token(), lease.token().get());
        history.record(0, Op::Release, Phase::Invoke, None);
        let released = lease.release().await;
        tracing::info!(?released, "the holder released after the election");
    }
    let mut last = FencingToken::new(0);
    for waiter in waiters {
        let token = waiter.await.expect("waiter task").expect("a waiter rides out the election and gets the lock");
        last = last.max(token);
    }
    let report = history.check();
    assert_eq!(report.holds, WAITERS + 1);
    assert!(report.is_clean(), "history: {report}");

    // The lock keeps working after the election, and after the old leader returns.
    let after = admin.acquire(&name, &opts).await.expect("acquire after the election");
    assert!(after.token() > last, "token {} after {last}", after.token());
    after.release().await.expect("release");
    tokio::task::block_in_place(|| cluster.member(leader).start_again()).expect("restart the old leader");
    let again = admin.acquire(&name, &opts).await.expect("acquire with every member back");
    assert!(again.token() > last);
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_loses_the_lock_and_its_guarded_write() {
    dlock_conformance::init_tracing();
    let mut cluster = start_cluster().await;
    let url = cluster.url();
    let ttl = Duration::from_secs(1);
    let name = unique_name("frozen-holder");
    let data = format!("data/{}", name.encoded());

    // The holder reaches one member through a proxy that can freeze its traffic.
    let member = cluster.endpoints()[0].trim_start_matches("http://").parse().expect("member address");
    let proxy = FaultProxy::start(member).await.expect("proxy");
    let holder = match dlock_etcd::connect(common::config(&format!("etcd://{}", proxy.addr()))).await {
        Ok(holder) => holder,
        Err(err) => {
            let member = cluster.member(0);
            let running = member.is_running();
            panic!("connect through the proxy: {err}; member running: {running}; log:\n{}", member.process().log_tail())
        }
    };
    let waiter = connect(&url).await;

    let held = holder.acquire(&name, &LockOptions::watchdog(ttl).wait(MARGIN)).await.expect("acquire");
    let written = holder.backend().guarded(&name, held.token(), [TxnOp::put(data.clone(), "holder", None)]).await;
    assert!(written.expect("guarded write").succeeded(), "the holder's guarded write applies while it holds");

    let next = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.acquire(&name, &LockOptions::watchdog(ttl).wait(ttl + MARGIN * 2)).await })
    };
    eventually("the waiter is queued", MARGIN, || async {
        waiter.inspect(&name).await.is_ok_and(|info| info.waiters == Some(1))
    })
    .await;

    proxy.blackhole();
    let next = next.await.expect("waiter task").expect("the waiter gets the lock of the frozen holder");
    assert!(next.token() > held.token(), "token {} after {}", next.token(), held.token());
    assert!(held.remaining().is_zero(), "the frozen holder still counted itself valid at the new grant");
    let written = waiter.backend().guarded(&name, next.token(), [TxnOp::put(data.clone(), "waiter", None)]).await;
    assert!(written.expect("guarded write").succeeded());
    let reason = tokio::time::timeout(MARGIN, held.lost()).await.expect("the frozen holder's lost signal fires");
    assert_ne!(reason, LostReason::Stolen, "the frozen holder could not have seen the new holder");

    // The holder wakes up, unaware, and writes with its old token: refused.
    proxy.restore();
    let stale = holder.backend().guarded(&name, held.token(), [TxnOp::put(data.clone(), "stale", None)]).await;
    assert!(!stale.expect("the guarded transaction runs").succeeded(), "a stale holder's guarded write applied");
    let mut etcd = waiter.backend().etcd().await.expect("etcd client");
    let value = etcd.get(data, None).await.expect("read the data").kvs().first().map(|kv| kv.value().to_vec());
    assert_eq!(value.as_deref(), Some(&b"waiter"[..]));
    assert!(matches!(held.release().await, Err(LockError::NotHeld { .. })));
    next.release().await.expect("release");
}

/// Renewals are not cut at the operation timeout, but a member that leaves a request
/// unanswered that long is left for another: with each member black-holed in turn (the
/// client's own link to it, as when one host hangs), the holder keeps its lease, because
/// the renewal sent beside the hung one goes to a member that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_move_on_from_a_member_that_hangs() {
    dlock_conformance::init_tracing();
    let mut cluster = start_cluster().await;
    let mut proxies = Vec::new();
    for member in cluster.members().iter_mut() {
        proxies.push(FaultProxy::start(member.addr()).await.expect("start a fault proxy"));
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let client = connect(&format!("etcd://{}", hosts.join(","))).await;
    let other = connect(&cluster.url()).await;
    let name = unique_name("member-hangs");
    let ttl = Duration::from_secs(3);
    let lease = client.acquire(&name, &LockOptions::watchdog(ttl).wait(MARGIN)).await.expect("acquire");

    for proxy in &proxies {
        let link = proxy.link();
        link.blackhole();
        tokio::time::sleep(ttl * 2).await;
        link.restore();
        assert!(!lease.is_lost(), "the lease was lost while one member hung: {:?}", lease.lost_reason());
        let intruder = other.try_acquire(&name, &LockOptions::new()).await.expect("try_acquire");
        assert!(intruder.is_none(), "another client got the lock while its holder renewed");
    }
    lease.release().await.expect("release");
}

/// The holder's member is cut off from the other two (its client still reaches it): its
/// renewals cannot reach a leader, so the holder learns it lost before the majority's
/// leader expires its lease and grants the waiter; its late fenced write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_on_a_partitioned_member_learns_first() {
    dlock_conformance::init_tracing();
    let mut cluster = start_cluster().await;
    let leader = cluster.leader().expect("a leader");
    let cut = (leader + 1) % 3;
    let endpoints = cluster.endpoints();
    let only = |i: usize| format!("etcd://{}", endpoints[i].trim_start_matches("http://"));
    let majority: Vec<String> =
        (0..3).filter(|&i| i != cut).map(|i| endpoints[i].trim_start_matches("http://").to_string()).collect();
    let holder = connect(&only(cut)).await;
    let waiter = connect(&format!("etcd://{}", majority.join(","))).await;
    let name = unique_name("member-partitioned");
    let history = History::new();
    let register = FencedRegister::new(history.clone());
    let ttl = Duration::from_secs(2);

    history.record(0, Op::Acquire, Phase::Invoke, None);
    let held = holder.acquire(&name, &LockOptions::watchdog(ttl).wait(MARGIN)).await.expect("acquire");
    history.record(0, Op::Acquire, Phase::Ok, Some(held.token()));
    register.write(0, held.token(), 1).expect("the holder writes while it holds");
    let next = {
        let (waiter, name, history) = (waiter.clone(), name.clone(), history.clone());
        tokio::spawn(async move {
            history.record(1, Op::Acquire, Phase::Invoke, None);
            // Generous: a loaded machine's members may change leaders, which renews leases.
            let lease = waiter.acquire(&name, &LockOptions::watchdog(ttl).wait(ttl + MARGIN * 4)).await;
            if let Ok(lease) = &lease {
                history.record(1, Op::Acquire, Phase::Ok, Some(lease.token()));
            }
            lease
        })
    };
    eventually("the waiter is queued", MARGIN, || async {
        waiter.inspect(&name).await.is_ok_and(|info| info.waiters == Some(1))
    })
    .await;

    tokio::task::block_in_place(|| cluster.isolate(cut)).expect("partition the holder's member");
    let lost = tokio::spawn({
        let (held, history) = (held.handle(), history.clone());
        async move {
            let reason = held.lost().await;
            history.record(0, Op::Lost, Phase::Ok, None);
            reason
        }
    });
    let next = next.await.expect("waiter task").expect("the majority grants the waiter once the lease expires");
    assert!(held.remaining().is_zero(), "the partitioned holder still counted itself valid at the new grant");
    assert!(next.token() > held.token(), "token {} after {}", next.token(), held.token());
    let reason = tokio::time::timeout(MARGIN, lost).await.expect("the holder's lost signal").expect("join");
    assert_ne!(reason, LostReason::Stolen, "a partitioned holder cannot have seen the new holder");
    register.write(1, next.token(), 2).expect("the new holder writes");
    assert!(register.write(0, held.token(), 3).is_err(), "the partitioned holder's late write was accepted");
    assert_eq!(register.value(), 2);
    history.record(1, Op::Release, Phase::Invoke, None);
    next.release().await.expect("release");
    let report = history.check();
    assert!(report.is_clean(), "history: {report}");

    tokio::task::block_in_place(|| cluster.heal());
    assert!(matches!(held.release().await, Err(LockError::NotHeld { .. })), "the old holder's release after healing");
}

/// Four clients take turns while the leader is cut off from the other members for a
/// while and then let back: no two hold at once, tokens only increase, no stale write is
/// accepted, the lock keeps being granted, and no hold is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_partitioned_while_grants_are_in_flight() {
    dlock_conformance::init_tracing();
    let mut cluster = start_cluster().await;
    let url = cluster.url();
    let name = unique_name("leader-partitioned");
    let history = History::new();
    let register = Arc::new(FencedRegister::new(history.clone()));
    let opts = LockOptions::watchdog(Duration::from_secs(2)).wait(Duration::from_secs(30));
    let until = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut workers = Vec::new();
    for process in 0..4 {
        let client = connect(&url).await;
        let (name, opts, history, register) = (name.clone(), opts.clone(), history.clone(), register.clone());
        workers.push(tokio::spawn(async move {
            let mut granted = 0usize;
            while tokio::time::Instant::now() < until {
                let hold = Duration::from_millis(20);
                if hold_once(process, &client, &name, &opts, &history, &register, hold).await.is_ok() {
                    granted += 1;
                }
            }
            granted
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let leader = cluster.leader().expect("a leader");
    tokio::task::block_in_place(|| cluster.isolate(leader)).expect("partition the leader");
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| cluster.heal());
    let mut granted = 0;
    for worker in workers {
        granted += worker.await.expect("worker");
    }
    let report = history.check();
    assert!(report.is_clean(), "history: {report}");
    assert!(granted >= 8, "only {granted} grants in 8 s around a partition");
    let admin = connect(&url).await;
    eventually("no hold is left behind", MARGIN, || async {
        match admin.try_acquire(&name, &LockOptions::watchdog(Duration::from_secs(2))).await {
            Ok(Some(lease)) => lease.release().await.is_ok(),
            _ => false,
        }
    })
    .await;
}
