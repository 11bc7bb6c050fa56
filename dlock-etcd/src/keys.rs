//! Where locks live in etcd's key space, and what their keys hold.
//!
//! A lock named `n` is the key range `<prefix>/<encoded n>/`; every hold or queued
//! request is one key in it, `<prefix>/<encoded n>/<lease id>-<seq>`, attached to the
//! client's lease. The name is percent-encoded ([`LockName::encoded`]) so it never
//! contains `/` or `!`: the range of one name never includes keys of another.
//!
//! Beside the range, outside every lock's range, live the result of the lock's last run,
//! `<prefix>/<encoded n>!result` ([`result_key`]), and the markers of requests given back,
//! `<prefix>/<encoded n>!<lease id>-<seq>`.

use std::fmt::Write;
use std::time::Duration;

use dlock_core::{FencingToken, LockName, OwnerId, StoredResult};
use etcd_client::{KeyValue, TxnOpResponse, TxnResponse};

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

/// The key that marks a request given back, so that its put, should it land late,
/// applies no more: `<prefix>/<encoded name>!<lease id>-<seq>`, beside the lock's range
/// (never inside any lock's range: the encoded name holds no `/`, and the suffix none).
pub(crate) fn given_back_key(dir: &[u8], key: &[u8]) -> Vec<u8> {
    let mut marker = dir.strip_suffix(b"/").unwrap_or(dir).to_vec();
    marker.push(b'!');
    marker.extend_from_slice(key.strip_prefix(dir).unwrap_or(key));
    marker
}

/// The key that keeps the result stored under a lock's name:
/// `<prefix>/<encoded name>!result`.
///
/// It lies beside the lock's range, not in it, so that it is never taken for a holder or
/// a waiter, and releasing or evicting the lock leaves it alone. It is attached to an
/// etcd lease of its own, granted for the retention, which deletes it when the retention
/// ends; its value is `"<token>\n"` (the token in decimal) followed by the result's bytes.
///
/// ```
/// use dlock_core::LockName;
///
/// let key = dlock_etcd::result_key("dlock", &LockName::new("orders/42")?);
/// assert_eq!(key, b"dlock/orders%2F42!result");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
pub fn result_key(prefix: &str, name: &LockName) -> Vec<u8> {
    result_key_in(&lock_dir(prefix, name))
}

/// The result key of the lock whose range is `dir` (see [`result_key`]): the encoded
/// name holds no `!`, so the suffix cannot be confused with a part of another name, and
/// `result` is not the `<hex>-<hex>` of a given-back marker.
pub(crate) fn result_key_in(dir: &[u8]) -> Vec<u8> {
    let mut key = dir.strip_suffix(b"/").unwrap_or(dir).to_vec();
    key.extend_from_slice(b"!result");
    key
}

/// The value of a result key: the token in decimal, a newline, then the result.
pub(crate) fn encode_result(token: FencingToken, value: &[u8]) -> Vec<u8> {
    let mut record = format!("{}\n", token.get()).into_bytes();
    record.reserve(value.len());
    record.extend_from_slice(value);
    record
}

/// Reads back a result key's value written by [`encode_result`].
pub(crate) fn decode_result(key: &[u8], record: &[u8]) -> Result<StoredResult, EtcdError> {
    let malformed = || EtcdError::MalformedResult { key: String::from_utf8_lossy(key).into_owned() };
    let end = record.iter().position(|&b| b == b'\n').ok_or_else(malformed)?;
    let head = &record[..end];
    // `u64::from_str` also takes a leading `+`, which dlock never writes.
    if head.is_empty() || !head.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let token: u64 = std::str::from_utf8(head).ok().and_then(|t| t.parse().ok()).ok_or_else(malformed)?;
    Ok(StoredResult { token: FencingToken::new(token), value: record[end + 1..].to_vec() })
}

/// What a lock key holds: the owner, and the requests that hold the lock through it (one
/// for a plain hold, several for re-entrant ones), as `"<count> <owner>\0<id> <id>..."`.
///
/// Each hold is named by the request that made it, so that giving one back, or undoing
/// an acquire whose answer was lost, removes exactly that hold however often it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldValue {
    pub(crate) owner: OwnerId,
    pub(crate) holds: Vec<String>,
}

impl HoldValue {
    pub(crate) fn new(owner: OwnerId, holds: Vec<String>) -> Self {
        HoldValue { owner, holds }
    }

    pub(crate) fn count(&self) -> u32 {
        u32::try_from(self.holds.len()).unwrap_or(u32::MAX)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        format!("{} {}\0{}", self.holds.len(), self.owner, self.holds.join(" ")).into_bytes()
    }

    pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Self, EtcdError> {
        let malformed = || EtcdError::MalformedValue { key: String::from_utf8_lossy(key).into_owned() };
        let text = std::str::from_utf8(value).map_err(|_| malformed())?;
        let (head, holds) = text.split_once('\0').ok_or_else(malformed)?;
        let (count, owner) = head.split_once(' ').ok_or_else(malformed)?;
        let count: usize = count.parse().map_err(|_| malformed())?;
        let owner = OwnerId::new(owner).map_err(|_| malformed())?;
        let holds: Vec<String> = holds.split(' ').filter(|h| !h.is_empty()).map(str::to_string).collect();
        if holds.len() != count || count == 0 {
            return Err(malformed());
        }
        Ok(HoldValue { owner, holds })
    }
}

/// The fencing token of a key of this create revision.
pub(crate) fn token_of(revision: i64) -> FencingToken {
    FencingToken::new(u64::try_from(revision).unwrap_or(0))
}

/// The first key the `op`-th read of a transaction found.
pub(crate) fn first_kv(resp: &TxnResponse, op: usize) -> Option<KeyValue> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
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
        let value = HoldValue::new(owner.clone(), vec!["c:1".into(), "c:2".into()]);
        assert_eq!(value.encode(), b"2 job 7: nightly\0c:1 c:2");
        assert_eq!(HoldValue::decode(b"k", &value.encode()).unwrap(), value);
        assert_eq!(value.count(), 2);
        for bad in [&b""[..], b"3", b"x owner\0a", b"1 \0a", b"\xff owner\0a", b"2 owner\0a", b"0 owner\0", b"1 owner"]
        {
            assert!(HoldValue::decode(b"k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn given_back_markers_stay_outside_every_range() {
        let dir = lock_dir("p", &LockName::new("a").unwrap());
        let key = request_key(&dir, 0x1f, 2);
        let marker = given_back_key(&dir, &key);
        assert_eq!(marker, b"p/a!1f-2");
        assert!(!marker.starts_with(&dir));
        assert!(!marker.starts_with(&lock_dir("p", &LockName::new("a!1f-2").unwrap())));
    }

    #[test]
    fn results_round_trip() {
        let record = encode_result(FencingToken::new(42), b"\"shipped\"\n");
        assert_eq!(record, b"42\n\"shipped\"\n");
        let back = decode_result(b"k", &record).unwrap();
        assert_eq!(back, StoredResult { token: FencingToken::new(42), value: b"\"shipped\"\n".to_vec() });
        let empty = decode_result(b"k", &encode_result(FencingToken::new(u64::MAX), b"")).unwrap();
        assert_eq!((empty.token.get(), empty.value.len()), (u64::MAX, 0));
        for bad in [&b""[..], b"42", b"\nvalue", b"+4\nv", b"-4\nv", b"4 2\nv", b"18446744073709551616\nv", b"\xff\nv"]
        {
            assert!(decode_result(b"k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn result_keys_stay_outside_every_range_and_apart() {
        let names = ["a", "a/b", "a!result", "a/result", "result", "a-1", "%21", "\u{e9}t\u{e9}"];
        let names: Vec<LockName> = names.iter().map(|n| LockName::new(*n).unwrap()).collect();
        for name in &names {
            let key = result_key("p", name);
            for other in &names {
                let dir = lock_dir("p", other);
                assert!(!key.starts_with(&dir), "{name}'s result key is in {other}'s range");
                if other != name {
                    assert_ne!(key, result_key("p", other), "{name} and {other} share a result");
                }
                let marker = given_back_key(&dir, &request_key(&dir, 0x1f, 2));
                assert_ne!(key, marker, "{name}'s result key is a marker of {other}");
            }
        }
        assert_eq!(result_key_in(&lock_dir("p", &names[0])), b"p/a!result");
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
