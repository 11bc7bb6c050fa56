//! Where locks live in etcd's key space, and what their keys hold.
//!
//! A lock named `n` is the key range `<prefix>/<encoded n>/`; every hold or queued
//! request is one key in it, attached to the client's lease, whose name says the kind of
//! hold asked for: `<prefix>/<encoded n>/<lease id>-<seq>` for an exclusive hold (a mutex,
//! a writer), `.../r/<lease id>-<seq>` for a reader and `.../p/<permits>/<lease id>-<seq>`
//! for one of `<permits>` permits. Lease ids are hex, so an exclusive key never starts
//! with `r` or `p`: the keys of each kind other than exclusive are one prefix, and the
//! keys that hold back a reader (or a permit) are the two ranges around it. The name is
//! percent-encoded ([`LockName::encoded`]) so it never contains `/` or `!`: the range of
//! one name never includes keys of another.
//!
//! Beside the range, outside every lock's range, live the result of the lock's last run,
//! `<prefix>/<encoded n>!result` ([`result_key`]), and the markers of requests given back,
//! `<prefix>/<encoded n>!<the request's key in the range>` (such as `!r/<lease id>-<seq>`).

use std::fmt::Write;
use std::time::Duration;

use dlock_core::{FencingToken, HoldKind, LockName, OwnerId, StoredResult};
use etcd_client::{KeyValue, TxnOpResponse, TxnResponse};

use crate::error::EtcdError;

/// The key range of one lock: `<prefix>/<encoded name>/`. Every key under it is a holder
/// or a queued request; the one with the lowest create revision holds the lock (readers,
/// or permits, hold together: a run of the oldest keys).
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

/// Where a reader's keys live in a lock's range.
const SHARED_TAG: &[u8] = b"r/";
/// Where the keys of permit requests live in a lock's range.
const PERMIT_TAG: &[u8] = b"p/";

/// The key of one request: the lock's range, the tag of its kind, the lease id and a
/// per-client sequence number, so that two requests of one client (one lease) never
/// share a key. A permit request's key carries the number of permits it asked with,
/// which waiters behind it need to know whether it holds.
pub(crate) fn request_key(dir: &[u8], kind: HoldKind, lease: i64, seq: u64) -> Vec<u8> {
    let mut key = dir.to_vec();
    let mut suffix = String::with_capacity(40);
    match kind {
        HoldKind::Exclusive => {}
        HoldKind::Shared => key.extend_from_slice(SHARED_TAG),
        HoldKind::Permit { permits } => {
            key.extend_from_slice(PERMIT_TAG);
            let _ = write!(suffix, "{permits}/");
        }
    }
    let _ = write!(suffix, "{lease:x}-{seq:x}");
    key.extend_from_slice(suffix.as_bytes());
    key
}

/// The kind of hold the key `key` of the range `dir` asks for, read from its name.
pub(crate) fn kind_of(dir: &[u8], key: &[u8]) -> Result<HoldKind, EtcdError> {
    let malformed = || EtcdError::MalformedKey { key: String::from_utf8_lossy(key).into_owned() };
    let rest = key.strip_prefix(dir).ok_or_else(malformed)?;
    if rest.starts_with(SHARED_TAG) {
        return Ok(HoldKind::Shared);
    }
    let Some(rest) = rest.strip_prefix(PERMIT_TAG) else {
        // Untagged, as every key was before readers and permits: exclusive.
        return Ok(HoldKind::Exclusive);
    };
    let end = rest.iter().position(|&b| b == b'/').ok_or_else(malformed)?;
    let digits = &rest[..end];
    // `u32::from_str` also takes a leading `+`, which dlock never writes.
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let permits: u32 = std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).ok_or_else(malformed)?;
    if permits == 0 {
        return Err(malformed());
    }
    Ok(HoldKind::Permit { permits })
}

/// The key ranges, `[start, end)`, of the keys in the lock's range `dir` that hold back
/// a request of `kind` when they are ahead of it: every key for an exclusive request,
/// and for a reader or a permit every key but those of its own kind (an exclusive key,
/// or one of the other non-exclusive kind, is never compatible with it).
pub(crate) fn blocker_ranges(dir: &[u8], kind: HoldKind) -> Vec<(Vec<u8>, Vec<u8>)> {
    let end = prefix_end(dir);
    let own = match kind {
        HoldKind::Exclusive => return vec![(dir.to_vec(), end)],
        HoldKind::Shared => [dir, SHARED_TAG].concat(),
        HoldKind::Permit { .. } => [dir, PERMIT_TAG].concat(),
    };
    vec![(dir.to_vec(), own.clone()), (prefix_end(&own), end)]
}

/// The key range, `[start, end)`, of every permit request of the lock's range `dir`.
pub(crate) fn permit_range(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let own = [dir, PERMIT_TAG].concat();
    let end = prefix_end(&own);
    (own, end)
}

/// The first key after every key that starts with `prefix`, as etcd's `WithPrefix`
/// computes it.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte is 0xff: no key comes after them all but the end of the key space.
    vec![0]
}

/// The key that marks a request given back, so that its put, should it land late,
/// applies no more: `<prefix>/<encoded name>!<the key's name in the range>`, beside the
/// lock's range (never inside any lock's range: the encoded name holds no `!`, so no
/// lock's range starts with `<prefix>/<encoded name>!`).
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
/// `result` is no given-back marker's suffix (those end in `<hex>-<hex>`).
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
        let key = request_key(&dir, HoldKind::Exclusive, 0x1f, 2);
        let marker = given_back_key(&dir, &key);
        assert_eq!(marker, b"p/a!1f-2");
        assert!(!marker.starts_with(&dir));
        assert!(!marker.starts_with(&lock_dir("p", &LockName::new("a!1f-2").unwrap())));
        for kind in [HoldKind::Shared, HoldKind::Permit { permits: 3 }] {
            let marker = given_back_key(&dir, &request_key(&dir, kind, 0x1f, 2));
            for name in ["a", "a!r", "a!p", "a!p/3"] {
                assert!(!marker.starts_with(&lock_dir("p", &LockName::new(name).unwrap())), "{kind:?} in {name}");
            }
        }
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
                let marker = given_back_key(&dir, &request_key(&dir, HoldKind::Exclusive, 0x1f, 2));
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
        let key = request_key(&a, HoldKind::Exclusive, 0x1f, 2);
        assert_eq!(key, b"p/a/1f-2");
        assert!(key.starts_with(&a));
    }

    #[test]
    fn keys_name_their_kind() {
        let dir = lock_dir("p", &LockName::new("a").unwrap());
        for kind in [
            HoldKind::Exclusive,
            HoldKind::Shared,
            HoldKind::Permit { permits: 1 },
            HoldKind::Permit { permits: 1_000_000 },
        ] {
            let key = request_key(&dir, kind, 0xabcdef, 0x10);
            assert_eq!(kind_of(&dir, &key).unwrap(), kind, "{}", String::from_utf8_lossy(&key));
        }
        assert_eq!(request_key(&dir, HoldKind::Shared, 0x1f, 2), b"p/a/r/1f-2");
        assert_eq!(request_key(&dir, HoldKind::Permit { permits: 3 }, 0x1f, 2), b"p/a/p/3/1f-2");
        for bad in [
            &b"p/a/p/"[..],
            b"p/a/p/0/1f-2",
            b"p/a/p/+3/1f-2",
            b"p/a/p/x/1f-2",
            b"p/a/p/3",
            b"p/a/p/99999999999/1-2",
            b"p/b/1f-2",
        ] {
            assert!(kind_of(&dir, bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn blockers_are_every_key_but_the_compatible_ones() {
        let dir = lock_dir("p", &LockName::new("a").unwrap());
        let in_ranges = |ranges: &[(Vec<u8>, Vec<u8>)], key: &[u8]| {
            ranges.iter().any(|(start, end)| key >= start.as_slice() && key < end.as_slice())
        };
        let kinds =
            [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit { permits: 2 }, HoldKind::Permit { permits: 9 }];
        for lease in [0, 0x1f, 0x7fff_ffff_ffff_ffff, -1] {
            for asker in kinds {
                let ranges = blocker_ranges(&dir, asker);
                for other in kinds {
                    let key = request_key(&dir, other, lease, 7);
                    let compatible = asker != HoldKind::Exclusive
                        && std::mem::discriminant(&asker) == std::mem::discriminant(&other);
                    assert_eq!(in_ranges(&ranges, &key), !compatible, "{asker:?} behind {other:?}");
                }
                let outside = [
                    lock_dir("p", &LockName::new("a/b").unwrap()),
                    given_back_key(&dir, &request_key(&dir, asker, lease, 7)),
                ];
                for key in outside {
                    assert!(!in_ranges(&ranges, &key), "{}", String::from_utf8_lossy(&key));
                }
            }
            let (start, end) = permit_range(&dir);
            for other in kinds {
                let key = request_key(&dir, other, lease, 7);
                assert_eq!(key >= start && key < end, matches!(other, HoldKind::Permit { .. }));
            }
        }
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
