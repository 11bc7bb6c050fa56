//! RedLock over five independent Redis masters: a lock survives two of them failing.
//!
//! A lock is held when a quorum of the masters (3 of 5) grant it for the same owner and
//! token; the lease's validity is the ttl less the time the quorum took to answer and a
//! clock-drift allowance. The token is agreed on by a quorum too, so it strictly increases
//! from one holder to the next, which is what a resource needs to refuse a holder whose
//! lease ran out (RedLock assumes bounded clock drift; the token does not).
//!
//! ```sh
//! cargo run -p dlock-examples --bin redlock -- \
//!     redlock://127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383
//! ```

use std::time::Duration;

use dlock::redis::redlock::{self, RedLockConfig};
use dlock::{LockName, LockOptions, Locker};

/// The five masters of docker-compose.yml.
const DEFAULT_URL: &str = "redlock://127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384,127.0.0.1:16385";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let config = RedLockConfig::from_url(&url)?;
    let (masters, quorum) = (config.nodes().len(), config.quorum());
    // Two replicas of a service, each with its own client.
    let first_replica = redlock::connect(config.clone()).await?;
    let second_replica = redlock::connect(config).await?;

    let name = LockName::new("invoices/2026-11")?;
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new().ttl(ttl).wait(Duration::from_secs(10));
    let first = first_replica.acquire(&name, &opts).await?;
    let (first_token, valid) = (first.token(), first.remaining());

    // The second replica asks while the first holds: it waits for the release message
    // that every master publishes, and gets the lock with a higher token.
    let (second, released) = tokio::join!(second_replica.acquire(&name, &opts), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        first.release().await
    });
    released?;
    let second = second?;
    let second_token = second.token();
    second.release().await?;
    if second_token <= first_token {
        return Err(format!("token {second_token} after {first_token}: tokens must increase").into());
    }
    println!(
        "redlock: held {name} on a quorum of {quorum} of {masters} masters with token {first_token} (valid {:.2} s of a {} s ttl); the next holder got token {second_token}",
        valid.as_secs_f64(),
        ttl.as_secs()
    );
    Ok(())
}
