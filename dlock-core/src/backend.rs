//! What a backend implements. [`Client`] turns a [`Backend`] into a
//! [`Locker`](crate::Locker) and supplies everything the backends share: validation, the
//! wait loop, cancellation safety, operation timeouts, giving back the grants of attempts
//! whose outcome is unknown, the renewal scheduler (which batches the renewals that are
//! due together), the lost signal, tracing and statistics.
//!
//! This module is for people writing a backend; users of locks need none of it.

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::info::{Capabilities, LockInfo};
use crate::name::{LockName, OwnerId};
use crate::options::{HoldKind, LeaseMode};
use crate::stored::StoredResult;
use crate::sweep::Swept;
use crate::token::FencingToken;

pub use crate::client::{Client, ClientConfig};
pub use crate::outcome::{Attempt, Release, Renewal};
pub use crate::state::LostSignal;

/// Names one acquire call, unique across clients and processes (`<client id>:<n>`).
///
/// A backend that can be left unsure whether an attempt was applied records the id with
/// the grant, so that [`Backend::give_back`] undoes exactly that grant and nothing else
/// (with an explicit owner, the same owner may hold the lock through other grants).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(String);

impl RequestId {
    /// The id of acquire call number `n` of the client with id `client`. Clients make
    /// them; a backend's own tests may too, to drive the backend without a client.
    pub fn new(client: &str, n: u64) -> Self {
        RequestId(format!("{client}:{n}"))
    }

    /// The id as text (ASCII letters, digits and `:`; at most 53 bytes).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One acquisition as the backend sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The lock.
    pub name: LockName,
    /// Who acquires: the caller's explicit owner, or a fresh one per acquire (then equal
    /// to the request id, so it is never shared).
    pub owner: OwnerId,
    /// This acquire call; see [`RequestId`].
    pub id: RequestId,
    /// The lease mode; its ttl is how long the backend keeps the hold without renewal.
    pub mode: LeaseMode,
    /// `false` for `try_acquire`: the backend need not queue the request.
    pub blocking: bool,
    /// Whether the caller demanded FIFO order. The client has already refused it on a
    /// backend without the `fifo` capability; a backend that offers both orders reads it.
    pub fair: bool,
    /// The kind of hold asked for. The client has refused kinds the backend's
    /// capabilities do not claim, so a backend without `shared` or `permits` only ever
    /// sees [`HoldKind::Exclusive`].
    pub kind: HoldKind,
}

impl Request {
    /// The ttl the backend keeps the hold for. Backends with coarser units round up,
    /// never down: the client's idea of validity must end before the backend's.
    pub fn ttl(&self) -> Duration {
        self.mode.ttl()
    }

    /// How long this waiter's place in a queue (a queue entry, a waiting marker) lasts
    /// after its last refresh: [`place_lapse`](crate::place_lapse) of the ttl, at most
    /// [`MAX_PLACE_LAPSE`](crate::MAX_PLACE_LAPSE) whatever lease it asks for, so that a
    /// waiter that died keeps nobody waiting for long. A backend that keeps places
    /// refreshes them at least three times within it while the waiter waits.
    pub fn place_lapse(&self) -> Duration {
        crate::options::place_lapse(self.ttl())
    }

    /// Whether the owner is this request's own (no explicit owner was given), so a hold of
    /// this owner can only have come from this request.
    pub fn owner_is_fresh(&self) -> bool {
        self.owner.as_str() == self.id.as_str()
    }
}

/// The atomic operations of one backend, and its wake-up mechanism.
///
/// Every method must complete or fail on its own: the client bounds `attempt`,
/// `release`, `inspect`, `abandon` and `give_back` by its operation timeout, and renewals
/// by the lease's remaining validity (turning an overrun into
/// [`LockError::Unavailable`]). A backend must not cut a renewal short by a fixed timeout
/// of its own: a reply that comes late but within the validity still renews the lease.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// What the backend keeps about a granted hold (a key and owner, a znode path).
    type Hold: Send + Sync + 'static;
    /// A waiter's place between attempts: a queue node, a subscription, or `()`.
    type Ticket: Send + 'static;

    /// A short name of the backend, such as `"redis"`.
    fn name(&self) -> &'static str;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Whether the backend grants `req` strictly in request order behind every waiter
    /// queued before it, whichever client they came from (a queue node, a `fair(true)`
    /// queue). The client then sends every blocking acquire straight to the backend.
    /// Otherwise (the default) the blocking acquires of one client for one name take
    /// turns in the client, and only the first of them contends at the backend: a client
    /// sends one waiter's requests instead of one per task, and its own tasks are
    /// granted in the order they asked instead of racing each other.
    ///
    /// A wrapper around another backend must answer as the backend it wraps.
    fn grants_in_request_order(&self, req: &Request) -> bool {
        let _ = req;
        false
    }

    /// One attempt: grant the lock (free, or already held by `req.owner`), or report
    /// that it is busy. May create or update `ticket` so that later attempts and waits
    /// keep the waiter's place and its wake-up subscription.
    ///
    /// An attempt must be atomic: it either grants (and the hold exists on the backend)
    /// or it changes nothing but the ticket. On `Granted`, a ticket still in the slot is
    /// dropped, not abandoned: the grant consumed the waiter's place.
    ///
    /// When an attempt fails (an error, or cut off by the operation timeout) it may still
    /// have been applied; the client then calls [`give_back`](Backend::give_back).
    async fn attempt(&self, req: &Request, ticket: &mut Option<Self::Ticket>)
        -> Result<Attempt<Self::Hold>, LockError>;

    /// Waits until the lock may have become free, or until `until`. Returning early is
    /// always allowed (the client just attempts again); missing a release is not.
    /// The default sleeps until `until`, which is right for backends that poll.
    async fn wait(&self, req: &Request, ticket: &mut Option<Self::Ticket>, until: Instant) -> Result<(), LockError> {
        let _ = (req, ticket);
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    /// The waiter gave up (timeout, `try_acquire`, cancellation): remove its place in the
    /// queue and anything it holds for waiting. Errors are logged, not returned.
    async fn abandon(&self, req: &Request, ticket: Self::Ticket) {
        let _ = (req, ticket);
    }

    /// An attempt failed without a clear answer: the backend may have applied it. Undo
    /// the grant it may have made (once, and only that grant: another holder, or the same
    /// owner's other grants, are never touched), and give up the waiter's place as
    /// [`abandon`](Backend::abandon) does.
    ///
    /// The client calls it in the background, bounded by the operation timeout. The
    /// default only abandons the ticket, which is right for a backend whose attempt
    /// cannot be applied without its caller learning of it.
    async fn give_back(&self, req: &Request, ticket: Option<Self::Ticket>) {
        if let Some(ticket) = ticket {
            self.abandon(req, ticket).await;
        }
    }

    /// Keeps the hold for `ttl` more from now (never shortening it), checking it is ours.
    async fn renew(&self, hold: &Self::Hold, ttl: Duration) -> Result<Renewal, LockError>;

    /// Renews the holds that are due together, all with the same `ttl`, answering for
    /// each in order. The renewal scheduler calls it for every group of renewals that
    /// fall due at once; a backend that can renew many holds in one request (a SQL
    /// statement, one keepalive, a multi-read) does it here. The default runs
    /// [`renew`](Backend::renew) for each hold concurrently.
    async fn renew_many(&self, holds: &[&Self::Hold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        futures::future::join_all(holds.iter().map(|hold| self.renew(hold, ttl))).await
    }

    /// Releases one hold, checking it is ours, and wakes the next waiter.
    async fn release(&self, hold: &Self::Hold) -> Result<Release, LockError>;

    /// Reports the lock's holder and queue.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError>;

    /// Stores `value` as the result of the run that holds `hold` (granted with `token`),
    /// kept for `retention`, in one atomic step with the check that `hold` is still the
    /// lock's live hold and that no result of a higher token is stored. `NotHeld` when
    /// either check fails; then nothing is written.
    ///
    /// The client has checked the value's size and the retention. A backend with the
    /// `results` capability implements it with [`load_result`](Backend::load_result);
    /// the default is `Unsupported`.
    async fn store_result(
        &self,
        hold: &Self::Hold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        let _ = (hold, token, value, retention);
        Err(LockError::Unsupported("storing results".into()))
    }

    /// The result stored under `name` and not yet past its retention, if any.
    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        let _ = name;
        Err(LockError::Unsupported("storing results".into()))
    }

    /// The clock-drift allowance subtracted from a hold's validity: a lease of `ttl`
    /// granted (or renewed) by a request sent at `t` counts as valid until
    /// `t + ttl - clock_drift(ttl)`. The default is [`drift`](crate::drift) (1% + 2 ms);
    /// a backend may only make it larger.
    fn clock_drift(&self, ttl: Duration) -> Duration {
        crate::options::drift(ttl)
    }

    /// How long the backend really keeps `hold` after a grant or renewal that asked for
    /// `requested`. The default is `requested`. A backend that may keep it for less (a
    /// session timeout the server negotiated down) says so, and the lease's validity and
    /// renewal period follow the shorter time.
    fn effective_ttl(&self, hold: &Self::Hold, requested: Duration) -> Duration {
        let _ = hold;
        requested
    }

    /// When the request that made `hold` was sent, if that was before the attempt that
    /// returned it: a grant made on this waiter's behalf by another call (a release that
    /// handed the lock on) counts from that call, not from the attempt that picked it up.
    /// The default is `None`: the attempt made the grant.
    fn granted_since(&self, hold: &Self::Hold) -> Option<Instant> {
        let _ = hold;
        None
    }

    /// Removes one bounded batch of what the backend keeps for names nobody uses any
    /// more: results past their retention, expired holds and lapsed places, and the
    /// token counter of a name that nobody holds, waits for or has been granted for the
    /// backend's keep time. `more` says whether the batch bound stopped it.
    ///
    /// A counter may go only where the backend starts a missing counter above every
    /// token it ever gave (from its clock in microseconds, or from a high-water mark
    /// that the sweep raises), so that the name's next grant still gets a higher token.
    /// The client sweeps in the background and on [`Locker::sweep`](crate::Locker::sweep);
    /// the default has nothing to sweep, which is right for a backend whose server
    /// expires every record by itself.
    async fn sweep(&self) -> Result<Swept, LockError> {
        Ok(Swept::default())
    }

    /// Which server, and which namespace on it (key prefix, table, root znode), this
    /// backend's locks live on, without credentials: two backends with the same target
    /// share their locks. Errors and [`MultiLock`](crate::MultiLock) use it. The default
    /// is unique to this backend value, which is right only for a backend that shares
    /// nothing with any other.
    fn target(&self) -> String {
        format!("{}@{:p}", self.name(), self)
    }

    /// Called once for every granted hold, for backends that learn of a loss by a push
    /// (a session expiry event) rather than by renewing. The default ignores it.
    fn watch_hold(&self, hold: &Self::Hold, signal: LostSignal) {
        let _ = (hold, signal);
    }
}

/// Locks `mutex`, ignoring poisoning: a panic elsewhere while it was held does not make
/// the state behind it inconsistent for the uses in this workspace, where every critical
/// section leaves the data valid at each step.
pub fn lock_unpoisoned<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
