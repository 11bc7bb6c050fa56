//! The queue nodes under a lock's znode: their names, their order, their kinds, the
//! grant rule over them, and their data.
//!
//! A contender's node is `_c_<uuid>-<kind>lock-<sequence>`, the layout of Curator's
//! `InterProcessMutex` with the kind of hold before the `lock-` mark: nothing for an
//! exclusive hold (so a mutex's node is exactly Curator's), `read-` for a reader,
//! `permit-<n>-` for one of `n` permits. The uuid lets a client find a node whose create
//! reply it lost, and the server-assigned sequence (one counter per lock znode, whatever
//! the kind) orders the queue. Every name still ends in `lock-<sequence>`, so contenders
//! that only know the mutex layout (Curator, older versions of this crate) queue in the
//! same order and take every node for an exclusive one: they wait for readers and
//! permits, and readers and permits wait for them. The data is `<count> <owner>`: the
//! hold count of a re-entrant owner, then the owner's identity.

use dlock_core::{HoldKind, OwnerId, MAX_PERMITS};

const NODE_MARK: &str = "_c_";
const LOCK_MARK: &str = "-lock-";
/// What Curator and this crate sort by: the sequence follows the last one.
const SEQUENCE_MARK: &str = "lock-";
const READ_MARK: &str = "read-";
const PERMIT_MARK: &str = "permit-";

/// The path prefix of a contender's node of this kind; the server appends the sequence.
pub(crate) fn node_prefix(lock_path: &str, uuid: &str, kind: HoldKind) -> String {
    match kind {
        HoldKind::Exclusive => format!("{lock_path}/{NODE_MARK}{uuid}-{SEQUENCE_MARK}"),
        HoldKind::Shared => format!("{lock_path}/{NODE_MARK}{uuid}-{READ_MARK}{SEQUENCE_MARK}"),
        HoldKind::Permit { permits } => {
            format!("{lock_path}/{NODE_MARK}{uuid}-{PERMIT_MARK}{permits}-{SEQUENCE_MARK}")
        }
    }
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
    /// The kind of hold the node asks for (exclusive for names without a kind).
    pub(crate) kind: HoldKind,
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
    // `rest[..=end]` keeps the dash that ends the uuid, which the kind marks expect.
    Some(split_kind(&rest[..=end]).0.strip_suffix('-').unwrap_or_default())
}

/// Splits what comes before `lock-` into the rest of the name (ending in its dash) and
/// the kind its mark names. A mark that does not parse (a count out of range) is no
/// mark: such a node counts as exclusive, the kind that is granted beside nothing.
fn split_kind(stem: &str) -> (&str, HoldKind) {
    if let Some(rest) = stem.strip_suffix(READ_MARK) {
        if rest.ends_with('-') {
            return (rest, HoldKind::Shared);
        }
    }
    let permits = stem.strip_suffix('-').and_then(|head| {
        let (rest, digits) = head.rsplit_once('-')?;
        let rest = rest.strip_suffix(PERMIT_MARK.trim_end_matches('-'))?;
        if !rest.ends_with('-') || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let permits = digits.parse::<u32>().ok().filter(|n| (1..=MAX_PERMITS).contains(n))?;
        Some((rest, HoldKind::Permit { permits }))
    });
    permits.unwrap_or((stem, HoldKind::Exclusive))
}

/// Parses a child name as a contender: anything ending in `lock-<digits>`, as Curator
/// sorts them. Other children are not part of the queue.
fn parse(name: &str) -> Option<Contender> {
    let at = name.rfind(SEQUENCE_MARK)?;
    let digits = &name[at + SEQUENCE_MARK.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let kind = split_kind(&name[..at]).1;
    Some(Contender { name: name.to_string(), sequence: digits.parse().ok()?, kind })
}

/// The queue of a lock: its contenders in sequence order, the order the grant rule reads.
pub(crate) fn queue(children: Vec<String>) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children.iter().filter_map(|name| parse(name)).collect();
    queue.sort_by_key(|c| c.sequence);
    queue
}

/// Whether the contender at `position` in `queue` holds (or may take) the lock and, if
/// not, which of the nodes ahead of it to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Its kind is compatible with every node ahead of it.
    Granted,
    /// It waits until one of these nodes (positions in the queue) is deleted: it cannot
    /// be granted before that, and only the deletion of nodes ahead can grant it.
    Wait(Vec<usize>),
}

/// The grant rule, the one of every backend ([`HoldKind::granted_prefix`]): a contender
/// is granted when every node ahead of it is, and its kind may join them:
///
/// - an exclusive node when it is first;
/// - a reader when only readers are ahead of it;
/// - a permit of `n` when only permits are ahead of it, fewer than `n` and fewer than
///   the count of each of them (no holder gets more company than it asked for).
///
/// Counting waiters ahead as if they held gives FIFO order and writer preference: a
/// waiting writer keeps every later reader waiting, and a permit never overtakes an
/// earlier one. No grant depends on a node behind it, so a node once granted stays
/// granted until it is deleted.
///
/// What it watches is a set of nodes one of whose deletions every grant of it needs, so
/// that no release is missed and as few waiters as possible wake for each one: the node
/// just ahead of a writer; the last node of another kind ahead of a reader or permit (all
/// readers behind a writer wake together when it leaves, as they are all granted). A
/// permit of `n` that waits among permits needs either fewer nodes ahead, which takes the
/// deletion of one of the `n` nodes just ahead of it (the nodes further ahead are fewer
/// than the deletions it needs), or a smaller count ahead gone: it watches those `n` and
/// every node ahead with a count below its own.
pub(crate) fn turn(queue: &[Contender], position: usize) -> Turn {
    let Some(own) = queue.get(position) else { return Turn::Wait(Vec::new()) };
    let ahead = &queue[..position];
    let last_other = |same: fn(&HoldKind) -> bool| ahead.iter().rposition(|c| !same(&c.kind));
    match own.kind {
        HoldKind::Exclusive => match position.checked_sub(1) {
            None => Turn::Granted,
            Some(before) => Turn::Wait(vec![before]),
        },
        HoldKind::Shared => match last_other(|k| *k == HoldKind::Shared) {
            None => Turn::Granted,
            Some(writer) => Turn::Wait(vec![writer]),
        },
        HoldKind::Permit { permits } => match last_other(|k| matches!(k, HoldKind::Permit { .. })) {
            Some(other) => Turn::Wait(vec![other]),
            None => {
                let count = |c: &Contender| match c.kind {
                    HoldKind::Permit { permits } => permits as usize,
                    _ => usize::MAX,
                };
                let own = permits as usize;
                let bound = ahead.iter().map(count).min().unwrap_or(usize::MAX).min(own);
                if position < bound {
                    return Turn::Granted;
                }
                let nearest = position.saturating_sub(own)..position;
                let smaller = (0..position).filter(|&at| count(&queue[at]) < own && !nearest.contains(&at));
                let mut watch: Vec<usize> = smaller.chain(nearest.clone()).collect();
                watch.sort_unstable();
                Turn::Wait(watch)
            }
        },
    }
}

/// Which contenders of `queue` are granted by [`turn`]'s rule, in one pass (for
/// `inspect`, which looks at the whole queue).
pub(crate) fn granted(queue: &[Contender]) -> Vec<bool> {
    let kinds: Vec<HoldKind> = queue.iter().map(|c| c.kind).collect();
    let holding = HoldKind::granted_prefix(&kinds);
    (0..queue.len()).map(|position| position < holding).collect()
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
        assert!(node_prefix("/dlock/x", uuid, HoldKind::Exclusive).ends_with("-lock-"));
    }

    fn node(uuid: &str, kind: HoldKind, sequence: u32) -> String {
        let prefix = node_prefix("/dlock/x", uuid, kind);
        format!("{}{sequence:010}", prefix.rsplit('/').next().unwrap())
    }

    #[test]
    fn kinds_are_read_back_from_names() {
        // The last group of a uuid can be all digits: it must not pass for a permit count.
        let uuid = "0e6f3a1c-9a4b-4f55-8d43-123456789012";
        for kind in [
            HoldKind::Exclusive,
            HoldKind::Shared,
            HoldKind::Permit { permits: 1 },
            HoldKind::Permit { permits: MAX_PERMITS },
        ] {
            let name = node(uuid, kind, 42);
            assert_eq!(uuid_of(&name), Some(uuid), "{name}");
            let parsed = parse(&name).unwrap();
            assert_eq!((parsed.kind, parsed.sequence), (kind, 42), "{name}");
        }
        assert_eq!(node(uuid, HoldKind::Exclusive, 7), format!("_c_{uuid}-lock-0000000007"), "Curator's layout");
        // Names of other clients, and marks that do not parse, are exclusive.
        for name in ["lock-0000000001", "_c_x-permit-0-lock-1", "_c_x-permit-1000001-lock-1", "_c_x-permit--lock-1"] {
            assert_eq!(parse(name).unwrap().kind, HoldKind::Exclusive, "{name}");
        }
        assert_eq!(parse("read-lock-1").unwrap().kind, HoldKind::Exclusive);
        assert_eq!(uuid_of("_c_x-permit-3-lock-1"), Some("x"));
        assert_eq!(uuid_of("_c_x-read-lock-1"), Some("x"));
    }

    fn kinds(kinds: &[HoldKind]) -> Vec<Contender> {
        let children = kinds.iter().enumerate().map(|(i, kind)| node(&format!("u{i}"), *kind, i as u32)).collect();
        queue(children)
    }

    #[test]
    fn the_grant_rule_and_what_waiters_watch() {
        use HoldKind::{Exclusive as W, Shared as R};
        const P2: HoldKind = HoldKind::Permit { permits: 2 };
        const P3: HoldKind = HoldKind::Permit { permits: 3 };
        let turns = |q: &[HoldKind]| -> Vec<Turn> {
            let q = kinds(q);
            let turns: Vec<Turn> = (0..q.len()).map(|i| turn(&q, i)).collect();
            let each: Vec<bool> = turns.iter().map(|t| *t == Turn::Granted).collect();
            assert_eq!(granted(&q), each, "the one-pass rule agrees with the rule");
            turns
        };
        let g = || Turn::Granted;
        let w = |v: &[usize]| Turn::Wait(v.to_vec());
        // A mutex: the head holds, everyone watches the node just ahead.
        assert_eq!(turns(&[W, W, W]), [g(), w(&[0]), w(&[1])]);
        // Readers hold together; a writer waits for all of them and keeps later readers
        // out, which watch it (the last writer ahead).
        assert_eq!(turns(&[R, R, W, R, R, W, R]), [g(), g(), w(&[1]), w(&[2]), w(&[2]), w(&[4]), w(&[5])]);
        assert_eq!(turns(&[W, R, R]), [g(), w(&[0]), w(&[0])]);
        // Permits: fewer than n ahead, and fewer than the count of each one ahead; a
        // waiter watches the n nodes just ahead of it and every smaller count ahead.
        const P1: HoldKind = HoldKind::Permit { permits: 1 };
        assert_eq!(turns(&[P2, P2, P2, P2]), [g(), g(), w(&[0, 1]), w(&[1, 2])]);
        assert_eq!(turns(&[P2, P2, P3, P1]), [g(), g(), w(&[0, 1]), w(&[2])]);
        assert_eq!(turns(&[P1, P3, P3, P3, P3])[4], w(&[0, 1, 2, 3]), "a smaller count further ahead is watched too");
        // A larger count never overtakes a smaller one waiting, nor crowds a holder.
        assert_eq!(turns(&[P2, P1, P3]), [g(), w(&[0]), w(&[0, 1])]);
        assert_eq!(turns(&[P1, P3, P3]), [g(), w(&[0]), w(&[0, 1])]);
        assert_eq!(turns(&[P3, P3, P2, P3]), [g(), g(), w(&[0, 1]), w(&[0, 1, 2])]);
        // Kinds exclude each other.
        assert_eq!(turns(&[R, P3, W, P3]), [g(), w(&[0]), w(&[1]), w(&[2])]);
        assert_eq!(turns(&[P3, R, P3]), [g(), w(&[0]), w(&[1])]);
        assert_eq!(turn(&kinds(&[W]), 3), Turn::Wait(Vec::new()));
    }

    #[test]
    fn data_round_trips_owners_with_spaces() {
        let owner = OwnerId::new("job 7: nightly").unwrap();
        assert_eq!(decode_data(&encode_data(&owner, 3)), (owner, 3));
        assert_eq!(decode_data(b"10.0.0.7").0.as_str(), "10.0.0.7");
        assert_eq!(decode_data(b"").0.as_str(), "(unknown)");
    }
}
