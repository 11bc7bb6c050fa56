//! RedLock over N independent Redis masters, with fencing tokens.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//! use dlock_redis::redlock::{self, RedLockConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let config = RedLockConfig::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379?node_timeout=50ms")?;
//! let locker = redlock::connect(config).await?;
//! let name = LockName::new("invoices/2026-11")?;
//! let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await?;
//! // Hand lease.token() to the resource, which refuses writes carrying an older token.
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The algorithm
//!
//! The masters are independent servers (no replication between them); a lock is held
//! when a quorum of N/2 + 1 of them hold it for the same owner and token.
//!
//! - **acquire** sends the grant script to every node at once, each call bounded by the
//!   per-node timeout (`node_timeout`, default 100 ms: a dead node costs that, not the
//!   ttl), and stops waiting as soon as a quorum granted. The lease's validity is the
//!   ttl minus the time since the attempt started minus the clock-drift allowance
//!   (ttl × `drift_factor` + `drift`, default 1% + 2 ms, the RedLock description's); a
//!   grant that arrives with no validity left is given back. A round that does not win
//!   gives back what it took on every node, including the ones that did not answer
//!   (their grant may have landed unseen); competitors that split the vote retry after a
//!   random delay up to `retry_delay`.
//! - **renew** (the watchdog, every ttl/3) and **release** run the single-server scripts
//!   on every node, checking owner and token on each; a renewal counts when a quorum
//!   renewed, and the lease is lost when a quorum of renewals fails (`Expired` or
//!   `Stolen` when the nodes say so, `BackendUnavailable` when they stay unreachable
//!   until the validity runs out).
//! - a **waiter** subscribes to the lock's release channel on every node (one pub/sub
//!   connection per node, shared by the client's waiters) and looks again on the first
//!   release message, or when enough of the current holds have expired.
//!
//! An uncontended acquire and release are two fan-outs of one script call each: on
//! every node, one `EVALSHA` of the grant script and one of the release script.
//!
//! # How a lock lives on each node
//!
//! Exactly as on a single server (see [`keys`](crate::keys)): the hold hash
//! `dlock:{name}` (`owner:<owner id>` → count, `token` → token, with a `PEXPIRE`), the
//! fence counter `dlock:{name}:fence` (kept for the keep time from the name's last use
//! there, [`RedLockConfig::with_keep_idle`]) and the channel `dlock:{name}:released`.
//! A stored result is a copy per master of the single server's `dlock:{name}:result`
//! hash; a store needs a quorum of masters to write their copy, and a load returns only
//! a record a quorum of masters hold the same copy of (see [`results`]).
//!
//! # Fencing tokens
//!
//! A node grants only if the lock is free there *and* the proposed token is above its
//! fence counter, which then rises to the token; the grant needs a quorum of nodes
//! accepting the same token. Any two quorums share a node, so two holders never share a
//! token and tokens strictly increase across successive holders, whatever was proposed
//! (see [`token`] for the argument). By default ([`TokenSource::Clock`])
//! the client proposes the larger of the wall clock in microseconds (plus a lead,
//! [`RedLockConfig::lead`]) and the highest counter it has seen, plus one; a node whose
//! counter is not below the proposal refuses it and answers with its counter, and the
//! client proposes the maximum plus one in a second round (the two-phase scheme's read,
//! learnt from the refusals). So an acquire is one round trip unless clocks disagree or a
//! competitor got in first, and tokens look like timestamps. [`TokenSource::ReadFirst`]
//! (`?tokens=read`) reads every counter first and proposes the maximum plus one: tokens
//! count up by one, for a second round trip on every acquire.
//!
//! Each node keeps a name's counter for the keep time after the name's last grant,
//! renewal or release there ([`RedLockConfig::with_keep_idle`], an hour by default), so
//! that idle names leave nothing behind on any master. A node without a counter grants
//! only proposals above its clock in microseconds, and reports its clock plus the lead as
//! its counter (to a read, or in a refusal), so that a proposal made from that report is
//! still above the clock when it arrives: a look at a name new to the masters takes one
//! round, with either token source. Tokens never go back as long as no master's clock
//! steps back by the keep time, and no client's or master's clock runs ahead of a
//! master's by half of it (see [`token`]).
//!
//! A re-entrant acquire (same owner) increments the count on each node that holds it
//! and returns the holder's token. A re-entry that its round gives back (the round was
//! lost, or won with a new token elsewhere) puts the node's hold back to the expiry it
//! had, so that a hold left on a minority of nodes by a lease its owner lost is not kept
//! alive by that owner's later attempts.
//!
//! # Errors of an acquire
//!
//! - a quorum granted: the lease;
//! - fewer than a quorum of nodes answered at all: `QuorumNotReached { got, needed }`
//!   (`got` = nodes that granted) at once, well under the ttl, or `Unavailable` when no
//!   node answered;
//! - a quorum answered but other holders stand in the way: busy, so `acquire` waits (and
//!   `try_acquire` returns `None`). This includes a mix of busy and unreachable nodes as
//!   long as a quorum answered: the answers show the lock held, and the wait ends with a
//!   release message, the holds' expiry or the caller's wait bound.
//!
//! A client connects when a quorum of nodes answers (the others are connected on first
//! use); fewer is `QuorumNotReached`, none is `Unavailable`.
//!
//! # Single instance or RedLock
//!
//! | | single instance (`redis://`) | RedLock, 5 masters (`redlock://`) |
//! |---|---|---|
//! | round trips, uncontended acquire + release | 2 (one script call each) | 2 fan-outs of 5 calls in parallel, each done at the third answer; 3 with `tokens=read` |
//! | p50 acquire + release (`dlock bench`, servers without persistence) | 153–162 µs | 283–313 µs (1.8–2.0× single) |
//! | the same, every server with AOF `appendfsync always` | 472–496 µs | 881–1037 µs (1.9–2.1× single) |
//! | one server killed | every lock unavailable until it is back | nothing: 4 masters answer |
//! | two servers killed | — | nothing: 3 masters still make a quorum, and no second holder gets in |
//! | three servers killed | — | acquires fail at once (`QuorumNotReached`); holders lose their leases when their validity runs out |
//! | master fails over to a replica that missed a grant | two holders possible, tokens may go back (see the crate docs) | not applicable: the masters do not replicate |
//! | server restarts with AOF `appendfsync always` | holds and tokens kept | holds and tokens kept |
//! | server restarts without its data | holds lost, tokens go back | one such master can let a second holder in and repeat a token: keep it down longer than the longest ttl, and keep the counters with AOF |
//! | holder paused past its ttl | fenced by the token | fenced by the token |
//!
//! The latencies are the p50 of `dlock bench --scenario uncontended --iterations 3000
//! --url redis://… --url redlock://…` (three runs), on a 2-core machine with all servers
//! local. On it, five connections cost more than one because their system calls and
//! wake-ups take turns on two cores: a bare `PING` to five servers at once takes
//! 1.7–3.5× a `PING` to one, about the ratio RedLock shows. The library adds nothing to the
//! commands themselves: its p50 is 0.85–0.93× the raw baseline's (it stops waiting at the
//! quorum; the raw baseline waits for all five). With the masters on hosts of their own,
//! a fan-out costs about the slowest round trip of the quorum.
//!
//! # What breaks it
//!
//! RedLock's safety rests on timing (lease validity measured on the client's monotonic
//! clock, server expiries on each server's clock, within the drift allowance) and on the
//! nodes keeping their data: a node that restarts empty forgets holds and fence counters
//! (see [`token`]). Use `appendonly yes` with `appendfsync always` on every
//! node, and delay a node's restart after a crash by more than the longest ttl in use.
//! A paused holder is fenced only if the resource checks the token.
//!
//! # Capabilities
//!
//! As the single server: re-entrant by owner, fixed and watchdog leases, `extend`,
//! notification on release, stored results; not FIFO, no queue length.

mod backend;
#[cfg(feature = "bench")]
mod baseline;
pub mod config;
mod nodes;
mod quorum;
pub mod results;
pub mod token;

use dlock_core::{Client, ConnectConfig, LockError};

pub use backend::{RedLockBackend, RedLockHold, RedLockTicket, REDLOCK_CAPABILITIES};
#[cfg(feature = "bench")]
pub use baseline::RedLockBaseline;
pub use config::{RedLockConfig, TokenSource, DEFAULT_NODE_TIMEOUT, DEFAULT_RETRY_DELAY, SCHEMES};

use crate::keys::KeyLayout;

/// A lock client over RedLock.
pub type RedLockLocker = Client<RedLockBackend>;

/// Connects to the masters as `config` says (in parallel, within its connect timeout) and
/// returns a lock client whose operations are bounded by its operation timeout.
///
/// Fails with `Unavailable` when no node answers in time, `QuorumNotReached` when fewer
/// than a quorum do, `InvalidInput` for a bad configuration.
pub async fn connect(config: RedLockConfig) -> Result<RedLockLocker, LockError> {
    let layout = KeyLayout::new(config.prefix())?;
    let nodes = nodes::connect(&config).await.map_err(|err| err.at(|| config.target()))?;
    let backend = RedLockBackend::new(nodes, layout, &config);
    Ok(Client::with_config(backend, config.common().client_config()))
}

/// The raw baseline of `dlock bench`: the same script calls an uncontended acquire and
/// release send to every node, without the library around them.
#[cfg(feature = "bench")]
pub async fn raw_baseline(config: RedLockConfig) -> Result<RedLockBaseline, LockError> {
    let layout = KeyLayout::new(config.prefix())?;
    let nodes = nodes::connect(&config).await?;
    let lead = u64::try_from(config.lead().as_micros()).unwrap_or(u64::MAX);
    Ok(RedLockBaseline::new(nodes, layout, config.quorum(), config.token_source(), lead))
}
