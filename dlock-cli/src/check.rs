//! `dlock check`: the conformance properties that need no server control, against a
//! live backend.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use dlock::{ClientConfig, Locker};
use dlock_conformance::properties::{cases, Case};
use dlock_conformance::{Fixture, Needs, Timing};
use dlock_core::backend::lock_unpoisoned;

use crate::exit::Failure;
use crate::{duration_arg, target};

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The short ttl the time-based properties use; the backend must honour it.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    ttl: Duration,
    /// Slack added to every time bound.
    #[arg(long, default_value = "3s", value_parser = duration_arg)]
    margin: Duration,
    /// Run only the properties whose name contains this text.
    #[arg(long)]
    only: Option<String>,
}

/// A live backend reached by URL: clients only, no control over the server.
struct Live {
    url: String,
    timing: Timing,
}

#[async_trait]
impl Fixture for Live {
    fn timing(&self) -> Timing {
        self.timing
    }

    async fn client(&self) -> Arc<dyn Locker> {
        dlock::connect(&self.url).await.unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}

pub(crate) async fn check(url: Option<String>, args: CheckArgs) -> Result<ExitCode, Failure> {
    let url = target::resolve(url)?;
    // Connect once up front so that a bad URL or a dead server is one clear error.
    let probe = dlock::connect(&url).await?;
    let backend = probe.backend_name();
    drop(probe);

    // The URL's own op_timeout, if it sets one, only makes calls fail sooner; the
    // properties run here do not depend on it.
    // Only the properties that need nothing but clients run here; none of them waits for
    // idle names to go, so the backends' default keep time stands.
    let timing = Timing {
        ttl: args.ttl,
        margin: args.margin,
        op_timeout: ClientConfig::default().op_timeout,
        idle: dlock_core::DEFAULT_KEEP_IDLE,
    };
    let fixture: Arc<dyn Fixture> = Arc::new(Live { url: url.clone(), timing });
    let selected: Vec<Case> =
        cases().into_iter().filter(|c| args.only.as_deref().is_none_or(|text| c.name.contains(text))).collect();
    let (runnable, skipped): (Vec<Case>, Vec<Case>) = selected.into_iter().partition(|c| c.needs() == Needs::Clients);

    let panics = capture_panic_messages();
    println!("dlock check: {backend} at {url}");
    println!("{:<40} {:<6} {:>8}  detail", "property", "result", "time");
    let mut failed = 0;
    for case in &runnable {
        let started = Instant::now();
        let (fixture, case) = (fixture.clone(), *case);
        let run = tokio::spawn(async move {
            if let Some(run) = case.run_on_clients(&*fixture) {
                run.await;
            }
        });
        let outcome = run.await;
        let took = started.elapsed();
        let (result, detail) = match outcome {
            Ok(()) => ("pass", String::new()),
            Err(_) => {
                failed += 1;
                let message = lock_unpoisoned(&panics).take().unwrap_or_default();
                ("FAIL", message.lines().next().unwrap_or_default().to_string())
            }
        };
        println!("{:<40} {:<6} {:>7.2}s  {detail}", case.name, result, took.as_secs_f64());
    }
    println!(
        "\n{} passed, {failed} failed; {} more need control over the server (faults, restarts) and run in the backend's own test suite",
        runnable.len() - failed,
        skipped.len()
    );
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Keeps the last panic message instead of printing it, so the table stays readable.
fn capture_panic_messages() -> Arc<Mutex<Option<String>>> {
    let slot = Arc::new(Mutex::new(None));
    let hook_slot = slot.clone();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".to_string());
        *lock_unpoisoned(&hook_slot) = Some(text);
    }));
    slot
}
