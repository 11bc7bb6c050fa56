//! What every backend that speaks TLS shares: one choice of crypto provider, one reading
//! of what a failed handshake refused ([`TlsRefusal`]), and one probe of whether a port
//! speaks TLS ([`speaks_tls`]), for the plaintext client a TLS-only server hangs up on.
//!
//! rustls builds its configurations on a process-wide crypto provider, which it picks by
//! itself only when exactly one is compiled in. The backends' client libraries pull in
//! different ones (ring for most, aws-lc-rs for ZooKeeper's), and an application's own
//! dependencies may add either, so with two compiled in, the first TLS handshake that
//! relies on the default would panic. Every backend calls [`install_crypto_provider`]
//! before it opens a TLS connection.

/// Installs ring as the process's rustls crypto provider, unless one is installed
/// already (by the application, or by another backend first): that one serves as well.
///
/// ```
/// dlock_core::tls::install_crypto_provider();
/// assert!(rustls::crypto::CryptoProvider::get_default().is_some());
/// ```
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one meanwhile: its error says so, and its choice stands.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A client configuration that trusts no certificate: a handshake with it can only fail,
/// but how it fails tells what the server speaks (a certificate presented means TLS).
/// `None` only if the crypto provider supports none of rustls' default protocol versions.
pub fn trusting_nothing() -> Option<std::sync::Arc<rustls::ClientConfig>> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Some(std::sync::Arc::new(config))
}

/// Whether the server at `host:port` answers a TLS handshake within `within`: it
/// presents a certificate (which [`trusting_nothing`] refuses) or refuses the handshake
/// with a TLS alert. `false` when nothing listens, nothing answers in time, or the answer
/// is not TLS. A plaintext client of a server that speaks only TLS sees a connection
/// closed or reset, as it would from an overloaded server; this tells the two apart,
/// so that the error can say which scheme to use.
///
/// ```no_run
/// # async fn f() {
/// if dlock_core::tls::speaks_tls("redis.internal", 6380, std::time::Duration::from_secs(1)).await {
///     eprintln!("redis.internal:6380 speaks TLS: connect with rediss://");
/// }
/// # }
/// ```
pub async fn speaks_tls(host: &str, port: u16, within: std::time::Duration) -> bool {
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        return false;
    };
    let handshake = async {
        let probe = trusting_nothing()?;
        let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        tokio_rustls::TlsConnector::from(probe).connect(name, tcp).await.err()
    };
    match tokio::time::timeout(within, handshake).await {
        Ok(Some(err)) => {
            matches!(TlsRefusal::find(&err), Some((_, refusal)) if refusal != Some(TlsRefusal::NotTls))
        }
        _ => false,
    }
}

/// For a plaintext client whose connection failed: a refusal naming the first of `hosts`
/// that [speaks TLS](speaks_tls) on its port, saying to connect with
/// `instead` (the TLS scheme, and the option naming a private CA); `None` when none does,
/// so that the failure stays what it was. The hosts are probed all at once, for at most
/// `within`.
///
/// ```no_run
/// # async fn f() {
/// let hosts = [dlock_core::HostPort::new("127.0.0.1", 6380)];
/// let instead = "rediss:// (and tls_ca=<pem file> when a private CA signed its certificate)";
/// if let Some(err) = dlock_core::tls::plaintext_refused(&hosts, instead, std::time::Duration::from_secs(1)).await {
///     assert!(err.to_string().contains("127.0.0.1:6380 speaks TLS on this port: connect with rediss://"));
/// }
/// # }
/// ```
pub async fn plaintext_refused(
    hosts: &[crate::HostPort],
    instead: &str,
    within: std::time::Duration,
) -> Option<crate::LockError> {
    let probes =
        hosts.iter().map(|host| async move { speaks_tls(&host.host, host.port, within).await.then_some(host) });
    let host = futures::future::join_all(probes).await.into_iter().flatten().next()?;
    Some(crate::LockError::refused(format!("{host} speaks TLS on this port: connect with {instead}"), None))
}

/// What a TLS handshake refused, told apart the same way for every backend; each backend
/// words the advice in its own option names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsRefusal {
    /// The server's certificate is not signed by a CA the client trusts (a CA of the same
    /// name but another key shows as a bad signature, and counts here too).
    UnknownCa,
    /// The server's certificate does not name the host the client connected to.
    OtherName,
    /// The client refused the server's certificate for another reason (expired, ...).
    ServerCertificate,
    /// The server refused the client's certificate, or its lack of one.
    ClientCertificate,
    /// The two sides share no TLS version or cipher suite.
    NoCommonVersion,
    /// The peer answered with something that is not TLS.
    NotTls,
}

impl TlsRefusal {
    /// Classifies a rustls error; `None` for failures that may pass (a server's internal
    /// error, a handshake cut short).
    ///
    /// ```
    /// use dlock_core::tls::TlsRefusal;
    /// use rustls::{CertificateError, Error};
    ///
    /// let unknown = Error::InvalidCertificate(CertificateError::UnknownIssuer);
    /// assert_eq!(TlsRefusal::of(&unknown), Some(TlsRefusal::UnknownCa));
    /// assert_eq!(TlsRefusal::of(&Error::HandshakeNotComplete), None);
    /// ```
    pub fn of(err: &rustls::Error) -> Option<TlsRefusal> {
        use rustls::{AlertDescription as Alert, CertificateError as Cert, Error};
        Some(match err {
            Error::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => TlsRefusal::UnknownCa,
            Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
                TlsRefusal::OtherName
            }
            Error::InvalidCertificate(_) => TlsRefusal::ServerCertificate,
            Error::AlertReceived(
                Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::AccessDenied
                | Alert::CertificateRequired,
            ) => TlsRefusal::ClientCertificate,
            Error::AlertReceived(Alert::HandshakeFailure | Alert::ProtocolVersion | Alert::InsufficientSecurity)
            | Error::PeerIncompatible(_) => TlsRefusal::NoCommonVersion,
            Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => TlsRefusal::NotTls,
            _ => return None,
        })
    }

    /// The rustls error in an error's chain, also where an I/O error carries it (as
    /// client libraries report a failed handshake), and what it refused.
    pub fn find<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<(&'e rustls::Error, Option<TlsRefusal>)> {
        let mut cause = Some(err);
        while let Some(err) = cause {
            let found = err.downcast_ref::<rustls::Error>().or_else(|| {
                err.downcast_ref::<std::io::Error>()
                    .and_then(|io| io.get_ref())
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            });
            if let Some(tls) = found {
                return Some((tls, TlsRefusal::of(tls)));
            }
            cause = err.source();
        }
        None
    }
}
