//! A waiter whose pub/sub connection cannot be opened, while its command connection
//! works, still gets the lock: it waits a quarter of the operation timeout for its
//! subscription, then looks again at the holder's ttl instead of failing the acquire.

mod support;

use std::time::{Duration, Instant};

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::{ConnectConfig, RedisConfig};
use dlock_testkit::supervisor::connection_gate::ConnectionGate;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};

/// The waiter's command connection goes through a gate that holds every connection
/// opened after it: its pub/sub connection, opened when it first waits, hangs (its
/// connect timeout is longer than an operation). The holder's fixed lease then runs out,
/// and the waiter, looking again at the holder's ttl, gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_without_pubsub_polls_at_the_holders_ttl() {
    let server = RedisServer::start(&ServerConfig::default()).expect("start redis-server");
    let gate = ConnectionGate::start(server.addr()).expect("start the gate");
    let op_timeout = Duration::from_secs(1);
    let waiter_config = RedisConfig::from_url(&format!("redis://{}", gate.addr()))
        .unwrap()
        .with_op_timeout(op_timeout)
        .with_connect_timeout(Duration::from_secs(4));
    let waiter = dlock_redis::connect(waiter_config).await.expect("connect through the gate");
    let holder = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("pubsub/unreachable").unwrap();
    let ttl = Duration::from_millis(1500);
    let lease = holder.acquire(&name, &LockOptions::fixed(ttl)).await.unwrap();
    let held = Instant::now();

    gate.hold_new();
    let granted = waiter
        .acquire(&name, &LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::from_secs(10)))
        .await
        .expect("the waiter gets the lock once the holder's lease runs out");
    assert!(granted.token() > lease.token());
    // Granted only after the holder's hold expired: no release message could come.
    assert!(held.elapsed() >= ttl, "granted {:?} after a hold of {ttl:?}", held.elapsed());
    assert_eq!(waiter.inspect(&name).await.unwrap().holder.map(|h| h.token), Some(granted.token()));
    granted.release().await.unwrap();
}
