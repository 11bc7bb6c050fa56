//! The etcd backend of dlock: leases kept alive by the client, a create-revision queue
//! per lock, and the key's create revision as fencing token.
//!
//! # How locks map onto etcd
//!
//! - **Sessions.** A client grants one etcd lease per distinct ttl (rounded up to whole
//!   seconds, etcd's unit), on first use, and shares it among all its locks and waiters of
//!   that ttl; the watchdog keeps it alive every ttl/3, and the renewals the scheduler
//!   finds due together ([`Backend::renew_many`](dlock_core::backend::Backend::renew_many))
//!   share one keepalive and one ownership check (a listing of the lease's keys, or a
//!   transaction of reads). Keepalives are not cut by a timeout of their own: a late
//!   answer within the lease's validity still renews it, and one that hangs does not hold
//!   up the next. A `Fixed(ttl)` lease gets a lease of its own that nobody keeps
//!   alive. Leases are never granted per lock for watchdog locks, and an unused lease is
//!   revoked, not leaked.
//! - **Keys.** A lock named `n` is the range `<prefix>/<encoded n>/` (the name is
//!   percent-encoded, [`lock_dir`]); each acquire puts one key
//!   `<prefix>/<encoded n>/<lease id>-<seq>` on its session's lease, holding
//!   `"<count> <owner>\0<request id> ..."`: the owner and the acquires holding the lock
//!   through the key (several for re-entrant holds). Every change to a hold is a
//!   compare-and-swap named by its request, so a release or re-entry whose answer was
//!   lost is never applied twice, and an acquire whose answer was lost is undone exactly. The key with the lowest create revision holds the lock; the
//!   others wait in create-revision order (FIFO), each watching the delete of the key
//!   just ahead of its own, so a release wakes one waiter. A woken waiter checks again
//!   that no key is ahead of it, that its own key still exists and that its lease is
//!   alive, so a waiter whose lease expired while it was blocked never believes it holds
//!   the lock (etcd#11456).
//! - **Fencing token.** The holder key's create revision: etcd's revision is global and
//!   only grows, so successive holders of a name get strictly increasing tokens, and a
//!   re-entrant acquire returns the holder's token again. For data kept in etcd itself,
//!   [`EtcdBackend::guarded_txn`] builds a transaction that applies only while the
//!   holder key with that create revision exists (etcd's `IsOwner`).
//! - **Results.** The result a run stores under a lock's name (for
//!   [`idempotent`](dlock_core::idempotent()) execution) is one key beside the lock's
//!   range, `<prefix>/<encoded n>!result` ([`result_key`]), so the queue never counts it
//!   and a release or eviction leaves it alone. Its value is `"<token>\n<result>"`, and it
//!   sits on an etcd lease of its own, granted for the retention rounded up to whole
//!   seconds, which deletes it when the retention ends. A store is one transaction that
//!   puts it only while the hold's key exists with its create revision, on the lease this
//!   client keeps it on, still naming the hold, and while the result key is as last read
//!   (absent, or holding a lower token); a result of an equal or higher token is never
//!   replaced (`NotHeld`). It costs a lease grant and one transaction.
//! - **Round trips.** An uncontended acquire is one transaction (put-if-the-range-is-empty)
//!   with a keepalive of the lease sent alongside (its validity counts from the attempt,
//!   so the lease must be renewed after the attempt began; concurrent acquires share the
//!   keepalive), and the release one guarded delete: two round trips. A `Fixed` acquire
//!   grants its own lease first: three.
//! - **Lost signal.** A renewal that finds the key gone reports the lease lost (`Expired`),
//!   as does a keepalive that finds the lease gone (`SessionExpired`, pushed to every lock
//!   on that lease at once); renewals that cannot reach etcd until the validity ends give
//!   `BackendUnavailable`.
//!
//! # Clusters
//!
//! The client talks to one member at a time and moves on to the next when that member
//! cannot be reached, has no leader, or does not answer in time; requests that surely
//! were not received (a refused connection, a member without a leader) are sent again to
//! another member within the operation timeout, and reads also after a broken
//! connection. A waiter whose watch breaks (its member died, an election is under way)
//! watches again from the same revision, so it misses no release.
//!
//! # Restarts and failover
//!
//! Everything lives in etcd's replicated, persisted key space: keys, leases and the
//! revision counter survive a restart or a leader change, so tokens keep increasing. etcd
//! restarts every lease's countdown when a leader takes over (a restart included), so a
//! hold can outlive its holder by up to one ttl after a failover (longer, never shorter,
//! which is the safe direction). A holder cut off from etcd loses its lease when renewals
//! fail until its validity ends; the server frees the key only after that. Requests to a
//! member without a leader fail at once (`Unavailable`) instead of waiting.
//!
//! # Caveats
//!
//! - etcd grants whole-second leases, at least about 1.5 election timeouts long: a 300 ms
//!   ttl is kept for a second on the server (the client still counts 300 ms).
//! - Re-entrancy is by owner within one client: the same owner through another client
//!   (another lease) queues like anyone else.
//! - A lock's range must hold only dlock's keys; `inspect` reports an error for a value
//!   dlock did not write, as `load_result` does for a result key.
//! - A result may be kept longer than its retention, never shorter: etcd raises a lease
//!   below its minimum ttl to that minimum, and restarts every lease's countdown when a
//!   leader takes over.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let config = dlock_etcd::EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379?prefix=shop")?;
//! let locker = dlock_etcd::connect(config).await?;
//! let name = LockName::new("orders/42")?;
//! let lease = locker.acquire(&name, &LockOptions::new().ttl(Duration::from_secs(10))).await?;
//! // Writes to etcd guarded by the lease's token apply only while it holds the lock.
//! let write = etcd_client::TxnOp::put("orders/42/state", "paid", None);
//! let applied = locker.backend().guarded(&name, lease.token(), [write]).await?.succeeded();
//! assert!(applied);
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod backend;
#[cfg(feature = "bench")]
mod baseline;
mod cluster;
mod config;
mod connect;
mod error;
mod fence;
mod keys;
mod lock;
mod registry;
mod results;
mod session;

use dlock_core::{Client, ClientConfig, ConnectConfig, LockError};

pub use backend::EtcdBackend;
#[cfg(feature = "bench")]
pub use baseline::{raw_baseline, EtcdBaseline};
pub use config::EtcdConfig;
pub use error::EtcdError;
pub use fence::guard;
pub use keys::{lock_dir, result_key};
pub use lock::EtcdTicket;
pub use registry::EtcdHold;

/// A lock client over etcd.
pub type EtcdLocker = Client<EtcdBackend>;

/// Connects to etcd (authenticating, and checking the cluster answers, within the
/// connect timeout) and returns a lock client whose operations are bounded by the
/// operation timeout.
pub async fn connect(config: EtcdConfig) -> Result<EtcdLocker, LockError> {
    let cluster = connect::open(&config).await?;
    let backend = EtcdBackend::new(cluster, config.prefix().to_string(), config.op_timeout());
    Ok(Client::with_config(backend, ClientConfig { op_timeout: config.op_timeout() }))
}
