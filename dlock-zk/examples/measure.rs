//! Measures the ZooKeeper backend against a local standalone server: uncontended
//! acquire+release latency beside the raw baseline (and the requests each sends, as the
//! server counts them), the hand-off latency to a waiting client, and what renewing 1,000
//! leases costs in requests.
//!
//! ```text
//! cargo run --release -p dlock-zk --example measure
//! ```

use std::time::{Duration, Instant};

use conformance::supervisor::zookeeper::{monitor, ZooKeeperServer};
use dlock_core::{LockError, LockName, LockOptions, Locker, RawBaseline};
use dlock_zk::ZkConfig;

const ROUNDS: usize = 2000;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p) as usize]
}

fn requests(server: &ZooKeeperServer) -> u64 {
    let metrics = monitor(server.addr()).expect("mntr");
    // The `mntr` that reads the counter is itself counted.
    metrics["zk_packets_received"].parse::<u64>().expect("a number") + 1
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let server = ZooKeeperServer::start().expect("start ZooKeeper (run scripts/install-backends)");
    let config = ZkConfig::from_url(&server.url())?;
    let locker = dlock_zk::connect(config.clone()).await?;
    let raw = dlock_zk::raw_baseline(config.clone()).await?;
    let name = LockName::new("measure/uncontended")?;
    let opts = LockOptions::new().wait(Duration::from_secs(5));

    for _ in 0..ROUNDS {
        locker.acquire(&name, &opts).await?.release().await?;
        raw.acquire_release(&name).await?;
    }
    let before = requests(&server);
    let mut library = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        locker.acquire(&name, &opts).await?.release().await?;
        library.push(started.elapsed());
    }
    let between = requests(&server);
    let mut baseline = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        raw.acquire_release(&name).await?;
        baseline.push(started.elapsed());
    }
    let after = requests(&server);
    println!(
        "uncontended acquire+release: library p50 {:?} p99 {:?}, {:.2} requests; raw p50 {:?} p99 {:?}, {:.2} requests",
        percentile(&mut library, 0.5),
        percentile(&mut library, 0.99),
        (between - before) as f64 / ROUNDS as f64,
        percentile(&mut baseline, 0.5),
        percentile(&mut baseline, 0.99),
        (after - between) as f64 / ROUNDS as f64,
    );

    let waiter = dlock_zk::connect(config).await?;
    let mut handoffs = Vec::new();
    for _ in 0..200 {
        let held = locker.acquire(&name, &opts).await?;
        let (w, n, o) = (waiter.clone(), name.clone(), opts.clone());
        let queued = tokio::spawn(async move { w.acquire(&n, &o).await.map(|lease| (Instant::now(), lease)) });
        while waiter.stats().waiting == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        held.release().await?;
        let released = Instant::now();
        let (granted, lease) = queued.await.expect("waiter task")?;
        handoffs.push(granted - released);
        lease.release().await?;
    }
    println!(
        "hand-off (release ack to the waiter's grant): p50 {:?} p99 {:?}",
        percentile(&mut handoffs.clone(), 0.5),
        percentile(&mut handoffs, 0.99)
    );

    let ttl = Duration::from_secs(3);
    let mut leases = Vec::new();
    for i in 0..1000 {
        leases.push(locker.acquire(&LockName::new(format!("measure/many/{i}"))?, &LockOptions::watchdog(ttl)).await?);
    }
    let (renewals, sent) = (locker.stats().renewals, requests(&server));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (renewals, sent) = (locker.stats().renewals - renewals, requests(&server) - sent);
    println!("1,000 leases of ttl {ttl:?} for 6 s: {renewals} renewals in {sent} requests");
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}
