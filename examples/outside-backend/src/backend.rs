//! The dlock backend over the lease server's protocol: what a `Backend` implementation
//! looks like when it is written outside dlock, with nothing but the public API.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::backend::{Attempt, Backend, Client, Release, Renewal, Request, RequestId};
use dlock_core::{
    BackendUrl, Capabilities, ConnectConfig, ConnectOptions, HoldKind, Holder, HostPort, LockError, LockInfo, LockName,
    LostReason, OwnerId, Swept,
};

use crate::protocol::{self, ceil_millis, Reply};
use crate::wire::{Answer, Wire};

/// The port a `leasemap://` URL without one names.
pub const DEFAULT_PORT: u16 = 7420;

/// How many idle names one sweep request asks the server to remove.
const SWEEP_BATCH: u64 = 1_000;

/// A client of a lease server: dlock's [`Client`] over [`LeaseMapBackend`].
pub type LeaseMapLocker = Client<LeaseMapBackend>;

/// Where the lease server is, and the settings every dlock backend shares (timeouts, the
/// keep time of idle names, the background sweep), through [`ConnectConfig`].
///
/// ```
/// use std::time::Duration;
/// use dlock_core::ConnectConfig;
/// use dlock_example_outside_backend::LeaseMapConfig;
///
/// let config = LeaseMapConfig::from_url("leasemap://127.0.0.1:7420?op_timeout=1s&keep_idle=10m")?;
/// assert_eq!(config.server().port, 7420);
/// assert_eq!(config.op_timeout(), Duration::from_secs(1));
/// let same = LeaseMapConfig::new("127.0.0.1", 7420)
///     .with_op_timeout(Duration::from_secs(1))
///     .with_keep_idle(Duration::from_secs(600));
/// assert_eq!(config, same);
/// assert!(LeaseMapConfig::from_url("leasemap://h1,h2").is_err(), "one server only");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseMapConfig {
    server: HostPort,
    common: ConnectOptions,
}

impl LeaseMapConfig {
    /// The server at `host:port`, with the default settings.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        LeaseMapConfig { server: HostPort::new(host, port), common: ConnectOptions::default() }
    }

    /// Reads `leasemap://host[:port][?option=value&...]`, with the options every backend
    /// reads (`connect_timeout`, `op_timeout`, `keep_idle`, `sweep_every`). `InvalidInput`
    /// for anything else: several hosts, credentials, a path, a `prefix` (a server has one
    /// namespace) or an unknown option.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let parsed = BackendUrl::parse(url, DEFAULT_PORT)?;
        if parsed.scheme != crate::SCHEME {
            return Err(parsed.invalid(format!("the scheme is not {}", crate::SCHEME)));
        }
        let [server] = parsed.hosts.as_slice() else { return Err(parsed.invalid("more than one server")) };
        if parsed.user.is_some() || parsed.password.is_some() {
            return Err(parsed.invalid("credentials (the lease server has none)"));
        }
        if !matches!(parsed.path.as_str(), "" | "/") {
            return Err(parsed.invalid("a path (the lease server has one namespace)"));
        }
        if parsed.prefix_given {
            return Err(parsed.invalid("a prefix (the lease server has one namespace)"));
        }
        parsed.reject_extra()?;
        parsed.options.validate()?;
        Ok(LeaseMapConfig { server: server.clone(), common: parsed.options })
    }

    /// The server.
    pub fn server(&self) -> &HostPort {
        &self.server
    }
}

impl ConnectConfig for LeaseMapConfig {
    fn common(&self) -> &ConnectOptions {
        &self.common
    }

    fn common_mut(&mut self) -> &mut ConnectOptions {
        &mut self.common
    }
}

/// Connects to the lease server `config` names (within its connect timeout, checking
/// that it speaks the protocol) and returns a dlock client of it.
///
/// ```
/// use dlock_core::{LockName, LockOptions, Locker};
/// use dlock_example_outside_backend::{connect, LeaseMapConfig, LeaseServer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let server = LeaseServer::start("127.0.0.1:0").await?;
/// let locker = connect(LeaseMapConfig::new("127.0.0.1", server.addr().port())).await?;
/// let name = LockName::new("orders/42")?;
/// let lease = locker.acquire(&name, &LockOptions::new()).await?;
/// assert_eq!(locker.inspect(&name).await?.holder.map(|h| h.token), Some(lease.token()));
/// lease.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(config: LeaseMapConfig) -> Result<LeaseMapLocker, LockError> {
    config.common.validate()?;
    // Errors name the server, as the client's errors do once it is connected.
    let wire = Wire::connect(config.server.clone(), config.common.connect_timeout)
        .await
        .map_err(|err| err.at(|| target(&config.server)))?;
    let backend = LeaseMapBackend { wire, keep_idle: config.common.keep_idle };
    Ok(Client::with_config(backend, config.common.client_config()))
}

/// The [`Backend`] of the lease server: one pipelined connection, opened again when it
/// breaks. Waiters poll (the server sends no wake-ups), guided by the holder's remaining
/// ttl that every busy answer carries.
#[derive(Debug)]
pub struct LeaseMapBackend {
    wire: Wire,
    keep_idle: Duration,
}

/// What the backend keeps about a granted hold: everything the server checks before it
/// renews or releases, so that a stale lease can neither extend nor free a newer hold.
#[derive(Debug, Clone)]
pub struct LeaseMapHold {
    name: LockName,
    owner: OwnerId,
    token: u64,
    /// The acquire call that was granted: a release takes back this grant and no other
    /// of the same owner's.
    grant: RequestId,
}

impl LeaseMapHold {
    /// The hold's fencing token.
    ///
    /// ```
    /// # use dlock_core::backend::{Attempt, Backend, Request, RequestId};
    /// # use dlock_core::{HoldKind, LeaseMode, LockName, OwnerId};
    /// # use dlock_example_outside_backend::{connect, LeaseMapConfig, LeaseServer};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = LeaseServer::start("127.0.0.1:0").await?;
    /// # let locker = connect(LeaseMapConfig::new("127.0.0.1", server.addr().port())).await?;
    /// let request = Request {
    ///     name: LockName::new("jobs/nightly")?,
    ///     owner: OwnerId::new("by-hand")?,
    ///     id: RequestId::new("by-hand", 1),
    ///     mode: LeaseMode::default(),
    ///     blocking: false,
    ///     fair: false,
    ///     kind: HoldKind::Exclusive,
    /// };
    /// let Attempt::Granted { hold, token } = locker.backend().attempt(&request, &mut None).await? else {
    ///     panic!("a fresh name is free");
    /// };
    /// assert_eq!(hold.token(), token.get());
    /// # Ok(()) }
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// A reply the request does not have: the server and this client disagree.
fn unexpected(what: &str, reply: &Reply) -> LockError {
    LockError::backend(format!("the lease server answered {what} with {reply:?}"))
}

#[async_trait]
impl Backend for LeaseMapBackend {
    type Hold = LeaseMapHold;
    /// No queue, no subscription: waiters poll.
    type Ticket = ();

    fn name(&self) -> &'static str {
        crate::DRIVER
    }

    /// What the server does, and nothing more: exclusive holds with watchdog or fixed
    /// leases, extension, re-entrancy by owner. It keeps no queue (no `fifo`, no queue
    /// length), sends no wake-ups (no `notify`), has no shared holds, permits or stored
    /// results. The client refuses what is absent with `Unsupported` before anything is
    /// sent, and the conformance suite checks that it does.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reentrant: true,
            fifo: false,
            notify: false,
            ttl: true,
            fixed: true,
            extend: true,
            queue_length: false,
            results: false,
            shared: false,
            permits: false,
        }
    }

    async fn attempt(&self, req: &Request, _ticket: &mut Option<()>) -> Result<Attempt<LeaseMapHold>, LockError> {
        if req.kind != HoldKind::Exclusive {
            return Err(LockError::Unsupported(format!("{} holds", req.kind.as_str())));
        }
        let request = protocol::Request::Acquire {
            name: req.name.as_str().into(),
            owner: req.owner.as_str().into(),
            grant: req.id.as_str().into(),
            ttl_ms: ceil_millis(req.ttl()),
        };
        match self.wire.call(&request).await?.reply {
            Reply::Granted { token } => Ok(Attempt::Granted {
                hold: LeaseMapHold { name: req.name.clone(), owner: req.owner.clone(), token, grant: req.id.clone() },
                token: dlock_core::FencingToken::new(token),
            }),
            Reply::Busy { ms_left } => Ok(Attempt::Busy { retry_after: Some(Duration::from_millis(ms_left)) }),
            // Only a request given back already is void, and the client never attempts
            // again after a give-back: this is a second delivery the caller gave up on.
            Reply::Void => Err(LockError::backend("the lease server refused an acquire that was given back")),
            other => Err(unexpected("ACQUIRE", &other)),
        }
    }

    /// The acquire may have been granted with its answer lost (a timeout, a connection
    /// that broke): the server takes back exactly that request's grant, and refuses the
    /// request if it arrives late.
    async fn give_back(&self, req: &Request, _ticket: Option<()>) {
        let request = protocol::Request::GiveBack {
            name: req.name.as_str().into(),
            owner: req.owner.as_str().into(),
            grant: req.id.as_str().into(),
            ttl_ms: ceil_millis(req.ttl()),
        };
        if let Err(err) = self.wire.call(&request).await {
            tracing::debug!(lock = %req.name, %err, "leasemap: giving back an attempt failed; its ttl frees it");
        }
    }

    async fn renew(&self, hold: &LeaseMapHold, ttl: Duration) -> Result<Renewal, LockError> {
        let request = protocol::Request::Renew {
            name: hold.name.as_str().into(),
            owner: hold.owner.as_str().into(),
            token: hold.token,
            ttl_ms: ceil_millis(ttl),
        };
        match self.wire.call(&request).await?.reply {
            Reply::Renewed => Ok(Renewal::Renewed),
            Reply::Expired => Ok(Renewal::Lost(LostReason::Expired)),
            Reply::Stolen => Ok(Renewal::Lost(LostReason::Stolen)),
            other => Err(unexpected("RENEW", &other)),
        }
    }

    async fn release(&self, hold: &LeaseMapHold) -> Result<Release, LockError> {
        let request = protocol::Request::Release {
            name: hold.name.as_str().into(),
            owner: hold.owner.as_str().into(),
            token: hold.token,
            grant: hold.grant.as_str().into(),
        };
        match self.wire.call(&request).await? {
            Answer { reply: Reply::Released, .. } => Ok(Release::Released),
            // A first delivery may have released it before its connection broke; this
            // answer cannot tell that from a hold that had already expired.
            Answer { reply: Reply::NotHeld, resent: true } => Err(LockError::unavailable(format!(
                "the connection to {} broke during a release, which may have been applied",
                self.wire.server()
            ))),
            Answer { reply: Reply::NotHeld, resent: false } => Ok(Release::NotHeld),
            Answer { reply, .. } => Err(unexpected("RELEASE", &reply)),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo, LockError> {
        let request = protocol::Request::Inspect { name: name.as_str().into() };
        match self.wire.call(&request).await?.reply {
            Reply::Free => Ok(LockInfo { holder: None, waiters: None }),
            Reply::Held { owner, token, count, ms_left } => Ok(LockInfo {
                holder: Some(Holder {
                    owner: OwnerId::new(owner)?,
                    token: dlock_core::FencingToken::new(token),
                    count,
                    remaining: Some(Duration::from_millis(ms_left)),
                }),
                waiters: None,
            }),
            other => Err(unexpected("INSPECT", &other)),
        }
    }

    /// The server removes names nobody used for this client's keep time and keeps the
    /// highest token it removed as the floor of every new counter, so tokens never go back.
    async fn sweep(&self) -> Result<Swept, LockError> {
        let request = protocol::Request::Sweep { keep_ms: ceil_millis(self.keep_idle), batch: SWEEP_BATCH };
        match self.wire.call(&request).await?.reply {
            Reply::Swept { removed, more } => Ok(Swept { removed, more }),
            other => Err(unexpected("SWEEP", &other)),
        }
    }

    fn target(&self) -> String {
        target(self.wire.server())
    }
}

/// Where a client of `server` keeps its locks (see [`Backend::target`]).
fn target(server: &HostPort) -> String {
    format!("{}@{server}", crate::DRIVER)
}

/// An operator's connection to a lease server, for what no lock client does: remove a
/// hold underneath its holder, count what the server keeps. Each call is bounded by the
/// timeout given at connect.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{HostPort, LockName, LockOptions, Locker};
/// use dlock_example_outside_backend::{connect, Admin, LeaseMapConfig, LeaseServer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let server = LeaseServer::start("127.0.0.1:0").await?;
/// let locker = connect(LeaseMapConfig::new("127.0.0.1", server.addr().port())).await?;
/// let admin = Admin::connect(HostPort::new("127.0.0.1", server.addr().port()), Duration::from_secs(1)).await?;
/// let name = LockName::new("reports/daily")?;
/// let lease = locker.acquire(&name, &LockOptions::new()).await?;
/// assert_eq!(admin.count("reports/").await?, 1);
/// admin.evict(&name).await?;
/// assert!(locker.inspect(&name).await?.holder.is_none());
/// # drop(lease);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Admin {
    wire: Wire,
    timeout: Duration,
}

impl Admin {
    /// Connects to the server at `server` within `timeout`.
    pub async fn connect(server: HostPort, timeout: Duration) -> Result<Self, LockError> {
        Ok(Admin { wire: Wire::connect(server, timeout).await?, timeout })
    }

    /// Removes the hold of `name` underneath its holder, keeping the name's token counter.
    pub async fn evict(&self, name: &LockName) -> Result<(), LockError> {
        match self.call(protocol::Request::Evict { name: name.as_str().into() }).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected("EVICT", &other)),
        }
    }

    /// How many names starting with `prefix` the server keeps anything for (a hold, a
    /// counter, a marker), expired ones not yet swept included.
    pub async fn count(&self, prefix: &str) -> Result<usize, LockError> {
        match self.call(protocol::Request::Count { prefix: prefix.into() }).await? {
            Reply::Count { names } => Ok(usize::try_from(names).unwrap_or(usize::MAX)),
            other => Err(unexpected("COUNT", &other)),
        }
    }

    async fn call(&self, request: protocol::Request) -> Result<Reply, LockError> {
        match tokio::time::timeout(self.timeout, self.wire.call(&request)).await {
            Ok(answer) => Ok(answer?.reply),
            Err(_) => {
                Err(LockError::unavailable(format!("{} did not answer within {:?}", self.wire.server(), self.timeout)))
            }
        }
    }
}
