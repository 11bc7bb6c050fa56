//! A backend for the core's own unit tests: the memory backend, with its renewals
//! counted, grouped, held up, failed or panicked at will.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{lock_unpoisoned, Attempt, Backend, Client, ClientConfig, Release, Renewal, Request};
use crate::error::LockError;
use crate::info::{Capabilities, LockInfo};
use crate::memory::{MemoryBackend, MemoryHold, MemoryLink, MemoryStore, MemoryTicket};
use crate::name::LockName;

/// What the probe does with the renewals it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewals {
    /// Passes them to the memory backend.
    Pass,
    /// Never answers.
    Hang,
    /// Never answers the next call, then passes.
    HangOnce,
    /// Fails them with a backend error (not transient).
    Fail,
    /// Panics once, then passes.
    PanicOnce,
}

/// The shared state of a probe backend.
pub(crate) struct Probe {
    pub(crate) store: MemoryStore,
    link: MemoryLink,
    mode: Mutex<Renewals>,
    /// When each `renew_many` call started, and how many holds it carried.
    calls: Mutex<Vec<(Instant, usize)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Whether the backend says it grants in request order, as the memory store does;
    /// when not, the client queues its own waiters of a name.
    in_order: AtomicBool,
}

impl Probe {
    /// The backend says it grants in any order from now on.
    pub(crate) fn grant_in_any_order(&self) {
        self.in_order.store(false, Ordering::SeqCst);
    }

    pub(crate) fn set(&self, mode: Renewals) {
        *lock_unpoisoned(&self.mode) = mode;
    }

    pub(crate) fn link(&self) -> &MemoryLink {
        &self.link
    }

    pub(crate) fn calls(&self) -> Vec<(Instant, usize)> {
        lock_unpoisoned(&self.calls).clone()
    }

    /// The most holds that were being renewed at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

pub(crate) struct ProbeBackend {
    inner: MemoryBackend,
    probe: Arc<Probe>,
}

/// A client over a probe backend of a fresh store, and the probe.
pub(crate) fn probe_client(op_timeout: Duration) -> (Client<ProbeBackend>, Arc<Probe>) {
    let store = MemoryStore::new();
    let inner = store.backend();
    let probe = Arc::new(Probe {
        store,
        link: inner.link(),
        mode: Mutex::new(Renewals::Pass),
        calls: Mutex::new(Vec::new()),
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
        in_order: AtomicBool::new(true),
    });
    let backend = ProbeBackend { inner, probe: probe.clone() };
    (Client::with_config(backend, ClientConfig::with_op_timeout(op_timeout)), probe)
}

/// Counts holds in flight for as long as it lives.
struct Flying<'a>(&'a Probe, usize);

impl<'a> Flying<'a> {
    fn start(probe: &'a Probe, n: usize) -> Self {
        let now = probe.in_flight.fetch_add(n, Ordering::SeqCst) + n;
        probe.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Flying(probe, n)
    }
}

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(self.1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for ProbeBackend {
    type Hold = MemoryHold;
    type Ticket = MemoryTicket;

    fn name(&self) -> &'static str {
        "probe"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// As the memory backend it drives, unless the test said otherwise.
    fn grants_in_request_order(&self, _req: &Request) -> bool {
        self.probe.in_order.load(Ordering::SeqCst)
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<MemoryTicket>,
    ) -> Result<Attempt<MemoryHold>, LockError> {
        self.inner.attempt(req, ticket).await
    }

    async fn wait(&self, req: &Request, ticket: &mut Option<MemoryTicket>, until: Instant) -> Result<(), LockError> {
        self.inner.wait(req, ticket, until).await
    }

    async fn abandon(&self, req: &Request, ticket: MemoryTicket) {
        self.inner.abandon(req, ticket).await
    }

    async fn give_back(&self, req: &Request, ticket: Option<MemoryTicket>) {
        self.inner.give_back(req, ticket).await
    }

    async fn renew(&self, hold: &MemoryHold, ttl: Duration) -> Result<Renewal, LockError> {
        self.inner.renew(hold, ttl).await
    }

    async fn renew_many(&self, holds: &[&MemoryHold], ttl: Duration) -> Vec<Result<Renewal, LockError>> {
        lock_unpoisoned(&self.probe.calls).push((Instant::now(), holds.len()));
        let _flying = Flying::start(&self.probe, holds.len());
        let mode = {
            let mut mode = lock_unpoisoned(&self.probe.mode);
            let now = *mode;
            if matches!(now, Renewals::HangOnce | Renewals::PanicOnce) {
                *mode = Renewals::Pass;
            }
            now
        };
        match mode {
            Renewals::Pass => futures::future::join_all(holds.iter().map(|hold| self.inner.renew(hold, ttl))).await,
            Renewals::Hang | Renewals::HangOnce => std::future::pending().await,
            Renewals::Fail => holds.iter().map(|_| Err(LockError::backend("refused by the probe"))).collect(),
            Renewals::PanicOnce => panic!("the probe's renewal panicked"),
        }
    }

    async fn release(&self, hold: &MemoryHold) -> Result<Release, LockError> {
        self.inner.release(hold).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        self.inner.inspect(name).await
    }
}
