//! Starts one server of every backend kind on free loopback ports, as the tests do, prints
//! one `dlock` URL per line, and keeps them running until its standard input closes.
//! `scripts/bench` uses it to benchmark every backend on this machine.
//!
//! ```sh
//! cargo run -p dlock-testkit --example servers
//! ```

use std::io::{BufRead, Write};

use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};
use dlock_testkit::supervisor::mariadb::MariaDbServer;
use dlock_testkit::supervisor::postgres::PostgresServer;
use dlock_testkit::supervisor::redis::{RedisConfig, RedisMasters, RedisServer};
use dlock_testkit::supervisor::zookeeper::ZooKeeperServer;

fn main() -> std::io::Result<()> {
    // A single Redis as most run it (no AOF); RedLock masters as its safety requires
    // (AOF with fsync on every write).
    let redis = RedisServer::start(&RedisConfig::default())?;
    let masters = RedisMasters::start(5, &RedisConfig { persistent: true, ..RedisConfig::default() })?;
    let zookeeper = ZooKeeperServer::start()?;
    let etcd = EtcdServer::start(&EtcdConfig::default())?;
    let postgres = PostgresServer::start(200)?;
    let mariadb = MariaDbServer::start(200)?;
    let mut out = std::io::stdout().lock();
    for url in [redis.url(), masters.url(), zookeeper.url(), etcd.url(), postgres.url(), mariadb.url()] {
        writeln!(out, "{url}")?;
    }
    out.flush()?;
    drop(out);
    // Until the caller closes our standard input (or dies: the servers die with us).
    for line in std::io::stdin().lock().lines() {
        line?;
    }
    Ok(())
}
