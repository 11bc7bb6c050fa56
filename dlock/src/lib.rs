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
//! This crate re-exports [`dlock_core`]: the API, the machinery and the in-process
//! [`memory`] backend.

mod url;

pub use dlock_core::*;
pub use url::{connect, raw_baseline, Scheme};

// The README's example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
