//! Choosing a backend by the scheme of a URL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use dlock_core::memory::MemoryStore;
use dlock_core::{LockError, Locker, RawBaseline};

/// The backends a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `memory://[name]`: an in-process store shared by every `connect` of the same name.
    Memory,
    /// `sqlite://path` or `sqlite::memory:`.
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
    /// `redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://` (and their TLS forms).
    Redis,
    /// `redlock://host:port,host:port,...` (`redlocks://` for TLS).
    RedLock,
    /// `zk://`.
    ZooKeeper,
    /// `etcd://` or `etcds://`.
    Etcd,
}

impl Scheme {
    /// The scheme of `url`, or `InvalidInput` when it names no backend.
    ///
    /// ```
    /// use dlock::Scheme;
    /// assert_eq!(Scheme::of("redis://127.0.0.1:6379")?, Scheme::Redis);
    /// assert_eq!(Scheme::of("sqlite::memory:")?, Scheme::Sqlite);
    /// assert!(Scheme::of("ftp://example.com").is_err());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn of(url: &str) -> Result<Self, LockError> {
        if url.starts_with("sqlite:") {
            return Ok(Scheme::Sqlite);
        }
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .ok_or_else(|| LockError::InvalidInput(format!("not a backend URL (no scheme): {url:?}")))?;
        Ok(match scheme.as_str() {
            "memory" => Scheme::Memory,
            "postgres" | "postgresql" => Scheme::Postgres,
            "mysql" | "mariadb" => Scheme::Mysql,
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel" => {
                Scheme::Redis
            }
            "redlock" | "redlocks" => Scheme::RedLock,
            "zk" => Scheme::ZooKeeper,
            "etcd" | "etcds" => Scheme::Etcd,
            other => return Err(LockError::InvalidInput(format!("no backend for the scheme {other:?} in {url:?}"))),
        })
    }

    /// The cargo feature of `dlock` that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Memory => "(always built in)",
            Scheme::Sqlite => "sqlite",
            Scheme::Postgres => "postgres",
            Scheme::Mysql => "mysql",
            Scheme::Redis => "redis",
            Scheme::RedLock => "redlock",
            Scheme::ZooKeeper => "zk",
            Scheme::Etcd => "etcd",
        }
    }

    fn not_built(self) -> LockError {
        LockError::Unsupported(format!(
            "this build of dlock has no {self:?} backend: enable the `{}` feature of the dlock crate \
             (for the command: cargo install --path dlock-cli --features {})",
            self.feature(),
            self.feature()
        ))
    }
}

/// Connects to the backend the URL names and returns it as a [`Locker`].
///
/// Fails with `InvalidInput` for a malformed URL, `Unsupported` (naming the feature to
/// enable) when the scheme's backend was not compiled in, and `Unavailable` when the
/// server cannot be reached within the connect timeout.
pub async fn connect(url: &str) -> Result<Arc<dyn Locker>, LockError> {
    let scheme = Scheme::of(url)?;
    match scheme {
        Scheme::Memory => Ok(Arc::new(memory_store(url)?.client())),
        #[cfg(feature = "sqlite")]
        Scheme::Sqlite => dlock_sql::connect_any(dlock_sql::SqlConfig::from_url(url)?).await,
        #[cfg(feature = "postgres")]
        Scheme::Postgres => dlock_sql::connect_any(dlock_sql::SqlConfig::from_url(url)?).await,
        #[cfg(feature = "mysql")]
        Scheme::Mysql => dlock_sql::connect_any(dlock_sql::SqlConfig::from_url(url)?).await,
        #[cfg(feature = "redis")]
        Scheme::Redis => Ok(Arc::new(dlock_redis::connect(dlock_redis::RedisConfig::from_url(url)?).await?)),
        #[cfg(feature = "redlock")]
        Scheme::RedLock => {
            Ok(Arc::new(dlock_redis::redlock::connect(dlock_redis::redlock::RedLockConfig::from_url(url)?).await?))
        }
        #[cfg(feature = "zk")]
        Scheme::ZooKeeper => Ok(Arc::new(dlock_zk::connect(dlock_zk::ZkConfig::from_url(url)?).await?)),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Arc::new(dlock_etcd::connect(dlock_etcd::EtcdConfig::from_url(url)?).await?)),
        #[allow(unreachable_patterns)]
        other => Err(other.not_built()),
    }
}

/// The raw baseline of the backend the URL names, for benchmarks: the same backend
/// commands an uncontended acquire+release sends, without dlock's machinery.
pub async fn raw_baseline(url: &str) -> Result<Box<dyn RawBaseline>, LockError> {
    let scheme = Scheme::of(url)?;
    match scheme {
        Scheme::Memory => Ok(Box::new(memory_store(url)?.raw_baseline())),
        #[cfg(feature = "sqlite")]
        Scheme::Sqlite => Ok(Box::new(dlock_sql::raw_baseline(dlock_sql::SqlConfig::from_url(url)?).await?)),
        #[cfg(feature = "postgres")]
        Scheme::Postgres => Ok(Box::new(dlock_sql::raw_baseline(dlock_sql::SqlConfig::from_url(url)?).await?)),
        #[cfg(feature = "mysql")]
        Scheme::Mysql => Ok(Box::new(dlock_sql::raw_baseline(dlock_sql::SqlConfig::from_url(url)?).await?)),
        #[cfg(feature = "redis")]
        Scheme::Redis => Ok(Box::new(dlock_redis::raw_baseline(dlock_redis::RedisConfig::from_url(url)?).await?)),
        #[cfg(feature = "redlock")]
        Scheme::RedLock => {
            Ok(Box::new(dlock_redis::redlock::raw_baseline(dlock_redis::redlock::RedLockConfig::from_url(url)?).await?))
        }
        #[cfg(feature = "zk")]
        Scheme::ZooKeeper => Ok(Box::new(dlock_zk::raw_baseline(dlock_zk::ZkConfig::from_url(url)?).await?)),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Box::new(dlock_etcd::raw_baseline(dlock_etcd::EtcdConfig::from_url(url)?).await?)),
        #[allow(unreachable_patterns)]
        other => Err(other.not_built()),
    }
}

/// `memory://name` names a store shared by every connect in this process.
fn memory_store(url: &str) -> Result<MemoryStore, LockError> {
    static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
    let name = url.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
    if name.contains(['?', '/']) {
        return Err(LockError::InvalidInput(format!("memory URLs take a bare store name: {url:?}")));
    }
    let mut stores = STORES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    Ok(stores.entry(name.to_string()).or_default().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::{LockName, LockOptions};

    #[tokio::test]
    async fn memory_urls_share_a_store_by_name() {
        let a = connect("memory://shared").await.unwrap();
        let b = connect("memory://shared").await.unwrap();
        let c = connect("memory://other").await.unwrap();
        let name = LockName::new("x").unwrap();
        let held = a.acquire(&name, &LockOptions::new()).await.unwrap();
        assert!(b.try_acquire(&name, &LockOptions::new()).await.unwrap().is_none());
        assert!(c.try_acquire(&name, &LockOptions::new()).await.unwrap().is_some());
        held.release().await.unwrap();
    }

    #[tokio::test]
    async fn bad_urls_are_invalid_input() {
        for url in ["", "nothing", "ftp://x", "memory://a/b"] {
            assert!(matches!(connect(url).await, Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[cfg(not(feature = "redlock"))]
    #[tokio::test]
    async fn a_backend_not_built_in_names_its_feature() {
        match connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").await {
            Err(LockError::Unsupported(why)) => assert!(why.contains("`redlock` feature"), "{why}"),
            other => panic!("{:?}", other.err()),
        }
    }
}
