//! PgBouncer in front of a PostgreSQL server, on a free loopback port, in the pooling mode
//! a test asks for. Like PostgreSQL it refuses to run as root: when the tests run as root
//! it runs as the `postgres` user.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::postgres::{chown_tree, run_as};
use super::{start_on_free_port, Kind, Server};

/// PgBouncer as a [`Server`] kind.
#[derive(Debug)]
pub struct PgBouncer;

impl Kind for PgBouncer {}

/// A running PgBouncer with its own configuration directory.
pub type PgBouncerServer = Server<PgBouncer>;

/// How PgBouncer hands server connections to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction: a client's next transaction may run on
    /// another one, so nothing of a session (advisory locks, `LISTEN`, prepared
    /// statements) outlives a transaction.
    Transaction,
}

fn program() -> io::Result<PathBuf> {
    super::program("pgbouncer", &["/usr/sbin", "/usr/bin", "/usr/local/bin"])
}

impl Server<PgBouncer> {
    /// Starts PgBouncer in `mode` in front of the PostgreSQL server at `upstream`, letting
    /// in the `postgres` user without a password (as the test servers do), with room for
    /// `pool_size` server connections.
    pub fn start(upstream: SocketAddr, mode: PoolMode, pool_size: u32) -> io::Result<Self> {
        let pgbouncer = program()?;
        let owner = run_as();
        start_on_free_port(|port| {
            let dir = tempfile::Builder::new().prefix("dlock-pgbouncer-").tempdir()?;
            let users = dir.path().join("userlist.txt");
            std::fs::write(&users, "\"postgres\" \"\"\n")?;
            let mode = match mode {
                PoolMode::Session => "session",
                PoolMode::Transaction => "transaction",
            };
            let ini = dir.path().join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     * = host={host} port={upstream_port}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {users}\n\
                     pool_mode = {mode}\n\
                     default_pool_size = {pool_size}\n\
                     max_client_conn = 2000\n\
                     ignore_startup_parameters = extra_float_digits,options\n\
                     server_reset_query = DISCARD ALL\n\
                     log_connections = 0\n\
                     log_disconnections = 0\n",
                    host = upstream.ip(),
                    upstream_port = upstream.port(),
                    users = users.display(),
                ),
            )?;
            chown_tree(dir.path(), owner)?;
            let (program, mut args) = match owner {
                Some((uid, gid)) => (
                    PathBuf::from("setpriv"),
                    vec![
                        format!("--reuid={uid}"),
                        format!("--regid={gid}"),
                        "--clear-groups".into(),
                        "--pdeathsig=KILL".into(),
                        pgbouncer.display().to_string(),
                    ],
                ),
                None => (pgbouncer.clone(), Vec::new()),
            };
            args.push(ini.display().to_string());
            Server::spawn(PgBouncer, "pgbouncer", &program, args, port, dir)
        })
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }
}
