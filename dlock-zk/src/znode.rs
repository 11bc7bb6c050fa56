//! The queue nodes under a lock's znode: their names, their order and their data.
//!
//! A contender's node is `_c_<uuid>-lock-<sequence>`, the layout of Curator's
//! `InterProcessMutex`: the uuid lets a client find a node whose create reply it lost,
//! and the server-assigned sequence orders the queue. Contenders that follow the same
//! layout (Curator's) queue in the same order. The data is `<count> <owner>`: the hold
//! count of a re-entrant owner, then the owner's identity.

use dlock_core::OwnerId;

const NODE_MARK: &str = "_c_";
const LOCK_MARK: &str = "-lock-";

/// The path prefix of a contender's node; the server appends the sequence.
pub(crate) fn node_prefix(lock_path: &str, uuid: &str) -> String {
    format!("{lock_path}/{NODE_MARK}{uuid}{LOCK_MARK}")
}

/// A node to delete once the session can: its lock znode, the uuid of the attempt that
/// created it, and its path when known (without it, the node is found by its uuid).
#[derive(Debug, Clone)]
pub(crate) struct Unwanted {
    pub(crate) lock_path: String,
    pub(crate) uuid: String,
    pub(crate) path: Option<String>,
}

/// One child of a lock's znode that looks like a contender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    /// The child's name (not the full path).
    pub(crate) name: String,
    /// The server-assigned sequence: the queue order.
    pub(crate) sequence: i64,
}

impl Contender {
    /// Whether this node was created for the attempt with this uuid.
    pub(crate) fn has_uuid(&self, uuid: &str) -> bool {
        uuid_of(&self.name) == Some(uuid)
    }
}

/// The uuid a node name carries, if it has our layout.
pub(crate) fn uuid_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(NODE_MARK)?;
    let end = rest.rfind(LOCK_MARK)?;
    Some(&rest[..end])
}

/// Parses a child name as a contender: anything ending in `lock-<digits>`, as Curator
/// sorts them. Other children are not part of the queue.
fn parse(name: &str) -> Option<Contender> {
    let at = name.rfind("lock-")?;
    let digits = &name[at + "lock-".len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Contender { name: name.to_string(), sequence: digits.parse().ok()? })
}

/// The queue of a lock: its contenders in grant order (the holder first).
pub(crate) fn queue(children: Vec<String>) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children.iter().filter_map(|name| parse(name)).collect();
    queue.sort_by_key(|c| c.sequence);
    queue
}

/// The data of a node: the hold count, then the owner.
pub(crate) fn encode_data(owner: &OwnerId, count: u32) -> Vec<u8> {
    format!("{count} {owner}").into_bytes()
}

/// Reads a node's data. Nodes written by other clients (Curator stores an IP address)
/// show their data as the owner with a count of 1.
pub(crate) fn decode_data(data: &[u8]) -> (OwnerId, u32) {
    let text = String::from_utf8_lossy(data);
    if let Some((count, owner)) = text.split_once(' ') {
        if let (Ok(count), Ok(owner)) = (count.parse::<u32>(), OwnerId::new(owner)) {
            return (owner, count);
        }
    }
    let owner = OwnerId::new(text.trim_matches('\0'))
        .or_else(|_| OwnerId::new("(unknown)"))
        .unwrap_or_else(|_| OwnerId::unique());
    (owner, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_orders_by_sequence_and_skips_strangers() {
        let children = vec![
            "_c_b-lock-0000000010".to_string(),
            "_c_a-lock-0000000002".to_string(),
            "notes".to_string(),
            "_c_c-lock-".to_string(),
            "_c_d-lock-0000000100".to_string(),
        ];
        let names: Vec<String> = queue(children).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["_c_a-lock-0000000002", "_c_b-lock-0000000010", "_c_d-lock-0000000100"]);
    }

    #[test]
    fn uuids_are_found_in_names() {
        let uuid = "0e6f3a1c-9a4b-4f55-8d43-6b7b2f3f9a10";
        let name = format!("{NODE_MARK}{uuid}{LOCK_MARK}0000000007");
        assert_eq!(uuid_of(&name), Some(uuid));
        assert!(parse(&name).unwrap().has_uuid(uuid));
        assert_eq!(uuid_of("lock-0000000001"), None);
        assert!(node_prefix("/dlock/x", uuid).ends_with("-lock-"));
    }

    #[test]
    fn data_round_trips_owners_with_spaces() {
        let owner = OwnerId::new("job 7: nightly").unwrap();
        assert_eq!(decode_data(&encode_data(&owner, 3)), (owner, 3));
        assert_eq!(decode_data(b"10.0.0.7").0.as_str(), "10.0.0.7");
        assert_eq!(decode_data(b"").0.as_str(), "(unknown)");
    }
}
