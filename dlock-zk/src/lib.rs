//! The ZooKeeper backend of dlock: strict FIFO locks on ephemeral-sequential nodes, with
//! the node's `czxid` as the fencing token.
//!
//! # How locks map onto ZooKeeper
//!
//! Each lock is a znode `<root>/<encoded name>` (the root is `/dlock` unless the URL says
//! otherwise; the name is percent-encoded into one path segment, so `orders/42` becomes
//! `orders%2F42` and two names never share a znode). It is a *container* node, which the
//! server deletes once its last child is gone, and it is created when first needed.
//!
//! An acquire creates an `EPHEMERAL_SEQUENTIAL` child `_c_<uuid>-lock-<sequence>` holding
//! `<count> <owner>`, and lists the children in the same round trip (the list is pipelined
//! behind the create). The lowest sequence holds the lock. A waiter watches only the node
//! just ahead of it, so a release wakes exactly one waiter (no herd effect) and grants
//! follow request order exactly. An uncontended acquire and release is two round trips
//! and three requests (create, list, delete); a hand-off is one watch notification and one
//! list.
//!
//! The uuid in the node's name lets a client whose create reply was lost (a dropped
//! connection) find the node it created instead of creating a second one, as Curator
//! does; nodes that a client gave up (a cancelled wait, a failed release, a create whose
//! outcome was unknown) are deleted by the session's monitor as soon as the server can be
//! reached, so no orphan of a live session blocks the queue behind it.
//!
//! # Fencing token
//!
//! The token is the node's `czxid`, the id of the transaction that created it. Zxids grow
//! with every write of the whole ensemble, across leader elections (the election epoch is
//! their high half) and restarts (they are persisted), so each grant's token exceeds the
//! previous holder's. A re-entrant acquire by the same owner returns the same token.
//!
//! # Leases are sessions
//!
//! A node lives as long as its ZooKeeper session, so the lease is the session: the
//! client's pings keep it alive, and a holder that dies frees its locks when its session
//! expires. Sessions are pooled: a lease's ttl is rounded down to a ladder of buckets a
//! factor of √2 apart (anchored at the default 30 s), and all locks of a bucket on the
//! client share one session (opened on first use, closed after 10 s unused), whose
//! requested timeout is the bucket, so a holder that dies still frees its locks within
//! its ttl, and any number of different ttls costs a handful of sessions. The server clamps
//! the request into its `[minSessionTimeout, maxSessionTimeout]` (by default 2 and 20
//! ticks, 4 s to 40 s), and the *negotiated* timeout is what bounds a hold:
//!
//! - Validity is confirmed only through the leader, which alone expires sessions: every
//!   confirming read has a `sync` pipelined in front of it, so a member cut off from the
//!   leader, still answering reads from its stale tree, cannot vouch for a hold. A
//!   watchdog lease counts its validity from the negotiated timeout less a guard (a
//!   quarter and a tenth of it, for the leader's delayed view of the client's activity),
//!   not from the requested ttl.
//! - The lost signal fires with `SessionExpired` when the session expires, and with
//!   `BackendUnavailable` when nothing was confirmed through the leader for the
//!   negotiated timeout minus that guard: the leader cannot expire the session sooner, so
//!   the holder learns of the loss first.
//! - The renewals that fall due together (the client hands them over in one
//!   `renew_many` call) share one `sync` and one multi-read request per session (1,000
//!   leases renewing every few seconds cost a few requests, not 1,000). No renewal is cut
//!   short by a timeout of this crate: a late answer within the lease's validity still
//!   renews. A node deleted underneath its holder is noticed at the next renewal (a
//!   `Fixed` lease's, by the heartbeat read of the session, or when it runs out).
//! - `Fixed(ttl)` leases are honoured, and so are `extend` and `max_hold`: the client
//!   deletes a hold's node when its ttl passes without renewal. Their nodes live in
//!   sessions of at most [`MAX_PLACE_LAPSE`](dlock_core::MAX_PLACE_LAPSE) (5 s, or the
//!   ttl if shorter), so a holder or waiter that dies frees its place within seconds,
//!   whatever ttl it asked for (the server may clamp the timeout up). A `Fixed` lease's
//!   validity counts from its ttl, kept by the session's heartbeats: cut off, its lost
//!   signal still fires before the server can expire the session, but a client frozen
//!   for longer than the session's window (a long GC pause) may find on waking that
//!   `remaining()` overstated the time left; it learns of the loss as its session's
//!   expiry reaches it, and fencing covers the gap.
//! - A waiter's place is its node, so it lapses with the node's session: within a few
//!   seconds for a `Fixed` lease, within the ttl for a watchdog lease (ZooKeeper cannot
//!   keep one node on two lifetimes).
//!
//! Re-entrancy is by owner within one client: another client acquiring with the same
//! owner id queues behind the holder like anyone else.
//!
//! # Access control
//!
//! With credentials in the URL (`zk://user:password@host/...`) the client authenticates
//! with the `digest` scheme, or by SASL DIGEST-MD5 with `?auth=sasl` ([`ZkAuth`]), and
//! creates every node with an ACL that gives this identity all permissions and everyone
//! else read access: other clients can inspect the locks but can neither queue nor delete
//! a lock node (deleting needs permission on the lock's znode).
//!
//! A server that refuses the client's identity (a wrong SASL password, no SASL where the
//! server enforces it) or its rights on a node (`NoAuth`, as a wrong `digest` password
//! gets on nodes made by the right one) is [`Refused`](dlock_core::LockError::Refused),
//! not an outage.
//!
//! # Stored results
//!
//! A run's result ([`Lease::store_result`](dlock_core::Lease::store_result), and
//! [`idempotent`](dlock_core::idempotent()) built on it) lives in a persistent znode beside
//! the lock's, `<root>/<encoded name>.result` ([`ZkConfig::result_path`]). Being outside the
//! lock's znode, it is not part of the queue and stays when the lock is released, its
//! holder evicted or its znode deleted; no encoded name has a `.`, so it is never a lock's
//! znode. It has the ACL of the lock nodes. Its data is `dlr1`, the run's fencing token,
//! the record's expiry in milliseconds since the Unix epoch (by the storing client's
//! clock; 8 bytes each, big-endian), then the value.
//!
//! A store is one `multi` transaction: a check that the hold's own node still exists
//! (its path carries the uuid of the attempt that created it and is never reused, so the
//! node exists exactly as long as the grant), with the create of the result znode or a
//! `setData` conditional on the version just read, after that read found no unexpired
//! record of the same or a later token. A concurrent change fails the transaction and
//! the store reads again; a hold that is gone fails it with nothing written (`NotHeld`).
//! Reads (and the read before a store) have a `sync` in front, so a member lagging
//! behind the leader cannot hide a stored result.
//!
//! ZooKeeper deletes a plain znode only when asked (TTL nodes are off by default, and
//! their deletion can race a fresh write), so the expiry lives in the record: an expired
//! record reads as absent, and the name's next store overwrites it. Readers do not delete
//! expired records; sweeps do ([`Locker::sweep`](dlock_core::Locker::sweep), and every
//! client in the background): one client at a time, marked by the ephemeral znode
//! `<root>/.sweeping`, lists the root, reads the result znodes and deletes each expired
//! one conditionally on the version read, at most 1,000 per call. One sweeper at a time
//! is what makes that sound: a delete conditional on a version could otherwise remove a
//! record that another sweeper deleted and a store re-created at the same version. Expiry
//! is judged by each client's clock, so clock skew between clients moves it by as much.
//!
//! # What stays per name
//!
//! Nothing of a name nobody uses: its lock znode is a container, which the server deletes
//! once its last child is gone (every `znode.container.checkIntervalMs`, 60 s by
//! default, at most `znode.container.maxPerMinute` a minute), its result znode goes with
//! the first sweep after the record's retention, and tokens are zxids, so there is no
//! counter to keep. A flat root with many names makes listing it (for sweeps) costly:
//! a root per application keeps it small.
//!
//! # What survives a restart, and failover
//!
//! Sessions, nodes and zxids are persisted: a server restarted on its data keeps the holds
//! of every session that reconnects within its timeout, and tokens keep growing. While no
//! server (or no quorum) can be reached, calls fail with `Unavailable` within their
//! timeouts, and holders' lost signals fire as above. An ensemble that loses a minority of
//! its members keeps serving; clients move to another member within the session timeout,
//! and their holds survive when they get there in time (a member's loss takes a leader
//! election: a short session timeout may be too short for it, and then the holds are lost,
//! safely).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//! use dlock_zk::ZkConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let config = ZkConfig::from_url("zk://app:s3cret@zk1:2181,zk2:2181,zk3:2181/shop?op_timeout=2s")?;
//! let locker = dlock_zk::connect(config).await?;
//! let name = LockName::new("stock/sku-1")?;
//! let lease = locker.acquire(&name, &LockOptions::watchdog(Duration::from_secs(10)).wait(Duration::from_secs(5))).await?;
//! // Hand lease.token() to the resource, which refuses writes with an older token.
//! println!("holding {} with token {}", lease.name(), lease.token());
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod backend;
#[cfg(feature = "bench")]
mod baseline;
mod config;
mod error;
mod node;
mod pool;
mod results;
mod session;
mod settings;
mod znode;

pub use backend::{ZkBackend, ZkHold, ZkTicket};
#[cfg(feature = "bench")]
pub use baseline::ZkBaseline;
pub use config::{Host, ZkAuth, ZkConfig, DEFAULT_PORT, DEFAULT_ROOT, SCHEME};
/// The shared builder methods of [`ZkConfig`] (timeouts and prefix).
pub use dlock_core::ConnectConfig;
pub use error::ZkRequestError;

use dlock_core::{Client, LockError};

/// A lock client over ZooKeeper.
pub type ZkLocker = Client<ZkBackend>;

/// Connects to the ensemble the configuration names. Fails with `Unavailable` within the
/// connect timeout when no member can be reached.
pub async fn connect(config: ZkConfig) -> Result<ZkLocker, LockError> {
    let client = config.common().client_config();
    let target = backend::target(&config);
    let backend = ZkBackend::connect(config).await.map_err(|err| err.at(|| target))?;
    Ok(Client::with_config(backend, client))
}

/// The raw baseline of this backend for `dlock bench` (see [`ZkBaseline`]).
#[cfg(feature = "bench")]
pub async fn raw_baseline(config: ZkConfig) -> Result<ZkBaseline, LockError> {
    ZkBaseline::connect(config).await
}
