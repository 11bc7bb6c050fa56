//! Run once per key: a payment request that a client retries must charge the card once.
//!
//! `dlock::idempotent` runs the work under a lease on the request's key and stores its
//! result in the lock's own backend (here Redis), checked against the lease in one atomic
//! step. A duplicate that arrives while the work runs gets the fallback at once; one that
//! arrives later gets the stored result, and the work does not run again.
//!
//! ```sh
//! cargo run -p dlock-examples --bin idempotent -- redis://127.0.0.1:6379
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock::{idempotent, IdempotentOptions, LockName, RunOutcome};
use tokio::sync::Notify;

/// The Redis service of docker-compose.yml (any backend that stores results will do).
const DEFAULT_URL: &str = "redis://127.0.0.1:16379";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DLOCK_URL").ok()).unwrap_or(DEFAULT_URL.into());
    let locker = dlock::connect(&url).await?;
    // The request id a client sends with its payment, and sends again when it retries.
    let request = format!("payments/req-{}", uuid::Uuid::new_v4().simple());
    let key = LockName::new(&request)?;
    // Results kept ten minutes: a retry after that would charge again.
    let opts = IdempotentOptions::new().with_retention(Duration::from_secs(600));
    let charges = AtomicU32::new(0);
    // The duplicate below arrives once the charge has started, and the charge ends only
    // once the duplicate has its answer (or after 10 s), so that the run shows the answer
    // to a duplicate in progress whatever the machine's speed.
    let (charging, answered) = (Notify::new(), Notify::new());
    let charge = |cents| {
        let (charges, charging, answered) = (&charges, &charging, &answered);
        move |lease: dlock::LeaseHandle| async move {
            charges.fetch_add(1, Ordering::Relaxed);
            charging.notify_one();
            let _ = tokio::time::timeout(Duration::from_secs(10), answered.notified()).await;
            charge_card(cents, lease.token().get()).await
        }
    };
    let busy = || "a charge for this request is in progress".to_string();

    // The request, and a duplicate delivered while it runs.
    let (first, during) = tokio::join!(idempotent(&*locker, &key, &opts, charge(4200), busy), async {
        let _ = tokio::time::timeout(Duration::from_secs(10), charging.notified()).await;
        let during = idempotent(&*locker, &key, &opts, charge(4200), busy).await;
        answered.notify_one();
        during
    });
    // The client's retry, after the first has answered.
    let after = idempotent(&*locker, &key, &opts, charge(4200), busy).await?;

    let (RunOutcome::Ran(receipt), RunOutcome::InProgress(answer), RunOutcome::Stored(stored)) =
        (first?, during?, after)
    else {
        return Err("expected one run, one duplicate in progress and one stored answer".into());
    };
    let charged = charges.load(Ordering::Relaxed);
    if charged != 1 || stored != receipt {
        return Err(format!("charged {charged} times; stored {stored:?} for {receipt:?}").into());
    }
    println!(
        "idempotent: {request} charged once ({receipt}); a duplicate during the run got \"{answer}\", the retry afterwards got the stored receipt"
    );
    Ok(())
}

/// The payment provider's call, which takes a while. The fence goes with it, so that the
/// provider could refuse a run whose lease ran out.
async fn charge_card(cents: u64, fence: u64) -> Result<String, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(format!("receipt for {}.{:02} fenced by {fence}", cents / 100, cents % 100))
}
