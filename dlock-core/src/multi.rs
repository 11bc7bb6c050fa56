//! Several locks taken as one, all or nothing, in one global order.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::error::{LockError, LostReason};
use crate::lease::Lease;
use crate::locker::Locker;
use crate::name::LockName;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// Several names, on one locker or on several (even of different backends), acquired
/// all or nothing.
///
/// The parts are always taken in one global order (by name, then by the server and
/// namespace the locker's locks live on, [`Locker::target`]), whatever order they were
/// given in, so two multi-locks over overlapping sets never wait on each other in a
/// cycle, in one process or in several.
///
/// An acquire that fails (timeout, error, cancellation) gives back every part it already
/// took. One that succeeds has every part live when it returns: once the last part is
/// taken, the earlier ones are checked, and `Fixed` ones extended to their full ttl, as
/// Redisson's `MultiLock` does; if a part lapsed while the later ones were awaited (its
/// fixed ttl ran out, its renewal failed), every part is given back and the acquire
/// starts over within its wait bound. The [`MultiLease`] it returns carries every part's
/// token, fires its lost signal when any part is lost, and releases every part.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock_core::{memory::MemoryStore, LockName, LockOptions, Locker, MultiLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let locker: Arc<dyn Locker> = Arc::new(MemoryStore::new().client());
/// let transfer = MultiLock::on(locker.clone(), [LockName::new("account/7")?, LockName::new("account/3")?])?;
///
/// let lease = transfer.acquire(&LockOptions::new().wait(Duration::from_secs(5))).await?;
/// assert_eq!(lease.tokens().len(), 2);
/// // ... move money between the two accounts, fencing each write with its part's token ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MultiLock {
    /// In acquisition order.
    parts: Vec<Part>,
}

#[derive(Clone)]
struct Part {
    locker: Arc<dyn Locker>,
    name: LockName,
    /// The locker's [`Locker::target`], read once.
    target: String,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.parts.iter().map(|p| format!("{}:{}", p.locker.backend_name(), p.name))).finish()
    }
}

impl MultiLock {
    /// A multi-lock of no parts; add them with [`with`](MultiLock::with).
    pub fn new() -> Self {
        Self::default()
    }

    /// A multi-lock of these names on one locker. `InvalidInput` for a name given twice.
    pub fn on(locker: Arc<dyn Locker>, names: impl IntoIterator<Item = LockName>) -> Result<Self, LockError> {
        names.into_iter().try_fold(Self::new(), |multi, name| multi.with(locker.clone(), name))
    }

    /// Adds `name` on `locker`. `InvalidInput` when the same name on the same locks is
    /// already a part (the same locker, or another client of the same server and
    /// namespace: the same [`Locker::target`]): acquiring it twice would wait on itself.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dlock_core::{memory::MemoryStore, LockName, Locker, MultiLock};
    ///
    /// let orders: Arc<dyn Locker> = Arc::new(MemoryStore::new().client());
    /// let stock: Arc<dyn Locker> = Arc::new(MemoryStore::new().client());
    /// let both = MultiLock::new()
    ///     .with(orders.clone(), LockName::new("order/9")?)?
    ///     .with(stock, LockName::new("sku/1")?)?;
    /// assert_eq!(both.len(), 2);
    /// assert!(both.with(orders, LockName::new("order/9")?).is_err());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with(mut self, locker: Arc<dyn Locker>, name: LockName) -> Result<Self, LockError> {
        let target = locker.target();
        if self.parts.iter().any(|p| p.name == name && p.target == target) {
            return Err(LockError::InvalidInput(format!("{name} on {target} is a part of this multi-lock already")));
        }
        let part = Part { locker, name, target };
        // Stable: parts that compare equal keep the order they were given in.
        let at = self.parts.partition_point(|p| order(p, &part) != Ordering::Greater);
        self.parts.insert(at, part);
        Ok(self)
    }

    /// How many parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether there are no parts.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &LockName> {
        self.parts.iter().map(|p| &p.name)
    }

    /// Acquires every part, in the global order, within the options' wait bound for the
    /// whole (`Timeout` after it). On any failure the parts already taken are released
    /// before the error returns; dropping the future releases them in the background.
    ///
    /// A part that lapsed while later parts were awaited makes the acquire give back
    /// every part and start over; `Timeout` when the wait bound ends first.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<MultiLease, LockError> {
        self.check(opts)?;
        let deadline = opts.wait_bound().map(|wait| Instant::now() + wait);
        loop {
            let mut taken = Vec::with_capacity(self.parts.len());
            for part in &self.parts {
                let opts = match deadline {
                    Some(deadline) => opts.clone().wait(deadline.saturating_duration_since(Instant::now())),
                    None => opts.clone(),
                };
                match part.locker.acquire(&part.name, &opts).await {
                    Ok(lease) => taken.push(lease),
                    Err(err) => {
                        release_all(taken).await;
                        return Err(err);
                    }
                }
            }
            match confirm(&taken, opts).await {
                Ok(true) => return Ok(MultiLease { leases: taken }),
                Ok(false) => {
                    release_all(taken).await;
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Err(LockError::timeout());
                    }
                    tracing::debug!(
                        parts = self.parts.len(),
                        "a part lapsed while the others were awaited: starting over"
                    );
                }
                Err(err) => {
                    release_all(taken).await;
                    return Err(err);
                }
            }
        }
    }

    /// Acquires every part if each is free now, without waiting; `Ok(None)`, with
    /// nothing held, when one is not.
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Option<MultiLease>, LockError> {
        self.check(opts)?;
        let mut taken = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part.locker.try_acquire(&part.name, opts).await {
                Ok(Some(lease)) => taken.push(lease),
                outcome => {
                    release_all(taken).await;
                    return outcome.map(|_| None);
                }
            }
        }
        Ok(Some(MultiLease { leases: taken }))
    }

    fn check(&self, opts: &LockOptions) -> Result<(), LockError> {
        if self.parts.is_empty() {
            return Err(LockError::InvalidInput("a multi-lock needs at least one part".into()));
        }
        opts.validate()
    }
}

fn order(a: &Part, b: &Part) -> Ordering {
    a.name.as_str().cmp(b.name.as_str()).then_with(|| a.target.cmp(&b.target))
}

/// Whether every part of a multi-lease just taken is live: each part taken before the
/// last is extended to its full ttl when it is `Fixed` (the watchdog keeps the others),
/// then none may be lost or out of validity. `Ok(false)` when one lapsed.
async fn confirm(taken: &[Lease], opts: &LockOptions) -> Result<bool, LockError> {
    let Some((_, earlier)) = taken.split_last() else { return Ok(true) };
    if !opts.lease_mode().is_watchdog() {
        let ttl = opts.lease_ttl();
        for outcome in join_all(earlier.iter().map(|lease| lease.extend(ttl))).await {
            match outcome {
                Ok(()) | Err(LockError::Unsupported(_)) => {}
                Err(LockError::NotHeld { .. } | LockError::Lost { .. }) => return Ok(false),
                Err(err) => return Err(err),
            }
        }
    }
    Ok(taken.iter().all(|lease| !lease.is_lost() && !lease.remaining().is_zero()))
}

async fn release_all(leases: Vec<Lease>) -> Vec<Result<(), LockError>> {
    join_all(leases.into_iter().map(Lease::release)).await
}

/// Every part of a [`MultiLock`], held. Dropping it releases every part in the
/// background.
#[must_use = "dropping a MultiLease releases every part in the background"]
#[derive(Debug)]
pub struct MultiLease {
    leases: Vec<Lease>,
}

impl MultiLease {
    /// The parts' leases, in the order they were taken.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// Every part's name and fencing token, in the order they were taken. Give each
    /// protected resource its own part's token.
    pub fn tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.leases.iter().map(|lease| (lease.name().clone(), lease.token())).collect()
    }

    /// How long every part is still certainly valid: the least of the parts'.
    pub fn remaining(&self) -> Duration {
        self.leases.iter().map(|lease| lease.remaining()).min().unwrap_or_default()
    }

    /// Whether any part has been lost.
    pub fn is_lost(&self) -> bool {
        self.leases.iter().any(|lease| lease.is_lost())
    }

    /// The reason of the first lost part found, if any part is lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.leases.iter().find_map(|lease| lease.lost_reason())
    }

    /// Waits until any part is lost, and says why. Stop using every protected resource
    /// then: the multi-lock no longer holds them all.
    pub async fn lost(&self) -> LostReason {
        let signals = self.leases.iter().map(|lease| Box::pin(lease.lost()));
        select_all(signals).await.0
    }

    /// Releases every part, all at once. Every part is released even when one fails;
    /// the first failure is returned (`NotHeld` when a part was no longer ours).
    pub async fn release(self) -> Result<(), LockError> {
        release_all(self.leases).await.into_iter().collect()
    }
}
