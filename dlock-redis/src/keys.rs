//! Where a lock lives in Redis: its keys and its release channel.
//!
//! For the lock `orders/42` under the default prefix `dlock`:
//!
//! | what | name | type |
//! |---|---|---|
//! | the hold | `dlock:{orders%2F42}` | hash: `owner:<owner id>` → hold count, `token` → fencing token, `grant:<request id>` → 1 per grant; with a ttl (PEXPIRE) |
//! | the fence counter | `dlock:{orders%2F42}:fence` | string counter (INCR), no ttl |
//! | a given-back request | `dlock:{orders%2F42}:void:<request id>` | string, with the request's ttl: refuses a late delivery of an acquire whose grant was given back |
//! | the release channel | `dlock:{orders%2F42}:released` | pub/sub channel; the message is the released token |
//! | the stored result | `dlock:{orders%2F42}:result` | hash: `token` → the storing hold's token, `value` → the result, `call` → the id of the store call; with the retention as ttl (PEXPIRE). Apart from the hold, so that a release or an eviction leaves it (see [`results`](crate::results)) |
//!
//! The part in braces is the Cluster hash tag, so the hold, the counter and the result
//! share one slot (a script may touch several). It is the name's [`LockName::encoded`]
//! form, which is injective and never contains a brace: two names never share a key, and
//! a name with `{` or `}` in it cannot move the tag.

use dlock_core::backend::RequestId;
use dlock_core::{LockError, LockName, OwnerId};

/// The field of the hold hash that holds the fencing token.
pub const TOKEN_FIELD: &str = "token";

/// The prefix of the hold hash's owner field (`owner:<owner id>` → count). The prefix
/// keeps any owner id apart from [`TOKEN_FIELD`].
pub const OWNER_FIELD_PREFIX: &str = "owner:";

/// The prefix of the hold hash's grant fields (`grant:<request id>` → 1): each grant is
/// recorded under the request that made it, so that it can be released or given back
/// once, and only it.
pub const GRANT_FIELD_PREFIX: &str = "grant:";

/// The key prefix of a client, validated.
///
/// ```
/// use dlock_core::LockName;
/// use dlock_redis::KeyLayout;
///
/// let layout = KeyLayout::new("shop")?;
/// let keys = layout.lock(&LockName::new("stock/{sku-1}")?);
/// assert_eq!(keys.hold, "shop:{stock%2F%7Bsku-1%7D}");
/// assert_eq!(keys.fence, "shop:{stock%2F%7Bsku-1%7D}:fence");
/// assert_eq!(keys.channel, "shop:{stock%2F%7Bsku-1%7D}:released");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// A layout under `prefix`: non-empty, without NUL, `{` or `}`.
    pub fn new(prefix: &str) -> Result<Self, LockError> {
        if prefix.is_empty() || prefix.contains(['\0', '{', '}']) {
            return Err(LockError::InvalidInput(format!(
                "Redis key prefix {prefix:?} must be non-empty, without NUL, '{{' or '}}'"
            )));
        }
        Ok(KeyLayout { prefix: prefix.to_string() })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys and channel of one lock.
    pub fn lock(&self, name: &LockName) -> LockKeys {
        let hold = format!("{}:{{{}}}", self.prefix, name.encoded());
        LockKeys { fence: format!("{hold}:fence"), channel: format!("{hold}:released"), hold }
    }
}

/// The keys and channel of one lock (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockKeys {
    /// The hold hash.
    pub hold: String,
    /// The fence counter.
    pub fence: String,
    /// The channel a release is published on.
    pub channel: String,
}

/// The hold hash's field for `owner`.
pub fn owner_field(owner: &OwnerId) -> String {
    format!("{OWNER_FIELD_PREFIX}{owner}")
}

/// The hold hash's field for the grant of request `id`.
pub fn grant_field(id: &RequestId) -> String {
    format!("{GRANT_FIELD_PREFIX}{id}")
}

impl LockKeys {
    /// The marker key that refuses a late delivery of request `id` once its grant was
    /// given back (in the lock's hash slot).
    pub fn void(&self, id: &RequestId) -> String {
        format!("{}:void:{id}", self.hold)
    }

    /// The key of the result stored under the lock's name (in the lock's hash slot).
    pub fn result(&self) -> String {
        format!("{}:result", self.hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_with_braces_are_refused() {
        for bad in ["", "a{", "}", "a\0"] {
            assert!(matches!(KeyLayout::new(bad), Err(LockError::InvalidInput(_))), "{bad:?}");
        }
    }

    #[test]
    fn every_key_of_a_lock_has_one_hash_tag() {
        let layout = KeyLayout::new("p").unwrap();
        for name in ["{}", "}{", "a{b}c", "{", "}", "🔒"] {
            let keys = layout.lock(&LockName::new(name).unwrap());
            let tag = |key: &str| {
                let open = key.find('{').unwrap();
                let close = open + key[open..].find('}').unwrap();
                key[open + 1..close].to_string()
            };
            assert_eq!(tag(&keys.hold), LockName::new(name).unwrap().encoded());
            assert_eq!(tag(&keys.hold), tag(&keys.fence));
            assert_eq!(tag(&keys.hold), tag(&keys.result()));
            assert_eq!(keys.hold.matches(['{', '}']).count(), 2, "{name}");
        }
    }
}
