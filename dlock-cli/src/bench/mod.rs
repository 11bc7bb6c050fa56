//! `dlock bench`: the scenarios of docs/design.md on every given backend, each beside a raw
//! baseline of the same backend commands sent without the library, so that the
//! library's overhead is a ratio measured in one run.

mod report;
mod scenarios;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::exit::Failure;
use crate::{duration_arg, target};

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Which scenarios to run (repeatable); default: all.
    #[arg(long, value_enum)]
    scenario: Vec<Scenario>,
    /// Where to write bench.json and bench.svg.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Acquire+release pairs measured in the uncontended scenario.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Hand-offs measured in the contended scenario.
    #[arg(long, default_value_t = 200)]
    handoffs: usize,
    /// Concurrent tasks for the disjoint-key throughput scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    tasks: Vec<usize>,
    /// How long each throughput and fairness point runs.
    #[arg(long, default_value = "3s", value_parser = duration_arg)]
    duration: Duration,
    /// Waiter counts of the herd scenario, spread over its 8 clients.
    #[arg(long, value_delimiter = ',', default_value = "8,64,512")]
    waiters: Vec<usize>,
    /// Leases held at once in the renewal scenario (each count its own point).
    #[arg(long, value_delimiter = ',', default_value = "5000")]
    leases: Vec<usize>,
    /// The watchdog ttl in the renewal scenario (renewed every ttl/3).
    #[arg(long, default_value = "3s", value_parser = duration_arg)]
    renew_ttl: Duration,
}

/// A benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// Uncontended acquire+release latency (p50/p99/p999).
    Uncontended,
    /// Disjoint-key acquire+release throughput at 1, 8, 64 tasks.
    Throughput,
    /// Contended hand-off latency: release ack to the next holder's acquire ack.
    Handoff,
    /// Fairness of 8 contending clients, as Jain's index over their grant counts.
    Fairness,
    /// W waiters on one name over 8 clients (W from --waiters), each holding for 1 ms:
    /// hand-offs per second, p50/p99 wait and attempts sent per grant, as W grows.
    Herd,
    /// Thousands of leases renewed at once: renewals, leases lost, and the client's CPU
    /// share and resident memory per lease while it renews them.
    Renewal,
    /// 8 tasks sharing one client, each holding for 1 ms: grants and hand-offs between
    /// tasks per second, p99 and longest wait, Jain's index over the tasks; in any order
    /// and (where the backend is FIFO) fair.
    Shared,
    /// Idempotent execution: a first run (look, lock, store, release) and a replay.
    Idempotent,
    /// A multi-lock of 3 names, uncontended acquire+release.
    Multi,
    /// Read-write lock, semaphore and election: uncontended acquire+release of each.
    Primitives,
}

impl Scenario {
    const ALL: [Scenario; 10] = [
        Scenario::Uncontended,
        Scenario::Throughput,
        Scenario::Handoff,
        Scenario::Fairness,
        Scenario::Herd,
        Scenario::Renewal,
        Scenario::Shared,
        Scenario::Idempotent,
        Scenario::Multi,
        Scenario::Primitives,
    ];
}

pub(crate) async fn bench(urls: Vec<String>, args: BenchArgs) -> Result<ExitCode, Failure> {
    let urls = if urls.is_empty() { vec![target::resolve(None)?] } else { urls };
    let scenarios = if args.scenario.is_empty() { Scenario::ALL.to_vec() } else { args.scenario.clone() };
    let mut rows = Vec::new();
    for url in &urls {
        let locker = dlock::connect(url).await?;
        let raw: Arc<dyn dlock::RawBaseline> = Arc::from(dlock::raw_baseline(url).await?);
        let backend = format!("{} ({})", locker.backend_name(), dlock::redact(url));
        let bench = scenarios::Bench { url: url.clone(), backend, locker, raw, args: &args };
        for scenario in &scenarios {
            rows.extend(bench.run(*scenario).await?);
        }
    }
    report::print_table(&rows);
    report::write_files(&args.out, &rows)?;
    println!("\nwrote {} and {}", args.out.join("bench.json").display(), args.out.join("bench.svg").display());
    Ok(ExitCode::SUCCESS)
}
