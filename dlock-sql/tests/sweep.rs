//! What the tables keep per name, as the rows show it: a sweep deletes a name's rows only
//! once the name is idle, sweeps racing grants never lower a token, a swept name comes back
//! above every token it had (also for an advisory client that still knows the deleted
//! row's id), the lease row's shared expiry covers every live shared hold and permit, and a
//! waiter's place lapses in seconds whatever lease it asks for.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Kind, SqlFixture, IDLE};
use dlock_conformance::properties::eventually;
use dlock_core::{ConnectConfig, LockName, LockOptions, Locker, MAX_PLACE_LAPSE};

fn unique(prefix: &str) -> LockName {
    LockName::new(format!("{prefix}/{:016x}", fastrand::u64(..))).expect("name")
}

/// Long enough past the keep time for the database's clock to agree, on a loaded machine.
const PAST_KEEP: Duration = Duration::from_millis(1500);

/// The lease row's `shared_us` against the latest expiry of the name's live rows.
async fn shared_covers_rows(fixture: &SqlFixture, name: &LockName) {
    let shared = fixture.scalar(&format!("SELECT shared_us FROM dlock_leases WHERE name = '{name}'")).await;
    let latest = fixture
        .scalar(&format!("SELECT MAX(expires_us) FROM dlock_holds WHERE name = '{name}' AND kind <> 'waiting'"))
        .await;
    let (shared, latest) = (shared.expect("a lease row"), latest.expect("a hold row"));
    assert!(shared >= latest, "{name}: shared_us {shared} is below a live hold's expiry {latest}");
}

/// Every new, re-entered or extended shared hold and permit leaves the lease row's shared
/// expiry at or above its own row's, so that no writer is granted while its row lives.
async fn shared_expiry_covers_every_live_hold(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let client = fixture.lease_client().await;
    for permits in [None, Some(100)] {
        let name = unique("expiry");
        let mut leases = Vec::new();
        for i in 0..20u64 {
            // Later grants ask for less time: each must still be covered.
            let opts = LockOptions::fixed(Duration::from_secs(60 - i));
            let opts = match permits {
                None => opts.read(),
                Some(n) => opts.permits(n),
            };
            let lease = client.try_acquire(&name, &opts).await.expect("grant");
            leases.push(lease.expect("a shared hold or permit is free"));
            shared_covers_rows(&fixture, &name).await;
        }
        for lease in &leases {
            lease.extend(Duration::from_secs(90)).await.expect("extend");
            shared_covers_rows(&fixture, &name).await;
        }
        for lease in leases {
            lease.release().await.expect("release");
        }
    }
}

/// Clients that sweep all the time, with a keep time of a millisecond, beside grants of
/// every kind on a few names: every grant of a name gets a token above the one before,
/// also when a sweep deleted the name's row in between (which the test makes sure
/// happened).
async fn sweeps_racing_grants_never_lower_a_token(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let eager = common::config(fixture.url()).with_keep_idle(Duration::from_millis(1));
    let worker = Arc::new(dlock_sql::connect(eager.clone()).await.expect("connect"));
    let stop = Arc::new(AtomicBool::new(false));
    let mut sweepers = Vec::new();
    for _ in 0..2 {
        let (sweeper, stop) = (dlock_sql::connect(eager.clone()).await.expect("connect"), stop.clone());
        sweepers.push(tokio::spawn(async move {
            let mut removed = 0;
            while !stop.load(Ordering::SeqCst) {
                removed += sweeper.sweep().await.expect("sweep").removed;
            }
            removed
        }));
    }
    let mut users = Vec::new();
    for n in 0..3 {
        let (worker, name) = (worker.clone(), unique(&format!("race/{n}")));
        users.push(tokio::spawn(async move {
            let (mut last, mut restarts) = (0u64, 0u32);
            for round in 0..45 {
                let opts = match round % 3 {
                    0 => LockOptions::fixed(Duration::from_secs(5)),
                    1 => LockOptions::fixed(Duration::from_secs(5)).read(),
                    _ => LockOptions::fixed(Duration::from_secs(5)).permits(2),
                };
                let lease = worker.acquire(&name, &opts.wait(Duration::from_secs(10))).await.expect("acquire");
                let token = lease.token().get();
                assert!(token > last, "{name}: token {token} after {last}");
                // Only this task uses the name: a step of more than one is a row made again.
                if last > 0 && token > last + 1 {
                    restarts += 1;
                }
                last = token;
                lease.release().await.expect("release");
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            restarts
        }));
    }
    let mut restarts = 0;
    for user in users {
        restarts += user.await.expect("join");
    }
    stop.store(true, Ordering::SeqCst);
    for sweeper in sweepers {
        sweeper.await.expect("join");
    }
    assert!(restarts > 0, "no sweep deleted a row between two grants: the race was never run");
}

/// A sweep keeps the rows of names held (exclusive, shared, permits) however long ago they
/// were granted, of names used within the keep time, and of names with a live place; it
/// deletes the rest, and a deleted name comes back above its last token.
async fn rows_go_only_when_their_name_is_idle(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let client = fixture.lease_client().await;
    let (held, reader, permit, released) =
        (unique("idle/held"), unique("idle/reader"), unique("idle/permit"), unique("idle/released"));
    let watch = LockOptions::watchdog(Duration::from_secs(2));
    let held_lease = client.acquire(&held, &watch).await.expect("acquire");
    let read_lease = client.acquire(&reader, &watch.clone().read()).await.expect("read");
    let permit_lease = client.acquire(&permit, &watch.clone().permits(3)).await.expect("permit");
    let first = client.acquire(&released, &LockOptions::new()).await.expect("acquire");
    let first_token = first.token();
    first.release().await.expect("release");
    client.sweep().await.expect("sweep");
    assert_eq!(records(&fixture, &released).await, 1, "a name released just now was swept");

    tokio::time::sleep(IDLE + PAST_KEEP).await;
    // A live place of a waiter keeps an idle name's row.
    let place = format!(
        "INSERT INTO dlock_holds (name, request, owner, kind, fence, expires_us) \
         VALUES ('{released}', 'r', 'o', 'waiting', 0, {} + 60000000)",
        fixture.now_us()
    );
    fixture.scalar(&place).await;
    client.sweep().await.expect("sweep");
    assert_eq!(records(&fixture, &released).await, 2, "the row of a name with a live place was swept");
    assert_eq!(records(&fixture, &held).await, 1, "the row of a held lock was swept");
    assert_eq!(records(&fixture, &reader).await, 2, "the rows of a reader were swept");
    assert_eq!(records(&fixture, &permit).await, 2, "the rows of a permit were swept");
    for lease in [&held_lease, &read_lease, &permit_lease] {
        assert!(!lease.is_lost(), "a sweep took a live hold");
    }

    // Once the place has lapsed, one sweep takes it and the name's row.
    fixture.scalar(&format!("UPDATE dlock_holds SET expires_us = 0 WHERE name = '{released}'")).await;
    client.sweep().await.expect("sweep");
    assert_eq!(records(&fixture, &released).await, 0, "an idle name's rows stayed");
    let again = client.acquire(&released, &LockOptions::new()).await.expect("acquire");
    assert!(again.token() > first_token, "a swept name came back with {} after {first_token}", again.token());
    again.release().await.expect("release");

    for lease in [held_lease, read_lease, permit_lease] {
        lease.release().await.expect("a hold the sweeps kept is released as usual");
    }
    tokio::time::sleep(IDLE + PAST_KEEP).await;
    client.sweep().await.expect("sweep");
    for name in [&held, &reader, &permit, &released] {
        assert_eq!(records(&fixture, name).await, 0, "{name}: rows stayed after its holds were released");
    }
}

async fn records(fixture: &SqlFixture, name: &LockName) -> usize {
    fixture.records(name.as_str()).await
}

/// The microseconds left to the places of `name`, as the holds table keeps them.
async fn place_left(fixture: &SqlFixture, name: &LockName, count: u32) -> Option<i64> {
    fixture
        .scalar(&format!(
            "SELECT MAX(expires_us) - {} FROM dlock_holds WHERE name = '{name}' AND kind = 'waiting' AND fence = {count}",
            fixture.now_us()
        ))
        .await
}

/// A waiting writer's place, and a waiting permit request's (with its count), lapse within
/// a place's lapse of their last refresh, though the lease asked for is an hour; the
/// place of a waiter that vanished keeps readers out no longer than that.
async fn places_lapse_in_seconds_whatever_the_lease(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (holder, waiter) = (fixture.lease_client().await, Arc::new(fixture.lease_client().await));
    let hour = Duration::from_secs(3600);
    let bound = i64::try_from(MAX_PLACE_LAPSE.as_micros()).unwrap() + 2_000;

    for (count, held, asked) in [
        (0, LockOptions::watchdog(Duration::from_secs(2)).read(), LockOptions::fixed(hour)),
        (3, LockOptions::watchdog(Duration::from_secs(2)).permits(1), LockOptions::fixed(hour).permits(3)),
    ] {
        let name = unique("place");
        let lease = holder.acquire(&name, &held).await.expect("acquire");
        let waiting = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move { waiter.acquire(&name, &asked.wait(hour)).await.map(drop) }
        });
        eventually("the waiter keeps a place", Duration::from_secs(10), || async {
            place_left(&fixture, &name, count).await.is_some()
        })
        .await;
        let left = place_left(&fixture, &name, count).await.expect("a place");
        assert!(left > 0 && left <= bound, "a place lasts {left} µs, past {MAX_PLACE_LAPSE:?}");
        // The waiter vanishes without giving up its place.
        waiting.abort();
        let _ = waiting.await;
        if count == 0 {
            let reader = holder.acquire(&name, &LockOptions::fixed(hour).read().wait(MAX_PLACE_LAPSE * 4)).await;
            reader
                .expect("a reader is let in once the vanished writer's place lapsed")
                .release()
                .await
                .expect("release");
        }
        lease.release().await.expect("release");
    }
}

macro_rules! on_each_database {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(Kind::Postgres).await;
            })*
        }
        mod mariadb {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(Kind::MariaDb).await;
            })*
        }
        mod sqlite {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(Kind::Sqlite).await;
            })*
        }
    };
}

on_each_database!(
    shared_expiry_covers_every_live_hold,
    sweeps_racing_grants_never_lower_a_token,
    rows_go_only_when_their_name_is_idle,
    places_lapse_in_seconds_whatever_the_lease,
);

/// An advisory name's row goes once it is idle and no session holds its lock; a held one
/// stays however long ago it was granted. A client that still knows the deleted row's id
/// takes the lock again, above every token the name had, and leaves no lock behind.
async fn advisory_rows_go_when_idle_and_come_back_above(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let config = common::advisory_config(fixture.url());
    let user = dlock_sql::connect_advisory(config.clone()).await.expect("connect");
    let other = dlock_sql::connect_advisory(config).await.expect("connect");
    let (idle, held) = (unique("advisory/idle"), unique("advisory/held"));
    let opts = LockOptions::fixed(Duration::from_secs(30));
    let first = user.acquire(&idle, &opts).await.expect("acquire");
    let first_token = first.token();
    first.release().await.expect("release");
    let holding = user.acquire(&held, &LockOptions::watchdog(Duration::from_secs(6))).await.expect("acquire");

    tokio::time::sleep(IDLE + PAST_KEEP).await;
    other.sweep().await.expect("sweep");
    assert_eq!(fixture.records(idle.as_str()).await, 0, "an idle advisory row stayed");
    assert_eq!(fixture.records(held.as_str()).await, 1, "the row of a held advisory lock was swept");
    assert!(!holding.is_lost());
    assert!(other.try_acquire(&held, &opts).await.expect("try").is_none(), "a held lock was granted again");

    let again = user.try_acquire(&idle, &opts).await.expect("try").expect("the swept name is free");
    assert!(again.token() > first_token, "a swept name came back with {} after {first_token}", again.token());
    again.release().await.expect("release");
    holding.release().await.expect("release");
    if db == Kind::Postgres {
        // No session kept a lock of the deleted row's key.
        let held = fixture.scalar("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2").await;
        assert_eq!(held, Some(0), "a session still holds an advisory lock");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory_rows_go_when_idle_and_come_back_above() {
    advisory_rows_go_when_idle_and_come_back_above(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_advisory_rows_go_when_idle_and_come_back_above() {
    advisory_rows_go_when_idle_and_come_back_above(Kind::MariaDb).await;
}
