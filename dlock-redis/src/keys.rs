//! Where a lock lives in Redis: its keys and its release channel.
//!
//! For the lock `orders/42` under the default prefix `dlock`:
//!
//! | what | name | type | lasts |
//! |---|---|---|---|
//! | the hold | `dlock:{orders%2F42}` | hash: `owner:<owner id>` → hold count, `token` → fencing token, `grant:<request id>` → 1 per grant, `extended` → the grant that last lengthened the hold and the expiry it found (see [`EXTENDED_FIELD`]). Held by readers or permits instead: `kind` → `shared` or `permit`, `token` → the newest grant's token, and per hold (its [hold id](hold_id)) `holder:<hold id>` → its token, `count:<hold id>` → its grants, `permits:<hold id>` → the number of permits it asked for (permits only), per grant `request:<request id>` → its hold id | the hold's ttl (PEXPIRE); held by readers or permits, the last lease (PEXPIREAT) |
//! | the fence counter | `dlock:{orders%2F42}:fence` | string counter: the last token given | the keep time (`keep_idle`, an hour by default) from the name's last grant, renewal or release; a grant that finds it missing starts it from the server's clock in µs |
//! | the leases of shared holds and permits | `dlock:{orders%2F42}:leases` | sorted set: hold id → when its hold lapses (ms since the epoch, server clock); exists only beside a hold hash of shared holds or permits | the last lease (PEXPIREAT) |
//! | a given-back request | `dlock:{orders%2F42}:void:<request id>` | string: refuses a late delivery of an acquire whose grant was given back | the request's ttl |
//! | the release channel | `dlock:{orders%2F42}:released` | pub/sub channel; the message is the released token. Used while no waiter queues | — |
//! | the queue | `dlock:{orders%2F42}:queue` | list of place ids (each the request id of a waiting acquire call), first come first | its longest place |
//! | the places | `dlock:{orders%2F42}:places` | hash: place id → when the place lapses (ms since the epoch, server clock); a place is in the list exactly when it is here | its longest place: a place lapses [`place_lapse`](dlock_core::place_lapse) (at most 5 s) after its waiter's last look |
//! | a client's wake-up channel | `dlock:{orders%2F42}:wake:<client id>` | pub/sub channel; the message is a place id, whose waiter is now first in the queue of a free lock. The client id is the place id up to its last `:` | — |
//! | the stored result | `dlock:{orders%2F42}:result` | hash: `token` → the storing hold's token, `value` → the result, `call` → the id of the store call. Apart from the hold, so that a release or an eviction leaves it (see [`results`](crate::results)) | the retention (PEXPIRE) |
//!
//! So every key of a name expires by itself: once a name is idle (no hold, no waiter),
//! its result goes after its retention and its fence counter after the keep time, and
//! nothing of it is left. The server needs no sweep. A counter that went is started again
//! from the server's clock in microseconds, which is above every token the name had as
//! long as the server's clock never steps back by the keep time (and, on RedLock, no
//! client's or master's clock runs ahead of a master's by half of it): tokens never go
//! back.
//!
//! The part in braces is the Cluster hash tag, so every key and channel of a name (hold,
//! counter, leases, given-back markers, queue, places, result, and the release and
//! wake-up channels) hashes to one slot: a script may touch several keys and publish on
//! the channels, a migration moves them together, and on a Cluster the channels are
//! sharded ones, heard on the shard that serves the slot. It is the name's
//! [`LockName::encoded`] form, which is injective and never contains a brace: two names
//! never share a key, and a name with `{` or `}` in it cannot move the tag.
//!
//! A name held by readers or permits keeps its hold hash, so that a writer's acquire (the
//! exclusive script) sees it held without reading the leases; the field names of the two
//! layouts never meet (`kind`, `holder:` and the rest beside `owner:` and `grant:`), so
//! an exclusive script never mistakes a reader for its own owner or grant.

use dlock_core::backend::RequestId;
use dlock_core::{HoldKind, LockError, LockName, OwnerId};

/// The field of the hold hash that holds the fencing token.
pub const TOKEN_FIELD: &str = "token";

/// The prefix of the hold hash's owner field (`owner:<owner id>` → count). The prefix
/// keeps any owner id apart from [`TOKEN_FIELD`].
pub const OWNER_FIELD_PREFIX: &str = "owner:";

/// The prefix of the hold hash's grant fields (`grant:<request id>` → 1): each grant is
/// recorded under the request that made it, so that it can be released or given back
/// once, and only it.
pub const GRANT_FIELD_PREFIX: &str = "grant:";

/// The field of an exclusive hold hash that names the grant which last lengthened the
/// hold and the expiry the hold had before (`extended` → `<grant field> <unix ms>`), so
/// that giving that grant back, or releasing it, puts the expiry back while no other
/// grant or renewal has counted on it since. Without it, an owner's acquire that
/// re-enters a hold left on a RedLock node by a lease it lost, and gives the re-entry back
/// because its round lost, would keep that hold one more ttl per attempt.
pub const EXTENDED_FIELD: &str = "extended";

/// The field of a hold hash of shared holds or permits that names their kind (`shared`
/// or `permit`); an exclusive hold has none.
pub const KIND_FIELD: &str = "kind";

/// The prefix of a shared hold's or permit's field in the hold hash (`holder:<hold id>`
/// → the hold's token).
pub const HOLDER_FIELD_PREFIX: &str = "holder:";

/// The prefix of a shared hold's or permit's grant count (`count:<hold id>` → grants).
pub const COUNT_FIELD_PREFIX: &str = "count:";

/// The prefix of a permit's number of permits (`permits:<hold id>` → the number its
/// request carried), which bounds how many holds may be beside it. A permit hold without
/// it (written by an older client) bounds nobody.
pub const PERMITS_FIELD_PREFIX: &str = "permits:";

/// The prefix of a shared hold's or permit's grant fields (`request:<request id>` → the
/// hold id), so that each grant is released or given back once, and only it.
pub const REQUEST_FIELD_PREFIX: &str = "request:";

/// What separates the owner id from the number of permits in a permit's hold id: NUL,
/// which no owner id contains, so that no two (owner, permits) pairs, and no owner id
/// alone, share a hold id.
pub const HOLD_ID_SEPARATOR: char = '\0';

/// The id under which a reader's share or a permit of `owner` is kept (see the
/// [module docs](self)): a reader's is the owner id, a permit's the owner id and the
/// number of permits, so that an owner re-enters a permit only with the same number and
/// takes another permit with another number.
///
/// ```
/// use dlock_core::{HoldKind, OwnerId};
/// use dlock_redis::keys::hold_id;
///
/// let owner = OwnerId::new("worker-1")?;
/// assert_eq!(hold_id(&owner, HoldKind::Shared), "worker-1");
/// assert_eq!(hold_id(&owner, HoldKind::Permit { permits: 3 }), "worker-1\u{0}3");
/// assert_ne!(hold_id(&owner, HoldKind::Permit { permits: 3 }), hold_id(&owner, HoldKind::Permit { permits: 4 }));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
pub fn hold_id(owner: &OwnerId, kind: HoldKind) -> String {
    hold_id_of(owner.as_str(), kind)
}

/// [`hold_id`] of an owner id already checked.
pub(crate) fn hold_id_of(owner: &str, kind: HoldKind) -> String {
    match kind {
        HoldKind::Permit { permits } => format!("{owner}{HOLD_ID_SEPARATOR}{permits}"),
        HoldKind::Exclusive | HoldKind::Shared => owner.to_string(),
    }
}

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
        LockKeys {
            fence: format!("{hold}:fence"),
            leases: format!("{hold}:leases"),
            channel: format!("{hold}:released"),
            queue: format!("{hold}:queue"),
            places: format!("{hold}:places"),
            wake_prefix: format!("{hold}:wake:"),
            hold,
        }
    }
}

/// The keys and channel of one lock (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockKeys {
    /// The hold hash.
    pub hold: String,
    /// The fence counter.
    pub fence: String,
    /// The leases of shared holds and permits: owner id by lapse time.
    pub leases: String,
    /// The channel a release is published on while nobody queues.
    pub channel: String,
    /// The FIFO queue of waiters' place ids.
    pub queue: String,
    /// The hash of each queued place's lapse time.
    pub places: String,
    /// The prefix of a client's wake-up channel; see [`wake`](Self::wake).
    pub wake_prefix: String,
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

    /// The channel on which the waiter with place `place` is told it is first in the
    /// queue of a free lock (the message is `place`). It is its client's: the place id up
    /// to its last `:`, as the scripts name it too.
    pub fn wake(&self, place: &str) -> String {
        let client = place.rsplit_once(':').map_or(place, |(client, _)| client);
        format!("{}{client}", self.wake_prefix)
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
    fn a_place_wakes_on_its_clients_channel() {
        let keys = KeyLayout::new("p").unwrap().lock(&LockName::new("n").unwrap());
        assert_eq!(keys.wake("0123abcd:17"), "p:{n}:wake:0123abcd");
        assert_eq!(keys.wake("a:b:17"), "p:{n}:wake:a:b");
        assert_eq!(keys.wake("lonely"), "p:{n}:wake:lonely");
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
            assert_eq!(tag(&keys.hold), tag(&keys.queue));
            assert_eq!(tag(&keys.hold), tag(&keys.places));
            assert_eq!(tag(&keys.hold), tag(&keys.leases));
            assert_eq!(keys.hold.matches(['{', '}']).count(), 2, "{name}");
            // The channels too: on a Cluster they are sharded, published from the scripts
            // (which may touch only their keys' slot) and subscribed where that slot is.
            let request = RequestId::new("0123abcd", 7);
            let (wake, void) = (keys.wake(request.as_str()), keys.void(&request));
            for key in [&keys.channel, &wake, &void] {
                assert_eq!(tag(&keys.hold), tag(key), "{key}");
            }
            let slot = crate::shards::slot(keys.hold.as_bytes());
            for key in
                [&keys.fence, &keys.leases, &keys.queue, &keys.places, &keys.result(), &keys.channel, &wake, &void]
            {
                assert_eq!(crate::shards::slot(key.as_bytes()), slot, "{key}");
            }
        }
    }
}
