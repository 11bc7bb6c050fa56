//! How Redis errors become [`LockError`]s.

use dlock_core::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// `Unavailable` for everything that says "the server cannot be reached or cannot serve
/// writes right now" (so that callers and the renewal scheduler retry), `Backend` for
/// the rest.
pub(crate) fn to_lock_error(err: RedisError) -> LockError {
    if let Some(why) = refusal(&err) {
        LockError::refused(why, Some(err.into()))
    } else if is_transient(&err) {
        LockError::unavailable_because("redis", err)
    } else {
        LockError::backend(err)
    }
}

/// Whether the server refused this client for its credentials or its ACL.
pub(crate) fn is_refused(err: &RedisError) -> bool {
    refusal(err).is_some()
}

/// Why the server refused this client for its credentials ([`LockError::Refused`]).
fn refusal(err: &RedisError) -> Option<&'static str> {
    if err.kind() == ErrorKind::AuthenticationFailed || has_code(err, &["WRONGPASS"]) {
        Some("the server did not accept the user name and password")
    } else if has_code(err, &["NOAUTH"]) {
        Some("the server requires a password: give one in the URL (redis://:password@host) or with_password")
    } else if has_code(err, &["NOPERM"]) {
        Some("the server's ACL does not let this user run the lock's commands or keys")
    } else {
        None
    }
}

/// Error codes (the first word of a server error) that say the server cannot take
/// writes now (out of memory, busy with a script, loading, too few replicas, no longer
/// the master), so that the call may succeed later or on another server.
const UNAVAILABLE_CODES: &[&str] =
    &["OOM", "BUSY", "LOADING", "NOREPLICAS", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN"];

/// Codes that say the server we talk to may no longer be the master.
const FAILOVER_CODES: &[&str] = &["READONLY", "MASTERDOWN", "NOREPLICAS", "LOADING"];

/// The server error code of `err`, also when Redis 6 wrapped it in the error of the script
/// that raised it (`ERR Error running script ... : -READONLY You can't write ...`).
fn server_codes(err: &RedisError) -> Vec<&str> {
    let mut codes = Vec::new();
    if let Some(code) = err.code() {
        codes.push(code);
    }
    if let Some(detail) = err.detail() {
        codes.extend(detail.split_whitespace().filter_map(|word| word.strip_prefix('-')));
    }
    codes
}

fn has_code(err: &RedisError, wanted: &[&str]) -> bool {
    server_codes(err).iter().any(|code| wanted.contains(code))
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
        || has_code(err, UNAVAILABLE_CODES)
}

/// Whether the error suggests that the server we talk to is no longer the master (or is
/// gone), so that a Sentinel client should look the master up again.
pub(crate) fn suggests_failover(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown))
        || has_code(err, FAILOVER_CODES)
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

    fn server_error(text: &str) -> RedisError {
        let reply = format!("-{text}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(value) => value.extract_error().expect_err("an error reply"),
            Err(err) => panic!("{text}: {err}"),
        }
    }

    #[test]
    fn servers_that_cannot_write_now_are_unavailable_and_suggest_a_failover() {
        for text in [
            "NOREPLICAS Not enough good replicas to write.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "BUSY Redis is busy running a script.",
            "ERR Error running script (call to f_0123): @user_script:1: @user_script: 1: -READONLY You can't write against a read only replica.",
        ] {
            let err = server_error(text);
            assert!(is_transient(&err), "{text}: {:?}", err.kind());
            assert!(matches!(to_lock_error(server_error(text)), LockError::Unavailable { source: Some(_), .. }), "{text}");
        }
        assert!(suggests_failover(&server_error("NOREPLICAS Not enough good replicas to write.")));
        assert!(suggests_failover(&server_error(
            "ERR Error running script (call to f_0123): @user_script:1: @user_script: 1: -READONLY You can't write"
        )));
        assert!(!suggests_failover(&server_error("OOM command not allowed")));
        assert!(!is_transient(&server_error("ERR wrong number of arguments")));
        assert!(!is_transient(&server_error("WRONGPASS invalid username-password pair")));
        for text in ["WRONGPASS invalid username-password pair", "NOAUTH Authentication required."] {
            assert!(matches!(to_lock_error(server_error(text)), LockError::Refused { .. }), "{text}");
        }
    }

    #[test]
    fn servers_that_may_no_longer_be_the_master_suggest_a_failover_also_from_inside_a_script() {
        for (code, message) in [
            ("READONLY", "You can't write against a read only replica."),
            ("MASTERDOWN", "Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("LOADING", "Redis is loading the dataset in memory"),
        ] {
            // As Redis 7 returns it, also from a script (with the script named after it).
            let plain = format!("{code} {message} script: f_0123, on @user_script:1.");
            // As Redis 6 wraps the error a script's call raised.
            let wrapped = format!("ERR Error running script (call to f_0123): @user_script:1: -{code} {message}");
            for text in [plain, wrapped] {
                let err = server_error(&text);
                assert!(suggests_failover(&err), "{text}: {:?}", err.kind());
                assert!(is_transient(&err), "{text}");
            }
        }
        for text in ["ERR wrong number of arguments", "BUSY Redis is busy running a script.", "NOPERM no permissions"] {
            assert!(!suggests_failover(&server_error(text)), "{text}");
        }
    }
}
