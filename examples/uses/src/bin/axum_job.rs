//! A web service whose replicas share a job endpoint, with a graceful shutdown.
//!
//! `POST /jobs/{name}` starts the job under the lock `jobs/{name}` and answers at once:
//! `202` with the fencing token, or `409` when a replica already runs it. The job holds a
//! watchdog lease, so it may run for as long as it needs, and a replica that crashes frees
//! the lock within the ttl.
//!
//! On SIGTERM (a rolling deploy, `docker stop`, Kubernetes) the service stops taking
//! requests, stops its running jobs and releases their leases before it exits: the next
//! replica can start the job at once instead of waiting out the ttl of a lease nobody
//! renews any more. (Dropping a lease also releases it, but in the background, which a
//! process that exits right after does not wait for.)
//!
//! ```sh
//! cargo run -p dlock-examples --bin axum_job -- redis://127.0.0.1:6379 127.0.0.1:3000
//! curl -X POST http://127.0.0.1:3000/jobs/nightly-report
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use dlock::{FencingToken, Lease, LockError, LockName, LockOptions, Locker};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The Redis service of docker-compose.yml.
const DEFAULT_URL: &str = "redis://127.0.0.1:16379";
/// Where the service listens unless the second argument or `DLOCK_LISTEN` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:3000";

/// What the handlers share.
#[derive(Clone)]
struct App {
    locker: Arc<dyn Locker>,
    /// Turns true at shutdown: running jobs stop and release their leases.
    stop: watch::Receiver<bool>,
    /// The running jobs, awaited before the process exits.
    jobs: Arc<Mutex<JoinSet<Result<(), LockError>>>>,
    started: Arc<AtomicUsize>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let listen = args.next().or_else(|| std::env::var("DLOCK_LISTEN").ok()).unwrap_or(DEFAULT_LISTEN.into());
    // Taken before anything else, so that an early SIGTERM shuts down gracefully too.
    let mut terminate = signal(SignalKind::terminate())?;

    let (stop, stopping) = watch::channel(false);
    let app =
        App { locker: dlock::connect(&url).await?, stop: stopping, jobs: Arc::default(), started: Arc::default() };
    let router = Router::new().route("/jobs/{name}", post(start_job)).with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("axum_job: listening on http://{}", listener.local_addr()?);

    // Stops accepting at SIGTERM or Ctrl-C, and returns once the requests under way are
    // answered.
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                Ok(()) = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;

    // No request can start a job any more: stop the running ones and wait until each has
    // released its lease.
    stop.send_replace(true);
    let mut jobs = std::mem::take(&mut *app.jobs.lock().unwrap_or_else(PoisonError::into_inner));
    let mut released = 0;
    while let Some(job) = jobs.join_next().await {
        job??;
        released += 1;
    }
    println!(
        "axum_job: started {} job(s); shut down on a signal after releasing {released} lease(s)",
        app.started.load(Ordering::Relaxed)
    );
    Ok(())
}

/// `POST /jobs/{name}`: starts the job unless a replica runs it already.
async fn start_job(State(app): State<App>, Path(job): Path<String>) -> (StatusCode, String) {
    let name = match LockName::new(format!("jobs/{job}")) {
        Ok(name) => name,
        Err(err) => return (StatusCode::BAD_REQUEST, format!("{err}\n")),
    };
    // A watchdog lease: renewed while the job runs, freed within 10 s if this process dies.
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    match app.locker.try_acquire(&name, &opts).await {
        Ok(Some(lease)) => {
            let token = lease.token();
            app.started.fetch_add(1, Ordering::Relaxed);
            app.jobs.lock().unwrap_or_else(PoisonError::into_inner).spawn(run_job(lease, app.stop.clone()));
            (StatusCode::ACCEPTED, format!("started {name} with token {token}\n"))
        }
        Ok(None) => (StatusCode::CONFLICT, format!("{name} is already running\n")),
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")),
    }
}

/// Runs the job until it finishes, its lease is lost or the service shuts down, then
/// releases the lease (`NotHeld` when it was lost: nothing to free).
async fn run_job(lease: Lease, mut stop: watch::Receiver<bool>) -> Result<(), LockError> {
    let ended = tokio::select! {
        reason = lease.lost() => format!("lost its lease ({reason})"),
        _ = stop.wait_for(|stop| *stop) => "stopped for the shutdown".to_string(),
        () = make_report(lease.token()) => "finished".to_string(),
    };
    eprintln!("axum_job: {} {ended}", lease.name());
    match lease.release().await {
        Err(LockError::NotHeld { .. }) => Ok(()),
        other => other,
    }
}

/// The job: a long report whose writes would carry `token`, so that the store refuses
/// them once a later holder has written.
async fn make_report(token: FencingToken) {
    let _ = token;
    tokio::time::sleep(Duration::from_secs(60)).await;
}
