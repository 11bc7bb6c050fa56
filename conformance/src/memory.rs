//! The fixture of the in-process backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::memory::{MemoryLink, MemoryStore};
use dlock_core::{Client, ClientConfig, LockError, LockName, Locker};

use crate::fixture::{FaultyClient, Fixture, Link, Timing};

/// The in-process backend under test: one [`MemoryStore`], clients over it.
#[derive(Clone, Default)]
pub struct MemoryFixture {
    store: MemoryStore,
}

impl std::fmt::Debug for MemoryFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryFixture").finish_non_exhaustive()
    }
}

impl MemoryFixture {
    /// A fixture over a fresh store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The store, for tests that need it directly.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn config() -> ClientConfig {
        ClientConfig { op_timeout: Duration::from_secs(1) }
    }
}

impl Link for MemoryLink {
    fn cut(&self) {
        MemoryLink::cut(self);
    }

    fn blackhole(&self) {
        MemoryLink::blackhole(self);
    }

    fn restore(&self) {
        MemoryLink::restore(self);
    }
}

#[async_trait]
impl Fixture for MemoryFixture {
    fn timing(&self) -> Timing {
        Timing { ttl: Duration::from_millis(500), margin: Duration::from_secs(2) }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(self.store.client_with(Self::config()))
    }

    async fn faulty_client(&self) -> FaultyClient {
        let backend = self.store.backend();
        let link = backend.link();
        FaultyClient { locker: Arc::new(Client::with_config(backend, Self::config())), link: Box::new(link) }
    }

    async fn evict(&self, name: &LockName) {
        self.store.evict(name);
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let backend = self.store.backend();
        backend.link().cut();
        Ok(Arc::new(Client::with_config(backend, ClientConfig { op_timeout: timeout })))
    }

    async fn stop_backend(&self) {
        self.store.set_available(false);
    }

    async fn start_backend(&self) {
        self.store.set_available(true);
    }
}
