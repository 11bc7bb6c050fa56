//! Leader election: one scheduler among the replicas runs at a time, and everyone can see
//! which one.
//!
//! `campaign` blocks until this candidate leads and stores its value (an address) under
//! the election's name; its term is the lease's fencing token, higher for every new
//! leader, so writes a leader makes can carry it. `observe` reports leaders in term
//! order. A leader that resigns (a deploy) hands over at once; one that dies, when its
//! lease runs out. Here on etcd; any backend that stores results will do.
//!
//! ```sh
//! cargo run -p dlock-examples --bin election -- etcd://127.0.0.1:2379
//! ```

use std::time::Duration;

use dlock::{campaign, observe, Leader, LockName, LockOptions};

/// The etcd cluster of docker-compose.yml.
const DEFAULT_URL: &str = "etcd://127.0.0.1:12379,127.0.0.1:12479,127.0.0.1:12579";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    // Two candidates and a dashboard that watches, each a client of its own.
    let (first, second, watcher) =
        (dlock::connect(&url).await?, dlock::connect(&url).await?, dlock::connect(&url).await?);
    let election = LockName::new("scheduler")?;
    // A dead leader is replaced within its ttl; a live one renews every ttl/3.
    let opts = LockOptions::new().ttl(Duration::from_secs(2)).wait(Duration::from_secs(10));
    let mut observer = observe(&*watcher, &election).every(Duration::from_millis(20));

    let leading = campaign(&*first, &election, b"10.0.0.7:8080", &opts).await?;
    let seen_first = next_leader(&mut observer).await?;

    // The second candidate waits in its campaign until the first resigns.
    let (taking_over, resigned) = tokio::join!(campaign(&*second, &election, b"10.0.0.8:8080", &opts), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        leading.resign().await
    });
    resigned?;
    let now_leading = taking_over?;
    let seen_second = next_leader(&mut observer).await?;
    let term = now_leading.term();
    now_leading.resign().await?;

    if seen_second.term <= seen_first.term || seen_second.term != term {
        return Err(
            format!("observed terms {} then {}, leader's term {term}", seen_first.term, seen_second.term).into()
        );
    }
    println!(
        "election: {} led in term {}, resigned, then {} led in term {} (both seen by an observer)",
        String::from_utf8_lossy(&seen_first.value),
        seen_first.term,
        String::from_utf8_lossy(&seen_second.value),
        seen_second.term
    );
    Ok(())
}

/// The next leader the observer reports, skipping moments with nobody leading; an error
/// after 10 s without one.
async fn next_leader<L: dlock::Locker + ?Sized>(
    observer: &mut dlock::Observer<'_, L>,
) -> Result<Leader, Box<dyn std::error::Error>> {
    let wait = async {
        loop {
            if let Some(leader) = observer.changed().await? {
                return Ok::<_, dlock::LockError>(leader);
            }
        }
    };
    Ok(tokio::time::timeout(Duration::from_secs(10), wait).await??)
}
