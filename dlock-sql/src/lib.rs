//! SQL backends for dlock: PostgreSQL, MySQL/MariaDB and SQLite, through sqlx.
//!
//! Two lockers, and three helpers for the database locks of the seeds:
//!
//! - [`SqlLocker`] (the default): a **lease table**. Each lock name is a row of
//!   `<prefix>_leases` (default `dlock_leases`): `name` (the full name, compared byte by
//!   byte: `TEXT COLLATE "C"`, SQLite's `BINARY`, MySQL's `VARBINARY(1024)`), `owner`,
//!   `holds` (the re-entrant count), `fence` and `expires_us`. Expiry is judged by the
//!   **database's clock** (microseconds since the epoch, read by the statement itself), never
//!   the client's; a ttl is rounded up and 1 ms of clock-resolution slack is added, so the
//!   database never frees a hold before the client's validity (counted from when the
//!   granting statement was sent) has ended. Acquire, renew and release are **one statement
//!   each** (an `INSERT … ON CONFLICT DO UPDATE … RETURNING` on PostgreSQL and SQLite, an
//!   `INSERT … ON DUPLICATE KEY UPDATE` answering through `LAST_INSERT_ID` on MySQL), on
//!   pooled connections: an uncontended acquire+release is 2 statements. The renewals that fall
//!   due together are one statement (`Backend::renew_many`; on MariaDB before 10.6, which
//!   lacks `JSON_TABLE`, one statement each). Release and renew are checked against owner
//!   and token in the statement. Each grant records its request id, so that a release sent
//!   twice (its reply lost) takes back one hold, and an acquire whose reply was lost is
//!   given back exactly (never another grant of the same owner). Waiters are woken by `LISTEN/NOTIFY` on
//!   PostgreSQL (the release sends `pg_notify` at commit); on MySQL and SQLite they poll with
//!   jittered backoff, never later than the holder's remaining ttl.
//!
//!   **Read-write locks and semaphores** ([`HoldKind`](dlock_core::HoldKind)): shared holds
//!   and permits are rows of `<prefix>_holds` beside the lease table, one per grant (name,
//!   request id, owner, kind, token, expiry); a permit's kind keeps the number of permits
//!   it was granted under (`permit:<n>`), so that a grant joins only where no holder would
//!   have more company than its own number allows ([`HoldKind::joins`]). Each grant,
//!   renewal and release of one is a transaction that first locks the name's lease row, so
//!   it decides on the holds as the last one left them; the token comes from the lease
//!   row's one fence counter, and the lease row keeps the latest expiry of the live shared
//!   holds and permits (`shared_us`, given the very expiry of each new or renewed row),
//!   which is how the one-statement exclusive acquire sees them. There is no queue: a
//!   blocking writer that finds readers in its way keeps a place there, while which no new
//!   reader or permit is granted (readers cannot starve writers), and a blocking permit
//!   request that is refused keeps a place with its number of permits, while which no later
//!   request for more permits is granted (more never overtakes fewer). A place lapses
//!   [`place_lapse`](dlock_core::place_lapse) of the ttl after its last refresh (5 s at
//!   most, whatever lease it asks for), and its waiter refreshes it four times within
//!   that: a waiter that died keeps the others out for seconds. An exclusive lock costs
//!   exactly what it did: readers and permits add statements only to their own operations
//!   (and to a writer that waits for them).
//!
//!   [`HoldKind::joins`]: dlock_core::HoldKind::joins
//! - [`AdvisoryLocker`] (`lock=advisory`): PostgreSQL `pg_try_advisory_lock` or MySQL
//!   `GET_LOCK`, held by a dedicated session per lock (see [`advisory`] for how the
//!   session is watched and how a frozen holder's session ends).
//! - [`RowLock`]: `SELECT … FOR UPDATE` (with `NOWAIT` or a wait bound) on one of your rows,
//!   for the duration of a transaction that runs your work; [`optimistic`]: the version-column
//!   compare-and-set with retries; [`fenced`]: `UPDATE … WHERE fence <= token`, so a resource
//!   in the same database refuses a holder whose lease ran out.
//!
//! **Stored results** (for [`idempotent`](dlock_core::idempotent()) execution): a row of
//! `<prefix>_results` beside the lease table, keyed by the same `name` column (the same
//! type and byte-by-byte comparison), with the `token` of the hold that stored it, its
//! `value` (`BYTEA`, MySQL's `LONGBLOB`, SQLite's `BLOB`) and `expires_us` on the database's
//! clock. A store is **one statement**: an `INSERT … SELECT` from the lease row under the
//! checks `release` makes (owner, token, grant, not expired), reading that row with a
//! shared lock (PostgreSQL `FOR SHARE`, MySQL `LOCK IN SHARE MODE`, SQLite's write lock) so
//! that no release, eviction or grant commits between the check and the write, and an
//! upsert that replaces only a result of a lower token or an expired one. Releasing or
//! evicting the lock leaves the result; a load ignores it once expired; the next store of
//! the name replaces it, and the sweep (below) deletes it; each client also deletes up to
//! 1,000 expired results after a store (at most once a minute). A 512 KiB result needs MySQL's `max_allowed_packet` of at least
//! 1 MiB (the default is 16 MiB on MariaDB, 64 MiB on MySQL 8). The advisory locker keeps
//! its results in `<prefix>_advisory_results` (see [`advisory`]).
//!
//! **Fencing token**: the row's `fence` counter, raised by every grant (a re-entrant acquire
//! returns the holder's token). A row is made with its counter at the database's clock in
//! microseconds (the clock expressions its expiries use), so a name whose row was swept
//! starts again above every token it had: a counter rises by one a grant, never faster
//! than the clock. **What survives a restart**: everything committed: holds (with their
//! expiry on the database clock), fence counters. Advisory locks do not survive: the
//! sessions end.
//!
//! **What stays per name, and for how long**: a name's lease row (its fence counter) for
//! the keep time ([`ConnectConfig::with_keep_idle`](dlock_core::ConnectConfig::with_keep_idle), `keep_idle=`, an hour by default) after
//! its last hold ended, by release or expiry, and while any hold or waiter's place of it
//! is live; a row of the holds table until it expires (a hold's ttl, a place's lapse); a
//! stored result until its retention ends; for the advisory locker, the name's counter row
//! for the keep time after its last grant, and while a session holds its lock. The client
//! sweeps ([`Locker::sweep`], and in the background every [`ConnectConfig::with_sweep_every`](dlock_core::ConnectConfig::with_sweep_every)):
//! each call deletes up to 1,000 rows of each table, using the indexes on `expires_us`
//! (lease and holds tables) and `used_us` (advisory table) that connecting creates where
//! they are missing. A sweep judges a row as it is when it locks it, and every grant
//! raises that row's expiry under the same lock, so a sweep never deletes a row that a
//! grant is using.
//!
//! **Caveats**: the database is a single point of decision. With asynchronous replication,
//! a failover can lose the last grants (and fence increments) made on the old primary: use
//! synchronous replication where that matters. The database clock must not jump: expiry is
//! wall-clock time on the server (NTP slewing is fine; a step backwards lengthens holds, a
//! step forwards shortens them), and a name swept away starts its tokens from that clock,
//! above every earlier token as long as the clock never steps back by the keep time.
//! SQLite is single-writer: all lock statements of all processes take turns on the file's
//! write lock (WAL mode, bounded by the busy timeout); it excludes processes on one
//! machine, and needs a local file system (not NFS).
//!
//! **Upgrading from an earlier version**: its clients make a missing row with the counter
//! at 0 or 1, and answer the holds table's `permit:<n>` rows with an error. Until none of
//! them runs against the tables, sweep nothing (URL option `sweep_every=off`, or
//! [`ConnectConfig::with_sweep_every`](dlock_core::ConnectConfig::with_sweep_every) at `None`) and take no permits with this version.
//!
//! URLs: `postgres://user:pass@host:5432/db`, `mysql://user:pass@host:3306/db` (also
//! `mariadb://`), `sqlite://relative/path.db`, `sqlite:///absolute/path.db`,
//! `sqlite::memory:`; options in [`SqlConfig`]. The tables are created when missing (or see
//! [`schema`] to create them from your migrations).
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let locker = dlock_sql::connect(dlock_sql::SqlConfig::from_url("sqlite://locks.db?op_timeout=2s")?).await?;
//! let name = LockName::new("orders/42")?;
//! let lease = locker.acquire(&name, &LockOptions::new().ttl(Duration::from_secs(10))).await?;
//! // Hand lease.token() to the resource; it refuses writes with an older token.
//! lease.release().await?;
//! # Ok(()) }
//! ```

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod advisory;
#[cfg(feature = "bench")]
mod baseline;
mod config;
mod db;
mod dialect;
mod error;
pub mod fenced;
mod holds;
mod lease;
mod link;
pub mod optimistic;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod relay;
mod results;
pub mod rowlock;
mod schema;
mod tls;
#[cfg(feature = "postgres")]
mod wake;

use std::sync::Arc;

use dlock_core::{Client, LockError, Locker};

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use advisory::{connect_advisory, AdvisoryBackend, AdvisoryHold, AdvisoryLocker, AdvisoryTicket};
#[cfg(feature = "bench")]
pub use baseline::{raw_baseline, SqlBaseline};
pub use config::{Dialect, LockKind, SqlConfig};
pub use dialect::schema;
pub use error::SqlError;
pub use lease::{SqlBackend, SqlHold, SqlTicket};
pub use link::SqlLink;
pub use rowlock::{RowLock, RowLocking, RowWait};
/// The sqlx this crate is built with: the pools [`SqlConfig::from_pg_pool`] and its
/// siblings take are this version's.
pub use sqlx;

/// A lock client over the lease table.
pub type SqlLocker = Client<SqlBackend>;

/// Connects a lease-table client (see [`SqlConfig`]): `Unavailable` within the connect
/// timeout when the database cannot be reached.
pub async fn connect(config: SqlConfig) -> Result<SqlLocker, LockError> {
    let client = config.common.client_config();
    let named = config.clone();
    let backend = SqlBackend::connect(config).await.map_err(|err| err.at(|| named.describe(&named.table())))?;
    Ok(Client::with_config(backend, client))
}

/// Connects the kind of client the config asks for (`lock=lease` or `lock=advisory`).
pub async fn connect_any(config: SqlConfig) -> Result<Arc<dyn Locker>, LockError> {
    match config.kind {
        LockKind::Lease => Ok(Arc::new(connect(config).await?)),
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        LockKind::Advisory => Ok(Arc::new(connect_advisory(config).await?)),
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        LockKind::Advisory => Err(LockError::InvalidInput("advisory locks need PostgreSQL or MySQL".into())),
    }
}
