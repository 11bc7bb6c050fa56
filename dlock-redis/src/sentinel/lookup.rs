//! Asking the Sentinels for the master, and choosing among their answers.
//!
//! Every Sentinel of the URL is asked at once, each within a bound, so that one that
//! accepts connections and never answers (a frozen host) costs the bound, not the
//! lookup, and the others' answers are not kept waiting behind it. Each is asked two
//! things in one round trip:
//!
//! - `SENTINEL GET-MASTER-ADDR-BY-NAME`: the master to use. While a failover the
//!   Sentinel leads is under way, it names the promoted replica from the moment that
//!   serves as master, when the Sentinel's record still names the old one;
//! - `SENTINEL MASTER`: the Sentinel's record of the master, for its configuration epoch
//!   (raised by every failover, and set to the failover's epoch when the promoted
//!   replica serves) and its flags (whether the Sentinel sees the master down).
//!
//! A Sentinel cut off from the others during a failover, or restarted with an old
//! configuration, names the old master under the old epoch until it hears of the new
//! one, and may be the first (or most of those) to answer. So the answer of the highest
//! epoch wins ([`choose`]), and the client never moves to a master of a lower (or the
//! same) epoch than the one it follows (see `Shared::follow`).
//!
//! The `redis` crate's `SentinelClient` is not used for this: it takes the Sentinels'
//! answers in the URL's order, so a frozen Sentinel listed first holds up the answers of
//! the others for its own connection timeout (a second) on every lookup, and it reads no
//! epoch, so the first Sentinel that names a server answering as a master wins.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult};

use dlock_core::backend::lock_unpoisoned;

use crate::config::Node;
use crate::error::is_refused;

/// The Sentinels of the URL, asked together.
pub(super) struct Sentinels {
    /// The monitored name of the master.
    master: String,
    nodes: Vec<Sentinel>,
}

/// One Sentinel: a client with the Sentinels' credentials, and the connection kept for
/// the next lookup (dropped when it fails or does not answer in time).
struct Sentinel {
    /// Its address, for the logs.
    at: String,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
}

/// What one Sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    /// The master to use.
    pub(super) master: Node,
    /// The configuration epoch of the Sentinel's record of the master.
    pub(super) epoch: u64,
    /// Whether the Sentinel flags that master down (`s_down` or `o_down`).
    pub(super) down: bool,
}

impl Sentinels {
    /// The Sentinels at `nodes` (address, client), which monitor `master`.
    pub(super) fn new(master: &str, nodes: impl IntoIterator<Item = (String, Client)>) -> Self {
        let nodes = nodes.into_iter().map(|(at, client)| Sentinel { at, client, conn: Mutex::new(None) }).collect();
        Sentinels { master: master.to_string(), nodes }
    }

    /// Asks every Sentinel at once, each within `bound`, and returns the answers that
    /// came, in the URL's order. Fails only when none came, with the most telling error
    /// (a refusal of the credentials, then a master nobody knows, then the rest).
    pub(super) async fn ask_all(&self, bound: Duration) -> RedisResult<Vec<Answer>> {
        let asked = futures::future::join_all(self.nodes.iter().map(|node| node.ask(&self.master, bound))).await;
        let mut answers = Vec::new();
        let mut failure: Option<RedisError> = None;
        for (node, result) in self.nodes.iter().zip(asked) {
            let err = match result {
                Ok(Some(answer)) => {
                    answers.push(answer);
                    continue;
                }
                Ok(None) => {
                    tracing::debug!(sentinel = %node.at, master = %self.master, "a Sentinel does not monitor the Redis master");
                    RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "the Sentinels do not monitor the master",
                        self.master.clone(),
                    ))
                }
                Err(err) => {
                    tracing::debug!(sentinel = %node.at, %err, "a Sentinel did not answer for the Redis master");
                    err
                }
            };
            if failure.as_ref().is_none_or(|kept| telling(&err) < telling(kept)) {
                failure = Some(err);
            }
        }
        match failure {
            Some(err) if answers.is_empty() => Err(err),
            _ => Ok(answers),
        }
    }

    /// Asks the Sentinel at `index` (of the URL's list) alone, within `bound`.
    pub(super) async fn ask(&self, index: usize, bound: Duration) -> RedisResult<Option<Answer>> {
        match self.nodes.get(index) {
            Some(node) => node.ask(&self.master, bound).await,
            None => Ok(None),
        }
    }
}

/// How much an error says about why no Sentinel answered: lower says more.
fn telling(err: &RedisError) -> u8 {
    if is_refused(err) {
        0
    } else if err.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        1
    } else if is_broken(err) || err.is_timeout() {
        3
    } else {
        2
    }
}

impl Sentinel {
    /// Its answer for `master`, `None` when it does not know the name.
    async fn ask(&self, master: &str, bound: Duration) -> RedisResult<Option<Answer>> {
        let asked = tokio::time::timeout(bound, async {
            let kept = lock_unpoisoned(&self.conn).clone();
            if let Some(conn) = kept {
                match query(conn, master).await {
                    // The connection kept since the last lookup may have broken meanwhile
                    // (the Sentinel restarted, a network cut): one more try on a new one.
                    Err(err) if is_broken(&err) => {
                        tracing::debug!(sentinel = %self.at, %err, "the connection to the Sentinel broke; connecting again");
                    }
                    asked => return asked,
                }
            }
            // Bounded by the timeout around, for the connection and the answer together.
            let settings = AsyncConnectionConfig::new().set_connection_timeout(Some(bound)).set_response_timeout(None);
            let conn = self.client.get_multiplexed_async_connection_with_config(&settings).await?;
            *lock_unpoisoned(&self.conn) = Some(conn.clone());
            query(conn, master).await
        })
        .await
        .unwrap_or_else(|_| {
            let why = format!("no answer from the Sentinel at {} within {bound:?}", self.at);
            Err(RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, why)))
        });
        if asked.is_err() {
            // It may be broken, or stuck behind the request that timed out.
            *lock_unpoisoned(&self.conn) = None;
        }
        asked
    }
}

/// Asks a Sentinel on `conn` where `master` is and what its record of it says.
async fn query(conn: MultiplexedConnection, master: &str) -> RedisResult<Option<Answer>> {
    let address = redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(master).to_owned();
    let record = redis::cmd("SENTINEL").arg("MASTER").arg(master).to_owned();
    // Both at once, on one multiplexed connection: one round trip.
    let (mut first, mut second) = (conn.clone(), conn);
    let (address, record) = futures::join!(
        address.query_async::<Option<(String, u16)>>(&mut first),
        record.query_async::<HashMap<String, String>>(&mut second),
    );
    match address? {
        // An unknown name fails the second with an error: the first tells.
        None => Ok(None),
        Some((host, port)) => Ok(Some(answer(host, port, &record?))),
    }
}

/// Whether `err` says that the connection is gone rather than what the Sentinel answered.
fn is_broken(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() || err.is_unrecoverable_error()
}

/// The answer of a Sentinel that names `host:port` as the master and whose record of the
/// master is `record` (`SENTINEL MASTER`).
fn answer(host: String, port: u16, record: &HashMap<String, String>) -> Answer {
    // A record without an epoch (a Sentinel before Redis 2.8) ranks below every failover.
    let epoch = record.get("config-epoch").and_then(|epoch| epoch.parse().ok()).unwrap_or(0);
    let flagged = record.get("flags").is_some_and(|flags| flags.split(',').any(|f| f == "s_down" || f == "o_down"));
    // The flags are those of the record, which names the old master while a failover the
    // Sentinel leads has promoted another: then they say nothing of the one named.
    let recorded = record.get("ip") == Some(&host) && record.get("port").and_then(|p| p.parse().ok()) == Some(port);
    Answer { master: Node::new(host, port), epoch, down: flagged && recorded }
}

/// The answer to follow among `answers`: of those whose Sentinel sees its master up (all,
/// if none does), the one of the highest configuration epoch; among several, the one
/// naming the master the client follows now (`is_current`), else the first in the URL's
/// order. `None` when there is no answer.
pub(super) fn choose(answers: &[Answer], is_current: impl Fn(&Node) -> bool) -> Option<&Answer> {
    let any_up = answers.iter().any(|answer| !answer.down);
    let candidates = || answers.iter().filter(move |answer| !(any_up && answer.down));
    let newest = candidates().map(|answer| answer.epoch).max()?;
    let mut newest_answers = candidates().filter(|answer| answer.epoch == newest);
    let first = newest_answers.clone().next();
    newest_answers.find(|answer| is_current(&answer.master)).or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(host: &str, epoch: u64, down: bool) -> Answer {
        Answer { master: Node::new(host, 6379), epoch, down }
    }

    fn record(fields: &[(&str, &str)]) -> HashMap<String, String> {
        fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_highest_epoch_wins_over_the_first_and_the_most_answers() {
        let answers = [said("old", 0, false), said("old", 0, false), said("new", 1, false)];
        assert_eq!(choose(&answers, |_| false).unwrap().master.host, "new");
        assert!(choose(&[], |_| true).is_none());
    }

    #[test]
    fn a_master_seen_down_is_passed_over_while_another_is_seen_up() {
        let answers = [said("down", 2, true), said("up", 1, false)];
        assert_eq!(choose(&answers, |_| false).unwrap().master.host, "up");
        let all_down = [said("a", 1, true), said("b", 2, true)];
        assert_eq!(choose(&all_down, |_| false).unwrap().master.host, "b");
    }

    #[test]
    fn among_equals_the_current_master_stays_else_the_first() {
        let answers = [said("a", 3, false), said("b", 3, false), said("c", 2, false)];
        assert_eq!(choose(&answers, |node| node.host == "b").unwrap().master.host, "b");
        assert_eq!(choose(&answers, |node| node.host == "c").unwrap().master.host, "a");
    }

    #[test]
    fn answers_carry_the_epoch_and_the_flags_of_the_named_master_only() {
        let plain = record(&[("ip", "10.0.0.5"), ("port", "6379"), ("flags", "master"), ("config-epoch", "7")]);
        assert_eq!(
            answer("10.0.0.5".into(), 6379, &plain),
            Answer { master: Node::new("10.0.0.5", 6379), epoch: 7, down: false }
        );
        let down =
            record(&[("ip", "10.0.0.5"), ("port", "6379"), ("flags", "master,s_down,o_down"), ("config-epoch", "7")]);
        assert!(answer("10.0.0.5".into(), 6379, &down).down);
        // Leading a failover: the record (and its flags) still names the old master.
        let promoting = record(&[
            ("ip", "10.0.0.5"),
            ("port", "6379"),
            ("flags", "master,o_down,failover_in_progress"),
            ("config-epoch", "8"),
        ]);
        let promoted = answer("10.0.0.6".into(), 6380, &promoting);
        assert_eq!((promoted.epoch, promoted.down), (8, false));
        assert_eq!(answer("h".into(), 1, &record(&[("flags", "s_down")])).epoch, 0);
    }
}
