//! Where a client's locks live, as `Locker::target` names them: the server, database and
//! table (never the user), or the SQLite file however its path was spelt; two clients of
//! the same tables share a target, and clients of other tables do not.

// The shared fixtures start every kind of server; the tests need every database feature.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

mod common;

use common::{Kind, SqlFixture};
use dlock_core::{ConnectConfig, Locker};

/// `scheme://host:port/database` of a fixture's URL, without its user.
fn server(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a server URL");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    format!("{scheme}://{}", rest.split('?').next().expect("a URL"))
}

async fn servers_are_named_without_their_users(db: Kind) {
    let fixture = SqlFixture::new(db).await;
    let (a, b) = (fixture.lease_client().await, fixture.lease_client().await);
    let expected = format!("{} table dlock_leases", server(fixture.url()));
    assert_eq!(a.target(), expected);
    assert_eq!(b.target(), a.target(), "two clients of one table");
    assert!(!a.target().contains('@'), "{}", a.target());

    let other = dlock_sql::connect(common::config(fixture.url()).with_prefix("other")).await.expect("connect");
    assert_eq!(other.target(), format!("{} table other_leases", server(fixture.url())));
    let advisory = dlock_sql::connect_advisory(common::advisory_config(fixture.url())).await.expect("connect");
    assert_eq!(advisory.target(), format!("{} table dlock_advisory", server(fixture.url())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_servers_are_named_without_their_users() {
    servers_are_named_without_their_users(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_servers_are_named_without_their_users() {
    servers_are_named_without_their_users(Kind::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_files_are_named_by_their_canonical_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("sub")).expect("sub dir");
    let direct = dlock_sql::connect(dlock_sql::SqlConfig::sqlite_file(dir.path().join("locks.db"))).await;
    let roundabout = dlock_sql::SqlConfig::sqlite_file(dir.path().join("sub").join("..").join("locks.db"));
    let roundabout = dlock_sql::connect(roundabout).await.expect("connect");
    let direct = direct.expect("connect");
    assert_eq!(direct.target(), roundabout.target(), "one file, one target");
    let canonical = std::fs::canonicalize(dir.path().join("locks.db")).expect("the file exists");
    assert_eq!(direct.target(), format!("sqlite://{} table dlock_leases", canonical.display()));
    let memory = dlock_sql::connect(dlock_sql::SqlConfig::sqlite_memory()).await.expect("connect");
    let another = dlock_sql::connect(dlock_sql::SqlConfig::sqlite_memory()).await.expect("connect");
    assert_ne!(memory.target(), another.target(), "two private databases share no locks");
}
