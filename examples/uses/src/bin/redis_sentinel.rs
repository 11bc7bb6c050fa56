//! Locks on the master of a Redis Sentinel group, with `wait_replicas=1`.
//!
//! Redis replicates asynchronously: a master that fails right after a grant may be
//! replaced by a replica that never saw it, and then a second client gets the lock, with a
//! token that can go back. With `wait_replicas=1` every grant and renewal waits (`WAIT`)
//! until a replica has it, and a grant no replica acknowledges is given back and fails
//! with `QuorumNotReached`: a failover keeps holds and tokens, at the price of no grants
//! while no replica answers.
//!
//! ```sh
//! cargo run -p dlock-examples --bin redis_sentinel -- 'redis+sentinel://127.0.0.1:26379/locks?wait_replicas=1'
//! ```

use std::time::Duration;

use dlock::redis::{RedisConfig, Topology};
use dlock::{LockName, LockOptions, Locker};

/// The Sentinel group of docker-compose.yml.
const DEFAULT_URL: &str = "redis+sentinel://127.0.0.1:16395,127.0.0.1:16396,127.0.0.1:16397/locks?wait_replicas=1";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let mut config = RedisConfig::from_url(&url)?;
    let Topology::Sentinel { master, .. } = config.topology().clone() else {
        return Err(format!("expected a redis+sentinel:// URL, got {}", config.target()).into());
    };
    // This example is about the acknowledgement: the builder adds it when the URL has not.
    if config.replica_ack().is_none() {
        config = config.with_replica_ack(1, Duration::from_millis(100));
    }
    let replicas = config.replica_ack().map_or(0, |ack| ack.replicas);
    // The client asks the Sentinels for the master, and asks again after a failover.
    let locker = dlock::redis::connect(config).await?;

    let name = LockName::new("orders/42")?;
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await?;
    let token = lease.token();
    // ... the work, fenced by `token` ...
    lease.release().await?;
    println!(
        "redis_sentinel: held {name} on the master of group {master} with token {token}, the grant acknowledged by {replicas} replica(s)"
    );
    Ok(())
}
