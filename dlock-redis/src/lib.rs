//! Redis backend for dlock: one server, a Redis Cluster, the master a Sentinel names, or
//! RedLock over several independent masters ([`redlock`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//! use dlock_redis::RedisConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let locker = dlock_redis::connect(RedisConfig::from_url("redis://127.0.0.1:6379/0?op_timeout=2s")?).await?;
//! let name = LockName::new("orders/42")?;
//! let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await?;
//! // Hand lease.token() to the resource, which refuses writes carrying an older token.
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! | URL | deployment |
//! |---|---|
//! | `redis://[user[:password]@]host[:port][/db]` | one server (`rediss://` for TLS) |
//! | `redis+cluster://[user[:password]@]host:port,host:port,...` | a Redis Cluster, through its seed nodes |
//! | `redis+sentinel://[user[:password]@]host:port,.../master[/db]` | the master of a Sentinel group |
//! | `redlock://[user[:password]@]host:port,host:port,...[/db]` | RedLock over N independent masters (see [`redlock`]) |
//!
//! Query options: `connect_timeout`, `op_timeout`, `prefix` (default `dlock`; no braces),
//! `wait_replicas` and `wait_timeout` (see below), `keep_idle` (how long a name's fence
//! counter outlives its last use, default an hour; see below), `tls_ca` (a PEM file of
//! CAs to trust instead of the system's), `sentinel_username` and `sentinel_password`,
//! and on a Cluster `node_address` (where to reach a node that announces another
//! address; see [Cluster](#cluster)).
//! A client's [`target`](dlock_core::Locker::target) names where its locks live, without
//! credentials (`redis://10.0.0.5:6379/0 prefix dlock`). Every option
//! has a builder method on [`RedisConfig`] (the first three through [`ConnectConfig`],
//! as on every backend's configuration; `tls_ca`, with TLS, the credentials and the
//! database, through [`AccessConfig`], as on [`RedLockConfig`]). A client keeps one
//! multiplexed command connection, which reconnects on its own, and opens one pub/sub
//! connection the first time one of its acquires has to wait (on a Cluster of Redis 7 or
//! later, one per primary its waiters listen on; see [Cluster](#cluster)). RedLock URLs have options
//! of their own (see [`RedLockConfig::from_url`]) and connect with [`redlock::connect`].
//!
//! # How a lock lives in Redis
//!
//! Each lock is a hash with a ttl, a fence counter and a pub/sub channel, all named
//! after the lock's [encoded](dlock_core::LockName::encoded) name inside a Cluster hash
//! tag (see [`keys`] for the exact layout):
//!
//! ```text
//! dlock:{orders%2F42}           hash  owner:<owner id> -> hold count, token -> 17,
//!                                     grant:<request id> -> 1 per grant           (PEXPIRE ttl)
//!                                     extended -> <grant field> <expiry it found>, while the
//!                                     grant that last lengthened the hold may be undone
//! dlock:{orders%2F42}:fence     string 17                            (PEXPIRE keep_idle, from each use)
//! dlock:{orders%2F42}:leases    zset  hold id -> when its reader's share or permit lapses
//! dlock:{orders%2F42}:void:<request id>  a request given back                     (PEXPIRE ttl)
//! dlock:{orders%2F42}:released  channel; a release publishes the released token
//! dlock:{orders%2F42}:queue     list  place ids of queued waiters, first come first (PEXPIRE)
//! dlock:{orders%2F42}:places    hash  place id -> when the place lapses (ms, server clock)  (PEXPIRE)
//! dlock:{orders%2F42}:wake:<client id>  channel; the message names the waiter now first
//! dlock:{orders%2F42}:result    hash  token -> 17, value -> <bytes>, call -> <store call id>
//!                                     (PEXPIRE retention; see below)
//! ```
//!
//! Every operation is one `EVALSHA` of a Lua script (loaded when the client connects,
//! except on a Cluster, and sent whole with `EVAL`, routed by its key, where the node
//! answers `NOSCRIPT`, so that a Cluster node that is down, or a replica promoted since,
//! costs nothing at connect and one `EVAL` per script later):
//!
//! - **acquire** grants when the hash is absent (`INCR` of the fence counter, the
//!   owner's count set to 1, the token stored, `PEXPIRE` of the ttl rounded up to whole
//!   milliseconds) or when the same owner holds it (count + 1, same token, the ttl never
//!   shortened); otherwise it returns the hold's remaining ttl (`PTTL`);
//! - **renew** (the watchdog, every ttl/3) and **release** check the owner *and* the
//!   token, so a stale lease can neither extend nor free a newer holder's lock; the last
//!   release deletes the hash and `PUBLISH`es on the lock's channel (`SPUBLISH` on a
//!   Cluster of Redis 7 or later);
//! - every grant is recorded under the request that made it, which makes each script
//!   idempotent: a call delivered twice (a retry after a broken connection, a Cluster
//!   client re-sending) grants or releases once. An acquire whose reply was lost (a
//!   timeout, a reset) is **given back**: a script removes exactly that request's grant,
//!   never another holder's or the same owner's other grants, and marks the request so
//!   that a late delivery of it grants nothing;
//! - the last release deletes the hash first (`DEL` works when the server is out of
//!   memory, see below);
//! - a **waiter** subscribes to the channel before it looks again, then sleeps until a
//!   release message or the holder's remaining ttl (an expired or deleted hold sends no
//!   message), on one pub/sub connection shared by every waiter of the client. It waits
//!   a quarter of the operation timeout for its subscription at most: when the pub/sub
//!   connection cannot be opened in time (while commands work), it looks again at the
//!   holder's ttl instead of failing the acquire, and is woken once the subscription is
//!   in place after all.
//!
//! # Fair locks
//!
//! With [`LockOptions::fair`](dlock_core::LockOptions::fair) a waiter takes a place in
//! the lock's queue (its place id is its request id) and is granted only when the lock
//! is free and its place is first. Each look refreshes the place to lapse one place lapse
//! later ([`place_lapse`](dlock_core::place_lapse): the ttl, at most five seconds, whatever
//! lease the waiter asks for), and a queued waiter looks again at least every quarter of
//! it, so a waiter whose process died is skipped within seconds, even one that asked for
//! a fixed lease of a year: lapsed places are dropped as they reach the head, and waiters
//! behind a head wake when its place would lapse. Giving up
//! (a timeout, a cancellation, a give-back) removes the place at once.
//!
//! Wake-ups go to the head alone: the release that frees the lock publishes the first
//! live place id on the wake-up channel of that waiter's client (`:wake:<client id>`;
//! on the lock's `:released` channel when nobody queues), so only that client receives
//! it, and it wakes only the waiter it names. A client's waiters on one lock share that
//! subscription, so waiters that come and go while others wait cost no `SUBSCRIBE`. The
//! head giving up its place while the lock is free wakes the next one the same way.
//!
//! While the queue has a live place, nobody overtakes it: a non-fair acquire is granted
//! only at the head too, a `try_acquire` of a free lock with a queue finds it busy, and a
//! blocking non-fair acquire that finds a queue takes a place at its end. Without a queue,
//! non-fair acquires work as above (every waiter retries on the release message), which
//! is cheaper when nobody asks for fairness. Re-entering a hold by its owner never
//! queues. RedLock has no queue (its `fifo` capability is false).
//!
//! An uncontended acquire and release are two commands on one multiplexed connection.
//!
//! # Read-write locks and semaphores
//!
//! A reader's share ([`LockOptions::read`](dlock_core::LockOptions::read)) and a permit
//! ([`LockOptions::permits`](dlock_core::LockOptions::permits)) have scripts of their
//! own; the lock alone (a writer) keeps the exclusive scripts above, unchanged in what an
//! uncontended acquire and release send. Readers and permits hold through the same hold
//! hash, marked `kind` → `shared` or `permit`, with fields per hold (`holder:<hold id>` →
//! its token, `count:<hold id>` → its grants, and for a permit `permits:<hold id>` → the
//! number of permits it asked for) and per grant (`request:<request id>` → its hold id),
//! and through the `:leases` sorted set, where each hold's id is scored with the time its
//! hold lapses. A reader's hold id is its owner id; a permit's is the owner id and the
//! number of permits ([`keys::hold_id`]), so an owner re-enters a permit only with the
//! same number, and asking with another number takes another permit, with a token of its
//! own. Each hold lapses on its own (a crashed reader's share ends
//! at its own ttl): every script drops the leases past their time before it looks, and
//! the hash and the set get the last lease's time as their expiry, so the writer's
//! script, which only sees the hash, finds the lock free exactly when no lease is left.
//! Every grant, of any kind, takes the next value of the one fence counter.
//!
//! A reader is admitted beside readers; a permit beside permits, while no holder, the new
//! one included, would have more holds beside it than its own number of permits allows
//! (fewer permits out than the request's number and than the number of every permit out;
//! a permit written by an older client without its number bounds nobody). Nothing else
//! mixes. So the number of permits can change at run time: while holders of an old
//! number remain, the smaller number bounds every grant. A writer that waits for readers
//! or permits takes a place in the lock's queue even when it did not ask for fairness, so
//! that readers coming after it queue behind it (writer preference: a stream of readers
//! cannot starve it); when the last reader leaves, the release wakes the head of the
//! queue as it does for a fair lock. A blocking permit request that is refused takes a
//! place too, so that a later request (for more permits, say) cannot overtake it: once
//! a queue exists, permits are granted only at its head, in the order they asked. A reader granted at the head wakes the next waiter,
//! who may join it. A permit handed back wakes the head of the queue (or publishes on the
//! lock's channel when nobody queues), as it may admit a waiter; a reader leaving other
//! readers behind admits nobody new and publishes nothing. Renewals, releases, give-backs
//! and stored results check the hold's owner, token and grant as for the lock alone; a
//! lost share or permit is reported stolen only when a hold of a kind it excludes is
//! there, else expired.
//!
//! # Stored results
//!
//! [`Lease::store_result`](dlock_core::Lease::store_result) (what
//! [`idempotent`](dlock_core::idempotent()) runs on) is one script too: it checks the hold
//! as a release does (this token, this owner, this grant still there) and that the
//! stored result, if any, has a lower token, then writes the `:result` hash and gives it
//! the retention as its ttl; otherwise it writes nothing and the store is `NotHeld`. The
//! result key is apart from the hold, so a release or an eviction leaves it, and it
//! shares the lock's hash tag, so that one script can touch both on a Cluster. A store
//! delivered twice (re-sent after a broken connection) finds its own record and succeeds
//! once. [`Locker::load_result`](dlock_core::Locker::load_result) reads it with a
//! script of its own; a record dlock did not write is a `Backend` error. See
//! [`results`] for the scripts.
//!
//! # Fencing tokens
//!
//! The token is the value of the lock's fence counter after the granting `INCR`: it
//! strictly increases over the grants of a name, and a re-entrant acquire returns the
//! holder's token again. The counter outlives the name's last grant, renewal or release
//! by the keep time ([`RedisConfig::with_keep_idle`], URL option `keep_idle`, an hour by
//! default), then expires, so that names nobody uses any more (an idempotency key per
//! request, say) leave nothing behind: every key of a name expires by itself (see
//! [`keys`] for how long each lasts), and the server needs no sweep. A grant that finds
//! the counter gone (`INCR` answers 1) starts it from the server's clock in
//! microseconds, which is above every token the name had, as long as the server's clock
//! never steps back by the keep time: tokens of a new name look like timestamps, and
//! tokens never go back when a lock is freed or a name comes back.
//!
//! # What survives a restart
//!
//! Only what the server persists. With `appendonly yes` and `appendfsync always`, holds
//! and fence counters survive a crash: tokens keep increasing. With RDB snapshots or
//! `appendfsync everysec`, a crash can lose the last writes: a fence counter may go
//! back (a later holder could get a token an earlier one had), and a hold may vanish
//! (another client can then acquire while the holder still believes it holds the lock,
//! until its next renewal reports the loss). Without persistence, everything is lost.
//! Use a persistent server when the fencing tokens protect anything.
//!
//! # Memory policy
//!
//! Use `maxmemory-policy noeviction` (or a server or database of its own for the locks).
//! Under a `volatile-*` policy (the default of several managed services) a hold, which
//! has a ttl, can be evicted under memory pressure before its ttl ends: another client
//! then gets the lock while the holder still counts on it. Under `allkeys-*` the fence
//! counters can be evicted too, and tokens start again from 1. The client reads the
//! policy when it connects (where the ACL allows `CONFIG GET`) and logs a warning for a
//! policy that evicts. Under `noeviction` at the memory limit, acquires fail with
//! `Unavailable` (the server refuses writes), while releases still work: the last
//! release of a hold deletes it, which the server allows.
//!
//! # Time
//!
//! Expiry follows each server's wall clock: a server clock that steps forward ends holds
//! early (the clock-drift allowance covers rates, not steps); keep servers on a slewing
//! NTP. The client counts validity on its monotonic clock, which does not advance while
//! the host is suspended: after a resume `remaining()` can be too high. A `Fixed` lease
//! is never renewed, so a hold lost to a restart or a failover is noticed by nobody
//! until its ttl ends: the fencing token is what protects the resource then.
//!
//! # Replication and failover
//!
//! Redis replicates asynchronously. If the master fails right after granting a lock and
//! before a replica has the write, the promoted replica does not know the hold: another
//! client can acquire the same lock, with a fence counter that may have gone back. With
//! [`RedisConfig::with_replica_ack`] (`?wait_replicas=N&wait_timeout=100ms` in the URL)
//! each grant, renewal and stored result is followed by `WAIT N timeout` on the
//! connection that sent it, one of a few the client opens for them alone (`WAIT` blocks
//! its connection, and busy answers, releases and inspects do not wait behind it): a
//! grant fewer than N replicas acknowledged is given back and fails with
//! [`LockError::QuorumNotReached`](dlock_core::LockError), an unacknowledged renewal
//! counts as failed (the watchdog retries it until the lease runs out), and an
//! unacknowledged result fails the store with `QuorumNotReached` but stays on the master
//! (it was stored under a live hold; a failover may lose it, and then a later run does
//! the work again). On a Cluster, `WAIT` goes in one pipeline with a command on the
//! lock's key, so it reaches the primary that granted, and counts that primary's
//! replicas. This narrows the window but does not close it: `WAIT` does not make Redis
//! strongly consistent (a replica may acknowledge and still not be the one promoted,
//! and expiries follow each server's clock). Where a lost lock is unacceptable, keep the
//! fencing token check in the protected resource, or use RedLock, ZooKeeper or etcd.
//!
//! Through Sentinel (`redis+sentinel://`), the client asks the Sentinels for the master and
//! follows it to a new one. It asks every Sentinel of the URL at once, waiting for each at
//! most a third of the connect timeout (a Sentinel that accepts connections and never
//! answers, as a frozen host, costs that third and holds up none of the others' answers),
//! and follows the answer with the highest configuration epoch (from `SENTINEL MASTER`),
//! passing over answers whose Sentinel sees its master down while another sees its own up:
//! a Sentinel cut off during a failover, or restarted with an old configuration, names the
//! old master under the old epoch, even if it answers first or most of them do. The client
//! never moves to a master of a lower epoch than the one it follows (a Sentinel group
//! rebuilt from scratch, whose epochs start again at 0, needs its clients reconnected). It
//! subscribes on every Sentinel of the URL to the events that name a new master of its
//! group (`+promoted-slave` from the Sentinel leading a failover, `+switch-master` from
//! every Sentinel; they carry no epoch, so the client asks the Sentinel that announced for
//! it before it moves), asks the master for its `ROLE` every second, and asks the Sentinels
//! again when a command fails in a way that suggests a failover (a broken connection,
//! `READONLY`, `MASTERDOWN`, `NOREPLICAS`, `LOADING`, also inside a script). Its command
//! connections and its waiters' pub/sub connection move together. So a failover that raises
//! no error on the client's connections (the old master keeps running, and takes writes
//! until the Sentinels demote it seconds later) moves idle and waiting clients alike to the
//! new master as soon as the Sentinels name it; list every Sentinel in the URL, since only
//! the leader of a failover announces the promotion. A client that hears from no Sentinel
//! (cut off from them together with the old master) still writes to the old master unless
//! it runs with `min-replicas-to-write`: then two clients can hold one lock (one on each
//! master), with the same token. Configure `min-replicas-to-write 1` (the old master then
//! answers `NOREPLICAS`, which sends the client to the Sentinels), and keep the fencing
//! check in the resource.
//!
//! # Cluster
//!
//! On a Cluster (`redis+cluster://`) commands are routed by slot, and every key and
//! channel of a lock hashes to the lock's slot (see [`keys`]). The client reads the
//! servers' version when it connects. On Redis 7 or later wake-ups go by sharded
//! pub/sub: the scripts `SPUBLISH`, so a release reaches only the shard (the primary and
//! its replicas) that serves the lock's slot, not every node, and a waiter's client
//! `SSUBSCRIBE`s on that primary, over one connection per primary it listens on. Which
//! primary that is comes from `CLUSTER SLOTS` asked through the command connection (the
//! URL's seed nodes may be gone) and from `MOVED`.
//!
//! When the slot migrates to another primary, or its primary fails over to a replica
//! (`CLUSTER FAILOVER`, or the primary killed and its replica promoted), the old node
//! drops the subscription (a `sunsubscribe` push) or its connection breaks; the client
//! subscribes again where the slot is served then (trying again with a growing delay,
//! up to 2 s, until the Cluster names a reachable primary) and wakes the lock's waiters,
//! since a release may have come meanwhile. Subscriptions of other slots stay. The tests
//! move a waited-for lock's slot to another primary, fail its primary over by hand, and
//! kill it (with the waiters' client seeded by that primary alone): the waiters are
//! woken by the release on the new primary within seconds, where the holder's ttl would
//! have had them wait 30 s; and no node of another shard receives the release's message.
//!
//! A `MOVED` or `ASK` answer to a script means the node did not run it (the slot is not
//! served there, or not yet), so the Cluster client's redirect to the right node is the
//! script's first run, whatever the script. A call that may have run already (its
//! connection broke after it was sent) is sent again only as every script here allows:
//! each is idempotent by its call's id (a grant by its request's field, a release that
//! finds its grant gone answers so, a stored result by its call id), and an acquire that
//! is not sent again is given back.
//!
//! Nodes behind a NAT or a port mapping (a Cluster in Docker announces addresses of its
//! own network) are reached where `node_address=<announced host:port>=<host:port>` says,
//! once per node ([`RedisConfig::with_node_address`]): every connection to such a node
//! goes there (commands, `WAIT`, sharded subscriptions, a seed given by its announced
//! address), while the slot map and redirections keep the announced addresses. A test
//! reaches every node through a proxy this way, and finds the client cut off from the
//! Cluster when the proxies cut, while the nodes still serve other clients.
//!
//! The ACL user needs `SPUBLISH` and `SSUBSCRIBE` on the lock channels, and `INFO`
//! (without it, or before Redis 7, the client keeps classic pub/sub: the scripts
//! `PUBLISH`, which the Cluster sends to every node, and waiters listen on one of the
//! URL's seed nodes).
//!
//! # Capabilities
//!
//! Re-entrant by owner, fixed and watchdog leases, `extend`, notification on release,
//! FIFO grants on request and queue lengths in `inspect` (see above), stored results,
//! readers' shares and semaphore permits ([`CAPABILITIES`]). RedLock claims less (see
//! [`REDLOCK_CAPABILITIES`]).

mod access;
mod backend;
#[cfg(feature = "bench")]
mod baseline;
pub mod config;
mod connection;
mod error;
mod handoff;
mod hold;
pub mod keys;
mod lua;
mod pubsub;
pub mod redlock;
mod replies;
pub mod results;
pub mod scripts;
mod sentinel;
mod shards;

use dlock_core::{Client, LockError};

pub use access::{AccessConfig, ServerAccess};
pub use backend::{RedisBackend, RedisTicket, CAPABILITIES};
#[cfg(feature = "bench")]
pub use baseline::RedisBaseline;
pub use config::{Node, RedisConfig, ReplicaAck, Topology, SCHEMES};
pub use connection::{NodeSource, RedisConnection};
/// The shared builder methods of [`RedisConfig`] and [`RedLockConfig`] (timeouts and
/// prefix; TLS, credentials and database are [`AccessConfig`]'s).
pub use dlock_core::ConnectConfig;
pub use hold::RedisHold;
pub use keys::{KeyLayout, LockKeys};
/// The redis crate this one is built with: [`RedisConfig::from_client`] takes its `Client`.
pub use redis;
pub use redlock::{RedLockConfig, RedLockLocker, REDLOCK_CAPABILITIES};
pub use shards::ShardNodes;

/// The connections of their own that grants and renewals take when they wait for
/// replicas: `WAIT` blocks the connection it is sent on for up to its timeout.
const ACKED_CONNECTIONS: usize = 4;

/// A lock client over Redis.
pub type RedisLocker = Client<RedisBackend>;

/// Connects to Redis as `config` says (within its connect timeout) and returns a lock
/// client whose operations are bounded by its operation timeout.
///
/// Fails with `Unavailable` when no server answers in time, `InvalidInput` for a bad
/// configuration.
pub async fn connect(config: RedisConfig) -> Result<RedisLocker, LockError> {
    let layout = KeyLayout::new(config.prefix())?;
    let named = |err: LockError| err.at(|| config.target());
    let connected = connection::connect(&config).await.map_err(named)?;
    let replica_ack = match config.replica_ack() {
        Some(ack) => {
            Some((ack, connection::connect_more(&config, &connected, ACKED_CONNECTIONS).await.map_err(named)?))
        }
        None => None,
    };
    let subscriptions = pubsub::Subscriptions::start(connected.nodes, config.connect_timeout(), config.op_timeout());
    let backend = RedisBackend::new(connected.commands, layout, subscriptions, replica_ack)
        .with_keep_idle(config.keep_idle())
        .with_target(config.target());
    Ok(Client::with_config(backend, config.common().client_config()))
}

/// The raw baseline of `dlock bench`: the same script calls an uncontended acquire and
/// release send, over the same kind of connection, without the library around them.
#[cfg(feature = "bench")]
pub async fn raw_baseline(config: RedisConfig) -> Result<RedisBaseline, LockError> {
    let layout = KeyLayout::new(config.prefix())?;
    let connected = connection::connect(&config).await?;
    let scripts = connected.nodes.publish().scripts();
    Ok(RedisBaseline::new(connected.commands, layout, scripts, config.replica_ack()))
}
