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
    ///
    /// The client fills in the lock's name and the bound it waited (a backend that
    /// reports a timeout of its own may leave them out).
    #[error("{}", timed_out(name.as_deref(), *waited))]
    #[non_exhaustive]
    Timeout {
        /// The lock's name.
        name: Option<String>,
        /// How long it waited: the wait bound of the acquire.
        waited: Option<std::time::Duration>,
    },
    /// A name, owner, duration or URL was not acceptable.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The lease was no longer ours when we tried to release or extend it.
    #[error("{} is no longer held by this lease", the_lock(name.as_deref()))]
    #[non_exhaustive]
    NotHeld {
        /// The lock's name.
        name: Option<String>,
    },
    /// The lease was lost while work was running under it.
    #[error("the lease of {} was lost: {reason}", the_lock(name.as_deref()))]
    #[non_exhaustive]
    Lost {
        /// Why.
        reason: LostReason,
        /// The lock's name.
        name: Option<String>,
    },
    /// The backend could not be reached within its connect or operation timeout, or the
    /// connection failed. Retrying later may succeed.
    ///
    /// The message names the server (`target`, without credentials) and quotes the
    /// client library's error (`source`), on every backend.
    #[error("backend unavailable: {}", explain(target.as_deref(), what, source.as_deref()))]
    #[non_exhaustive]
    Unavailable {
        /// What could not be done.
        what: String,
        /// The server or servers it could not be done on, as [`Locker::target`](crate::Locker::target)
        /// names them (never with a password), once known.
        target: Option<String>,
        /// The client library's error, when there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The connection was refused for who or how it connects: a wrong user or password,
    /// TLS the server requires and the client does not use, a server certificate that does
    /// not verify (an unknown CA, another host name). Not transient: retrying cannot help
    /// until the URL, the credentials or the server's configuration change.
    #[error("connection refused: {}", explain(target.as_deref(), why, source.as_deref()))]
    #[non_exhaustive]
    Refused {
        /// Why, in words that say what to change.
        why: String,
        /// The server that refused, or that the client refused (never with a password).
        target: Option<String>,
        /// The client library's error.
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

    /// The lock was not acquired within the wait bound (the client names the lock and
    /// the bound: see [`LockError::named`]).
    pub fn timeout() -> Self {
        LockError::Timeout { name: None, waited: None }
    }

    /// The lease was no longer ours (the client names the lock).
    pub fn not_held() -> Self {
        LockError::NotHeld { name: None }
    }

    /// The lease was lost for `reason` (the client names the lock).
    pub fn lost(reason: LostReason) -> Self {
        LockError::Lost { reason, name: None }
    }

    /// Names the lock a `Timeout`, `NotHeld` or `Lost` error was about, if it does not
    /// name one yet; other errors are returned as they are.
    ///
    /// ```
    /// use dlock_core::{LockError, LockName};
    ///
    /// let name = LockName::new("orders/42")?;
    /// let err = LockError::not_held().named(&name);
    /// assert_eq!(err.to_string(), "the lock \"orders/42\" is no longer held by this lease");
    /// assert_eq!(err.lock_name(), Some("orders/42"));
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn named(mut self, lock: &crate::LockName) -> Self {
        if let LockError::Timeout { name: at @ None, .. }
        | LockError::NotHeld { name: at @ None }
        | LockError::Lost { name: at @ None, .. } = &mut self
        {
            *at = Some(lock.as_str().to_string());
        }
        self
    }

    /// The lock a `Timeout`, `NotHeld` or `Lost` error names, if any.
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            LockError::Timeout { name, .. } | LockError::NotHeld { name } | LockError::Lost { name, .. } => {
                name.as_deref()
            }
            _ => None,
        }
    }

    /// The backend could not be reached: `what` says what could not be done.
    pub fn unavailable(what: impl Into<String>) -> Self {
        LockError::Unavailable { what: what.into(), target: None, source: None }
    }

    /// The backend could not be reached because of `source`, a client library's error
    /// (kept as the error's source, so its chain is not lost, and quoted in the message).
    pub fn unavailable_because(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable { what: what.into(), target: None, source: Some(source.into()) }
    }

    /// The connection was refused (see [`LockError::Refused`]): `why` says what to change.
    pub fn refused(why: impl Into<String>, source: Option<BoxError>) -> Self {
        LockError::Refused { why: why.into(), target: None, source }
    }

    /// Names the server an `Unavailable` or `Refused` error was about, if it does not name
    /// one yet; other errors are returned as they are. Clients call it with their
    /// [`Locker::target`](crate::Locker::target), so that every backend's errors name
    /// their server the same way.
    ///
    /// ```
    /// use dlock_core::LockError;
    ///
    /// let err = LockError::unavailable_because("connecting failed", std::io::Error::other("connection refused"));
    /// let err = err.at(|| "postgres://10.0.0.5:5432/shop".to_string());
    /// assert_eq!(
    ///     err.to_string(),
    ///     "backend unavailable: postgres://10.0.0.5:5432/shop: connecting failed: connection refused"
    /// );
    /// assert_eq!(err.target(), Some("postgres://10.0.0.5:5432/shop"));
    /// ```
    pub fn at(mut self, target: impl FnOnce() -> String) -> Self {
        if let LockError::Unavailable { target: at @ None, .. } | LockError::Refused { target: at @ None, .. } =
            &mut self
        {
            *at = Some(target());
        }
        self
    }

    /// The server an `Unavailable` or `Refused` error names, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            LockError::Unavailable { target, .. } | LockError::Refused { target, .. } => target.as_deref(),
            _ => None,
        }
    }

    /// Whether retrying the same call later could succeed (the backend was unreachable).
    pub fn is_transient(&self) -> bool {
        matches!(self, LockError::Unavailable { .. } | LockError::QuorumNotReached { .. })
    }
}

/// The message of an error about a server: the server, what happened, and the client
/// library's error unless `what` quotes it already.
fn explain(
    target: Option<&str>,
    what: &str,
    source: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
) -> String {
    let mut text = String::new();
    if let Some(target) = target {
        text.push_str(target);
        text.push_str(": ");
    }
    text.push_str(what);
    if let Some(cause) = source.map(ToString::to_string) {
        if !cause.is_empty() && !what.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// `the lock "orders/42"`, or `the lock` when the name is not known.
fn the_lock(name: Option<&str>) -> String {
    match name {
        Some(name) => format!("the lock {name:?}"),
        None => "the lock".to_string(),
    }
}

fn timed_out(name: Option<&str>, waited: Option<std::time::Duration>) -> String {
    match waited {
        Some(waited) => format!("{} was not acquired within the wait bound of {waited:?}", the_lock(name)),
        None => format!("{} was not acquired within the wait bound", the_lock(name)),
    }
}
