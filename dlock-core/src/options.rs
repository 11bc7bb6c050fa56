//! How to acquire a lock: lease mode, wait bound, maximum hold, retry backoff, owner.

use std::time::Duration;

use crate::error::LockError;
use crate::name::OwnerId;

/// The ttl used when none is given, as in Redisson.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The shortest ttl accepted. Below it the clock drift allowance eats the lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest duration accepted anywhere in the options (365 days).
///
/// Larger values are rejected as `InvalidInput` rather than risking overflow in
/// deadline arithmetic or in a backend's expiry command.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest a waiter's place in a queue outlives the waiter's last sign of life,
/// whatever lease it asks for: a waiter that crashed, or was cut off, at the head of a
/// queue keeps a free lock from the waiters behind it for no longer than this (or its
/// ttl, if shorter). Waiters refresh their place several times within it.
pub const MAX_PLACE_LAPSE: Duration = Duration::from_secs(5);

/// How long the place of a waiter asking for a lease of `ttl` outlives its last refresh:
/// the ttl, or [`MAX_PLACE_LAPSE`] if that is shorter.
pub fn place_lapse(ttl: Duration) -> Duration {
    ttl.min(MAX_PLACE_LAPSE)
}

/// How long a backend keeps what it stores for a name (its token counter, above all)
/// after the name's last grant, renewal or release, unless configured otherwise: an
/// hour. A sweep removes an idle name's state only after it; a backend whose counters
/// restart from its clock relies on that clock never stepping back by as much.
pub const DEFAULT_KEEP_IDLE: Duration = Duration::from_secs(3600);

/// How a lease stays alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// The backend keeps the hold for `ttl` after each renewal, and the client renews it
    /// every `ttl / 3` while the lease lives. A crashed holder frees the lock within `ttl`.
    Watchdog {
        /// How long the backend keeps the hold without a renewal.
        ttl: Duration,
    },
    /// The hold lasts `ttl` and is never renewed (unless [`Lease::extend`](crate::Lease::extend)
    /// is called). The lease's lost signal fires when it runs out.
    Fixed(Duration),
}

impl LeaseMode {
    /// The ttl of either mode.
    pub fn ttl(&self) -> Duration {
        match *self {
            LeaseMode::Watchdog { ttl } | LeaseMode::Fixed(ttl) => ttl,
        }
    }

    /// Whether the client renews the hold.
    pub fn is_watchdog(&self) -> bool {
        matches!(self, LeaseMode::Watchdog { .. })
    }
}

impl Default for LeaseMode {
    fn default() -> Self {
        LeaseMode::Watchdog { ttl: DEFAULT_TTL }
    }
}

/// The most permits a [`HoldKind::Permit`] request may name.
pub const MAX_PERMITS: u32 = 1_000_000;

/// What an acquire asks for: the lock alone, a reader's share, or one of a semaphore's
/// permits. Holds of one name are compatible as follows, and an acquire waits until its
/// kind may join every current hold ([`HoldKind::joins`]):
///
/// - `Exclusive` (a mutex, a read-write lock's writer) with nothing;
/// - `Shared` (a read-write lock's reader) with other `Shared` holds;
/// - `Permit { permits }` with other `Permit` holds, while no holder, the new one
///   included, would have more company than its own number of permits allows: a request
///   for `n` joins `h` permit holds when `h + 1` is at most its own `n` and at most the
///   `n` of every one of them.
///
/// Every grant of any kind takes a fencing token from the name's one counter, so a
/// writer's token is above every earlier grant's. Waiters queue in one order on
/// backends that queue: a writer that waits keeps readers that come after it waiting
/// too (writer preference), so a stream of readers cannot starve it, and a permit request
/// never overtakes one that waits for fewer permits. An owner re-enters a hold only with
/// the kind it holds, and a permit only with the same number of permits (no upgrade from
/// reader to writer; another number takes another permit). The number of permits travels
/// with each request, so it can change at run time: while holders of the old number
/// remain, the smaller of the two numbers bounds every grant, so that no holder is ever
/// beside more holders than it asked for.
///
/// ```
/// use dlock_core::{memory::MemoryStore, HoldKind, LockName, LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let locker = MemoryStore::new().client();
/// let name = LockName::new("reports/2026")?;
/// let a = locker.acquire(&name, &LockOptions::new().read()).await?;
/// let b = locker.acquire(&name, &LockOptions::new().read()).await?;
/// // A writer waits for both readers.
/// assert!(locker.try_acquire(&name, &LockOptions::new().write()).await?.is_none());
/// a.release().await?;
/// b.release().await?;
///
/// let pool = LockName::new("pool/gpu")?;
/// let two = LockOptions::new().permits(2);
/// assert_eq!(two.hold_kind(), HoldKind::Permit { permits: 2 });
/// let first = locker.acquire(&pool, &two).await?;
/// let second = locker.acquire(&pool, &two).await?;
/// assert!(locker.try_acquire(&pool, &two).await?.is_none());
/// // Asking for more permits does not crowd the holders that asked for two.
/// assert!(locker.try_acquire(&pool, &LockOptions::new().permits(3)).await?.is_none());
/// # drop((first, second));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HoldKind {
    /// One holder alone.
    #[default]
    Exclusive,
    /// One of any number of readers.
    Shared,
    /// One of at most `permits` holders.
    Permit {
        /// How many holders the name admits, as this request sees it.
        permits: u32,
    },
}

impl HoldKind {
    /// Whether holds of these two kinds may be held together at all, by different
    /// owners, leaving aside how many permits there are.
    pub fn compatible(&self, other: HoldKind) -> bool {
        matches!(
            (self, other),
            (HoldKind::Shared, HoldKind::Shared) | (HoldKind::Permit { .. }, HoldKind::Permit { .. })
        )
    }

    /// Whether a new hold of this kind may be granted beside `holds`, the kinds of every
    /// current hold of other owners: it is compatible with each, and for permits no
    /// holder (this one included) would have more holders beside it than its own number
    /// of permits allows.
    ///
    /// ```
    /// use dlock_core::HoldKind;
    ///
    /// let permits = |permits| HoldKind::Permit { permits };
    /// assert!(permits(3).joins([permits(3), permits(3)]));
    /// assert!(!permits(3).joins([permits(2), permits(3)]), "the holder of two would have two beside it");
    /// assert!(!permits(1).joins([permits(3)]));
    /// assert!(HoldKind::Shared.joins([HoldKind::Shared; 100]));
    /// assert!(!HoldKind::Shared.joins([HoldKind::Exclusive]));
    /// assert!(HoldKind::Exclusive.joins([]));
    /// ```
    pub fn joins(&self, holds: impl IntoIterator<Item = HoldKind>) -> bool {
        let mut bound = self.permit_bound();
        let mut held = 0usize;
        for other in holds {
            if !self.compatible(other) {
                return false;
            }
            held += 1;
            bound = bound.min(other.permit_bound());
        }
        held < bound
    }

    /// How many holds of a queue, oldest first, hold under the grant rule: the first, and
    /// each next one while every one before it holds and it may
    /// [`join`](HoldKind::joins) them. A request never holds before one older than it,
    /// so grants follow the queue: a writer that waits keeps later readers out, and a
    /// permit request never overtakes an earlier one that waits.
    ///
    /// ```
    /// use dlock_core::HoldKind;
    ///
    /// let permits = |permits| HoldKind::Permit { permits };
    /// assert_eq!(HoldKind::granted_prefix(&[permits(2), permits(1), permits(3)]), 1);
    /// assert_eq!(HoldKind::granted_prefix(&[permits(3), permits(3), permits(2), permits(3)]), 2);
    /// assert_eq!(HoldKind::granted_prefix(&[HoldKind::Shared, HoldKind::Shared, HoldKind::Exclusive, HoldKind::Shared]), 2);
    /// ```
    pub fn granted_prefix(queue: &[HoldKind]) -> usize {
        let mut bound = usize::MAX;
        let mut granted = 0usize;
        for (i, kind) in queue.iter().enumerate() {
            if i > 0 && !kind.compatible(queue[i - 1]) {
                break;
            }
            bound = bound.min(kind.permit_bound());
            if i >= bound {
                break;
            }
            granted += 1;
        }
        granted
    }

    /// How many holds a hold of this kind may be one of: its permits, one for an
    /// exclusive hold, no bound for a reader.
    fn permit_bound(&self) -> usize {
        match self {
            HoldKind::Exclusive => 1,
            HoldKind::Shared => usize::MAX,
            HoldKind::Permit { permits } => *permits as usize,
        }
    }

    /// A short word for logs and backends' records: `exclusive`, `shared` or `permit`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HoldKind::Exclusive => "exclusive",
            HoldKind::Shared => "shared",
            HoldKind::Permit { .. } => "permit",
        }
    }
}

/// Exponential backoff with jitter, for backends that must poll and for retries.
///
/// The n-th delay is drawn uniformly from `[d/2, d]` where `d = min(max, initial * 2^n)`,
/// so that waiters that started together spread out.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
/// let d = backoff.delay(3);
/// assert!(d >= Duration::from_millis(40) && d <= Duration::from_millis(80));
/// assert!(backoff.delay(60) <= Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and doubling up to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The first delay's upper bound.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The largest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay before retry number `attempt` (0-based), jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(30)).unwrap_or(u32::MAX);
        let ceiling = self.initial.saturating_mul(factor).min(self.max);
        let half = ceiling / 2;
        let jitter_nanos = fastrand::u64(0..=half.as_nanos().min(u64::MAX as u128) as u64);
        half + Duration::from_nanos(jitter_nanos)
    }

    fn validate(&self) -> Result<(), LockError> {
        if self.initial.is_zero() {
            return Err(LockError::InvalidInput("backoff initial delay is zero".into()));
        }
        if self.max < self.initial {
            return Err(LockError::InvalidInput("backoff max is below its initial delay".into()));
        }
        check_duration("backoff max", self.max)
    }
}

impl Default for Backoff {
    /// 10 ms doubling to 250 ms.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(10), Duration::from_millis(250))
    }
}

/// How to acquire a lock.
///
/// The default is a watchdog lease of 30 s renewed every 10 s, an unbounded wait,
/// no maximum hold, a fresh owner for every acquire (so no re-entrancy), and no
/// demand for fairness.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{LockOptions, LeaseMode, OwnerId};
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(600))
///     .owner(OwnerId::new("job-7")?);
/// assert_eq!(opts.lease_mode(), LeaseMode::Watchdog { ttl: Duration::from_secs(10) });
/// assert_eq!(opts.wait_bound(), Some(Duration::from_secs(2)));
///
/// let fixed = LockOptions::fixed(Duration::from_secs(5));
/// assert_eq!(fixed.lease_mode(), LeaseMode::Fixed(Duration::from_secs(5)));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockOptions {
    mode: LeaseMode,
    wait: Option<Duration>,
    max_hold: Option<Duration>,
    backoff: Backoff,
    owner: Option<OwnerId>,
    fair: bool,
    kind: HoldKind,
}

impl LockOptions {
    /// The defaults: a 30 s watchdog lease, wait without bound.
    pub fn new() -> Self {
        Self::default()
    }

    /// A watchdog lease with this ttl, renewed every `ttl / 3`.
    pub fn watchdog(ttl: Duration) -> Self {
        Self::new().mode(LeaseMode::Watchdog { ttl })
    }

    /// A fixed lease of this ttl that is never renewed.
    pub fn fixed(ttl: Duration) -> Self {
        Self::new().mode(LeaseMode::Fixed(ttl))
    }

    /// Sets the lease mode.
    pub fn mode(mut self, mode: LeaseMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the ttl, keeping the lease mode.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.mode = match self.mode {
            LeaseMode::Watchdog { .. } => LeaseMode::Watchdog { ttl },
            LeaseMode::Fixed(_) => LeaseMode::Fixed(ttl),
        };
        self
    }

    /// Bounds how long `acquire` may block before failing with `Timeout`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Lets `acquire` block until it gets the lock (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Stops the watchdog renewing after this long, so a hung holder cannot keep the
    /// lock forever: the hold then ends at most one ttl later.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Sets the backoff used between polls (on backends that poll) and retries.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Acquires as this owner: acquiring a lock the owner already holds is re-entrant.
    ///
    /// Where the owner's holds live differs by backend. On Redis, RedLock, the SQL
    /// lease table and memory the owner id is stored with the hold, so any client (even
    /// another process) acquiring with the same id re-enters it. On ZooKeeper and etcd
    /// the hold is the client's own node or key, so only acquires through the same
    /// client re-enter; another client with the same id waits like anyone else. Give
    /// each process its own ids unless sharing a hold across processes is the point.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Demands that waiters be granted the lock in the order they asked for it.
    /// Backends that cannot promise it fail the acquire with `Unsupported`.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Asks for this kind of hold (see [`HoldKind`]). Backends without the capability
    /// fail the acquire with `Unsupported`.
    pub fn kind(mut self, kind: HoldKind) -> Self {
        self.kind = kind;
        self
    }

    /// Asks for a reader's share of a read-write lock: [`HoldKind::Shared`].
    pub fn read(self) -> Self {
        self.kind(HoldKind::Shared)
    }

    /// Asks for a read-write lock's writer: [`HoldKind::Exclusive`], the default, named
    /// for code that reads better beside [`read`](LockOptions::read).
    pub fn write(self) -> Self {
        self.kind(HoldKind::Exclusive)
    }

    /// Asks for one of a semaphore's `permits` permits: [`HoldKind::Permit`].
    pub fn permits(self, permits: u32) -> Self {
        self.kind(HoldKind::Permit { permits })
    }

    /// The kind of hold asked for.
    pub fn hold_kind(&self) -> HoldKind {
        self.kind
    }

    /// The lease mode.
    pub fn lease_mode(&self) -> LeaseMode {
        self.mode
    }

    /// The lease ttl.
    pub fn lease_ttl(&self) -> Duration {
        self.mode.ttl()
    }

    /// The wait bound, `None` for unbounded.
    pub fn wait_bound(&self) -> Option<Duration> {
        self.wait
    }

    /// The maximum hold, if any.
    pub fn max_hold_bound(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The backoff.
    pub fn retry_backoff(&self) -> Backoff {
        self.backoff
    }

    /// The explicit owner, if any.
    pub fn explicit_owner(&self) -> Option<&OwnerId> {
        self.owner.as_ref()
    }

    /// Whether fairness was demanded.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// Checks every duration: a ttl of at least [`MIN_TTL`], nothing zero where zero makes
    /// no sense, nothing above [`MAX_DURATION`].
    pub fn validate(&self) -> Result<(), LockError> {
        let ttl = self.mode.ttl();
        if ttl < MIN_TTL {
            return Err(LockError::InvalidInput(format!("ttl {ttl:?} is below the minimum of {MIN_TTL:?}")));
        }
        check_duration("ttl", ttl)?;
        if let Some(wait) = self.wait {
            check_duration("wait", wait)?;
        }
        if let Some(max_hold) = self.max_hold {
            if max_hold.is_zero() {
                return Err(LockError::InvalidInput("max_hold is zero".into()));
            }
            check_duration("max_hold", max_hold)?;
        }
        if let HoldKind::Permit { permits } = self.kind {
            if permits == 0 || permits > MAX_PERMITS {
                return Err(LockError::InvalidInput(format!("{permits} permits: must be 1 to {MAX_PERMITS}")));
            }
        }
        self.backoff.validate()
    }
}

fn check_duration(what: &str, d: Duration) -> Result<(), LockError> {
    if d > MAX_DURATION {
        return Err(LockError::InvalidInput(format!("{what} {d:?} exceeds the maximum of 365 days")));
    }
    Ok(())
}

/// The clock-drift allowance subtracted from a lease's validity: 1% of the ttl plus 2 ms,
/// as in the RedLock description.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_absurd_durations() {
        let bad = [
            LockOptions::watchdog(Duration::ZERO),
            LockOptions::fixed(Duration::from_millis(1)),
            LockOptions::watchdog(Duration::from_millis(u64::MAX)),
            LockOptions::new().wait(Duration::MAX),
            LockOptions::new().max_hold(Duration::ZERO),
            LockOptions::new().backoff(Backoff::new(Duration::ZERO, Duration::from_secs(1))),
            LockOptions::new().backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(1))),
        ];
        for opts in bad {
            assert!(matches!(opts.validate(), Err(LockError::InvalidInput(_))), "{opts:?}");
        }
        assert!(LockOptions::new().wait(Duration::ZERO).validate().is_ok());
        assert!(LockOptions::new().validate().is_ok());
    }

    #[test]
    fn backoff_never_overflows() {
        let b = Backoff::new(Duration::from_secs(1), MAX_DURATION);
        for n in [0, 1, 31, 32, 1000, u32::MAX] {
            assert!(b.delay(n) <= MAX_DURATION);
        }
    }
}
