//! ZooKeeper client errors as lock errors.

use dlock_core::LockError;
use zookeeper_client as zk;

/// A ZooKeeper error that is not about connectivity: the server refused the request.
#[derive(Debug, thiserror::Error)]
#[error("ZooKeeper {what} failed: {source}")]
pub struct ZkRequestError {
    what: &'static str,
    #[source]
    source: zk::Error,
}

/// Maps an error of the ZooKeeper client: lost connections, timeouts and dead sessions
/// are `Unavailable` (retrying later may work), a refused identity or right is `Refused`
/// (retrying cannot help), everything else is a `Backend` error.
pub(crate) fn lock_error(what: &'static str, err: zk::Error) -> LockError {
    if is_transient(&err) {
        return LockError::unavailable(format!("ZooKeeper {what}: {err}"));
    }
    let why = match err {
        // Also the server's answer to a client without SASL where it requires SASL.
        zk::Error::AuthFailed => "ZooKeeper refused the credentials: a wrong SASL user or password, or none where the server requires SASL (zk://user:password@host/?auth=sasl)",
        zk::Error::NoAuth => "ZooKeeper refused this identity the lock's nodes: another identity made them (a different digest password is a different identity, and the server lets a SASL user it does not know through as one of its own) or their ACL names another user",
        _ => return LockError::backend(ZkRequestError { what, source: err }),
    };
    LockError::refused(why, Some(Box::new(ZkRequestError { what, source: err })))
}

/// Whether the error says the server could not be reached (or the session is gone),
/// rather than that it refused the request.
pub(crate) fn is_transient(err: &zk::Error) -> bool {
    is_connection_loss(err)
        || matches!(
            err,
            zk::Error::Timeout
                | zk::Error::NoHosts
                | zk::Error::SessionExpired
                | zk::Error::SessionMoved
                | zk::Error::ClientClosed
                | zk::Error::Throttled
                | zk::Error::NotReadOnly
        )
}

/// Whether a request failed because its connection broke, so that it may or may not have
/// been applied. The client reports a connection it gave up on (no answer within its
/// connection timeout, an I/O error) with a `Custom` error rather than `ConnectionLoss`.
pub(crate) fn is_connection_loss(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// `Unavailable` for an operation that did not finish within its timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> LockError {
    LockError::unavailable(format!("ZooKeeper {what} did not complete within {timeout:?}"))
}

/// Sends a request again while its connection breaks under it: the client reconnects to
/// the same session meanwhile (requests wait for it), so a read, or a write whose second
/// application changes nothing, can simply be repeated. The caller's timeout bounds it.
pub(crate) async fn retrying<T, F, Fut>(mut request: F) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, zk::Error>>,
{
    loop {
        match request().await {
            Err(err) if is_connection_loss(&err) => {
                tracing::debug!(%err, "ZooKeeper connection lost; sending the request again");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            outcome => return outcome,
        }
    }
}
