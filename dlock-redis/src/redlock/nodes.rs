//! The N masters of a RedLock client: one command connection and one (lazy) pub/sub
//! connection each, and the fan-out that sends one call to all of them at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use redis::RedisResult;

use dlock_core::{ConnectConfig, LockError};

use super::config::RedLockConfig;
use super::quorum::Answer;
use crate::config::Node;
use crate::connection::{self, RedisConnection};
use crate::pubsub::Subscriptions;

/// One master: its address, command connection and release subscriptions.
pub(crate) struct NodeLink {
    pub(crate) node: Node,
    pub(crate) conn: RedisConnection,
    pub(crate) subscriptions: Subscriptions,
}

/// The masters of one client, shared with the tasks that clean up after it.
pub(crate) type Nodes = Arc<[NodeLink]>;

/// Connects to every node at once, within the connect timeout. Nodes that do not answer
/// get a connection that opens on first use, so that a client can start while a
/// minority is down; fewer than a quorum answering is an error (`Unavailable` when none
/// did, `QuorumNotReached` otherwise), and so is any answer that is not about reaching
/// a node (wrong credentials, say).
pub(crate) async fn connect(config: &RedLockConfig) -> Result<Nodes, LockError> {
    config.validate()?;
    let attempts = config.nodes().iter().map(|node| async move {
        let node_config = config.node_config(node);
        let outcome = connection::connect(&node_config).await;
        (node, node_config, outcome)
    });
    let mut reached = 0;
    let mut first_failure = None;
    let mut connected = Vec::with_capacity(config.nodes().len());
    let mut answered = Vec::new();
    for (node, node_config, outcome) in futures::future::join_all(attempts).await {
        let link = match outcome {
            Ok(link) => {
                reached += 1;
                answered.push((node.clone(), link.commands.clone()));
                link
            }
            Err(err) if err.is_transient() => {
                tracing::debug!(%node, %err, "RedLock node unreachable at connect; it will be tried on first use");
                first_failure.get_or_insert(err);
                connection::connect_lazily(&node_config)?
            }
            Err(err) => return Err(err),
        };
        connected.push((node.clone(), link));
    }
    refuse_duplicates(&answered, config.connect_timeout()).await?;
    let quorum = config.quorum();
    if reached < quorum {
        return Err(match (reached, first_failure) {
            (0, first) => LockError::unavailable(format!(
                "none of the {} RedLock nodes answered{}",
                config.nodes().len(),
                first.map(|err| format!(" (first: {err})")).unwrap_or_default()
            )),
            (got, _) => LockError::QuorumNotReached { got, needed: quorum },
        });
    }
    Ok(connected
        .into_iter()
        .map(|(node, link)| NodeLink {
            node,
            conn: link.commands,
            subscriptions: Subscriptions::start(link.nodes, config.connect_timeout(), config.op_timeout()),
        })
        .collect())
}

/// Refuses two entries that reach one server (two names or addresses of one host, a
/// proxy in front of another entry): each would get a vote, and that server's crash or
/// empty restart would cost two. Servers are told apart by the `run_id` of `INFO server`;
/// only the nodes that answered at connect are checked, and those that do not answer
/// `INFO` within `timeout` (or refuse it) are not.
async fn refuse_duplicates(answered: &[(Node, RedisConnection)], timeout: Duration) -> Result<(), LockError> {
    let ids = answered.iter().map(|(node, conn)| {
        let mut conn = conn.clone();
        async move {
            let get = redis::cmd("INFO").arg("server").clone();
            match tokio::time::timeout(timeout, get.query_async::<String>(&mut conn)).await {
                Ok(Ok(info)) => run_id(&info).map(|id| (node, id.to_string())),
                _ => None,
            }
        }
    });
    let mut seen: Vec<(&Node, String)> = Vec::new();
    for (node, id) in futures::future::join_all(ids).await.into_iter().flatten() {
        if let Some((first, _)) = seen.iter().find(|(_, other)| *other == id) {
            return Err(LockError::InvalidInput(format!(
                "RedLock nodes {first} and {node} are one Redis server (run_id {id}): each master must be listed once"
            )));
        }
        seen.push((node, id));
    }
    Ok(())
}

/// The `run_id` line of an `INFO server` reply.
fn run_id(info: &str) -> Option<&str> {
    info.lines().find_map(|line| line.trim().strip_prefix("run_id:"))
}

/// Sends `call` to every node at once and collects the answers, until `enough` says the
/// outcome is known or `timeout` passes (unanswered calls then count as timed out).
///
/// Calls still out when the outcome is known, or when the time ran out, are not
/// abandoned: the client library drops a queued command whose caller has gone, and a
/// renewal or release must reach every node it can. A task of their own waits for them,
/// up to the same deadline (or one more `timeout` after it ran out).
pub(crate) async fn fan_out<T, F, Fut>(
    nodes: &[NodeLink],
    timeout: Duration,
    call: F,
    enough: impl FnMut(&[Answer<T>]) -> bool,
) -> Vec<Answer<T>>
where
    T: Send + 'static,
    F: Fn(RedisConnection) -> Fut,
    Fut: Future<Output = RedisResult<T>> + Send + 'static,
{
    let (answers, late) = fan_out_keeping_late(nodes, timeout, call, enough).await;
    if !late.is_empty() {
        tokio::spawn(late.drain());
    }
    answers
}

/// The calls of a fan-out still out when it decided, and until when they may be waited for.
pub(crate) struct Late<T> {
    calls: FuturesUnordered<BoxFuture<'static, (usize, RedisResult<T>)>>,
    until: tokio::time::Instant,
    /// Whether the fan-out ran out of time (the calls had their node timeout already).
    timed_out: bool,
}

impl<T: Send + 'static> Late<T> {
    /// Whether no call is still out.
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The answers that come in time, by node, each as it comes, if the fan-out decided
    /// before its deadline; the calls left at the end are dropped. Calls that had their
    /// node timeout already are not waited for again: they go on in a task of their own.
    pub(crate) async fn answers_if_early(self, each: impl FnMut(usize, RedisResult<T>)) {
        if self.timed_out {
            if !self.is_empty() {
                tokio::spawn(self.drain());
            }
            return;
        }
        self.answers(each).await;
    }

    async fn answers(mut self, mut each: impl FnMut(usize, RedisResult<T>)) {
        let _ = tokio::time::timeout_at(self.until, async {
            while let Some((index, reply)) = self.calls.next().await {
                each(index, reply);
            }
        })
        .await;
    }

    /// Waits for the calls, in time, and drops their answers.
    async fn drain(self) {
        self.answers(|_, _| {}).await;
    }
}

/// As [`fan_out`], but hands back the calls still out instead of waiting for them in a
/// task of its own: a caller that must act on their answers (a grant round giving back
/// what a late node granted) waits for them itself.
pub(crate) async fn fan_out_keeping_late<T, F, Fut>(
    nodes: &[NodeLink],
    timeout: Duration,
    call: F,
    mut enough: impl FnMut(&[Answer<T>]) -> bool,
) -> (Vec<Answer<T>>, Late<T>)
where
    T: Send + 'static,
    F: Fn(RedisConnection) -> Fut,
    Fut: Future<Output = RedisResult<T>> + Send + 'static,
{
    let mut answers: Vec<Answer<T>> = nodes.iter().map(|_| Answer::Pending).collect();
    let mut calls: FuturesUnordered<BoxFuture<'static, (usize, RedisResult<T>)>> = nodes
        .iter()
        .enumerate()
        .map(|(index, link)| {
            let reply = call(link.conn.clone());
            async move { (index, reply.await) }.boxed()
        })
        .collect();
    let deadline = tokio::time::Instant::now() + timeout;
    let sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(sleep);
    let record = |answers: &mut [Answer<T>], (index, reply): (usize, RedisResult<T>)| {
        answers[index] = match reply {
            Ok(reply) => Answer::Replied(reply),
            Err(err) => Answer::Failed(err),
        };
    };
    loop {
        tokio::select! {
            // Answers first: on a busy machine the deadline and answers become ready in
            // the same tick, and an answer that arrived is not a node that timed out.
            biased;
            next = calls.next() => {
                let Some(next) = next else { break };
                record(&mut answers, next);
                if enough(&answers) {
                    return (answers, Late { calls, until: deadline, timed_out: false });
                }
            }
            _ = &mut sleep => {
                // Let the connections hand over replies they have already read.
                tokio::task::yield_now().await;
                while let Some(Some(next)) = calls.next().now_or_never() {
                    record(&mut answers, next);
                }
                for answer in answers.iter_mut().filter(|a| matches!(a, Answer::Pending)) {
                    *answer = Answer::TimedOut;
                }
                // Calls still out go on for one more period: a release or a give-back to
                // a slow node must still reach it (a dropped call that was not yet
                // written is never sent).
                return (answers, Late { calls, until: tokio::time::Instant::now() + timeout, timed_out: true });
            }
        }
    }
    (answers, Late { calls, until: deadline, timed_out: false })
}
