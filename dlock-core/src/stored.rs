//! Results kept under a lock's name by the run that held it, for
//! [`idempotent`](crate::idempotent()) execution.

use std::fmt;
use std::time::Duration;

use crate::error::LockError;
use crate::options::MAX_DURATION;
use crate::token::FencingToken;

/// The largest result any backend stores: below ZooKeeper's 1 MiB node limit and etcd's
/// 1.5 MiB request limit with room for the record's own fields.
pub const MAX_RESULT_BYTES: usize = 512 * 1024;

/// A result stored under a lock's name: the bytes the run produced and the fencing token
/// of the lease it ran under.
///
/// ```
/// use dlock_core::{FencingToken, StoredResult};
///
/// let record = StoredResult { token: FencingToken::new(7), value: b"shipped".to_vec() };
/// assert_eq!(record.token.get(), 7);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// The token of the run that stored it; a run with a lower token can no longer
    /// replace it.
    pub token: FencingToken,
    /// The result, as the run encoded it.
    pub value: Vec<u8>,
}

impl fmt::Debug for StoredResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Results may be large and may hold user data: show their size, not their bytes.
        f.debug_struct("StoredResult").field("token", &self.token).field("bytes", &self.value.len()).finish()
    }
}

/// Checks a result and its retention before anything is sent to a backend.
pub(crate) fn check_result(value: &[u8], retention: Duration) -> Result<(), LockError> {
    if value.len() > MAX_RESULT_BYTES {
        return Err(LockError::InvalidInput(format!(
            "a result of {} bytes is over the {MAX_RESULT_BYTES}-byte limit",
            value.len()
        )));
    }
    if retention < Duration::from_millis(1) || retention > MAX_DURATION {
        return Err(LockError::InvalidInput(format!("retention {retention:?} is outside 1ms..=365 days")));
    }
    Ok(())
}
