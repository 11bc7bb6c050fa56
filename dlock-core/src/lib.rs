//! The dlock API, and the machinery every backend shares.
//!
//! A [`Locker`] hands out [`Lease`]s on named locks. Every lease carries a
//! [`FencingToken`] that strictly increases over the successive holders of a name, knows
//! how long it is certainly valid, and fires a lost signal when it stops being valid.
//! Backends (Redis, ZooKeeper, etcd, SQL; [`memory`] in this crate) implement the small
//! [`Backend`](backend::Backend) trait; [`Client`] turns one into a `Locker` and supplies the wait loop,
//! cancellation safety, operation timeouts, the renewal scheduler (one task per client,
//! not per lease), the lost signal, tracing spans and statistics.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock_core::LockError> {
//! let locker = MemoryStore::new().client();
//! let name = LockName::new("orders/42")?;
//! let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_secs(3));
//!
//! let lease = locker.acquire(&name, &opts).await?;
//! // Give the token to the resource, which refuses writes with an older one.
//! let token = lease.token();
//! # let _ = token;
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Tracing
//!
//! Every backend operation runs in a [`tracing`] span with the fields `backend`, `lock`
//! and, once granted, `token`:
//!
//! | span | level | extra fields |
//! |---|---|---|
//! | `dlock.acquire` | info | `owner`, `blocking`, `kind` |
//! | `dlock.extend` | info | `ttl` |
//! | `dlock.renew` | debug | `leases` (how many renewals went in one backend call), `ttl`; no `lock` |
//! | `dlock.release` | info | |
//! | `dlock.store_result` | info | `bytes` |
//! | `dlock.sweep` | info | no `lock` |
//!
//! A lost lease logs a `warn` event with its reason.
//!
//! # Metrics
//!
//! Clients record through the [`metrics`](https://docs.rs/metrics) facade, so they cost
//! next to nothing until the application installs a recorder (such as
//! `metrics-exporter-prometheus`; see `dlock/examples/prometheus.rs`). Every metric has a
//! `backend` label (`redis`, `postgres`, ...). Lock names are never labels: they are
//! unbounded.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `dlock_acquires_total` | counter | `outcome`: `granted`, `busy`, `timeout`, `cancelled`, `error` | acquire and try_acquire calls, by how they ended |
//! | `dlock_acquire_wait_seconds` | histogram | | from the call to the grant |
//! | `dlock_handoffs_total` | counter | | grants to a caller that found the lock held and waited |
//! | `dlock_hold_seconds` | histogram | | from the grant to the release or drop of the lease |
//! | `dlock_renewals_total` | counter | `outcome`: `renewed`, `error` | watchdog renewals, one per lease |
//! | `dlock_renewal_seconds` | histogram | | latency of one backend renewal call (renewals due together share one) |
//! | `dlock_leases_lost_total` | counter | `reason`: `expired`, `renewal_failed`, `session_expired`, `stolen`, `backend_unavailable` | lost signals fired |
//! | `dlock_active_leases` | gauge | | leases alive now |
//! | `dlock_waiting` | gauge | | acquires waiting for a holder to let go |
//! | `dlock_in_flight` | gauge | | acquires and background releases under way |
//!
//! [`ClientStats`] gives the same counts for one client, without a recorder. The
//! project's `docs/metrics.md` adds the units and the alerts worth having.

pub mod backend;
#[cfg(feature = "bench")]
mod baseline;
mod client;
mod connect;
mod election;
mod error;
mod given;
mod idempotent;
mod info;
mod lease;
mod local_queue;
mod locker;
pub mod memory;
mod multi;
mod name;
mod options;
mod outcome;
mod renewal;
mod state;
mod stats;
mod stored;
mod sweep;
#[cfg(test)]
mod testing;
#[cfg(feature = "tls")]
pub mod tls;
mod token;
mod url;
pub mod wire;

#[cfg(feature = "bench")]
pub use baseline::RawBaseline;
pub use client::{Client, ClientConfig, DEFAULT_SWEEP_EVERY};
pub use connect::{parse_duration, percent_decode, ConnectConfig, ConnectOptions};
pub use election::{campaign, observe, Leader, Leadership, Observer, DEFAULT_OBSERVE_EVERY};
pub use error::{BoxError, LockError, LostReason};
pub use given::Given;
pub use idempotent::{idempotent, IdempotentError, IdempotentOptions, RunOutcome};
pub use info::{Capabilities, Holder, LockInfo};
pub use lease::{Lease, LeaseHandle};
pub use locker::{with_lock, Locker, LockerExt};
pub use multi::{MultiLease, MultiLock};
pub use name::{LockName, OwnerId, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use options::{
    drift, place_lapse, Backoff, HoldKind, LeaseMode, LockOptions, DEFAULT_KEEP_IDLE, DEFAULT_TTL, MAX_DURATION,
    MAX_PERMITS, MAX_PLACE_LAPSE, MIN_TTL,
};
pub use stats::ClientStats;
pub use stored::{StoredResult, MAX_RESULT_BYTES};
pub use sweep::Swept;
pub use token::FencingToken;
pub use url::{redact, BackendUrl, HostPort};
