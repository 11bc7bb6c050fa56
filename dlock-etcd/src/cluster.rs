//! The etcd cluster as one client reaches it: a connection per endpoint, one of them
//! pinned at a time, and the next one pinned when it fails.
//!
//! `etcd-client` spreads requests over all endpoints through one balanced channel that
//! keeps a dead member in its rotation: with one member of three down, a good share of
//! requests fail at once ("tcp connect error"), or hang until a timeout where the dead
//! host does not refuse connections. Pinning one member, as etcd's own clients do, sends
//! every request to a member that answered last time; a request that surely never reached
//! a server (the connection was refused, or the member has no leader and said so before
//! doing anything) is sent again to the next member, within the same time bound.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::LockError;
use etcd_client::{
    Client, ConnectOptions, Error, GetOptions, GetResponse, LeaseGrantOptions, LeaseTimeToLiveOptions, Txn,
    TxnResponse, WatchOptions, WatchStream,
};
use tonic::Code;

use crate::error::{is_lease_gone, is_transient, map_err};

/// The first pause before sending again a request refused for want of a leader.
const RETRY_FIRST: Duration = Duration::from_millis(10);
/// The longest such pause.
const RETRY_MAX: Duration = Duration::from_millis(200);
/// The longest pause between attempts to revoke a lease left behind.
const REVOKE_PAUSE_MAX: Duration = Duration::from_secs(5);

/// The members of one cluster, as this client reaches them.
pub(crate) struct Cluster {
    members: Vec<Member>,
    pinned: AtomicUsize,
    options: ConnectOptions,
    connect_timeout: Duration,
    /// How long a request may stay unanswered before the next request goes to another
    /// member (the request itself may wait longer, up to its own limit).
    patience: Duration,
}

struct Member {
    endpoint: String,
    client: tokio::sync::OnceCell<Client>,
}

/// Whether a request may be sent again after the connection broke under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Only where it surely was not received: it may change something twice.
    Unsent,
    /// Whenever it may not have been served: repeating it changes nothing.
    Idempotent,
}

/// How a failed request is sent again.
enum Again {
    /// At once, to the next member.
    Refused,
    /// After a pause.
    AfterPause,
}

enum Failure {
    /// No client for the member: connecting (or authenticating) failed.
    Connect(Error),
    /// The request failed.
    Call(Error),
}

impl Cluster {
    pub(crate) fn new(
        endpoints: Vec<String>,
        options: ConnectOptions,
        connect_timeout: Duration,
        patience: Duration,
    ) -> Self {
        let members: Vec<Member> =
            endpoints.into_iter().map(|endpoint| Member { endpoint, client: tokio::sync::OnceCell::new() }).collect();
        // Clients start on different members, spreading the load as etcd's clients do.
        let first = fastrand::usize(..members.len().max(1));
        Cluster { members, pinned: AtomicUsize::new(first), options, connect_timeout, patience }
    }

    /// The application's own client, for every request: it keeps its own connections
    /// (and its own balancing over its endpoints); `label` names it in errors.
    pub(crate) fn given(client: Client, label: String, connect_timeout: Duration, patience: Duration) -> Self {
        let member = Member { endpoint: label, client: tokio::sync::OnceCell::new_with(Some(client)) };
        Cluster {
            members: vec![member],
            pinned: AtomicUsize::new(0),
            options: ConnectOptions::new(),
            connect_timeout,
            patience,
        }
    }

    async fn client(&self, index: usize) -> Result<Client, Error> {
        let member = &self.members[index];
        member
            .client
            .get_or_try_init(|| async {
                let connect = Client::connect([member.endpoint.as_str()], Some(self.options.clone()));
                match tokio::time::timeout(self.connect_timeout, connect).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::IoError(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection to {} in time", member.endpoint),
                    ))),
                }
            })
            .await
            .cloned()
    }

    /// The client of the pinned member, for users' own requests.
    pub(crate) async fn pinned_client(&self) -> Result<Client, LockError> {
        self.call("connect", self.connect_timeout, Retry::Idempotent, |client| async move { Ok(client) }).await
    }

    fn rotate(&self, from: usize) {
        if self.members.len() > 1 {
            let next = (from + 1) % self.members.len();
            if self.pinned.compare_exchange(from, next, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                tracing::debug!(from = %self.members[from].endpoint, to = %self.members[next].endpoint, "etcd member switched");
            }
        }
    }

    /// Runs `op` on the pinned member within `limit`, moving to the next member when this
    /// one cannot be reached. A request is sent again when that cannot apply it twice: at
    /// once to each other member when the connection was refused (it was never sent),
    /// after a short pause while the member refuses it for want of a leader (an election
    /// is under way), and, for a request that may be repeated (`Retry::Idempotent`), after
    /// a pause when the connection broke under it. An overrun is `Unavailable`.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &str,
        limit: Duration,
        retry: Retry,
        mut op: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let deadline = Instant::now() + limit;
        let mut refused = 0;
        let mut pause = RETRY_FIRST;
        loop {
            let index = self.pinned.load(Ordering::SeqCst) % self.members.len();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = async {
                let client = self.client(index).await.map_err(Failure::Connect)?;
                op(client).await.map_err(Failure::Call)
            };
            let mut attempt = std::pin::pin!(attempt);
            // A request may wait longer than the member deserves trust: past `patience`
            // the next requests go to another member while this one still waits for its
            // answer (a late answer of a renewal still counts).
            let answer = match tokio::time::timeout(remaining.min(self.patience), &mut attempt).await {
                Err(_) if remaining > self.patience => {
                    self.rotate(index);
                    tokio::time::timeout(remaining - self.patience, attempt).await
                }
                answer => answer,
            };
            let (err, again) = match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(Failure::Call(err))) if refused_connection(&err) => (err, Again::Refused),
                // Connecting sent no request of ours; authenticating may have been refused.
                Ok(Err(Failure::Connect(err))) if is_transient(&err) => (err, Again::Refused),
                Ok(Err(Failure::Call(err))) if no_leader(&err) => (err, Again::AfterPause),
                Ok(Err(Failure::Call(err))) if retry == Retry::Idempotent && is_transient(&err) => {
                    (err, Again::AfterPause)
                }
                Ok(Err(Failure::Connect(err) | Failure::Call(err))) => {
                    if member_trouble(&err) {
                        self.rotate(index);
                    }
                    return Err(map_err(err));
                }
                Err(_) => {
                    self.rotate(index);
                    return Err(LockError::unavailable(format!("etcd {what} did not complete within {limit:?}")));
                }
            };
            self.rotate(index);
            match again {
                Again::Refused => {
                    refused += 1;
                    if refused >= self.members.len() {
                        return Err(map_err(err));
                    }
                }
                Again::AfterPause => {
                    let retry_at = Instant::now() + pause;
                    if retry_at >= deadline {
                        return Err(map_err(err));
                    }
                    tokio::time::sleep_until(retry_at.into()).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// A transaction that changes something: sent again only where it surely did not apply.
    pub(crate) async fn txn(&self, what: &str, limit: Duration, txn: Txn) -> Result<TxnResponse, LockError> {
        self.call(what, limit, Retry::Unsent, |client| {
            let txn = txn.clone();
            async move { client.kv_client().txn(txn).await }
        })
        .await
    }

    /// A transaction that only reads, or whose guard makes a repeat harmless.
    pub(crate) async fn read(&self, what: &str, limit: Duration, txn: Txn) -> Result<TxnResponse, LockError> {
        self.call(what, limit, Retry::Idempotent, |client| {
            let txn = txn.clone();
            async move { client.kv_client().txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        limit: Duration,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<GetResponse, LockError> {
        self.call(what, limit, Retry::Idempotent, |client| {
            let (key, options) = (key.clone(), options.clone());
            async move { client.kv_client().get(key, Some(options)).await }
        })
        .await
    }

    /// Grants a lease under an id this client chose, so that a grant sent again after its
    /// answer was lost finds the lease the first one made (and takes it, at the ttl the
    /// server gave it) instead of making a second one. A grant that fails (or is dropped)
    /// after it may have reached the server leaves a lease nobody knows of: it is revoked
    /// in the background, for as long as it could live.
    pub(crate) async fn grant(self: &Arc<Self>, limit: Duration, ttl_secs: i64) -> Result<Granted, LockError> {
        let lives = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(u64::MAX));
        let unanswered = UnansweredGrant {
            cluster: self,
            id: fastrand::i64(1..i64::MAX),
            sent: AtomicBool::new(false),
            limit,
            ends: Instant::now() + lives,
        };
        let id = unanswered.id;
        let granted = self
            .call("lease grant", limit, Retry::Idempotent, |client| {
                let resent = unanswered.sent.swap(true, Ordering::SeqCst);
                let sent = &unanswered.sent;
                async move {
                    let granted = grant_as(&client, id, ttl_secs, resent).await;
                    match &granted {
                        Ok(_) => sent.store(false, Ordering::SeqCst),
                        Err(err) if refused_connection(err) && !resent => sent.store(false, Ordering::SeqCst),
                        Err(_) => {}
                    }
                    granted
                }
            })
            .await;
        drop(unanswered);
        granted
    }

    pub(crate) async fn revoke(&self, limit: Duration, lease: i64) -> Result<(), LockError> {
        self.call("lease revoke", limit, Retry::Idempotent, |client| async move {
            client.lease_client().revoke(lease).await.map(drop)
        })
        .await
    }

    /// Revokes a lease that holds nothing of ours, in the background (the answer of the call
    /// that made it unused need not wait for it), trying again for `within` while the
    /// cluster cannot be reached: a lease left behind ends only at its own ttl.
    pub(crate) fn revoke_later(self: &Arc<Self>, limit: Duration, lease: i64, within: Duration) {
        // Dropped outside a runtime (at exit), the lease is left to its ttl.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let cluster = Arc::clone(self);
        let give_up = Instant::now() + within;
        runtime.spawn(async move {
            let mut pause = RETRY_MAX;
            loop {
                match cluster.revoke(limit, lease).await {
                    Ok(()) => return,
                    Err(err) if is_lease_gone(&err) => return,
                    Err(err) if !err.is_transient() || Instant::now() + pause >= give_up => {
                        tracing::debug!(%err, lease = %format_args!("{lease:x}"), "revoking an unused lease failed");
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(REVOKE_PAUSE_MAX);
                    }
                }
            }
        });
    }

    /// One keepalive on a fresh stream (closed again when the answer is in): `Ok(false)`
    /// when the lease is gone.
    pub(crate) async fn keep_alive(&self, limit: Duration, lease: i64) -> Result<bool, LockError> {
        let kept = self
            .call("keepalive", limit, Retry::Idempotent, |client| async move {
                client.lease_client().keep_alive(lease).await.map(drop)
            })
            .await;
        match kept {
            Ok(()) => Ok(true),
            Err(err) if is_lease_gone(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The remaining ttl of a lease in seconds (negative when it is gone).
    pub(crate) async fn time_to_live(&self, limit: Duration, lease: i64) -> Result<i64, LockError> {
        self.call("lease ttl", limit, Retry::Idempotent, |client| async move {
            client.lease_client().time_to_live(lease, None).await.map(|r| r.ttl())
        })
        .await
    }

    /// The keys attached to a lease, `None` when the lease is gone.
    pub(crate) async fn lease_keys(&self, limit: Duration, lease: i64) -> Result<Option<Vec<Vec<u8>>>, LockError> {
        self.call("lease keys", limit, Retry::Idempotent, |client| async move {
            let options = LeaseTimeToLiveOptions::new().with_keys();
            let resp = client.lease_client().time_to_live(lease, Some(options)).await?;
            Ok((resp.ttl() >= 0).then(|| resp.keys().to_vec()))
        })
        .await
    }

    pub(crate) async fn watch(
        &self,
        limit: Duration,
        key: Vec<u8>,
        options: WatchOptions,
    ) -> Result<WatchStream, LockError> {
        self.call("watch", limit, Retry::Idempotent, |client| {
            let (key, options) = (key.clone(), options.clone());
            async move { client.watch_client().watch(key, Some(options)).await }
        })
        .await
    }
}

/// A lease the cluster granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    /// Its id.
    pub(crate) id: i64,
    /// Its ttl in seconds, as the server set it (never below what was asked, perhaps above).
    pub(crate) ttl: i64,
}

/// A grant that may have reached the server with no answer yet (`sent`): when it is
/// dropped so, the lease it may have made is revoked in the background.
struct UnansweredGrant<'a> {
    cluster: &'a Arc<Cluster>,
    id: i64,
    sent: AtomicBool,
    limit: Duration,
    /// When the lease would end on its own.
    ends: Instant,
}

impl Drop for UnansweredGrant<'_> {
    fn drop(&mut self) {
        if self.sent.load(Ordering::SeqCst) {
            let within = self.ends.saturating_duration_since(Instant::now());
            self.cluster.revoke_later(self.limit, self.id, within);
        }
    }
}

/// One grant of lease `id`. Sent again (`resent`), a grant the server says exists was
/// made by an earlier sending whose answer was lost: ids are drawn at random from 2^63,
/// so another client's lease under the same id is not a case to plan for.
async fn grant_as(client: &Client, id: i64, ttl_secs: i64, resent: bool) -> Result<Granted, Error> {
    let mut leases = client.lease_client();
    match leases.grant(ttl_secs, Some(LeaseGrantOptions::new().with_id(id))).await {
        Ok(resp) => Ok(Granted { id: resp.id(), ttl: resp.ttl() }),
        Err(err) if resent && lease_exists(&err) => {
            let ttl = leases.time_to_live(id, None).await?.granted_ttl();
            tracing::debug!(lease = %format_args!("{id:x}"), "a grant sent again found the lease it made");
            Ok(Granted { id, ttl })
        }
        Err(err) => Err(err),
    }
}

/// Whether a grant was refused because a lease with its id exists.
fn lease_exists(err: &Error) -> bool {
    matches!(err, Error::GRpcStatus(status) if status.code() == Code::FailedPrecondition && status.message().contains("lease already exists"))
}

/// Whether the connection was refused: the request was never sent.
fn refused_connection(err: &Error) -> bool {
    match err {
        Error::GRpcStatus(status) => {
            status.code() == Code::Unavailable && {
                let message = status.message();
                message.contains("tcp connect error") || message.contains("error trying to connect")
            }
        }
        Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether the member refused the request for want of a leader, before doing anything.
fn no_leader(err: &Error) -> bool {
    matches!(err, Error::GRpcStatus(status) if status.code() == Code::Unavailable && status.message().contains("etcdserver: no leader"))
}

/// Whether the member looks unreachable or cut off (worth trying another).
fn member_trouble(err: &Error) -> bool {
    match err {
        Error::GRpcStatus(status) => match status.code() {
            Code::Unavailable => !status.message().starts_with("etcdserver:"),
            Code::DeadlineExceeded | Code::Unknown => true,
            _ => false,
        },
        Error::TransportError(_) | Error::IoError(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer};

    /// A grant sent again under the id of one whose answer was lost takes the lease the
    /// first made; sent once, the same grant is refused (that id is another's lease).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_sent_again_takes_the_lease_it_made() {
        let server = tokio::task::spawn_blocking(|| EtcdServer::start(&ServerConfig::default()))
            .await
            .expect("spawn_blocking")
            .expect("start etcd");
        let endpoint = server.url().replacen("etcd://", "http://", 1);
        let client = Client::connect([endpoint], None).await.expect("connect");
        let id = fastrand::i64(1..i64::MAX);

        let first = grant_as(&client, id, 60, false).await.expect("the first grant");
        assert_eq!(first, Granted { id, ttl: 60 });
        let again = grant_as(&client, id, 60, true).await.expect("the grant sent again");
        assert_eq!(again, first, "the grant sent again took the lease the first made");
        let leases = client.lease_client().leases().await.expect("list leases");
        assert_eq!(leases.leases().iter().filter(|l| l.id() == id).count(), 1);

        let other = grant_as(&client, id, 60, false).await.expect_err("a first grant under a taken id");
        assert!(lease_exists(&other), "{other}");
    }
}
