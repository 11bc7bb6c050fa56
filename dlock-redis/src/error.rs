//! How Redis errors become [`LockError`]s.

use dlock_core::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// `Unavailable` for everything that says "the server cannot be reached or cannot serve
/// writes right now" (so that callers and the renewal scheduler retry), `Backend` for
/// the rest.
pub(crate) fn to_lock_error(err: RedisError) -> LockError {
    if is_transient(&err) {
        LockError::unavailable(format!("redis: {err}"))
    } else {
        LockError::backend(err)
    }
}

/// Whether the error is about reaching a server that can take writes, rather than
/// about the request.
pub(crate) fn is_transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            ) | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::EmptySentinelList
        )
}

/// Whether the error suggests that the server we talk to is no longer the master (or is
/// gone), so that a Sentinel client should look the master up again.
pub(crate) fn suggests_failover(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_unavailable() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(to_lock_error(refused), LockError::Unavailable { .. }));
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "bad"));
        assert!(matches!(to_lock_error(parse), LockError::Backend(_)));
    }
}
