//! A clock that jumps forward on one master (the objection Kleppmann raised against
//! RedLock): the hold expires early there, and with the two masters its holder never
//! reached, another client gets a quorum while the first holder's lease is still valid by
//! its own clock. RedLock cannot close that window, since its safety assumes bounded
//! clock drift. The fencing token is what stays safe: any two quorums share a master,
//! whose fence counter the second grant had to pass, so the second token is above the
//! first and the fenced resource refuses the first holder's late write.
//!
//! The jump is played on the hold's key: a step of the server's clock past the key's
//! expiry does to the key exactly what `PEXPIRE key 1` does. (Debian's redis-server is
//! linked with jemalloc, which cannot start under libfaketime.)

mod support;

use std::time::Duration;

use dlock_conformance::history::{FencedRegister, History, Op, Phase};
use dlock_conformance::Fault;
use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::Node;
use dlock_testkit::proxy::FaultProxy;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters};

/// The master whose clock jumps.
const JUMPS: usize = 2;

fn node(addr: std::net::SocketAddr) -> Node {
    Node::new(addr.ip().to_string(), addr.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_lets_a_second_holder_in_and_fencing_refuses_the_first() {
    let masters = tokio::task::spawn_blocking(|| RedisMasters::start(5, &ServerConfig::default()))
        .await
        .unwrap()
        .expect("start 5 masters");
    // The first client reaches every master through a proxy, so that it can miss two.
    let mut proxies = Vec::new();
    for addr in masters.addrs() {
        proxies.push(FaultProxy::start(addr).await.expect("start a proxy"));
    }
    let through_proxies: Vec<Node> = proxies.iter().map(|p| node(p.addr())).collect();
    let direct: Vec<Node> = masters.addrs().into_iter().map(node).collect();
    let first_client = dlock_redis::redlock::connect(support::redlock::config_for(&through_proxies)).await.unwrap();
    let second_client = dlock_redis::redlock::connect(support::redlock::config_for(&direct)).await.unwrap();

    let name = LockName::new("fast-clock").unwrap();
    let ttl = Duration::from_secs(10);
    // The first holder gets masters 0, 1 and 2: a quorum of three. Its links to 3 and 4
    // stay cut: a grant it re-sends once a link is back would land there after all.
    proxies[3].set_fault(Fault::Cut);
    proxies[4].set_fault(Fault::Cut);
    let first = first_client.acquire(&name, &LockOptions::fixed(ttl)).await.expect("a quorum of 0, 1, 2");
    let history = History::new();
    let register = FencedRegister::new(history.clone());
    history.record(0, Op::Acquire, Phase::Ok, Some(first.token()));
    register.write(0, first.token(), 1).expect("the first holder writes");

    // Master 2's clock jumps past the hold's expiry.
    let hold_key = second_client.backend().keys(&name).hold;
    let jumped = masters.nodes()[JUMPS].cli(&["PEXPIRE", &hold_key, "1"]).expect("PEXPIRE");
    assert_eq!(jumped.trim(), "1", "master 2 has the first holder's hold");
    dlock_conformance::properties::eventually("master 2 expires the hold", Duration::from_secs(5), || {
        let gone = masters.nodes()[JUMPS].cli(&["EXISTS", &hold_key]).is_ok_and(|n| n.trim() == "0");
        async move { gone }
    })
    .await;
    let second = second_client
        .try_acquire(&name, &LockOptions::fixed(ttl))
        .await
        .unwrap()
        .expect("masters 2, 3 and 4 grant the lock: a quorum");
    history.record(1, Op::Acquire, Phase::Ok, Some(second.token()));
    assert!(
        !first.is_lost() && first.remaining() > ttl / 2,
        "the first holder still believes it holds the lock ({:?} left)",
        first.remaining()
    );

    // Two holders at once: the token is what keeps the resource safe.
    assert!(second.token() > first.token(), "{} after {}", second.token(), first.token());
    register.write(1, second.token(), 2).expect("the second holder writes");
    let stale = register.write(0, first.token(), 3);
    assert!(stale.is_err(), "the first holder's late write was accepted");
    assert_eq!(register.value(), 2);
    history.record(0, Op::Release, Phase::Invoke, Some(first.token()));
    history.record(1, Op::Release, Phase::Invoke, Some(second.token()));
    let report = history.check();
    assert_eq!(report.overlaps.len(), 1, "{report:?}");
    assert!(report.token_regressions.is_empty() && report.stale_writes.is_empty(), "{report:?}");
    drop(first);
    second.release().await.unwrap();
}
