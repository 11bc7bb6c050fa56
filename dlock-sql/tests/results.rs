//! Stored results on each database, as the tables hold them: the row beside the lease (or
//! advisory) row with the database's expiry, what a store refuses, results that outlive
//! releases and evictions, binary and 512 KiB values, expired rows (absent, replaced,
//! swept), corrupt rows, and names that must never share a result.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use std::time::Duration;

use common::{Kind, SqlFixture};
use dlock_conformance::properties::eventually;
use dlock_core::{LockError, LockName, LockOptions, Locker, OwnerId, MAX_RESULT_BYTES};
use sqlx::AssertSqlSafe;

const RETENTION: Duration = Duration::from_secs(600);

fn opts() -> LockOptions {
    LockOptions::watchdog(Duration::from_secs(5)).wait(Duration::from_secs(5))
}

/// Direct access to the tables, beside the clients.
enum Raw {
    Postgres(sqlx::PgPool),
    MariaDb(sqlx::MySqlPool),
    Sqlite(sqlx::SqlitePool),
}

/// One row of a results table: token, value, and the microseconds until it expires on
/// the database's clock.
type Record = (i64, Vec<u8>, i64);

impl Raw {
    async fn new(fixture: &SqlFixture) -> Raw {
        let url = fixture.url();
        match fixture.dialect() {
            dlock_sql::Dialect::Postgres => Raw::Postgres(sqlx::PgPool::connect(url).await.expect("pool")),
            dlock_sql::Dialect::MySql => Raw::MariaDb(sqlx::MySqlPool::connect(url).await.expect("pool")),
            dlock_sql::Dialect::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(url.trim_start_matches("sqlite://"))
                    .busy_timeout(Duration::from_secs(10));
                Raw::Sqlite(sqlx::SqlitePool::connect_with(opts).await.expect("pool"))
            }
        }
    }

    /// Microseconds since the epoch on the database's clock.
    fn now(&self) -> &'static str {
        match self {
            Raw::Postgres(_) => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint",
            Raw::MariaDb(_) => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)",
            Raw::Sqlite(_) => "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
        }
    }

    async fn exec(&self, sql: &str) {
        let sql = AssertSqlSafe(sql.to_string());
        match self {
            Raw::Postgres(p) => sqlx::query(sql).execute(p).await.map(drop),
            Raw::MariaDb(p) => sqlx::query(sql).execute(p).await.map(drop),
            Raw::Sqlite(p) => sqlx::query(sql).execute(p).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn record(&self, table: &str, name: &str) -> Option<Record> {
        let sql = AssertSqlSafe(format!(
            "SELECT token, value, expires_us - {} FROM {table} WHERE name = '{name}'",
            self.now()
        ));
        match self {
            Raw::Postgres(p) => sqlx::query_as(sql).fetch_optional(p).await,
            Raw::MariaDb(p) => sqlx::query_as(sql).fetch_optional(p).await,
            Raw::Sqlite(p) => sqlx::query_as(sql).fetch_optional(p).await,
        }
        .expect("read a results row")
    }

    async fn count(&self, table: &str) -> i64 {
        let sql = AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}"));
        match self {
            Raw::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Raw::MariaDb(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Raw::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .expect("count rows")
    }
}

/// A transaction left open on the tables.
enum Tx {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    MariaDb(sqlx::Transaction<'static, sqlx::MySql>),
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

impl Raw {
    /// Runs `sql` in a transaction that stays open.
    async fn uncommitted(&self, sql: &str) -> Tx {
        let sql = AssertSqlSafe(sql.to_string());
        match self {
            Raw::Postgres(p) => {
                let mut tx = p.begin().await.expect("begin");
                sqlx::query(sql).execute(&mut *tx).await.expect("statement");
                Tx::Postgres(tx)
            }
            Raw::MariaDb(p) => {
                let mut tx = p.begin().await.expect("begin");
                sqlx::query(sql).execute(&mut *tx).await.expect("statement");
                Tx::MariaDb(tx)
            }
            Raw::Sqlite(p) => {
                let mut tx = p.begin().await.expect("begin");
                sqlx::query(sql).execute(&mut *tx).await.expect("statement");
                Tx::Sqlite(tx)
            }
        }
    }
}

impl Tx {
    async fn commit(self) {
        match self {
            Tx::Postgres(tx) => tx.commit().await,
            Tx::MariaDb(tx) => tx.commit().await,
            Tx::Sqlite(tx) => tx.commit().await,
        }
        .expect("commit");
    }
}

fn assert_not_held(what: &str, outcome: Result<(), LockError>) {
    assert!(matches!(outcome, Err(LockError::NotHeld { .. })), "{what}: {outcome:?}");
}

/// The result is a row of `dlock_results` beside the lease row, with the hold's token and
/// the retention on the database's clock. A second store of the same token is refused;
/// releasing or evicting the lock leaves the result; an evicted holder stores nothing; a
/// later holder replaces it. Re-entrant holds store once for the token they share.
async fn result_lives_beside_the_lease(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let raw = Raw::new(&fixture).await;
    let (client, other) = (fixture.lease_client().await, fixture.lease_client().await);
    let name = LockName::new("results/layout").unwrap();

    let first = client.acquire(&name, &opts()).await.expect("acquire");
    first.store_result(b"first", RETENTION).await.expect("store");
    let (token, value, remaining_us) = raw.record("dlock_results", "results/layout").await.expect("a row");
    assert_eq!((token as u64, value.as_slice()), (first.token().get(), &b"first"[..]));
    assert!(remaining_us > 590_000_000 && remaining_us <= 600_000_000, "expires in {remaining_us} µs");
    assert_not_held("a second store of the same token", first.store_result(b"again", RETENTION).await);

    let first_token = first.token();
    first.release().await.expect("release");
    let kept = other.load_result(&name).await.expect("load").expect("the release left the result");
    assert_eq!((kept.token, kept.value.as_slice()), (first_token, &b"first"[..]));

    let second = other.acquire(&name, &opts()).await.expect("acquire again");
    fixture.admin().backend().evict(&name).await.expect("evict");
    assert!(other.load_result(&name).await.expect("load").is_some(), "the eviction removed the result");
    assert_not_held("a store after the eviction", second.store_result(b"evicted", RETENTION).await);

    let third = client.acquire(&name, &opts()).await.expect("the evicted lock is free");
    third.store_result(b"third", RETENTION).await.expect("a later holder replaces the result");
    let replaced = other.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((replaced.token, replaced.value.as_slice()), (third.token(), &b"third"[..]));
    third.release().await.expect("release");

    let reentrant = LockName::new("results/reentrant").unwrap();
    let owned = opts().owner(OwnerId::new("job 7").unwrap());
    let outer = client.acquire(&reentrant, &owned).await.expect("acquire");
    let inner = client.acquire(&reentrant, &owned).await.expect("re-enter");
    inner.store_result(b"inner", RETENTION).await.expect("the inner hold stores");
    inner.release().await.expect("release the inner hold");
    assert_not_held("the outer hold of a token already stored", outer.store_result(b"outer", RETENTION).await);
    let stored = client.load_result(&reentrant).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (outer.token(), &b"inner"[..]));
    outer.release().await.expect("release");
}

/// Values come back byte for byte: empty, every byte value (not UTF-8), and the largest
/// allowed; names that differ by case, by Unicode normalization or by one byte at the end
/// of a 1024-byte name never share a result.
async fn values_and_names_round_trip(locker: &dyn Locker) {
    let name = LockName::new("results/values").unwrap();
    let binary: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let largest: Vec<u8> = (0..MAX_RESULT_BYTES).map(|i| (i * 7 + i / 256) as u8).collect();
    for value in [Vec::new(), binary, "résumé 🔒".as_bytes().to_vec(), largest] {
        let lease = locker.acquire(&name, &opts()).await.expect("acquire");
        let token = lease.token();
        lease.store_result(&value, RETENTION).await.expect("store");
        lease.release().await.expect("release");
        let stored = locker.load_result(&name).await.expect("load").expect("stored");
        assert_eq!(stored.token, token);
        assert!(stored.value == value, "a value of {} bytes came back as {} bytes", value.len(), stored.value.len());
    }

    let long = "n".repeat(1023);
    let names = ["Case/a".to_string(), "case/a".to_string(), "caf\u{e9}".to_string(), "cafe\u{301}".to_string()]
        .into_iter()
        .chain([format!("{long}x"), format!("{long}y"), long.clone()]);
    let names: Vec<LockName> = names.map(|n| LockName::new(n).unwrap()).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(locker.load_result(name).await.expect("load"), None, "{name} has a result before its store");
        let lease = locker.acquire(name, &opts()).await.expect("acquire");
        lease.store_result(format!("value {i}").as_bytes(), RETENTION).await.expect("store");
        lease.release().await.expect("release");
    }
    for (i, name) in names.iter().enumerate() {
        let stored = locker.load_result(name).await.expect("load").expect("stored");
        assert_eq!(stored.value, format!("value {i}").into_bytes(), "{name} got another name's result");
    }
}

/// An expired result is absent, and any holder's store replaces it, even of a lower token;
/// an unexpired one of a higher token refuses the store. A row dlock did not write is a
/// `Backend` error. The first store of a client (`fresh`, which has stored nothing yet)
/// sweeps expired rows of other names, and leaves live ones.
async fn expired_and_corrupt_rows(fixture: &SqlFixture, locker: &dyn Locker, fresh: &dyn Locker, table: &str) {
    let raw = Raw::new(fixture).await;
    let name = LockName::new("results/expiry").unwrap();
    let lease = locker.acquire(&name, &opts()).await.expect("acquire");
    lease.store_result(b"brief", Duration::from_millis(50)).await.expect("store");
    eventually("the result expires", Duration::from_secs(5), || async {
        locker.load_result(&name).await.expect("load").is_none()
    })
    .await;
    // Whether the expired row is still there depends on when this client's sweep ran:
    // both are right, so nothing is asserted about it.
    lease.release().await.expect("release");

    // A token far above any the clock-based counters will reach.
    let (now, higher) = (raw.now(), 1i64 << 62);
    raw.exec(&format!(
        "UPDATE {table} SET token = {higher}, expires_us = {now} + 600000000 WHERE name = 'results/expiry'"
    ))
    .await;
    let lower = locker.acquire(&name, &opts()).await.expect("acquire");
    assert_not_held("a store under a kept result of a higher token", lower.store_result(b"lower", RETENTION).await);
    raw.exec(&format!("UPDATE {table} SET expires_us = 0 WHERE name = 'results/expiry'")).await;
    lower.store_result(b"lower", RETENTION).await.expect("an expired result of a higher token is replaced");
    let stored = locker.load_result(&name).await.expect("load").expect("stored");
    assert_eq!((stored.token, stored.value.as_slice()), (lower.token(), &b"lower"[..]));
    lower.release().await.expect("release");

    raw.exec(&format!("UPDATE {table} SET token = -3 WHERE name = 'results/expiry'")).await;
    let corrupt = locker.load_result(&name).await;
    assert!(matches!(corrupt, Err(LockError::Backend(_))), "a corrupt row: {corrupt:?}");

    let before = raw.count(table).await;
    for i in 0..3 {
        raw.exec(&format!(
            "INSERT INTO {table} (name, token, value, expires_us) VALUES ('results/gone-{i}', 1, 'x', 0)"
        ))
        .await;
    }
    assert_eq!(raw.count(table).await, before + 3);
    let sweeper = LockName::new("results/sweeper").unwrap();
    let lease = fresh.acquire(&sweeper, &opts()).await.expect("acquire");
    lease.store_result(b"sweep", RETENTION).await.expect("store");
    lease.release().await.expect("release");
    eventually("the expired rows are swept", Duration::from_secs(10), || async {
        raw.record(table, "results/gone-0").await.is_none()
            && raw.record(table, "results/gone-1").await.is_none()
            && raw.record(table, "results/gone-2").await.is_none()
    })
    .await;
    assert!(raw.record(table, "results/sweeper").await.is_some(), "the sweep took a live result");
}

/// A store that meets an eviction under way (not committed yet) waits for it, then sees
/// it: the store is refused and writes nothing. Were the hold checked on a snapshot taken
/// before the eviction committed, the store would answer at once and write. MariaDB runs
/// READ COMMITTED here (PostgreSQL's default), where its plain `INSERT … SELECT` would read
/// such a snapshot.
async fn store_waits_for_an_eviction_under_way(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let raw = Raw::new(&fixture).await;
    if db == Kind::MariaDb {
        raw.exec("SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED").await;
    }
    let client = fixture.lease_client().await;
    let name = LockName::new("results/evicting").unwrap();
    let lease = client.acquire(&name, &opts()).await.expect("acquire");
    let eviction = raw
        .uncommitted(
            "UPDATE dlock_leases SET owner = NULL, holds = 0, expires_us = 0, grants = '' \
             WHERE name = 'results/evicting'",
        )
        .await;
    let store = tokio::spawn(async move {
        let stored = lease.store_result(b"racing", RETENTION).await;
        (lease, stored)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!store.is_finished(), "the store did not wait for the eviction under way");
    eviction.commit().await;
    let (lease, stored) = store.await.expect("store task");
    assert_not_held("a store that waited for an eviction", stored);
    assert!(raw.record("dlock_results", "results/evicting").await.is_none(), "the store wrote");
    drop(lease);
}

async fn lease_values(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    values_and_names_round_trip(&fixture.lease_client().await).await;
}

async fn lease_expiry(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (client, fresh) = (fixture.lease_client().await, fixture.lease_client().await);
    expired_and_corrupt_rows(&fixture, &client, &fresh, "dlock_results").await;
}

/// Advisory results: a row of `dlock_advisory_results` with the hold's token, refused while
/// the advisory row's fence is not the hold's or once the hold's session has ended, and
/// kept through a release and the end of the session.
async fn advisory_results(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let raw = Raw::new(&fixture).await;
    let connect =
        || async { dlock_sql::connect_advisory(common::advisory_config(fixture.url())).await.expect("connect") };
    let client = connect().await;
    let name = LockName::new("results/advisory").unwrap();

    let first = client.acquire(&name, &opts()).await.expect("acquire");
    first.store_result(b"first", RETENTION).await.expect("store");
    let (token, value, remaining_us) = raw.record("dlock_advisory_results", "results/advisory").await.expect("a row");
    assert_eq!((token as u64, value.as_slice()), (first.token().get(), &b"first"[..]));
    assert!(remaining_us > 590_000_000 && remaining_us <= 600_000_000, "expires in {remaining_us} µs");
    assert_not_held("a second store of the same token", first.store_result(b"again", RETENTION).await);
    assert!(raw.record("dlock_results", "results/advisory").await.is_none(), "the lease table's results were used");
    // The session holds the lock, but the row says another grant came since.
    raw.exec("UPDATE dlock_advisory SET fence = fence + 1 WHERE name = 'results/advisory'").await;
    assert_not_held("a store under another grant's fence", first.store_result(b"fenced", RETENTION).await);
    raw.exec("UPDATE dlock_advisory SET fence = fence - 1 WHERE name = 'results/advisory'").await;

    let first_token = first.token();
    first.release().await.expect("release");
    let second = client.acquire(&name, &opts()).await.expect("acquire again");
    let kept = client.load_result(&name).await.expect("load").expect("the release left the result");
    assert_eq!((kept.token, kept.value.as_slice()), (first_token, &b"first"[..]));
    second.store_result(b"second", RETENTION).await.expect("a later hold replaces the result");

    connect().await.backend().evict(&name).await.expect("evict");
    assert_not_held("a store after the session ended", second.store_result(b"evicted", RETENTION).await);
    let kept = client.load_result(&name).await.expect("load").expect("the eviction left the result");
    assert_eq!((kept.token, kept.value.as_slice()), (second.token(), &b"second"[..]));
    drop(second);

    values_and_names_round_trip(&client).await;
    expired_and_corrupt_rows(&fixture, &client, &connect().await, "dlock_advisory_results").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_result_lives_beside_the_lease() {
    result_lives_beside_the_lease(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_result_lives_beside_the_lease() {
    result_lives_beside_the_lease(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_result_lives_beside_the_lease() {
    result_lives_beside_the_lease(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_waits_for_an_eviction_under_way() {
    store_waits_for_an_eviction_under_way(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_store_waits_for_an_eviction_under_way() {
    store_waits_for_an_eviction_under_way(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_waits_for_an_eviction_under_way() {
    store_waits_for_an_eviction_under_way(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_values_and_names_round_trip() {
    lease_values(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_values_and_names_round_trip() {
    lease_values(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_values_and_names_round_trip() {
    lease_values(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_expired_and_corrupt_rows() {
    lease_expiry(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_expired_and_corrupt_rows() {
    lease_expiry(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_expired_and_corrupt_rows() {
    lease_expiry(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory_results() {
    advisory_results(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_advisory_results() {
    advisory_results(Kind::MariaDb).await;
}
