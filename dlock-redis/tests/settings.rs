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
            // Not an outage: retrying cannot help.
            Err(err @ LockError::Refused { .. }) => assert!(!err.is_transient() && !err.to_string().contains("wrong")),
            other => panic!("{url}: expected a refusal, got {:?}", other.map(|_| "a client")),
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
    let refused = |result: Result<dlock_redis::RedisLocker, LockError>| match result {
        Ok(_) => panic!("a requirepass server took a client without the right password"),
        Err(err) => err,
    };
    let unauthenticated = refused(dlock_redis::connect(support::client_config(requirepass.addr())).await);
    let wrong = refused(dlock_redis::connect(support::client_config(requirepass.addr()).with_password("nope")).await);
    let closed = dlock_testkit::supervisor::free_port().unwrap();
    let nowhere = format!("127.0.0.1:{closed}").parse().unwrap();
    let no_server = refused(dlock_redis::connect(support::client_config(nowhere)).await);
    // Each says what failed, where, and is told apart from the others.
    for (err, place, says) in [
        (&unauthenticated, requirepass.addr().to_string(), "requires a password"),
        (&wrong, requirepass.addr().to_string(), "did not accept the user name and password"),
        (&no_server, nowhere.to_string(), "cannot connect"),
    ] {
        let message = err.to_string();
        assert!(message.contains(&place) && message.contains(says), "{message}");
        assert!(!message.contains("nope"), "{message}");
    }
    assert!(matches!(unauthenticated, LockError::Refused { .. }) && !unauthenticated.is_transient());
    assert!(matches!(wrong, LockError::Refused { .. }));
    assert!(matches!(no_server, LockError::Unavailable { .. }) && no_server.is_transient());
}
