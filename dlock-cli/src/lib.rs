//! The `dlock` command: run a command under a distributed lock, demo the oversell story,
//! inspect a lock, check a live backend against the conformance suite, benchmark backends.
//!
//! The command is this crate's binary. As a library it offers one function, [`main`], so
//! that a backend that lives outside dlock can have its own `dlock` command: register
//! the driver, then hand over to [`main`]; `dlock check`, `run`, `inspect` and the rest
//! then reach it by its URL scheme.
//!
//! ```no_run
//! use std::sync::Arc;
//! use dlock::{memory::MemoryStore, Locker};
//!
//! fn connect(_url: String) -> dlock::Connecting {
//!     Box::pin(async { Ok(Arc::new(MemoryStore::new().client()) as Arc<dyn Locker>) })
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     if let Err(err) = dlock::register_driver("toy", &["toy"], connect) {
//!         eprintln!("{err}");
//!         return std::process::ExitCode::from(64);
//!     }
//!     dlock_cli::main()
//! }
//! ```

mod bench;
mod check;
mod demo;
mod exit;
mod gc;
mod inspect;
mod run;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use exit::{Failure, USAGE};

/// Distributed locks with fencing tokens, from the shell.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, about, long_about = None)]
struct Cli {
    /// The backend, e.g. redis://127.0.0.1:6379, postgres://user@host/db, zk://host:2181/locks.
    /// Default: a SQLite file in your data directory.
    /// `dlock bench` takes several.
    #[arg(long, global = true, env = "DLOCK_URL", action = clap::ArgAction::Append)]
    url: Vec<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock; exit with its exit code.
    ///
    /// Exit codes of dlock itself: 75 the lock was not acquired within --wait, 76 the lease
    /// was lost while the command ran (the command got SIGTERM), 69 the backend is
    /// unreachable, 77 the connection was refused for its credentials or TLS, 64 bad
    /// arguments or URL.
    Run(run::RunArgs),
    /// Run a command while this process leads an election; exit with its exit code.
    ///
    /// The command sees DLOCK_TERM (the term, strictly higher for every later leader: pass
    /// it with its writes). Losing the leadership stops it as a lost lease stops `run`
    /// (exit 76); 75 when --wait ran out before this process was elected.
    Elect(run::ElectArgs),
    /// Show the oversell problem, its fix with a lock, and fencing of a paused holder.
    Demo(demo::DemoArgs),
    /// Show a lock's holder, token, remaining ttl and waiters.
    Inspect(inspect::InspectArgs),
    /// Remove what the backend keeps for names nobody uses any more: results past their
    /// retention, and the token counters of names idle for the backend's keep time (the
    /// URL's keep_idle, an hour by default); tokens never go back. Clients do it in the
    /// background every 10 minutes; this does it now.
    Gc(gc::GcArgs),
    /// Run the conformance properties that need no server control against a live backend.
    Check(check::CheckArgs),
    /// Benchmark backends against raw baselines of their own commands.
    Bench(bench::BenchArgs),
}

/// Runs the `dlock` command with this process's arguments, and returns its exit code
/// (the codes `dlock --help` lists). Drivers added with [`dlock::register_driver`]
/// before the call are reachable by their URL schemes.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DLOCK_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return Failure::new(exit::UNAVAILABLE, format!("cannot start the runtime: {e}")).report(),
    };
    // The command runs as a task on the runtime's workers, as application code does, not
    // on the thread that blocks on it (which would add a thread hand-off to every await).
    let task = runtime.spawn(async move {
        match cli.command {
            Command::Bench(args) => bench::bench(cli.url, args).await,
            command => {
                let url = target::single(cli.url)?;
                match command {
                    Command::Run(args) => run::run(url, args).await,
                    Command::Elect(args) => run::elect(url, args).await,
                    Command::Demo(args) => demo::demo(url, args).await,
                    Command::Inspect(args) => inspect::inspect(url, args).await,
                    Command::Gc(args) => gc::gc(url, args).await,
                    Command::Check(args) => check::check(url, args).await,
                    Command::Bench(_) => unreachable!("handled above"),
                }
            }
        }
    });
    let outcome = runtime
        .block_on(task)
        .unwrap_or_else(|e| Err(Failure::new(exit::UNAVAILABLE, format!("the command failed: {e}"))));
    // Background releases of dropped leases get a moment to finish.
    runtime.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}

/// A duration argument: `500ms`, `30s`, `2m`, `1h` (a bare number is seconds).
fn duration_arg(text: &str) -> Result<Duration, String> {
    dlock::parse_duration(text).map_err(|e| e.to_string())
}
