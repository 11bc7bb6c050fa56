//! Uncontended acquire+release through dlock next to the same requests sent raw
//! ([`dlock_etcd::raw_baseline`]), against an etcd started for the run on a RAM-backed
//! data directory (or the server of `DLOCK_TEST_ETCD_URL`):
//!
//! ```text
//! cargo run --release -p dlock-etcd --example latency
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer};
use conformance::supervisor::external_url;
use dlock_core::{LockError, LockName, LockOptions, Locker, RawBaseline};
use dlock_etcd::EtcdConfig;

const SEQUENTIAL: usize = 2000;
const CONCURRENT: usize = 64;
const WINDOW: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (_server, url) = match external_url("etcd") {
        Some(url) => (None, url),
        None => {
            let server = EtcdServer::start(&ServerConfig::default()).expect("start etcd");
            let url = server.url();
            (Some(server), url)
        }
    };
    let config = EtcdConfig::from_url(&url)?;
    let locker = Arc::new(dlock_etcd::connect(config.clone()).await?);
    let raw = Arc::new(dlock_etcd::raw_baseline(config).await?);
    let opts = LockOptions::new();

    println!("{:<28} {:>10} {:>10} {:>10}", "uncontended, 1 task", "p50", "p99", "ops/s");
    let lib = sequential(|name| {
        let (locker, opts) = (locker.clone(), opts.clone());
        async move { locker.acquire(&name, &opts).await?.release().await }
    })
    .await?;
    report("dlock acquire+release", &lib);
    let base = sequential(|name| {
        let raw = raw.clone();
        async move { raw.acquire_release(&name).await }
    })
    .await?;
    report("raw baseline", &base);

    println!("\n{:<28} {:>10}", format!("disjoint names, {CONCURRENT} tasks"), "ops/s");
    let lib = concurrent({
        let (locker, opts) = (locker.clone(), opts.clone());
        move |name| {
            let (locker, opts) = (locker.clone(), opts.clone());
            async move { locker.acquire(&name, &opts).await?.release().await }
        }
    })
    .await?;
    println!("{:<28} {:>10.0}", "dlock acquire+release", lib);
    let base = concurrent({
        let raw = raw.clone();
        move |name| {
            let raw = raw.clone();
            async move { raw.acquire_release(&name).await }
        }
    })
    .await?;
    println!("{:<28} {:>10.0}", "raw baseline", base);
    Ok(())
}

fn name(task: usize, i: usize) -> LockName {
    LockName::new(format!("bench/{task}/{i}")).expect("name")
}

async fn sequential<F, Fut>(op: F) -> Result<Vec<Duration>, LockError>
where
    F: Fn(LockName) -> Fut,
    Fut: std::future::Future<Output = Result<(), LockError>>,
{
    let mut took = Vec::with_capacity(SEQUENTIAL);
    for i in 0..SEQUENTIAL {
        let started = Instant::now();
        op(name(0, i)).await?;
        took.push(started.elapsed());
    }
    took.sort();
    Ok(took)
}

async fn concurrent<F, Fut>(op: F) -> Result<f64, LockError>
where
    F: Fn(LockName) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), LockError>> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENT)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut done = 0usize;
                while started.elapsed() < WINDOW {
                    op(name(task + 1, done)).await?;
                    done += 1;
                }
                Ok::<_, LockError>(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task")?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn report(what: &str, took: &[Duration]) {
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    let mean = took.iter().sum::<Duration>() / took.len() as u32;
    println!("{what:<28} {:>10.2?} {:>10.2?} {:>10.0}", at(0.5), at(0.99), 1.0 / mean.as_secs_f64());
}
