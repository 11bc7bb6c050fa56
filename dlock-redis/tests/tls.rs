//! `rediss://` and `redlocks://`: locks over TLS, with the servers' CA given by `tls_ca`.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::redlock::{self, RedLockConfig};
use dlock_redis::RedisConfig;
use dlock_testkit::supervisor::free_port;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters, RedisServer};
use dlock_testkit::supervisor::tls::TestPki;

/// The arguments of a redis-server that also listens for TLS on `tls_port`.
fn tls_args(certs: &Path, tls_port: u16) -> Vec<String> {
    let file = |name: &str| certs.join(name).display().to_string();
    vec![
        "--tls-port".to_string(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        file("server.pem"),
        "--tls-key-file".into(),
        file("server-key.pem"),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls() {
    let certs = TestPki::new("client").expect("test certificates");
    let tls_port = free_port().unwrap();
    let file = |name: &str| certs.dir().join(name).display().to_string();
    let args = tls_args(certs.dir(), tls_port);
    let _server = RedisServer::start(&ServerConfig { extra_args: args, ..ServerConfig::default() }).unwrap();

    let url = format!("rediss://127.0.0.1:{tls_port}?tls_ca={}&connect_timeout=2s&op_timeout=2s", file("ca.pem"));
    let config = RedisConfig::from_url(&url).unwrap();
    let (a, b) = (dlock_redis::connect(config.clone()).await.unwrap(), dlock_redis::connect(config).await.unwrap());
    let name = LockName::new("over/tls").unwrap();
    let held = a.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await })
    };
    dlock_conformance::properties::eventually("the waiter waits", Duration::from_secs(5), || async {
        b.stats().waiting == 1
    })
    .await;
    held.release().await.unwrap();
    let released = Instant::now();
    let next = waiter.await.unwrap().unwrap();
    assert!(released.elapsed() < Duration::from_secs(3), "the release message reached the waiter over TLS");
    next.release().await.unwrap();

    // The system's roots do not know the test CA: the connection is refused, promptly.
    let untrusted = RedisConfig::from_url(&format!("rediss://127.0.0.1:{tls_port}?connect_timeout=2s")).unwrap();
    let started = Instant::now();
    assert!(dlock_redis::connect(untrusted).await.is_err(), "a server with an unknown CA was trusted");
    assert!(started.elapsed() < Duration::from_secs(4));

    // A plaintext client on the TLS port: the server hangs up, and a probe finds TLS there.
    let plain = RedisConfig::from_url(&format!("redis://127.0.0.1:{tls_port}?connect_timeout=2s")).unwrap();
    match dlock_redis::connect(plain).await.map(|_| ()) {
        Err(err @ dlock_core::LockError::Refused { .. }) => {
            let message = err.to_string();
            let says = format!("127.0.0.1:{tls_port} speaks TLS on this port: connect with rediss://");
            assert!(message.contains(&says), "{message}");
        }
        other => panic!("a plaintext client on a TLS port: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls() {
    let certs = TestPki::new("client").expect("test certificates");
    let mut servers = Vec::new();
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let tls_port = free_port().unwrap();
        let args = tls_args(certs.dir(), tls_port);
        servers.push(RedisMasters::start(1, &ServerConfig { extra_args: args, ..ServerConfig::default() }).unwrap());
        hosts.push(format!("127.0.0.1:{tls_port}"));
    }
    let ca = certs.dir().join("ca.pem").display().to_string();
    let url = format!("redlocks://{}?tls_ca={ca}&connect_timeout=2s&op_timeout=2s&node_timeout=500ms", hosts.join(","));
    let locker = redlock::connect(RedLockConfig::from_url(&url).unwrap()).await.expect("connect over TLS");
    let name = LockName::new("redlock/over/tls").unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    assert_eq!(locker.inspect(&name).await.unwrap().holder.map(|h| h.token), Some(lease.token()));
    lease.release().await.unwrap();

    // Without the test CA no node is trusted: no client.
    let untrusted = RedLockConfig::from_url(&format!("redlocks://{}?connect_timeout=2s", hosts.join(","))).unwrap();
    let started = Instant::now();
    assert!(redlock::connect(untrusted).await.is_err(), "nodes with an unknown CA were trusted");
    assert!(started.elapsed() < Duration::from_secs(4));
}
