//! What a backend's tests give the suite: independent clients, and, for the properties
//! that need them, the means to hurt them. Each property's signature names the trait it
//! needs: [`Fixture`] (plain clients: runs against any live backend, as `dlock check`
//! does), [`Evict`], [`Faults`] or [`Restart`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{LockError, LockName, Locker};

pub use dlock_core::memory::Fault;

/// The time scale of one backend's tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A short lease ttl the backend honours exactly (or rounds up).
    pub ttl: Duration,
    /// Slack added to every time bound, for shared and noisy machines.
    pub margin: Duration,
    /// The operation timeout of the fixture's clients: how long one call may take before
    /// it fails with `Unavailable`.
    pub op_timeout: Duration,
    /// How long the fixture's clients keep what the backend stores for a name after the
    /// name's last use (its keep time for idle names: a short one, so that the suite can
    /// see idle names go).
    pub idle: Duration,
}

impl Timing {
    /// Short times for fixtures that only run [`core`](crate::properties::core) against a
    /// server of their own: 2 s leases with 4 s of slack, 2 s per operation, idle names
    /// kept for 1 s.
    pub const SHORT: Timing = Timing {
        ttl: Duration::from_secs(2),
        margin: Duration::from_secs(4),
        op_timeout: Duration::from_secs(2),
        idle: Duration::from_secs(1),
    };
}

/// A [`Fixture`] made of a timing and a function that connects a client: for a test that
/// runs properties against a server it set up its own way (over TLS, with credentials,
/// through the application's own pool or client) without a fixture type of its own.
///
/// ```
/// use std::sync::Arc;
/// use dlock_conformance::{properties, Connecting, Timing};
/// use dlock_core::memory::MemoryStore;
/// use dlock_core::Locker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let fixture = Connecting::new(Timing::SHORT, || async { Arc::new(store.client()) as Arc<dyn Locker> });
/// properties::core(&fixture).await;
/// # }
/// ```
pub struct Connecting<F> {
    timing: Timing,
    connect: F,
}

impl<F> Connecting<F> {
    /// A fixture whose clients `connect` makes, each a new one, with `timing`.
    pub fn new(timing: Timing, connect: F) -> Self {
        Connecting { timing, connect }
    }
}

impl<F> std::fmt::Debug for Connecting<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting").field("timing", &self.timing).finish_non_exhaustive()
    }
}

#[async_trait]
impl<F, Fut> Fixture for Connecting<F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: std::future::Future<Output = Arc<dyn Locker>> + Send,
{
    fn timing(&self) -> Timing {
        self.timing
    }

    async fn client(&self) -> Arc<dyn Locker> {
        (self.connect)().await
    }
}

/// A switch on one client's link to the backend: a TCP fault proxy, or an in-process
/// switch for backends without a network.
pub trait Link: Send + Sync {
    /// Plays `fault` from now on, for connections already open too.
    fn set(&self, fault: Fault);

    /// Closes the client's connections and refuses new ones.
    fn cut(&self) {
        self.set(Fault::Cut);
    }

    /// Keeps connections open but lets nothing through, as when a host freezes.
    fn blackhole(&self) {
        self.set(Fault::Blackhole);
    }

    /// Lets traffic flow again.
    fn restore(&self) {
        self.set(Fault::None);
    }
}

/// A client whose link can be cut.
pub struct FaultyClient {
    /// The client.
    pub locker: Arc<dyn Locker>,
    /// Its link.
    pub link: Box<dyn Link>,
}

impl std::fmt::Debug for FaultyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyClient").field("backend", &self.locker.backend_name()).finish_non_exhaustive()
    }
}

/// What a property needs from the fixture; [`Case::needs`](crate::properties::Case::needs)
/// says it for each property.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    /// Only independent clients ([`Fixture`]): runs against any live backend.
    Clients,
    /// Removing a lock underneath its holder ([`Evict`]).
    Evict,
    /// Hurting a client's link, or a client of an unreachable backend ([`Faults`]).
    Faults,
    /// Stopping and restarting the backend ([`Restart`]).
    Restart,
    /// Counting what the backend stores ([`Storage`]).
    Storage,
}

/// A backend under test: real servers started by the harness (or pointed to by
/// `DLOCK_TEST_*_URL`), and independent clients of them.
///
/// Every method of this trait and the ones built on it panics when the setup itself
/// fails: that is a broken test environment, not a property of the backend.
#[async_trait]
pub trait Fixture: Send + Sync {
    /// The time scale of this backend's tests.
    fn timing(&self) -> Timing;

    /// A new client with its own connection(s) or session, independent of the others.
    async fn client(&self) -> Arc<dyn Locker>;
}

/// A fixture that can remove a lock underneath its holder.
#[async_trait]
pub trait Evict: Fixture {
    /// Removes the lock `name` underneath its holder, as an operator deleting the key
    /// would; the fence counter stays.
    async fn evict(&self, name: &LockName);
}

/// A fixture that can hurt a client's link to the backend.
#[async_trait]
pub trait Faults: Fixture {
    /// A new client whose link to the backend can be hurt with any [`Fault`].
    async fn faulty_client(&self) -> FaultyClient;

    /// A client of a backend that cannot be reached, with the given operation and
    /// connect timeout. Backends that connect eagerly may fail here instead, with
    /// `Unavailable`, within the same bound.
    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError>;
}

/// A fixture that can stop and restart the backend.
#[async_trait]
pub trait Restart: Fixture {
    /// Why this fixture cannot stop its backend after all, if it cannot: it was pointed
    /// at a server it did not start (`DLOCK_TEST_*_URL`, a container). The properties
    /// that need a restart then print this and pass without running; a fixture that
    /// started its own servers never says so.
    fn cannot_restart(&self) -> Option<String> {
        None
    }

    /// Stops the backend (kill -9 of the server, keeping its data).
    async fn stop_backend(&self);

    /// Starts the stopped backend again on the same address and data.
    async fn start_backend(&self);
}

/// A fixture that can count what the backend stores, as an operator listing keys, rows
/// or znodes would.
#[async_trait]
pub trait Storage: Fixture {
    /// How many records (keys, rows, znodes: whatever the backend keeps) belong to lock
    /// names that start with `prefix`, counting expired ones the server has not removed
    /// yet.
    async fn records(&self, prefix: &str) -> usize;
}

/// A fixture with every capability: what a backend's own test suite provides.
pub trait FullFixture: Evict + Faults + Restart + Storage {}

impl<T: Evict + Faults + Restart + Storage> FullFixture for T {}
