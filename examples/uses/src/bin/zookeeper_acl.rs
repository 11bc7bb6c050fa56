//! Locks on ZooKeeper with digest credentials in the URL.
//!
//! With `zk://user:password@...` the client authenticates with ZooKeeper's `digest`
//! scheme and creates every lock node with an ACL that gives this identity every right
//! and everyone else read access: other clients (an operator's shell, another service)
//! can see who holds a lock, but can neither queue for it nor delete a holder's node.
//!
//! ```sh
//! cargo run -p dlock-examples --bin zookeeper_acl -- zk://app:s3cret@127.0.0.1:2181/dlock
//! ```

use std::time::Duration;

use dlock::zk::ZkConfig;
use dlock::{LockError, LockName, LockOptions, Locker};

/// The ZooKeeper ensemble of docker-compose.yml, with credentials of this example's own.
const DEFAULT_URL: &str = "zk://app:s3cret@127.0.0.1:12181,127.0.0.1:12182,127.0.0.1:12183/dlock";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let config = ZkConfig::from_url(&url)?;
    let Some(user) = config.user().map(str::to_owned) else {
        return Err("give digest credentials in the URL: zk://user:password@host:2181/root".into());
    };
    // Another identity on the same ensemble and root, as another team's service would be.
    let other = dlock::zk::connect(config.clone().with_credentials("someone-else", "guess")).await?;
    let locker = dlock::zk::connect(config).await?;

    let name = LockName::new("jobs/compaction")?;
    let opts = LockOptions::new().wait(Duration::from_secs(10));
    let lease = locker.acquire(&name, &opts).await?;
    let token = lease.token();

    // The other identity reads the holder...
    let seen = other.inspect(&name).await?.holder.map(|holder| holder.token);
    // ...but the ACL keeps it from queueing for the lock.
    let refused = match other.try_acquire(&name, &opts).await {
        Err(err @ LockError::Refused { .. }) => err.to_string(),
        Ok(Some(_)) | Ok(None) => return Err("another identity could queue for the lock: no ACL on it".into()),
        Err(err) => return Err(err.into()),
    };
    lease.release().await?;
    if seen != Some(token) {
        return Err(format!("another identity saw holder {seen:?}, not token {token}").into());
    }
    println!(
        "zookeeper_acl: as digest user {user}, held {name} with token {token}; another identity saw the holder and was refused the lock ({refused})"
    );
    Ok(())
}
