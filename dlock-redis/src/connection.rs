//! Connections to Redis: one multiplexed, reconnecting command connection per client
//! (to one server, a Cluster, or the master a Sentinel names), and the means to open a
//! connection to a single node for pub/sub.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisConnectionInfo, RedisFuture,
    RedisResult, TlsCertificates, TlsMode, Value,
};

use dlock_core::{ConnectConfig, LockError};

use crate::access::AccessConfig;
use crate::config::{Node, RedisConfig, Topology};
use crate::error::to_lock_error;
use crate::scripts::Publish;
use crate::sentinel::{MasterChanges, SentinelConnection, SentinelMaster};
use crate::shards::{speak_sharded_pubsub, ShardNodes};
use crate::{results, scripts};

/// Reconnection attempts after a connection broke (each bounded by the connect
/// timeout). On a Cluster they are also re-sendings of a command whose connection broke
/// under it; that is safe because every script is idempotent per request.
const RECONNECT_RETRIES: usize = 2;

/// How long a failed plaintext connect waits to learn whether the servers speak TLS.
const TLS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A command connection: cheap to clone (clones share the connection), reconnecting on
/// its own after a failure. Commands have no response timeout of their own: the client
/// bounds each operation by its operation timeout, and a renewal by the lease's validity
/// (a late reply within it still renews).
#[derive(Clone)]
pub enum RedisConnection {
    /// One server.
    Single(ConnectionManager),
    /// A Cluster: one connection per node, commands routed by slot.
    Cluster(ClusterConnection),
    /// The master a Sentinel names, followed to a new one after a failover.
    Sentinel(SentinelConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisConnection::")?;
        f.write_str(match self {
            RedisConnection::Single(_) => "Single",
            RedisConnection::Cluster(_) => "Cluster",
            RedisConnection::Sentinel(_) => "Sentinel",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(conn) => conn.req_packed_command(cmd),
            RedisConnection::Cluster(conn) => conn.req_packed_command(cmd),
            RedisConnection::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConnection::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(conn) => conn.get_db(),
            RedisConnection::Cluster(conn) => conn.get_db(),
            RedisConnection::Sentinel(conn) => conn.current().get_db(),
        }
    }
}

impl RedisConnection {
    /// Tells the connection that the server may no longer be the master (a write was not
    /// acknowledged by the replicas it should have): through Sentinel, the master is
    /// looked up again. Elsewhere nothing happens.
    pub fn suspect_failover(&self) {
        if let RedisConnection::Sentinel(conn) = self {
            conn.look_up_again();
        }
    }
}

/// Where pub/sub connections go: the server, any Cluster node (before Redis 7, a
/// `PUBLISH` reaches every node of a Cluster), the primaries of a Cluster's shards
/// (sharded pub/sub, Redis 7 or later), or the master Sentinel names now.
#[derive(Clone)]
pub enum NodeSource {
    /// One server.
    Single(Box<Client>),
    /// The Cluster's seed nodes, tried in turn, for classic pub/sub.
    Cluster(Vec<Client>),
    /// The primary serving each channel's slot, for sharded pub/sub.
    Shards(Box<ShardNodes>),
    /// The master a Sentinel names now, which the command connections follow too.
    Sentinel(SentinelMaster),
}

impl std::fmt::Debug for NodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeSource::")?;
        f.write_str(match self {
            NodeSource::Single(_) => "Single",
            NodeSource::Cluster(_) => "Cluster",
            NodeSource::Shards(_) => "Shards",
            NodeSource::Sentinel(_) => "Sentinel",
        })
    }
}

impl NodeSource {
    /// How releases must be published for waiters listening through these nodes.
    pub fn publish(&self) -> Publish {
        match self {
            NodeSource::Shards(_) => Publish::Sharded,
            NodeSource::Single(_) | NodeSource::Cluster(_) | NodeSource::Sentinel(_) => Publish::Classic,
        }
    }

    /// A client for the node of a classic pub/sub connection; `attempt` counts the
    /// failures so far, to rotate through Cluster seeds (and, through Sentinel, to look
    /// the master up again). Sharded pub/sub has no one node: an error.
    pub async fn client(&self, attempt: usize) -> RedisResult<Client> {
        match self {
            NodeSource::Single(client) => Ok((**client).clone()),
            NodeSource::Cluster(clients) => Ok(clients[attempt % clients.len()].clone()),
            NodeSource::Shards(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "sharded pub/sub connects to the primary serving each channel's slot",
            ))),
            NodeSource::Sentinel(master) => Ok(master.client(attempt)),
        }
    }

    /// Changes of the node a connection should be open to: a new master through
    /// Sentinel; never, elsewhere.
    pub(crate) fn changes(&self) -> MasterChanges {
        match self {
            NodeSource::Sentinel(master) => master.changes(),
            NodeSource::Single(_) | NodeSource::Cluster(_) | NodeSource::Shards(_) => MasterChanges::none(),
        }
    }
}

/// A connected client's command connection and its source of pub/sub nodes.
pub(crate) struct Connected {
    /// The command connection.
    pub commands: RedisConnection,
    /// Where pub/sub connections go.
    pub nodes: NodeSource,
}

/// Connects as `config` says, within its connect timeout, and loads the lock scripts.
/// `Unavailable` when no server answers in time.
pub(crate) async fn connect(config: &RedisConfig) -> Result<Connected, LockError> {
    connect_and_check(config, true).await
}

/// `count` more command connections beside `connected`'s, for the grants and renewals
/// that wait for replicas (`WAIT` blocks its connection). Through Sentinel they follow
/// the master `connected` follows.
pub(crate) async fn connect_more(
    config: &RedisConfig,
    connected: &Connected,
    count: usize,
) -> Result<Vec<RedisConnection>, LockError> {
    let opened = match &connected.nodes {
        NodeSource::Sentinel(master) => {
            futures::future::join_all((0..count).map(|_| connect_to_master(config, master))).await
        }
        NodeSource::Single(_) | NodeSource::Cluster(_) | NodeSource::Shards(_) => {
            let opened = futures::future::join_all((0..count).map(|_| connect_and_check(config, false))).await;
            opened.into_iter().map(|connected| connected.map(|c| c.commands)).collect()
        }
    };
    opened.into_iter().collect()
}

/// Another command connection to the master `master` follows, with the scripts loaded,
/// within the connect timeout.
async fn connect_to_master(config: &RedisConfig, master: &SentinelMaster) -> Result<RedisConnection, LockError> {
    let timeout = config.connect_timeout();
    let attempt = async {
        let mut conn = RedisConnection::Sentinel(master.another_connection().await?);
        load_scripts(&mut conn).await?;
        Ok::<_, redis::RedisError>(conn)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(match to_lock_error(err) {
            LockError::Unavailable { source: Some(cause), .. } => {
                LockError::unavailable_because("cannot connect", cause)
            }
            other => other,
        }),
        Err(_) => Err(LockError::unavailable(format!("cannot connect within {timeout:?}"))),
    }
}

async fn connect_and_check(config: &RedisConfig, check: bool) -> Result<Connected, LockError> {
    config.validate()?;
    let ca = prepare_tls(config)?;
    let timeout = config.connect_timeout();
    let attempt = async {
        let connected = open(config, ca.as_deref()).await?;
        let mut commands = connected.commands.clone();
        load_scripts(&mut commands).await?;
        if check {
            check_memory_policy(&mut commands, config).await;
        }
        Ok::<_, redis::RedisError>(connected)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(connected)) => Ok(connected),
        // The client names the server (`LockError::at`).
        Ok(Err(err)) => Err(match to_lock_error(err) {
            LockError::Unavailable { source: Some(cause), .. } => {
                let failed = LockError::unavailable_because("cannot connect", cause);
                match config.access().tls || config.given_client().is_some() {
                    true => failed,
                    // A server that speaks only TLS hangs up on a plaintext client.
                    false => {
                        let instead = "rediss:// (and tls_ca=<pem file> when a private CA signed its certificate)";
                        let reached: Vec<Node> =
                            config.addresses().iter().map(|n| config.reached_at(n).clone()).collect();
                        dlock_core::tls::plaintext_refused(&reached, instead, TLS_PROBE_TIMEOUT).await.unwrap_or(failed)
                    }
                }
            }
            other => other,
        }),
        Err(_) => Err(LockError::unavailable(format!("cannot connect within {timeout:?}"))),
    }
}

/// `SCRIPT LOAD`s every script a client sends, the lock scripts and the
/// [result scripts](crate::results), so that the first call of each is a plain
/// `EVALSHA`. The list is put together here, above both, so that the script layer never
/// depends on what is built on it. Not on a Cluster: there `SCRIPT LOAD` must reach every
/// node, so one node down would fail the connect, and a replica promoted later would not
/// have the scripts anyway; each node is sent a script whole on its first `NOSCRIPT`.
async fn load_scripts(conn: &mut RedisConnection) -> RedisResult<()> {
    if matches!(conn, RedisConnection::Cluster(_)) {
        return Ok(());
    }
    scripts::scripts().load_all(conn).await?;
    for script in results::scripts().all() {
        script.load_async(conn).await?;
    }
    Ok(())
}

/// Reads the server's `maxmemory-policy` and warns when it can evict what the locks
/// rely on. Where the ACL refuses `CONFIG GET` (managed services often do), nothing is
/// said: the crate docs tell why `noeviction` matters.
async fn check_memory_policy(conn: &mut RedisConnection, config: &RedisConfig) {
    let get = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").clone();
    let reply: RedisResult<Vec<String>> = get.query_async(conn).await;
    match reply {
        Ok(pair) => {
            if let Some(risk) = pair.get(1).and_then(|policy| eviction_risk(policy)) {
                tracing::warn!(server = %describe(config), policy = %pair[1], "{risk}");
            }
        }
        Err(err) => tracing::debug!(%err, "cannot read maxmemory-policy; make sure it is noeviction"),
    }
}

/// What a `maxmemory-policy` can do to locks, if anything.
pub(crate) fn eviction_risk(policy: &str) -> Option<&'static str> {
    if policy.starts_with("volatile-") {
        Some("maxmemory-policy evicts keys with a ttl: under memory pressure a lock's hold can vanish before its ttl, and another client then gets the lock; use noeviction")
    } else if policy.starts_with("allkeys-") {
        Some("maxmemory-policy evicts any key: a lock's hold can vanish before its ttl and its fence counter can be evicted, so that tokens start again from 1; use noeviction")
    } else {
        None
    }
}

/// A connection to one server (`config` names a single server) that connects on its
/// first command instead of now, and reconnects as [`connect`]'s does. Nothing is sent
/// until then; the scripts are sent whole on their first `NOSCRIPT`.
pub(crate) fn connect_lazily(config: &RedisConfig) -> Result<Connected, LockError> {
    config.validate()?;
    let Topology::Single(node) = config.topology() else {
        return Err(LockError::InvalidInput("a lazy connection is to one server".into()));
    };
    let ca = prepare_tls(config)?;
    let client = match config.given_client() {
        Some(given) => given.clone(),
        None => client(node_info(node, config), ca.as_deref()).map_err(to_lock_error)?,
    };
    let manager =
        ConnectionManager::new_lazy_with_config(client.clone(), manager_config(config)).map_err(to_lock_error)?;
    Ok(Connected { commands: RedisConnection::Single(manager), nodes: NodeSource::Single(Box::new(client)) })
}

/// Installs the TLS crypto provider when TLS is used, and reads the CA file if one is set.
fn prepare_tls(config: &RedisConfig) -> Result<Option<Vec<u8>>, LockError> {
    if config.tls() {
        dlock_core::tls::install_crypto_provider();
    }
    match config.tls_ca() {
        Some(path) => Ok(Some(std::fs::read(path).map_err(|err| {
            LockError::InvalidInput(format!("cannot read the TLS CA file {}: {err}", path.display()))
        })?)),
        None => Ok(None),
    }
}

/// The CA certificates to trust, when not the system's.
pub(crate) fn certificates(ca: Option<&[u8]>) -> Option<TlsCertificates> {
    ca.map(|pem| TlsCertificates { client_tls: None, root_cert: Some(pem.to_vec()) })
}

pub(crate) fn client(info: ConnectionInfo, ca: Option<&[u8]>) -> RedisResult<Client> {
    match certificates(ca) {
        Some(certs) => Client::build_with_tls(info, certs),
        None => Client::open(info),
    }
}

async fn open(config: &RedisConfig, ca: Option<&[u8]>) -> RedisResult<Connected> {
    if let Some(client) = config.given_client() {
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config(config)).await?;
        return Ok(Connected {
            commands: RedisConnection::Single(manager),
            nodes: NodeSource::Single(Box::new(client.clone())),
        });
    }
    match config.topology() {
        Topology::Single(node) => {
            let client = client(node_info(node, config), ca)?;
            let manager = ConnectionManager::new_with_config(client.clone(), manager_config(config)).await?;
            Ok(Connected { commands: RedisConnection::Single(manager), nodes: NodeSource::Single(Box::new(client)) })
        }
        Topology::Cluster(seeds) => {
            let infos: Vec<ConnectionInfo> = seeds.iter().map(|node| node_info(node, config)).collect();
            // The client connects to every seed before it reads the slot map, so a seed
            // that accepts connections but never answers (a frozen host) would take the
            // whole connect budget: each node gets a third of it.
            let mut builder = ClusterClientBuilder::new(infos.clone())
                .connection_timeout(config.connect_timeout() / 3)
                .retries(RECONNECT_RETRIES as u32);
            if let Some(user) = config.user() {
                builder = builder.username(user);
            }
            if let Some(password) = config.password() {
                builder = builder.password(password);
            }
            if config.tls() {
                builder = builder.tls(TlsMode::Secure);
            }
            if let Some(certs) = certificates(ca) {
                builder = builder.certs(certs);
            }
            // The nodes the slot map names by their announced addresses, reached where the
            // config says.
            if !config.node_addresses().is_empty() {
                let map = config
                    .node_addresses()
                    .iter()
                    .map(|(announced, reached)| {
                        let address = |n: &Node| redis::cluster::NodeAddress::new(n.host.clone(), n.port);
                        (address(announced), address(reached))
                    })
                    .collect();
                builder = builder.node_address_map(map);
            }
            let mut conn = builder.build()?.get_async_connection().await?;
            // Wake-ups go by sharded pub/sub where the servers speak it: only the shard
            // serving a lock's slot hears its releases, and waiters follow the slot.
            let nodes = match speak_sharded_pubsub(&mut conn).await {
                true => NodeSource::Shards(Box::new(ShardNodes::new(conn.clone(), config.clone(), ca))),
                false => NodeSource::Cluster(
                    infos.into_iter().map(|info| client(info, ca)).collect::<RedisResult<Vec<_>>>()?,
                ),
            };
            Ok(Connected { commands: RedisConnection::Cluster(conn), nodes })
        }
        Topology::Sentinel { .. } => {
            let master = SentinelMaster::connect(config, ca).await?;
            Ok(Connected {
                commands: RedisConnection::Sentinel(master.connection()),
                nodes: NodeSource::Sentinel(master),
            })
        }
    }
}

pub(crate) fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(None)
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
}

pub(crate) fn node_addr(node: &Node, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls { host: node.host.clone(), port: node.port, insecure: false, tls_params: None }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    }
}

/// The connection settings of one node: address (where the config says to reach it),
/// TLS, credentials, database.
pub(crate) fn node_info(node: &Node, config: &RedisConfig) -> ConnectionInfo {
    let mut redis = RedisConnectionInfo::default().set_db(config.db());
    if let Some(user) = config.user() {
        redis = redis.set_username(user);
    }
    if let Some(password) = config.password() {
        redis = redis.set_password(password);
    }
    node_addr(config.reached_at(node), config.tls())
        .into_connection_info()
        .expect("a TCP address always makes connection info")
        .set_redis_settings(redis)
}

fn describe(config: &RedisConfig) -> String {
    let list = |nodes: &[Node]| nodes.iter().map(Node::to_string).collect::<Vec<_>>().join(",");
    match config.topology() {
        Topology::Single(node) => node.to_string(),
        Topology::Cluster(nodes) => format!("cluster {}", list(nodes)),
        Topology::Sentinel { sentinels, master } => format!("master {master:?} of sentinels {}", list(sentinels)),
    }
}

#[cfg(test)]
mod tests {
    use super::eviction_risk;

    #[test]
    fn policies_that_evict_locks_are_named() {
        assert!(eviction_risk("noeviction").is_none());
        assert!(eviction_risk("volatile-lru").unwrap().contains("hold"));
        assert!(eviction_risk("volatile-ttl").is_some());
        assert!(eviction_risk("allkeys-lfu").unwrap().contains("fence counter"));
    }
}
