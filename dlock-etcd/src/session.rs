//! Sessions: the etcd leases that hold a client's lock keys.
//!
//! A client has one shared session per distinct ttl (in whole seconds), granted on first
//! use and shared by every watchdog lock and waiter of that ttl: the lease is granted once
//! per session, never once per lock. A `Fixed` lease gets a private session of its own,
//! which nobody keeps alive.
//!
//! Sessions are kept alive on demand. Whoever needs the lease to last `need` from an
//! instant `since` (an acquire that is about to grant, a renewal, a waiter keeping its
//! place) sends a probe; one task per session answers the probes in rounds, each with one
//! keepalive sent after every probe of the round was made (so it extends the lease to at
//! least `since + ttl` for each) and the ownership checks of the renewals among them. A
//! keepalive is skipped when the last one already covers every probe. A renewal waits a
//! little (a 30th of the ttl) for others to share its round, as renewals of locks taken
//! at different moments come due at different moments; an acquire or a waiter never
//! waits. The checks of a large round are one listing of the lease's keys, of a small one
//! a transaction of reads. Renewing a thousand locks of one ttl thus costs a few rounds
//! of two requests each per renewal period, not a thousand round trips.
//!
//! A session that may hold a key nobody tracks (a put whose answer was lost, a delete
//! that failed) is retired: it takes no new requests, lives only as long as the holds and
//! waiters already on it, and is revoked when the last of them lets go. Any session is
//! revoked when nothing uses it any more.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use dlock_core::LockError;
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::Cluster;
use crate::error::EtcdError;

/// Range operations per checking transaction (etcd allows 128 by default).
const CHECKS_PER_TXN: usize = 100;
/// The longest a renewal waits for others to share its round.
const GATHER_MAX: Duration = Duration::from_millis(100);

/// What a session tells the rest of the backend after its rounds.
pub(crate) trait SessionEvents: Send + Sync {
    /// The server says the lease no longer exists: every hold on it is gone.
    fn lease_gone(&self, lease: i64);
    /// A round finished; a moment to tidy up.
    fn round_done(&self);
}

/// A renewal's ownership check: the key still exists with the token as create revision.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) key: Vec<u8>,
    pub(crate) token: i64,
}

/// The answer to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The lease is gone (expired or revoked), and every key on it with it.
    LeaseGone,
    /// The lease lasts at least `need` from `since`; `held` answers the check, if any.
    Alive { held: Option<bool> },
}

struct Request {
    since: Instant,
    need: Duration,
    check: Option<Check>,
    reply: oneshot::Sender<Result<Probe, LockError>>,
}

#[derive(Debug)]
struct State {
    /// A keepalive (or the grant) sent at this instant succeeded: the lease lasts at
    /// least the ttl from then.
    last_sent: Instant,
    /// The server said the lease is gone.
    gone: bool,
    /// No new request may use the lease (a key of ours may be on it untracked).
    retired: bool,
}

/// One etcd lease of this client.
pub(crate) struct Session {
    id: i64,
    ttl: Duration,
    private: bool,
    state: Arc<Mutex<State>>,
    requests: mpsc::UnboundedSender<Request>,
    cluster: Arc<Cluster>,
    op_timeout: Duration,
    /// Where a shared session is kept, and under which ttl.
    home: Option<(Weak<SessionMap>, i64)>,
}

/// The shared sessions of a client, by ttl in whole seconds.
type SessionMap = tokio::sync::Mutex<HashMap<i64, Arc<Session>>>;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("lease", &format_args!("{:x}", self.id)).field("ttl", &self.ttl).finish()
    }
}

impl Session {
    fn start(sessions: &Sessions, id: i64, ttl: Duration, granted: Instant, home: Option<i64>) -> Arc<Self> {
        let state = Arc::new(Mutex::new(State { last_sent: granted, gone: false, retired: false }));
        let (requests, rx) = mpsc::unbounded_channel();
        let (cluster, op_timeout) = (sessions.cluster.clone(), sessions.op_timeout);
        let rounds = Rounds {
            id,
            ttl,
            state: state.clone(),
            cluster: cluster.clone(),
            op_timeout,
            events: sessions.events.clone(),
        };
        tokio::spawn(rounds.run(rx));
        Arc::new(Session {
            id,
            ttl,
            private: home.is_none(),
            state,
            requests,
            cluster,
            op_timeout,
            home: home.map(|ttl| (Arc::downgrade(&sessions.shared), ttl)),
        })
    }

    /// Takes a shared session out of its client's map, so that it lives only as long as
    /// the holds and waiters already on it (and is revoked when they let go).
    fn leave_home(&self) {
        let Some((map, key)) = &self.home else { return };
        let (Some(map), Ok(runtime)) = (map.upgrade(), tokio::runtime::Handle::try_current()) else { return };
        let (key, id) = (*key, self.id);
        runtime.spawn(async move {
            let mut map = map.lock().await;
            if map.get(&key).is_some_and(|s| s.id == id) {
                map.remove(&key);
            }
        });
    }

    /// The lease id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// The ttl the server granted (whole seconds, at least what was asked).
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether this is a `Fixed` lease's own session.
    pub(crate) fn is_private(&self) -> bool {
        self.private
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the server said the lease is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.state().gone
    }

    /// Until when the lease certainly exists (unless revoked).
    pub(crate) fn alive_until(&self) -> Instant {
        self.state().last_sent + self.ttl
    }

    /// When a waiter should next keep the lease alive: a third of the ttl after the last
    /// keepalive, as a watchdog would.
    pub(crate) fn keepalive_due(&self) -> Instant {
        self.state().last_sent + self.ttl / 3
    }

    /// Whether a new request may put a key on this lease now.
    fn usable(&self, now: Instant) -> bool {
        let state = self.state();
        !state.gone && !state.retired && now + Duration::from_millis(50) < state.last_sent + self.ttl
    }

    /// Takes the lease out of service for new requests: a key of ours may be on it that
    /// nobody tracks (a put whose reply was lost, a delete that failed), and it must not be
    /// kept alive longer than the holds already on it need.
    pub(crate) fn retire(&self) {
        let newly = {
            let mut state = self.state();
            !std::mem::replace(&mut state.retired, true)
        };
        if newly {
            tracing::debug!(lease = %format_args!("{:x}", self.id), "lease retired");
            self.leave_home();
        }
    }

    /// Records that the server says the lease is gone.
    pub(crate) fn mark_gone(&self) {
        let newly = !std::mem::replace(&mut self.state().gone, true);
        if newly {
            self.leave_home();
        }
    }

    /// Makes sure the lease lasts at least `need` from `since`, keeping it alive if the
    /// last keepalive does not cover that. `Ok(false)` when the lease is gone.
    pub(crate) async fn ensure(&self, since: Instant, need: Duration) -> Result<bool, LockError> {
        {
            let state = self.state();
            if state.gone {
                return Ok(false);
            }
            if state.last_sent + self.ttl >= since + need {
                return Ok(true);
            }
        }
        Ok(self.probe(since, need, None).await? != Probe::LeaseGone)
    }

    /// Keeps the lease alive for `need` from `since` and checks that the key still holds.
    pub(crate) async fn renew(&self, since: Instant, need: Duration, check: Check) -> Result<Probe, LockError> {
        self.probe(since, need, Some(check)).await
    }

    async fn probe(&self, since: Instant, need: Duration, check: Option<Check>) -> Result<Probe, LockError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request { since, need, check, reply })
            .map_err(|_| LockError::backend(EtcdError::Protocol("the session's round task ended")))?;
        answer.await.map_err(|_| LockError::backend(EtcdError::Protocol("the session's round task ended")))?
    }
}

impl Drop for Session {
    /// Revokes the lease once nothing uses it: its keys (waiters that gave up, keys whose
    /// delete failed) go at once instead of at expiry.
    fn drop(&mut self) {
        if self.state().gone {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (cluster, id, limit) = (self.cluster.clone(), self.id, self.op_timeout);
        runtime.spawn(async move {
            if let Err(err) = cluster.revoke(limit, id).await {
                tracing::debug!(lease = %format_args!("{id:x}"), %err, "revoking an unused lease failed; it expires on its own");
            }
        });
    }
}

/// The task that answers one session's probes in rounds.
struct Rounds {
    id: i64,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    cluster: Arc<Cluster>,
    op_timeout: Duration,
    events: Weak<dyn SessionEvents>,
}

impl Rounds {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Request>) {
        // Renewals of locks acquired at different moments come due at different moments;
        // waiting a little for the others lets one round serve them all. The wait costs
        // nothing in safety (validity counts from before it) and little in slack (a 30th
        // of the ttl, at most a tenth of the operation timeout).
        let gather = (self.ttl / 30).min(self.op_timeout / 10).min(GATHER_MAX);
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            if batch[0].check.is_some() {
                let until = tokio::time::Instant::now() + gather;
                while let Ok(Some(more)) = tokio::time::timeout_at(until, rx.recv()).await {
                    // An acquire or a waiter is waiting for this round: send it now.
                    let urgent = more.check.is_none();
                    batch.push(more);
                    if urgent {
                        break;
                    }
                }
            }
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            batch.retain(|r| !r.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            self.round(batch).await;
            if let Some(events) = self.events.upgrade() {
                events.round_done();
            }
        }
    }

    async fn round(&self, batch: Vec<Request>) {
        let (gone, last_sent) = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.gone, state.last_sent)
        };
        if gone {
            for r in batch {
                let _ = r.reply.send(Ok(Probe::LeaseGone));
            }
            return;
        }
        let keepalive = batch.iter().any(|r| last_sent + self.ttl < r.since + r.need);
        let checks: Vec<&Check> = batch.iter().filter_map(|r| r.check.as_ref()).collect();
        let sent = Instant::now();
        let outcome = tokio::time::timeout(self.op_timeout, async {
            let alive = async {
                if keepalive {
                    self.keep_alive().await.map(Some)
                } else {
                    Ok(None)
                }
            };
            futures::join!(alive, self.check(&checks))
        })
        .await;
        let (alive, held) = match outcome {
            Ok(both) => both,
            Err(_) => {
                let err =
                    || LockError::unavailable(format!("etcd keepalive did not complete within {:?}", self.op_timeout));
                for r in batch {
                    let _ = r.reply.send(Err(err()));
                }
                return;
            }
        };
        match alive {
            Ok(Some(false)) => {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).gone = true;
                tracing::debug!(lease = %format_args!("{:x}", self.id), "the lease is gone");
                if let Some(events) = self.events.upgrade() {
                    events.lease_gone(self.id);
                }
                for r in batch {
                    let _ = r.reply.send(Ok(Probe::LeaseGone));
                }
            }
            Ok(confirmed) => {
                if confirmed.is_some() {
                    let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    state.last_sent = state.last_sent.max(sent);
                }
                let mut held = held.map(|v| v.into_iter());
                for r in batch {
                    let answer = match (&r.check, &mut held) {
                        (None, _) => Ok(Probe::Alive { held: None }),
                        (Some(_), Ok(results)) => match results.next() {
                            Some(h) => Ok(Probe::Alive { held: Some(h) }),
                            None => Err(LockError::backend(EtcdError::Protocol("a check transaction lost a result"))),
                        },
                        (Some(_), Err(err)) => Err(clone_err(err)),
                    };
                    let _ = r.reply.send(answer);
                }
            }
            Err(err) => {
                for r in batch {
                    let _ = r.reply.send(Err(clone_err(&err)));
                }
            }
        }
    }

    /// One keepalive: `Ok(false)` when the lease is gone.
    async fn keep_alive(&self) -> Result<bool, LockError> {
        self.cluster.keep_alive(self.op_timeout, self.id).await
    }

    /// Whether each key still exists with its token. Many checks are answered by one
    /// request for the keys attached to the lease (request keys are never reused, so a
    /// key attached under its name is the one granted); a few, or a lease with more keys
    /// than one answer carries, by transactions of up to [`CHECKS_PER_TXN`] reads.
    async fn check(&self, checks: &[&Check]) -> Result<Vec<bool>, LockError> {
        if checks.len() > CHECKS_PER_TXN {
            match self.cluster.lease_keys(self.op_timeout, self.id).await {
                Ok(Some(keys)) => {
                    let attached: HashSet<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                    return Ok(checks.iter().map(|c| attached.contains(c.key.as_slice())).collect());
                }
                // The keepalive sent along says so too, and answers every probe.
                Ok(None) => return Ok(vec![false; checks.len()]),
                Err(err) if err.is_transient() => return Err(err),
                Err(err) => tracing::debug!(%err, "listing the lease's keys failed; reading them one by one"),
            }
        }
        let txns = checks.chunks(CHECKS_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> =
                chunk.iter().map(|c| TxnOp::get(c.key.clone(), Some(GetOptions::new().with_keys_only()))).collect();
            async move {
                let resp = self.cluster.read("renewal check", self.op_timeout, Txn::new().and_then(ops)).await?;
                let found = resp
                    .op_responses()
                    .into_iter()
                    .zip(chunk)
                    .map(|(op, c)| match op {
                        TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| kv.create_revision() == c.token),
                        _ => false,
                    })
                    .collect::<Vec<_>>();
                if found.len() == chunk.len() {
                    Ok(found)
                } else {
                    Err(LockError::backend(EtcdError::Protocol("a check transaction answered too few reads")))
                }
            }
        });
        let results = futures::future::try_join_all(txns).await?;
        Ok(results.into_iter().flatten().collect())
    }
}

/// `LockError` is not `Clone`; a round's one failure is told to each of its probes.
fn clone_err(err: &LockError) -> LockError {
    match err {
        LockError::Unavailable { what, .. } => LockError::unavailable(what.clone()),
        other => LockError::backend(EtcdError::Round(other.to_string())),
    }
}

/// The client's shared sessions, one per ttl in whole seconds.
pub(crate) struct Sessions {
    cluster: Arc<Cluster>,
    op_timeout: Duration,
    events: Weak<dyn SessionEvents>,
    shared: Arc<SessionMap>,
}

impl Sessions {
    pub(crate) fn new(cluster: Arc<Cluster>, op_timeout: Duration, events: Weak<dyn SessionEvents>) -> Self {
        Sessions { cluster, op_timeout, events, shared: Arc::new(tokio::sync::Mutex::new(HashMap::new())) }
    }

    /// The shared session of this ttl, granting its lease if there is none in service.
    pub(crate) async fn shared(&self, ttl_secs: i64) -> Result<Arc<Session>, LockError> {
        let mut map = self.shared.lock().await;
        if let Some(session) = map.get(&ttl_secs) {
            if session.usable(Instant::now()) {
                return Ok(session.clone());
            }
        }
        let session = self.grant(ttl_secs, Some(ttl_secs)).await?;
        // The replaced session stays alive for whatever still uses it, and is revoked
        // when the last of them lets go.
        map.insert(ttl_secs, session.clone());
        Ok(session)
    }

    /// A new private session (a `Fixed` lease of its own).
    pub(crate) async fn private(&self, ttl_secs: i64) -> Result<Arc<Session>, LockError> {
        self.grant(ttl_secs, None).await
    }

    /// Grants a lease: for the map under `home`, or private.
    async fn grant(&self, ttl_secs: i64, home: Option<i64>) -> Result<Arc<Session>, LockError> {
        let sent = Instant::now();
        let resp = self.cluster.grant(self.op_timeout, ttl_secs).await?;
        // The server may raise a short ttl to its minimum; a shorter one would break the
        // promise that the hold outlasts the client's idea of it.
        let granted = resp.ttl();
        if granted < ttl_secs {
            let _ = self.cluster.revoke(self.op_timeout, resp.id()).await;
            return Err(EtcdError::ShortLease { asked: ttl_secs, granted }.into());
        }
        let ttl = Duration::from_secs(u64::try_from(granted).unwrap_or(u64::MAX));
        tracing::debug!(lease = %format_args!("{:x}", resp.id()), ?ttl, shared = home.is_some(), "lease granted");
        Ok(Session::start(self, resp.id(), ttl, sent, home))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::supervisor::etcd::{EtcdConfig, EtcdServer};
    use etcd_client::{ConnectOptions, PutOptions};

    struct Quiet;

    impl SessionEvents for Quiet {
        fn lease_gone(&self, _lease: i64) {}
        fn round_done(&self) {}
    }

    /// The sum of a gRPC server counter over every label set of one method.
    fn counter(metrics: &str, name: &str, method: &str) -> u64 {
        let label = format!("grpc_method=\"{method}\"");
        metrics
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_due_together_share_one_round() {
        let mut server = tokio::task::spawn_blocking(|| EtcdServer::start(&EtcdConfig::default()))
            .await
            .expect("spawn_blocking")
            .expect("start etcd");
        let limit = Duration::from_secs(2);
        let cluster = Arc::new(Cluster::new(vec![server.endpoint()], ConnectOptions::new(), limit));
        let events: Arc<dyn SessionEvents> = Arc::new(Quiet);
        let sessions = Sessions::new(cluster.clone(), limit, Arc::downgrade(&events));
        let ttl = Duration::from_secs(60);
        let session = sessions.shared(60).await.expect("grant");

        const HOLDS: usize = 450;
        let mut checks = Vec::new();
        for chunk in (0..HOLDS).collect::<Vec<_>>().chunks(100) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|i| format!("renewal-test/{i}").into_bytes()).collect();
            let puts: Vec<TxnOp> = keys
                .iter()
                .map(|key| TxnOp::put(key.clone(), "1 owner", Some(PutOptions::new().with_lease(session.id()))))
                .collect();
            let resp = cluster.txn("put", limit, Txn::new().and_then(puts)).await.expect("put");
            let revision = resp.header().expect("header").revision();
            checks.extend(keys.into_iter().map(|key| Check { key, token: revision }));
        }
        // One key is gone, as if an operator deleted it.
        cluster.delete(limit, checks[7].key.clone()).await.expect("delete");

        let before = server.member().metrics().expect("metrics");
        let since = Instant::now();
        let answers =
            futures::future::join_all(checks.iter().map(|check| session.renew(since, ttl, check.clone()))).await;
        let after = server.member().metrics().expect("metrics");

        for (i, answer) in answers.into_iter().enumerate() {
            let expected = Probe::Alive { held: Some(i != 7) };
            assert_eq!(answer.expect("renewal"), expected, "hold {i}");
        }
        let keepalives = counter(&after, "grpc_server_msg_received_total", "LeaseKeepAlive")
            - counter(&before, "grpc_server_msg_received_total", "LeaseKeepAlive");
        let txns =
            counter(&after, "grpc_server_started_total", "Txn") - counter(&before, "grpc_server_started_total", "Txn");
        let listings = counter(&after, "grpc_server_started_total", "LeaseTimeToLive")
            - counter(&before, "grpc_server_started_total", "LeaseTimeToLive");
        assert_eq!(keepalives, 1, "{HOLDS} renewals due together take one keepalive");
        assert_eq!((listings, txns), (1, 0), "their checks take one listing of the lease's keys");
        assert!(session.alive_until() >= since + ttl);
    }
}
