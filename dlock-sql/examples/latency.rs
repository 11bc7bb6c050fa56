//! Uncontended acquire+release latency of each SQL locker against its raw baseline (the
//! same statements sent straight through sqlx), on servers started for the run:
//!
//! ```text
//! cargo run --release -p dlock-sql --example latency [rounds]
//! ```
//!
//! `dlock bench` is the full benchmark; this is the quick look for this crate alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::supervisor::mariadb::MariaDbServer;
use conformance::supervisor::postgres::PostgresServer;
use dlock_core::{LockName, LockOptions, Locker, RawBaseline};
use dlock_sql::SqlConfig;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let p50 = percentile(&samples, 0.5);
    println!(
        "{what:<28} p50 {:>8.1} µs   p99 {:>8.1} µs   {:>7.0} /s",
        p50.as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / samples.iter().sum::<Duration>().as_secs_f64()
    );
    p50
}

async fn measure(label: &str, url: &str, rounds: usize) {
    let config = SqlConfig::from_url(url).expect("url");
    let name = LockName::new(format!("latency/{label}")).unwrap();
    let opts = LockOptions::new().wait(Duration::from_secs(5));
    let locker: Arc<dyn Locker> = dlock_sql::connect_any(config.clone()).await.expect("connect");
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds + rounds / 10 {
        let started = Instant::now();
        locker.acquire(&name, &opts).await.expect("acquire").release().await.expect("release");
        if i >= rounds / 10 {
            samples.push(started.elapsed());
        }
    }
    let lib = report(&format!("{label} dlock"), samples);
    if config.get_lock_kind() == dlock_sql::LockKind::Lease {
        let raw = dlock_sql::raw_baseline(config).await.expect("baseline");
        let mut samples = Vec::with_capacity(rounds);
        for i in 0..rounds + rounds / 10 {
            let started = Instant::now();
            raw.acquire_release(&name).await.expect("raw");
            if i >= rounds / 10 {
                samples.push(started.elapsed());
            }
        }
        let raw = report(&format!("{label} raw statements"), samples);
        println!("{:<28} {:.2}x", format!("{label} overhead"), lib.as_secs_f64() / raw.as_secs_f64());
    }
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|r| r.parse().ok()).unwrap_or(2000);
    let postgres = PostgresServer::start(200).expect("start postgres");
    let mariadb = MariaDbServer::start(200).expect("start mariadb");
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("locks.db").display());
    measure("postgres", &postgres.url(), rounds).await;
    measure("postgres advisory", &format!("{}?lock=advisory", postgres.url()), rounds).await;
    measure("mariadb", &mariadb.url(), rounds).await;
    measure("mariadb advisory", &format!("{}?lock=advisory", mariadb.url()), rounds).await;
    measure("sqlite", &sqlite, rounds).await;
}
