//! Serves dlock's metrics to Prometheus while a few tasks take turns on a lock.
//!
//! ```text
//! cargo run -p dlock --example prometheus -- [URL] [ADDR] [SECONDS]
//! curl http://127.0.0.1:9898/metrics
//! ```
//!
//! URL defaults to `memory://example`, ADDR to `127.0.0.1:9898`; with SECONDS it stops
//! after that long, else it runs until interrupted. Any recorder of the `metrics` facade
//! works the same way; this one is the Prometheus exporter with its own HTTP listener,
//! and histogram buckets chosen for what dlock measures (docs/metrics.md lists every
//! metric and the alerts worth having).

use std::net::SocketAddr;
use std::time::Duration;

use dlock::{LockName, LockOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Seconds: a wait is short or a problem; a hold is as long as the work; a renewal is a
/// round trip.
const WAIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];
const HOLD_BUCKETS: &[f64] = &[0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0];
const RENEWAL_BUCKETS: &[f64] = &[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://example".into());
    let addr: SocketAddr = args.next().unwrap_or_else(|| "127.0.0.1:9898".into()).parse()?;
    let run_for = args.next().map(|s| s.parse::<u64>().map(Duration::from_secs)).transpose()?;

    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full("dlock_acquire_wait_seconds".into()), WAIT_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full("dlock_hold_seconds".into()), HOLD_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full("dlock_renewal_seconds".into()), RENEWAL_BUCKETS)?
        .install()?;

    let locker = dlock::connect(&url).await?;
    for worker in 0..4 {
        let locker = locker.clone();
        tokio::spawn(async move {
            let name = LockName::new("example/prometheus").expect("a valid name");
            let opts = LockOptions::new().wait(Duration::from_secs(5));
            loop {
                match locker.acquire(&name, &opts).await {
                    Ok(lease) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let _ = lease.release().await;
                    }
                    Err(err) => eprintln!("worker {worker}: {err}"),
                }
            }
        });
    }
    println!("metrics of {} at http://{addr}/metrics", dlock::redact(&url));
    match run_for {
        Some(limit) => tokio::time::sleep(limit).await,
        None => tokio::signal::ctrl_c().await?,
    }
    Ok(())
}
