//! How to reach ZooKeeper: the ensemble's addresses, digest credentials, the znode root
//! and the timeouts, read from a `zk://` URL or set with builder methods.

use std::fmt;

use dlock_core::{BackendUrl, ConnectConfig, ConnectOptions, HostPort, LockError, LockName};

/// The client port of a ZooKeeper server when the URL names none.
pub const DEFAULT_PORT: u16 = 2181;

/// The znode under which locks live when neither the URL path nor `prefix` names one.
pub const DEFAULT_ROOT: &str = "/dlock";

/// The URL scheme this crate accepts.
pub const SCHEME: &str = "zk";

/// One `host:port` of the ensemble.
pub type Host = HostPort;

/// The settings of a ZooKeeper lock client.
///
/// The URL form is `zk://[user:password@]host[:port][,host[:port]...][/root][?options]`:
/// every member of the ensemble (the client fails over between them), optional digest
/// credentials (then lock nodes are created with ACLs that let only this identity change
/// or delete them, and anyone read them), the znode root under which the locks live
/// (default `/dlock`; the `prefix` option says the same as the path, `prefix=shop/locks`
/// meaning `/shop/locks`), and the options `connect_timeout` and `op_timeout`.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::ConnectConfig;
/// use dlock_zk::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://app:s3cret@zk1:2181,zk2:2182,zk3/shop/locks?op_timeout=500ms")?;
/// assert_eq!(config.connect_string(), "zk1:2181,zk2:2182,zk3:2181");
/// assert_eq!(config.root(), "/shop/locks");
/// assert_eq!(config.user(), Some("app"));
/// assert_eq!(config.op_timeout(), Duration::from_millis(500));
///
/// let local = ZkConfig::new("127.0.0.1:2181")?
///     .with_root("/jobs")?
///     .with_credentials("app", "s3cret")
///     .with_op_timeout(Duration::from_secs(1));
/// assert_eq!(local.root(), "/jobs");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
///
/// The timeouts and the prefix (the root without its leading `/`) are the shared
/// [`ConnectOptions`], set and read through [`ConnectConfig`].
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<Host>,
    digest: Option<(String, String)>,
    common: ConnectOptions,
}

impl ConnectConfig for ZkConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("root", &self.root())
            .field("user", &self.user())
            .field("password", &self.digest.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout())
            .field("op_timeout", &self.op_timeout())
            .finish()
    }
}

impl ZkConfig {
    /// A configuration for the ensemble in `hosts` (`host[:port]`, comma-separated), with
    /// the default root and timeouts.
    pub fn new(hosts: &str) -> Result<Self, LockError> {
        Ok(ZkConfig { hosts: parse_hosts(hosts)?, digest: None, common: ConnectOptions::default() })
    }

    /// Parses a `zk://` URL (see the type's documentation). Fails with `InvalidInput` on
    /// a malformed URL or an unknown option.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let url = BackendUrl::parse(url, DEFAULT_PORT)?;
        if url.scheme != SCHEME {
            return Err(url.invalid("the scheme is not zk"));
        }
        if let Some((key, _)) = url.extra.first() {
            return Err(url.invalid(format!("unknown option {key:?} (known: connect_timeout, op_timeout, prefix)")));
        }
        let path = url.path.trim_end_matches('/');
        let root = match (path.is_empty(), url.prefix_given) {
            (false, true) => return Err(url.invalid("both a path and the prefix option name the root")),
            (false, false) => path.to_string(),
            (true, true) => format!("/{}", url.options.prefix.trim_matches('/')),
            (true, false) => DEFAULT_ROOT.to_string(),
        };
        let mut config =
            ZkConfig { hosts: url.hosts.clone(), digest: None, common: url.options.clone() }.with_root(&root)?;
        match (&url.user, &url.password) {
            (None, None) => {}
            (Some(user), Some(password)) => config = config.with_credentials(user.as_str(), password.as_str()),
            _ => return Err(url.invalid("credentials need both a user and a password")),
        }
        config.validate()?;
        Ok(config)
    }

    /// Replaces the ensemble's members (`host[:port]`, comma-separated).
    pub fn with_hosts(mut self, hosts: &str) -> Result<Self, LockError> {
        self.hosts = parse_hosts(hosts)?;
        Ok(self)
    }

    /// Sets the znode under which the locks live: an absolute path such as `/shop/locks`.
    /// It is created (with this client's ACL) when missing.
    pub fn with_root(mut self, root: &str) -> Result<Self, LockError> {
        validate_root(root)?;
        self.common.prefix = root.trim_start_matches('/').to_string();
        Ok(self)
    }

    /// Authenticates with ZooKeeper's `digest` scheme as `user:password`. Lock nodes are
    /// then created readable by anyone but writable and deletable only by this identity.
    /// The user must be non-empty and without `:` (connecting fails with `InvalidInput`
    /// otherwise).
    pub fn with_credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Checks what the builder methods could not: the root (also when set with
    /// [`with_prefix`](ConnectConfig::with_prefix)) and the credentials.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        validate_root(&self.root())?;
        if let Some((user, password)) = &self.digest {
            if user.is_empty() || user.contains(':') || user.contains('\0') || password.contains('\0') {
                return Err(LockError::InvalidInput("a digest user must be non-empty, without ':' or NUL".into()));
            }
        }
        Ok(())
    }

    /// The ensemble's members.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The members as a ZooKeeper connect string: `host:port,host:port`.
    pub fn connect_string(&self) -> String {
        self.hosts.iter().map(Host::to_string).collect::<Vec<_>>().join(",")
    }

    /// The znode under which the locks live: the prefix as an absolute path.
    pub fn root(&self) -> String {
        format!("/{}", self.common.prefix.trim_matches('/'))
    }

    /// The digest user, if credentials were given.
    pub fn user(&self) -> Option<&str> {
        self.digest.as_ref().map(|(user, _)| user.as_str())
    }

    /// The digest password, if credentials were given.
    pub fn password(&self) -> Option<&str> {
        self.digest.as_ref().map(|(_, password)| password.as_str())
    }

    pub(crate) fn digest_auth(&self) -> Option<Vec<u8>> {
        self.digest.as_ref().map(|(user, password)| format!("{user}:{password}").into_bytes())
    }

    /// The znode of the lock `name`: the root, then the name encoded as one path segment
    /// (injective, so two names never share a znode). Its children are the queue.
    ///
    /// ```
    /// use dlock_core::LockName;
    /// use dlock_zk::ZkConfig;
    ///
    /// let config = ZkConfig::new("127.0.0.1")?;
    /// assert_eq!(config.lock_path(&LockName::new("orders/42")?), "/dlock/orders%2F42");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn lock_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.root(), name.encoded())
    }

    /// The znode of the result stored under the lock `name`: a sibling of the lock's
    /// znode, its path with `.result` appended. An encoded name never contains a `.`, so
    /// this is never the znode of a lock, and two names never share it; being outside the
    /// lock's znode, it is not part of the queue and stays when the lock's znode goes.
    ///
    /// ```
    /// use dlock_core::LockName;
    /// use dlock_zk::ZkConfig;
    ///
    /// let config = ZkConfig::new("127.0.0.1")?;
    /// assert_eq!(config.result_path(&LockName::new("orders/42")?), "/dlock/orders%2F42.result");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn result_path(&self, name: &LockName) -> String {
        format!("{}{RESULT_SUFFIX}", self.lock_path(name))
    }
}

/// What a result's znode appends to its lock's path: a `.`, which no encoded name has.
pub(crate) const RESULT_SUFFIX: &str = ".result";

fn parse_hosts(hosts: &str) -> Result<Vec<Host>, LockError> {
    Ok(BackendUrl::parse(&format!("{SCHEME}://{hosts}"), DEFAULT_PORT)?.hosts)
}

fn validate_root(root: &str) -> Result<(), LockError> {
    let bad = |why: &str| LockError::InvalidInput(format!("ZooKeeper root {root:?}: {why}"));
    let rest = root.strip_prefix('/').ok_or_else(|| bad("must start with '/'"))?;
    if rest.is_empty() {
        return Err(bad("must name a znode below '/'"));
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err(bad("has an empty segment or a trailing '/'"));
        }
        if segment == "." || segment == ".." {
            return Err(bad("has a '.' or '..' segment"));
        }
        if segment.chars().any(|c| c == '\0' || c.is_control()) {
            return Err(bad("has a control character"));
        }
    }
    if rest == "zookeeper" || rest.starts_with("zookeeper/") {
        return Err(bad("/zookeeper is reserved by the server"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn parses_ensembles_credentials_and_roots() {
        let c = ZkConfig::from_url("zk://u%40x:p%3Aw@[::1]:2182,h2,h3:9/a%20b/c").unwrap();
        assert_eq!(c.hosts(), &[Host::new("::1", 2182), Host::new("h2", 2181), Host::new("h3", 9)]);
        assert_eq!(c.connect_string(), "[::1]:2182,h2:2181,h3:9");
        assert_eq!(c.root(), "/a b/c");
        assert_eq!((c.user(), c.password()), (Some("u@x"), Some("p:w")));
        assert!(!format!("{c:?}").contains("p:w"));

        let c = ZkConfig::from_url("ZK://h?prefix=shop%2Flocks&connect_timeout=2s").unwrap();
        assert_eq!(c.root(), "/shop/locks");
        assert_eq!(c.connect_timeout(), Duration::from_secs(2));
        assert_eq!(ZkConfig::from_url("zk://h/").unwrap().root(), DEFAULT_ROOT);
        assert_eq!(ZkConfig::from_url("zk://h").unwrap().root(), DEFAULT_ROOT);
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "zk:/h",
            "redis://h",
            "zk://",
            "zk://h:0",
            "zk://h:99999",
            "zk://h:x",
            "zk://h,,h2",
            "zk://[::1",
            "zk://h/a//b",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h/root?prefix=x",
            "zk://h?tls=true",
            "zk://h?op_timeout=0s",
            "zk://user@h",
            "zk://:pw@h",
        ] {
            assert!(matches!(ZkConfig::from_url(url), Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        let err = ZkConfig::from_url("zk://u:hunter2@h?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn lock_paths_are_one_segment_per_name() {
        let c = ZkConfig::new("h").unwrap();
        for name in ["a/b", "..", "a b", "🔒"] {
            let path = c.lock_path(&LockName::new(name).unwrap());
            assert_eq!(path.matches('/').count(), 2, "{path}");
        }
    }

    #[test]
    fn result_paths_never_meet_lock_paths() {
        let c = ZkConfig::new("h").unwrap();
        let names = ["a", "a.result", "a%2Eresult", "a/b", ".result", "🔒"].map(|n| LockName::new(n).unwrap());
        let mut paths: Vec<String> = names.iter().flat_map(|n| [c.lock_path(n), c.result_path(n)]).collect();
        let all = paths.len();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), all, "two znodes coincide: {paths:?}");
        for name in &names {
            assert!(!c.lock_path(name).contains('.'), "a lock path with a '.': {name:?}");
            assert_eq!(c.result_path(name).matches('/').count(), 2);
        }
    }
}
