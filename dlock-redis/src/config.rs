//! How to reach Redis: the deployment (one server, a Cluster, or a master found through
//! Sentinel), credentials, TLS, timeouts, the key prefix and replica acknowledgement,
//! read from a URL or set with builder methods.

use std::fmt;
use std::time::Duration;

use dlock_core::{parse_duration, BackendUrl, ConnectConfig, ConnectOptions, Given, HostPort, LockError};

use crate::access::{AccessConfig, ServerAccess};
use crate::keys::KeyLayout;

/// The port of a Redis server when the URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// The port of a Sentinel when the URL names none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The URL schemes this crate accepts, for a facade that picks a backend by scheme.
pub const SCHEMES: &[&str] =
    &["redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"];

/// One `host:port`.
pub type Node = HostPort;

/// Which Redis deployment the locks live on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (a master, possibly with replicas that the client never talks to).
    Single(Node),
    /// A Redis Cluster, found through any of these seed nodes.
    Cluster(Vec<Node>),
    /// The current master of the Sentinel-monitored group `master`, found through these
    /// Sentinels (and found again after a failover).
    Sentinel {
        /// Sentinel addresses.
        sentinels: Vec<Node>,
        /// The monitored group's name (`sentinel monitor <name> ...`).
        master: String,
    },
}

/// Replica acknowledgement after each grant and renewal: `WAIT replicas timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    /// How many replicas must have the write.
    pub replicas: u32,
    /// How long the server waits for them.
    pub timeout: Duration,
}

/// The settings of a Redis lock client.
///
/// The timeouts and the key prefix are the [`ConnectOptions`] every backend shares, set
/// and read through [`ConnectConfig`] (re-exported by this crate); TLS, the credentials
/// and the database are the [`ServerAccess`] it shares with
/// [`RedLockConfig`](crate::RedLockConfig), set and read through [`AccessConfig`].
///
/// ```
/// use std::time::Duration;
/// use dlock_redis::{AccessConfig, ConnectConfig, RedisConfig, Topology};
///
/// let config = RedisConfig::from_url("redis://app:s3cret@cache.internal:6380/2?op_timeout=500ms&prefix=shop")?;
/// assert_eq!(config.db(), 2);
/// assert_eq!(config.op_timeout(), Duration::from_millis(500));
/// assert_eq!(config.prefix(), "shop");
///
/// // The same with the builder.
/// let built = RedisConfig::single("cache.internal", 6380)
///     .with_credentials("app", "s3cret")
///     .with_db(2)
///     .with_op_timeout(Duration::from_millis(500))
///     .with_prefix("shop");
/// assert_eq!(built, config);
///
/// let cluster = RedisConfig::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000")?;
/// assert!(matches!(cluster.topology(), Topology::Cluster(nodes) if nodes.len() == 2));
///
/// let sentinel = RedisConfig::from_url("redis+sentinel://10.0.0.5,10.0.0.6/orders?wait_replicas=1")?;
/// assert!(matches!(sentinel.topology(), Topology::Sentinel { master, .. } if master == "orders"));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    topology: Topology,
    access: ServerAccess,
    // Apart rather than a pair, as in `ServerAccess`.
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
    common: ConnectOptions,
    replica_ack: Option<ReplicaAck>,
    /// Cluster nodes reached elsewhere than they announce themselves: (announced, reached).
    node_addresses: Vec<(Node, Node)>,
    /// The application's own client, if it gave one.
    given: Option<Given<redis::Client>>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology)
            .field("access", &self.access)
            .field("sentinel_user", &self.sentinel_user)
            .field("sentinel_password", &self.sentinel_password.as_ref().map(|_| "<redacted>"))
            .field("common", &self.common)
            .field("replica_ack", &self.replica_ack)
            .field("node_addresses", &self.node_addresses)
            .field("given_client", &self.given.is_some())
            .finish()
    }
}

impl RedisConfig {
    /// One server at `host:port`, with the defaults of [`ConnectOptions`].
    pub fn single(host: impl Into<String>, port: u16) -> Self {
        Self::with_topology(Topology::Single(Node::new(host, port)))
    }

    /// A Redis Cluster reached through these seed nodes.
    pub fn cluster(seeds: impl IntoIterator<Item = Node>) -> Self {
        Self::with_topology(Topology::Cluster(seeds.into_iter().collect()))
    }

    /// The master of the Sentinel group `master`, found through these Sentinels.
    pub fn sentinel(sentinels: impl IntoIterator<Item = Node>, master: impl Into<String>) -> Self {
        Self::with_topology(Topology::Sentinel { sentinels: sentinels.into_iter().collect(), master: master.into() })
    }

    fn with_topology(topology: Topology) -> Self {
        RedisConfig {
            topology,
            access: ServerAccess::default(),
            sentinel_user: None,
            sentinel_password: None,
            common: ConnectOptions::default(),
            replica_ack: None,
            node_addresses: Vec::new(),
            given: None,
        }
    }

    /// Locks on the server of the application's own `redis::Client` (redis 1.x, also
    /// re-exported as [`crate::redis`]): the lock's connections are made from it, with
    /// its address, TLS settings, credentials and database, so that nothing about the
    /// server is configured twice. The client opens its own connections from it: one for
    /// commands (a connection manager, which reconnects), one for the pub/sub wake-ups,
    /// and with [`with_replica_ack`](Self::with_replica_ack) a few more for `WAIT`.
    /// One server only (a Cluster or Sentinel client is configured by URL);
    /// `InvalidInput` for a client of a Unix socket.
    ///
    /// ```
    /// use dlock_core::ConnectConfig;
    /// use dlock_redis::RedisConfig;
    ///
    /// let client = dlock_redis::redis::Client::open("redis://:secret@10.0.0.5:6380/2")?;
    /// let config = RedisConfig::from_client(client)?.with_prefix("shop");
    /// assert_eq!(config.target(), "redis://10.0.0.5:6380/2 prefix shop");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_client(client: redis::Client) -> Result<Self, LockError> {
        let info = client.get_connection_info();
        let (host, port, tls) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port, false),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port, true),
            other => {
                return Err(LockError::InvalidInput(format!(
                    "a Redis client of {other}: the lock needs one that connects over TCP"
                )))
            }
        };
        let mut config = Self::single(host, port);
        config.access.tls = tls;
        config.access.db = info.redis_settings().db();
        config.given = Some(Given::new(client));
        Ok(config)
    }

    /// The application's own client, if the config was made from one.
    pub(crate) fn given_client(&self) -> Option<&redis::Client> {
        self.given.as_ref().map(Given::get)
    }

    /// Parses a URL:
    ///
    /// - `redis://[user[:password]@]host[:port][/db]` (`rediss://` for TLS): one server;
    /// - `redis+cluster://[user[:password]@]host:port,host:port,...`: a Cluster, through
    ///   its seed nodes;
    /// - `redis+sentinel://[user[:password]@]host:port,.../master[/db]`: the master of a
    ///   Sentinel group (the credentials are the master's; `sentinel_username` and
    ///   `sentinel_password` give the Sentinels' own).
    ///
    /// Query options: `connect_timeout`, `op_timeout`, `prefix` (as every backend);
    /// `wait_replicas=N` with `wait_timeout=<duration>` (default 100ms) to demand that N
    /// replicas acknowledge each grant and renewal; on a Cluster, `node_address=<announced
    /// host:port>=<host:port>` (once per node) to reach a node elsewhere than it announces
    /// itself (see [`with_node_address`](Self::with_node_address)); `keep_idle=<duration>`, how long a
    /// name's fence counter outlives its last use (default an hour, see
    /// [`ConnectConfig::with_keep_idle`]); `tls_ca=<path>`, a PEM file of the CA
    /// certificates to trust instead of the system's (with `rediss`). Unknown options are
    /// `InvalidInput`.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase()).unwrap_or_default();
        let (tls, kind) = match scheme.as_str() {
            "redis" => (false, Kind::Single),
            "rediss" => (true, Kind::Single),
            "redis+cluster" => (false, Kind::Cluster),
            "rediss+cluster" => (true, Kind::Cluster),
            "redis+sentinel" => (false, Kind::Sentinel),
            "rediss+sentinel" => (true, Kind::Sentinel),
            _ => {
                return Err(LockError::InvalidInput(format!(
                    "bad Redis URL {}: unknown scheme (use one of {})",
                    redact(url),
                    SCHEMES.join(", ")
                )))
            }
        };
        let default_port = if kind == Kind::Sentinel { DEFAULT_SENTINEL_PORT } else { DEFAULT_PORT };
        let parsed = BackendUrl::parse(url, default_port)?;
        let bad = |why: &str| parsed.invalid(why);
        let segments: Vec<&str> = parsed.path.split('/').filter(|s| !s.is_empty()).collect();
        let (master, db) = match kind {
            Kind::Sentinel => match segments.as_slice() {
                [master] => (Some(master.to_string()), None),
                [master, db] => (Some(master.to_string()), Some(*db)),
                _ => return Err(bad("expected /<master name>[/<db>] after the Sentinel addresses")),
            },
            _ => match segments.as_slice() {
                [] => (None, None),
                [db] => (None, Some(*db)),
                _ => return Err(bad("expected at most /<db> after the address")),
            },
        };
        let nodes = parsed.hosts.clone();
        let mut config = match kind {
            Kind::Single => {
                if nodes.len() != 1 {
                    return Err(bad("one host expected (use redis+cluster:// for several)"));
                }
                Self::with_topology(Topology::Single(nodes.into_iter().next().expect("one node")))
            }
            Kind::Cluster => Self::cluster(nodes),
            Kind::Sentinel => Self::sentinel(nodes, master.expect("sentinel master parsed")),
        };
        let (access, rest) = ServerAccess::from_url(&parsed, tls, db)?;
        config.access = access;
        config.common = parsed.options.clone();
        let mut replicas = None;
        let mut wait_timeout = None;
        for (key, value) in rest {
            match key.as_str() {
                "wait_replicas" => {
                    replicas = Some(value.parse::<u32>().map_err(|_| bad("wait_replicas must be a number"))?);
                }
                "wait_timeout" => wait_timeout = Some(parse_duration(&value)?),
                "sentinel_username" => config.sentinel_user = Some(value),
                "sentinel_password" => config.sentinel_password = Some(value),
                "node_address" => {
                    let (announced, reached) = value
                        .split_once('=')
                        .ok_or_else(|| bad("node_address must be <announced host:port>=<host:port>"))?;
                    let node = |text: &str| parse_node(text).map_err(|why| bad(&format!("node_address: {why}")));
                    config = config.with_node_address(node(announced)?, node(reached)?);
                }
                other => return Err(bad(&format!("unknown option {other:?}"))),
            }
        }
        match (replicas, wait_timeout) {
            (Some(replicas), timeout) => {
                config.replica_ack =
                    Some(ReplicaAck { replicas, timeout: timeout.unwrap_or(Duration::from_millis(100)) });
            }
            (None, Some(_)) => return Err(bad("wait_timeout needs wait_replicas")),
            (None, None) => {}
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings together; [`connect`](crate::connect) calls it too.
    pub fn validate(&self) -> Result<(), LockError> {
        let bad = |why: String| Err(LockError::InvalidInput(why));
        KeyLayout::new(self.prefix())?;
        if self.given.is_some()
            && (self.access.user.is_some() || self.access.password.is_some() || self.access.tls_ca.is_some())
        {
            return bad(
                "credentials and TLS belong to the application's redis::Client, not to the lock's config".into()
            );
        }
        if matches!(&self.topology, Topology::Sentinel { master, .. } if master.is_empty()) {
            return bad("the Sentinel master name is empty".into());
        }
        let nodes = self.addresses();
        if nodes.is_empty() {
            return bad("no Redis address given".into());
        }
        if nodes.iter().any(|n| n.host.is_empty() || n.port == 0) {
            return bad("a Redis address has an empty host or port 0".into());
        }
        self.access.validate("rediss")?;
        if matches!(self.topology, Topology::Cluster(_)) && self.access.db != 0 {
            return bad("a Redis Cluster has only database 0".into());
        }
        if !self.node_addresses.is_empty() && !matches!(self.topology, Topology::Cluster(_)) {
            return bad("node_address applies to the nodes of a Redis Cluster".into());
        }
        if self.node_addresses.iter().any(|(a, r)| [a, r].iter().any(|n| n.host.is_empty() || n.port == 0)) {
            return bad("a node_address has an empty host or port 0".into());
        }
        self.common.validate()?;
        if let Some(ack) = self.replica_ack {
            if ack.replicas == 0 {
                return bad("wait_replicas must be at least 1".into());
            }
            // WAIT 0 would block forever; a wait at least as long as an operation would
            // turn every grant into a timeout.
            if ack.timeout < Duration::from_millis(1) || ack.timeout >= self.op_timeout() {
                return bad(format!(
                    "wait_timeout {:?} must be at least 1ms and below op_timeout {:?}",
                    ack.timeout,
                    self.op_timeout()
                ));
            }
        }
        Ok(())
    }

    /// Authenticates to the Sentinels as this ACL user, with this password, when their
    /// credentials differ from the master's (URL options `sentinel_username` and
    /// `sentinel_password`). Only a Sentinel deployment uses them.
    ///
    /// ```
    /// use dlock_redis::{AccessConfig, Node, RedisConfig};
    ///
    /// let config = RedisConfig::sentinel([Node::new("10.0.0.5", 26379)], "orders")
    ///     .with_credentials("app", "s3cret")
    ///     .with_sentinel_credentials("watcher", "hunter2");
    /// assert_eq!((config.sentinel_user(), config.sentinel_password()), (Some("watcher"), Some("hunter2")));
    /// assert_eq!(config.user(), Some("app"));
    /// ```
    pub fn with_sentinel_credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.sentinel_user = Some(user.into());
        self.sentinel_password = Some(password.into());
        self
    }

    /// Authenticates to the Sentinels with a password alone (Sentinels protected by
    /// `requirepass`), when it differs from the master's.
    ///
    /// ```
    /// use dlock_redis::{Node, RedisConfig};
    ///
    /// let config = RedisConfig::sentinel([Node::new("10.0.0.5", 26379)], "orders").with_sentinel_password("hunter2");
    /// assert_eq!((config.sentinel_user(), config.sentinel_password()), (None, Some("hunter2")));
    /// ```
    pub fn with_sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_user = None;
        self.sentinel_password = Some(password.into());
        self
    }

    /// Demands that `replicas` replicas acknowledge each grant and renewal within
    /// `timeout` (`WAIT`); a grant they do not acknowledge is given back and fails with
    /// `QuorumNotReached`.
    pub fn with_replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some(ReplicaAck { replicas, timeout });
        self
    }

    /// Reaches the Cluster node that announces itself as `announced` (in `CLUSTER SLOTS`
    /// and in `MOVED` and `ASK` redirections) at `reached` instead, for nodes behind a NAT
    /// or a port mapping (a Cluster in Docker announces addresses of its own network), or
    /// whose TLS certificate names a host rather than the IP they announce. Every
    /// connection the client opens to that node goes to `reached`: commands, `WAIT`, the
    /// waiters' sharded pub/sub, a seed given as `announced`; the slot map keeps the
    /// announced addresses, so redirections are still understood. A Cluster only
    /// ([`validate`](Self::validate) refuses it elsewhere).
    ///
    /// ```
    /// use dlock_redis::{Node, RedisConfig};
    ///
    /// let config = RedisConfig::from_url(
    ///     "redis+cluster://172.18.0.2:6379?node_address=172.18.0.2:6379=127.0.0.1:7000&node_address=172.18.0.3:6379=127.0.0.1:7001",
    /// )?;
    /// assert_eq!(config.node_addresses()[1], (Node::new("172.18.0.3", 6379), Node::new("127.0.0.1", 7001)));
    /// let built = RedisConfig::cluster([Node::new("172.18.0.2", 6379)])
    ///     .with_node_address(Node::new("172.18.0.2", 6379), Node::new("127.0.0.1", 7000))
    ///     .with_node_address(Node::new("172.18.0.3", 6379), Node::new("127.0.0.1", 7001));
    /// assert_eq!(built, config);
    /// assert!(RedisConfig::single("h", 1).with_node_address(Node::new("a", 1), Node::new("b", 2)).validate().is_err());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with_node_address(mut self, announced: Node, reached: Node) -> Self {
        self.node_addresses.retain(|(a, _)| *a != announced);
        self.node_addresses.push((announced, reached));
        self
    }

    /// The Cluster nodes reached elsewhere than they announce themselves: (announced,
    /// reached).
    pub fn node_addresses(&self) -> &[(Node, Node)] {
        &self.node_addresses
    }

    /// Where the client connects to reach `node`: the address
    /// [`with_node_address`](Self::with_node_address) gives it, else its own.
    pub(crate) fn reached_at<'a>(&'a self, node: &'a Node) -> &'a Node {
        self.node_addresses.iter().find(|(announced, _)| announced == node).map_or(node, |(_, reached)| reached)
    }

    /// Where the locks live, without credentials: the scheme, the server (the Cluster's
    /// seed nodes, or the Sentinels and the master's name), the database and the key
    /// prefix. Clients with the same target share their locks; what
    /// [`Locker::target`](dlock_core::Locker::target) tells.
    ///
    /// ```
    /// use dlock_redis::{ConnectConfig, RedisConfig};
    ///
    /// let config = RedisConfig::from_url("redis://app:s3cret@10.0.0.5:6379/2?prefix=shop")?;
    /// assert_eq!(config.target(), "redis://10.0.0.5:6379/2 prefix shop");
    /// let cluster = RedisConfig::from_url("rediss+cluster://b:7001,a:7000")?;
    /// assert_eq!(cluster.target(), "rediss+cluster://a:7000,b:7001/0 prefix dlock");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn target(&self) -> String {
        let tls = if self.access.tls { "s" } else { "" };
        let (scheme, place) = match &self.topology {
            Topology::Single(node) => ("", node.to_string()),
            // Seeds and Sentinels are sets: listed in any order, they are the same place.
            Topology::Cluster(seeds) => ("+cluster", sorted(seeds)),
            Topology::Sentinel { sentinels, master } => ("+sentinel", format!("{}/{master}", sorted(sentinels))),
        };
        format!("redis{tls}{scheme}://{place}/{} prefix {}", self.access.db, self.prefix())
    }

    /// The deployment.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The Sentinels' ACL user name, if any.
    ///
    /// ```
    /// use dlock_redis::RedisConfig;
    ///
    /// let config = RedisConfig::from_url("redis+sentinel://s1/orders?sentinel_username=watcher&sentinel_password=x")?;
    /// assert_eq!(config.sentinel_user(), Some("watcher"));
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn sentinel_user(&self) -> Option<&str> {
        self.sentinel_user.as_deref()
    }

    /// The Sentinels' password, if any.
    ///
    /// ```
    /// use dlock_redis::RedisConfig;
    ///
    /// let config = RedisConfig::from_url("redis+sentinel://s1/orders?sentinel_password=x")?;
    /// assert_eq!((config.sentinel_user(), config.sentinel_password()), (None, Some("x")));
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn sentinel_password(&self) -> Option<&str> {
        self.sentinel_password.as_deref()
    }

    /// The replica acknowledgement demanded, if any.
    pub fn replica_ack(&self) -> Option<ReplicaAck> {
        self.replica_ack
    }
}

/// `with_connect_timeout`, `with_op_timeout`, `with_prefix` and their getters. The
/// connect timeout bounds connecting (and loading the scripts); the operation timeout,
/// one lock operation. The prefix may not contain `{` or `}`, which would break the hash
/// tag that keeps a lock's keys in one Cluster slot: [`validate`](RedisConfig::validate)
/// and `connect` refuse it.
///
/// ```
/// use std::time::Duration;
/// use dlock_redis::{ConnectConfig, RedisConfig};
///
/// let config = RedisConfig::single("127.0.0.1", 6379)
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_op_timeout(Duration::from_millis(500))
///     .with_prefix("shop");
/// assert_eq!(config.connect_timeout(), Duration::from_secs(2));
/// assert_eq!(config.op_timeout(), Duration::from_millis(500));
/// assert_eq!(config.prefix(), "shop");
/// assert!(config.with_prefix("a{b").validate().is_err());
/// ```
impl ConnectConfig for RedisConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

/// `with_tls`, `with_tls_ca`, `with_credentials`, `with_password`, `with_db` and their
/// getters. The credentials are those of the server, of every Cluster node or of the
/// master a Sentinel names (the Sentinels' own are
/// [`with_sentinel_credentials`](RedisConfig::with_sentinel_credentials)). A Cluster has
/// only database 0: [`validate`](RedisConfig::validate) and `connect` refuse another.
///
/// ```
/// use dlock_redis::{AccessConfig, Node, RedisConfig};
///
/// let config = RedisConfig::cluster([Node::new("10.0.0.1", 7000)]).with_tls(true).with_credentials("app", "s3cret");
/// assert!(config.validate().is_ok());
/// assert!(config.with_db(1).validate().is_err());
/// ```
impl RedisConfig {
    /// The addresses the client connects to first: the server, the Cluster's seeds, or
    /// the Sentinels.
    pub(crate) fn addresses(&self) -> &[Node] {
        match &self.topology {
            Topology::Single(node) => std::slice::from_ref(node),
            Topology::Cluster(nodes) => nodes.as_slice(),
            Topology::Sentinel { sentinels, .. } => sentinels.as_slice(),
        }
    }
}

impl AccessConfig for RedisConfig {
    fn access(&self) -> &ServerAccess {
        &self.access
    }

    fn access_mut(&mut self) -> &mut ServerAccess {
        &mut self.access
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    Cluster,
    Sentinel,
}

pub(crate) use dlock_core::redact;

/// `host:port` or `[v6]:port`, the port required.
fn parse_node(text: &str) -> Result<Node, String> {
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").ok_or_else(|| format!("{text:?} is not [host]:port"))?,
        None => text
            .rsplit_once(':')
            .filter(|(h, _)| !h.contains(':'))
            .ok_or_else(|| format!("{text:?} is not host:port"))?,
    };
    let port = port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("bad port in {text:?}"))?;
    if host.is_empty() || host.contains(['/', '@', '?', '#', '%', ' ', '\0', '[', ']', '=', ',']) {
        return Err(format!("bad host in {text:?}"));
    }
    Ok(Node::new(host, port))
}

/// `nodes` as `host:port` in one order, whatever order they were given in.
pub(crate) fn sorted(nodes: &[Node]) -> String {
    let mut nodes: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    nodes.sort();
    nodes.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_server_urls() {
        let c = RedisConfig::from_url("redis://localhost").unwrap();
        assert_eq!(c.topology(), &Topology::Single(Node::new("localhost", 6379)));
        assert!(!c.tls());
        assert_eq!(c.db(), 0);
        assert_eq!(c.prefix(), "dlock");

        let c = RedisConfig::from_url("rediss://u%40x:p%3Aw@[::1]:7000/3?connect_timeout=2s").unwrap();
        assert_eq!(c.topology(), &Topology::Single(Node::new("::1", 7000)));
        assert!(c.tls());
        assert_eq!((c.user(), c.password()), (Some("u@x"), Some("p:w")));
        assert_eq!(c.db(), 3);
        assert_eq!(c.connect_timeout(), Duration::from_secs(2));

        let c = RedisConfig::from_url("redis://:onlypass@h:1").unwrap();
        assert_eq!((c.user(), c.password()), (None, Some("onlypass")));
    }

    #[test]
    fn parses_cluster_and_sentinel_urls() {
        let c = RedisConfig::from_url("redis+cluster://a:1,b:2,c").unwrap();
        assert_eq!(c.topology(), &Topology::Cluster(vec![Node::new("a", 1), Node::new("b", 2), Node::new("c", 6379)]));
        let c = RedisConfig::from_url("rediss+sentinel://s1,s2:5000/my%20master/4?sentinel_password=x").unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Sentinel {
                sentinels: vec![Node::new("s1", 26379), Node::new("s2", 5000)],
                master: "my master".into()
            }
        );
        assert_eq!(c.db(), 4);
        assert_eq!(c.sentinel_password(), Some("x"));
    }

    #[test]
    fn parses_node_addresses() {
        let c = RedisConfig::from_url("redis+cluster://a:1?node_address=a:1=127.0.0.1:7&node_address=[::1]:2=[::1]:8")
            .unwrap();
        assert_eq!(
            c.node_addresses(),
            [(Node::new("a", 1), Node::new("127.0.0.1", 7)), (Node::new("::1", 2), Node::new("::1", 8))]
        );
        assert_eq!(c.reached_at(&Node::new("::1", 2)), &Node::new("::1", 8));
        assert_eq!(c.reached_at(&Node::new("b", 1)), &Node::new("b", 1));
        // Given twice, the last one counts.
        let c = RedisConfig::from_url("redis+cluster://a:1?node_address=a:1=b:2&node_address=a:1=c:3").unwrap();
        assert_eq!(c.node_addresses(), [(Node::new("a", 1), Node::new("c", 3))]);
    }

    #[test]
    fn parses_replica_acknowledgement() {
        let c = RedisConfig::from_url("redis://h?wait_replicas=2&wait_timeout=50ms").unwrap();
        assert_eq!(c.replica_ack(), Some(ReplicaAck { replicas: 2, timeout: Duration::from_millis(50) }));
        let c = RedisConfig::from_url("redis://h?wait_replicas=1").unwrap();
        assert_eq!(c.replica_ack().map(|a| a.timeout), Some(Duration::from_millis(100)));
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "http://h",
            "redis//h",
            "redis://",
            "redis://h:0",
            "redis://h:99999",
            "redis://h:x",
            "redis://a,b",
            "redis://h/x",
            "redis://h/1/2",
            "redis://h/-1",
            "redis+cluster://a,b/1",
            "redis+sentinel://s",
            "redis+sentinel://s/m/1/2",
            "redis://h?unknown=1",
            "redis://h?prefix=a{b",
            "redis://h?prefix=a}b",
            "redis://h?wait_timeout=1s",
            "redis://h?wait_replicas=0",
            "redis://h?wait_replicas=x",
            "redis://h?wait_replicas=1&wait_timeout=10s&op_timeout=1s",
            "redis://h?keep_idle=0ms",
            "redis://h?keep_idle=9000h",
            "redis://h?keep_idle=soon",
            "redis://h?tls_ca=/ca.pem",
            "redis://[::1",
            "redis://h?node_address=a:1=b:2",
            "redis+sentinel://s/m?node_address=a:1=b:2",
            "redis+cluster://a:1?node_address=a:1",
            "redis+cluster://a:1?node_address=a=b:2",
            "redis+cluster://a:1?node_address=a:1=b:0",
            "redis+cluster://a:1?node_address=a:1=b:x",
            "redis+cluster://a:1?node_address=::1:1=b:2",
        ] {
            assert!(matches!(RedisConfig::from_url(url), Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[test]
    fn never_shows_passwords() {
        let err = RedisConfig::from_url("redis://user:hunter2@h?nope=1").unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        let config = RedisConfig::from_url("redis://user:hunter2@h").unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        let built = RedisConfig::sentinel([Node::new("s", 1)], "m")
            .with_credentials("app", "hunter2")
            .with_sentinel_credentials("watcher", "hunter3");
        let shown = format!("{built:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("hunter3"), "{shown}");
        assert!(shown.contains("app") && shown.contains("watcher"), "{shown}");
    }

    #[test]
    fn builds_with_credentials_and_common_options() {
        let c = RedisConfig::single("h", 1)
            .with_credentials("app", "s3cret")
            .with_connect_timeout(Duration::from_secs(2))
            .with_prefix("shop");
        assert_eq!((c.user(), c.password()), (Some("app"), Some("s3cret")));
        assert_eq!(c.connect_timeout(), Duration::from_secs(2));
        assert_eq!(c.op_timeout(), ConnectOptions::default().op_timeout);
        assert_eq!(c.prefix(), "shop");
        assert!(c.validate().is_ok());
        assert_eq!(c, RedisConfig::from_url("redis://app:s3cret@h:1?connect_timeout=2s&prefix=shop").unwrap());
    }

    #[test]
    fn keeps_idle_names_for_the_keep_time_asked() {
        assert_eq!(RedisConfig::single("h", 1).keep_idle(), dlock_core::DEFAULT_KEEP_IDLE);
        let c = RedisConfig::from_url("redis://h?keep_idle=90s").unwrap();
        assert_eq!(c.keep_idle(), Duration::from_secs(90));
        assert_eq!(c, RedisConfig::single("h", DEFAULT_PORT).with_keep_idle(Duration::from_secs(90)));
        for keep in [Duration::ZERO, Duration::from_micros(999), dlock_core::MAX_DURATION + Duration::from_secs(1)] {
            let err = RedisConfig::single("h", 1).with_keep_idle(keep).validate();
            assert!(matches!(err, Err(LockError::InvalidInput(_))), "{keep:?}");
        }
    }

    #[test]
    fn builds_with_a_password_alone() {
        let c = RedisConfig::single("h", 1).with_password("s3cret");
        assert_eq!((c.user(), c.password()), (None, Some("s3cret")));
        assert_eq!(c, RedisConfig::from_url("redis://:s3cret@h:1").unwrap());
        // A password alone replaces an ACL user set before, and the other way round.
        let c = c.with_credentials("app", "other").with_password("s3cret");
        assert_eq!((c.user(), c.password()), (None, Some("s3cret")));
        let c = c.with_credentials("app", "other");
        assert_eq!((c.user(), c.password()), (Some("app"), Some("other")));

        let s = RedisConfig::sentinel([Node::new("s", 1)], "m").with_sentinel_password("x");
        assert_eq!((s.sentinel_user(), s.sentinel_password()), (None, Some("x")));
        assert_eq!((s.user(), s.password()), (None, None));
        assert_eq!(s, RedisConfig::from_url("redis+sentinel://s:1/m?sentinel_password=x").unwrap());
    }
}
