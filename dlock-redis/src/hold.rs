//! What a grant leaves with the client, on one server or on every RedLock master alike,
//! and how an inspected hold is reported.

use dlock_core::{FencingToken, HoldKind, Holder, LockError, OwnerId};

use crate::keys::{hold_id_of, LockKeys, GRANT_FIELD_PREFIX, OWNER_FIELD_PREFIX};
use crate::replies::HoldView;

/// A granted hold: the lock's keys, the owner, the grant (named after the request that
/// made it), the token, which renewals and the release check on the server (on
/// RedLock, on every master: the keys and fields are the same on each), and the kind of
/// hold, which picks the scripts that renew, release and store under it.
#[derive(Debug, Clone)]
pub struct RedisHold {
    pub(crate) keys: LockKeys,
    pub(crate) owner_field: String,
    pub(crate) grant_field: String,
    pub(crate) token: u64,
    pub(crate) kind: HoldKind,
    /// When the release that handed this hold to its waiter was sent (see the
    /// `handoff` module); `None` for a hold its own acquire was granted.
    pub(crate) handed_at: Option<tokio::time::Instant>,
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

    /// The kind of hold granted.
    pub fn kind(&self) -> HoldKind {
        self.kind
    }

    /// The hold id, as the scripts of shared holds and permits name the hold: built from
    /// the owner field without its prefix (every owner field is built with it) and the
    /// kind (see [`hold_id`](crate::keys::hold_id)).
    pub(crate) fn hold_id(&self) -> String {
        let owner = self.owner_field.strip_prefix(OWNER_FIELD_PREFIX).unwrap_or(&self.owner_field);
        hold_id_of(owner, self.kind)
    }

    /// The id of the request that made the grant, likewise.
    pub(crate) fn request_id(&self) -> &str {
        self.grant_field.strip_prefix(GRANT_FIELD_PREFIX).unwrap_or(&self.grant_field)
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
