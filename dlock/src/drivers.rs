//! The table of backends a URL can name: one row per driver, with its schemes, the cargo
//! feature that builds it, and how to connect.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use dlock_core::memory::MemoryStore;
#[cfg(feature = "bench")]
use dlock_core::RawBaseline;
use dlock_core::{LockError, Locker};

/// A connect in progress, as a driver's connect function returns it.
pub type Connecting = Pin<Box<dyn Future<Output = Result<Arc<dyn Locker>, LockError>> + Send>>;
#[cfg(feature = "bench")]
type Baselining = Pin<Box<dyn Future<Output = Result<Box<dyn RawBaseline>, LockError>> + Send>>;

/// How a driver connects; `None` when its feature was not compiled in.
#[derive(Clone, Copy)]
struct Built {
    connect: fn(String) -> Connecting,
    /// The raw baseline of `dlock bench`, which only the built-in drivers have.
    #[cfg(feature = "bench")]
    baseline: Option<fn(String) -> Baselining>,
}

/// One backend a URL can name.
///
/// ```
/// let driver = dlock::driver("redis+sentinel://10.0.0.1:26379/orders")?;
/// assert_eq!(driver.name(), "redis");
/// assert_eq!(driver.feature(), Some("redis"));
/// assert!(dlock::driver("ftp://example.com").is_err());
/// # Ok::<(), dlock::LockError>(())
/// ```
pub struct Driver {
    name: &'static str,
    schemes: &'static [&'static str],
    feature: Option<&'static str>,
    built: Option<Built>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .field("built", &self.is_built())
            .finish()
    }
}

impl Driver {
    /// The backend's short name, as its lockers report it (`"redis"`, `"postgres"`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The URL schemes that name this backend.
    pub fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// The cargo feature of `dlock` that builds this backend in; `None` for the in-process
    /// memory backend, which is always built, and for drivers added with
    /// [`register_driver`].
    pub fn feature(&self) -> Option<&'static str> {
        self.feature
    }

    /// Whether this build of dlock contains the backend.
    pub fn is_built(&self) -> bool {
        self.built.is_some()
    }

    fn built(&self) -> Result<Built, LockError> {
        self.built.ok_or_else(|| {
            let feature = self.feature.unwrap_or_default();
            LockError::Unsupported(format!(
                "this build of dlock has no {} backend: enable the `{feature}` feature of the dlock crate \
                 (for the command: cargo install --path dlock-cli --features {feature})",
                self.name
            ))
        })
    }
}

macro_rules! built {
    ($feature:literal, $connect:expr, $baseline:expr) => {{
        #[cfg(feature = $feature)]
        let built = Some(Built {
            connect: |url| Box::pin(async move { $connect(url).await }),
            #[cfg(feature = "bench")]
            baseline: Some(|url| Box::pin(async move { $baseline(url).await })),
        });
        #[cfg(not(feature = $feature))]
        let built = None;
        built
    }};
}

/// Every backend, built in or not (so that a URL naming a missing one says which feature
/// to enable).
pub static DRIVERS: &[Driver] = &[
    Driver {
        name: "memory",
        schemes: &["memory"],
        feature: None,
        built: Some(Built {
            connect: |url| Box::pin(async move { Ok(Arc::new(memory_store(&url)?.client()) as Arc<dyn Locker>) }),
            #[cfg(feature = "bench")]
            baseline: Some(|url| {
                Box::pin(async move { Ok(Box::new(memory_store(&url)?.raw_baseline()) as Box<dyn RawBaseline>) })
            }),
        }),
    },
    Driver {
        name: "sqlite",
        schemes: &["sqlite"],
        feature: Some("sqlite"),
        built: built!("sqlite", sql, sql_baseline),
    },
    Driver {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        feature: Some("postgres"),
        built: built!("postgres", sql, sql_baseline),
    },
    Driver {
        name: "mysql",
        schemes: &["mysql", "mariadb"],
        feature: Some("mysql"),
        built: built!("mysql", sql, sql_baseline),
    },
    Driver {
        name: "redis",
        schemes: &["redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"],
        feature: Some("redis"),
        built: built!("redis", redis, redis_baseline),
    },
    Driver {
        name: "redlock",
        schemes: &["redlock", "redlocks"],
        feature: Some("redlock"),
        built: built!("redlock", redlock, redlock_baseline),
    },
    Driver { name: "zookeeper", schemes: &["zk", "zks"], feature: Some("zk"), built: built!("zk", zk, zk_baseline) },
    Driver {
        name: "etcd",
        schemes: &["etcd", "etcds"],
        feature: Some("etcd"),
        built: built!("etcd", etcd, etcd_baseline),
    },
];

/// The driver of the backend `url` names, or `InvalidInput` when its scheme names none.
/// The scheme is the text before the first `:` (`sqlite::memory:` is SQLite).
pub fn driver(url: &str) -> Result<&'static Driver, LockError> {
    let scheme = match url.split_once(':') {
        Some((scheme, _)) if !scheme.is_empty() => scheme.to_ascii_lowercase(),
        _ => return Err(LockError::InvalidInput(format!("not a backend URL (no scheme): {url:?}"))),
    };
    drivers()
        .into_iter()
        .find(|driver| driver.schemes.contains(&scheme.as_str()))
        .ok_or_else(|| LockError::InvalidInput(format!("no backend for the scheme {scheme:?} in {url:?}")))
}

/// Drivers added by [`register_driver`], kept for the life of the process.
static REGISTERED: RwLock<Vec<&'static Driver>> = RwLock::new(Vec::new());

/// Every driver a URL can name: the built-in ones ([`DRIVERS`]), then those added with
/// [`register_driver`].
pub fn drivers() -> Vec<&'static Driver> {
    let registered = REGISTERED.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    DRIVERS.iter().chain(registered.iter().copied()).collect()
}

/// Adds a backend that lives outside this crate, so that [`connect`] (and the `dlock`
/// command built on it, see `dlock_cli::main`) reach it by URL: `connect` gets the
/// whole URL. Registering is for the life of the process.
///
/// Fails with `InvalidInput` when `name` or one of `schemes` is already taken, or when
/// `schemes` is empty or a scheme is not lower-case ASCII letters, digits, `+`, `-` or
/// `.` (what a URL scheme may hold).
///
/// ```
/// use std::sync::Arc;
/// use dlock::{memory::MemoryStore, Locker};
///
/// fn connect(_url: String) -> dlock::Connecting {
///     Box::pin(async { Ok(Arc::new(MemoryStore::new().client()) as Arc<dyn Locker>) })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::LockError> {
/// dlock::register_driver("toy", &["toy"], connect)?;
/// assert_eq!(dlock::connect("toy://anywhere").await?.backend_name(), "memory");
/// assert!(dlock::register_driver("toy-again", &["toy"], connect).is_err(), "the scheme is taken");
/// assert!(dlock::register_driver("redis", &["myredis"], connect).is_err(), "so is the name");
/// # Ok(()) }
/// ```
pub fn register_driver(
    name: &'static str,
    schemes: &'static [&'static str],
    connect: fn(String) -> Connecting,
) -> Result<(), LockError> {
    let valid = |scheme: &&str| {
        !scheme.is_empty()
            && scheme.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
    };
    if schemes.is_empty() || !schemes.iter().all(valid) {
        return Err(LockError::InvalidInput(format!(
            "a driver needs URL schemes of lower-case letters, digits, '+', '-' or '.': {schemes:?}"
        )));
    }
    let mut registered = REGISTERED.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    for known in DRIVERS.iter().chain(registered.iter().copied()) {
        if known.name == name {
            return Err(LockError::InvalidInput(format!("a driver named {name:?} exists already")));
        }
        if let Some(taken) = schemes.iter().find(|s| known.schemes.contains(s)) {
            return Err(LockError::InvalidInput(format!("the scheme {taken:?} belongs to the {} driver", known.name)));
        }
    }
    let built = Built {
        connect,
        #[cfg(feature = "bench")]
        baseline: None,
    };
    registered.push(Box::leak(Box::new(Driver { name, schemes, feature: None, built: Some(built) })));
    Ok(())
}

/// Connects to the backend the URL names and returns it as a [`Locker`].
///
/// Fails with `InvalidInput` for a malformed URL, `Unsupported` (naming the feature to
/// enable) when the scheme's backend was not compiled in, and `Unavailable` when the
/// server cannot be reached within the connect timeout.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::LockError> {
/// let locker = dlock::connect("memory://orders").await?;
/// assert_eq!(locker.backend_name(), "memory");
/// assert!(matches!(dlock::connect("ftp://example.com").await, Err(dlock::LockError::InvalidInput(_))));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Locker>, LockError> {
    (driver(url)?.built()?.connect)(url.to_string()).await
}

/// The raw baseline of the backend the URL names, for benchmarks: the same backend
/// commands an uncontended acquire+release sends, without dlock's machinery (with the
/// `bench` feature).
#[cfg(feature = "bench")]
pub async fn raw_baseline(url: &str) -> Result<Box<dyn RawBaseline>, LockError> {
    let driver = driver(url)?;
    let baseline = driver.built()?.baseline.ok_or_else(|| {
        LockError::Unsupported(format!("the {} driver has no raw baseline to benchmark against", driver.name))
    })?;
    baseline(url.to_string()).await
}

/// `memory://name` names a store shared by every connect in this process.
fn memory_store(url: &str) -> Result<MemoryStore, LockError> {
    static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
    let name = url.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
    if name.contains(['?', '/']) {
        return Err(LockError::InvalidInput(format!("memory URLs take a bare store name: {url:?}")));
    }
    let mut stores = dlock_core::backend::lock_unpoisoned(STORES.get_or_init(Default::default));
    Ok(stores.entry(name.to_string()).or_default().clone())
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn sql(url: String) -> Result<Arc<dyn Locker>, LockError> {
    dlock_sql::connect_any(dlock_sql::SqlConfig::from_url(&url)?).await
}

#[cfg(all(feature = "bench", any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
async fn sql_baseline(url: String) -> Result<Box<dyn RawBaseline>, LockError> {
    Ok(Box::new(dlock_sql::raw_baseline(dlock_sql::SqlConfig::from_url(&url)?).await?))
}

#[cfg(feature = "redis")]
async fn redis(url: String) -> Result<Arc<dyn Locker>, LockError> {
    Ok(Arc::new(dlock_redis::connect(dlock_redis::RedisConfig::from_url(&url)?).await?))
}

#[cfg(all(feature = "bench", feature = "redis"))]
async fn redis_baseline(url: String) -> Result<Box<dyn RawBaseline>, LockError> {
    Ok(Box::new(dlock_redis::raw_baseline(dlock_redis::RedisConfig::from_url(&url)?).await?))
}

#[cfg(feature = "redlock")]
async fn redlock(url: String) -> Result<Arc<dyn Locker>, LockError> {
    use dlock_redis::redlock;
    Ok(Arc::new(redlock::connect(redlock::RedLockConfig::from_url(&url)?).await?))
}

#[cfg(all(feature = "bench", feature = "redlock"))]
async fn redlock_baseline(url: String) -> Result<Box<dyn RawBaseline>, LockError> {
    use dlock_redis::redlock;
    Ok(Box::new(redlock::raw_baseline(redlock::RedLockConfig::from_url(&url)?).await?))
}

#[cfg(feature = "zk")]
async fn zk(url: String) -> Result<Arc<dyn Locker>, LockError> {
    Ok(Arc::new(dlock_zk::connect(dlock_zk::ZkConfig::from_url(&url)?).await?))
}

#[cfg(all(feature = "bench", feature = "zk"))]
async fn zk_baseline(url: String) -> Result<Box<dyn RawBaseline>, LockError> {
    Ok(Box::new(dlock_zk::raw_baseline(dlock_zk::ZkConfig::from_url(&url)?).await?))
}

#[cfg(feature = "etcd")]
async fn etcd(url: String) -> Result<Arc<dyn Locker>, LockError> {
    Ok(Arc::new(dlock_etcd::connect(dlock_etcd::EtcdConfig::from_url(&url)?).await?))
}

#[cfg(all(feature = "bench", feature = "etcd"))]
async fn etcd_baseline(url: String) -> Result<Box<dyn RawBaseline>, LockError> {
    Ok(Box::new(dlock_etcd::raw_baseline(dlock_etcd::EtcdConfig::from_url(&url)?).await?))
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
        for url in ["", "nothing", ":x", "ftp://x", "memory://a/b"] {
            assert!(matches!(connect(url).await, Err(LockError::InvalidInput(_))), "{url}");
        }
    }

    #[test]
    fn every_scheme_names_one_driver() {
        let mut seen = std::collections::HashSet::new();
        for driver in DRIVERS {
            for scheme in driver.schemes() {
                assert!(seen.insert(*scheme), "{scheme} is listed twice");
                assert_eq!(super::driver(&format!("{}://x", scheme.to_uppercase())).unwrap().name(), driver.name());
            }
        }
        assert_eq!(driver("sqlite::memory:").unwrap().name(), "sqlite");
    }

    #[test]
    fn the_table_knows_what_this_build_holds() {
        for (name, built) in [
            ("memory", true),
            ("sqlite", cfg!(feature = "sqlite")),
            ("postgres", cfg!(feature = "postgres")),
            ("mysql", cfg!(feature = "mysql")),
            ("redis", cfg!(feature = "redis")),
            ("redlock", cfg!(feature = "redlock")),
            ("zookeeper", cfg!(feature = "zk")),
            ("etcd", cfg!(feature = "etcd")),
        ] {
            let driver = DRIVERS.iter().find(|d| d.name() == name).unwrap();
            assert_eq!(driver.is_built(), built, "{name}");
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
