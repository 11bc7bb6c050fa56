//! `nemesis`: clients in their own processes loop acquire → fenced write → release on one
//! lock while a fault schedule drawn from a seed pauses them, plays faults on their links
//! and kills servers; the history checker and the fenced register judge the run.
//!
//! ```text
//! cargo run -p dlock-nemesis --release -- --topology redis --clients 8 --duration 10m --seed 1
//! ```
//!
//! Exit codes: 0 a clean run (or a run of a topology documented unsafe, labelled so),
//! 1 anomalies found, 2 the run itself failed or proves nothing (no hold, no write, no
//! fault played, a fault that failed to apply, a register the clients could not reach).

mod client;
mod clock;
mod mutant;
mod plan;
mod register;
mod run;
mod skew;
mod strike;
mod topology;
mod verdict;
mod work;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "nemesis", about = "A randomized fault run against a dlock backend, judged by the history checker")]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// One client of a run (started by the run itself).
    #[command(hide = true)]
    Client(client::ClientArgs),
}

/// What a run is asked to do.
#[derive(Debug, Clone, clap::Args)]
struct RunArgs {
    /// A backend the run does not start; only client pauses are played against it.
    #[arg(long, conflicts_with = "topology")]
    url: Option<String>,
    /// The servers to start, each client reaching them through proxies of its own.
    #[arg(long, default_value = "sqlite", value_parser = clap::builder::PossibleValuesParser::new(topology::NAMES))]
    topology: String,
    /// Client processes contending for the lock.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// How long the clients run (e.g. 30s, 10m).
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed of the fault schedule: the same seed replays the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The clients' lease ttl (watchdog leases); faults last about as long.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// What the clients do: exclusive holds, readers and writers, permits of mixed
    /// counts, or `idempotent` work.
    #[arg(long, value_enum, default_value_t = client::Mode::Lock)]
    mode: client::Mode,
    /// Plants a defect the verdict must catch (see the README's nemesis section).
    #[arg(long, value_enum)]
    mutant: Option<mutant::Mutant>,
    /// Also write the verdict to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write every fault played to this file, one JSON object per line.
    #[arg(long)]
    timeline: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.role {
        // One thread: the client's lost-signal watcher and its loop never write their
        // events file at the same moment.
        Some(Role::Client(args)) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime.map_err(Into::into).and_then(|rt| rt.block_on(client::run(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("nemesis client: {err}");
                    ExitCode::from(2)
                }
            }
        }
        None => {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
            let verdict = runtime.map_err(Into::into).and_then(|rt| rt.block_on(run::run(&cli.run)));
            match verdict {
                Ok((verdict, timeline)) => {
                    println!("{verdict}");
                    if let Some(path) = &cli.run.json {
                        let text = serde_json::to_string_pretty(&verdict.to_json()).unwrap_or_default();
                        if let Err(err) = std::fs::write(path, text + "\n") {
                            eprintln!("nemesis: cannot write {}: {err}", path.display());
                            return ExitCode::from(2);
                        }
                    }
                    if let Some(path) = &cli.run.timeline {
                        if let Err(err) = std::fs::write(path, timeline) {
                            eprintln!("nemesis: cannot write {}: {err}", path.display());
                            return ExitCode::from(2);
                        }
                    }
                    if verdict.anomalies() > 0 && verdict.run.unsafe_by_design.is_none() {
                        ExitCode::from(1)
                    } else if !verdict.proves_nothing().is_empty() {
                        ExitCode::from(2)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(err) => {
                    eprintln!("nemesis: {err}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
