//! Exit codes, as in sysexits.h and flock(1).

use std::process::ExitCode;

use dlock::LockError;

/// Bad arguments or URL, or a backend not compiled in.
pub(crate) const USAGE: u8 = 64;
/// The backend could not be reached or failed.
pub(crate) const UNAVAILABLE: u8 = 69;
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
            LockError::Timeout => TEMPFAIL,
            LockError::Lost(_) => LOST,
            _ => UNAVAILABLE,
        };
        Failure::new(code, err.to_string())
    }
}
