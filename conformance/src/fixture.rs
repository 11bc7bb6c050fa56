//! What a backend's tests give the suite: independent clients and control over faults.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{LockError, LockName, Locker};

/// The time scale of one backend's tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A short lease ttl the backend honours exactly (or rounds up).
    pub ttl: Duration,
    /// Slack added to every time bound, for shared and noisy machines.
    pub margin: Duration,
}

/// A switch on one client's link to the backend.
pub trait Link: Send + Sync {
    /// Closes the client's connections and refuses new ones.
    fn cut(&self);
    /// Keeps connections open but lets nothing through, as when a host freezes.
    fn blackhole(&self);
    /// Lets traffic flow again.
    fn restore(&self);
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
        f.debug_struct("FaultyClient").finish_non_exhaustive()
    }
}

/// What the suite needs from a backend's test setup beyond plain clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    /// Only independent clients: runs against any live backend (`dlock check`).
    Clients,
    /// Removing a lock underneath its holder ([`Fixture::evict`]).
    Evict,
    /// Cutting a client's link, or a client of an unreachable backend.
    Faults,
    /// Stopping and restarting the backend.
    Restart,
}

/// A backend under test: real servers started by the harness (or pointed to by
/// `DLOCK_TEST_*_URL`), and the means to hurt them.
///
/// Every method panics when the setup itself fails: that is a broken test environment,
/// not a property of the backend.
#[async_trait]
pub trait Fixture: Send + Sync {
    /// The time scale of this backend's tests.
    fn timing(&self) -> Timing;

    /// A new client with its own connection(s) or session, independent of the others.
    async fn client(&self) -> Arc<dyn Locker>;

    /// A new client whose link to the backend can be cut or blackholed.
    async fn faulty_client(&self) -> FaultyClient;

    /// Removes the lock `name` underneath its holder, as an operator deleting the key
    /// would; the fence counter stays.
    async fn evict(&self, name: &LockName);

    /// A client of a backend that cannot be reached, with the given operation and
    /// connect timeout. Backends that connect eagerly may fail here instead, with
    /// `Unavailable`, within the same bound.
    async fn unreachable_client(&self, timeout: Duration) -> Result<Arc<dyn Locker>, LockError>;

    /// Stops the backend (kill -9 of the server, keeping its data).
    async fn stop_backend(&self);

    /// Starts the stopped backend again on the same address and data.
    async fn start_backend(&self);
}
