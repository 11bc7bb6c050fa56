//! PostgreSQL servers on free loopback ports, each in its own copy of a cached data directory.
//!
//! `initdb` is slow, so one template data directory is made per machine (see
//! [`cached`](super::cached())) and copied for every server. PostgreSQL refuses to run as
//! root: when the tests run as root, `initdb` and `postgres` run as the `postgres` user
//! (through `setpriv`, which also re-arms the parent-death signal that the change of user
//! clears), and the data directories are handed to that user.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{cached, copy_tree, start_on_free_port, succeeded, wait_for_port, Kind, Server, ServerProcess};

const BIN_DIRS: &[&str] = &[
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/14/bin",
    "/usr/local/bin",
    "/usr/bin",
];

/// PostgreSQL as a [`Server`] kind.
#[derive(Debug)]
pub struct Postgres;

impl Kind for Postgres {
    /// Until `pg_isready` says it accepts connections: the server listens before it has
    /// finished starting, and answers "the database system is starting up" until then.
    fn ready(&self, addr: SocketAddr, process: &mut ServerProcess) -> io::Result<()> {
        wait_for_port(addr, process, Self::START_TIMEOUT)?;
        let pg_isready = program("pg_isready")?;
        process.wait_until(
            &format!("accepting connections on {addr}"),
            Self::START_TIMEOUT,
            Duration::from_millis(20),
            || {
                let status = Command::new(&pg_isready)
                    .args(["-q", "-t", "2", "-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
                    .status()?;
                Ok(status.success())
            },
        )
    }
}

/// A running PostgreSQL server with its own data directory.
pub type PostgresServer = Server<Postgres>;

/// The user to run PostgreSQL as: `postgres` when we are root, nobody else otherwise.
pub(crate) fn run_as() -> Option<(u32, u32)> {
    if current_uid() != 0 {
        return None;
    }
    let out = Command::new("id").args(["-u", "postgres"]).output().ok()?;
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    let out = Command::new("id").args(["-g", "postgres"]).output().ok()?;
    let gid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some((uid, gid))
}

fn current_uid() -> u32 {
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// The first of [`BIN_DIRS`] that has `name`, then `PATH`: Debian keeps the server
/// programs off `PATH`, one directory per major version, newest first.
fn program(name: &str) -> io::Result<PathBuf> {
    BIN_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .map_or_else(|| super::program(name, &[]), Ok)
}

pub(crate) fn chown_tree(path: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    let Some((uid, gid)) = owner else { return Ok(()) };
    let status = Command::new("chown").arg("-R").arg(format!("{uid}:{gid}")).arg(path).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("chown -R {} failed", path.display())))
    }
}

/// The template data directory, made once per machine.
fn template() -> io::Result<PathBuf> {
    let initdb = program("initdb")?;
    let owner = run_as();
    cached("postgres-template-v1", |scratch| {
        std::fs::create_dir_all(scratch)?;
        chown_tree(scratch, owner)?;
        let mut cmd = match owner {
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}")).arg("--clear-groups").arg(&initdb);
                c
            }
            None => Command::new(&initdb),
        };
        cmd.arg("-D")
            .arg(scratch)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C"])
            .current_dir("/");
        succeeded("initdb", cmd.output()?).map(drop)
    })
}

/// What a PostgreSQL server that accepts TLS connections only needs: its certificate
/// and key, and the CA of client certificates. Its `pg_hba.conf` refuses every plain TCP
/// connection, trusts the `postgres` user over TLS (and over the Unix socket in
/// [`Server::dir`]), lets in `cert_user` by its client certificate (common name
/// `cert_user`), and everyone else with a SCRAM password.
#[derive(Debug, Clone)]
pub struct PostgresTls {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that signs client certificates (PEM).
    pub client_ca: PathBuf,
    /// The user who logs in with a client certificate.
    pub cert_user: String,
}

impl PostgresTls {
    /// Copies the files into `dir` (the server refuses a key others can read) and writes
    /// the `pg_hba.conf`; returns the server's settings for them.
    fn install(&self, dir: &Path) -> io::Result<Vec<(&'static str, String)>> {
        let mut settings = Vec::new();
        for (setting, from, file) in [
            ("ssl_cert_file", &self.cert, "server.pem"),
            ("ssl_key_file", &self.key, "server-key.pem"),
            ("ssl_ca_file", &self.client_ca, "client-ca.pem"),
        ] {
            let to = dir.join(file);
            std::fs::copy(from, &to)?;
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            settings.push((setting, to.display().to_string()));
        }
        let hba = dir.join("pg_hba.conf");
        std::fs::write(
            &hba,
            format!(
                "local all all trust\n\
                 hostnossl all all 0.0.0.0/0 reject\n\
                 hostssl all postgres 127.0.0.1/32 trust\n\
                 hostssl all {} 127.0.0.1/32 cert\n\
                 hostssl all all 127.0.0.1/32 scram-sha-256\n",
                self.cert_user
            ),
        )?;
        settings.push(("ssl", "on".into()));
        settings.push(("hba_file", hba.display().to_string()));
        Ok(settings)
    }
}

impl Server<Postgres> {
    /// Starts a PostgreSQL server on a free port, with small memory settings and room for
    /// `max_connections` sessions.
    pub fn start(max_connections: u32) -> io::Result<Self> {
        Self::start_with(max_connections, None)
    }

    /// Starts a PostgreSQL server that accepts TLS connections only (see [`PostgresTls`]).
    pub fn start_tls(max_connections: u32, tls: &PostgresTls) -> io::Result<Self> {
        Self::start_with(max_connections, Some(tls))
    }

    fn start_with(max_connections: u32, tls: Option<&PostgresTls>) -> io::Result<Self> {
        let postgres = program("postgres")?;
        let template = template()?;
        let owner = run_as();
        start_on_free_port(|port| {
            let dir = tempfile::Builder::new().prefix("dlock-postgres-").tempdir()?;
            let data = dir.path().join("data");
            copy_tree(&template, &data)?;
            let tls_settings = match tls {
                Some(tls) => tls.install(dir.path())?,
                None => Vec::new(),
            };
            chown_tree(dir.path(), owner)?;
            let mut args: Vec<String> = Vec::new();
            let program = match owner {
                Some((uid, gid)) => {
                    args.extend([
                        format!("--reuid={uid}"),
                        format!("--regid={gid}"),
                        "--clear-groups".into(),
                        "--pdeathsig=KILL".into(),
                        postgres.display().to_string(),
                    ]);
                    PathBuf::from("setpriv")
                }
                None => postgres.clone(),
            };
            args.extend(["-D".into(), data.display().to_string(), "-p".into(), port.to_string()]);
            for (key, value) in [
                ("listen_addresses", "127.0.0.1".to_string()),
                ("unix_socket_directories", dir.path().display().to_string()),
                ("max_connections", max_connections.to_string()),
                ("shared_buffers", "16MB".into()),
                // Segments in the data directory: a killed server leaves nothing in /dev/shm.
                ("dynamic_shared_memory_type", "mmap".into()),
                ("fsync", "off".into()),
                ("full_page_writes", "off".into()),
                ("logging_collector", "off".into()),
                ("log_min_messages", "warning".into()),
            ]
            .into_iter()
            .chain(tls_settings.clone())
            {
                args.push("-c".into());
                args.push(format!("{key}={value}"));
            }
            Server::spawn(Postgres, "postgres", &program, args, port, dir)
        })
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }
}
