//! How etcd's errors become [`LockError`]s.

use dlock_core::LockError;
use etcd_client::Error;
use tonic::Code;

/// Errors of this backend that are not the client library's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// A key under a lock's range does not hold `"<count> <owner>\0<ids>"`: something other than
    /// dlock wrote it.
    #[error("the lock key {key:?} holds a value dlock did not write")]
    MalformedValue {
        /// The key.
        key: String,
    },
    /// A key under a lock's range has a name dlock does not give its keys (a permit
    /// request's key without a valid number of permits): something other than dlock
    /// wrote it.
    #[error("the lock key {key:?} has a name dlock does not give its keys")]
    MalformedKey {
        /// The key.
        key: String,
    },
    /// A lock's result key does not hold `"<token>\n<result>"`: something other than
    /// dlock wrote it.
    #[error("the result key {key:?} holds a value dlock did not write")]
    MalformedResult {
        /// The key.
        key: String,
    },
    /// The server answered with something the protocol rules out.
    #[error("unexpected reply from etcd: {0}")]
    Protocol(&'static str),
    /// The server granted a lease shorter than asked.
    #[error("etcd granted a {granted} s lease where {asked} s were asked")]
    ShortLease {
        /// The ttl asked for, in seconds.
        asked: i64,
        /// The ttl granted, in seconds.
        granted: i64,
    },
    /// The lease named in a request does not exist (any more).
    #[error("the etcd lease is gone")]
    LeaseNotFound,
    /// A batched round failed; each request in it gets this copy of the failure.
    #[error("{0}")]
    Round(String),
}

impl From<EtcdError> for LockError {
    fn from(err: EtcdError) -> Self {
        LockError::backend(err)
    }
}

/// Maps a client library error: what says the server could not be reached (or had no
/// leader, or timed out) is `Unavailable`, anything else `Backend`.
pub(crate) fn map_err(err: Error) -> LockError {
    if is_lease_not_found(&err) {
        EtcdError::LeaseNotFound.into()
    } else if let Some(why) = refusal(&err) {
        LockError::refused(why, Some(err.into()))
    } else if is_transient(&err) {
        LockError::unavailable_because("etcd", err)
    } else {
        LockError::backend(err)
    }
}

/// Why the server refused this client for its credentials or its certificate
/// ([`LockError::Refused`]).
fn refusal(err: &Error) -> Option<&'static str> {
    let Error::GRpcStatus(status) = err else { return None };
    let message = status.message();
    match status.code() {
        Code::Unavailable if message.contains("certificate") => {
            Some("the server's certificate was refused: name its CA with ca= (and its name with domain=)")
        }
        Code::InvalidArgument | Code::Unauthenticated if message.contains("authentication failed") => {
            Some("the server did not accept the user name and password")
        }
        Code::InvalidArgument | Code::Unauthenticated if message.contains("user name is empty") => {
            Some("the server has authentication on: give a user and password in the URL (etcd://user:password@host)")
        }
        Code::PermissionDenied => Some("the server's roles do not let this user read and write the lock's keys"),
        _ => None,
    }
}

/// Whether the error says etcd could not be reached, had no leader, or ran out of time:
/// the same request may succeed later.
pub(crate) fn is_transient(err: &Error) -> bool {
    match err {
        Error::GRpcStatus(status) => match status.code() {
            // A certificate the client refuses is a configuration problem, not an outage.
            Code::Unavailable if status.message().contains("certificate") => false,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted => true,
            // Broken connections surface as Unknown with a transport message.
            Code::Unknown => {
                let message = status.message().to_ascii_lowercase();
                ["transport", "connection", "broken pipe", "reset", "closed", "h2 protocol"]
                    .iter()
                    .any(|m| message.contains(m))
            }
            _ => false,
        },
        Error::TransportError(_) | Error::IoError(_) => true,
        _ => false,
    }
}

/// Whether the error says the lease named in a request does not exist (any more).
pub(crate) fn is_lease_not_found(err: &Error) -> bool {
    match err {
        Error::GRpcStatus(status) => status.code() == Code::NotFound && status.message().contains("lease not found"),
        Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// Whether a mapped error says the lease named in the request does not exist.
pub(crate) fn is_lease_gone(err: &LockError) -> bool {
    match err {
        LockError::Backend(source) => matches!(source.downcast_ref::<EtcdError>(), Some(EtcdError::LeaseNotFound)),
        _ => false,
    }
}
