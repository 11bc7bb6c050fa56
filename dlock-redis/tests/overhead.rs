//! The library's overhead over the raw script calls, printed, not asserted (speed is
//! measured, never tested). Run it in release mode:
//!
//! ```text
//! cargo nextest run --release -p dlock-redis --test overhead --run-ignored only --no-capture
//! ```

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::supervisor::redis::{RedisConfig as ServerConfig, RedisServer};
use dlock_core::{Attempt, Backend, LeaseMode, LockName, LockOptions, Locker, OwnerId, RawBaseline, Request};

const RUN_FOR: Duration = Duration::from_millis(300);
const ROUNDS: usize = 15;

/// Acquire+release pairs per second with `tasks` tasks, each on its own name.
async fn rate<F, Fut>(tasks: usize, op: F) -> f64
where
    F: Fn(LockName) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let name = LockName::new(format!("overhead/{task}")).unwrap();
            let mut done = 0u64;
            while started.elapsed() < RUN_FOR {
                op(name.clone()).await;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for handle in handles {
        total += handle.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// The median of `rates`.
fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run it in release mode with --run-ignored only"]
async fn library_versus_raw_script_calls() {
    let server = RedisServer::start(&ServerConfig::default()).unwrap();
    let config = support::client_config(server.addr()).with_op_timeout(Duration::from_secs(5));
    let locker = Arc::new(dlock_redis::connect(config.clone()).await.unwrap());
    let raw = Arc::new(dlock_redis::raw_baseline(config).await.unwrap());
    for tasks in [1, 64] {
        // Short runs of each, interleaved, so that the load of a shared machine hits all alike.
        let (mut raw_rates, mut backend_rates, mut lib_rates) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let raw = raw.clone();
            raw_rates.push(
                rate(tasks, move |name| {
                    let raw = raw.clone();
                    async move { raw.acquire_release(&name).await.unwrap() }
                })
                .await,
            );
            // The backend's own attempt and release, without the client around them.
            let backend_locker = locker.clone();
            backend_rates.push(
                rate(tasks, move |name| {
                    let locker = backend_locker.clone();
                    async move {
                        let owner = OwnerId::new(format!("bench:{}", fastrand::u64(..))).unwrap();
                        let req = Request { name, owner, mode: LeaseMode::default(), blocking: true, fair: false };
                        match locker.backend().attempt(&req, &mut None).await.unwrap() {
                            Attempt::Granted { hold, .. } => drop(locker.backend().release(&hold).await.unwrap()),
                            Attempt::Busy { .. } => panic!("busy"),
                        }
                    }
                })
                .await,
            );
            let lib_locker = locker.clone();
            lib_rates.push(
                rate(tasks, move |name| {
                    let locker = lib_locker.clone();
                    async move {
                        let lease = locker.acquire(&name, &LockOptions::new()).await.unwrap();
                        lease.release().await.unwrap();
                    }
                })
                .await,
            );
        }
        let (raw_rate, backend_rate, lib_rate) = (median(raw_rates), median(backend_rates), median(lib_rates));
        println!(
            "tasks {tasks:>2}: median of {ROUNDS} runs: raw {raw_rate:>7.0}/s  backend {backend_rate:>7.0}/s  \
             dlock {lib_rate:>7.0}/s  cost ratio: backend {:.3}, dlock {:.3}",
            raw_rate / backend_rate,
            raw_rate / lib_rate
        );
    }
}
