//! The database's own advisory locks: PostgreSQL's `pg_try_advisory_lock` or
//! MySQL/MariaDB's `GET_LOCK` (`?lock=advisory` in the URL).
//!
//! The lock is held by a database session of its own, so it ends the moment that session
//! does: a holder whose connection drops loses the lock at once (its lost signal fires),
//! with no ttl to wait out. There is no `extend` (`Unsupported`): an extension whose reply
//! was lost would break the session and free the lock. Tokens come from a counter row
//! per name, raised on the holding session.
//!
//! ```sh
//! cargo run -p dlock-examples --bin advisory -- 'postgres://app:secret@127.0.0.1:5432/app?lock=advisory'
//! cargo run -p dlock-examples --bin advisory -- 'mysql://root:secret@127.0.0.1:3306/app?lock=advisory'
//! ```

use std::time::Duration;

use dlock::sql::{LockKind, SqlConfig};
use dlock::{LockError, LockName, LockOptions, Locker};

/// The PostgreSQL service of docker-compose.yml.
const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:15432/dlock?lock=advisory";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let config = SqlConfig::from_url(&url)?;
    if config.lock_kind() != LockKind::Advisory {
        return Err("this example is about advisory locks: add ?lock=advisory to the URL".into());
    }
    let dialect = config.dialect().name();
    // Two replicas of a service, each with its own client.
    let first_replica = dlock::sql::connect_advisory(config.clone()).await?;
    let second_replica = dlock::sql::connect_advisory(config).await?;

    let name = LockName::new("migrations")?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_secs(10));
    let first = first_replica.acquire(&name, &opts).await?;
    let first_token = first.token();
    if second_replica.try_acquire(&name, &opts).await?.is_some() {
        return Err("two sessions held the advisory lock at once".into());
    }
    match first.extend(Duration::from_secs(20)).await {
        Err(LockError::Unsupported(_)) => {}
        other => return Err(format!("extend on an advisory lock should be Unsupported, not {other:?}").into()),
    }
    first.release().await?;
    let second = second_replica.acquire(&name, &opts).await?;
    let second_token = second.token();
    second.release().await?;
    println!(
        "advisory: on {dialect}, a session held {name} with token {first_token} while another found it taken (extend: Unsupported); then the other got token {second_token}"
    );
    Ok(())
}
