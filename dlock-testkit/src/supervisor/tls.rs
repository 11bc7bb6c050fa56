//! Certificates for TLS tests: a CA, a server certificate for 127.0.0.1 and localhost,
//! and a client certificate, written as PEM files into a temporary directory.

use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A throwaway PKI: `ca.pem`; `server.pem` + `server-key.pem` (for `127.0.0.1` and
/// `localhost`, or the names given to [`TestPki::for_server`]); `client.pem` + `client-key.pem` (common name `client_cn`).
pub struct TestPki {
    dir: TempDir,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

impl TestPki {
    /// Makes the CA and both certificates.
    pub fn new(client_cn: &str) -> io::Result<Self> {
        Self::for_server(client_cn, &["127.0.0.1", "localhost"])
    }

    /// Makes the CA and both certificates, the server's for `server_names` only (so that a
    /// client that connects by another name can be shown to refuse it).
    pub fn for_server(client_cn: &str, server_names: &[&str]) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("dlock-pki-").tempdir()?;
        let fail = |e: rcgen::Error| io::Error::other(format!("making a test certificate: {e}"));
        let ca_key = KeyPair::generate().map_err(fail)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        ca.distinguished_name.push(DnType::CommonName, "dlock test CA");
        let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem())?;
        let issuer = Issuer::new(ca, ca_key);

        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose, file: &str| -> io::Result<()> {
            let key = KeyPair::generate().map_err(fail)?;
            let mut params = CertificateParams::new(names).map_err(fail)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &issuer).map_err(fail)?;
            std::fs::write(dir.path().join(format!("{file}.pem")), cert.pem())?;
            std::fs::write(dir.path().join(format!("{file}-key.pem")), key.serialize_pem())
        };
        leaf(
            server_names.iter().map(|name| name.to_string()).collect(),
            "dlock test server",
            ExtendedKeyUsagePurpose::ServerAuth,
            "server",
        )?;
        leaf(Vec::new(), client_cn, ExtendedKeyUsagePurpose::ClientAuth, "client")?;
        Ok(TestPki { dir })
    }

    /// The directory of the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// One of the PEM files by name, e.g. `ca.pem`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
