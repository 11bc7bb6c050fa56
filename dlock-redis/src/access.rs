//! How a client reaches one Redis server once it knows its address: TLS, credentials and
//! the logical database. Every deployment and every RedLock node is reached the same way,
//! so both configurations embed one [`ServerAccess`], read it from their URLs here and
//! check it here.

use std::fmt;
use std::path::{Path, PathBuf};

use dlock_core::{BackendUrl, LockError};

/// TLS, credentials and the logical database of the connections to Redis, as
/// [`RedisConfig`](crate::RedisConfig) and [`RedLockConfig`](crate::RedLockConfig) embed
/// them; set and read them through [`AccessConfig`]. `Debug` shows the password as
/// `<redacted>`.
///
/// ```
/// use dlock_redis::{AccessConfig, RedisConfig, ServerAccess};
///
/// let config = RedisConfig::from_url("rediss://app:s3cret@cache.internal/2")?;
/// let expected = ServerAccess {
///     tls: true,
///     user: Some("app".into()),
///     password: Some("s3cret".into()),
///     db: 2,
///     ..ServerAccess::default()
/// };
/// assert_eq!(config.access(), &expected);
/// assert!(!format!("{expected:?}").contains("s3cret"));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ServerAccess {
    /// Whether the connections use TLS.
    pub tls: bool,
    /// A PEM file of the CA certificates to trust instead of the system's (with TLS only).
    pub tls_ca: Option<PathBuf>,
    // Apart rather than a pair: `requirepass` servers take a password without a user,
    // and a URL may name a user without a password.
    /// The ACL user to authenticate as, if any.
    pub user: Option<String>,
    /// The password to authenticate with, if any.
    pub password: Option<String>,
    /// The logical database (never negative).
    pub db: i64,
}

impl fmt::Debug for ServerAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerAccess")
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

impl ServerAccess {
    /// Reads what a URL says about access: its credentials, the database named by the path
    /// segment `db` (each scheme has its own path layout), and the `tls_ca` option, which
    /// it takes out of the URL's other options; returns the options left to the scheme.
    pub(crate) fn from_url(
        url: &BackendUrl,
        tls: bool,
        db: Option<&str>,
    ) -> Result<(Self, Vec<(String, String)>), LockError> {
        let mut access =
            ServerAccess { tls, user: url.user.clone(), password: url.password.clone(), ..ServerAccess::default() };
        if let Some(db) = db {
            access.db = db.parse().map_err(|_| url.invalid(format!("database {db:?} is not a number")))?;
        }
        let mut rest = Vec::with_capacity(url.extra.len());
        for (key, value) in &url.extra {
            match key.as_str() {
                "tls_ca" => access.tls_ca = Some(PathBuf::from(value)),
                _ => rest.push((key.clone(), value.clone())),
            }
        }
        Ok((access, rest))
    }

    /// Fails with `InvalidInput` on settings no deployment accepts; `tls_scheme` is the
    /// scheme that turns TLS on, which the message suggests.
    pub(crate) fn validate(&self, tls_scheme: &str) -> Result<(), LockError> {
        if self.tls_ca.is_some() && !self.tls {
            return Err(LockError::InvalidInput(format!("tls_ca needs TLS ({tls_scheme}://)")));
        }
        if self.db < 0 {
            return Err(LockError::InvalidInput(format!("database {} is negative", self.db)));
        }
        Ok(())
    }
}

/// The builder methods [`RedisConfig`](crate::RedisConfig) and
/// [`RedLockConfig`](crate::RedLockConfig) share over the [`ServerAccess`] they embed:
/// `with_*` setters that take and return the configuration, bare getters.
///
/// ```
/// use dlock_redis::redlock::RedLockConfig;
/// use dlock_redis::{AccessConfig, Node, RedisConfig};
///
/// let single = RedisConfig::single("cache.internal", 6380).with_tls(true).with_credentials("app", "s3cret").with_db(2);
/// assert_eq!(single, RedisConfig::from_url("rediss://app:s3cret@cache.internal:6380/2")?);
///
/// let redlock = RedLockConfig::new([Node::new("10.0.0.1", 6379)]).with_password("s3cret").with_db(2);
/// assert_eq!((redlock.user(), redlock.password(), redlock.db()), (None, Some("s3cret"), 2));
/// # Ok::<(), dlock_core::LockError>(())
/// ```
pub trait AccessConfig: Sized {
    /// The embedded access settings.
    ///
    /// ```
    /// use dlock_redis::{AccessConfig, RedisConfig, ServerAccess};
    ///
    /// assert_eq!(RedisConfig::single("127.0.0.1", 6379).access(), &ServerAccess::default());
    /// ```
    fn access(&self) -> &ServerAccess;

    /// The embedded access settings, to change them.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, Node, RedisConfig};
    ///
    /// let redlock = RedLockConfig::new([Node::new("10.0.0.1", 6379)]).with_credentials("app", "s3cret");
    /// let mut single = RedisConfig::single("10.0.0.9", 6379);
    /// *single.access_mut() = redlock.access().clone();
    /// assert_eq!(single.user(), Some("app"));
    /// ```
    fn access_mut(&mut self) -> &mut ServerAccess;

    /// Uses TLS (`rediss://`, `redlocks://`), verifying the servers against the system's
    /// root certificates, or those of [`with_tls_ca`](AccessConfig::with_tls_ca).
    ///
    /// ```
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// let config = RedisConfig::single("cache.internal", 6380).with_tls(true);
    /// assert_eq!(config, RedisConfig::from_url("rediss://cache.internal:6380")?);
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn with_tls(mut self, tls: bool) -> Self {
        self.access_mut().tls = tls;
        self
    }

    /// Trusts the CA certificates in this PEM file (instead of the system's) for TLS
    /// (URL option `tls_ca`). Without TLS, `validate` and `connect` refuse it.
    ///
    /// ```
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// let config = RedisConfig::single("cache.internal", 6380).with_tls_ca("/etc/ssl/redis-ca.pem");
    /// assert!(config.validate().is_err());
    /// assert!(config.with_tls(true).validate().is_ok());
    /// ```
    fn with_tls_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.access_mut().tls_ca = Some(path.into());
        self
    }

    /// Authenticates as this ACL user, with this password (`AUTH user password`), in
    /// place of any credentials set before. On a Sentinel deployment these are the
    /// master's (see
    /// [`with_sentinel_credentials`](crate::RedisConfig::with_sentinel_credentials) for
    /// the Sentinels' own); with RedLock, every node's.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, Node, RedisConfig};
    ///
    /// let config = RedisConfig::single("127.0.0.1", 6379).with_credentials("app", "s3cret");
    /// assert_eq!((config.user(), config.password()), (Some("app"), Some("s3cret")));
    ///
    /// let config = RedLockConfig::new([Node::new("10.0.0.1", 6379)]).with_credentials("app", "s3cret");
    /// assert_eq!((config.user(), config.password()), (Some("app"), Some("s3cret")));
    /// ```
    fn with_credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        let access = self.access_mut();
        access.user = Some(user.into());
        access.password = Some(password.into());
        self
    }

    /// Authenticates with a password alone (`AUTH password`), for servers protected by
    /// `requirepass` rather than ACL users, in place of any credentials set before.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, Node, RedisConfig};
    ///
    /// let config = RedisConfig::single("127.0.0.1", 6379).with_password("s3cret");
    /// assert_eq!((config.user(), config.password()), (None, Some("s3cret")));
    ///
    /// let config = RedLockConfig::new([Node::new("10.0.0.1", 6379)]).with_password("s3cret");
    /// assert_eq!((config.user(), config.password()), (None, Some("s3cret")));
    /// ```
    fn with_password(mut self, password: impl Into<String>) -> Self {
        let access = self.access_mut();
        access.user = None;
        access.password = Some(password.into());
        self
    }

    /// The logical database (default 0; a Cluster has only database 0).
    ///
    /// ```
    /// use dlock_redis::{AccessConfig, Node, RedisConfig};
    ///
    /// assert_eq!(RedisConfig::single("127.0.0.1", 6379).with_db(3), RedisConfig::from_url("redis://127.0.0.1/3")?);
    /// assert!(RedisConfig::cluster([Node::new("10.0.0.1", 7000)]).with_db(3).validate().is_err());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn with_db(mut self, db: i64) -> Self {
        self.access_mut().db = db;
        self
    }

    /// Whether TLS is used.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// assert!(RedisConfig::from_url("rediss+cluster://10.0.0.1:7000")?.tls());
    /// assert!(!RedLockConfig::from_url("redlock://a,b,c")?.tls());
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn tls(&self) -> bool {
        self.access().tls
    }

    /// The CA file trusted for TLS, if not the system's roots.
    ///
    /// ```
    /// use std::path::Path;
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::AccessConfig;
    ///
    /// let config = RedLockConfig::from_url("redlocks://a,b,c?tls_ca=/etc/ssl/redis-ca.pem")?;
    /// assert_eq!(config.tls_ca(), Some(Path::new("/etc/ssl/redis-ca.pem")));
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn tls_ca(&self) -> Option<&Path> {
        self.access().tls_ca.as_deref()
    }

    /// The ACL user name, if any (none with [`with_password`](AccessConfig::with_password)).
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// assert_eq!(RedisConfig::from_url("redis://app:s3cret@h")?.user(), Some("app"));
    /// assert_eq!(RedisConfig::from_url("redis://:s3cret@h")?.user(), None);
    /// assert_eq!(RedLockConfig::from_url("redlock://app:s3cret@a,b,c")?.user(), Some("app"));
    /// assert_eq!(RedLockConfig::from_url("redlock://:s3cret@a,b,c")?.user(), None);
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn user(&self) -> Option<&str> {
        self.access().user.as_deref()
    }

    /// The password, if any.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// assert_eq!(RedisConfig::from_url("redis://:s3cret@h")?.password(), Some("s3cret"));
    /// assert_eq!(RedisConfig::from_url("redis://h")?.password(), None);
    /// assert_eq!(RedLockConfig::from_url("redlock://:s3cret@a,b,c")?.password(), Some("s3cret"));
    /// assert_eq!(RedLockConfig::from_url("redlock://a,b,c")?.password(), None);
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn password(&self) -> Option<&str> {
        self.access().password.as_deref()
    }

    /// The logical database.
    ///
    /// ```
    /// use dlock_redis::redlock::RedLockConfig;
    /// use dlock_redis::{AccessConfig, RedisConfig};
    ///
    /// assert_eq!(RedisConfig::from_url("redis+sentinel://s1/orders/4")?.db(), 4);
    /// assert_eq!(RedLockConfig::from_url("redlock://a,b,c")?.db(), 0);
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    fn db(&self) -> i64 {
        self.access().db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(url: &str, db: Option<&str>) -> Result<(ServerAccess, Vec<(String, String)>), LockError> {
        ServerAccess::from_url(&BackendUrl::parse(url, 6379)?, url.starts_with("rediss"), db)
    }

    #[test]
    fn reads_credentials_database_and_ca_from_a_url() {
        let (access, rest) =
            read("rediss://u%40x:p%3Aw@h?tls_ca=/ca.pem&wait_replicas=1&prefix=shop", Some("3")).unwrap();
        let expected = ServerAccess {
            tls: true,
            tls_ca: Some("/ca.pem".into()),
            user: Some("u@x".into()),
            password: Some("p:w".into()),
            db: 3,
        };
        assert_eq!(access, expected);
        assert_eq!(rest, vec![("wait_replicas".to_string(), "1".to_string())]);

        let (access, rest) = read("redis://:onlypass@h", None).unwrap();
        assert_eq!(access, ServerAccess { password: Some("onlypass".into()), ..ServerAccess::default() });
        assert!(rest.is_empty());

        assert!(matches!(read("redis://h", Some("x")), Err(LockError::InvalidInput(_))));
    }

    #[test]
    fn refuses_a_ca_without_tls_and_a_negative_database() {
        let ca = ServerAccess { tls_ca: Some("/ca.pem".into()), ..ServerAccess::default() };
        let err = ca.validate("redlocks").unwrap_err().to_string();
        assert!(err.contains("redlocks://"), "{err}");
        assert!(ServerAccess { tls: true, ..ca }.validate("redlocks").is_ok());
        assert!(ServerAccess { db: -1, ..ServerAccess::default() }.validate("rediss").is_err());
    }

    #[test]
    fn debug_hides_the_password() {
        let access =
            ServerAccess { user: Some("app".into()), password: Some("hunter2".into()), ..ServerAccess::default() };
        let shown = format!("{access:?}");
        assert!(!shown.contains("hunter2") && shown.contains("app") && shown.contains("<redacted>"), "{shown}");
    }
}
