//! Idempotent execution: run a piece of work once per key, hand later duplicates its
//! stored result, and turn concurrent duplicates away at once.

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{LockError, LostReason};
use crate::lease::{Lease, LeaseHandle};
use crate::locker::Locker;
use crate::name::LockName;
use crate::options::{HoldKind, LockOptions};
use crate::stored::{check_result, StoredResult, MAX_RESULT_BYTES};

/// How [`idempotent`] runs: the lease the work runs under, how long its result is kept,
/// and how large the result may be.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{IdempotentOptions, LockOptions};
///
/// let opts = IdempotentOptions::new()
///     .with_lock(LockOptions::watchdog(Duration::from_secs(10)))
///     .with_retention(Duration::from_secs(24 * 3600))
///     .with_max_bytes(4096);
/// assert_eq!(opts.retention(), Duration::from_secs(86_400));
/// assert_eq!(opts.max_bytes(), 4096);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotentOptions {
    lock: LockOptions,
    retention: Duration,
    max_bytes: usize,
}

impl Default for IdempotentOptions {
    /// A 30 s watchdog lease, results kept for a day, at most 64 KiB each.
    fn default() -> Self {
        IdempotentOptions { lock: LockOptions::new(), retention: Duration::from_secs(24 * 3600), max_bytes: 64 * 1024 }
    }
}

impl IdempotentOptions {
    /// The defaults: a 30 s watchdog lease, results kept for a day, at most 64 KiB each.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease the work runs under. Its wait bound is not used: a duplicate never
    /// waits for the run in progress.
    pub fn with_lock(mut self, lock: LockOptions) -> Self {
        self.lock = lock;
        self
    }

    /// How long a result is kept after the run that stored it (1 ms..=365 days).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The largest encoded result (JSON) kept, at most [`MAX_RESULT_BYTES`]. A larger
    /// result fails the run with [`IdempotentError::TooLarge`] and is not kept.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The lease options.
    pub fn lock(&self) -> &LockOptions {
        &self.lock
    }

    /// How long results are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The largest encoded result kept.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    fn validate(&self) -> Result<(), LockError> {
        self.lock.validate()?;
        if self.lock.hold_kind() != HoldKind::Exclusive {
            return Err(LockError::InvalidInput(format!(
                "idempotent work needs an exclusive lease: a {} hold would let duplicates run at once",
                self.lock.hold_kind().as_str()
            )));
        }
        if self.lock.explicit_owner().is_some() {
            return Err(LockError::InvalidInput(
                "idempotent work takes no explicit owner: a duplicate with the same owner would re-enter the run's \
                 hold and run the work again"
                    .into(),
            ));
        }
        if self.max_bytes == 0 || self.max_bytes > MAX_RESULT_BYTES {
            return Err(LockError::InvalidInput(format!(
                "max_bytes {} is outside 1..={MAX_RESULT_BYTES}",
                self.max_bytes
            )));
        }
        check_result(&[], self.retention)
    }
}

/// What an [`idempotent`] call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome<T> {
    /// This call ran the work; its result is stored for later duplicates.
    Ran(T),
    /// A run before this call finished and stored this result; the work did not run.
    Stored(T),
    /// Another run of the same key is under way; this is the fallback's answer.
    InProgress(T),
}

impl<T> RunOutcome<T> {
    /// The value, whichever way it came.
    pub fn into_value(self) -> T {
        match self {
            RunOutcome::Ran(value) | RunOutcome::Stored(value) | RunOutcome::InProgress(value) => value,
        }
    }

    /// Whether this call ran the work.
    pub fn ran(&self) -> bool {
        matches!(self, RunOutcome::Ran(_))
    }
}

/// Why an [`idempotent`] call failed. The key is free again afterwards (at once, or when
/// the lease's ttl runs out if the backend could not be reached). No result was stored,
/// so a retry runs the work again, unless the error is the store's own and its outcome
/// is unknown (`Unavailable`, `QuorumNotReached`): the record may then have been written,
/// and a retry gets it or runs again.
#[derive(Debug, thiserror::Error)]
pub enum IdempotentError<E> {
    /// The work returned this error.
    #[error("the work failed: {0}")]
    Work(E),
    /// The work's result, encoded, is larger than the bound.
    #[error("the result is {size} bytes, over the bound of {limit}")]
    TooLarge {
        /// The encoded size.
        size: usize,
        /// The bound ([`IdempotentOptions::with_max_bytes`]).
        limit: usize,
    },
    /// The result could not be encoded, or a stored one could not be decoded as `T`.
    #[error("the result could not be encoded or decoded: {0}")]
    Codec(#[source] serde_json::Error),
    /// The lock or the store failed; `Lost` when the lease was lost while the work ran
    /// or before its result was stored.
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// Runs `work` at most once per `key` while its result is kept.
///
/// - The first caller runs `work` under a lease on `key`, stores its result (JSON,
///   with the lease's fencing token) for the retention time, and gets
///   [`RunOutcome::Ran`].
/// - A duplicate while that run is under way does not wait: it gets
///   [`RunOutcome::InProgress`] with `fallback()`'s answer at once.
/// - A duplicate after it gets [`RunOutcome::Stored`] with the stored result; `work`
///   does not run.
/// - A `work` that fails stores nothing and frees the key; a caller that dies while
///   running frees it when its lease runs out. Either way the next call runs again.
///
/// The result is stored in the lock's own backend, in one atomic step with the check that
/// the run's lease is still the live one: a run whose lease ran out while it was paused
/// cannot overwrite the result of a later run. The work is cancelled when its lease is
/// lost. A store whose outcome is unknown (the backend went away) is an error, and a
/// retry may then run the work again: work with outside effects should still fence them
/// with the token its [`LeaseHandle`] carries.
///
/// Needs the `results` capability (`Unsupported` otherwise).
///
/// ```
/// use dlock_core::{idempotent, memory::MemoryStore, IdempotentOptions, LockName, RunOutcome};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locker = MemoryStore::new().client();
/// let key = LockName::new("payments/req-8f2c")?;
/// let opts = IdempotentOptions::new();
/// let charge = |_lease| async { Ok::<_, std::io::Error>("charged 42.00".to_string()) };
///
/// let first = idempotent(&locker, &key, &opts, charge, || "in progress".to_string()).await?;
/// assert_eq!(first, RunOutcome::Ran("charged 42.00".to_string()));
///
/// // A retry of the same request gets the stored answer; the charge does not run again.
/// let again = idempotent(&locker, &key, &opts, |_| async { unreachable!() }, || "in progress".to_string()).await;
/// assert_eq!(again.map_err(|e: dlock_core::IdempotentError<std::io::Error>| e.to_string())?, RunOutcome::Stored("charged 42.00".to_string()));
/// # Ok(()) }
/// ```
pub async fn idempotent<L, T, E, W, Fut, F>(
    locker: &L,
    key: &LockName,
    opts: &IdempotentOptions,
    work: W,
    fallback: F,
) -> Result<RunOutcome<T>, IdempotentError<E>>
where
    L: Locker + ?Sized,
    T: Serialize + DeserializeOwned,
    W: FnOnce(LeaseHandle) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    F: FnOnce() -> T,
{
    opts.validate()?;
    if let Some(stored) = locker.load_result(key).await? {
        return Ok(RunOutcome::Stored(decode(&stored)?));
    }
    let Some(lease) = locker.try_acquire(key, &opts.lock).await? else {
        return Ok(RunOutcome::InProgress(fallback()));
    };
    // A run may have stored its result and let go between the look and the grant.
    match locker.load_result(key).await {
        Ok(None) => {}
        Ok(Some(stored)) => {
            let _ = lease.release().await;
            return Ok(RunOutcome::Stored(decode(&stored)?));
        }
        Err(err) => return Err(give_up(lease, err).await),
    }
    let handle = lease.handle();
    let outcome = tokio::select! {
        biased;
        reason = handle.lost() => return Err(give_up(lease, LockError::lost(reason).named(handle.name())).await),
        outcome = work(lease.handle()) => outcome,
    };
    let value = match outcome {
        Ok(value) => value,
        Err(err) => {
            let _ = lease.release().await;
            return Err(IdempotentError::Work(err));
        }
    };
    let bytes = match serde_json::to_vec(&value) {
        Ok(bytes) if bytes.len() > opts.max_bytes => {
            let _ = lease.release().await;
            return Err(IdempotentError::TooLarge { size: bytes.len(), limit: opts.max_bytes });
        }
        Ok(bytes) => bytes,
        Err(err) => {
            let _ = lease.release().await;
            return Err(IdempotentError::Codec(err));
        }
    };
    match lease.store_result(&bytes, opts.retention).await {
        Ok(()) => {}
        Err(LockError::NotHeld { .. }) => {
            let reason = handle.lost_reason().unwrap_or(LostReason::Expired);
            return Err(give_up(lease, LockError::lost(reason).named(handle.name())).await);
        }
        Err(err) => return Err(give_up(lease, err).await),
    }
    // The result is stored; a release that fails only leaves the key to its ttl, and
    // duplicates meanwhile are told the run is in progress.
    if let Err(err) = lease.release().await {
        tracing::warn!(lock = %key, error = %err, "releasing after storing the result failed");
    }
    Ok(RunOutcome::Ran(value))
}

async fn give_up<E>(lease: Lease, err: LockError) -> IdempotentError<E> {
    // Owner-checked: frees whatever is left of the hold, touches nobody else's.
    let _ = lease.release().await;
    IdempotentError::Lock(err)
}

fn decode<T: DeserializeOwned, E>(stored: &StoredResult) -> Result<T, IdempotentError<E>> {
    serde_json::from_slice(&stored.value).map_err(IdempotentError::Codec)
}
