//! Locks over the application's own `redis::Client` (`RedisConfig::from_client`): the
//! suite's core properties pass with clients made from it (its password and database
//! are the ones used), and each lock client opens the connections the docs say: one for
//! commands and one for the pub/sub wake-ups.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::properties::{self, unique_name};
use dlock_conformance::{Fixture, Timing};
use dlock_core::{ConnectConfig, LockError, LockOptions, Locker};
use dlock_redis::{AccessConfig, RedisConfig};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};

const PASSWORD: &str = "s3cret";

fn server() -> RedisServer {
    let args = ["--requirepass", PASSWORD].map(String::from).to_vec();
    RedisServer::start(&ServerConfig { extra_args: args, ..ServerConfig::default() }).expect("redis-server")
}

/// The application's client, as it would make it from its own settings.
fn app_client(server: &RedisServer) -> dlock_redis::redis::Client {
    dlock_redis::redis::Client::open(format!("redis://:{PASSWORD}@{}/3", server.addr())).expect("a client")
}

struct Clients(RedisServer);

#[async_trait]
impl Fixture for Clients {
    fn timing(&self) -> Timing {
        Timing::SHORT
    }

    async fn client(&self) -> Arc<dyn Locker> {
        let config =
            RedisConfig::from_client(app_client(&self.0)).expect("config").with_op_timeout(Duration::from_secs(2));
        Arc::new(dlock_redis::connect(config).await.expect("connect over the application's client"))
    }
}

/// Connections the server has open, by `CLIENT LIST`.
fn connections(server: &RedisServer) -> usize {
    let list = server.cli(&["-a", PASSWORD, "--no-auth-warning", "CLIENT", "LIST"]).expect("CLIENT LIST");
    // The redis-cli connection asking is one of them.
    list.lines().filter(|line| !line.trim().is_empty()).count() - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_client_passes_the_core_properties() {
    let clients = Clients(server());
    properties::core(&clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_client_opens_a_command_and_a_pubsub_connection() {
    let server = server();
    let before = connections(&server);
    let locker = dlock_redis::connect(RedisConfig::from_client(app_client(&server)).unwrap()).await.expect("connect");
    // A waiter makes the client subscribe.
    let name = unique_name("own-client");
    let held = locker.acquire(&name, &LockOptions::watchdog(Duration::from_secs(5))).await.expect("acquire");
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move { locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await })
    };
    dlock_conformance::properties::eventually("the waiter waits", Duration::from_secs(5), || async {
        locker.stats().waiting == 1
    })
    .await;
    assert_eq!(connections(&server) - before, 2, "one command connection and one pub/sub connection");
    // The keys are in the client's database 3, not 0.
    let keys = server.cli(&["-a", PASSWORD, "--no-auth-warning", "-n", "3", "DBSIZE"]).unwrap();
    assert_ne!(keys.trim(), "0", "nothing in the client's database");
    held.release().await.expect("release");
    waiter.await.unwrap().expect("granted").release().await.expect("release");

    // Credentials are the client's: a config that sets its own is refused.
    let twice = RedisConfig::from_client(app_client(&server)).unwrap().with_password("other");
    assert!(matches!(dlock_redis::connect(twice).await, Err(LockError::InvalidInput(_))));
}
