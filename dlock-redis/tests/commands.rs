//! What the backend sends to Redis, read back with MONITOR: an uncontended acquire and
//! release are two commands, and a waiter is woken by the release message, not by polling.

mod support;

use std::time::Duration;

use dlock_core::{LockName, LockOptions, Locker};
use dlock_redis::scripts::scripts;
use dlock_testkit::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use support::monitor::{client_commands, Monitor, Sent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_are_two_commands() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("orders/42").unwrap();
    let mut monitor = Monitor::start(&server).await;

    let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
    lease.release().await.unwrap();

    let sent = monitor.collect().await;
    let commands = client_commands(&sent);
    assert_eq!(commands.len(), 2, "an uncontended acquire and release sent {commands:#?}");
    assert!(commands[0].is_script(scripts().acquire.get_hash()), "first: {:?}", commands[0]);
    assert!(commands[1].is_script(scripts().release.get_hash()), "second: {:?}", commands[1]);
    // The scripts' own calls: a grant and a release that frees the lock and tells waiters.
    let inside: Vec<String> = sent.iter().filter(|s| s.source == "lua").map(Sent::command).collect();
    assert!(inside.contains(&"incr".to_string()) && inside.contains(&"publish".to_string()), "{inside:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_message_not_by_polling() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr());
    let holder = dlock_redis::connect(config.clone()).await.unwrap();
    let waiter = dlock_redis::connect(config).await.unwrap();
    let name = LockName::new("jobs/nightly").unwrap();
    let held = holder.acquire(&name, &LockOptions::watchdog(Duration::from_secs(30))).await.unwrap();
    let mut monitor = Monitor::start(&server).await;

    // The default backoff (10 ms doubling to 250 ms) would poll several times a second.
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.acquire(&name, &LockOptions::new().wait(Duration::from_secs(20))).await })
    };
    dlock_conformance::properties::eventually("the waiter waits", Duration::from_secs(5), || async {
        waiter.stats().waiting == 1
    })
    .await;
    // Time is what this test is about: a polling waiter would try again within this second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_release = monitor.collect().await;
    held.release().await.unwrap();
    let lease =
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("the waiter is woken").unwrap().unwrap();
    let after_release = monitor.collect().await;

    let acquire = scripts().acquire.get_hash();
    let tries = |sent: &[Sent]| client_commands(sent).iter().filter(|s| s.is_script(acquire)).count();
    let commands: Vec<String> = client_commands(&before_release).iter().map(|s| s.command()).collect();
    // One look, the subscription, one more look (a release in between is not missed).
    assert_eq!(tries(&before_release), 2, "while the lock was held the waiter sent {commands:?}");
    let subscribe = commands.iter().position(|c| c == "subscribe").expect("the waiter subscribes");
    let second_try = client_commands(&before_release).iter().rposition(|s| s.is_script(acquire)).unwrap();
    assert!(subscribe < second_try, "the waiter must subscribe before its second look: {commands:?}");

    // The release publishes; the waiter's one more look gets the lock.
    let published = after_release.iter().position(|s| s.source == "lua" && s.command() == "publish");
    let granted = after_release.iter().position(|s| s.is_script(acquire));
    assert!(published.is_some() && published < granted, "{after_release:#?}");
    assert_eq!(tries(&after_release), 1, "{after_release:#?}");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_loaded_again() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let locker = dlock_redis::connect(support::client_config(server.addr())).await.unwrap();
    let name = LockName::new("flushed").unwrap();
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let lease = locker.acquire(&name, &LockOptions::new()).await.expect("acquire after SCRIPT FLUSH");
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    lease.release().await.expect("release after SCRIPT FLUSH");
    assert!(locker.inspect(&name).await.unwrap().holder.is_none());
}
