//! The errors of every lock operation, and the reasons a lease can be lost.

use std::fmt;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lease stopped being valid. The same reason means the same thing on every backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out of time: a `Fixed` lease reached its ttl, the watchdog stopped
    /// at `max_hold`, or the backend reports that the hold no longer exists.
    Expired,
    /// Renewals failed with backend errors until the lease's validity ran out.
    RenewalFailed,
    /// The backend session the hold was tied to (a ZooKeeper session, an etcd lease,
    /// a database connection) expired or was closed.
    SessionExpired,
    /// The backend shows another holder (another owner or token) where ours was.
    Stolen,
    /// The backend could not be reached before the lease's validity ran out.
    BackendUnavailable,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::RenewalFailed => "renewing the lease failed",
            LostReason::SessionExpired => "the backend session expired",
            LostReason::Stolen => "another holder took the lock",
            LostReason::BackendUnavailable => "the backend was unreachable until the lease ran out",
        })
    }
}

/// The error of every lock operation.
///
/// ```
/// use dlock_core::{LockError, LockName};
///
/// match LockName::new("") {
///     Err(LockError::InvalidInput(why)) => assert!(why.contains("empty")),
///     other => panic!("unexpected: {other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was not acquired within the wait bound.
    #[error("the lock was not acquired within the wait bound")]
    Timeout,
    /// A name, owner, duration or URL was not acceptable.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The lease was no longer ours when we tried to release or extend it.
    #[error("the lock is no longer held by this lease")]
    NotHeld,
    /// The lease was lost while work was running under it.
    #[error("the lease was lost: {0}")]
    Lost(LostReason),
    /// The backend could not be reached within its connect or operation timeout, or the
    /// connection failed. Retrying later may succeed.
    #[error("backend unavailable: {what}")]
    Unavailable {
        /// What could not be done.
        what: String,
        /// The client library's error, when there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// Too few nodes confirmed an operation: RedLock masters granting, or replicas
    /// acknowledging a write the caller asked to have replicated.
    #[error("quorum not reached: {got} of {needed} nodes confirmed")]
    QuorumNotReached {
        /// Nodes that confirmed.
        got: usize,
        /// Nodes needed.
        needed: usize,
    },
    /// The backend cannot do what was asked (see [`Capabilities`](crate::Capabilities)).
    #[error("unsupported by this backend: {0}")]
    Unsupported(String),
    /// Any other error the backend reported.
    #[error("backend error: {0}")]
    Backend(#[source] BoxError),
}

impl LockError {
    /// Wraps a backend library's error.
    pub fn backend(err: impl Into<BoxError>) -> Self {
        LockError::Backend(err.into())
    }

    /// The backend could not be reached: `what` says what could not be done.
    pub fn unavailable(what: impl Into<String>) -> Self {
        LockError::Unavailable { what: what.into(), source: None }
    }

    /// The backend could not be reached because of `source`, a client library's error
    /// (kept as the error's source, so its chain is not lost).
    pub fn unavailable_because(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable { what: what.into(), source: Some(source.into()) }
    }

    /// Whether retrying the same call later could succeed (the backend was unreachable).
    pub fn is_transient(&self) -> bool {
        matches!(self, LockError::Unavailable { .. } | LockError::QuorumNotReached { .. })
    }
}
