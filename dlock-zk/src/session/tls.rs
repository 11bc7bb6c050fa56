//! TLS for sessions (`zks://`): the client library's options, built from the configured
//! files each time a session opens (so that renewed certificates are picked up), and a
//! handshake of this crate's own that tells why a connection failed.
//!
//! The client library reports a handshake that failed as a lost connection, exactly as it
//! reports a server that is down, and retries. A refused certificate would then look like
//! an outage until the connect timeout. So when a connect fails, [`diagnose`] shakes hands
//! with each member itself, with the same trust and identity, and turns a certificate the
//! client refuses, or one the server refuses, into [`LockError::Refused`] at once. A
//! plaintext client probes too: a member that answers a TLS handshake is a TLS port, which
//! a `zk://` URL cannot use.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::tls::TlsRefusal;
use dlock_core::{HostPort, LockError};
use futures::stream::{FuturesUnordered, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use zookeeper_client as zk;

use crate::config::ZkConfig;

/// The longest a probe of the members takes.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a probe whose handshake went through waits for an alert: a TLS 1.3 server
/// judges the client's certificate only after the client has finished its part of the
/// handshake, and says so in the first record it sends.
const ALERT_WAIT: Duration = Duration::from_millis(300);

/// The TLS material of one session: the client library's options, and the same trust and
/// identity as a rustls configuration for [`diagnose`].
pub(crate) struct Tls {
    options: zk::TlsOptions,
    probe: Arc<ClientConfig>,
    /// Whether the CA is the system's roots (no `ca` option): the advice differs.
    system_roots: bool,
}

impl Tls {
    /// Reads the configured files (`None` for a plaintext configuration). A file that
    /// cannot be read or holds nothing usable is `InvalidInput` naming its option.
    pub(crate) fn load(config: &ZkConfig) -> Result<Option<Tls>, LockError> {
        if !config.is_tls() {
            return Ok(None);
        }
        dlock_core::tls::install_crypto_provider();
        let (ca, ca_source) = match config.ca_file() {
            Some(path) => (read("ca", path)?, format!("the CA file (ca={})", path.display())),
            None => (system_roots()?, "the system's root certificates".to_string()),
        };
        let unusable = |what: &str, err: &dyn std::fmt::Display| {
            LockError::InvalidInput(format!("{what} holds nothing usable for TLS: {err}"))
        };
        let mut options = zk::TlsOptions::new().with_pem_ca(&ca).map_err(|e| unusable(&ca_source, &e))?;
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_slice_iter(ca.as_bytes()).filter_map(Result::ok);
        roots.add_parsable_certificates(certs);
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(LockError::backend)?
            .with_root_certificates(roots);
        let probe = match config.client_identity() {
            Some((cert_path, key_path)) => {
                let what = format!(
                    "the client certificate (cert={}) or its key (key={})",
                    cert_path.display(),
                    key_path.display()
                );
                let (cert, key) = (read("cert", cert_path)?, read("key", key_path)?);
                options = options.with_pem_identity(&cert, &key).map_err(|e| unusable(&what, &e))?;
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| unusable(&what, &e))?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| unusable(&what, &e))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| unusable(&what, &e))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Some(Tls { options, probe: Arc::new(probe), system_roots: config.ca_file().is_none() }))
    }

    /// The client library's options.
    pub(crate) fn options(&self) -> zk::TlsOptions {
        self.options.clone()
    }
}

fn read(option: &str, path: &Path) -> Result<String, LockError> {
    std::fs::read_to_string(path).map_err(|e| {
        LockError::InvalidInput(format!("cannot read the file of option {option} ({}): {e}", path.display()))
    })
}

/// The system's roots as PEM text, which is all the client library takes.
fn system_roots() -> Result<String, LockError> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(LockError::InvalidInput(format!(
            "no CA to trust: the system has no root certificates ({}); name one with ca=<pem file>",
            if errors.is_empty() { "none found".to_string() } else { errors.join("; ") }
        )));
    }
    let pems: Vec<pem::Pem> = found.certs.iter().map(|cert| pem::Pem::new("CERTIFICATE", cert.to_vec())).collect();
    Ok(pem::encode_many(&pems))
}

/// What probing the members told.
pub(crate) enum Verdict {
    /// A member refused this client or was refused by it, for how it connects.
    Refused(LockError),
    /// A member answered, and nothing showed a refusal: the failure is something else,
    /// perhaps with a guess at what (a TLS handshake the server cut short).
    Answered(Option<String>),
    /// No member could be reached, or none answered in time.
    Unreached,
}

/// Shakes hands with every member (all at once, until `until`): with the session's TLS
/// configuration for a TLS client, and with one that trusts nothing for a plaintext
/// client (any certificate a member presents then shows that it speaks TLS).
pub(crate) async fn diagnose(config: &ZkConfig, tls: Option<&Tls>, until: Instant) -> Verdict {
    let probe = match tls {
        Some(tls) => tls.probe.clone(),
        None => match dlock_core::tls::trusting_nothing() {
            Some(probe) => probe,
            None => return Verdict::Unreached,
        },
    };
    // A member that accepts connections and then says nothing must not hold the session's
    // connect up until its deadline: a probe that gives up is asked again after the next
    // failed attempt.
    let until = until.min(Instant::now() + PROBE_TIMEOUT);
    let mut probes: FuturesUnordered<_> = config
        .hosts()
        .iter()
        .map(|host| {
            let probe = probe.clone();
            async move {
                match tokio::time::timeout_at(until.into(), handshake(probe, host)).await {
                    Ok(outcome) => judge(outcome, host, tls),
                    Err(_) => Verdict::Unreached,
                }
            }
        })
        .collect();
    let mut verdict = Verdict::Unreached;
    while let Some(each) = probes.next().await {
        match (each, &verdict) {
            (Verdict::Refused(err), _) => return Verdict::Refused(err),
            (Verdict::Answered(hint), Verdict::Unreached | Verdict::Answered(None)) => {
                verdict = Verdict::Answered(hint)
            }
            _ => {}
        }
    }
    verdict
}

/// How a probe ended: `Err(None)` when no TCP connection was made, `Err(Some(_))` when the
/// handshake (or the wait for an alert after it) failed.
type Outcome = Result<(), Option<io::Error>>;

async fn handshake(probe: Arc<ClientConfig>, host: &HostPort) -> Outcome {
    let name = ServerName::try_from(host.host.clone()).map_err(|e| Some(io::Error::other(e)))?;
    let tcp = TcpStream::connect((host.host.as_str(), host.port)).await.map_err(|_| None)?;
    let mut stream = TlsConnector::from(probe).connect(name, tcp).await.map_err(Some)?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(ALERT_WAIT, stream.read(&mut byte)).await {
        Ok(Err(err)) => Err(Some(err)),
        _ => Ok(()),
    }
}

fn judge(outcome: Outcome, host: &HostPort, tls: Option<&Tls>) -> Verdict {
    let err = match outcome {
        Ok(()) => return Verdict::Answered(None),
        Err(None) => return Verdict::Unreached,
        Err(Some(err)) => err,
    };
    let Some((tls_error, _)) = TlsRefusal::find(&err) else {
        // The connection broke without a TLS error. A TLS server ends a handshake it
        // refuses with an alert; a plaintext ZooKeeper closes the connection on the
        // client's hello, but so may an overloaded server (too many connections): a guess
        // for the message, not a refusal.
        let hint = tls.map(|_| {
            format!("{host} closed the connection during the TLS handshake: is that its plaintext client port (zk://)?")
        });
        return Verdict::Answered(hint);
    };
    let why = match tls {
        Some(tls) => match why_refused(tls_error, host, tls) {
            Some(why) => why,
            None => return Verdict::Answered(None),
        },
        None => match TlsRefusal::of(tls_error) {
            // A member that sends records rustls cannot read does not speak TLS either.
            Some(TlsRefusal::NotTls) => return Verdict::Answered(None),
            _ => format!(
                "{host} speaks TLS on this port: connect with zks:// (and ca=<pem file> when a private CA signed its \
                 certificate)"
            ),
        },
    };
    Verdict::Refused(LockError::refused(why, Some(Box::new(err))))
}

/// Why a TLS handshake with `host` failed, in words that say what to change; `None` for
/// failures that may pass (a server's internal error, a handshake cut short).
fn why_refused(err: &rustls::Error, host: &HostPort, tls: &Tls) -> Option<String> {
    let trusted = if tls.system_roots { "the system's roots" } else { "the ca= file" };
    Some(match TlsRefusal::of(err)? {
        TlsRefusal::UnknownCa => format!(
            "the certificate of {host} is not signed by a CA this client trusts ({trusted}): name its CA with \
             ca=<pem file>"
        ),
        TlsRefusal::OtherName => {
            format!("the certificate of {host} does not name the host {}: connect by a name it has", host.host)
        }
        TlsRefusal::ServerCertificate => format!("this client refused the certificate of {host}"),
        TlsRefusal::ClientCertificate => format!(
            "{host} refused this client's certificate, or its lack of one: give one it trusts with cert= and key="
        ),
        TlsRefusal::NoCommonVersion => {
            format!("{host} ended the TLS handshake ({err}): it accepts none of this client's TLS versions or ciphers")
        }
        TlsRefusal::NotTls => format!("{host} does not speak TLS on this port (it answered with something else)"),
        _ => return None,
    })
}
