//! The database restarted (kill -9) while a lock is held: calls fail with typed errors and
//! never hang, the hold (a committed row) survives the restart, the lock is usable
//! afterwards, and the fence counter does not go back.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::time::{Duration, Instant};

use common::{Kind, SqlFixture, OP_TIMEOUT};
use dlock_core::{LockError, LockName, LockOptions, Locker};

async fn restart_while_held(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (a, b) = (fixture.lease_client().await, fixture.lease_client().await);
    let name = LockName::new(format!("restart/{db:?}")).unwrap();
    // A long ttl: the hold outlives the outage, so the restart itself is what is tested.
    let opts = LockOptions::watchdog(Duration::from_secs(60)).wait(Duration::from_secs(5));
    let lease = a.acquire(&name, &opts).await.expect("acquire");
    let before = lease.token();

    fixture.kill();
    for (what, outcome) in [
        ("inspect", b.inspect(&name).await.map(drop)),
        ("try_acquire", b.try_acquire(&name, &opts).await.map(drop)),
        ("acquire", b.acquire(&name, &opts).await.map(drop)),
    ] {
        assert!(
            matches!(outcome, Err(LockError::Unavailable { .. })),
            "{what} while the database is down: {outcome:?}"
        );
    }
    let started = Instant::now();
    let extended = lease.extend(Duration::from_secs(60)).await;
    assert!(matches!(extended, Err(LockError::Unavailable { .. })), "extend while down: {extended:?}");
    assert!(started.elapsed() < OP_TIMEOUT * 3, "extend took {:?} while the database was down", started.elapsed());

    tokio::task::block_in_place(|| fixture.start_again());
    // Pooled connections died with the server; each client recovers within a few calls.
    let deadline = Instant::now() + Duration::from_secs(30);
    let info = loop {
        match b.inspect(&name).await {
            Ok(info) => break info,
            Err(e) => {
                assert!(Instant::now() < deadline, "inspect after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let holder = info.holder.expect("the committed hold survives the restart");
    assert_eq!(holder.token, before);
    assert!(b.try_acquire(&name, &opts).await.expect("try_acquire").is_none(), "the survived hold still excludes");
    assert!(!lease.is_lost(), "the outage was far shorter than the ttl: {:?}", lease.lost_reason());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match lease.extend(Duration::from_secs(60)).await {
            Ok(()) => break,
            Err(e) => {
                assert!(Instant::now() < deadline && e.is_transient(), "extend after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    lease.release().await.expect("the holder releases after the restart");
    let next = b.acquire(&name, &opts).await.expect("the lock is usable after the restart");
    assert!(next.token() > before, "token {} after the restart, {before} before", next.token());
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_while_held() {
    restart_while_held(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_restart_while_held() {
    restart_while_held(Kind::MariaDb).await;
}
