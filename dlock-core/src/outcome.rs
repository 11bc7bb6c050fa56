//! What a backend's operations answer.

use std::time::Duration;

use crate::error::LostReason;
use crate::token::FencingToken;

/// The outcome of one acquisition attempt.
#[derive(Debug)]
pub enum Attempt<H> {
    /// The lock is ours.
    Granted {
        /// Whatever the backend needs to renew and release this hold.
        hold: H,
        /// The fencing token of the hold.
        token: FencingToken,
    },
    /// Someone else holds it (or is ahead in the queue).
    Busy {
        /// When to look again if no notification comes: the current hold's remaining
        /// ttl where the backend knows it. `None` means "only when notified" on
        /// notifying backends, and "after the backoff delay" on polling ones.
        retry_after: Option<Duration>,
    },
}

/// The outcome of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The hold now lasts at least the requested ttl from when the renewal was sent.
    Renewed,
    /// The hold is gone; the reason says how (`Expired` when nobody holds it,
    /// `Stolen` when someone else does).
    Lost(LostReason),
}

/// The outcome of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// One hold was released (the lock is free when the owner held it once).
    Released,
    /// The hold was not ours any more; nothing was changed.
    NotHeld,
}
