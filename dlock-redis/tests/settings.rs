//! Settings reach the server: ACL user and password (from the URL or the builder), a
//! password alone, database, key prefix; the client's target names the server, the
//! database and the prefix, never the credentials.

mod support;

use std::time::{Duration, Instant};

use dlock_core::{LockError, LockName, LockOptions, Locker};
use dlock_redis::{AccessConfig, RedisConfig};
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};

fn server_with_acl_user() -> RedisServer {
    let args = ["--user", "default", "off", "--user", "locks", "on", ">s3cr%t", "~*", "&*", "+@all"];
    RedisServer::start(&ServerConfig { extra_args: args.map(String::from).to_vec(), ..ServerConfig::default() })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_database_and_prefix_come_from_the_url() {
    let server = server_with_acl_user();
    let url = format!("redis://locks:s3cr%25t@{}/3?prefix=shop&op_timeout=1s&connect_timeout=1s", server.addr());
    let locker = dlock_redis::connect(RedisConfig::from_url(&url).unwrap()).await.expect("connect as the ACL user");
    assert_eq!(locker.target(), format!("redis://{}/3 prefix shop", server.addr()), "no credentials in it");
    let name = LockName::new("stock/{sku-1}").unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();

    let auth = ["--user", "locks", "--pass", "s3cr%t", "--no-auth-warning"];
    let key = "shop:{stock%2F%7Bsku-1%7D}";
    let in_db = |db: &str| {
        let mut args = auth.to_vec();
        args.extend(["-n", db, "HGET", key, "token"]);
        server.cli(&args).unwrap().trim().to_string()
    };
    assert_eq!(in_db("3"), lease.token().to_string(), "the hold is in database 3 under the prefix");
    assert_eq!(in_db("0"), "", "nothing in database 0");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_without_hanging() {
    let server = server_with_acl_user();
    for url in [
        format!("redis://locks:wrong@{}?connect_timeout=1s", server.addr()),
        format!("redis://{}?connect_timeout=1s", server.addr()),
    ] {
        let started = Instant::now();
        let result = dlock_redis::connect(RedisConfig::from_url(&url).unwrap()).await;
        assert!(started.elapsed() < Duration::from_secs(3), "{url}: {:?}", started.elapsed());
        match result {
            Err(LockError::Backend(_) | LockError::Unavailable { .. }) => {}
            other => panic!("{url}: expected an error, got {:?}", other.map(|_| "a client")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_the_builder_reach_the_server() {
    let acl = server_with_acl_user();
    let args = ["--requirepass", "s3cr%t"];
    let requirepass =
        RedisServer::start(&ServerConfig { extra_args: args.map(String::from).to_vec(), ..ServerConfig::default() })
            .unwrap();
    let name = LockName::new("builder").unwrap();
    for config in [
        support::client_config(acl.addr()).with_credentials("locks", "s3cr%t"),
        support::client_config(requirepass.addr()).with_password("s3cr%t"),
    ] {
        let locker = dlock_redis::connect(config.clone()).await.unwrap_or_else(|err| panic!("{config:?}: {err}"));
        let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
        lease.release().await.unwrap();
    }
    let unauthenticated = dlock_redis::connect(support::client_config(requirepass.addr())).await;
    assert!(unauthenticated.is_err(), "a requirepass server took a client without the password");
}
