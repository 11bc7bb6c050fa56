//! [`Client`]: a [`Backend`] made into a [`Locker`], with the wait loop, cancellation
//! safety and operation timeouts written once for every backend.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::{Attempt, Backend, Release, Renewal, Request};
use crate::error::LockError;
use crate::lease::{HoldOps, Lease, LeaseCore, LeaseSpec, LostSignal};
use crate::locker::{Capabilities, ClientStats, LockInfo, Locker};
use crate::name::{LockName, OwnerId};
use crate::options::{drift, LockOptions, MAX_DURATION};
use crate::renewal::Scheduler;
use crate::stats::{InFlight, Stats};
use crate::token::FencingToken;

/// Settings every client shares, whatever its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The longest a single backend operation (an attempt, a renewal, a release, an
    /// inspect) may take before it fails with `Unavailable`. Waiting for a holder is not
    /// an operation: the wait bound of [`LockOptions`] governs it.
    pub op_timeout: Duration,
}

impl Default for ClientConfig {
    /// A 5 s operation timeout.
    fn default() -> Self {
        ClientConfig { op_timeout: Duration::from_secs(5) }
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
/// let client = Client::with_config(store.backend(), ClientConfig { op_timeout: Duration::from_secs(1) });
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
    next_owner: AtomicU64,
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
        let stats = Arc::new(Stats::default());
        Client {
            inner: Arc::new(Inner {
                backend,
                config,
                scheduler: Scheduler::new(stats.clone()),
                stats,
                id: uuid::Uuid::new_v4().simple().to_string(),
                next_owner: AtomicU64::new(1),
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

    /// A unique id of this client; the default owner of each acquire is `<id>:<n>`.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    async fn start(&self, name: &LockName, opts: &LockOptions, blocking: bool) -> AcquireResult {
        opts.validate()?;
        check_capabilities(self.inner.backend.capabilities(), opts)?;
        let owner = match opts.explicit_owner() {
            Some(owner) => owner.clone(),
            None => {
                OwnerId::new(format!("{}:{}", self.inner.id, self.inner.next_owner.fetch_add(1, Ordering::Relaxed)))?
            }
        };
        let req = Request { name: name.clone(), owner, mode: opts.lease_mode(), blocking, fair: opts.is_fair() };
        let span = tracing::info_span!(
            "dlock.acquire",
            backend = self.inner.backend.name(),
            lock = %req.name,
            owner = %req.owner,
            blocking,
        );
        let cancel = Arc::new(Cancel::default());
        let inner = self.inner.clone();
        let opts = opts.clone();
        let in_flight = Some(InFlight::start(&self.inner.stats));
        let run = {
            let cancel = cancel.clone();
            async move { inner.acquire_loop(&req, &opts, &cancel).await }.instrument(span)
        };
        Guarded { run: Some(Box::pin(run)), cancel, in_flight }.await
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
    if !caps.ttl && opts.max_hold_bound().is_some() {
        return Err(LockError::Unsupported("max_hold on a backend without ttl expiry".into()));
    }
    Ok(())
}

impl<B: Backend> Inner<B> {
    /// Bounds one backend operation by the operation timeout.
    async fn timed<T>(&self, what: &str, op: impl Future<Output = Result<T, LockError>>) -> Result<T, LockError> {
        match tokio::time::timeout(self.config.op_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(LockError::Unavailable(format!(
                "{} {what} did not complete within {:?}",
                self.backend.name(),
                self.config.op_timeout
            ))),
        }
    }

    async fn acquire_loop(self: &Arc<Self>, req: &Request, opts: &LockOptions, cancel: &Cancel) -> AcquireResult {
        let started = Instant::now();
        let deadline = started + opts.wait_bound().unwrap_or(MAX_DURATION);
        let notify = self.backend.capabilities().notify;
        let backoff = opts.retry_backoff();
        let mut ticket: Option<B::Ticket> = None;
        let mut polls = 0u32;
        loop {
            if cancel.is_fired() {
                self.abandon(req, ticket).await;
                return Ok(None);
            }
            let sent = Instant::now();
            let attempt = match self.timed("acquire", self.backend.attempt(req, &mut ticket)).await {
                Ok(attempt) => attempt,
                Err(err) => {
                    self.abandon(req, ticket).await;
                    return Err(err);
                }
            };
            let retry_after = match attempt {
                Attempt::Granted { hold, token } => {
                    let ttl = req.ttl();
                    let allowance = self.backend.clock_drift(ttl).max(drift(ttl));
                    if sent + ttl.saturating_sub(allowance) > Instant::now() {
                        tracing::debug!(%token, waited = ?started.elapsed(), "acquired");
                        return Ok(Some(self.make_lease(req, opts, hold, token, sent)));
                    }
                    // Granted so late that the lease would be born expired: give it back
                    // and try again, as RedLock does.
                    let _ = self.timed("release", self.backend.release(&hold)).await;
                    Some(Duration::ZERO)
                }
                Attempt::Busy { retry_after } => retry_after,
            };
            let now = Instant::now();
            let cancelled = cancel.is_fired();
            if !req.blocking || cancelled || now >= deadline {
                self.abandon(req, ticket).await;
                return if req.blocking && !cancelled { Err(LockError::Timeout) } else { Ok(None) };
            }
            let pause = if notify {
                retry_after.unwrap_or(MAX_DURATION)
            } else {
                polls = polls.saturating_add(1);
                backoff.delay(polls - 1).min(retry_after.unwrap_or(MAX_DURATION))
            };
            let until = deadline.min(now + pause);
            self.stats.waiting.fetch_add(1, Ordering::Relaxed);
            let waited = {
                let wait = self.backend.wait(req, &mut ticket, until);
                tokio::select! {
                    result = wait => Some(result),
                    _ = cancel.fired() => None,
                }
            };
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            match waited {
                Some(Ok(())) => {}
                Some(Err(err)) => {
                    self.abandon(req, ticket).await;
                    return Err(err);
                }
                None => {
                    self.abandon(req, ticket).await;
                    return Ok(None);
                }
            }
        }
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
        let bound = Arc::new(Bound { inner: self.clone(), hold, name: req.name.clone(), token });
        let core = LeaseCore::new(spec, bound.clone(), self.stats.clone());
        self.backend.watch_hold(&bound.hold, LostSignal::new(&core));
        Lease::new(core, self.scheduler.clone())
    }
}

/// One hold bound to its client: what a lease calls to renew and release.
struct Bound<B: Backend> {
    inner: Arc<Inner<B>>,
    hold: B::Hold,
    name: LockName,
    token: FencingToken,
}

#[async_trait]
impl<B: Backend> HoldOps for Bound<B> {
    async fn renew(&self, ttl: Duration) -> Result<Renewal, LockError> {
        let span = tracing::debug_span!("dlock.renew", backend = self.inner.backend.name(), lock = %self.name, token = %self.token);
        self.inner.timed("renew", self.inner.backend.renew(&self.hold, ttl)).instrument(span).await
    }

    fn drift(&self, ttl: Duration) -> Duration {
        self.inner.backend.clock_drift(ttl)
    }

    async fn release(&self) -> Result<Release, LockError> {
        let span = tracing::info_span!("dlock.release", backend = self.inner.backend.name(), lock = %self.name, token = %self.token);
        self.inner.timed("release", self.inner.backend.release(&self.hold)).instrument(span).await
    }
}

#[async_trait]
impl<B: Backend> Locker for Client<B> {
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Lease, LockError> {
        self.start(name, opts, true).await?.ok_or(LockError::Timeout)
    }

    async fn try_acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Option<Lease>, LockError> {
        self.start(name, opts, false).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.inner.timed("inspect", self.inner.backend.inspect(name)).await
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
