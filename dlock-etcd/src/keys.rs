//! Where locks live in etcd's key space, and what their keys hold.
//!
//! A lock named `n` is the key range `<prefix>/<encoded n>/`; every hold or queued
//! request is one key in it, `<prefix>/<encoded n>/<lease id>-<seq>`, attached to the
//! client's lease. The name is percent-encoded ([`LockName::encoded`]) so it never
//! contains `/`: the range of one name never includes keys of another.

use std::fmt::Write;
use std::time::Duration;

use dlock_core::{LockName, OwnerId};

use crate::error::EtcdError;

/// The key range of one lock: `<prefix>/<encoded name>/`. Every key under it is a holder
/// or a queued request; the one with the lowest create revision holds the lock.
///
/// ```
/// use dlock_core::LockName;
///
/// let dir = dlock_etcd::lock_dir("dlock", &LockName::new("orders/42")?);
/// assert_eq!(dir, b"dlock/orders%2F42/");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
pub fn lock_dir(prefix: &str, name: &LockName) -> Vec<u8> {
    format!("{prefix}/{}/", name.encoded()).into_bytes()
}

/// The key of one request: the lock's range, the lease id and a per-client sequence
/// number, so that two requests of one client (one lease) never share a key.
pub(crate) fn request_key(dir: &[u8], lease: i64, seq: u64) -> Vec<u8> {
    let mut key = dir.to_vec();
    let mut suffix = String::with_capacity(24);
    let _ = write!(suffix, "{lease:x}-{seq:x}");
    key.extend_from_slice(suffix.as_bytes());
    key
}

/// What a lock key holds: the owner and how many times it holds the lock (re-entrancy),
/// as `"<count> <owner>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldValue {
    pub(crate) count: u32,
    pub(crate) owner: OwnerId,
}

impl HoldValue {
    pub(crate) fn encode(count: u32, owner: &OwnerId) -> Vec<u8> {
        format!("{count} {owner}").into_bytes()
    }

    pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Self, EtcdError> {
        let malformed = || EtcdError::MalformedValue { key: String::from_utf8_lossy(key).into_owned() };
        let text = std::str::from_utf8(value).map_err(|_| malformed())?;
        let (count, owner) = text.split_once(' ').ok_or_else(malformed)?;
        let count = count.parse().map_err(|_| malformed())?;
        let owner = OwnerId::new(owner).map_err(|_| malformed())?;
        Ok(HoldValue { count, owner })
    }
}

/// A ttl in etcd's unit, whole seconds, rounded up (never down: the client's idea of a
/// lease's validity must end before the server's).
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up() {
        assert_eq!(ttl_secs(Duration::from_millis(10)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
    }

    #[test]
    fn values_round_trip() {
        let owner = OwnerId::new("job 7: nightly").unwrap();
        let value = HoldValue::encode(3, &owner);
        assert_eq!(value, b"3 job 7: nightly");
        assert_eq!(HoldValue::decode(b"k", &value).unwrap(), HoldValue { count: 3, owner });
        for bad in [&b""[..], b"3", b"x owner", b"3 ", b"\xff owner"] {
            assert!(HoldValue::decode(b"k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_name_never_ranges_over_another() {
        let a = lock_dir("p", &LockName::new("a").unwrap());
        let ab = lock_dir("p", &LockName::new("a/b").unwrap());
        assert!(!ab.starts_with(&a));
        let key = request_key(&a, 0x1f, 2);
        assert_eq!(key, b"p/a/1f-2");
        assert!(key.starts_with(&a));
    }
}
