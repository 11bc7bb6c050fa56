//! The RedLock [`Backend`]: every operation is one fan-out of a script call to all the
//! masters at once, decided by a quorum of their answers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_core::backend::lock_unpoisoned;
use dlock_core::backend::{Attempt, Backend, Release, Renewal, Request};
use dlock_core::{Capabilities, ConnectConfig, FencingToken, LockError, LockInfo, LockName, StoredResult};
use redis::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::config::RedLockConfig;
use super::nodes::{fan_out, fan_out_keeping_late, NodeLink, Nodes};
use super::quorum::{
    count_released, decide_grant, decide_inspect, decide_release, decide_renewal, grant_won, inspect_done, max_fence,
    renewal_done, unreachable, Answer, GrantAnswers, GrantOutcome,
};
use super::token::Proposer;
use crate::backend::{give_back_call, release_call, renew_call};
use crate::config::Node;
use crate::hold::{holder, RedisHold};
use crate::keys::{grant_field, owner_field, KeyLayout, LockKeys, TOKEN_FIELD};
use crate::pubsub::Registration;
use crate::scripts::{scripts, ttl_millis, GrantReply, HoldView, Invocation, ReleaseReply, RenewReply};

/// What RedLock can do: everything but FIFO grants and queue lengths (waiters are not
/// queued on the masters; each retries when woken).
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    fifo: false,
    notify: true,
    ttl: true,
    fixed: true,
    extend: true,
    queue_length: false,
    results: true,
    shared: false,
    permits: false,
};

/// The RedLock backend of one client: the masters, the key layout (the same as a single
/// server's, on every node), and the settings that shape each operation.
pub struct RedLockBackend {
    nodes: Nodes,
    layout: KeyLayout,
    config: RedLockConfig,
    quorum: usize,
    node_timeout: Duration,
    proposer: Proposer,
    /// How long a name's fence counter outlives its last use on a node, in ms.
    keep_ms: u64,
}

impl std::fmt::Debug for RedLockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockBackend").finish_non_exhaustive()
    }
}

/// A RedLock hold is a Redis hold: the same keys, fields and token on every master.
pub type RedLockHold = RedisHold;

/// A waiter's subscriptions to the lock's release channel on every node, sharing one
/// wake-up.
pub struct RedLockTicket {
    notify: Arc<Notify>,
    _registrations: Vec<Registration>,
    /// After a split vote, the next wait is a plain random delay: the competitors' own
    /// give-backs publish releases that would otherwise wake them all at once again.
    quiet: bool,
    /// Split votes so far in this acquire: each one doubles the range of the random delay.
    splits: u32,
}

impl std::fmt::Debug for RedLockTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockTicket").field("quiet", &self.quiet).field("splits", &self.splits).finish()
    }
}

/// One acquire request as every node sees it: the lock's keys, the owner and grant
/// fields, the marker of a given-back request, and the ttl.
struct Ask {
    keys: LockKeys,
    owner: String,
    grant: String,
    void: String,
    ttl_ms: u64,
    /// The keep time of the name's fence counter, in ms.
    keep_ms: u64,
    /// The give-back of the last round, still running: the next round of the same
    /// request waits for it, so that it finds this request's earlier grants gone.
    giving_back: Mutex<Option<JoinHandle<()>>>,
}

impl Ask {
    fn new(layout: &KeyLayout, req: &Request, keep_ms: u64) -> Self {
        let keys = layout.lock(&req.name);
        Ask {
            owner: owner_field(&req.owner),
            grant: grant_field(&req.id),
            void: keys.void(&req.id),
            ttl_ms: ttl_millis(req.ttl()),
            keep_ms,
            keys,
            giving_back: Mutex::new(None),
        }
    }

    /// Waits for the give-back of the last round, if one is running (it is bounded by the
    /// node timeout).
    async fn given_back(&self) {
        let running = lock_unpoisoned(&self.giving_back).take();
        if let Some(running) = running {
            let _ = running.await;
        }
    }
}

/// What one look at the lock (one or two grant rounds) found.
enum Look {
    Won(u64),
    Busy { split: bool, retry_after: Option<Duration> },
}

impl RedLockBackend {
    pub(crate) fn new(nodes: Nodes, layout: KeyLayout, config: &RedLockConfig) -> Self {
        RedLockBackend {
            quorum: config.quorum(),
            node_timeout: config.node_timeout(),
            proposer: Proposer::new(config.token_source(), config.lead()),
            keep_ms: ttl_millis(config.keep_idle()).max(1),
            config: config.clone(),
            nodes,
            layout,
        }
    }

    /// The masters, in the configured order.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes.iter().map(|link| link.node.clone()).collect()
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The key layout.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The keys and channel of `name` (the same on every node).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        self.layout.lock(name)
    }

    /// The command connection to node `index`, for commands of your own.
    pub fn connection(&self, index: usize) -> Option<crate::RedisConnection> {
        self.nodes.get(index).map(|link| link.conn.clone())
    }

    /// `PING`s every node at once, each within the node timeout: which nodes answer now
    /// (a health check; connections to nodes that were down reconnect on the way).
    pub async fn ping_nodes(&self) -> Vec<Result<(), LockError>> {
        let answers = fan_out(
            &self.nodes,
            self.node_timeout,
            |mut conn| async move { redis::cmd("PING").query_async::<String>(&mut conn).await },
            |_| false,
        )
        .await;
        answers
            .into_iter()
            .map(|answer| match answer {
                Answer::Replied(_) => Ok(()),
                Answer::Failed(err) => Err(crate::error::to_lock_error(err)),
                Answer::Pending | Answer::TimedOut => {
                    Err(LockError::unavailable(format!("no answer within {:?}", self.node_timeout)))
                }
            })
            .collect()
    }

    /// How many lock channels this client's waiters are subscribed to now, on the node
    /// with the most.
    pub fn subscribed_channels(&self) -> usize {
        self.nodes.iter().map(|link| link.subscriptions.channels()).max().unwrap_or(0)
    }

    /// The bound of a renewal, release or inspect fan-out. They stop as soon as a quorum
    /// decided, so a dead node does not slow them down, and a per-node timeout would only
    /// fail them when a burst of renewals queues up on the connections; the bound stays
    /// below the operation timeout, so that the answers, not the client's timeout,
    /// explain a failure.
    fn settle_timeout(&self) -> Duration {
        self.config.op_timeout().saturating_sub(self.node_timeout)
    }

    fn has_time_for(&self, fan_outs: u32, deadline: Instant) -> bool {
        Instant::now() + self.node_timeout * fan_outs <= deadline
    }

    /// The fan-outs of one more look at the lock: the last round's give-back, then a
    /// grant round, after reading the counters if the proposer reads first.
    fn fan_outs_per_look(&self) -> u32 {
        if self.proposer.reads_first() {
            3
        } else {
            2
        }
    }

    /// A random delay after the `splits`-th split vote in a row, so that competitors do
    /// not try again in step: up to the retry delay, doubling with each split (up to 16
    /// times), as the contention proves heavier.
    fn jitter(&self, splits: u32) -> Duration {
        let range = self.config.retry_delay().saturating_mul(1 << splits.saturating_sub(1).min(4));
        range.mul_f64(fastrand::f64())
    }

    /// Registers for the release channel on every node, then waits (up to the node
    /// timeout) for the subscriptions to be in place. One confirmed later wakes the
    /// waiter, which then looks again.
    async fn subscribe(&self, channel: &str) -> RedLockTicket {
        let notify = Arc::new(Notify::new());
        let (registrations, confirmations): (Vec<_>, Vec<_>) =
            self.nodes.iter().map(|link| link.subscriptions.register(channel, notify.clone())).unzip();
        let confirmed = futures::future::join_all(confirmations.into_iter().map(|c| c.confirmed()));
        let _ = tokio::time::timeout(self.node_timeout, confirmed).await;
        RedLockTicket { notify, _registrations: registrations, quiet: false, splits: 0 }
    }

    /// One look at the lock: a grant round with the proposer's first proposal (after
    /// reading the counters, if it reads first), and one more round above the highest
    /// counter if the only obstacle was a proposal too low.
    async fn look(&self, ask: &Ask, deadline: Instant) -> Result<Look, LockError> {
        let mut proposal = match self.proposer.first(&ask.keys.fence) {
            Some(proposal) => proposal,
            None => self.proposer.above(self.read_counters(&ask.keys).await?),
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            let (outcome, mut answers) = self.grant_round(ask, proposal).await;
            tracing::debug!(proposal, ?outcome, round = rounds, "RedLock grant round");
            let timed_out = answers.iter().any(|a| matches!(a, Answer::TimedOut));
            match outcome {
                GrantOutcome::Won(token) => return Ok(Look::Won(token)),
                // Nodes that did not answer in time (rather than refusing the connection)
                // may have been slow once: one more round, if the operation has time.
                GrantOutcome::Unreachable { .. } if timed_out && rounds < 2 && self.has_time_for(2, deadline) => {
                    proposal = self.proposer.above(max_fence(&answers).unwrap_or(0).max(proposal));
                }
                GrantOutcome::Unreachable { got } => return Err(unreachable(&mut answers, got, self.quorum)),
                GrantOutcome::Stale { max_fence } if rounds < 2 && self.has_time_for(2, deadline) => {
                    proposal = self.proposer.above(max_fence);
                }
                GrantOutcome::Stale { .. } => return Ok(Look::Busy { split: true, retry_after: None }),
                GrantOutcome::Busy { split, retry_after } => return Ok(Look::Busy { split, retry_after }),
            }
        }
    }

    /// Phase one of the plain two-phase scheme: the highest fence counter a quorum reports
    /// (a node without one reports its clock plus the lead).
    async fn read_counters(&self, keys: &LockKeys) -> Result<u64, LockError> {
        let call = Arc::new(read_fence_call(keys, self.proposer.lead_micros()));
        let mut answers = fan_out(
            &self.nodes,
            self.node_timeout,
            |mut conn| {
                let call = call.clone();
                async move { Ok(redis::from_redis_value::<u64>(call.run(&mut conn).await?)?) }
            },
            |_| false,
        )
        .await;
        let read = answers.iter().filter(|a| a.replied().is_some()).count();
        if read < self.quorum {
            return Err(unreachable(&mut answers, read, self.quorum));
        }
        Ok(answers.iter().filter_map(Answer::replied).copied().max().unwrap_or(0))
    }

    /// Sends the grant script with `proposal` to every node and decides. A round gives
    /// back whatever it may have taken that is not part of a won hold: its grants and
    /// re-entries on the nodes that answered, and on every node that did not, whatever
    /// grant of the request landed there unseen (a grant of the proposal, or a re-entry of
    /// a hold the owner has there) unless it carries the won token. That is a release on
    /// every node but those that answered busy or stale, whose script changed nothing. The
    /// give-back runs in the background (bounded by the node timeout), so that a lost look
    /// costs one node timeout; a later round of the same request waits for it first.
    async fn grant_round(&self, ask: &Ask, proposal: u64) -> (GrantOutcome, Vec<Answer<(GrantReply, u64)>>) {
        ask.given_back().await;
        let keys = &ask.keys;
        let mut guard = GiveBack { nodes: &self.nodes, ask, armed: true, timeout: self.node_timeout };
        let call = Arc::new(grant_call(
            keys,
            (&ask.owner, &ask.grant, &ask.void),
            proposal,
            (ask.ttl_ms, ask.keep_ms),
            self.proposer.lead_micros(),
        ));
        let quorum = self.quorum;
        let (answers, late) = fan_out_keeping_late(
            &self.nodes,
            self.node_timeout,
            |mut conn| {
                let call = call.clone();
                async move { GrantReply::parse(call.run(&mut conn).await?) }
            },
            |answers| grant_won(answers, quorum).is_some(),
        )
        .await;
        if let Some(fence) = max_fence(&answers) {
            self.proposer.observe(&keys.fence, fence);
        }
        let outcome = decide_grant(&answers, proposal, quorum);
        let mut leftovers = leftovers(&answers, outcome);
        guard.disarm();
        if !leftovers.is_empty() {
            let (nodes, keys, owner, grant, timeout) =
                (self.nodes.clone(), keys.clone(), ask.owner.clone(), ask.grant.clone(), self.node_timeout);
            let keep_ms = ask.keep_ms;
            let running = tokio::spawn(async move {
                // A node whose answer comes after a won round decided says what it took;
                // only those that never answer are looked at.
                late.answers_if_early(|index, reply| {
                    if let (Some(at), Ok((reply, _))) = (leftovers.iter().position(|(i, _)| *i == index), reply) {
                        match late_leftover(reply, outcome) {
                            Some(leftover) => leftovers[at].1 = leftover,
                            None => {
                                leftovers.remove(at);
                            }
                        }
                    }
                })
                .await;
                give_back(&nodes, &keys, (&owner, &grant), &leftovers, (keep_ms, timeout)).await
            });
            *lock_unpoisoned(&ask.giving_back) = Some(running);
        }
        (outcome, answers)
    }
}

/// The grant script call of one request (its owner and grant fields and its marker
/// key) with one proposal on one node: its ttl and the name's keep time in ms, and the
/// lead in µs that a node without a counter adds to the clock it reports.
pub(crate) fn grant_call(
    keys: &LockKeys,
    (owner_field, grant_field, void): (&str, &str, &str),
    proposal: u64,
    (ttl_ms, keep_ms): (u64, u64),
    lead_us: u64,
) -> Invocation {
    Invocation::new(&scripts().grant, &[&keys.hold, &keys.fence, void])
        .arg(owner_field)
        .arg(proposal.to_string())
        .arg(ttl_ms)
        .arg(grant_field)
        .arg(keep_ms)
        .arg(lead_us)
}

/// The call that reads one node's fence counter (or its clock plus `lead_us`).
pub(crate) fn read_fence_call(keys: &LockKeys, lead_us: u64) -> Invocation {
    Invocation::new(&scripts().read_fence, &[&keys.fence]).arg(lead_us)
}

/// The bound of a fan-out that has none of its own (its caller bounds it).
const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What a round gives back on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leftover {
    /// The grant or re-entry the node answered, with its token.
    Token(u64),
    /// Whatever grant the request has on a node whose answer was not seen: a grant of the
    /// proposal, or a re-entry of a hold the owner has there with another token (a lease
    /// it lost may have left one). A grant of `keep` (the won token) is part of the hold
    /// and stays.
    Unseen { keep: Option<u64> },
}

/// What a round gives back on a node whose answer came after it decided: a grant or a
/// re-entry of a token other than the won one.
fn late_leftover(reply: GrantReply, outcome: GrantOutcome) -> Option<Leftover> {
    match (reply, outcome) {
        (GrantReply::Granted(token) | GrantReply::Reentered(token), GrantOutcome::Won(won)) if token == won => None,
        (GrantReply::Granted(token) | GrantReply::Reentered(token), _) => Some(Leftover::Token(token)),
        _ => None,
    }
}

/// What a round must give back, node by node: grants and re-entries of a token other
/// than the winning one; and where no answer came, whatever the request's grant there
/// carries unless it is the winning token (then a late grant of it is part of the hold).
fn leftovers(answers: &GrantAnswers, outcome: GrantOutcome) -> Vec<(usize, Leftover)> {
    let won = match outcome {
        GrantOutcome::Won(token) => Some(token),
        _ => None,
    };
    answers
        .iter()
        .enumerate()
        .filter_map(|(index, answer)| match answer {
            Answer::Replied((GrantReply::Granted(token) | GrantReply::Reentered(token), _)) => {
                (won != Some(*token)).then_some((index, Leftover::Token(*token)))
            }
            Answer::Replied(_) => None,
            Answer::Pending | Answer::TimedOut | Answer::Failed(_) => Some((index, Leftover::Unseen { keep: won })),
        })
        .collect()
}

/// Releases the grant `grant` of `owner` on each node of `leftovers` (owner-, grant- and
/// token-checked, so a hold that is not this request's is never touched), all at once,
/// within `timeout`. Where the token is not known, the node's hold is read first: on the
/// same connection, behind the grant call that may still be on its way.
async fn give_back(
    nodes: &[NodeLink],
    keys: &LockKeys,
    (owner, grant): (&str, &str),
    leftovers: &[(usize, Leftover)],
    (keep_ms, timeout): (u64, Duration),
) {
    if leftovers.is_empty() {
        return;
    }
    let calls = leftovers.iter().map(|&(index, leftover)| {
        let mut conn = nodes[index].conn.clone();
        async move {
            let token = match leftover {
                Leftover::Token(token) => token,
                Leftover::Unseen { keep } => {
                    let (token, granted): (Option<String>, Option<String>) =
                        redis::cmd("HMGET").arg(&keys.hold).arg(TOKEN_FIELD).arg(grant).query_async(&mut conn).await?;
                    match (token.and_then(|t| t.parse::<u64>().ok()), granted) {
                        (Some(token), Some(_)) if Some(token) != keep => token,
                        _ => return Ok(Value::Nil),
                    }
                }
            };
            release_call(scripts(), keys, (owner, grant), token, keep_ms).run(&mut conn).await
        }
    });
    match tokio::time::timeout(timeout, futures::future::join_all(calls)).await {
        Ok(results) => {
            for err in results.into_iter().filter_map(Result::err) {
                tracing::debug!(%err, lock = %keys.hold, "giving back a partial grant failed; its ttl frees it");
            }
        }
        Err(_) => tracing::debug!(lock = %keys.hold, "giving back a partial grant timed out; its ttl frees it"),
    }
}

/// Gives back the round's grants on every node if the round is abandoned halfway (the
/// attempt's future dropped): they may have landed on any of them.
struct GiveBack<'a> {
    nodes: &'a Nodes,
    ask: &'a Ask,
    armed: bool,
    timeout: Duration,
}

impl GiveBack<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (nodes, keys, owner, grant, timeout) =
            (self.nodes.clone(), self.ask.keys.clone(), self.ask.owner.clone(), self.ask.grant.clone(), self.timeout);
        let leftovers: Vec<_> = (0..nodes.len()).map(|index| (index, Leftover::Unseen { keep: None })).collect();
        let keep_ms = self.ask.keep_ms;
        runtime.spawn(async move { give_back(&nodes, &keys, (&owner, &grant), &leftovers, (keep_ms, timeout)).await });
    }
}

#[async_trait]
impl Backend for RedLockBackend {
    type Hold = RedLockHold;
    type Ticket = RedLockTicket;

    fn name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        REDLOCK_CAPABILITIES
    }

    fn target(&self) -> String {
        self.config.target()
    }

    async fn attempt(
        &self,
        req: &Request,
        ticket: &mut Option<RedLockTicket>,
    ) -> Result<Attempt<RedLockHold>, LockError> {
        // The client bounds the whole attempt by the operation timeout, from a moment
        // just before this one: start no fan-out that could not finish within it.
        let deadline = Instant::now() + self.config.op_timeout().saturating_sub(self.node_timeout / 4);
        // A quiet wait is the one right after a split vote and no other: a wait cut short
        // (the client woke the waiter for a release of its own) must not leave the next
        // wait, behind a holder, deaf to that holder's release until its ttl.
        if let Some(ticket) = ticket.as_mut() {
            ticket.quiet = false;
        }
        let ask = Ask::new(&self.layout, req, self.keep_ms);
        let mut look = self.look(&ask, deadline).await?;
        if let Look::Busy { split, .. } = look {
            // The subscriptions, then one more look (each fan-out within a node timeout).
            if req.blocking && ticket.is_none() && self.has_time_for(1 + self.fan_outs_per_look(), deadline) {
                *ticket = Some(self.subscribe(&ask.keys.channel).await);
                // Look again: a release between the first look and the subscriptions
                // would otherwise go unnoticed until the holder's ttl. After a split
                // vote, the random delay comes first.
                if !split {
                    look = self.look(&ask, deadline).await?;
                }
            }
        }
        Ok(match look {
            Look::Won(token) => Attempt::Granted {
                hold: RedLockHold {
                    keys: ask.keys,
                    owner_field: ask.owner,
                    grant_field: ask.grant,
                    token,
                    kind: dlock_core::HoldKind::Exclusive,
                    handed_at: None,
                },
                token: FencingToken::new(token),
            },
            Look::Busy { split: true, .. } => {
                let splits = match ticket {
                    Some(ticket) => {
                        ticket.quiet = true;
                        ticket.splits += 1;
                        ticket.splits
                    }
                    None => 1,
                };
                Attempt::Busy { retry_after: Some(self.jitter(splits)) }
            }
            // Without a known expiry (the holds that stand in the way have none, or too
            // few nodes said when theirs end) look again after the retry delay: a holder
            // that crashed sends no release message.
            Look::Busy { split: false, retry_after } => {
                Attempt::Busy { retry_after: Some(retry_after.unwrap_or_else(|| self.jitter(1) + self.node_timeout)) }
            }
        })
    }

    async fn wait(
        &self,
        _req: &Request,
        ticket: &mut Option<RedLockTicket>,
        until: tokio::time::Instant,
    ) -> Result<(), LockError> {
        match ticket {
            Some(ticket) if !ticket.quiet => {
                let _ = tokio::time::timeout_at(until, ticket.notify.notified()).await;
            }
            Some(ticket) => {
                ticket.quiet = false;
                tokio::time::sleep_until(until).await;
            }
            None => tokio::time::sleep_until(until).await,
        }
        Ok(())
    }

    async fn renew(&self, hold: &RedLockHold, ttl: Duration) -> Result<Renewal, LockError> {
        let times = (ttl_millis(ttl), self.keep_ms);
        let call = renew_call(scripts(), &hold.keys, (&hold.owner_field, &hold.grant_field), hold.token, times);
        let call = Arc::new(call);
        let quorum = self.quorum;
        // No bound of its own: the client bounds a renewal by the lease's validity, and a
        // quorum of answers that come late but within it still renews.
        let mut answers = fan_out(
            &self.nodes,
            UNBOUNDED,
            |mut conn| {
                let call = call.clone();
                async move { RenewReply::parse(call.run(&mut conn).await?) }
            },
            |answers| renewal_done(answers, quorum) || decide_renewal(answers, quorum).is_some(),
        )
        .await;
        match decide_renewal(&answers, quorum) {
            Some(renewal) => Ok(renewal),
            None => {
                let renewed = answers.iter().filter(|a| a.replied() == Some(&RenewReply::Renewed)).count();
                Err(unreachable(&mut answers, renewed, quorum))
            }
        }
    }

    async fn release(&self, hold: &RedLockHold) -> Result<Release, LockError> {
        let call =
            release_call(scripts(), &hold.keys, (&hold.owner_field, &hold.grant_field), hold.token, self.keep_ms);
        let call = Arc::new(call);
        let quorum = self.quorum;
        let mut answers = fan_out(
            &self.nodes,
            self.settle_timeout(),
            |mut conn| {
                let call = call.clone();
                async move {
                    let (reply, sent_twice) = call.run_again_if_broken(&mut conn).await?;
                    Ok(ReleaseReply::parse(reply)?.released(sent_twice))
                }
            },
            |answers| count_released(answers) >= quorum,
        )
        .await;
        match decide_release(&answers, quorum) {
            Some(release) => Ok(release),
            None => {
                let released = count_released(&answers);
                Err(unreachable(&mut answers, released, quorum))
            }
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let keys = self.layout.lock(name);
        let call = Invocation::new(&scripts().inspect, &[&keys.hold]);
        let call = Arc::new(call);
        let quorum = self.quorum;
        let mut answers = fan_out(
            &self.nodes,
            self.settle_timeout(),
            |mut conn| {
                let call = call.clone();
                async move { HoldView::parse(call.run(&mut conn).await?) }
            },
            |answers| inspect_done(answers, quorum),
        )
        .await;
        let view = match decide_inspect(&answers, self.quorum) {
            Ok(view) => view,
            Err(got) => return Err(unreachable(&mut answers, got, self.quorum)),
        };
        Ok(LockInfo { holder: holder(view, &keys.hold)?, waiters: None })
    }

    async fn store_result(
        &self,
        hold: &RedLockHold,
        token: FencingToken,
        value: &[u8],
        retention: Duration,
    ) -> Result<(), LockError> {
        // As long as a release may take: a copy that lands late still lands under the
        // hold the master checks, so it needs no validity left on the client's clock.
        super::results::store(&self.nodes, self.settle_timeout(), self.quorum, hold, token, value, retention).await
    }

    async fn load_result(&self, name: &LockName) -> Result<Option<StoredResult>, LockError> {
        super::results::load(&self.nodes, self.settle_timeout(), self.quorum, &self.layout.lock(name)).await
    }

    async fn give_back(&self, req: &Request, ticket: Option<RedLockTicket>) {
        drop(ticket);
        let keys = self.layout.lock(&req.name);
        let call = Arc::new(give_back_call(scripts(), &keys, req));
        let answers = fan_out(
            &self.nodes,
            self.settle_timeout(),
            |mut conn| {
                let call = call.clone();
                async move { call.run(&mut conn).await }
            },
            |_| false,
        )
        .await;
        let unanswered = answers.iter().filter(|a| a.replied().is_none()).count();
        if unanswered > 0 {
            tracing::debug!(lock = %keys.hold, unanswered, "giving back an attempt whose reply was lost did not reach every node; their ttl frees them");
        }
    }

    fn clock_drift(&self, ttl: Duration) -> Duration {
        self.config.drift(ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::quorum::Answer;

    fn answers(list: Vec<Answer<GrantReply>>) -> Vec<Answer<(GrantReply, u64)>> {
        list.into_iter()
            .map(|answer| match answer {
                Answer::Replied(reply) => Answer::Replied((reply, 10)),
                Answer::Pending => Answer::Pending,
                _ => Answer::TimedOut,
            })
            .collect()
    }

    #[test]
    fn a_round_won_with_a_new_token_gives_back_the_reentries_seen_and_unseen() {
        use GrantReply::{Busy, Granted, Reentered};
        let answers = answers(vec![
            Answer::Replied(Reentered(7)),
            Answer::Pending,
            Answer::Replied(Granted(11)),
            Answer::Replied(Granted(11)),
            Answer::Replied(Granted(11)),
            Answer::Replied(Busy { left: None, token: 3 }),
        ]);
        let leftovers = leftovers(&answers, GrantOutcome::Won(11));
        // The pending node may have re-entered 7 as the first did: whatever it holds for
        // the request goes back, unless it is a late grant of the won token.
        assert_eq!(leftovers, vec![(0, Leftover::Token(7)), (1, Leftover::Unseen { keep: Some(11) })]);
    }

    #[test]
    fn a_round_won_by_reentry_keeps_the_reentries_and_gives_back_the_fresh_grants() {
        use GrantReply::{Granted, Reentered};
        let answers = answers(vec![
            Answer::Replied(Reentered(7)),
            Answer::Replied(Reentered(7)),
            Answer::Replied(Granted(11)),
            Answer::TimedOut,
        ]);
        let leftovers = leftovers(&answers, GrantOutcome::Won(7));
        assert_eq!(leftovers, vec![(2, Leftover::Token(11)), (3, Leftover::Unseen { keep: Some(7) })]);
    }

    #[test]
    fn a_late_answer_is_given_back_unless_it_holds_the_won_token() {
        use GrantReply::{Busy, Granted, Reentered};
        assert_eq!(late_leftover(Granted(11), GrantOutcome::Won(11)), None);
        assert_eq!(late_leftover(Reentered(7), GrantOutcome::Won(11)), Some(Leftover::Token(7)));
        assert_eq!(late_leftover(Granted(11), GrantOutcome::Won(7)), Some(Leftover::Token(11)));
        assert_eq!(late_leftover(Granted(11), GrantOutcome::Unreachable { got: 1 }), Some(Leftover::Token(11)));
        assert_eq!(late_leftover(Busy { left: None, token: 3 }, GrantOutcome::Won(11)), None);
    }

    #[test]
    fn a_lost_round_gives_back_everything_it_may_hold() {
        use GrantReply::{Granted, Reentered};
        let answers = answers(vec![Answer::Replied(Reentered(7)), Answer::Replied(Granted(11)), Answer::Pending]);
        let outcome = GrantOutcome::Unreachable { got: 1 };
        assert_eq!(
            leftovers(&answers, outcome),
            vec![(0, Leftover::Token(7)), (1, Leftover::Token(11)), (2, Leftover::Unseen { keep: None })]
        );
    }
}
