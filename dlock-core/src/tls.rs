//! The one choice of TLS crypto provider for every backend.
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
