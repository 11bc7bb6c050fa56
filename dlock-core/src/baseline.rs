//! The raw baseline of a backend, for `dlock bench`: the same backend commands an
//! uncontended acquire and release send, issued directly through the backend's client
//! library without any of dlock's machinery, so that the library's overhead is a ratio
//! measured in one run.

use async_trait::async_trait;

use crate::error::LockError;
use crate::name::LockName;
use crate::options::HoldKind;

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

    /// Sends the commands of one uncontended acquire+release of a hold of `kind` (a
    /// reader's share, a permit), as the library would. The default covers the exclusive
    /// kind and answers `Unsupported` for the others, for a backend without them or
    /// without a raw form of them yet.
    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        match kind {
            HoldKind::Exclusive => self.acquire_release(name).await,
            other => Err(LockError::Unsupported(format!("a raw baseline of {} holds", other.as_str()))),
        }
    }

    /// Sends the commands of one uncontended campaign and resignation: the acquire, the
    /// store of `value` under the hold (as [`campaign`](crate::campaign) stores the
    /// leader's value), and the release. The default answers `Unsupported`, for a backend
    /// without stored results or without a raw form of them yet.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        let _ = (name, value);
        Err(LockError::Unsupported("a raw baseline of a campaign".into()))
    }

    /// Sends the renewal command(s) for a hold of `name` (for the mass-renewal scenario).
    async fn renew(&self, name: &LockName) -> Result<(), LockError>;
}
