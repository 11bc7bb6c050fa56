//! Results on RedLock: a copy on every master, a store refused by a majority, the
//! remains of a failed store (never a result, never hiding one), and masters down.

mod support;

use std::time::Duration;

use dlock_core::{LockError, LockName, LockOptions, Locker};
use dlock_redis::redlock::{self, RedLockLocker};
use dlock_redis::results::{scripts as result_scripts, ResultRecord};
use dlock_redis::scripts::Invocation;
use support::redlock::{RedLockFixture, MASTERS};

const RETENTION: Duration = Duration::from_secs(600);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(6)).wait(Duration::from_secs(6))
}

async fn locker(fixture: &RedLockFixture) -> RedLockLocker {
    redlock::connect(fixture.config()).await.expect("connect to the masters")
}

/// Each master's copy of the result of `name`, in node order.
async fn copies(fixture: &RedLockFixture, key: &str) -> Vec<Option<ResultRecord>> {
    let mut copies = Vec::new();
    for index in 0..MASTERS {
        let mut admin = fixture.admin(index).await;
        let reply = Invocation::new(&result_scripts().load, &[key]).run(&mut admin).await.expect("load script");
        copies.push(ResultRecord::parse(reply).expect("a record dlock wrote"));
    }
    copies
}

/// Deletes the hold of `name` on the masters `indexes`, as an expiry there would.
async fn drop_hold(fixture: &RedLockFixture, hold: &str, indexes: &[usize]) {
    for &index in indexes {
        let mut admin = fixture.admin(index).await;
        let _: i64 = redis::cmd("DEL").arg(hold).query_async(&mut admin).await.expect("DEL the hold");
    }
}

/// A store reaches every master, and each copy is the same record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_copied_to_every_master() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let client = locker(&fixture).await;
    let name = LockName::new("results/copies").unwrap();
    let keys = client.backend().keys(&name);
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"everywhere", RETENTION).await.expect("store");
    let token = lease.token();
    lease.release().await.expect("release");
    // The fan-out returns at a quorum; the last copies land just after.
    dlock_conformance::properties::eventually("every master has its copy", Duration::from_secs(5), || async {
        copies(&fixture, &keys.result()).await.iter().all(Option::is_some)
    })
    .await;
    let copies = copies(&fixture, &keys.result()).await;
    let first = copies[0].clone().unwrap();
    assert_eq!((first.token, first.value.as_slice()), (token.get(), &b"everywhere"[..]));
    assert!(copies.iter().all(|copy| copy.as_ref() == Some(&first)), "the copies differ: {copies:?}");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (token, &b"everywhere"[..]));
}

/// A store that a majority of masters refuse (the hold is gone there) is `NotHeld`. The
/// masters still holding the lock keep their copy, but a load never returns those
/// remains, whether a result lies under them or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remains_of_a_failed_store_are_never_a_result() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let client = locker(&fixture).await;
    let name = LockName::new("results/remains").unwrap();
    let keys = client.backend().keys(&name);

    // No result yet: the remains alone read as none.
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    drop_hold(&fixture, &keys.hold, &[0, 1, 2]).await;
    let refused = lease.store_result(b"remains", RETENTION).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a store a majority refused: {refused:?}");
    let copies_now = copies(&fixture, &keys.result()).await;
    assert!(copies_now[..3].iter().all(Option::is_none), "{copies_now:?}");
    assert_eq!(client.load_result(&name).await.expect("load"), None, "the remains of a failed store were read");
    drop(lease);
    drop_hold(&fixture, &keys.hold, &[3, 4]).await;

    // A result on every master, then a later holder's store that fails: the result stays.
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"result", RETENTION).await.expect("store");
    let result_token = lease.token();
    lease.release().await.expect("release");
    dlock_conformance::properties::eventually("every master has its copy", Duration::from_secs(5), || async {
        copies(&fixture, &keys.result()).await.iter().all(|c| c.as_ref().is_some_and(|c| c.value == b"result"))
    })
    .await;
    let later = client.acquire(&name, &opts()).await.expect("acquire again");
    assert!(later.token() > result_token);
    drop_hold(&fixture, &keys.hold, &[0, 1, 2]).await;
    let refused = later.store_result(b"later remains", RETENTION).await;
    assert!(matches!(refused, Err(LockError::NotHeld { .. })), "a store a majority refused: {refused:?}");
    let stored = client.load_result(&name).await.expect("load").expect("the result under the remains");
    assert_eq!((stored.token, stored.value.as_slice()), (result_token, &b"result"[..]));
    drop(later);
}

/// With two masters down results are stored and read on the other three; with three
/// down a load cannot tell, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_with_masters_down() {
    dlock_conformance::init_tracing();
    let fixture = RedLockFixture::new();
    let client = locker(&fixture).await;
    let name = LockName::new("results/masters-down").unwrap();

    fixture.with_masters_mut("killing masters", |m| [0, 1].into_iter().for_each(|i| m.kill(i)));
    let lease = client.acquire(&name, &opts()).await.expect("acquire with three masters");
    lease.store_result(b"on three", RETENTION).await.expect("store on three masters");
    let token = lease.token();
    lease.release().await.expect("release");
    let stored = client.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (token, &b"on three"[..]));

    // The copies are on exactly a quorum: with one of them down as well, the masters that
    // missed the store cannot tell whether a result exists.
    fixture.with_masters_mut("moving the outage", |m| {
        [0, 1].into_iter().for_each(|i| m.start_again(i).expect("restart a master"));
        m.kill(2);
    });
    match client.load_result(&name).await {
        Err(LockError::QuorumNotReached { needed: 3, .. }) => {}
        Ok(Some(stored)) => {
            // Only right if a grant and a store sent to the restarted masters before they
            // died were sent again when their connections came back, and landed: the
            // record is then on a quorum after all.
            assert_eq!((stored.token, stored.value.as_slice()), (token, &b"on three"[..]));
            let keys = client.backend().keys(&name);
            let mut intact = 0;
            for index in [0, 1, 3, 4] {
                let mut admin = fixture.admin(index).await;
                let call = Invocation::new(&result_scripts().load, &[&keys.result()]);
                let copy = ResultRecord::parse(call.run(&mut admin).await.expect("load")).expect("a dlock record");
                intact += usize::from(copy.is_some_and(|c| c.token == token.get() && c.value == b"on three"));
            }
            assert!(intact >= 3, "a load returned a record only {intact} live masters hold");
        }
        other => panic!("a load that cannot see a quorum of copies: {other:?}"),
    }
    fixture.with_masters_mut("restarting the master", |m| m.start_again(2).expect("restart a master"));
    // Its connection may take a moment to come back.
    dlock_conformance::properties::eventually("the result is read again", Duration::from_secs(10), || async {
        client.load_result(&name).await.is_ok_and(|stored| stored.is_some_and(|s| s.token == token))
    })
    .await;

    fixture.with_masters_mut("killing a majority", |m| [0, 1, 2].into_iter().for_each(|i| m.kill(i)));
    let unreachable = client.load_result(&name).await;
    assert!(
        matches!(unreachable, Err(LockError::QuorumNotReached { needed: 3, .. })),
        "a load with three masters down: {unreachable:?}"
    );
}
