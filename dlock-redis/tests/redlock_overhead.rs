//! Uncontended acquire+release latency of RedLock over five local masters against one
//! single server, printed, not asserted (speed is measured, never tested). It does what
//! `dlock bench`'s uncontended scenario does (the library and the raw baseline alternate
//! on one name), for each backend in turn, in short interleaved rounds so that the load
//! of a shared machine hits all alike, and reports the median of the rounds' p50s. Run
//! it in release mode:
//!
//! ```text
//! cargo nextest run --release -p dlock-redis --test redlock_overhead --run-ignored only --no-capture
//! ```

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::supervisor::redis::{RedisConfig as ServerConfig, RedisMasters, RedisServer};
use dlock_core::{LockName, LockOptions, Locker, RawBaseline};
use dlock_redis::redlock::{self, RedLockConfig, TokenSource};
use dlock_redis::Node;

const ROUNDS: usize = 15;
const ITERATIONS: usize = 200;

struct Variant {
    label: String,
    locker: Arc<dyn Locker>,
    raw: Arc<dyn RawBaseline>,
    /// The p50s of the library and of the raw baseline, one per round, in µs.
    lib: Vec<f64>,
    raw_p50: Vec<f64>,
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One round of one variant: `ITERATIONS` acquire+release pairs of the library, each
/// followed by one of the raw baseline, on the same name.
async fn round(variant: &mut Variant, name: &LockName) {
    let (mut lib, mut raw) = (Vec::with_capacity(ITERATIONS), Vec::with_capacity(ITERATIONS));
    for _ in 0..ITERATIONS {
        let started = Instant::now();
        variant.locker.acquire(name, &LockOptions::new()).await.unwrap().release().await.unwrap();
        lib.push(started.elapsed());
        let started = Instant::now();
        variant.raw.acquire_release(name).await.unwrap();
        raw.push(started.elapsed());
    }
    variant.lib.push(p50(lib));
    variant.raw_p50.push(p50(raw));
}

/// The floor of one fan-out on this machine: a bare `PING` to each of `conns` at once.
async fn ping_fan_out(conns: &[redis::aio::MultiplexedConnection]) -> Duration {
    let started = Instant::now();
    futures::future::join_all(conns.iter().map(|conn| {
        let mut conn = conn.clone();
        async move { redis::cmd("PING").query_async::<String>(&mut conn).await.unwrap() }
    }))
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run it in release mode with --run-ignored only"]
async fn redlock_versus_single_instance() {
    let single = RedisServer::start(&ServerConfig::default()).unwrap();
    let masters = RedisMasters::start(5, &ServerConfig::default()).unwrap();
    let single_config = support::client_config(single.addr()).with_op_timeout(Duration::from_secs(5));
    let nodes: Vec<Node> = masters.addrs().iter().map(|a| Node::new(a.ip().to_string(), a.port())).collect();
    let redlock_config = |count: usize, source| {
        RedLockConfig::new(nodes[..count].to_vec())
            .with_op_timeout(Duration::from_secs(5))
            .with_node_timeout(Duration::from_millis(500))
            .with_token_source(source)
    };
    let mut variants = vec![Variant {
        label: "single instance".into(),
        locker: Arc::new(dlock_redis::connect(single_config.clone()).await.unwrap()),
        raw: Arc::new(dlock_redis::raw_baseline(single_config).await.unwrap()),
        lib: Vec::new(),
        raw_p50: Vec::new(),
    }];
    for (count, source) in
        [(1, TokenSource::Clock), (3, TokenSource::Clock), (5, TokenSource::Clock), (5, TokenSource::ReadFirst)]
    {
        let tokens = if source == TokenSource::Clock { "clock" } else { "read" };
        variants.push(Variant {
            label: format!("RedLock x{count}, tokens={tokens}"),
            locker: Arc::new(redlock::connect(redlock_config(count, source)).await.unwrap()),
            raw: Arc::new(redlock::raw_baseline(redlock_config(count, source)).await.unwrap()),
            lib: Vec::new(),
            raw_p50: Vec::new(),
        });
    }
    let mut pings = Vec::new();
    for addr in masters.addrs() {
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        pings.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let (mut ping_one, mut ping_five) = (Vec::new(), Vec::new());

    for (index, variant) in variants.iter_mut().enumerate() {
        // Warm up connections and scripts.
        round(variant, &LockName::new(format!("overhead/warm-up/{index}")).unwrap()).await;
        variant.lib.clear();
        variant.raw_p50.clear();
    }
    for r in 0..ROUNDS {
        for (index, variant) in variants.iter_mut().enumerate() {
            round(variant, &LockName::new(format!("overhead/{index}/{r}")).unwrap()).await;
        }
        let (mut one, mut five) = (Vec::new(), Vec::new());
        for _ in 0..ITERATIONS {
            one.push(ping_fan_out(&pings[..1]).await);
            five.push(ping_fan_out(&pings).await);
        }
        ping_one.push(p50(one));
        ping_five.push(p50(five));
    }
    let single_p50 = median(variants[0].lib.clone());
    println!("uncontended acquire+release, median of {ROUNDS} rounds of {ITERATIONS} (p50 per round):");
    for variant in &variants {
        let (lib, raw) = (median(variant.lib.clone()), median(variant.raw_p50.clone()));
        println!(
            "  {:<26} dlock p50 {lib:>7.1} µs  raw p50 {raw:>7.1} µs  dlock/raw {:.2}  vs single instance {:.2}x",
            variant.label,
            lib / raw,
            lib / single_p50
        );
    }
    let (one, five) = (median(ping_one), median(ping_five));
    println!(
        "the floor of one fan-out here: PING to 1 connection {one:.1} µs, to 5 at once {five:.1} µs ({:.2}x)",
        five / one
    );
}
