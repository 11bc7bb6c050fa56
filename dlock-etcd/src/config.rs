//! [`EtcdConfig`]: endpoints, credentials, TLS, timeouts and key prefix, from a URL or a builder.

use std::fmt;
use std::path::PathBuf;

use dlock_core::{BackendUrl, ConnectConfig, ConnectOptions, Given, LockError};

/// The port etcd clients use when a URL names none.
const DEFAULT_PORT: u16 = 2379;

/// How to reach etcd and where to keep the locks.
///
/// From a URL, `etcd://[user:password@]host:port[,host:port...][/][?options]`, or
/// `etcds://...` for TLS. Options: `connect_timeout`, `op_timeout` and `prefix` (shared by
/// every backend), and with `etcds://` also `ca` (a PEM file of the CA to trust instead of
/// the system's roots), `cert` and `key` (a client certificate, PEM files) and `domain`
/// (the name to verify in the server's certificate, when it is not the host of the URL).
///
/// ```
/// use std::time::Duration;
/// use dlock_core::ConnectConfig;
/// use dlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://app:s3cret@10.0.0.1:2379,10.0.0.2:2379?op_timeout=2s&prefix=shop")?;
/// assert_eq!(config.endpoints(), ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(config.op_timeout(), Duration::from_secs(2));
/// assert_eq!(config.prefix(), "shop");
///
/// let built =
///     EtcdConfig::new(["127.0.0.1:2379"]).with_credentials("app", "s3cret").with_op_timeout(Duration::from_secs(2));
/// assert_eq!(built.endpoints(), ["http://127.0.0.1:2379"]);
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    hosts: Vec<String>,
    user: Option<(String, String)>,
    tls: bool,
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    domain: Option<String>,
    common: ConnectOptions,
    /// The application's own client, if it gave one.
    given: Option<Given<etcd_client::Client>>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("hosts", &self.hosts)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("domain", &self.domain)
            .field("common", &self.common)
            .field("given_client", &self.given.is_some())
            .finish()
    }
}

impl EtcdConfig {
    /// A configuration for these `host:port` endpoints, without TLS or credentials, with
    /// the default timeouts (5 s) and prefix (`dlock`).
    pub fn new<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            user: None,
            tls: false,
            ca: None,
            identity: None,
            domain: None,
            common: ConnectOptions::default(),
            given: None,
        }
    }

    /// Parses `etcd://` and `etcds://` URLs (see the type's docs).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let url = BackendUrl::parse(url, DEFAULT_PORT)?;
        let bad = |why: &str| url.invalid(why);
        let tls = match url.scheme.as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("expected etcd:// or etcds://")),
        };
        if url.path != "/" && !url.path.is_empty() {
            return Err(bad("the URL takes no path (use ?prefix= for the key prefix)"));
        }
        let user = match (&url.user, &url.password) {
            (None, None) => None,
            (Some(user), password) => Some((user.clone(), password.clone().unwrap_or_default())),
            (None, Some(_)) => return Err(bad("empty user name")),
        };
        let mut config = EtcdConfig::new(Vec::<String>::new());
        config.hosts = url.hosts.iter().map(ToString::to_string).collect();
        config.user = user;
        config.tls = tls;
        config.common = url.options.clone();
        let rest = url.extra.clone();
        let mut cert = None;
        let mut key = None;
        for (name, value) in rest {
            if !tls && matches!(name.as_str(), "ca" | "cert" | "key" | "domain") {
                return Err(bad(&format!("option {name} needs TLS (etcds://)")));
            }
            if value.is_empty() {
                return Err(bad(&format!("option {name} is empty")));
            }
            match name.as_str() {
                "ca" => config.ca = Some(PathBuf::from(value)),
                "cert" => cert = Some(PathBuf::from(value)),
                "key" => key = Some(PathBuf::from(value)),
                "domain" => config.domain = Some(value),
                other => return Err(bad(&format!("unknown option {other:?}"))),
            }
        }
        match (cert, key) {
            (Some(cert), Some(key)) => config.identity = Some((cert, key)),
            (None, None) => {}
            _ => return Err(bad("cert and key go together")),
        }
        Ok(config)
    }

    /// Authenticates as this etcd user, with this password.
    pub fn with_credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Speaks TLS to the endpoints (trusting the system's roots unless [`with_ca_file`](Self::with_ca_file) is set).
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trusts the CA in this PEM file (and turns TLS on).
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self.tls = true;
        self
    }

    /// Presents this client certificate and key, PEM files (and turns TLS on).
    pub fn with_client_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self.tls = true;
        self
    }

    /// Verifies this name in the server's certificate instead of the endpoint's host.
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// The members as `host:port`.
    pub(crate) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The endpoints as the client library takes them: `http://host:port` or `https://host:port`.
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts.iter().map(|host| format!("{scheme}://{host}")).collect()
    }

    /// The user name, if the client authenticates.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(user, _)| user.as_str())
    }

    pub(crate) fn credentials(&self) -> Option<&(String, String)> {
        self.user.as_ref()
    }

    /// Whether the client speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The CA file to trust, if set.
    pub fn ca_file(&self) -> Option<&PathBuf> {
        self.ca.as_ref()
    }

    /// The client certificate and key files, if set.
    pub fn client_identity(&self) -> Option<(&PathBuf, &PathBuf)> {
        self.identity.as_ref().map(|(cert, key)| (cert, key))
    }

    /// The name verified in the server's certificate, if set.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Checks what the URL parser checks, for configurations built by hand.
    /// Sends every request through the application's own client (etcd-client 0.x, also
    /// re-exported as [`crate::etcd_client`]) instead of connecting to the hosts, which
    /// then only name the cluster in errors and in [`target`](dlock_core::Locker::target).
    /// The client's endpoints, TLS and credentials are its own: setting any of them here
    /// too is `InvalidInput` at connect. The lock opens no connection of its own; its
    /// watches and lease keep-alives are streams on the client's connections. A client of
    /// this crate's own moves to another member when one fails; a given client balances
    /// over its endpoints as etcd-client does.
    ///
    /// ```no_run
    /// use dlock_etcd::EtcdConfig;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = dlock_etcd::etcd_client::Client::connect(["10.0.0.1:2379"], None).await?;
    /// let locker = dlock_etcd::connect(EtcdConfig::new(["10.0.0.1:2379"]).with_client(client)).await?;
    /// # drop(locker); Ok(()) }
    /// ```
    pub fn with_client(mut self, client: etcd_client::Client) -> Self {
        self.given = Some(Given::new(client));
        self
    }

    /// The application's own client, if one was given.
    pub(crate) fn given_client(&self) -> Option<&etcd_client::Client> {
        self.given.as_ref().map(Given::get)
    }

    pub(crate) fn validate(&self) -> Result<(), LockError> {
        if self.given.is_some()
            && (self.user.is_some() || self.ca.is_some() || self.identity.is_some() || self.domain.is_some())
        {
            return Err(LockError::InvalidInput(
                "credentials and TLS belong to the application's etcd client, not to the lock's config".into(),
            ));
        }
        if self.hosts.is_empty() {
            return Err(LockError::InvalidInput("an etcd configuration needs at least one endpoint".into()));
        }
        for host in &self.hosts {
            BackendUrl::parse(&format!("etcd://{host}"), DEFAULT_PORT)
                .map_err(|_| LockError::InvalidInput(format!("bad etcd endpoint {host:?}")))?;
        }
        if self.prefix().is_empty() || self.prefix().contains('\0') {
            return Err(LockError::InvalidInput("the key prefix must be non-empty text without NUL".into()));
        }
        for (what, d) in [("connect timeout", self.connect_timeout()), ("op timeout", self.op_timeout())] {
            if d.is_zero() || d > dlock_core::MAX_DURATION {
                return Err(LockError::InvalidInput(format!("the {what} {d:?} is out of range")));
            }
        }
        Ok(())
    }
}

/// `with_connect_timeout`, `with_op_timeout`, `with_prefix` and their getters.
impl ConnectConfig for EtcdConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn parses_full_urls() {
        let c = EtcdConfig::from_url(
            "etcds://us%40er:p%3Ass@a.example:2380,[::1]:2381,b.example?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&domain=etcd.local&connect_timeout=250ms&prefix=x%2Fy",
        )
        .unwrap();
        assert_eq!(c.endpoints(), ["https://a.example:2380", "https://[::1]:2381", "https://b.example:2379"]);
        assert_eq!(c.credentials(), Some(&("us@er".to_string(), "p:ss".to_string())));
        assert!(c.is_tls());
        assert_eq!(c.ca_file(), Some(&PathBuf::from("/etc/ca.pem")));
        assert_eq!(c.client_identity(), Some((&PathBuf::from("/c.pem"), &PathBuf::from("/k.pem"))));
        assert_eq!(c.domain(), Some("etcd.local"));
        assert_eq!(c.connect_timeout(), Duration::from_millis(250));
        assert_eq!(c.op_timeout(), Duration::from_secs(5));
        assert_eq!(c.prefix(), "x/y");
        assert!(!format!("{c:?}").contains("p:ss"), "Debug must not show the password");
    }

    #[test]
    fn plain_url_defaults() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379/").unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
        assert_eq!(c.prefix(), "dlock");
        assert!(c.credentials().is_none());
        assert_eq!(EtcdConfig::from_url("etcd://localhost").unwrap().endpoints(), ["http://localhost:2379"]);
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "redis://h:1",
            "etcd//h:1",
            "etcd://",
            "etcd://h:1,,h:2",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:x",
            "etcd://h:1/path",
            "etcd://:pw@h:1",
            "etcd://h:1?ca=/ca.pem",
            "etcds://h:1?cert=/c.pem",
            "etcd://h:1?bogus=1",
            "etcd://h:1?op_timeout=0s",
            "etcd://h:1?prefix=",
            "etcd://[::1:1",
            "etcd://a:b:1",
        ] {
            assert!(matches!(EtcdConfig::from_url(url), Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[test]
    fn errors_hide_the_password() {
        let err = EtcdConfig::from_url("etcd://u:hunter2@h:1?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn builds_with_credentials_and_common_options() {
        let c = EtcdConfig::new(["h:1"]).with_credentials("app", "s3cret").with_prefix("shop");
        assert_eq!(c.user(), Some("app"));
        assert_eq!(c.credentials(), Some(&("app".to_string(), "s3cret".to_string())));
        assert_eq!(c.prefix(), "shop");
        assert_eq!(c.op_timeout(), ConnectOptions::default().op_timeout);
    }

    #[test]
    fn validates_built_configs() {
        assert!(EtcdConfig::new(["h:1"]).validate().is_ok());
        assert!(EtcdConfig::new(Vec::<String>::new()).validate().is_err());
        assert!(EtcdConfig::new(["h:1"]).with_prefix("").validate().is_err());
        assert!(EtcdConfig::new(["h:1"]).with_op_timeout(Duration::ZERO).validate().is_err());
    }
}
