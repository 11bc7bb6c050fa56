//! PostgreSQL advisory grants that meet another transaction's change of the name's row,
//! each interleaving held open by a real transaction on the server: a grant whose update
//! waits for a concurrent update of the row takes the session lock once, so its release
//! frees the lock; a try whose row a sweep deletes while the try waits for the name's
//! record key neither refuses the free lock nor keeps a lock of no row.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::time::Duration;

use common::{Kind, SqlFixture};
use dlock_conformance::properties::eventually;
use dlock_core::{ConnectConfig, LockName, LockOptions, Locker};
use sqlx::{Connection, PgConnection, PgPool};

fn unique(prefix: &str) -> LockName {
    LockName::new(format!("{prefix}/{:016x}", fastrand::u64(..))).expect("name")
}

/// Room for the steps the test takes while the client's statement waits on the server.
const PATIENT: Duration = Duration::from_secs(30);

/// How many advisory locks (two-key, as the holds take them) any session holds.
async fn held_locks(probe: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted")
        .fetch_one(probe)
        .await
        .expect("read pg_locks")
}

/// Waits until some statement waits for a lock of `locktype` on the server.
async fn waiting_for(probe: &PgPool, locktype: &'static str) {
    eventually(&format!("a statement waits for a {locktype} lock"), PATIENT, || async move {
        let waiting: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pg_locks WHERE NOT granted AND locktype = $1")
            .bind(locktype)
            .fetch_one(probe)
            .await
            .expect("read pg_locks");
        waiting > 0
    })
    .await;
}

/// A grant whose update of the name's row waits for another transaction that updated the
/// row (as another client's first look-up of the name does) and commits meanwhile: the
/// lock is taken once, so the one unlock of the release frees it for everyone at once, not
/// after the server ends the released session's idle timeout (a ttl later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_waits_for_a_row_update_takes_the_lock_once() {
    let fixture = SqlFixture::new(Kind::Postgres).await;
    let config = common::advisory_config(fixture.url()).with_op_timeout(PATIENT);
    let user = dlock_sql::connect_advisory(config.clone()).await.expect("connect");
    let other = dlock_sql::connect_advisory(config).await.expect("connect");
    let probe = PgPool::connect(fixture.url()).await.expect("connect the probe");
    let name = unique("advisory/recheck");
    let opts = LockOptions::fixed(Duration::from_secs(60));
    // The row exists and the client knows its id: the next try is one statement.
    let first = user.acquire(&name, &opts).await.expect("acquire");
    let first_token = first.token();
    first.release().await.expect("release");

    let mut writer = PgConnection::connect(fixture.url()).await.expect("connect the writer");
    sqlx::raw_sql("BEGIN").execute(&mut writer).await.expect("begin");
    sqlx::query("UPDATE dlock_advisory SET used_us = used_us WHERE name = $1")
        .bind(name.as_str())
        .execute(&mut writer)
        .await
        .expect("update the row");
    let trying = tokio::spawn({
        let (user, name, opts) = (user.clone(), name.clone(), opts.clone());
        async move { user.try_acquire(&name, &opts).await }
    });
    // The try's update waits for the writer's transaction.
    waiting_for(&probe, "transactionid").await;
    sqlx::raw_sql("COMMIT").execute(&mut writer).await.expect("commit");
    let lease = trying.await.expect("join").expect("try").expect("nobody held the lock");
    assert!(lease.token() > first_token, "token {} after {first_token}", lease.token());
    lease.release().await.expect("release");

    let still = held_locks(&probe).await;
    let next = other.try_acquire(&name, &opts).await.expect("try");
    assert!(
        next.is_some(),
        "the released lock stayed held ({still} advisory lock(s) held after the release): \
         the grant took the session lock twice, and one unlock left it with the idle session"
    );
}

/// A try that waits for the name's record key (a look-up holds it) while a sweep deletes
/// the name's row: when it goes on, the lock is free and the row is gone. The try makes
/// the row again and takes the lock, above the old token, and no session is left holding
/// a lock of the deleted row's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_whose_row_is_swept_under_it_neither_refuses_nor_keeps_the_lock() {
    let fixture = SqlFixture::new(Kind::Postgres).await;
    let config = common::advisory_config(fixture.url()).with_op_timeout(PATIENT);
    let user = dlock_sql::connect_advisory(config.clone()).await.expect("connect");
    let sweeper = dlock_sql::connect_advisory(config.with_keep_idle(Duration::from_millis(1))).await.expect("connect");
    let probe = PgPool::connect(fixture.url()).await.expect("connect the probe");
    let name = unique("advisory/swept");
    let opts = LockOptions::fixed(Duration::from_secs(60));
    let first = user.acquire(&name, &opts).await.expect("acquire");
    let first_token = first.token();
    // The key of the name's record: the held lock's two keys, as one.
    let record: i64 = sqlx::query_scalar(
        "SELECT (classid::int8 << 32) | objid::int8 FROM pg_locks \
         WHERE locktype = 'advisory' AND objsubid = 2 AND granted",
    )
    .fetch_one(&probe)
    .await
    .expect("the held lock's keys");
    first.release().await.expect("release");

    let mut reader = PgConnection::connect(fixture.url()).await.expect("connect the reader");
    sqlx::raw_sql("BEGIN").execute(&mut reader).await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)").bind(record).execute(&mut reader).await.expect("record key");
    let trying = tokio::spawn({
        let (user, name, opts) = (user.clone(), name.clone(), opts.clone());
        async move { user.try_acquire(&name, &opts).await }
    });
    // The try has begun (and taken its snapshot, which still shows the row) and waits.
    waiting_for(&probe, "advisory").await;
    let swept = sweeper.sweep().await.expect("sweep");
    assert!(swept.removed >= 1, "the sweep deleted nothing: the race was not run");
    assert_eq!(fixture.records(name.as_str()).await, 0, "the idle row stayed");
    sqlx::raw_sql("COMMIT").execute(&mut reader).await.expect("commit");

    let lease = trying.await.expect("join").expect("try").expect("a try refused a lock nobody held");
    assert!(lease.token() > first_token, "a swept name came back with {} after {first_token}", lease.token());
    lease.release().await.expect("release");
    assert_eq!(held_locks(&probe).await, 0, "a session still holds an advisory lock");
}
