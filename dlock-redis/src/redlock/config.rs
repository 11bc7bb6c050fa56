//! The settings of a RedLock client: the independent masters, how each is reached, the
//! per-node timeout, the clock-drift allowance, the retry delay and how tokens are
//! proposed, read from a `redlock://` URL or set with builder methods.

use std::collections::HashSet;
use std::time::Duration;

use dlock_core::{parse_duration, BackendUrl, ConnectConfig, ConnectOptions, LockError, MAX_DURATION};

use crate::access::{AccessConfig, ServerAccess};
use crate::config::{sorted, Node, RedisConfig, DEFAULT_PORT};
use crate::keys::KeyLayout;

/// The URL schemes of RedLock: `redlock://` and, with TLS to every node, `redlocks://`.
pub const SCHEMES: &[&str] = &["redlock", "redlocks"];

/// The default per-node timeout: far below any sensible ttl, so that a node that does not
/// answer costs an acquire milliseconds, not the lease.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// The default upper bound of the random delay before retrying after a split vote.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// How the client picks the fencing token it proposes to the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenSource {
    /// Propose the larger of the wall clock in microseconds (plus a lead, see
    /// [`RedLockConfig::lead`]) and the highest counter this client has seen for the
    /// lock, plus one; a node whose counter is not below the proposal refuses it and
    /// answers with its counter, and the client proposes the maximum plus one in a
    /// second round. One round trip per acquire in the usual case, a name seen for the
    /// first time included; tokens look like timestamps.
    #[default]
    Clock,
    /// Read every node's counter first and propose the maximum plus one: the plain
    /// two-phase scheme, with tokens that count up by one per grant, for one more round
    /// trip per acquire. A node without a counter (a name new to it, or idle past the
    /// keep time) reports its clock in microseconds plus the lead instead.
    ReadFirst,
}

/// The settings of a RedLock client over N independent Redis masters.
///
/// The timeouts and the key prefix are the [`ConnectOptions`] every backend shares, set
/// and read through [`ConnectConfig`] (re-exported by this crate); TLS, the credentials
/// and the database, which every node shares, are the [`ServerAccess`] of a
/// [`RedisConfig`], set and read through [`AccessConfig`].
///
/// ```
/// use std::time::Duration;
/// use dlock_redis::redlock::{RedLockConfig, TokenSource};
/// use dlock_redis::{AccessConfig, ConnectConfig};
///
/// let config = RedLockConfig::from_url(
///     "redlock://app:s3cret@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/2?node_timeout=50ms&prefix=shop",
/// )?;
/// assert_eq!(config.nodes().len(), 3);
/// assert_eq!(config.quorum(), 2);
/// assert_eq!(config.node_timeout(), Duration::from_millis(50));
/// assert_eq!(config.token_source(), TokenSource::Clock);
/// assert_eq!(config.prefix(), "shop");
///
/// // The same with the builder.
/// use dlock_redis::Node;
/// let built = RedLockConfig::new((1..=3).map(|i| Node::new(format!("10.0.0.{i}"), 6379)))
///     .with_credentials("app", "s3cret")
///     .with_db(2)
///     .with_node_timeout(Duration::from_millis(50))
///     .with_prefix("shop");
/// assert_eq!(built, config);
/// # Ok::<(), dlock_core::LockError>(())
/// ```
// A derived Debug shows no secret: the password is in `ServerAccess`, whose Debug hides it.
#[derive(Debug, Clone, PartialEq)]
pub struct RedLockConfig {
    nodes: Vec<Node>,
    access: ServerAccess,
    common: ConnectOptions,
    node_timeout: Duration,
    drift_factor: f64,
    drift_fixed: Duration,
    retry_delay: Duration,
    token_source: TokenSource,
}

impl RedLockConfig {
    /// RedLock over these masters, with the defaults: the timeouts and prefix of
    /// [`ConnectOptions`], a [`DEFAULT_NODE_TIMEOUT`] per node, a drift allowance of
    /// 1% of the ttl + 2 ms, a [`DEFAULT_RETRY_DELAY`], [`TokenSource::Clock`], and fence
    /// counters kept for [`DEFAULT_KEEP_IDLE`](dlock_core::DEFAULT_KEEP_IDLE) after a name's last use.
    pub fn new(nodes: impl IntoIterator<Item = Node>) -> Self {
        RedLockConfig {
            nodes: nodes.into_iter().collect(),
            access: ServerAccess::default(),
            common: ConnectOptions::default(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            drift_factor: 0.01,
            drift_fixed: Duration::from_millis(2),
            retry_delay: DEFAULT_RETRY_DELAY,
            token_source: TokenSource::Clock,
        }
    }

    /// Parses `redlock://[user[:password]@]host[:port],host[:port],...[/db][?options]`
    /// (`redlocks://` for TLS to every node). Every node shares the credentials, the
    /// database and the TLS settings.
    ///
    /// Query options: `connect_timeout`, `op_timeout`, `prefix` (as every backend);
    /// `node_timeout` (the bound of each call to one node, default 100ms);
    /// `drift_factor` (a fraction of the ttl, default 0.01) and `drift` (a fixed part,
    /// default 2ms; `0` for none) of the clock-drift allowance; `retry_delay` (the upper
    /// bound of the random delay after a split vote, default 50ms); `tokens=clock|read`
    /// (see [`TokenSource`]); `keep_idle` (how long a name's fence counter outlives its
    /// last use on each node, default an hour; see
    /// [`ConnectConfig::with_keep_idle`]); `tls_ca=<path>`. Unknown options are
    /// `InvalidInput`.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let parsed = BackendUrl::parse(url, DEFAULT_PORT)?;
        let bad = |why: &str| parsed.invalid(why);
        let tls = match parsed.scheme.as_str() {
            "redlock" => false,
            "redlocks" => true,
            _ => return Err(bad(&format!("unknown scheme (use one of {})", SCHEMES.join(", ")))),
        };
        let segments: Vec<&str> = parsed.path.split('/').filter(|s| !s.is_empty()).collect();
        let db = match segments.as_slice() {
            [] => None,
            [db] => Some(*db),
            _ => return Err(bad("expected at most /<db> after the addresses")),
        };
        let (access, rest) = ServerAccess::from_url(&parsed, tls, db)?;
        let mut config = Self::new(parsed.hosts.clone());
        config.access = access;
        config.common = parsed.options.clone();
        for (key, value) in rest {
            match key.as_str() {
                "node_timeout" => config.node_timeout = parse_duration(&value)?,
                "drift_factor" => {
                    config.drift_factor =
                        value.parse().map_err(|_| bad("drift_factor must be a number such as 0.01"))?;
                }
                "drift" => {
                    config.drift_fixed = if value.trim() == "0" { Duration::ZERO } else { parse_duration(&value)? }
                }
                "retry_delay" => config.retry_delay = parse_duration(&value)?,
                "tokens" => {
                    config.token_source = match value.as_str() {
                        "clock" => TokenSource::Clock,
                        "read" => TokenSource::ReadFirst,
                        _ => return Err(bad("tokens must be clock or read")),
                    };
                }
                other => return Err(bad(&format!("unknown option {other:?}"))),
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings together; [`connect`](super::connect) calls it too.
    pub fn validate(&self) -> Result<(), LockError> {
        let bad = |why: String| Err(LockError::InvalidInput(why));
        KeyLayout::new(self.prefix())?;
        if self.nodes.is_empty() {
            return bad("RedLock needs at least one node".into());
        }
        if self.nodes.iter().any(|n| n.host.is_empty() || n.port == 0) {
            return bad("a RedLock node has an empty host or port 0".into());
        }
        // The same server twice would vote twice: two clients could then each count a
        // "majority" that shares only that one server. This catches the same text;
        // aliases (two names or addresses of one server) are caught at connect, by run_id.
        let mut seen = HashSet::new();
        if let Some(twice) = self.nodes.iter().find(|n| !seen.insert((n.host.to_ascii_lowercase(), n.port))) {
            return bad(format!("RedLock node {twice} is listed twice"));
        }
        self.access.validate("redlocks")?;
        self.common.validate()?;
        if self.node_timeout.is_zero() {
            return bad("timeouts must be above zero".into());
        }
        // An attempt is a few fan-outs, each bounded by the node timeout, and must end
        // well within one operation.
        if self.node_timeout.saturating_mul(4) > self.op_timeout() {
            return bad(format!(
                "node_timeout {:?} must be at most a quarter of op_timeout {:?}",
                self.node_timeout,
                self.op_timeout()
            ));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return bad(format!("drift_factor {} must be at least 0 and below 0.5", self.drift_factor));
        }
        if self.drift_fixed > MAX_DURATION {
            return bad(format!("drift {:?} is absurd", self.drift_fixed));
        }
        if self.retry_delay.is_zero() || self.retry_delay > MAX_DURATION {
            return bad(format!("retry_delay {:?} must be above zero and sensible", self.retry_delay));
        }
        Ok(())
    }

    /// How long one call to one node may take before the node counts as not answering.
    /// Keep it far below your ttls and at most a quarter of the operation timeout.
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The clock-drift allowance subtracted from every lease's validity: `factor` × ttl plus
    /// `fixed` (default 0.01 × ttl plus 2 ms, as the RedLock description suggests). Widen
    /// it when the nodes' clocks may run at rates further apart.
    pub fn with_drift(mut self, factor: f64, fixed: Duration) -> Self {
        self.drift_factor = factor;
        self.drift_fixed = fixed;
        self
    }

    /// The upper bound of the random delay before trying again after a split vote (no
    /// client won a majority).
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How tokens are proposed (see [`TokenSource`]).
    pub fn with_token_source(mut self, source: TokenSource) -> Self {
        self.token_source = source;
        self
    }

    /// How far ahead of a clock proposals are made: three node timeouts (the longest a
    /// proposal takes to reach a node after the clock it was made from was read: the
    /// rest of one fan-out, a give-back and the next one), at most half the keep time.
    /// A node without a counter reports its clock plus this lead, and a proposal from the
    /// clock adds it too, so that it reaches the node before the node's clock passes it:
    /// a look at a fresh name takes one round, and a second round, made above what a
    /// refusal reported, is not refused again because the node's clock moved on.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock_redis::{redlock::RedLockConfig, ConnectConfig};
    ///
    /// let config = RedLockConfig::from_url("redlock://a,b,c?node_timeout=50ms")?;
    /// assert_eq!(config.lead(), Duration::from_millis(150));
    /// assert_eq!(config.with_keep_idle(Duration::from_millis(200)).lead(), Duration::from_millis(100));
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn lead(&self) -> Duration {
        self.node_timeout.saturating_mul(3).min(self.keep_idle() / 2)
    }

    /// Where the locks live, without credentials: the scheme, the masters (in one order,
    /// whatever order they were listed in), the database and the key prefix. Clients
    /// with the same target share their locks; what
    /// [`Locker::target`](dlock_core::Locker::target) tells.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    ///
    /// let config = RedLockConfig::from_url("redlock://app:s3cret@10.0.0.2:6379,10.0.0.1:6379,10.0.0.3:6379/1")?;
    /// assert_eq!(config.target(), "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/1 prefix dlock");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn target(&self) -> String {
        let tls = if self.access.tls { "s" } else { "" };
        format!("redlock{tls}://{}/{} prefix {}", sorted(&self.nodes), self.access.db, self.prefix())
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// How many nodes must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The clock-drift allowance for a lease of `ttl`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor).saturating_add(self.drift_fixed)
    }

    /// The upper bound of the random retry delay.
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }

    /// How tokens are proposed.
    pub fn token_source(&self) -> TokenSource {
        self.token_source
    }

    /// The connection settings of one node, as a single-server [`RedisConfig`].
    pub fn node_config(&self, node: &Node) -> RedisConfig {
        let mut config = RedisConfig::single(node.host.clone(), node.port);
        *config.access_mut() = self.access.clone();
        *config.common_mut() = self.common.clone();
        config
    }
}

/// `with_connect_timeout`, `with_op_timeout`, `with_prefix` and their getters. The
/// connect timeout bounds connecting to the nodes; the operation timeout, one lock
/// operation with all its fan-outs, and must be at least four times the
/// [node timeout](RedLockConfig::with_node_timeout). The prefix may not contain `{` or
/// `}`: [`validate`](RedLockConfig::validate) and `connect` refuse it.
///
/// ```
/// use std::time::Duration;
/// use dlock_redis::redlock::RedLockConfig;
/// use dlock_redis::{ConnectConfig, Node};
///
/// let config = RedLockConfig::new([Node::new("10.0.0.1", 6379)])
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_op_timeout(Duration::from_millis(400))
///     .with_prefix("shop");
/// assert_eq!(config.connect_timeout(), Duration::from_secs(2));
/// assert_eq!(config.op_timeout(), Duration::from_millis(400));
/// assert_eq!(config.prefix(), "shop");
/// // 400 ms is four times the default node timeout; less is refused.
/// assert!(config.validate().is_ok());
/// assert!(config.with_op_timeout(Duration::from_millis(399)).validate().is_err());
/// ```
impl ConnectConfig for RedLockConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

/// `with_tls`, `with_tls_ca`, `with_credentials`, `with_password`, `with_db` and their
/// getters, the same for every node: [`node_config`](RedLockConfig::node_config) hands
/// each node a copy. `with_tls` turns TLS on for every node, as `redlocks://` does.
///
/// ```
/// use dlock_redis::redlock::RedLockConfig;
/// use dlock_redis::{AccessConfig, Node};
///
/// let config = RedLockConfig::new([Node::new("10.0.0.1", 6379), Node::new("10.0.0.2", 6379)])
///     .with_tls(true)
///     .with_password("s3cret")
///     .with_db(3);
/// let node = config.node_config(&config.nodes()[1]);
/// assert_eq!(node.access(), config.access());
/// ```
impl AccessConfig for RedLockConfig {
    fn access(&self) -> &ServerAccess {
        &self.access
    }

    fn access_mut(&mut self) -> &mut ServerAccess {
        &mut self.access
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn parses_node_lists_and_options() {
        let c = RedLockConfig::from_url("redlock://a:1,b:2,c,[::1]:4,e:5").unwrap();
        assert_eq!(
            c.nodes(),
            &[Node::new("a", 1), Node::new("b", 2), Node::new("c", 6379), Node::new("::1", 4), Node::new("e", 5)]
        );
        assert_eq!(c.quorum(), 3);
        assert!(!c.tls());
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(102));

        let c = RedLockConfig::from_url(
            "redlocks://u:p%40ss@a,b/3?op_timeout=2s&node_timeout=20ms&drift_factor=0.05&drift=0\
             &retry_delay=10ms&tokens=read&tls_ca=/ca.pem",
        )
        .unwrap();
        assert!(c.tls());
        assert_eq!((c.user(), c.password(), c.db()), (Some("u"), Some("p@ss"), 3));
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.node_timeout(), Duration::from_millis(20));
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(500));
        assert_eq!(c.retry_delay(), Duration::from_millis(10));
        assert_eq!(c.token_source(), TokenSource::ReadFirst);
        assert_eq!(c.tls_ca(), Some(Path::new("/ca.pem")));

        let node = c.node_config(&c.nodes()[1]);
        assert_eq!(node.topology(), &crate::Topology::Single(Node::new("b", 6379)));
        assert_eq!((node.db(), node.user(), node.password(), node.tls()), (3, Some("u"), Some("p@ss"), true));
        assert_eq!((node.op_timeout(), node.connect_timeout()), (c.op_timeout(), c.connect_timeout()));
        assert_eq!(node.prefix(), c.prefix());
        assert_eq!(node.tls_ca(), Some(Path::new("/ca.pem")));
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)] {
            let nodes = (0..n).map(|i| Node::new("h", 1000 + i as u16));
            let quorum = RedLockConfig::new(nodes).quorum();
            assert_eq!(quorum, q, "{n} nodes");
            // Any two quorums share a node.
            assert!(2 * quorum > n);
        }
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "redis://a,b,c",
            "redlock//a",
            "redlock://",
            "redlock://a,a",
            "redlock://A:1,a:1",
            "redlock://a,b:0",
            "redlock://a,b/x",
            "redlock://a,b/1/2",
            "redlock://a,b/-1",
            "redlock://a?nope=1",
            "redlock://a?node_timeout=0ms",
            "redlock://a?node_timeout=2s&op_timeout=5s",
            "redlock://a?drift_factor=0.5",
            "redlock://a?drift_factor=-0.1",
            "redlock://a?drift_factor=x",
            "redlock://a?retry_delay=0s",
            "redlock://a?tokens=random",
            "redlock://a?tls_ca=/ca.pem",
            "redlock://a?prefix=x{y",
            "redlock://a?keep_idle=0s",
            "redlock://a?keep_idle=later",
        ] {
            assert!(matches!(RedLockConfig::from_url(url), Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[test]
    fn never_shows_passwords() {
        let err = RedLockConfig::from_url("redlock://u:hunter2@a,b?nope=1").unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        let config = RedLockConfig::from_url("redlock://u:hunter2@a,b").unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        let built = RedLockConfig::new([Node::new("a", 1)]).with_credentials("app", "hunter2");
        let shown = format!("{built:?}");
        assert!(!shown.contains("hunter2") && shown.contains("app"), "{shown}");
    }

    #[test]
    fn builds_with_credentials_and_common_options() {
        let nodes = [Node::new("a", 1), Node::new("b", 2), Node::new("c", 3)];
        let c = RedLockConfig::new(nodes.clone())
            .with_credentials("app", "s3cret")
            .with_op_timeout(Duration::from_secs(2))
            .with_prefix("shop");
        assert_eq!((c.user(), c.password()), (Some("app"), Some("s3cret")));
        assert_eq!(c.op_timeout(), Duration::from_secs(2));
        assert_eq!(c.connect_timeout(), ConnectOptions::default().connect_timeout);
        assert_eq!(c.prefix(), "shop");
        assert!(c.validate().is_ok());
        assert_eq!(c, RedLockConfig::from_url("redlock://app:s3cret@a:1,b:2,c:3?op_timeout=2s&prefix=shop").unwrap());
        let node = c.node_config(&nodes[0]);
        assert_eq!((node.user(), node.password(), node.prefix()), (Some("app"), Some("s3cret"), "shop"));
    }

    #[test]
    fn keeps_idle_names_for_the_keep_time_asked_and_leads_by_at_most_half_of_it() {
        let c = RedLockConfig::from_url("redlock://a,b,c?keep_idle=90s&node_timeout=100ms").unwrap();
        assert_eq!(c.keep_idle(), Duration::from_secs(90));
        assert_eq!(c.lead(), Duration::from_millis(300));
        assert_eq!(c.clone().with_keep_idle(Duration::from_millis(100)).lead(), Duration::from_millis(50));
        assert!(matches!(c.with_keep_idle(Duration::ZERO).validate(), Err(LockError::InvalidInput(_))));
        assert_eq!(RedLockConfig::new([Node::new("a", 1)]).keep_idle(), dlock_core::DEFAULT_KEEP_IDLE);
    }

    #[test]
    fn builds_with_a_password_alone() {
        let c = RedLockConfig::new([Node::new("a", 1)]).with_credentials("app", "other").with_password("s3cret");
        assert_eq!((c.user(), c.password()), (None, Some("s3cret")));
        assert_eq!(c, RedLockConfig::from_url("redlock://:s3cret@a:1").unwrap());
        let node = c.node_config(&c.nodes()[0]);
        assert_eq!((node.user(), node.password()), (None, Some("s3cret")));
    }
}
