//! The fixture of the in-process backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::memory::{MemoryLink, MemoryStore};
use dlock_core::{Client, ClientConfig, LockError, LockName, Locker};

use crate::fixture::{Evict, Fault, Faults, FaultyClient, Fixture, Link, Restart, Storage, Timing};

/// The in-process backend under test: one [`MemoryStore`], clients over it.
#[derive(Clone)]
pub struct MemoryFixture {
    store: MemoryStore,
}

/// How long the fixture's store keeps an idle name.
const IDLE: Duration = Duration::from_secs(1);

impl Default for MemoryFixture {
    fn default() -> Self {
        MemoryFixture { store: MemoryStore::new().keep_idle_names_for(IDLE) }
    }
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
        ClientConfig::with_op_timeout(Duration::from_secs(1))
    }
}

impl Link for MemoryLink {
    fn set(&self, fault: Fault) {
        MemoryLink::set(self, fault);
    }
}

#[async_trait]
impl Fixture for MemoryFixture {
    fn timing(&self) -> Timing {
        Timing {
            ttl: Duration::from_millis(500),
            margin: Duration::from_secs(2),
            op_timeout: Self::config().op_timeout,
            idle: IDLE,
        }
    }

    async fn client(&self) -> Arc<dyn Locker> {
        Arc::new(self.store.client_with(Self::config()))
    }
}

#[async_trait]
impl Evict for MemoryFixture {
    async fn evict(&self, name: &LockName) {
        self.store.evict(name);
    }
}

#[async_trait]
impl Faults for MemoryFixture {
    async fn faulty_client(&self) -> FaultyClient {
        let backend = self.store.backend();
        let link = backend.link();
        FaultyClient { locker: Arc::new(Client::with_config(backend, Self::config())), link: Box::new(link) }
    }

    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError> {
        let backend = self.store.backend();
        backend.link().cut();
        Ok(Arc::new(Client::with_config(backend, ClientConfig::with_op_timeout(timeout))))
    }
}

#[async_trait]
impl Restart for MemoryFixture {
    async fn stop_backend(&self) {
        self.store.set_available(false);
    }

    async fn start_backend(&self) {
        self.store.set_available(true);
    }
}

#[async_trait]
impl Storage for MemoryFixture {
    async fn records(&self, prefix: &str) -> usize {
        self.store.names_kept(prefix)
    }
}
