//! A nightly job that must run on one replica at a time, locked on a single Redis server.
//!
//! The lease is a watchdog lease: the client renews it every ttl/3 while the job runs, so
//! the ttl bounds how long a crashed holder keeps the others out, not how long the job may
//! take. Every write of the job carries the lease's fencing token, and the store refuses a
//! token below the last one it accepted: a holder that was paused past its lease cannot
//! overwrite the work of the holder after it.
//!
//! ```sh
//! cargo run -p dlock-examples --bin redis_watchdog -- redis://127.0.0.1:6379
//! ```

use std::time::{Duration, Instant};

use dlock::redis::RedisConfig;
use dlock::{LockName, LockOptions, Locker};

/// The Redis service of docker-compose.yml.
const DEFAULT_URL: &str = "redis://127.0.0.1:16379";

/// The store's side of fencing, as a script on the same Redis: a part of the report is
/// written only with a token at least the highest one that wrote before (a holder may
/// write several times with its own token). Tokens stay far below 2^53, so Lua's numbers
/// hold them exactly.
const FENCED_WRITE: &str = r"
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < fence then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'body', ARGV[2])
return 1
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let locker = dlock::redis::connect(RedisConfig::from_url(&url)?).await?;
    // The report lives on the same server here; any store that compares tokens will do.
    // The redis crate does not know dlock's URL options, so they are left out.
    let server = url.split('?').next().unwrap_or(&url);
    let mut store = redis::Client::open(server)?.get_multiplexed_async_connection().await?;
    let write = redis::Script::new(FENCED_WRITE);

    let name = LockName::new("reports/nightly")?;
    // A 2 s ttl so that this run (3 s of work) shows the watchdog at work; a real job
    // would take 10 to 30 s, the time a crashed holder may keep the others waiting.
    let ttl = Duration::from_secs(2);
    let lease = locker.acquire(&name, &LockOptions::new().ttl(ttl).wait(Duration::from_secs(10))).await?;
    let token = lease.token();
    let started = Instant::now();
    for part in 1..=3 {
        // Stop as soon as the lease is lost: past that point another replica may run.
        tokio::select! {
            reason = lease.lost() => return Err(format!("lease lost before part {part}: {reason}").into()),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let accepted: i64 = write
            .key("reports:nightly")
            .arg(token.get())
            .arg(format!("part {part} of 3"))
            .invoke_async(&mut store)
            .await?;
        if accepted != 1 {
            return Err(format!("the store refused token {token}: a later holder has written").into());
        }
    }
    let held = started.elapsed();
    let renewals = locker.stats().renewals;
    lease.release().await?;
    println!(
        "redis_watchdog: wrote 3 parts of {name} fenced by token {token}, held {:.1} s on a {} s watchdog lease renewed {renewals} times",
        held.as_secs_f64(),
        ttl.as_secs()
    );
    Ok(())
}
