//! Following the master a Sentinel group names.
//!
//! A client's connections through Sentinel share one [`SentinelMaster`]: the master's
//! address now, the configuration epoch under which the Sentinels named it, and a
//! generation that counts the switches. Its command connections and its pub/sub
//! connection move to a new master when the generation changes.
//!
//! The master is looked up by asking every Sentinel of the URL at once, each within a
//! share of the connect timeout, and following the answer of the newest configuration
//! (see [`lookup`]): a Sentinel that never answers costs that share, not the lookup, and
//! one that still names the old master (cut off during the failover, or restarted with
//! an old configuration) is outweighed by one that names the new master under a higher
//! epoch. The client never moves to a master of a lower epoch than the one it follows.
//! A lookup that no Sentinel answers is tried again, with backoff, until one does.
//! Three things look for a switch:
//!
//! - a subscription on each configured Sentinel (reconnecting with backoff) to the events
//!   that name a new master for our master name: `+promoted-slave`, which the Sentinel
//!   leading a failover publishes once the replica it chose serves as master, and
//!   `+switch-master`, which every Sentinel publishes when it takes the new master on.
//!   Neither carries the configuration epoch, so the client asks the Sentinel that
//!   published it for the master at once (one round trip to a Sentinel that just spoke)
//!   and follows its answer by the epoch rule: an announcement late or out of order moves
//!   nothing back. Each (re)subscription also looks the master up once, since an event may
//!   have been published while nobody listened;
//! - `ROLE` on the main command connection every [`ROLE_CHECK_EVERY`]: a server that says
//!   it is no longer a master, or does not answer, has the master looked up again;
//! - a command that fails in a way that [suggests a failover](suggests_failover), or a
//!   write the replicas did not acknowledge ([`SentinelConnection::look_up_again`]).
//!
//! The events matter most: when a Sentinel promotes a replica while the old master keeps
//! running, nothing fails on the client's connections, and the old master answers `ROLE`
//! with `master` and takes writes until the Sentinels demote it, seconds later. A client
//! that waited for an error would grant there meanwhile, beside clients on the new
//! master. `+promoted-slave` comes first: the Sentinels name the new master from then on
//! (to anyone who asks), while `+switch-master` waits until the other replicas follow it,
//! which can take until the failover timeout.
//!
//! The background tasks hold the shared state weakly and end as soon as the last handle
//! to it is dropped.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, PubSubSink, PubSubStream};
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisConnectionInfo, RedisFuture, RedisResult, Role, Value};
use tokio::sync::{watch, Notify};

use dlock_core::backend::lock_unpoisoned;
use dlock_core::ConnectConfig;

use crate::access::AccessConfig;
use crate::config::{Node, RedisConfig, Topology};
use crate::connection::{client, manager_config, node_addr, node_info};
use crate::error::{is_refused, suggests_failover};

mod lookup;

use lookup::{choose, Answer, Sentinels};

/// How often the main command connection asks its server for its `ROLE`. One small
/// command a second on a multiplexed connection costs nothing measurable; the Sentinels'
/// announcement is the fast path, this is the net under it.
const ROLE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The share of the connect timeout a lookup waits for each Sentinel's answer (a third):
/// a connect keeps the rest for connecting to the master it names.
const LOOKUP_SHARE: u32 = 3;

/// How often an idle subscription to a Sentinel is checked with a `PING` (a Sentinel cut
/// off without a reset would otherwise leave the subscription silent for good).
const SENTINEL_HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Delay between attempts to subscribe to a Sentinel (or to look the master up when no
/// Sentinel answered), doubling up to the maximum.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(5);

/// The delay before the next attempt after `failures` failed ones (subscribing to a
/// Sentinel, or a lookup no Sentinel answered).
fn backoff(failures: u32) -> Duration {
    RESUBSCRIBE_MIN.saturating_mul(1 << failures.min(6)).min(RESUBSCRIBE_MAX)
}

/// The Sentinels' event of a new master taken on: `<master name> <old ip> <old port>
/// <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// The leading Sentinel's event of the replica it promoted serving as master:
/// `slave <ip>:<port> <ip> <port> @ <master name> <old ip> <old port>`.
const PROMOTED: &str = "+promoted-slave";

/// The master a Sentinel group names now, shared by a client's connections (cheap to
/// clone; clones share it). The client follows it to a new master as the
/// [module docs](self) describe.
#[derive(Clone)]
pub struct SentinelMaster {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelMaster").field("master", &self.shared.master.borrow().address).finish_non_exhaustive()
    }
}

struct Shared {
    /// The Sentinels of the URL, for looking the master up.
    sentinels: Sentinels,
    /// The master now. Dropping the sender (with this) ends the background tasks.
    master: watch::Sender<Master>,
    /// Asks the lookup task to look the master up again; requests made while it looks
    /// are folded into one more lookup after it.
    lookups: Arc<Notify>,
    /// The main command connection, the one `ROLE` is checked on.
    main: Arc<Mutex<Link>>,
    /// How connections to a master are made.
    settings: Settings,
}

/// What connecting to a master (or a Sentinel) takes, kept for the masters to come.
struct Settings {
    config: RedisConfig,
    ca: Option<Vec<u8>>,
    manager: ConnectionManagerConfig,
}

/// One master the client followed.
#[derive(Clone)]
struct Master {
    /// How many times the client moved to another master.
    generation: u64,
    /// `host:port`, as the Sentinels name it.
    address: String,
    /// The configuration epoch under which the Sentinels named it (the highest the client
    /// saw naming it): the client moves only to a master of a higher one.
    epoch: u64,
    client: Client,
}

/// A command connection and the generation of the master it goes to.
struct Link {
    generation: u64,
    manager: ConnectionManager,
}

impl SentinelMaster {
    /// Asks the Sentinels of `config` (a Sentinel topology) for the master, connects to
    /// it, and starts following it. Unbounded: the caller bounds it by the connect timeout.
    pub(crate) async fn connect(config: &RedisConfig, ca: Option<&[u8]>) -> RedisResult<Self> {
        let Topology::Sentinel { sentinels, master } = config.topology() else {
            return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "not a Sentinel topology")));
        };
        let clients = sentinel_clients(config, sentinels, ca)?;
        let lookup = Sentinels::new(master, sentinels.iter().map(Node::to_string).zip(clients.iter().cloned()));
        let answers = lookup.ask_all(lookup_bound(config)).await?;
        let Some(answer) = choose(&answers, |_| false) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "no Sentinel answered",
            )));
        };
        let client = client(node_info(&answer.master, config), ca)?;
        let settings = Settings { config: config.clone(), ca: ca.map(<[u8]>::to_vec), manager: manager_config(config) };
        let manager = ConnectionManager::new_with_config(client.clone(), settings.manager.clone()).await?;
        let address = address_of(&client);
        let (master_tx, master_rx) = watch::channel(Master { generation: 0, address, epoch: answer.epoch, client });
        let lookups = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            sentinels: lookup,
            master: master_tx,
            lookups: lookups.clone(),
            main: Arc::new(Mutex::new(Link { generation: 0, manager })),
            settings,
        });
        let weak = Arc::downgrade(&shared);
        spawn_until_closed(master_rx.clone(), look_up_on_request(weak.clone(), lookups.clone()));
        spawn_until_closed(master_rx.clone(), check_role(weak.clone(), lookups.clone(), config.op_timeout()));
        for (index, (node, sentinel)) in sentinels.iter().zip(clients).enumerate() {
            let listener = Listener {
                shared: weak.clone(),
                lookups: lookups.clone(),
                sentinel,
                index,
                at: node.to_string(),
                master: master.clone(),
                connect_timeout: config.connect_timeout(),
                op_timeout: config.op_timeout(),
            };
            spawn_until_closed(master_rx.clone(), listener.run());
        }
        Ok(SentinelMaster { shared })
    }

    /// The main command connection.
    pub(crate) fn connection(&self) -> SentinelConnection {
        SentinelConnection { master: self.clone(), link: self.shared.main.clone() }
    }

    /// Another command connection to the master, of its own (for commands that block
    /// their connection), connected now. Unbounded: the caller bounds it.
    pub(crate) async fn another_connection(&self) -> RedisResult<SentinelConnection> {
        let Master { generation, client, .. } = self.shared.master.borrow().clone();
        let manager = ConnectionManager::new_with_config(client, self.shared.settings.manager.clone()).await?;
        // Should the master have changed meanwhile, the first command moves it on.
        Ok(SentinelConnection { master: self.clone(), link: Arc::new(Mutex::new(Link { generation, manager })) })
    }

    /// A client for the master now (for a pub/sub connection). `attempt` counts the
    /// failures to connect so far: after one, the master is looked up again too.
    pub(crate) fn client(&self, attempt: usize) -> Client {
        if attempt > 0 {
            self.look_up_again();
        }
        self.shared.master.borrow().client.clone()
    }

    /// Changes of the master, for a connection that must follow it.
    pub(crate) fn changes(&self) -> MasterChanges {
        MasterChanges(Some(self.shared.master.subscribe()))
    }

    /// Has the master looked up again through the Sentinels, in the background; requests
    /// made while a lookup runs lead to one more after it.
    pub(crate) fn look_up_again(&self) {
        self.shared.lookups.notify_one();
    }
}

impl Shared {
    /// Asks every Sentinel for the master and follows the answer of the newest
    /// configuration, within a share of the connect timeout. False when no Sentinel
    /// answered.
    async fn look_up(&self) -> bool {
        match self.sentinels.ask_all(lookup_bound(&self.settings.config)).await {
            Ok(answers) => {
                let current = self.master.borrow().address.clone();
                if let Some(answer) =
                    choose(&answers, |node| node_addr(node, self.settings.config.tls()).to_string() == current)
                {
                    self.follow(answer, "looked up through Sentinel");
                }
                true
            }
            Err(err) => {
                tracing::debug!(%err, "looking up the Redis master through Sentinel failed; trying again");
                false
            }
        }
    }

    /// Asks the Sentinel at `index`, which announced `node` as the new master, for the
    /// master's configuration epoch with its address, and follows its answer. The
    /// announcements carry no epoch, and one may come late (a Sentinel that catches up
    /// announces each switch it learns of): the answer says whether it is newer than the
    /// master followed. When the Sentinel does not answer, all of them are asked.
    async fn follow_announcement(&self, index: usize, node: &Node, sentinel: &str) {
        match self.sentinels.ask(index, lookup_bound(&self.settings.config)).await {
            Ok(Some(answer)) => {
                if answer.master != *node {
                    tracing::debug!(%sentinel, announced = %node, named = %answer.master, "the Sentinel names another Redis master than it announced");
                }
                self.follow(&answer, "announced by a Sentinel");
            }
            Ok(None) => self.lookups.notify_one(),
            Err(err) => {
                tracing::debug!(%err, %sentinel, "the Sentinel that announced a Redis master does not answer; asking all");
                self.lookups.notify_one();
            }
        }
    }

    /// Moves to the master `answer` names if the Sentinels named it under a higher
    /// configuration epoch than the master followed now; an answer naming the master
    /// followed only raises the epoch known for it.
    fn follow(&self, answer: &Answer, why: &'static str) {
        let client = match client(node_info(&answer.master, &self.settings.config), self.settings.ca.as_deref()) {
            Ok(client) => client,
            Err(err) => {
                return tracing::debug!(%err, master = %answer.master, "cannot connect to the named Redis master");
            }
        };
        let address = address_of(&client);
        self.master.send_if_modified(|master| {
            if master.address == address {
                master.epoch = master.epoch.max(answer.epoch);
                return false;
            }
            if answer.epoch <= master.epoch {
                tracing::debug!(
                    followed = %master.address, epoch = master.epoch, named = %address, named_epoch = answer.epoch, why,
                    "a Sentinel names a Redis master of a configuration no newer than the one followed; staying"
                );
                return false;
            }
            tracing::debug!(from = %master.address, to = %address, epoch = answer.epoch, why, "following the Redis master to another server");
            *master = Master { generation: master.generation + 1, address, epoch: answer.epoch, client };
            true
        });
    }
}

/// How long a lookup waits for each Sentinel's answer.
fn lookup_bound(config: &RedisConfig) -> Duration {
    config.connect_timeout() / LOOKUP_SHARE
}

/// Changes of the master a [`SentinelMaster`] follows, or none, for a connection to one
/// server or a Cluster.
#[derive(Debug)]
pub(crate) struct MasterChanges(Option<watch::Receiver<Master>>);

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("generation", &self.generation)
            .field("address", &self.address)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl MasterChanges {
    /// Changes of nothing: never completes.
    pub(crate) fn none() -> Self {
        MasterChanges(None)
    }

    /// Marks the master now as seen: [`changed`](Self::changed) waits for the next one.
    pub(crate) fn seen(&mut self) {
        if let Some(changes) = &mut self.0 {
            changes.borrow_and_update();
        }
    }

    /// Completes when the master changed since it was last seen; never, when it cannot
    /// change (or its client is gone).
    pub(crate) async fn changed(&mut self) {
        let moved = match &mut self.0 {
            Some(changes) => changes.changed().await.is_ok(),
            None => false,
        };
        if !moved {
            std::future::pending::<()>().await;
        }
    }
}

/// A command connection to the master a [`SentinelMaster`] names: it moves to a new
/// master with its next command, and has the master looked up again when a command fails
/// in a way that suggests a failover.
#[derive(Clone)]
pub struct SentinelConnection {
    master: SentinelMaster,
    link: Arc<Mutex<Link>>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection").finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// The connection to the master now, opened (lazily) if the master changed since the
    /// last command.
    pub(crate) fn current(&self) -> ConnectionManager {
        let master = self.master.shared.master.borrow();
        let mut link = lock_unpoisoned(&self.link);
        if link.generation != master.generation {
            let settings = self.master.shared.settings.manager.clone();
            match ConnectionManager::new_lazy_with_config(master.client.clone(), settings) {
                Ok(manager) => *link = Link { generation: master.generation, manager },
                // Stays with the old one: the next command tries again.
                Err(err) => {
                    tracing::debug!(%err, to = %master.address, "cannot open a connection to the new Redis master")
                }
            }
        }
        link.manager.clone()
    }

    /// Has the master looked up again (a write was not acknowledged as it should have been).
    pub(crate) fn look_up_again(&self) {
        self.master.look_up_again();
    }

    fn after<T>(&self, result: &RedisResult<T>) {
        if let Err(err) = result {
            if suggests_failover(err) {
                self.look_up_again();
            }
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.current().send_packed_command(cmd).await;
            self.after(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self.current().send_packed_commands(pipeline, offset, count).await;
            self.after(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}

/// A client per Sentinel, for lookups and announcements: the Sentinels' credentials and
/// TLS, no database.
fn sentinel_clients(config: &RedisConfig, sentinels: &[Node], ca: Option<&[u8]>) -> RedisResult<Vec<Client>> {
    let mut settings = RedisConnectionInfo::default();
    if let Some(user) = config.sentinel_user() {
        settings = settings.set_username(user);
    }
    if let Some(password) = config.sentinel_password() {
        settings = settings.set_password(password);
    }
    sentinels
        .iter()
        .map(|node| {
            let info = node_addr(node, config.tls()).into_connection_info()?.set_redis_settings(settings.clone());
            client(info, ca)
        })
        .collect()
}

/// How the Sentinels name a master's server, and so how two are told apart.
fn address_of(client: &Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// Runs `task` until it ends or the [`SentinelMaster`] whose master `closed` watches is
/// dropped, whichever comes first.
fn spawn_until_closed(mut closed: watch::Receiver<Master>, task: impl Future<Output = ()> + Send + 'static) {
    tokio::spawn(async move {
        let dropped = async move { while closed.changed().await.is_ok() {} };
        tokio::select! {
            () = dropped => {}
            () = task => {}
        }
    });
}

/// Looks the master up each time it is asked to. A lookup that no Sentinel answered is
/// tried again, with backoff, until one does: what asked for it (an announcement that may
/// have been missed, a master that stopped answering) still stands.
async fn look_up_on_request(shared: Weak<Shared>, lookups: Arc<Notify>) {
    let mut failures = 0u32;
    loop {
        match failures {
            0 => lookups.notified().await,
            _ => {
                tokio::select! {
                    () = lookups.notified() => {}
                    () = tokio::time::sleep(backoff(failures - 1)) => {}
                }
            }
        }
        // Held for one lookup, which a share of the connect timeout bounds.
        let Some(shared) = shared.upgrade() else { return };
        failures = match shared.look_up().await {
            true => 0,
            false => failures.saturating_add(1),
        };
    }
}

/// Asks the main command connection's server for its `ROLE` now and then, and has the
/// master looked up again when it is not a master any more or does not answer.
async fn check_role(shared: Weak<Shared>, lookups: Arc<Notify>, op_timeout: Duration) {
    let mut every = tokio::time::interval(ROLE_CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.reset();
    loop {
        every.tick().await;
        let Some(mut conn) = shared.upgrade().map(|shared| SentinelMaster { shared }.connection().current()) else {
            return;
        };
        let role = redis::cmd("ROLE");
        match tokio::time::timeout(op_timeout, role.query_async::<Role>(&mut conn)).await {
            Ok(Ok(Role::Primary { .. })) => {}
            Ok(Ok(_)) => {
                tracing::debug!("the Redis master's server is no longer a master; looking the master up again");
                lookups.notify_one();
            }
            Ok(Err(err)) if is_refused(&err) => {
                tracing::debug!(%err, "ROLE is refused; only Sentinel announcements and errors tell of a failover");
                return;
            }
            Ok(Err(err)) => {
                if suggests_failover(&err) {
                    lookups.notify_one();
                }
            }
            Err(_) => {
                tracing::debug!("the Redis master does not answer ROLE; looking the master up again");
                lookups.notify_one();
            }
        }
    }
}

/// Listens to one Sentinel's announcements of a new master.
struct Listener {
    shared: Weak<Shared>,
    lookups: Arc<Notify>,
    sentinel: Client,
    /// The Sentinel's place in the URL's list.
    index: usize,
    /// The Sentinel's address, for the logs.
    at: String,
    /// The monitored name of our master.
    master: String,
    connect_timeout: Duration,
    op_timeout: Duration,
}

impl Listener {
    async fn run(self) {
        let mut failures = 0u32;
        loop {
            match tokio::time::timeout(self.connect_timeout, self.subscribe()).await {
                Ok(Ok((sink, stream))) => {
                    failures = 0;
                    // An announcement may have gone by while nobody listened.
                    self.lookups.notify_one();
                    self.follow(sink, stream).await;
                    tracing::debug!(sentinel = %self.at, "the subscription to the Sentinel broke; subscribing again");
                }
                Ok(Err(err)) => tracing::debug!(sentinel = %self.at, %err, "cannot subscribe to the Sentinel"),
                Err(_) => tracing::debug!(sentinel = %self.at, "subscribing to the Sentinel timed out"),
            }
            if self.shared.strong_count() == 0 {
                return;
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            tokio::time::sleep(delay).await;
        }
    }

    async fn subscribe(&self) -> RedisResult<(PubSubSink, PubSubStream)> {
        let (mut sink, stream) = self.sentinel.get_async_pubsub().await?.split();
        sink.subscribe(&[SWITCH_MASTER, PROMOTED]).await?;
        Ok((sink, stream))
    }

    /// Moves the client on each announcement for its master, until the subscription breaks.
    async fn follow(&self, mut sink: PubSubSink, mut stream: PubSubStream) {
        let mut health = tokio::time::interval(SENTINEL_HEALTH_CHECK_EVERY);
        health.reset();
        loop {
            tokio::select! {
                message = stream.next() => {
                    let Some(message) = message else { return };
                    let Ok(payload) = message.get_payload::<String>() else { continue };
                    let Some(node) = announced(message.get_channel_name(), &payload, &self.master) else { continue };
                    let Some(shared) = self.shared.upgrade() else { return };
                    shared.follow_announcement(self.index, &node, &self.at).await;
                }
                _ = health.tick() => {
                    if !matches!(tokio::time::timeout(self.op_timeout, sink.ping::<Value>()).await, Ok(Ok(_))) {
                        return;
                    }
                }
            }
        }
    }
}

/// The new master an event on `channel` names, if it is about `master`.
fn announced(channel: &str, payload: &str, master: &str) -> Option<Node> {
    match channel {
        SWITCH_MASTER => switched_to(payload, master),
        PROMOTED => promoted(payload, master),
        _ => None,
    }
}

/// The new master of a [`SWITCH_MASTER`] event, if it is about `master`. Read from the
/// end, so that a name with spaces is whole.
fn switched_to(payload: &str, master: &str) -> Option<Node> {
    let mut words = payload.rsplitn(5, ' ');
    let port = words.next()?.parse().ok()?;
    let host = words.next()?;
    let (_old_port, _old_host) = (words.next()?, words.next()?);
    (words.next()? == master && !host.is_empty()).then(|| Node::new(host, port))
}

/// The promoted replica of a [`PROMOTED`] event, if it is about `master`. The instance
/// (before the ` @ `) is `slave <name> <ip> <port>`, with no spaces in its words.
fn promoted(payload: &str, master: &str) -> Option<Node> {
    let (instance, of) = payload.split_once(" @ ")?;
    let mut of = of.rsplitn(3, ' ');
    let (_old_port, _old_host) = (of.next()?, of.next()?);
    if of.next()? != master {
        return None;
    }
    match instance.split(' ').collect::<Vec<_>>()[..] {
        ["slave", _name, host, port] if !host.is_empty() => Some(Node::new(host, port.parse().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotions_are_read_for_our_master_only() {
        let event = "slave 10.0.0.6:6380 10.0.0.6 6380 @ orders 10.0.0.5 6379";
        let to = announced(PROMOTED, event, "orders").unwrap();
        assert_eq!((to.host.as_str(), to.port), ("10.0.0.6", 6380));
        assert!(announced(PROMOTED, event, "billing").is_none());
        assert!(announced(SWITCH_MASTER, event, "orders").is_none());
        let spaced = "slave [::1]:6380 ::1 6380 @ my orders 10.0.0.5 6379";
        assert!(promoted(spaced, "my orders").is_some_and(|to| to.host == "::1" && to.port == 6380));
        for garbled in [
            "",
            "slave 10.0.0.6:6380 10.0.0.6 6380",
            "master orders 10.0.0.6 6380 @ orders 10.0.0.5 6379",
            "slave 10.0.0.6:6380 10.0.0.6 port @ orders 10.0.0.5 6379",
            "slave 10.0.0.6 6380 @ orders 10.0.0.5 6379",
        ] {
            assert!(promoted(garbled, "orders").is_none(), "{garbled:?}");
        }
    }

    #[test]
    fn switch_announcements_are_read_for_our_master_only() {
        let to = switched_to("orders 10.0.0.5 6379 10.0.0.6 6380", "orders").unwrap();
        assert_eq!((to.host.as_str(), to.port), ("10.0.0.6", 6380));
        assert!(switched_to("orders 10.0.0.5 6379 10.0.0.6 6380", "billing").is_none());
        assert!(switched_to("my orders 10.0.0.5 6379 ::1 6380", "my orders").is_some_and(|to| to.host == "::1"));
        for garbled in ["", "orders", "orders 10.0.0.5 6379 10.0.0.6", "orders 10.0.0.5 6379 10.0.0.6 port"] {
            assert!(switched_to(garbled, "orders").is_none(), "{garbled:?}");
        }
    }
}
