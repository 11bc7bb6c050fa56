//! Opening the etcd client a backend (or a raw baseline) uses.

use std::time::Duration;

use dlock_core::{ConnectConfig, HostPort, LockError};
use etcd_client::{Certificate, ConnectOptions, GetOptions, Identity, TlsOptions};

use crate::cluster::Cluster;
use crate::config::EtcdConfig;

/// HTTP/2 pings on connections with open streams (watches): a dead connection fails its
/// watches after about interval + timeout instead of hanging them. etcd refuses pings
/// more often than every 5 s, and pings on idle connections.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a failed plaintext connect waits to learn whether the members speak TLS.
const TLS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects, authenticates if the configuration names a user, and reads one key, all
/// within the connect timeout: an unreachable cluster is `Unavailable` now, not at the
/// first lock.
pub(crate) async fn open(config: &EtcdConfig) -> Result<Cluster, LockError> {
    config.validate()?;
    let limit = config.connect_timeout();
    if let Some(client) = config.given_client() {
        let label = format!("the application's client ({})", config.endpoints().join(","));
        let cluster = Cluster::given(client.clone(), label, limit, config.op_timeout() / 2);
        return probe(cluster, config).await;
    }
    let mut options = ConnectOptions::new()
        .with_connect_timeout(limit)
        .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
        .with_keep_alive_while_idle(false)
        // A member cut off from its leader fails requests at once (and ends watches)
        // instead of holding them until the timeout.
        .with_require_leader(true);
    if let Some((user, password)) = config.credentials() {
        options = options.with_user(user.clone(), password.clone()).with_auto_token_refresh(true);
    }
    if config.is_tls() {
        options = options.with_tls(tls_options(config)?);
    }
    // Half the operation timeout: a renewal that hangs that long moves the next requests
    // to another member before the client sends a second renewal beside it.
    let cluster = Cluster::new(config.endpoints(), options, limit, config.op_timeout() / 2);
    probe(cluster, config).await
}

/// Reads one key, so that a cluster that does not answer is `Unavailable` now, or
/// `Refused` when a plaintext client reached members that speak only TLS.
async fn probe(cluster: Cluster, config: &EtcdConfig) -> Result<Cluster, LockError> {
    let probe = format!("{}/", config.prefix()).into_bytes();
    let read =
        cluster.get("connect", config.connect_timeout(), probe, GetOptions::new().with_keys_only().with_limit(1));
    match read.await {
        Ok(_) => Ok(cluster),
        Err(err @ LockError::Unavailable { .. }) if !config.is_tls() => {
            let hosts: Vec<HostPort> = config
                .hosts()
                .iter()
                .filter_map(|host| {
                    host.rsplit_once(':').and_then(|(name, port)| Some(HostPort::new(name, port.parse().ok()?)))
                })
                .collect();
            let instead = "etcds:// (and ca=<pem file> when a private CA signed its certificate)";
            Err(dlock_core::tls::plaintext_refused(&hosts, instead, TLS_PROBE_TIMEOUT).await.unwrap_or(err))
        }
        Err(err) => Err(err),
    }
}

fn tls_options(config: &EtcdConfig) -> Result<TlsOptions, LockError> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| LockError::InvalidInput(format!("cannot read the {what} {}: {e}", path.display())))
    };
    let mut tls = TlsOptions::new();
    tls = match config.ca_file() {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read("CA file", ca)?)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = config.client_identity() {
        tls = tls.identity(Identity::from_pem(read("client certificate", cert)?, read("client key", key)?));
    }
    if let Some(domain) = config.domain() {
        tls = tls.domain_name(domain);
    }
    Ok(tls)
}
