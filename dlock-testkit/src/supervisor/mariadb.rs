//! MariaDB servers on free loopback ports, each in its own copy of a cached data directory.
//!
//! `mariadb-install-db` is slow, so one template data directory is made per machine (see
//! [`cached`](super::cached())) and copied for every server. The server runs as the current
//! user (`--user=root` when that is root), with a passwordless `root` account reachable
//! over TCP, small buffers, and commits written to the OS at every commit so that a kill -9
//! loses nothing.

use std::io;
use std::path::PathBuf;
use std::process::Command;

use super::{cached, copy_tree, start_on_free_port, succeeded, Kind, Server};

/// MariaDB as a [`Server`] kind.
#[derive(Debug)]
pub struct MariaDb;

impl Kind for MariaDb {}

/// A running MariaDB server with its own data directory.
pub type MariaDbServer = Server<MariaDb>;

fn program(name: &str) -> io::Result<PathBuf> {
    super::program(name, &["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/mysql/bin"])
}

fn user() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into())
}

/// Options shared by the template's bootstrap and every server, so both agree on the
/// InnoDB files.
fn common_args() -> Vec<String> {
    [
        "--innodb-buffer-pool-size=16M",
        "--innodb-log-file-size=16M",
        "--innodb-log-buffer-size=1M",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-doublewrite=0",
        "--innodb-flush-method=nosync",
        "--performance-schema=OFF",
        "--skip-log-bin",
        "--key-buffer-size=1M",
        "--character-set-server=utf8mb4",
    ]
    .map(String::from)
    .to_vec()
}

fn template() -> io::Result<PathBuf> {
    let install = program("mariadb-install-db").or_else(|_| program("mysql_install_db"))?;
    cached("mariadb-template-v2", |scratch| {
        std::fs::create_dir_all(scratch)?;
        let out = Command::new(&install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", scratch.display()))
            .arg(format!("--user={}", user()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .args(common_args())
            .current_dir("/")
            .output()?;
        succeeded("mariadb-install-db", out)?;
        // A database is a directory of the data directory: this one holds the tests' tables.
        std::fs::create_dir_all(scratch.join("dlock"))?;
        Ok(())
    })
}

/// What a MariaDB server that accepts TLS connections only
/// (`require_secure_transport=ON`) needs: its certificate and key, and the CA of client
/// certificates.
#[derive(Debug, Clone)]
pub struct MariaDbTls {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that signs client certificates (PEM).
    pub client_ca: PathBuf,
}

impl Server<MariaDb> {
    /// Starts a MariaDB server on a free port, with room for `max_connections` sessions.
    pub fn start(max_connections: u32) -> io::Result<Self> {
        Self::start_with(max_connections, None)
    }

    /// Starts a MariaDB server that refuses connections without TLS over TCP (the Unix
    /// socket `mysqld.sock` in [`Server::dir`] stays open, for the tests' setup).
    pub fn start_tls(max_connections: u32, tls: &MariaDbTls) -> io::Result<Self> {
        Self::start_with(max_connections, Some(tls))
    }

    fn start_with(max_connections: u32, tls: Option<&MariaDbTls>) -> io::Result<Self> {
        let mariadbd = program("mariadbd").or_else(|_| program("mysqld"))?;
        let template = template()?;
        start_on_free_port(|port| {
            let dir = tempfile::Builder::new().prefix("dlock-mariadb-").tempdir()?;
            let data = dir.path().join("data");
            copy_tree(&template, &data)?;
            let mut args = vec![
                "--no-defaults".to_string(),
                format!("--datadir={}", data.display()),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={}", dir.path().join("mysqld.sock").display()),
                format!("--pid-file={}", dir.path().join("mysqld.pid").display()),
                format!("--tmpdir={}", dir.path().display()),
                format!("--user={}", user()),
                format!("--max-connections={max_connections}"),
                "--skip-name-resolve".into(),
                "--thread-stack=256K".into(),
            ];
            args.extend(common_args());
            if let Some(tls) = tls {
                args.extend([
                    format!("--ssl-cert={}", tls.cert.display()),
                    format!("--ssl-key={}", tls.key.display()),
                    format!("--ssl-ca={}", tls.client_ca.display()),
                    "--require-secure-transport=ON".into(),
                ]);
            }
            Server::spawn(MariaDb, "mariadbd", &mariadbd, args, port, dir)
        })
    }

    /// `mysql://root@127.0.0.1:<port>/dlock`.
    pub fn url(&self) -> String {
        format!("mysql://root@{}/dlock", self.addr())
    }
}
