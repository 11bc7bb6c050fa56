//! Locks in the database a service already has: the SQL lease table.
//!
//! Each lock name is a row of `dlock_leases` (created when missing) with its holder, its
//! expiry on the database's clock and a fence counter raised by every grant. PostgreSQL
//! wakes waiters with LISTEN/NOTIFY; SQLite (one machine, no server) and MySQL poll.
//!
//! ```sh
//! cargo run -p dlock-examples --bin sql_lease -- postgres://app:secret@127.0.0.1:5432/app
//! cargo run -p dlock-examples --bin sql_lease -- sqlite:///tmp/locks.db
//! ```

use std::time::Duration;

use dlock::sql::SqlConfig;
use dlock::{LockName, LockOptions, Locker};

/// The PostgreSQL service of docker-compose.yml.
const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:15432/dlock";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let config = SqlConfig::from_url(&url)?;
    let (dialect, table) = (config.dialect().name(), config.table());
    // Two replicas of a service, each with its own client (and connection pool).
    let first_replica = dlock::sql::connect(config.clone()).await?;
    let second_replica = dlock::sql::connect(config).await?;

    let name = LockName::new("invoices/2026-12")?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_secs(10));
    let first = first_replica.acquire(&name, &opts).await?;
    let first_token = first.token();
    // While the first holds the row, the second finds the lock taken without waiting.
    if second_replica.try_acquire(&name, &opts).await?.is_some() {
        return Err("two clients held the lock at once".into());
    }
    first.release().await?;
    let second = second_replica.acquire(&name, &opts).await?;
    let second_token = second.token();
    second.release().await?;
    println!(
        "sql_lease: on {dialect} (table {table}), held {name} with token {first_token} while another client found it taken; then the other got token {second_token}"
    );
    Ok(())
}
