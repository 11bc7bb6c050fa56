//! [`Client`]: a [`Backend`] made into a [`Locker`], with the wait loop, cancellation
//! safety and operation timeouts written once for every backend.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Backend, Request, RequestId};
use crate::error::LockError;
use crate::info::{Capabilities, LockInfo};
use crate::lease::Lease;
use crate::local_queue::{LocalQueues, Place, Turn};
use crate::locker::Locker;
use crate::name::{LockName, OwnerId};
use crate::options::{drift, HoldKind, LockOptions, MAX_DURATION};
use crate::outcome::{Attempt, Release, Renewal};
use crate::renewal::Scheduler;
use crate::state::{HoldOps, LeaseCore, LeaseSpec, LostSignal};
use crate::stats::{ClientStats, InFlight, Outcome, Stats};
use crate::stored::StoredResult;
use crate::sweep::{self, Swept};
use crate::token::FencingToken;

/// Settings every client shares, whatever its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The longest a single backend operation (an attempt, a release, an inspect, an
    /// extension) may take before it fails with `Unavailable`. Waiting for a holder is not
    /// an operation: the wait bound of [`LockOptions`] governs it. A watchdog renewal is
    /// bounded by the lease's validity instead, and one left unanswered this long gets
    /// another renewal sent beside it.
    pub op_timeout: Duration,
    /// How often the client sweeps, in the background, what the backend keeps for names
    /// nobody uses any more (see [`Locker::sweep`]), give or take a quarter so that the
    /// replicas of a service spread their sweeps; `None` never sweeps in the background.
    /// The first sweep comes one period after the client's first acquire.
    pub sweep_every: Option<Duration>,
}

/// How often a client sweeps idle names by default.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(600);

impl Default for ClientConfig {
    /// A 5 s operation timeout; a sweep every [`DEFAULT_SWEEP_EVERY`].
    fn default() -> Self {
        ClientConfig { op_timeout: Duration::from_secs(5), sweep_every: Some(DEFAULT_SWEEP_EVERY) }
    }
}

impl ClientConfig {
    /// The default settings with this operation timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock_core::ClientConfig;
    ///
    /// let config = ClientConfig::with_op_timeout(Duration::from_secs(2));
    /// assert_eq!(config.op_timeout, Duration::from_secs(2));
    /// assert_eq!(config.sweep_every, ClientConfig::default().sweep_every);
    /// ```
    pub fn with_op_timeout(op_timeout: Duration) -> Self {
        ClientConfig { op_timeout, ..ClientConfig::default() }
    }
}

/// A lock client over one backend. Cheap to clone; clones share the connection(s)
/// and the renewal scheduler.
///
/// ```
/// use dlock_core::{memory::MemoryStore, Client, ClientConfig, Locker};
/// use std::time::Duration;
///
/// let store = MemoryStore::new();
/// let client = Client::with_config(store.backend(), ClientConfig::with_op_timeout(Duration::from_secs(1)));
/// assert_eq!(client.backend_name(), "memory");
/// ```
pub struct Client<B: Backend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> std::fmt::Debug for Client<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.inner.backend.name())
            .field("id", &self.inner.id)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Clone for Client<B> {
    fn clone(&self) -> Self {
        Client { inner: self.inner.clone() }
    }
}

struct Inner<B: Backend> {
    backend: B,
    config: ClientConfig,
    scheduler: Scheduler,
    stats: Arc<Stats>,
    id: String,
    next_request: AtomicU64,
    /// Whether the background sweep has been started.
    sweeping: AtomicBool,
    /// Where this client's blocking acquires of one name take turns.
    queues: Arc<LocalQueues>,
}

/// Lease ids are unique in the process, so that one scheduler map can never confuse two.
static NEXT_LEASE_ID: AtomicU64 = AtomicU64::new(1);

/// A lease, or `None` when a try found the lock busy or the caller went away.
type AcquireResult = Result<Option<Lease>, LockError>;

impl<B: Backend> Client<B> {
    /// A client with the default [`ClientConfig`].
    pub fn new(backend: B) -> Self {
        Self::with_config(backend, ClientConfig::default())
    }

    /// A client with the given settings.
    pub fn with_config(backend: B, config: ClientConfig) -> Self {
        let stats = Arc::new(Stats::new(backend.name()));
        Client {
            inner: Arc::new(Inner {
                backend,
                scheduler: Scheduler::new(stats.clone(), config.op_timeout),
                config,
                stats,
                id: uuid::Uuid::new_v4().simple().to_string(),
                next_request: AtomicU64::new(1),
                sweeping: AtomicBool::new(false),
                queues: Arc::default(),
            }),
        }
    }

    /// The backend, for backend-specific operations.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Takes the backend and the settings back out of a client that has no clone, so
    /// that a wrapper backend (counting, tracing, or injecting faults into its calls)
    /// can be put around it: `Client::with_config(Wrapper(backend), config)`. A client
    /// that still has clones (or leases, which hold one) is handed back unchanged.
    ///
    /// ```
    /// use dlock_core::{memory::MemoryStore, Client, Locker};
    ///
    /// let client = Client::new(MemoryStore::new().backend());
    /// let spare = client.clone();
    /// let client = client.into_backend().unwrap_err();
    /// drop(spare);
    /// let (backend, config) = client.into_backend().expect("the only handle");
    /// let rebuilt = Client::with_config(backend, config);
    /// assert_eq!(rebuilt.backend_name(), "memory");
    /// ```
    pub fn into_backend(self) -> Result<(B, ClientConfig), Self> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => Ok((inner.backend, inner.config)),
            Err(inner) => Err(Client { inner }),
        }
    }

    /// A unique id of this client; each acquire's request id (and its default owner) is
    /// `<id>:<n>`.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Starts the background sweep once, in the runtime of the first acquire; it ends
    /// when the last clone of the client is dropped.
    fn start_sweeping(&self) {
        let Some(every) = self.inner.config.sweep_every else { return };
        if self.inner.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.sweeping.store(false, Ordering::SeqCst);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(sweep::next_pause(every)).await;
                let Some(inner) = weak.upgrade() else { return };
                match sweep::sweep_all(&inner.backend, inner.config.op_timeout).await {
                    Ok(swept) if swept.removed > 0 => {
                        tracing::debug!(backend = inner.backend.name(), removed = swept.removed, "swept idle names")
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(backend = inner.backend.name(), error = %err, "sweeping idle names failed")
                    }
                }
            }
        });
    }

    async fn start(&self, name: &LockName, opts: &LockOptions, blocking: bool) -> AcquireResult {
        let started = Instant::now();
        opts.validate()?;
        self.start_sweeping();
        check_capabilities(self.inner.backend.capabilities(), opts)?;
        let id = RequestId::new(&self.inner.id, self.inner.next_request.fetch_add(1, Ordering::Relaxed));
        let owner = match opts.explicit_owner() {
            Some(owner) => owner.clone(),
            None => OwnerId::new(id.as_str())?,
        };
        let req = Request {
            name: name.clone(),
            owner,
            id,
            mode: opts.lease_mode(),
            blocking,
            fair: opts.is_fair(),
            kind: opts.hold_kind(),
        };
        let span = tracing::info_span!(
            "dlock.acquire",
            backend = self.inner.backend.name(),
            lock = %req.name,
            owner = %req.owner,
            blocking,
            kind = req.kind.as_str(),
        );
        let cancel = Arc::new(Cancel::default());
        let inner = self.inner.clone();
        let opts = opts.clone();
        let in_flight = Some(InFlight::start(&self.inner.stats));
        let run = {
            let cancel = cancel.clone();
            async move {
                let deadline = started + opts.wait_bound().unwrap_or(MAX_DURATION);
                // Held until this acquire ends: the next local waiter then takes its turn.
                let place = match inner.take_turn(&req, deadline, &cancel).await {
                    Ok(place) => place,
                    Err(outcome) => return outcome,
                };
                let outcome = inner.acquire_loop(&req, &opts, &cancel, (started, deadline), place.as_ref()).await;
                if let (Some(place), Err(err)) = (&place, &outcome) {
                    // The waiters behind learn of what failed here on their own, at once.
                    if !matches!(err, LockError::Timeout { .. }) {
                        place.failed();
                    }
                }
                drop(place);
                outcome
            }
            .instrument(span)
        };
        let stats = self.inner.stats.clone();
        let result = Guarded { run: Some(Box::pin(run)), cancel, in_flight, stats: stats.clone() }.await;
        stats.acquire_ended(match &result {
            Ok(Some(_)) => Outcome::Granted,
            Ok(None) => Outcome::Busy,
            Err(LockError::Timeout { .. }) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        });
        result
    }
}

/// Tells an acquire whose caller has gone to give up and give back what it got.
#[derive(Default)]
struct Cancel {
    fired: AtomicBool,
    notify: Notify,
}

impl Cancel {
    fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    async fn fired(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_fired() {
            notified.await;
        }
    }
}

/// The acquire runs in the caller's task. If the caller drops it (a timeout, a
/// `select!`) halfway, the rest of it moves to a task of its own, which finishes the
/// round trip in flight and gives back whatever it got: a cancelled acquire never leaves
/// a hold, a queue entry or a renewal behind, and the common path costs no task hand-off.
struct Guarded {
    run: Option<Pin<Box<dyn Future<Output = AcquireResult> + Send>>>,
    cancel: Arc<Cancel>,
    in_flight: Option<InFlight>,
    stats: Arc<Stats>,
}

impl Future for Guarded {
    type Output = AcquireResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<AcquireResult> {
        let Some(run) = self.run.as_mut() else {
            return Poll::Ready(Err(LockError::Backend("acquire polled after it completed".into())));
        };
        let result = run.as_mut().poll(cx);
        if result.is_ready() {
            self.run = None;
            self.in_flight = None;
        }
        result
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else { return };
        self.cancel.fire();
        self.stats.acquire_ended(Outcome::Cancelled);
        // Without a runtime nothing can finish the attempt; the hold's ttl frees it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let in_flight = self.in_flight.take();
            runtime.spawn(async move {
                // A lease that comes back is dropped here, which releases it (and counts
                // as in flight until then, so the count never dips to zero in between).
                drop(run.await);
                drop(in_flight);
            });
        }
    }
}

fn check_capabilities(caps: Capabilities, opts: &LockOptions) -> Result<(), LockError> {
    if !caps.fixed && !opts.lease_mode().is_watchdog() {
        return Err(LockError::Unsupported("fixed-ttl leases".into()));
    }
    if !caps.fifo && opts.is_fair() {
        return Err(LockError::Unsupported("fair (FIFO) acquisition".into()));
    }
    if !caps.reentrant && opts.explicit_owner().is_some() {
        return Err(LockError::Unsupported("explicit owners (re-entrant locking)".into()));
    }
    match opts.hold_kind() {
        HoldKind::Shared if !caps.shared => return Err(LockError::Unsupported("shared (reader) holds".into())),
        HoldKind::Permit { .. } if !caps.permits => return Err(LockError::Unsupported("semaphore permits".into())),
        _ => {}
    }
    if !caps.ttl && opts.max_hold_bound().is_some() {
        return Err(LockError::Unsupported("max_hold on a backend without ttl expiry".into()));
    }
    Ok(())
}

impl<B: Backend> Inner<B> {
    /// Bounds one backend operation by the operation timeout.
    async fn timed<T>(&self, what: &str, op: impl Future<Output = Result<T, LockError>>) -> Result<T, LockError> {
        let result = match tokio::time::timeout(self.config.op_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(LockError::unavailable(format!(
                "{} {what} did not complete within {:?}",
                self.backend.name(),
                self.config.op_timeout
            ))),
        };
        // Every backend's operation errors pass here: the one place that names the server.
        result.map_err(|err| err.at(|| self.backend.target()))
    }

    /// Waits for this acquire's turn among the client's waiters of the same name, where
    /// the backend does not keep their order itself (see
    /// [`Backend::grants_in_request_order`]). A try, or an acquire for an explicit owner
    /// (who may already hold the lock and re-enter it), does not queue: it would wait
    /// behind waiters that wait for it. `Ok(None)`: go to the backend without a turn.
    /// `Err` carries how the acquire ends instead: its wait bound ran out, or its caller
    /// went away.
    async fn take_turn(
        &self,
        req: &Request,
        deadline: Instant,
        cancel: &Cancel,
    ) -> Result<Option<Place>, AcquireResult> {
        if !req.blocking || !req.owner_is_fresh() || self.backend.grants_in_request_order(req) {
            return Ok(None);
        }
        let mut place = self.queues.join(&req.name);
        if place.try_turn() {
            return Ok(Some(place));
        }
        self.stats.waiting(true);
        let ended = tokio::select! {
            turn = place.turn() => Ok(turn),
            _ = cancel.fired() => Err(Ok(None)),
            _ = tokio::time::sleep_until(deadline) => Err(Err(LockError::timeout())),
        };
        self.stats.waiting(false);
        match ended? {
            Turn::Mine => Ok(Some(place)),
            // The first waiter failed: go to the backend now, without the turn.
            Turn::Open => Ok(None),
        }
    }

    async fn acquire_loop(
        self: &Arc<Self>,
        req: &Request,
        opts: &LockOptions,
        cancel: &Cancel,
        (started, deadline): (Instant, Instant),
        place: Option<&Place>,
    ) -> AcquireResult {
        let notify = self.backend.capabilities().notify;
        let backoff = opts.retry_backoff();
        let mut ticket: Option<B::Ticket> = None;
        let mut polls = 0u32;
        // A waiter whose turn came after a local neighbour let go was handed off to.
        let mut handed_off = place.is_some_and(Place::waited);
        loop {
            // Before the attempt, so that a release by a neighbour while it is on the wire
            // still wakes the wait after it.
            let neighbour_released = place.and_then(Place::released);
            if cancel.is_fired() {
                self.abandon(req, ticket).await;
                return Ok(None);
            }
            let sent = Instant::now();
            self.stats.attempted();
            let attempt = match self.timed("acquire", self.backend.attempt(req, &mut ticket)).await {
                Ok(attempt) => attempt,
                Err(err) => {
                    // The attempt may have been applied with its answer lost: give back
                    // what it may have granted, without keeping the caller waiting.
                    self.give_back_in_background(req, ticket);
                    return Err(err);
                }
            };
            let retry_after = match attempt {
                Attempt::Granted { hold, token } => {
                    let sent = self.backend.granted_since(&hold).map_or(sent, |since| since.min(sent));
                    if validity(&self.backend, &hold, sent, req.ttl()).0 > Instant::now() {
                        tracing::debug!(%token, waited = ?started.elapsed(), "acquired");
                        self.stats.granted(started.elapsed(), handed_off);
                        return Ok(Some(self.make_lease(req, opts, hold, token, sent)));
                    }
                    // Granted so late that the lease would be born expired: give it back
                    // and try again, as RedLock does.
                    let _ = self.timed("release", self.backend.release(&hold)).await;
                    Some(Duration::ZERO)
                }
                Attempt::Busy { retry_after } => {
                    handed_off = true;
                    retry_after
                }
            };
            let now = Instant::now();
            let cancelled = cancel.is_fired();
            if !req.blocking || cancelled || now >= deadline {
                self.abandon(req, ticket).await;
                return if req.blocking && !cancelled { Err(LockError::timeout()) } else { Ok(None) };
            }
            let pause = if notify {
                retry_after.unwrap_or(MAX_DURATION)
            } else {
                polls = polls.saturating_add(1);
                backoff.delay(polls - 1).min(retry_after.unwrap_or(MAX_DURATION))
            };
            let until = deadline.min(now + pause);
            self.stats.waiting(true);
            let waited = {
                let wait = self.backend.wait(req, &mut ticket, until);
                let neighbour = async {
                    match neighbour_released {
                        Some(released) => released.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    result = wait => Some(result),
                    // A lease of this client on the name was released: the lock may be
                    // free, and this waiter is the one of the client to try first.
                    () = neighbour => Some(Ok(())),
                    _ = cancel.fired() => None,
                }
            };
            self.stats.waiting(false);
            match waited {
                Some(Ok(())) => {}
                Some(Err(err)) => {
                    self.abandon(req, ticket).await;
                    return Err(err.at(|| self.backend.target()));
                }
                None => {
                    self.abandon(req, ticket).await;
                    return Ok(None);
                }
            }
        }
    }

    fn give_back_in_background(self: &Arc<Self>, req: &Request, ticket: Option<B::Ticket>) {
        let (inner, req) = (self.clone(), req.clone());
        let in_flight = InFlight::start(&self.stats);
        tokio::spawn(async move {
            let _in_flight = in_flight;
            if tokio::time::timeout(inner.config.op_timeout, inner.backend.give_back(&req, ticket)).await.is_err() {
                tracing::debug!(lock = %req.name, "giving back an attempt of unknown outcome timed out");
            }
        });
    }

    async fn abandon(&self, req: &Request, ticket: Option<B::Ticket>) {
        if let Some(ticket) = ticket {
            let abandon = self.backend.abandon(req, ticket);
            if tokio::time::timeout(self.config.op_timeout, abandon).await.is_err() {
                tracing::debug!(lock = %req.name, "giving up the waiter's place timed out");
            }
        }
    }

    fn make_lease(
        self: &Arc<Self>,
        req: &Request,
        opts: &LockOptions,
        hold: B::Hold,
        token: FencingToken,
        sent: Instant,
    ) -> Lease {
        let spec = LeaseSpec {
            id: NEXT_LEASE_ID.fetch_add(1, Ordering::Relaxed),
            name: req.name.clone(),
            owner: req.owner.clone(),
            token,
            mode: req.mode,
            max_hold: opts.max_hold_bound(),
            extendable: self.backend.capabilities().extend,
            attempt_started: sent,
        };
        let bound = Arc::new(BoundHold { inner: self.clone(), hold, name: req.name.clone(), token });
        let core = LeaseCore::new(spec, bound.clone(), self.stats.clone());
        self.backend.watch_hold(&bound.hold, LostSignal::new(&core));
        Lease::new(core, self.scheduler.clone())
    }
}

/// Until when a grant or renewal of `hold` sent at `sent` for `ttl` keeps it, on this
/// clock (the ttl the backend really applies, minus the larger drift allowance), and that
/// effective ttl.
fn validity<B: Backend>(backend: &B, hold: &B::Hold, sent: Instant, ttl: Duration) -> (Instant, Duration) {
    let effective = backend.effective_ttl(hold, ttl).min(ttl);
    let allowance = backend.clock_drift(effective).max(drift(effective));
    (sent + effective.saturating_sub(allowance), effective)
}

/// One hold bound to its client: what a lease calls to renew and release.
struct BoundHold<B: Backend> {
    inner: Arc<Inner<B>>,
    hold: B::Hold,
    name: LockName,
    token: FencingToken,
}

#[async_trait]
impl<B: Backend> HoldOps for BoundHold<B> {
    async fn renew(&self, ttl: Duration) -> Result<Renewal, LockError> {
        let span = tracing::info_span!("dlock.extend", backend = self.inner.backend.name(), lock = %self.name, token = %self.token, ?ttl);
        self.inner.timed("extend", self.inner.backend.renew(&self.hold, ttl)).instrument(span).await
    }

    async fn renew_batch(
        &self,
        batch: &[Arc<LeaseCore>],
        ttl: Duration,
        deadline: Instant,
    ) -> Vec<Result<Renewal, LockError>> {
        // Every lease of a scheduler comes from this client, so every hold is ours.
        let holds: Option<Vec<&B::Hold>> = batch
            .iter()
            .map(|core| (core.hold.as_ref() as &dyn Any).downcast_ref::<BoundHold<B>>().map(|bound| &bound.hold))
            .collect();
        let Some(holds) = holds else {
            return batch
                .iter()
                .map(|_| Err(LockError::Backend("a lease of another client was batched".into())))
                .collect();
        };
        let backend = &self.inner.backend;
        let span = tracing::debug_span!("dlock.renew", backend = backend.name(), leases = holds.len(), ?ttl);
        match tokio::time::timeout_at(deadline, backend.renew_many(&holds, ttl)).instrument(span).await {
            Ok(answers) if answers.len() == holds.len() => answers,
            Ok(answers) => {
                let why = format!("{} answered {} renewals of {}", backend.name(), answers.len(), holds.len());
                holds.iter().map(|_| Err(LockError::Backend(why.clone().into()))).collect()
            }
            Err(_) => holds
                .iter()
                .map(|_| {
                    Err(LockError::unavailable(format!(
                        "{} renewal unanswered until the lease ran out",
                        backend.name()
                    )))
                })
                .collect(),
        }
    }

    fn validity(&self, sent: Instant, ttl: Duration) -> (Instant, Duration) {
        validity(&self.inner.backend, &self.hold, sent, ttl)
    }

    async fn release(&self) -> Result<Release, LockError> {
        let span = tracing::info_span!("dlock.release", backend = self.inner.backend.name(), lock = %self.name, token = %self.token);
        let released = self.inner.timed("release", self.inner.backend.release(&self.hold)).instrument(span).await;
        self.inner.queues.released(&self.name);
        released
    }

    async fn store_result(&self, value: &[u8], retention: Duration) -> Result<(), LockError> {
        let span = tracing::info_span!("dlock.store_result", backend = self.inner.backend.name(), lock = %self.name, token = %self.token, bytes = value.len());
        let store = self.inner.backend.store_result(&self.hold, self.token, value, retention);
        self.inner.timed("store_result", store).instrument(span).await
    }
}

#[async_trait]
impl<B: Backend> Locker for Client<B> {
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Lease, LockError> {
        let acquired = self.start(name, opts, true).await.and_then(|lease| lease.ok_or_else(LockError::timeout));
        // The one place every acquire's errors pass: it names the lock and the bound.
        acquired.map_err(|err| match err {
            LockError::Timeout { name: None, waited: None } => {
                LockError::Timeout { name: Some(name.as_str().to_string()), waited: opts.wait_bound() }
            }
            other => other.named(name),
        })
    }

    async fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<Lease>, LockError> {
        self.start(name, opts, false).await.map_err(|err| err.named(name))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.inner.timed("inspect", self.inner.backend.inspect(name)).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        self.inner.timed("load_result", self.inner.backend.load_result(name)).await
    }

    async fn sweep(&self) -> Result<Swept, LockError> {
        let span = tracing::info_span!("dlock.sweep", backend = self.inner.backend.name());
        sweep::sweep_all(&self.inner.backend, self.inner.config.op_timeout).instrument(span).await
    }

    fn target(&self) -> String {
        self.inner.backend.target()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.backend.capabilities()
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    fn stats(&self) -> ClientStats {
        self.inner.stats.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, timeout, Instant};

    use crate::memory::Fault;
    use crate::testing::probe_client;
    use crate::{LockError, LockName, LockOptions, Locker};

    fn name() -> LockName {
        LockName::new("client/acquire").unwrap()
    }

    /// Waits (on the paused clock) until nothing the client started is still running.
    async fn settled(client: &impl Locker) {
        while client.stats().in_flight > 0 {
            sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_cancelled_during_its_attempt_gives_back_the_grant() {
        let (client, probe) = probe_client(Duration::from_secs(10));
        let other = probe.store.client();
        probe.link().set(Fault::DelayReplies(Duration::from_secs(1)));
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        assert!(timeout(Duration::from_millis(100), client.acquire(&name(), &opts)).await.is_err());
        assert!(other.try_acquire(&name(), &opts).await.unwrap().is_none(), "the attempt was applied");
        settled(&client).await;
        let started = Instant::now();
        let lease = other.try_acquire(&name(), &opts).await.unwrap().expect("the cancelled grant was given back");
        assert_eq!(started.elapsed(), Duration::ZERO);
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_cancelled_while_waiting_leaves_no_place_in_the_queue() {
        let (client, probe) = probe_client(Duration::from_secs(10));
        let other = probe.store.client();
        let opts = LockOptions::new().fair(true).wait(Duration::from_secs(60));
        let held = other.acquire(&name(), &opts).await.unwrap();
        let waiting = tokio::spawn({
            let client = client.clone();
            async move { client.acquire(&name(), &opts).await }
        });
        while other.inspect(&name()).await.unwrap().waiters != Some(1) {
            sleep(Duration::from_millis(1)).await;
        }
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        settled(&client).await;
        assert_eq!(other.inspect(&name()).await.unwrap().waiters, Some(0));
        held.release().await.unwrap();
        assert!(other.inspect(&name()).await.unwrap().holder.is_none(), "the cancelled waiter was not granted");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_without_an_answer_is_given_back_in_the_background() {
        let op = Duration::from_millis(200);
        let (client, probe) = probe_client(op);
        let other = probe.store.client();
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        probe.link().set(Fault::DropReplies);
        let started = Instant::now();
        assert!(matches!(client.acquire(&name(), &opts).await, Err(LockError::Unavailable { .. })));
        assert_eq!(started.elapsed(), op, "the caller does not wait for the give-back");
        settled(&client).await;
        assert!(other.try_acquire(&name(), &opts).await.unwrap().is_some(), "no orphan hold for a ttl");
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_born_expired_is_given_back_not_handed_out() {
        // Validity counts from the send time and ends `drift` before the store's ttl:
        // a reply that arrives in between finds a hold the store still keeps.
        let ttl = Duration::from_secs(3);
        let late = ttl - crate::drift(ttl) + Duration::from_millis(1);
        let (client, probe) = probe_client(Duration::from_secs(10));
        let other = probe.store.client();
        probe.link().set(Fault::DelayReplies(late));
        let trying = tokio::spawn({
            let client = client.clone();
            async move { client.try_acquire(&name(), &LockOptions::fixed(ttl)).await }
        });
        sleep(late + Duration::from_millis(1)).await;
        assert!(other.inspect(&name()).await.unwrap().holder.is_none(), "released before the store's ttl ran out");
        assert!(trying.await.unwrap().unwrap().is_none(), "no lease that is born expired");
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_sent_is_counted() {
        let (client, probe) = probe_client(Duration::from_secs(10));
        let other = probe.store.client();
        let opts = LockOptions::new().wait(Duration::from_secs(10));
        let held = other.acquire(&name(), &opts).await.unwrap();
        assert!(client.try_acquire(&name(), &opts).await.unwrap().is_none());
        assert_eq!(client.stats().attempts, 1);
        let waiter = tokio::spawn({
            let client = client.clone();
            async move { client.acquire(&name(), &opts).await }
        });
        while client.stats().waiting == 0 {
            sleep(Duration::from_millis(1)).await;
        }
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        // The waiter asked once, was woken by the release, and asked once more.
        assert_eq!(client.stats().attempts, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_queued_in_the_client_behind_a_failure_fail_within_their_own_timeout() {
        let op = Duration::from_secs(1);
        let (client, probe) = probe_client(op);
        probe.grant_in_any_order();
        probe.link().set(Fault::DropReplies);
        let opts = LockOptions::new().wait(Duration::from_secs(60));
        let started = Instant::now();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let (client, opts) = (client.clone(), opts.clone());
                tokio::spawn(async move { client.acquire(&name(), &opts).await })
            })
            .collect();
        for waiter in waiters {
            assert!(matches!(waiter.await.unwrap(), Err(LockError::Unavailable { .. })));
        }
        // The first fails after one timeout, and everyone behind it after one more.
        assert_eq!(started.elapsed(), op * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clients_waiters_of_one_name_contend_one_at_a_time_in_the_order_they_asked() {
        let (client, probe) = probe_client(Duration::from_secs(10));
        probe.grant_in_any_order();
        let other = probe.store.client();
        let opts = LockOptions::new().wait(Duration::from_secs(60));
        let held = other.acquire(&name(), &opts).await.unwrap();
        let (granted, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (mine, opts, granted) = (client.clone(), opts.clone(), granted.clone());
            waiters.push(tokio::spawn(async move {
                let lease = mine.acquire(&name(), &opts).await.unwrap();
                granted.send(i).unwrap();
                lease.release().await.unwrap();
            }));
            while client.stats().waiting < i + 1 {
                sleep(Duration::from_millis(1)).await;
            }
        }
        // Only the first of them is queued at the store.
        assert_eq!(other.inspect(&name()).await.unwrap().waiters, Some(1));
        let attempts = client.stats().attempts;
        held.release().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!((0..3).map(|_| order.try_recv().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(client.stats().attempts - attempts, 3, "one attempt per hand-off");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_granted_after_a_slow_reply_counts_from_the_send_time() {
        let ttl = Duration::from_secs(3);
        let (client, probe) = probe_client(Duration::from_secs(10));
        probe.link().set(Fault::DelayReplies(Duration::from_secs(1)));
        let lease = client.acquire(&name(), &LockOptions::fixed(ttl)).await.unwrap();
        assert_eq!(lease.remaining(), ttl - crate::drift(ttl) - Duration::from_secs(1));
    }
}
