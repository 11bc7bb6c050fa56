//! The blocking API: renewals go on while the caller's thread blocks, from a plain `fn`
//! with no runtime, and a call from inside an async task is refused, not a panic.
#![cfg(feature = "blocking")]

use std::time::Duration;

use dlock::blocking::BlockingLocker;
use dlock::{LockError, LockName, LockOptions};

const TTL: Duration = Duration::from_millis(400);

#[test]
fn a_lease_outlives_three_ttls_of_blocking_work_and_keeps_others_out() {
    let url = "memory://blocking-renewals";
    let holder = BlockingLocker::connect(url).expect("connect");
    let other = BlockingLocker::connect(url).expect("connect another client");
    let name = LockName::new("report").unwrap();
    let lease = holder.acquire(&name, &LockOptions::watchdog(TTL)).expect("acquire");
    // The test is about time: the caller's thread blocks past three ttls.
    std::thread::sleep(TTL * 3);
    assert!(!lease.is_lost(), "lost while the caller blocked: {:?}", lease.lost_reason());
    assert!(lease.remaining() > Duration::ZERO);
    assert!(other.try_acquire(&name, &LockOptions::watchdog(TTL)).expect("try").is_none(), "taken while held");
    let token = lease.token();
    drop(lease);
    // Dropping released it at once: no need to wait for the ttl.
    let next = other.try_acquire(&name, &LockOptions::watchdog(TTL)).expect("try").expect("free after the drop");
    assert!(next.token() > token);
    next.release().expect("release");
}

#[test]
fn a_wait_bound_blocks_and_then_times_out() {
    let locker = BlockingLocker::connect("memory://blocking-timeout").expect("connect");
    let name = LockName::new("busy").unwrap();
    let _held = locker.acquire(&name, &LockOptions::watchdog(TTL)).expect("acquire");
    let waiting = LockOptions::watchdog(TTL).wait(Duration::from_millis(100));
    let waited = std::time::Instant::now();
    assert!(matches!(locker.acquire(&name, &waiting), Err(LockError::Timeout { .. })));
    assert!(waited.elapsed() >= Duration::from_millis(100));
}

#[tokio::test]
async fn inside_an_async_task_the_calls_are_refused() {
    match BlockingLocker::connect("memory://blocking-refused") {
        Err(LockError::InvalidInput(why)) => assert!(why.contains("async"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_locker_made_outside_refuses_inside_and_its_lease_drops_anywhere() {
    let locker = BlockingLocker::connect("memory://blocking-moved").expect("connect");
    let name = LockName::new("moved").unwrap();
    let lease = locker.acquire(&name, &LockOptions::watchdog(TTL)).expect("acquire");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        assert!(matches!(locker.inspect(&name), Err(LockError::InvalidInput(_))));
        // Dropped inside a runtime, it releases in the background instead of blocking.
        drop(lease);
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while locker.inspect(&name).expect("inspect").holder.is_some() {
        assert!(std::time::Instant::now() < deadline, "the dropped lease was never released");
        std::thread::sleep(Duration::from_millis(10));
    }
}
