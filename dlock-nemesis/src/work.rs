//! The `idempotent` mode of a client: runs the work of one of a few dozen keys at a
//! time, each key's work once, and logs each run and its outcome so that the verdict
//! can find a key whose work ran again after its result was stored.

use std::time::Duration;

use dlock::{idempotent, IdempotentOptions, LockName, LockOptions, Locker, RunOutcome};

use crate::client::{ClientArgs, Log};
use crate::clock::now_ns;

/// How many keys the clients share at a time: few enough that duplicates are common.
pub(crate) const KEYS: usize = 32;

/// How long one set of keys is in use, in ttls: then the clients move on to new keys,
/// so that work keeps running all run long instead of only answering stored results.
const GENERATION_TTLS: u32 = 4;

/// Events: `work start` (inside the work, with the run's token), then one of `work ran`
/// (stored and acknowledged), `work stored` (a stored result answered), `work busy` (a
/// run was in progress) or `work error`, each with the key as its extra field.
pub(crate) async fn run(
    args: &ClientArgs,
    locker: &dyn Locker,
    log: &mut Log,
    rng: &mut fastrand::Rng,
) -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let opts = IdempotentOptions::new().with_lock(LockOptions::watchdog(ttl)).with_retention(Duration::from_secs(3600));
    while now_ns() < args.until_ns {
        let generation = crate::clock::since(args.epoch_ns).as_nanos() / (ttl * GENERATION_TTLS).as_nanos();
        let key = usize::try_from(generation).unwrap_or(usize::MAX / 2 / KEYS) * KEYS + rng.usize(..KEYS);
        let name = LockName::new(format!("{}/{key}", crate::client::LOCK))?;
        let length = ttl.mul_f64(rng.f64() / 2.0);
        let mut starts = log.try_clone()?;
        let started = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let work = {
            let started = started.clone();
            move |lease: dlock::LeaseHandle| {
                let token = lease.token().get();
                // The same self-check as a holder's before each write: a client paused
                // between the grant and the start finds its lease run out, and does not
                // start work another client may be running by now.
                let valid = !lease.is_lost() && !lease.remaining().is_zero();
                if valid {
                    started.store(token, std::sync::atomic::Ordering::SeqCst);
                    starts.event("work", "start", Some(token), &key.to_string());
                }
                async move {
                    if !valid {
                        return Err(RanOut);
                    }
                    tokio::time::sleep(length).await;
                    Ok(token)
                }
            }
        };
        let outcome = idempotent(locker, &name, &opts, work, || 0).await;
        let started = Some(started.load(std::sync::atomic::Ordering::SeqCst)).filter(|t| *t != 0);
        let (phase, token) = match outcome {
            Ok(RunOutcome::Ran(token)) => ("ran", Some(token)),
            Ok(RunOutcome::Stored(token)) => ("stored", Some(token)),
            Ok(RunOutcome::InProgress(_)) => ("busy", None),
            Err(_) => ("error", started),
        };
        log.event("work", phase, token, &key.to_string());
        if phase == "busy" || phase == "error" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Work not started: the lease had run out by the time the work was to start.
#[derive(Debug)]
struct RanOut;

impl std::fmt::Display for RanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lease ran out before the work started")
    }
}
