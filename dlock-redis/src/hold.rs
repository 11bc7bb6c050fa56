//! What a grant leaves with the client, on one server or on every RedLock master alike,
//! and how an inspected hold is reported.

use dlock_core::{FencingToken, Holder, LockError, OwnerId};

use crate::keys::LockKeys;
use crate::scripts::HoldView;

/// A granted hold: the lock's keys, the owner, the grant (named after the request that
/// made it) and the token, which renewals and the release check on the server (on
/// RedLock, on every master: the keys and fields are the same on each).
#[derive(Debug, Clone)]
pub struct RedisHold {
    pub(crate) keys: LockKeys,
    pub(crate) owner_field: String,
    pub(crate) grant_field: String,
    pub(crate) token: u64,
}

impl RedisHold {
    /// The lock's keys.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.token)
    }
}

/// The holder an inspect script's reply names, if any; `hold_key` names the key in the
/// error when the stored owner is not a valid owner id.
pub(crate) fn holder(view: Option<HoldView>, hold_key: &str) -> Result<Option<Holder>, LockError> {
    let Some(view) = view else { return Ok(None) };
    Ok(Some(Holder {
        owner: OwnerId::new(&view.owner).map_err(|e| LockError::backend(format!("owner field of {hold_key}: {e}")))?,
        token: FencingToken::new(view.token),
        count: view.count,
        remaining: view.remaining,
    }))
}
