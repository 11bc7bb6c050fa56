//! The server-side mutants: what the run does to the servers when a mutant strikes
//! ([`Act::Mutate`](crate::plan::Act::Mutate)), as an operator's tool would, straight to
//! the servers and not through any client's proxies.

use std::io;

use dlock::{ConnectConfig, LockName};

use crate::client::LOCK;
use crate::mutant::Mutant;
use crate::skew::command;
use crate::topology::Topology;

/// Whether `mutant` can be played on `topology`, and if not, why.
pub(crate) fn applies(mutant: Mutant, topology: &Topology) -> Result<(), String> {
    let redis = matches!(
        topology,
        Topology::Redis(_) | Topology::Sentinel { .. } | Topology::RedLock { .. } | Topology::Cluster { .. }
    );
    let sql = matches!(topology, Topology::Sqlite { .. } | Topology::Postgres(_) | Topology::MariaDb(_));
    // An advisory lock lives as long as its session: there is nothing to renew. Its
    // token is a counter in a row of its own table, not played here.
    let advisory = matches!(topology, Topology::PostgresAdvisory(_));
    let zk = matches!(topology, Topology::ZooKeeper(_) | Topology::ZkEnsemble(_));
    let fits = match mutant {
        Mutant::Evict | Mutant::NoSelfCheck | Mutant::LateWrite => !matches!(topology, Topology::External(_)),
        Mutant::FenceReset | Mutant::NeverRenews if advisory => false,
        // ZooKeeper's and etcd's tokens are the server's own revisions, which nothing
        // can set back; RedLock's proposals start from the proposer's clock, above any
        // counter set back (see dlock-redis's redlock::token).
        Mutant::FenceReset => (redis && !matches!(topology, Topology::RedLock { .. })) || sql,
        // A ZooKeeper hold lives as long as its session, which the client library keeps
        // alive by itself: a lease renewal there extends nothing on the server.
        Mutant::NeverRenews => !zk && !matches!(topology, Topology::External(_)),
        Mutant::HalfTtl => redis,
    };
    if fits {
        Ok(())
    } else {
        Err(format!("the {mutant} mutant does not apply to this topology"))
    }
}

/// The mutant strikes once: `evict` makes the servers forget the lock's holder,
/// `fence-reset` sets its fence counter back to 1.
pub(crate) async fn strike(mutant: Mutant, topology: &Topology) -> io::Result<()> {
    let name = LockName::new(LOCK).map_err(io::Error::other)?;
    let url = topology.url(&topology.endpoints());
    match topology {
        Topology::Redis(_) | Topology::Sentinel { .. } | Topology::RedLock { .. } | Topology::Cluster { .. } => {
            let prefix = match topology {
                Topology::RedLock { .. } => dlock::redis::RedLockConfig::from_url(&url).map(|c| c.prefix().to_string()),
                _ => dlock::redis::RedisConfig::from_url(&url).map(|c| c.prefix().to_string()),
            };
            let keys =
                dlock::redis::KeyLayout::new(&prefix.map_err(io::Error::other)?).map_err(io::Error::other)?.lock(&name);
            let servers = match topology {
                // The primary serving the lock's slot now: the others answer MOVED.
                Topology::Cluster { cluster, slot, .. } => {
                    vec![cluster.addrs()[tokio::task::block_in_place(|| cluster.owner(*slot))?]]
                }
                _ => topology.servers_direct(),
            };
            // On RedLock, a quorum of masters must forget the hold for anyone else to
            // get one; a counter is set back on every master.
            let (servers, args): (&[_], Vec<&str>) = match mutant {
                Mutant::Evict => (&servers[..topology.quorum().min(servers.len())], vec!["DEL", &keys.hold]),
                _ => (&servers[..], vec!["SET", &keys.fence, "1"]),
            };
            let done: Vec<io::Result<String>> = servers.iter().map(|addr| command(*addr, &args)).collect();
            // A Sentinel group's replica refuses writes; the master is the one that counts.
            if done.iter().any(Result::is_ok) {
                Ok(())
            } else {
                done.into_iter().next().unwrap_or_else(|| Err(io::Error::other("no server"))).map(drop)
            }
        }
        Topology::Sqlite { .. } | Topology::Postgres(_) | Topology::MariaDb(_) => sql(mutant, &url, &name).await,
        Topology::PostgresAdvisory(_) => {
            let config = dlock::sql::SqlConfig::from_url(&url).map_err(io::Error::other)?;
            let client = dlock::sql::connect_advisory(config).await.map_err(io::Error::other)?;
            client.backend().evict(&name).await.map_err(io::Error::other)
        }
        Topology::ZooKeeper(_) | Topology::ZkEnsemble(_) => zk_evict(&url, &name).await,
        Topology::Etcd(_) | Topology::EtcdCluster(_) => etcd_evict(&url, &name).await,
        Topology::External(_) => Err(io::Error::other("a mutant cannot strike a backend the run did not start")),
    }
}

/// The keys of the run's lock on a Redis deployment that `url` names (by its prefix).
pub(crate) fn lock_keys(url: &str) -> Result<dlock::redis::LockKeys, dlock::LockError> {
    let config = dlock::redis::RedisConfig::from_url(url)?;
    Ok(dlock::redis::KeyLayout::new(config.prefix())?.lock(&LockName::new(LOCK)?))
}

async fn sql(mutant: Mutant, url: &str, name: &LockName) -> io::Result<()> {
    use sqlx::Connection;
    let config = dlock::sql::SqlConfig::from_url(url).map_err(io::Error::other)?;
    if mutant == Mutant::Evict {
        let client = dlock::sql::connect(config).await.map_err(io::Error::other)?;
        return client.backend().evict(name).await.map_err(io::Error::other);
    }
    let table = config.table();
    let done = match url.split(':').next() {
        Some("sqlite") => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.map_err(io::Error::other)?;
            let update = format!("UPDATE {table} SET fence = 1 WHERE name = ?1");
            sqlx::query(sqlx::AssertSqlSafe(update)).bind(name.as_str()).execute(&mut conn).await.map(drop)
        }
        Some("postgres") => {
            let mut conn = sqlx::PgConnection::connect(url).await.map_err(io::Error::other)?;
            let update = format!("UPDATE {table} SET fence = 1 WHERE name = $1");
            sqlx::query(sqlx::AssertSqlSafe(update)).bind(name.as_str()).execute(&mut conn).await.map(drop)
        }
        _ => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.map_err(io::Error::other)?;
            let update = format!("UPDATE {table} SET fence = 1 WHERE name = ?");
            sqlx::query(sqlx::AssertSqlSafe(update)).bind(name.as_str()).execute(&mut conn).await.map(drop)
        }
    };
    done.map_err(io::Error::other)
}

/// Deletes the head of the lock's queue: the holder's znode.
async fn zk_evict(url: &str, name: &LockName) -> io::Result<()> {
    let config = dlock::zk::ZkConfig::from_url(url).map_err(io::Error::other)?;
    let admin =
        zookeeper_client::Client::connector().connect(&config.connect_string()).await.map_err(io::Error::other)?;
    let path = config.lock_path(name);
    let mut children = match admin.list_children(&path).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => return Ok(()),
        Err(err) => return Err(io::Error::other(err)),
    };
    let sequence = |child: &String| child.rsplit_once("lock-").and_then(|(_, n)| n.parse::<i64>().ok());
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(sequence);
    let Some(head) = children.first() else { return Ok(()) };
    match admin.delete(&format!("{path}/{head}"), None).await {
        Ok(()) | Err(zookeeper_client::Error::NoNode) => Ok(()),
        Err(err) => Err(io::Error::other(err)),
    }
}

/// Deletes the holder's key: the first under the lock's directory by creation.
async fn etcd_evict(url: &str, name: &LockName) -> io::Result<()> {
    use etcd_client::{GetOptions, SortOrder, SortTarget};
    let client = dlock::etcd::connect(dlock::etcd::EtcdConfig::from_url(url).map_err(io::Error::other)?)
        .await
        .map_err(io::Error::other)?;
    let dir = dlock::etcd::lock_dir(client.backend().prefix(), name);
    let mut kv = client.backend().etcd().await.map_err(io::Error::other)?.kv_client();
    let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
    let resp = kv.get(dir, Some(first)).await.map_err(io::Error::other)?;
    let Some(holder) = resp.kvs().first() else { return Ok(()) };
    kv.delete(holder.key().to_vec(), None).await.map_err(io::Error::other)?;
    Ok(())
}
