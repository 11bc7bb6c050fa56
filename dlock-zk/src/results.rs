//! Results stored under a lock's name: the record a result znode holds, and the store
//! that checks the hold in the same transaction as it writes.
//!
//! A record is `dlr1`, the fencing token of the run that stored it (8 bytes, big-endian),
//! its expiry in milliseconds since the Unix epoch by the storing client's clock (8
//! bytes, big-endian), then the value. ZooKeeper cannot delete a plain znode after a
//! while, so the expiry travels in the record and an expired record reads as absent.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::{FencingToken, LockError, StoredResult, Swept};
use futures::future::join_all;
use zookeeper_client as zk;

use crate::config::RESULT_SUFFIX;
use crate::error::{is_connection_loss, lock_error, retrying};
use crate::node::Node;
use crate::session::Session;
use crate::settings::Settings;

/// Opens every record; the digit is the layout's version.
const MAGIC: &[u8; 4] = b"dlr1";
const HEADER: usize = MAGIC.len() + 8 + 8;

/// A record read back from a result znode.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) token: FencingToken,
    /// Milliseconds since the Unix epoch.
    pub(crate) expires_ms: u64,
    pub(crate) value: &'a [u8],
}

impl Record<'_> {
    pub(crate) fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_ms
    }

    pub(crate) fn to_stored(&self) -> StoredResult {
        StoredResult { token: self.token, value: self.value.to_vec() }
    }
}

/// The bytes of a record.
pub(crate) fn encode(token: FencingToken, expires_ms: u64, value: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(HEADER + value.len());
    data.extend_from_slice(MAGIC);
    data.extend_from_slice(&token.get().to_be_bytes());
    data.extend_from_slice(&expires_ms.to_be_bytes());
    data.extend_from_slice(value);
    data
}

/// Reads a record; `Backend` when the znode at `path` holds something else.
pub(crate) fn decode<'a>(data: &'a [u8], path: &str) -> Result<Record<'a>, LockError> {
    let corrupt = || LockError::Backend(format!("the ZooKeeper znode {path} holds no result record").into());
    let rest = data.strip_prefix(MAGIC.as_slice()).ok_or_else(corrupt)?;
    let (token, rest) = rest.split_first_chunk::<8>().ok_or_else(corrupt)?;
    let (expires, value) = rest.split_first_chunk::<8>().ok_or_else(corrupt)?;
    Ok(Record { token: FencingToken::new(u64::from_be_bytes(*token)), expires_ms: u64::from_be_bytes(*expires), value })
}

/// The wall clock in milliseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis().min(u64::MAX.into()) as u64)
}

/// When a record stored now for `retention` expires, in milliseconds since the Unix
/// epoch. A fraction of a millisecond rounds up, so that a record is never kept for less.
pub(crate) fn expiry_ms(retention: Duration) -> u64 {
    let millis = retention.as_nanos().div_ceil(1_000_000).min(u64::MAX.into()) as u64;
    now_ms().saturating_add(millis)
}

/// The data and stat of the znode at `path`, or `None` when there is none, as the
/// leader had it when the read was sent: a `sync` goes in front of the read, so that a
/// member lagging behind the leader does not hide a result stored through another one.
pub(crate) async fn read(client: &zk::Client, path: &str) -> Result<Option<(Vec<u8>, zk::Stat)>, zk::Error> {
    let synced_read = || async {
        // A member answers a session's requests in order: the read comes after the sync.
        let (synced, read) = futures::join!(client.sync(path), client.get_data(path));
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(err) => return Err(err),
        }
        match read {
            Ok(found) => Ok(Some(found)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(err) => Err(err),
        }
    };
    retrying(synced_read).await
}

/// How a store ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The record is stored.
    Written,
    /// The hold is gone, or a record of the same or a later token is kept: nothing was
    /// written.
    NotHeld,
    /// The hold's session ended after a transaction whose answer was lost: only reading
    /// the record (on another session) tells whether it was applied.
    Unknown,
}

/// Stores `record` (of `token`) at `path` in one transaction with the check that the
/// hold's node still exists. The node's path carries the uuid of the attempt that created
/// it and ZooKeeper never gives an ephemeral-sequential node's path to a second node, so
/// its existence is this grant's existence (and, being granted, it stays the lowest
/// sequence until it is deleted). Its version is not checked: it changes with the
/// re-entrant hold count, which says nothing about the grant.
///
/// A live record of the same or a later token is never replaced: the transaction
/// replaces exactly the version read (or creates the znode if there was none), and a
/// concurrent change sends the store back to read again.
pub(crate) async fn store(
    settings: &Settings,
    session: &Session,
    node: &Node,
    path: &str,
    token: FencingToken,
    record: &[u8],
) -> Result<Outcome, LockError> {
    let client = session.client();
    // A transaction whose connection broke may have been applied: the record read next
    // tells (it is ours, byte for byte, only if it was).
    let mut unsure = false;
    // After such a transaction, the hold was found gone.
    let mut gone = false;
    loop {
        if session.is_ended() {
            // The node went with the session: no transaction of ours can apply any more.
            return Ok(if unsure { Outcome::Unknown } else { Outcome::NotHeld });
        }
        let current = match read(client, path).await {
            Ok(current) => current,
            Err(_) if session.is_ended() => continue,
            Err(err) => return Err(lock_error("read the result", err)),
        };
        if unsure && current.as_ref().is_some_and(|(data, _)| data.as_slice() == record) {
            return Ok(Outcome::Written);
        }
        if gone {
            return Ok(Outcome::NotHeld);
        }
        let version = match &current {
            None => None,
            Some((data, stat)) => {
                let kept = decode(data, path)?;
                if kept.token >= token && !kept.is_expired(now_ms()) {
                    return Ok(Outcome::NotHeld);
                }
                Some(stat.version)
            }
        };
        let mut writer = client.new_multi_writer();
        let options = zk::CreateMode::Persistent.with_acls(settings.acls());
        writer
            .add_check_version(&node.path, -1)
            .and_then(|()| match version {
                Some(version) => writer.add_set_data(path, record, Some(version)),
                None => writer.add_create(path, record, &options),
            })
            .map_err(|err| lock_error("prepare the result's transaction", err))?;
        let sent = session.sending();
        match writer.commit().await {
            Ok(_) => {
                // A transaction goes through the leader: the session was alive when sent.
                session.confirm(sent);
                return Ok(Outcome::Written);
            }
            Err(zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoNode }) => {
                session.lose(node, session.gone_reason());
                if !unsure {
                    return Ok(Outcome::NotHeld);
                }
                gone = true;
            }
            // The result changed since it was read: read it again.
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists,
            }) => {}
            Err(zk::MultiWriteError::RequestFailed { source }) if is_connection_loss(&source) => {
                tracing::debug!(%source, %path, "the result's transaction lost its connection; reading it back");
                unsure = true;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) if session.is_ended() => {}
            Err(err) => return Err(lock_error("store the result", err.into())),
        }
    }
}

/// The ephemeral znode a client keeps under the root while it sweeps. One sweeper at a
/// time makes the sweep's conditional deletes sound: a record read as expired can then
/// change before the delete only by a store, which raises its version, and never by a
/// delete and a store that creates it afresh at the version read.
const SWEEPER: &str = ".sweeping";

/// How many reads and deletes a sweep has in flight at once.
const SWEEP_IN_FLIGHT: usize = 64;

/// Deletes the result znodes under the root whose record has expired (by this client's
/// clock), reading at most `batch` of them: those after `cursor` in name order, where the
/// last call stopped. The cursor goes back to the start once a call reaches the end, so
/// that calls until [`Swept::more`] is false pass over every result once, each call short
/// enough for the operation timeout however many results the root holds; a sweep cut off
/// halfway leaves the cursor where it stopped, and the next sweep goes on from there to
/// the end (and the one after it from the start). Nothing is done while another client
/// is sweeping.
pub(crate) async fn sweep(
    settings: &Settings,
    session: &Session,
    batch: usize,
    cursor: &Mutex<String>,
) -> Result<Swept, LockError> {
    let client = session.client();
    let root = settings.config.root();
    let marker = format!("{}/{SWEEPER}", root.trim_end_matches('/'));
    let options = zk::CreateMode::Ephemeral.with_acls(settings.acls());
    match retrying(|| client.create(&marker, &[], &options)).await {
        Ok(_) => {}
        // Another client sweeps, or nothing was ever stored under this root.
        Err(zk::Error::NodeExists | zk::Error::NoNode) => return Ok(Swept::default()),
        Err(err) => return Err(lock_error("take the sweeper's place", err)),
    }
    let mut place = SweeperPlace { client: client.clone(), marker };
    let swept = sweep_results(client, &root, batch, cursor).await;
    // Deleted before the next call of the same sweep tries to take the place again.
    let _ = client.delete(&std::mem::take(&mut place.marker), None).await;
    swept
}

/// The sweeper's znode, deleted when the sweep ends, however it ends: a sweep cut off by
/// the operation timeout must not keep every later sweep out until its session ends. An
/// empty path means it was deleted already.
struct SweeperPlace {
    client: zk::Client,
    marker: String,
}

impl Drop for SweeperPlace {
    fn drop(&mut self) {
        if self.marker.is_empty() {
            return;
        }
        let (client, marker) = (self.client.clone(), std::mem::take(&mut self.marker));
        // Without a runtime the place goes with the session.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.delete(&marker, None).await;
            });
        }
    }
}

async fn sweep_results(
    client: &zk::Client,
    root: &str,
    batch: usize,
    cursor: &Mutex<String>,
) -> Result<Swept, LockError> {
    let children = match retrying(|| client.list_children(root)).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(Swept::default()),
        Err(err) => return Err(lock_error("list the root", err)),
    };
    let mut results: Vec<&String> = children.iter().filter(|child| child.ends_with(RESULT_SUFFIX)).collect();
    results.sort_unstable();
    let after = lock_unpoisoned(cursor).clone();
    let first = results.partition_point(|child| child.as_str() <= after.as_str());
    let these = &results[first..results.len().min(first + batch)];
    let more = first + these.len() < results.len();
    *lock_unpoisoned(cursor) = match these.last() {
        Some(last) if more => (*last).clone(),
        _ => String::new(),
    };
    let dir = root.trim_end_matches('/');
    let paths: Vec<String> = these.iter().map(|child| format!("{dir}/{child}")).collect();
    let now = now_ms();
    let mut removed = 0u64;
    for chunk in paths.chunks(SWEEP_IN_FLIGHT) {
        let reads = join_all(chunk.iter().map(|path| client.get_data(path))).await;
        let mut doomed = Vec::new();
        for (path, read) in chunk.iter().zip(reads) {
            let Ok((data, stat)) = read else { continue };
            // A znode of someone else's layout is not ours to delete.
            if decode(&data, path).is_ok_and(|record| record.is_expired(now)) {
                doomed.push((path, stat.version));
            }
        }
        // Conditional on the version read: a record stored again meanwhile stays.
        let deletes = join_all(doomed.iter().map(|(path, version)| client.delete(path, Some(*version)))).await;
        for (deleted, (path, _)) in deletes.into_iter().zip(&doomed) {
            match deleted {
                Ok(()) => removed += 1,
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                Err(err) => tracing::debug!(%path, %err, "deleting an expired result failed"),
            }
        }
    }
    Ok(Swept { removed, more })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let data = encode(FencingToken::new(0x0102_0304_0506_0708), 1_700_000_000_123, b"shipped");
        assert_eq!(data.len(), HEADER + 7);
        let record = decode(&data, "/r").unwrap();
        assert_eq!(
            record,
            Record {
                token: FencingToken::new(0x0102_0304_0506_0708),
                expires_ms: 1_700_000_000_123,
                value: b"shipped"
            }
        );
        assert!(!record.is_expired(1_700_000_000_122));
        assert!(record.is_expired(1_700_000_000_123));
        let empty = encode(FencingToken::new(1), 2, b"");
        assert_eq!(decode(&empty, "/r").unwrap().value, b"");
    }

    #[test]
    fn foreign_data_is_a_backend_error() {
        for data in [&b""[..], b"dlr1", b"dlr1\0\0\0\0\0\0\0\x01\0\0", b"xxxx\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0\x02"] {
            let err = decode(data, "/dlock/a.result").unwrap_err();
            assert!(matches!(err, LockError::Backend(_)), "{data:?}: {err:?}");
            assert!(err.to_string().contains("/dlock/a.result"), "{err}");
        }
    }

    #[test]
    fn retention_rounds_up_to_the_millisecond() {
        let before = now_ms();
        let expiry = expiry_ms(Duration::from_micros(1));
        assert!(expiry > before && expiry <= now_ms() + 1, "{before} {expiry}");
        let year = expiry_ms(Duration::from_secs(365 * 24 * 3600));
        assert!(year >= before + 365 * 24 * 3600 * 1000);
    }
}
