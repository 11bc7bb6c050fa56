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
//!   revoked, not leaked. Each grant names its lease id (drawn at random), so a grant
//!   sent again after its answer was lost takes the lease the first sending made, and a
//!   grant that fails with no answer revokes that id in the background until the
//!   server answers (or the lease would have ended anyway).
//! - **Keys.** A lock named `n` is the range `<prefix>/<encoded n>/` (the name is
//!   percent-encoded, [`lock_dir`]); each acquire puts one key on its session's lease,
//!   named for the kind of hold it asks for: `<prefix>/<encoded n>/<lease id>-<seq>` for
//!   an exclusive hold (a mutex, a read-write lock's writer), `.../r/<lease id>-<seq>` for
//!   a reader, `.../p/<permits>/<lease id>-<seq>` for one of a semaphore's `<permits>`
//!   permits (the number each request asked with). The key holds
//!   `"<count> <owner>\0<request id> ..."`: the owner and the acquires holding the lock
//!   through the key (several for re-entrant holds). Every change to a hold is a
//!   compare-and-swap named by its request, so a release or re-entry whose answer was
//!   lost is never applied twice, and an acquire whose answer was lost is undone exactly.
//! - **Queue.** The keys queue in create-revision order, and a key holds when every key
//!   ahead of it holds and is compatible with it: an exclusive key when it is first, a
//!   reader when only readers are ahead of it, a permit request when only permit requests
//!   are ahead of it, fewer than its own number of permits and than the number of each of
//!   them ([`HoldKind::joins`](dlock_core::HoldKind::joins)). Grants therefore follow the
//!   queue (FIFO), and a waiting writer keeps the readers that come after it out (writer
//!   preference). Each waiter watches only the deletes that can let it in: a writer the
//!   key just ahead of its own, so a release wakes one waiter; a reader the last key ahead
//!   of it that is not a reader; a permit request the last key ahead of it that is not a
//!   permit request or, behind permit requests only, the nearest `permits` of them (up to
//!   32; beyond that it also looks again twice a second). A woken waiter checks again
//!   what is ahead of it, that its own key still exists and that its lease is alive, so
//!   a waiter whose lease expired while it was blocked never believes it holds the lock
//!   (etcd#11456). While it waits, a key sits on a short lease of the client's (at most
//!   [`MAX_PLACE_LAPSE`](dlock_core::MAX_PLACE_LAPSE)), so a waiter that dies keeps the
//!   queue behind it waiting for seconds whatever ttl it asked for; it moves back to a
//!   lease of its ttl once it holds.
//! - **What stays per name.** Nothing: the keys go with their release or their lease,
//!   results ride on a lease of their retention, and the token is a revision, so there is
//!   no counter to keep and nothing to sweep.
//! - **Fencing token.** The holder key's create revision, for every kind of hold: etcd's
//!   revision is global and only grows, and keys hold in create-revision order, so every
//!   grant's token is above every earlier grant's of the name (a writer's above the
//!   readers' before it), and a re-entrant acquire returns the holder's token again. For data kept in etcd itself,
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
//! - **Round trips.** An uncontended acquire is one transaction (put-if-the-range-is-empty;
//!   for a reader, put-if-only-readers-are-in-it; for a permit, put-if-only-permits-are-in-it
//!   and read the permit requests ahead) with a keepalive of the lease sent alongside (its
//!   validity counts from the attempt, so the lease must be renewed after the attempt
//!   began; concurrent acquires share the keepalive), and the release one guarded delete:
//!   two round trips. A `Fixed` acquire grants its own lease first: three. A
//!   `try_acquire` of a busy lock puts nothing, except on a semaphore whose permits are all
//!   out, where it deletes the key it put again: two.
//! - **Lost signal.** A renewal that finds the key gone reports the lease lost (`Expired`),
//!   as does a keepalive that finds the lease gone (`SessionExpired`, pushed to every lock
//!   on that lease at once); renewals that cannot reach etcd until the validity ends give
//!   `BackendUnavailable`. A gone key is never reported `Stolen`, for any kind of hold:
//!   the key is gone either way, and telling who holds now would take another read.
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
//!   (another lease) queues like anyone else, and so does an owner asking for another
//!   kind of hold than it holds (a reader does not become a writer).
//! - A permit request reads up to `permits` keys ahead of it on each check, so very
//!   large semaphores that are full cost reads in proportion.
//! - `inspect` of a lock held by readers or permits reads the whole queue, and shows the
//!   newest of the holds.
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

use dlock_core::{Client, ConnectConfig, LockError};

pub use backend::EtcdBackend;
#[cfg(feature = "bench")]
pub use baseline::{raw_baseline, EtcdBaseline};
pub use config::EtcdConfig;
pub use error::EtcdError;
/// The etcd-client crate this one is built with: [`EtcdConfig::with_client`] takes its
/// `Client`.
pub use etcd_client;
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
    let cluster = connect::open(&config).await.map_err(|err| err.at(|| backend::target(&config)))?;
    let backend = EtcdBackend::new(cluster, &config);
    Ok(Client::with_config(backend, config.common().client_config()))
}
