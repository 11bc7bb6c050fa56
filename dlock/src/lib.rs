#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
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
pub use drivers::{connect, driver, drivers, register_driver, Connecting, Driver, DRIVERS};
/// The raw baselines `dlock bench` measures the library against (the `bench` feature).
#[cfg(feature = "bench")]
pub use {dlock_core::RawBaseline, drivers::raw_baseline};

/// Redis: one server, Sentinel or Cluster ([`dlock_redis`]); RedLock over several masters
/// in [`redis::redlock`] with the `redlock` feature.
#[cfg(any(feature = "redis", feature = "redlock"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "redis", feature = "redlock"))))]
pub use dlock_redis as redis;

/// SQL databases: lease tables, advisory locks and fenced writes ([`dlock_sql`]).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
pub use dlock_sql as sql;

/// ZooKeeper ([`dlock_zk`]).
#[cfg(feature = "zk")]
#[cfg_attr(docsrs, doc(cfg(feature = "zk")))]
pub use dlock_zk as zk;

/// etcd ([`dlock_etcd`]).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use dlock_etcd as etcd;
