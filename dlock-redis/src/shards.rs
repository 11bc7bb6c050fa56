//! Sharded pub/sub on a Redis Cluster (Redis 7 or later): where a client's waiters listen
//! for the releases of locks whose slots move between primaries.
//!
//! Every channel of a lock carries the lock's hash tag, so it hashes to the lock's slot,
//! and the scripts `SPUBLISH` there: the message reaches only the shard (primary and
//! replicas) that serves the slot. A waiter's client `SSUBSCRIBE`s on the primary that
//! serves the channel's slot, over one RESP3 connection per primary it listens on,
//! opened when the first channel of that primary is subscribed.
//!
//! Which primary serves a slot comes from `CLUSTER SLOTS`, asked through the client's
//! command connection (which follows the Cluster's topology, so the seed nodes of the URL
//! may be gone), and is corrected by a `MOVED` answer to `SSUBSCRIBE`. A subscription is
//! *lost* when its slot moves away (the node then unsubscribes its subscribers with a
//! `sunsubscribe` push: a migrated slot, or a primary demoted by a failover) or when its
//! connection breaks or stops answering (a primary killed or frozen): the subscriptions'
//! owner ([`crate::pubsub`]) places them again, on the node that serves the slot then.
//!
//! The redis crate speaks sharded pub/sub only through its Cluster client, whose
//! subscriptions follow slot moves it learns of from its own commands; a connection that
//! only listens sends none, so it would not notice a migrated slot. Here a plain
//! multiplexed connection per node is used instead, with one channel per `SSUBSCRIBE`:
//! its one confirmation is then the command's reply.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Client, ErrorKind, ProtocolVersion, PushInfo, PushKind, ServerErrorKind, Value};
use tokio::sync::mpsc;

use crate::config::{Node, RedisConfig};
use crate::connection::{client, node_info};

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// How many `MOVED` answers one subscription follows before it waits for the next try.
const MAX_REDIRECTS: usize = 3;

/// What a Cluster client's sharded subscriptions need: its command connection (to read
/// the slot map) and how to open a connection to any node (address, TLS, credentials).
#[derive(Clone)]
pub struct ShardNodes {
    commands: ClusterConnection,
    config: RedisConfig,
    ca: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for ShardNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardNodes").finish_non_exhaustive()
    }
}

impl ShardNodes {
    pub(crate) fn new(commands: ClusterConnection, config: RedisConfig, ca: Option<&[u8]>) -> Self {
        ShardNodes { commands, config, ca: ca.map(Arc::from) }
    }

    /// A client for `node`, speaking RESP3 (pushes) with the configured settings.
    fn client(&self, node: &Node) -> redis::RedisResult<Client> {
        let info = node_info(node, &self.config);
        let redis = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        client(info.set_redis_settings(redis), self.ca.as_deref())
    }

    /// Which primary serves each slot, by `CLUSTER SLOTS` through the command connection.
    async fn slot_map(&self) -> redis::RedisResult<SlotMap> {
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut self.commands.clone()).await?;
        Ok(SlotMap::parse(&reply))
    }
}

/// Whether the Cluster's servers speak sharded pub/sub (Redis 7 or later), by the
/// version a primary reports. Unknown (an ACL that refuses `INFO`, say) counts as no:
/// classic pub/sub works on every version.
pub(crate) async fn speak_sharded_pubsub(conn: &mut ClusterConnection) -> bool {
    let info = redis::cmd("INFO").arg("server").clone();
    match conn.route_command(info, RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary)).await {
        Ok(reply) => match text(&reply).as_deref().and_then(major_version) {
            Some(major) => major >= 7,
            None => {
                tracing::debug!("no redis_version in INFO server; using classic pub/sub");
                false
            }
        },
        Err(err) => {
            tracing::debug!(%err, "cannot read the Cluster's version; using classic pub/sub");
            false
        }
    }
}

/// The major version in an `INFO server` text.
fn major_version(info: &str) -> Option<u32> {
    let version = info.lines().find_map(|line| line.strip_prefix("redis_version:"))?;
    version.trim().split('.').next()?.parse().ok()
}

/// The hash slot of a key or channel: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, when not empty), else of the whole, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    crc16(tagged) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Which primary serves which slots, as far as known.
#[derive(Debug, Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, Node)>,
}

impl SlotMap {
    /// The primaries of a `CLUSTER SLOTS` reply: `[start, end, [host, port, id, ..], replicas..]`
    /// per range. A range whose primary has no known address (`?` or empty) is left out:
    /// a `MOVED` names it when it is asked.
    fn parse(reply: &Value) -> Self {
        let mut ranges = Vec::new();
        let Value::Array(entries) = reply else { return SlotMap { ranges } };
        for entry in entries {
            let Value::Array(fields) = entry else { continue };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (fields.first().and_then(int), fields.get(1).and_then(int), fields.get(2))
            else {
                continue;
            };
            let host = primary.first().and_then(text).filter(|h| !h.is_empty() && h != "?");
            let port = primary.get(1).and_then(int);
            if let (Some(host), Some(port), Ok(start), Ok(end)) = (host, port, u16::try_from(start), u16::try_from(end))
            {
                if let Ok(port) = u16::try_from(port) {
                    ranges.push((start, end, Node::new(host, port)));
                }
            }
        }
        SlotMap { ranges }
    }

    fn owner(&self, slot: u16) -> Option<&Node> {
        self.ranges.iter().find(|(start, end, _)| (*start..=*end).contains(&slot)).map(|(_, _, node)| node)
    }

    /// `slot` is served by `node` (a `MOVED` said so): the range that held it is split
    /// around it.
    fn moved(&mut self, slot: u16, node: Node) {
        let mut ranges = Vec::with_capacity(self.ranges.len() + 2);
        for (start, end, owner) in self.ranges.drain(..) {
            if (start..=end).contains(&slot) {
                if start < slot {
                    ranges.push((start, slot - 1, owner.clone()));
                }
                if slot < end {
                    ranges.push((slot + 1, end, owner));
                }
            } else {
                ranges.push((start, end, owner));
            }
        }
        ranges.push((slot, slot, node));
        self.ranges = ranges;
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The address a `MOVED` names (`host:port`, the host possibly an IPv6 address).
fn redirected(err: &redis::RedisError) -> Option<(u16, Node)> {
    let (addr, slot) = err.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((slot, Node::new(host, port.parse().ok()?)))
}

/// How one `SSUBSCRIBE` went.
enum Subscribed {
    Yes,
    /// The slot is served elsewhere.
    Moved(u16, Node),
    /// The server said no, for now.
    Refused,
    /// The connection cannot be used any more.
    Broken,
}

/// One primary's connection, with the id its pushes carry.
struct NodeLink {
    id: u64,
    conn: MultiplexedConnection,
}

/// What the sharded subscriptions tell their owner.
pub(crate) enum ShardEvent {
    /// A message on a channel.
    Message { channel: String, payload: Vec<u8> },
    /// These channels are no longer subscribed anywhere: their slot moved, or their
    /// node's connection broke.
    Lost(Vec<String>),
}

/// A client's sharded subscriptions: the connections to the primaries it listens on, and
/// which channel is subscribed on which.
pub(crate) struct Shards {
    nodes: ShardNodes,
    connect_timeout: Duration,
    op_timeout: Duration,
    slots: SlotMap,
    /// By address (`host:port`).
    links: HashMap<String, NodeLink>,
    /// Each subscribed channel's link id.
    placed: HashMap<String, u64>,
    /// The `SUNSUBSCRIBE`s sent and not yet echoed, by link id and channel: their
    /// confirmation pushes are not the server's unsubscribing of a moved slot.
    unsubscribing: HashMap<(u64, String), usize>,
    pushes: mpsc::UnboundedReceiver<(u64, PushInfo)>,
    push_sender: mpsc::UnboundedSender<(u64, PushInfo)>,
    next_link: u64,
    /// Channels lost and not yet reported.
    lost: Vec<String>,
}

impl Shards {
    /// No connection yet: the first subscription opens one.
    pub(crate) fn new(nodes: ShardNodes, connect_timeout: Duration, op_timeout: Duration) -> Self {
        let (push_sender, pushes) = mpsc::unbounded_channel();
        Shards {
            nodes,
            connect_timeout,
            op_timeout,
            slots: SlotMap::default(),
            links: HashMap::new(),
            placed: HashMap::new(),
            unsubscribing: HashMap::new(),
            pushes,
            push_sender,
            next_link: 0,
            lost: Vec::new(),
        }
    }

    /// `SSUBSCRIBE`s each of `channels` on the primary that serves its slot (one slot
    /// map read and one connection per primary for them all), following `MOVED`. Returns
    /// those subscribed now; the others (their primary cannot be reached, or the Cluster
    /// cannot say which it is) are for the caller to try again later.
    pub(crate) async fn subscribe(&mut self, channels: &[String]) -> Vec<String> {
        let mut subscribed: Vec<String> = channels.iter().filter(|c| self.placed.contains_key(*c)).cloned().collect();
        let mut todo: Vec<(String, u16)> = channels
            .iter()
            .filter(|c| !self.placed.contains_key(*c))
            .map(|c| (c.clone(), slot(c.as_bytes())))
            .collect();
        for _ in 0..=MAX_REDIRECTS {
            if todo.is_empty() {
                break;
            }
            if todo.iter().any(|(_, slot)| self.slots.owner(*slot).is_none()) {
                self.read_slot_map().await;
            }
            let mut by_node: HashMap<String, (Node, Vec<(String, u16)>)> = HashMap::new();
            for (channel, slot) in todo.drain(..) {
                if let Some(node) = self.slots.owner(slot) {
                    by_node
                        .entry(node.to_string())
                        .or_insert_with(|| (node.clone(), Vec::new()))
                        .1
                        .push((channel, slot));
                }
            }
            for (node, group) in by_node.into_values() {
                let Some((id, conn)) = self.link(&node).await else {
                    // Perhaps not the owner any more (a primary killed, its replica promoted).
                    self.slots = SlotMap::default();
                    continue;
                };
                for (channel, slot) in group {
                    match self.subscribe_on(&node, (id, conn.clone()), &channel).await {
                        Subscribed::Yes => {
                            self.placed.insert(channel.clone(), id);
                            subscribed.push(channel);
                        }
                        Subscribed::Moved(moved, owner) => {
                            self.slots.moved(moved, owner);
                            todo.push((channel, slot));
                        }
                        Subscribed::Refused => self.slots = SlotMap::default(),
                        Subscribed::Broken => {
                            self.drop_link(&node.to_string());
                            self.slots = SlotMap::default();
                            break;
                        }
                    }
                }
            }
        }
        subscribed
    }

    /// One `SSUBSCRIBE` on `node`'s connection.
    async fn subscribe_on(
        &self,
        node: &Node,
        (id, mut conn): (u64, MultiplexedConnection),
        channel: &str,
    ) -> Subscribed {
        let ssubscribe = redis::cmd("SSUBSCRIBE").arg(channel).clone();
        match tokio::time::timeout(self.op_timeout, ssubscribe.query_async::<Value>(&mut conn)).await {
            Ok(Ok(Value::Push { kind: PushKind::SSubscribe, data })) if first_is(&data, channel) => Subscribed::Yes,
            Ok(Err(err)) if err.kind() == ErrorKind::Server(ServerErrorKind::Moved) => match redirected(&err) {
                Some((slot, owner)) => Subscribed::Moved(slot, owner),
                None => Subscribed::Refused,
            },
            Ok(Err(err)) if !err.is_unrecoverable_error() && !err.is_io_error() => {
                // CLUSTERDOWN, TRYAGAIN, an ACL refusal: the connection itself is fine.
                tracing::debug!(%err, channel, %node, "SSUBSCRIBE refused; trying again later");
                Subscribed::Refused
            }
            other => {
                // Broken, silent, or answered out of turn: its pairing of requests and
                // replies cannot be trusted any more.
                match other {
                    Ok(Err(err)) => tracing::debug!(%err, %node, link = id, "a sharded pub/sub connection broke"),
                    Ok(Ok(reply)) => tracing::debug!(?reply, %node, "an SSUBSCRIBE answered out of turn"),
                    Err(_) => tracing::debug!(%node, "an SSUBSCRIBE got no answer in time"),
                }
                Subscribed::Broken
            }
        }
    }

    /// Reads the slot map again, within the operation timeout.
    async fn read_slot_map(&mut self) {
        match tokio::time::timeout(self.op_timeout, self.nodes.slot_map()).await {
            Ok(Ok(map)) => self.slots = map,
            Ok(Err(err)) => tracing::debug!(%err, "cannot read the Cluster's slot map"),
            Err(_) => tracing::debug!("reading the Cluster's slot map timed out"),
        }
    }

    /// `SUNSUBSCRIBE`s `channel` where it is subscribed.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) {
        let Some(id) = self.placed.remove(channel) else { return };
        let Some(addr) = self.links.iter().find(|(_, link)| link.id == id).map(|(addr, _)| addr.clone()) else {
            return;
        };
        let key = (id, channel.to_string());
        *self.unsubscribing.entry(key.clone()).or_default() += 1;
        let mut conn = self.links[&addr].conn.clone();
        let reply = tokio::time::timeout(
            self.op_timeout,
            redis::cmd("SUNSUBSCRIBE").arg(channel).query_async::<Value>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(_)) => {}
            Ok(Err(err)) if !err.is_unrecoverable_error() && !err.is_io_error() => {
                // Refused (the slot moved away): no confirmation will come.
                self.echoed(&key);
            }
            _ => self.drop_link(&addr),
        }
    }

    /// Checks every connection with a `PING`; one that fails or is silent for the
    /// operation timeout is closed, and its channels are lost.
    pub(crate) async fn check(&mut self) {
        let links: Vec<(String, MultiplexedConnection)> =
            self.links.iter().map(|(addr, link)| (addr.clone(), link.conn.clone())).collect();
        let timeout = self.op_timeout;
        let pings = links.into_iter().map(|(addr, mut conn)| async move {
            let pong = tokio::time::timeout(timeout, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
            (addr, matches!(pong, Ok(Ok(_))))
        });
        for (addr, alive) in futures::future::join_all(pings).await {
            if !alive {
                tracing::debug!(%addr, "a sharded pub/sub connection does not answer");
                self.drop_link(&addr);
            }
        }
    }

    /// The next message, or channels lost. Never ends (while no primary is connected, it
    /// waits).
    pub(crate) async fn next(&mut self) -> ShardEvent {
        loop {
            if !self.lost.is_empty() {
                return ShardEvent::Lost(std::mem::take(&mut self.lost));
            }
            let Some((id, push)) = self.pushes.recv().await else {
                // Never: the sender is held here.
                std::future::pending::<()>().await;
                continue;
            };
            match push.kind {
                PushKind::SMessage => {
                    if let (Some(channel), Some(Value::BulkString(payload))) =
                        (push.data.first().and_then(text), push.data.get(1))
                    {
                        return ShardEvent::Message { channel, payload: payload.clone() };
                    }
                }
                PushKind::SUnsubscribe => {
                    let Some(channel) = push.data.first().and_then(text) else { continue };
                    let key = (id, channel);
                    if self.unsubscribing.contains_key(&key) {
                        self.echoed(&key);
                    } else if self.placed.get(&key.1) == Some(&id) {
                        // The node dropped the subscription: the slot is no longer its own.
                        tracing::debug!(channel = %key.1, "a channel's slot moved; subscribing where it is now");
                        self.placed.remove(&key.1);
                        self.slots = SlotMap::default();
                        return ShardEvent::Lost(vec![key.1]);
                    }
                }
                PushKind::Disconnection => {
                    if let Some(addr) = self.links.iter().find(|(_, link)| link.id == id).map(|(a, _)| a.clone()) {
                        tracing::debug!(%addr, "a sharded pub/sub connection closed");
                        self.drop_link(&addr);
                    }
                }
                _ => {}
            }
        }
    }

    fn echoed(&mut self, key: &(u64, String)) {
        if let Some(count) = self.unsubscribing.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                self.unsubscribing.remove(key);
            }
        }
    }

    /// The connection to `node`, opened (within the connect timeout) if there is none.
    async fn link(&mut self, node: &Node) -> Option<(u64, MultiplexedConnection)> {
        let addr = node.to_string();
        if let Some(link) = self.links.get(&addr) {
            return Some((link.id, link.conn.clone()));
        }
        let id = self.next_link;
        self.next_link += 1;
        let pushes = self.push_sender.clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_push_sender(move |push: PushInfo| pushes.send((id, push)));
        let open = async { self.nodes.client(node)?.get_multiplexed_async_connection_with_config(&config).await };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Ok(conn)) => {
                self.links.insert(addr, NodeLink { id, conn: conn.clone() });
                Some((id, conn))
            }
            Ok(Err(err)) => {
                tracing::debug!(%err, %node, "cannot open a sharded pub/sub connection");
                None
            }
            Err(_) => {
                tracing::debug!(%node, "opening a sharded pub/sub connection timed out");
                None
            }
        }
    }

    /// Closes the connection to `addr`: its channels are lost.
    fn drop_link(&mut self, addr: &str) {
        let Some(link) = self.links.remove(addr) else { return };
        let lost: Vec<String> =
            self.placed.iter().filter(|(_, id)| **id == link.id).map(|(channel, _)| channel.clone()).collect();
        for channel in &lost {
            self.placed.remove(channel);
        }
        self.unsubscribing.retain(|(id, _), _| *id != link.id);
        self.lost.extend(lost);
    }
}

/// Whether a confirmation's first element is `channel`.
fn first_is(data: &[Value], channel: &str) -> bool {
    data.first().and_then(text).is_some_and(|c| c == channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_computes() {
        // As `CLUSTER KEYSLOT` answers.
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"dlock:{a%2Fb}:released"), slot(b"dlock:{a%2Fb}:wake:c1"));
    }

    #[test]
    fn versions_are_read_from_info() {
        assert_eq!(major_version("# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n"), Some(7));
        assert_eq!(major_version("redis_version:6.2.14\n"), Some(6));
        assert_eq!(major_version("# Server\n"), None);
    }

    #[test]
    fn a_slot_map_is_read_from_cluster_slots_and_corrected_by_moved() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(b"id".to_vec())])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("127.0.0.1", 7000), node("127.0.0.1", 7003)]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("?", 7001)]),
            Value::Array(vec![Value::Int(10923), Value::Int(16383), node("127.0.0.1", 7002)]),
        ]);
        let mut map = SlotMap::parse(&reply);
        assert_eq!(map.owner(0), Some(&Node::new("127.0.0.1", 7000)));
        assert_eq!(map.owner(5460).map(|n| n.port), Some(7000));
        assert_eq!(map.owner(6000), None, "a primary without an address is left to MOVED");
        assert_eq!(map.owner(16383).map(|n| n.port), Some(7002));
        map.moved(100, Node::new("127.0.0.1", 7002));
        assert_eq!(map.owner(100).map(|n| n.port), Some(7002));
        assert_eq!(map.owner(99).map(|n| n.port), Some(7000));
        assert_eq!(map.owner(101).map(|n| n.port), Some(7000));
        map.moved(0, Node::new("127.0.0.1", 7001));
        assert_eq!(map.owner(0).map(|n| n.port), Some(7001));
        assert_eq!(map.owner(1).map(|n| n.port), Some(7000));
        map.moved(6000, Node::new("127.0.0.1", 7001));
        assert_eq!(map.owner(6000).map(|n| n.port), Some(7001));
        assert_eq!(map.ranges.len(), 6);
        assert!(SlotMap::parse(&Value::Nil).ranges.is_empty());
    }
}
