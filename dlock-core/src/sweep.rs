//! Removing what a backend keeps for names nobody uses any more: results past their
//! retention, the token counters of names idle past the backend's keep time, holds and
//! waiters' places that lapsed. Backends whose server expires such records itself (Redis
//! keys with a ttl, etcd keys on a lease) have nothing to sweep.
//!
//! A client sweeps in the background, every [`ClientConfig::sweep_every`] (jittered, so
//! that the replicas of a service do not sweep together), and on demand with
//! [`Locker::sweep`]. A sweep never lets a token go back: a name's counter is removed
//! only when the backend can start it again above every token it gave (see
//! [`Backend::sweep`]).

use std::time::Duration;

use crate::backend::Backend;
use crate::error::LockError;
#[cfg(doc)]
use crate::{backend::Backend as _, ClientConfig, Locker};

/// What a sweep removed.
///
/// ```
/// use dlock_core::Swept;
///
/// let total = Swept { removed: 3, more: false } + Swept { removed: 4, more: false };
/// assert_eq!(total.removed, 7);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// How many records went: results, counters, lapsed holds and places.
    pub removed: u64,
    /// Whether the backend stopped at its batch bound with more left to remove.
    pub more: bool,
}

impl std::ops::Add for Swept {
    type Output = Swept;

    fn add(self, other: Swept) -> Swept {
        Swept { removed: self.removed.saturating_add(other.removed), more: other.more }
    }
}

/// How many batches one sweep takes at most, so that a sweep always ends even when
/// another client keeps adding what it removes.
const MAX_BATCHES: u32 = 1_000;

/// Sweeps in batches, each bounded by `op_timeout`, until the backend has nothing more.
pub(crate) async fn sweep_all<B: Backend>(backend: &B, op_timeout: Duration) -> Result<Swept, LockError> {
    let mut total = Swept::default();
    for _ in 0..MAX_BATCHES {
        let batch = match tokio::time::timeout(op_timeout, backend.sweep()).await {
            Ok(batch) => batch?,
            Err(_) => {
                return Err(LockError::unavailable(format!(
                    "{} sweep did not complete within {op_timeout:?}",
                    backend.name()
                )))
            }
        };
        total = total + batch;
        if !batch.more {
            break;
        }
    }
    Ok(total)
}

/// The pause before the next background sweep: `every`, give or take a quarter.
pub(crate) fn next_pause(every: Duration) -> Duration {
    let quarter = every / 4;
    let spread = u64::try_from(quarter.as_nanos().saturating_mul(2)).unwrap_or(u64::MAX);
    every - quarter + Duration::from_nanos(fastrand::u64(0..=spread))
}
