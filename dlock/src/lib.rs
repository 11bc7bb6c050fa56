//! Distributed locks with fencing tokens, behind one API.
//!
//! Pick a backend at run time by URL with [`connect`], or at compile time by feature:
//!
//! | scheme | backend | feature |
//! |---|---|---|
//! | `memory://[name]` | in-process ([`memory`]) | always |
//! | `sqlite://path`, `sqlite::memory:` | SQLite lease table | `sqlite` (default) |
//! | `postgres://`, `postgresql://` | PostgreSQL lease table (`?lock=advisory`: `pg_advisory_lock`) | `postgres` |
//! | `mysql://`, `mariadb://` | MySQL/MariaDB lease table (`?lock=advisory`: `GET_LOCK`) | `mysql` |
//! | `redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://` | Redis (one server, Cluster, Sentinel) | `redis` |
//! | `redlock://h1:p1,h2:p2,...` (`redlocks://`) | RedLock over N Redis masters | `redlock` |
//! | `zk://` | ZooKeeper | `zk` |
//! | `etcd://`, `etcds://` | etcd | `etcd` |
//!
//! ```
//! use dlock::{LockName, LockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::LockError> {
//! let locker = dlock::connect("memory://docs").await?;
//! let lease = locker.acquire(&LockName::new("nightly-report")?, &LockOptions::new()).await?;
//! println!("token {}", lease.token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! Each backend crate is also reachable as a module behind its feature, so its own
//! configuration and helpers need no second dependency: `dlock::redis` (with `redis` or
//! `redlock`), `dlock::sql` (with `sqlite`, `postgres` or `mysql`), `dlock::zk` (with `zk`),
//! `dlock::etcd` (with `etcd`).
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # async fn fenced() -> Result<(), dlock::LockError> {
//! use dlock::sql::SqlConfig;
//! let locker = dlock::sql::connect(SqlConfig::from_url("sqlite::memory:")?).await?;
//! # let _ = locker;
//! # Ok(()) }
//! ```

mod drivers;

pub use dlock_core::memory;
pub use dlock_core::{
    campaign, drift, idempotent, observe, parse_duration, redact, with_lock, Backoff, BoxError, Capabilities, Client,
    ClientConfig, ClientStats, ConnectConfig, ConnectOptions, FencingToken, HoldKind, Holder, IdempotentError,
    IdempotentOptions, Leader, Leadership, Lease, LeaseHandle, LeaseMode, LockError, LockInfo, LockName, LockOptions,
    Locker, LockerExt, LostReason, MultiLease, MultiLock, Observer, OwnerId, RunOutcome, StoredResult,
    DEFAULT_OBSERVE_EVERY, DEFAULT_TTL, MAX_DURATION, MAX_NAME_LEN, MAX_OWNER_LEN, MAX_PERMITS, MAX_RESULT_BYTES,
    MIN_TTL,
};
pub use drivers::{connect, driver, Driver, DRIVERS};
/// The raw baselines `dlock bench` measures the library against (the `bench` feature).
#[cfg(feature = "bench")]
pub use {dlock_core::RawBaseline, drivers::raw_baseline};

/// Redis: one server, Sentinel or Cluster ([`dlock_redis`]); RedLock over several masters
/// in [`redis::redlock`] with the `redlock` feature.
#[cfg(any(feature = "redis", feature = "redlock"))]
pub use dlock_redis as redis;

/// SQL databases: lease tables, advisory locks and fenced writes ([`dlock_sql`]).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use dlock_sql as sql;

/// ZooKeeper ([`dlock_zk`]).
#[cfg(feature = "zk")]
pub use dlock_zk as zk;

/// etcd ([`dlock_etcd`]).
#[cfg(feature = "etcd")]
pub use dlock_etcd as etcd;

// The README's example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
