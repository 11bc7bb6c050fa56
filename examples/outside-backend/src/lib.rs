//! A worked example of a dlock backend written outside dlock's repository: a small lease
//! server, the [`Backend`](dlock_core::backend::Backend) that speaks to it, and the
//! driver that lets [`dlock::connect`] reach it by a `leasemap://` URL. Its tests run the
//! whole shared conformance suite against it (`tests/conformance.rs`); the guide that
//! walks through it is `docs/testing-your-backend.md` in dlock's repository.
//!
//! It uses only what a crate of your own could: the public API of `dlock-core` (the
//! backend author's part is [`dlock_core::backend`]), [`dlock::register_driver`], and,
//! in its tests, `dlock-conformance` with its `proxy` feature.
//!
//! # The server
//!
//! [`LeaseServer`] keeps a map from lock names to holds (owner, re-entry count, fencing
//! token, expiry on the server's monotonic clock) and a fence counter per name that only
//! rises, and serves it on a TCP port with a line protocol. Every request is one line,
//! `<tag> <VERB> <field>...`, answered by one line with the same tag, so that a client
//! pipelines requests on one connection. Text fields are percent-encoded: a lock name
//! may hold any UTF-8 but NUL, and travels unchanged.
//!
//! | request | answers |
//! |---|---|
//! | `HELLO <version>` | `HELLO <version>` |
//! | `ACQUIRE <name> <owner> <request id> <ttl ms>` | `GRANTED <token>`, `BUSY <ms left>`, `VOID` |
//! | `RENEW <name> <owner> <token> <ttl ms>` | `RENEWED`, `EXPIRED`, `STOLEN` |
//! | `RELEASE <name> <owner> <token> <request id>` | `RELEASED`, `NOTHELD` |
//! | `GIVEBACK <name> <owner> <request id> <ttl ms>` | `OK` |
//! | `INSPECT <name>` | `FREE`, `HELD <owner> <token> <count> <ms left>` |
//! | `SWEEP <keep ms> <batch>` | `SWEPT <removed> <more>` |
//! | `EVICT <name>`, `COUNT <name prefix>` (for operators and tests) | `OK`, `COUNT <names>` |
//!
//! Any request may be answered `ERR <message>`.
//!
//! # How it keeps the contract
//!
//! - A grant is recorded under the request id that made it, so a request delivered
//!   twice (sent again after its connection broke) grants once, and a **give-back** of an
//!   acquire whose answer was lost takes back exactly that grant, never the owner's
//!   other ones; the server then refuses a late delivery of that request (`VOID`).
//! - `RENEW` and `RELEASE` check the owner *and* the token: a lease whose hold expired or
//!   was removed can neither extend nor free the next holder's lock.
//! - Expiry counts on the server from when it receives a request; the client counts its
//!   lease from when it sent it, minus a drift allowance, so the holder always stops
//!   believing in its lease before the server lets another in.
//! - Every operation is bounded: dlock's client bounds calls by the operation timeout and
//!   renewals by the lease's validity; the connection itself only bounds connecting.
//! - A name nobody used for the client's keep time is swept; the server remembers the
//!   highest token it swept away and starts new counters there, so tokens never go back.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{LockName, LockOptions, Locker};
//! use dlock_example_outside_backend::{register, LeaseServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = LeaseServer::start("127.0.0.1:0").await?;
//! register()?;
//! let locker = dlock::connect(&format!("leasemap://{}?op_timeout=1s", server.addr())).await?;
//! let name = LockName::new("orders/42")?;
//! let lease = locker.acquire(&name, &LockOptions::new().wait(Duration::from_secs(5))).await?;
//! println!("fence your writes with {}", lease.token());
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod protocol;
mod server;
mod wire;

use std::sync::Arc;

use dlock_core::{LockError, Locker};

pub use backend::{connect, Admin, LeaseMapBackend, LeaseMapConfig, LeaseMapHold, LeaseMapLocker, DEFAULT_PORT};
pub use server::LeaseServer;

/// The driver's name, which its lockers report as their backend name.
pub const DRIVER: &str = "leasemap";

/// The URL scheme of the lease server.
pub const SCHEME: &str = "leasemap";

/// Adds the `leasemap` driver to [`dlock::connect`] (and to a `dlock` command built on
/// `dlock_cli::main`), so that `leasemap://host:port` URLs reach a lease server. Calling
/// it again is harmless; it fails with `InvalidInput` only when another driver has taken
/// the name or the scheme.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// dlock_example_outside_backend::register()?;
/// dlock_example_outside_backend::register()?;
/// assert_eq!(dlock::driver("leasemap://127.0.0.1:7420")?.name(), "leasemap");
/// # Ok(()) }
/// ```
pub fn register() -> Result<(), LockError> {
    match dlock::register_driver(DRIVER, &[SCHEME], connect_url) {
        Ok(()) => Ok(()),
        // Registering lasts for the life of the process: a second call finds ours there.
        Err(err) => match dlock::driver(&format!("{SCHEME}://")) {
            Ok(driver) if driver.name() == DRIVER => Ok(()),
            _ => Err(err),
        },
    }
}

/// The driver's connect function: the whole URL in, a locker out.
fn connect_url(url: String) -> dlock::Connecting {
    Box::pin(async move {
        let locker = connect(LeaseMapConfig::from_url(&url)?).await?;
        Ok(Arc::new(locker) as Arc<dyn Locker>)
    })
}
