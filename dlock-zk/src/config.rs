//! How to reach ZooKeeper: the ensemble's addresses, digest credentials, TLS, the znode
//! root and the timeouts, read from a `zk://` or `zks://` URL or set with builder methods.

use std::fmt;
use std::path::{Path, PathBuf};

use dlock_core::{BackendUrl, ConnectConfig, ConnectOptions, HostPort, LockError, LockName};
use zookeeper_client as zk;

/// The client port of a ZooKeeper server when the URL names none.
pub const DEFAULT_PORT: u16 = 2181;

/// The znode under which locks live when neither the URL path nor `prefix` names one.
pub const DEFAULT_ROOT: &str = "/dlock";

/// The URL scheme of plaintext connections.
pub const SCHEME: &str = "zk";

/// The URL scheme of TLS connections (to the servers' `secureClientPort`).
pub(crate) const TLS_SCHEME: &str = "zks";

/// The options only a `zks://` URL takes.
const TLS_OPTIONS: [&str; 3] = ["ca", "cert", "key"];

/// How a client's credentials authenticate to ZooKeeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZkAuth {
    /// The `digest` scheme (`addauth digest user:password`): the server takes any
    /// password and derives the identity from it, so a wrong password shows only when a
    /// node made by the right one is changed (`NoAuth`).
    #[default]
    Digest,
    /// SASL DIGEST-MD5 against the users of the server's JAAS `Server` section: the server
    /// checks the password when the session opens, and with `enforce.auth.schemes=sasl`
    /// closes the sessions of clients that did not authenticate.
    Sasl,
}

/// One `host:port` of the ensemble.
pub type Host = HostPort;

/// The settings of a ZooKeeper lock client.
///
/// The URL form is `zk://[user:password@]host[:port][,host[:port]...][/root][?options]`:
/// every member of the ensemble (the client fails over between them), optional
/// credentials (then lock nodes are created with ACLs that let only this identity change
/// or delete them, and anyone read them; the `auth` option says how they authenticate:
/// `auth=digest`, the default, or `auth=sasl` for SASL DIGEST-MD5, see [`ZkAuth`]), the
/// znode root under which the locks live (default `/dlock`; the `prefix` option says the
/// same as the path, `prefix=shop/locks` meaning `/shop/locks`), and the options
/// `connect_timeout` and `op_timeout`.
///
/// `zks://` instead of `zk://` speaks TLS to every member (ZooKeeper serves it on a
/// separate port, its `secureClientPort`), as etcd's `etcds://` does, with the same
/// options: `ca` (a PEM file of the CA that signed the servers' certificates; the system's
/// roots otherwise), and `cert` and `key` (PEM files of a client certificate and its key,
/// for servers that require one). The files are read when the client connects. A server's
/// certificate must name the host the URL names.
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
///
/// let secure = ZkConfig::from_url("zks://zk1:2281,zk2:2281/locks?ca=/etc/zk/ca.pem")?;
/// assert!(secure.is_tls());
/// assert_eq!(secure.ca_file(), Some(std::path::Path::new("/etc/zk/ca.pem")));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
///
/// The timeouts and the prefix (the root without its leading `/`) are the shared
/// [`ConnectOptions`], set and read through [`ConnectConfig`].
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<Host>,
    credentials: Option<(String, String)>,
    auth: ZkAuth,
    tls: bool,
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
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
            .field("password", &self.credentials.as_ref().map(|_| "<redacted>"))
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("connect_timeout", &self.connect_timeout())
            .field("op_timeout", &self.op_timeout())
            .finish()
    }
}

impl ZkConfig {
    /// A configuration for the ensemble in `hosts` (`host[:port]`, comma-separated), with
    /// the default root and timeouts.
    pub fn new(hosts: &str) -> Result<Self, LockError> {
        Ok(ZkConfig {
            hosts: parse_hosts(hosts)?,
            credentials: None,
            auth: ZkAuth::Digest,
            tls: false,
            ca: None,
            identity: None,
            common: ConnectOptions::default(),
        })
    }

    /// Parses a `zk://` or `zks://` URL (see the type's documentation). Fails with
    /// `InvalidInput` on a malformed URL or an unknown option.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let url = BackendUrl::parse(url, DEFAULT_PORT)?;
        let tls = match url.scheme.as_str() {
            SCHEME => false,
            TLS_SCHEME => true,
            _ => return Err(url.invalid("the scheme is not zk or zks")),
        };
        let (mut ca, mut cert, mut key) = (None, None, None);
        let mut auth = ZkAuth::Digest;
        for (name, value) in &url.extra {
            if name == "auth" {
                auth = match value.as_str() {
                    "digest" => ZkAuth::Digest,
                    "sasl" => ZkAuth::Sasl,
                    _ => return Err(url.invalid(format!("auth={value:?} is neither digest nor sasl"))),
                };
                continue;
            }
            if name == "tls" || name == "ssl" {
                // Other clients' URLs turn TLS on with an option; say what this one wants.
                return Err(url.invalid(format!(
                    "TLS for ZooKeeper needs the zks:// scheme (zks://host:port/root?ca=<pem file>), \
                     not a {name} option"
                )));
            }
            if !TLS_OPTIONS.contains(&name.as_str()) {
                return Err(url.invalid(format!(
                    "unknown option {name:?} (known: auth, connect_timeout, op_timeout, prefix; with zks://: ca, cert, key)"
                )));
            }
            if !tls {
                return Err(url.invalid(format!("option {name} needs TLS: use the zks:// scheme")));
            }
            if value.is_empty() {
                return Err(url.invalid(format!("option {name} names no file")));
            }
            let file = Some(PathBuf::from(value));
            match name.as_str() {
                "ca" => ca = file,
                "cert" => cert = file,
                _ => key = file,
            }
        }
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(url.invalid("options cert and key go together")),
        };
        let path = url.path.trim_end_matches('/');
        let root = match (path.is_empty(), url.prefix_given) {
            (false, true) => return Err(url.invalid("both a path and the prefix option name the root")),
            (false, false) => path.to_string(),
            (true, true) => format!("/{}", url.options.prefix.trim_matches('/')),
            (true, false) => DEFAULT_ROOT.to_string(),
        };
        let mut config = ZkConfig {
            hosts: url.hosts.clone(),
            credentials: None,
            auth,
            tls,
            ca,
            identity,
            common: url.options.clone(),
        }
        .with_root(&root)?;
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
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// How the [credentials](Self::with_credentials) authenticate: with the `digest`
    /// scheme (the default), or by SASL DIGEST-MD5 against the server's JAAS users.
    ///
    /// ```
    /// use dlock_zk::{ZkAuth, ZkConfig};
    ///
    /// let config = ZkConfig::new("zk1:2181")?.with_credentials("app", "s3cret").with_auth(ZkAuth::Sasl);
    /// assert_eq!(config.auth(), ZkAuth::Sasl);
    /// assert_eq!(config, ZkConfig::from_url("zk://app:s3cret@zk1:2181?auth=sasl")?);
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with_auth(mut self, auth: ZkAuth) -> Self {
        self.auth = auth;
        self
    }

    /// How the credentials authenticate.
    pub fn auth(&self) -> ZkAuth {
        self.auth
    }

    /// Speaks TLS to every member (on the port the servers serve TLS on, their
    /// `secureClientPort`), trusting the system's roots unless
    /// [`with_ca_file`](Self::with_ca_file) names a CA.
    ///
    /// ```
    /// use dlock_zk::ZkConfig;
    ///
    /// let config = ZkConfig::new("zk1:2281")?.with_tls(true);
    /// assert!(config.is_tls() && config.ca_file().is_none());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trusts the CA in this PEM file instead of the system's roots (and turns TLS on):
    /// servers' certificates are usually signed by a private CA. The file is read when the
    /// client connects.
    ///
    /// ```
    /// use dlock_zk::ZkConfig;
    ///
    /// let config = ZkConfig::new("zk1:2281")?.with_ca_file("/etc/zk/ca.pem");
    /// assert!(config.is_tls());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self.tls = true;
        self
    }

    /// Presents this client certificate and its key, PEM files (and turns TLS on), to
    /// servers that require one (`ssl.clientAuth=need`). The files are read when the client
    /// connects.
    ///
    /// ```
    /// use dlock_zk::ZkConfig;
    ///
    /// let config = ZkConfig::new("zk1:2281")?
    ///     .with_ca_file("/etc/zk/ca.pem")
    ///     .with_client_identity("/etc/zk/client.pem", "/etc/zk/client-key.pem");
    /// assert!(config.client_identity().is_some());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn with_client_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self.tls = true;
        self
    }

    /// Whether the client speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The CA file to trust, if set.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The client certificate and key files, if set.
    pub fn client_identity(&self) -> Option<(&Path, &Path)> {
        self.identity.as_ref().map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// Checks what the builder methods could not: the root (also when set with
    /// [`with_prefix`](ConnectConfig::with_prefix)), the credentials, and that TLS files
    /// are not named for a plaintext client.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        validate_root(&self.root())?;
        if !self.tls && (self.ca.is_some() || self.identity.is_some()) {
            return Err(LockError::InvalidInput(
                "a CA file or client certificate is set but TLS is off (with_tls(false))".into(),
            ));
        }
        match (&self.credentials, self.auth) {
            (Some((user, password)), _) => {
                if user.is_empty() || user.contains(':') || user.contains('\0') || password.contains('\0') {
                    return Err(LockError::InvalidInput(
                        "a ZooKeeper user must be non-empty, without ':' or NUL".into(),
                    ));
                }
            }
            (None, ZkAuth::Sasl) => {
                return Err(LockError::InvalidInput("SASL authentication needs a user and a password".into()));
            }
            (None, ZkAuth::Digest) => {}
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

    /// The user, if credentials were given.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(user, _)| user.as_str())
    }

    /// The password, if credentials were given.
    pub fn password(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(_, password)| password.as_str())
    }

    /// Whether the client authenticates (and so creates nodes only its identity may
    /// change).
    pub(crate) fn authenticates(&self) -> bool {
        self.credentials.is_some()
    }

    /// The connector, set to authenticate as the credentials say.
    pub(crate) fn authenticate(&self, connector: zk::Connector) -> zk::Connector {
        match (&self.credentials, self.auth) {
            (None, _) => connector,
            (Some((user, password)), ZkAuth::Digest) => {
                connector.with_auth("digest", format!("{user}:{password}").as_bytes())
            }
            (Some((user, password)), ZkAuth::Sasl) => {
                connector.with_sasl(zk::SaslOptions::digest_md5(user.clone(), password.clone()))
            }
        }
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
    fn parses_tls_urls() {
        let c =
            ZkConfig::from_url("zks://u:p@zk1:2281,zk2/locks?ca=%2Fetc%2Fzk%2Fca.pem&cert=c.pem&key=k.pem").unwrap();
        assert!(c.is_tls());
        assert_eq!(c.connect_string(), "zk1:2281,zk2:2181");
        assert_eq!(c.root(), "/locks");
        assert_eq!(c.ca_file(), Some(Path::new("/etc/zk/ca.pem")));
        assert_eq!(c.client_identity(), Some((Path::new("c.pem"), Path::new("k.pem"))));
        let plain = ZkConfig::from_url("zks://h").unwrap();
        assert!(plain.is_tls() && plain.ca_file().is_none() && plain.client_identity().is_none());
        assert!(!ZkConfig::from_url("zk://h").unwrap().is_tls());
    }

    #[test]
    fn rejects_bad_tls_urls() {
        for (url, says) in [
            ("zk://h?tls=true", "TLS for ZooKeeper needs the zks:// scheme"),
            ("zks://h?tls=true", "TLS for ZooKeeper needs the zks:// scheme"),
            ("zk://h?ssl=1", "TLS for ZooKeeper needs the zks:// scheme"),
            ("zk://h?ca=ca.pem", "needs TLS: use the zks:// scheme"),
            ("zks://h?cert=c.pem", "cert and key go together"),
            ("zks://h?key=k.pem", "cert and key go together"),
            ("zks://h?ca=", "names no file"),
            ("zks://h?domain=x", "unknown option"),
            ("zkss://h", "not zk or zks"),
        ] {
            match ZkConfig::from_url(url) {
                Err(LockError::InvalidInput(message)) => assert!(message.contains(says), "{url}: {message}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        let off = ZkConfig::new("h").unwrap().with_ca_file("ca.pem").with_tls(false);
        assert!(matches!(off.validate(), Err(LockError::InvalidInput(_))));
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
