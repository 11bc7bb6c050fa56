//! Locks on etcd over TLS, trusting a private CA.
//!
//! `etcds://` turns TLS on; `ca=<PEM file>` trusts that CA instead of the system's roots
//! (clusters usually run on certificates of their own CA), and `cert`/`key` would add a
//! client certificate where the cluster asks for one. The token is the lock key's create
//! revision, which rises with every write to the cluster.
//!
//! ```sh
//! cargo run -p dlock-examples --bin etcd_tls -- 'etcds://127.0.0.1:2379?ca=/etc/etcd/ca.pem'
//! ```

use std::time::Duration;

use dlock::etcd::EtcdConfig;
use dlock::{LockName, LockOptions, Locker};

/// The TLS endpoint of docker-compose.yml, with the CA `scripts/compose-certs` makes.
const DEFAULT_URL: &str = "etcds://127.0.0.1:12389?ca=.compose-certs/ca.crt";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let config = EtcdConfig::from_url(&url)?;
    if !config.is_tls() {
        return Err("this example speaks TLS: give an etcds:// URL".into());
    }
    let trusted = config.ca_file().map_or_else(|| "the system's roots".to_string(), |ca| ca.display().to_string());
    let locker = dlock::etcd::connect(config).await?;

    let name = LockName::new("deploys/production")?;
    let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(10))).await?;
    let token = lease.token();
    // ... the work, fenced by `token` ...
    lease.release().await?;
    println!("etcd_tls: over TLS trusting {trusted}, held {name} with token {token} (the lock key's create revision)");
    Ok(())
}
