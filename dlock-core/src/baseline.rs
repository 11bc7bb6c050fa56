//! The raw baseline of a backend, for `dlock bench`: the same backend commands an
//! uncontended acquire and release send, issued directly through the backend's client
//! library without any of dlock's machinery, so that the library's overhead is a ratio
//! measured in one run.

use async_trait::async_trait;

use crate::error::LockError;
use crate::name::LockName;

/// The commands of one uncontended acquire+release, sent raw.
///
/// ```
/// use dlock_core::{memory::MemoryStore, LockName, RawBaseline};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_core::LockError> {
/// let raw = MemoryStore::new().raw_baseline();
/// raw.acquire_release(&LockName::new("bench/0")?).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RawBaseline: Send + Sync {
    /// Sends the acquire command(s) for `name` and then the release command(s), exactly
    /// as the library would on an uncontended lock, over the same kind of connection.
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError>;

    /// Sends the renewal command(s) for a hold of `name` (for the mass-renewal scenario).
    async fn renew(&self, name: &LockName) -> Result<(), LockError>;
}
