//! What every backend that speaks TLS shares: one choice of crypto provider, and one
//! reading of what a failed handshake refused ([`TlsRefusal`]).
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
