//! Exit codes, as in sysexits.h and flock(1).

use std::process::ExitCode;

use dlock::LockError;

/// Bad arguments or URL, or a backend not compiled in.
pub(crate) const USAGE: u8 = 64;
/// The backend could not be reached or failed.
pub(crate) const UNAVAILABLE: u8 = 69;
/// The connection was refused for its credentials or TLS (`LockError::Refused`).
pub(crate) const NOPERM: u8 = 77;
/// The lock was not acquired within `--wait`.
pub(crate) const TEMPFAIL: u8 = 75;
/// The lease was lost while the command ran.
pub(crate) const LOST: u8 = 76;
/// `--once`: the key already ran successfully; the command was not run again.
pub(crate) const ALREADY_RAN: u8 = 79;

/// A failure of the command itself: its message and exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }

    pub(crate) fn report(self) -> ExitCode {
        eprintln!("dlock: {}", self.message);
        ExitCode::from(self.code)
    }
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        let code = match &err {
            LockError::InvalidInput(_) | LockError::Unsupported(_) => USAGE,
            LockError::Timeout { .. } => TEMPFAIL,
            LockError::Lost { .. } => LOST,
            LockError::Refused { .. } => NOPERM,
            _ => UNAVAILABLE,
        };
        Failure::new(code, with_causes(&err))
    }
}

/// The error's message and, a line each below it, the causes in its source chain that
/// the message does not say already (a backend often quotes its client library's error).
fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str("\n  caused by: ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::io;

    use dlock::LockError;

    use super::{Failure, NOPERM, UNAVAILABLE};

    /// A client library's error with a cause of its own.
    #[derive(Debug)]
    struct PoolTimedOut(io::Error);

    impl std::fmt::Display for PoolTimedOut {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("pool timed out")
        }
    }

    impl std::error::Error for PoolTimedOut {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn every_cause_the_message_does_not_say_gets_a_line() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused (os error 111)");
        let err = LockError::unavailable_because("the database could not be reached", PoolTimedOut(refused))
            .at(|| "postgres://db:5432/shop".into());
        let failure = Failure::from(err);
        assert_eq!(failure.code, UNAVAILABLE);
        assert_eq!(
            failure.message,
            "backend unavailable: postgres://db:5432/shop: the database could not be reached: pool timed out\n  \
             caused by: connection refused (os error 111)"
        );
    }

    #[test]
    fn a_refusal_has_its_own_exit_code() {
        let err = LockError::refused("the server did not accept the user name and password", None);
        assert_eq!(Failure::from(err).code, NOPERM);
    }

    #[test]
    fn a_cause_the_message_quotes_already_is_not_repeated() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        let err = LockError::unavailable_because("redis: Connection refused", refused);
        assert_eq!(Failure::from(err).message, "backend unavailable: redis: Connection refused");
    }
}
