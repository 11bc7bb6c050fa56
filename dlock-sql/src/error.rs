//! Errors: how database errors become [`LockError`]s, and [`SqlError`], the error of the
//! row-lock, optimistic and fenced helpers.

use dlock_core::LockError;

/// The error of the helpers ([`crate::rowlock`], [`crate::optimistic`], [`crate::fenced`]).
///
/// Contention is typed, never a generic database error: a row another transaction has
/// locked is [`SqlError::Contended`], a version that moved is [`SqlError::Conflict`], a
/// write refused by a higher fencing token is [`SqlError::Fenced`].
///
/// ```
/// use dlock_core::LockError;
/// use dlock_sql::SqlError;
///
/// assert!(matches!(LockError::from(SqlError::Contended), LockError::Timeout { .. }));
/// assert!(matches!(LockError::from(SqlError::Fenced), LockError::NotHeld { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The row is locked by another transaction and could not be locked within the wait
    /// bound (`NOWAIT`, `lock_timeout`, `innodb_lock_wait_timeout`, SQLite's busy timeout).
    #[error("the row is locked by another transaction")]
    Contended,
    /// An optimistic update found another version than it read, on every allowed attempt.
    #[error("the row changed since it was read (version conflict)")]
    Conflict,
    /// The row to lock or update does not exist.
    #[error("no such row")]
    NotFound,
    /// A fenced write was refused: the resource has seen a higher fencing token.
    #[error("the write was refused: the resource has seen a newer fencing token")]
    Fenced,
    /// The database could not be reached (connection refused or lost, pool timed out).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for SqlError {
    fn from(err: sqlx::Error) -> Self {
        if is_lock_contention(&err) {
            SqlError::Contended
        } else if matches!(err, sqlx::Error::RowNotFound) {
            SqlError::NotFound
        } else if is_unavailable(&err) {
            SqlError::Unavailable(err)
        } else {
            SqlError::Database(err)
        }
    }
}

impl From<SqlError> for LockError {
    fn from(err: SqlError) -> Self {
        match err {
            SqlError::Contended => LockError::timeout(),
            SqlError::Fenced => LockError::not_held(),
            SqlError::Unavailable(e) | SqlError::Database(e) if refusal(&e).is_some() => lock_error(e),
            SqlError::Unavailable(e) => LockError::unavailable_because("the database could not be reached", e),
            other => LockError::backend(other),
        }
    }
}

/// The database error's code: SQLSTATE on PostgreSQL, the error number on MySQL/MariaDB,
/// the extended result code on SQLite.
fn code(err: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = err else { return None };
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return Some(my.number().to_string());
    }
    db.code().map(|c| c.into_owned())
}

/// "Could not lock": a row lock not granted within its bound.
pub(crate) fn is_lock_contention(err: &sqlx::Error) -> bool {
    let Some(code) = code(err) else { return false };
    let sqlx::Error::Database(db) = err else { return false };
    #[cfg(feature = "postgres")]
    if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() {
        // lock_not_available (NOWAIT, lock_timeout)
        return code == "55P03";
    }
    #[cfg(feature = "mysql")]
    if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some() {
        // ER_LOCK_WAIT_TIMEOUT (also MariaDB's NOWAIT), ER_LOCK_NOWAIT (MySQL 8)
        return code == "1205" || code == "3572";
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLITE_BUSY and its extended codes: the write lock was not had within busy_timeout.
        return code.parse::<i32>().is_ok_and(|c| c & 0xff == 5 || c & 0xff == 6);
    }
    let _ = db;
    false
}

/// Whether the database rolled the statement back as a deadlock victim or a serialization
/// failure: it changed nothing and may be sent again.
pub(crate) fn is_rolled_back(err: &sqlx::Error) -> bool {
    let Some(code) = code(err) else { return false };
    // PostgreSQL: serialization_failure, deadlock_detected; MySQL/MariaDB: ER_LOCK_DEADLOCK.
    matches!(code.as_str(), "40001" | "40P01" | "1213")
}

/// Whether the server answered that it ended the session (an operator's kill, a
/// shutdown): the statement it answered did not commit.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn is_session_ended(err: &sqlx::Error) -> bool {
    // PostgreSQL: admin_shutdown, crash_shutdown; MySQL/MariaDB: ER_SERVER_SHUTDOWN,
    // ER_CONNECTION_KILLED.
    code(err).is_some_and(|code| ["57P01", "57P02", "1053", "1927"].contains(&code.as_str()))
}

/// Whether an error means the database could not be reached.
pub(crate) fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(_) => {
            let Some(code) = code(err) else { return false };
            // PostgreSQL: connection exceptions, admin/crash shutdown, cannot connect now.
            code.starts_with("08")
                || ["57P01", "57P02", "57P03"].contains(&code.as_str())
                // MySQL/MariaDB: server shutdown, connection killed, read-only during start.
                || ["1053", "1927", "2006", "2013"].contains(&code.as_str())
                // SQLite: cannot open the file, disk I/O error.
                || code.parse::<i32>().is_ok_and(|c| c & 0xff == 14 || c & 0xff == 10)
        }
        _ => false,
    }
}

/// Why the connection was refused for who or how it connects, in words that say what to
/// change ([`LockError::Refused`]): credentials, TLS one side requires, a certificate.
pub(crate) fn refusal(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Tls(e) if e.to_string().contains("does not support TLS") => {
            Some("the server does not offer TLS, which the URL's TLS mode requires (sslmode, ssl-mode)".into())
        }
        sqlx::Error::Tls(e) => Some(certificate_refusal(&**e).unwrap_or_else(|| "TLS could not be set up".into())),
        sqlx::Error::Io(e) => certificate_refusal(e),
        sqlx::Error::Database(db) => {
            let code = code(err)?;
            let refused = match code.as_str() {
                // PostgreSQL invalid_password; MySQL/MariaDB ER_ACCESS_DENIED_ERROR.
                "28P01" | "1045" => "the server did not accept the user name and password",
                // PostgreSQL invalid_authorization_specification: no pg_hba.conf line lets
                // this connection in; "no encryption" when only TLS ones would.
                "28000" if db.message().contains("no encryption") => {
                    "the server accepts only TLS connections: connect with sslmode=require, verify-ca or verify-full"
                }
                "28000" => "the server's pg_hba.conf does not let this user in from this address",
                // ER_SECURE_TRANSPORT_REQUIRED (MySQL 3159, MariaDB 4151).
                "3159" | "4151" => {
                    "the server accepts only TLS connections: connect with ssl-mode=REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                }
                _ => return None,
            };
            Some(refused.into())
        }
        _ => None,
    }
}

/// Maps an error of opening a connection: as [`lock_error`] does, except that MariaDB
/// answers a plain connection to a server that requires TLS as it answers a wrong
/// password (1045, access denied), so a refused plain connection (`plain`: the URL turned
/// TLS off) says that it may be either.
pub(crate) fn connect_error(err: sqlx::Error, plain: bool) -> LockError {
    if plain && code(&err).as_deref() == Some("1045") {
        return LockError::refused(
            "the server did not accept the user name and password, or it accepts only TLS connections and \
             ssl-mode=DISABLED turned TLS off",
            Some(err.into()),
        );
    }
    lock_error(err)
}

/// SQLite has no TLS.
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
fn certificate_refusal(_: &(dyn std::error::Error + 'static)) -> Option<String> {
    None
}

/// A certificate either side refused during the TLS handshake, found in an error's chain.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn certificate_refusal(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    use dlock_core::tls::TlsRefusal;
    let (tls, refusal) = TlsRefusal::find(err)?;
    Some(match refusal {
        Some(TlsRefusal::UnknownCa) => "the server's certificate is not signed by a CA this client trusts: name its \
                                        CA with sslrootcert (PostgreSQL) or ssl-ca (MySQL)"
            .into(),
        Some(TlsRefusal::OtherName) => "the server's certificate does not name the host the URL connects to \
                                        (verify-full and VERIFY_IDENTITY check it): connect by a name the \
                                        certificate lists"
            .into(),
        Some(TlsRefusal::ServerCertificate) => format!("the server's certificate was refused: {tls}"),
        Some(TlsRefusal::ClientCertificate) => {
            "the server refused this client's certificate (sslcert and sslkey, or ssl-cert and ssl-key)".into()
        }
        _ => format!("TLS failed: {tls}"),
    })
}

/// Maps a database error of a lock operation: refused for its credentials or TLS →
/// `Refused`; unreachable → `Unavailable`, a write lock not had in time (SQLite busy) →
/// `Unavailable` too (the operation could not be done within its bound), anything else →
/// `Backend`.
pub(crate) fn lock_error(err: sqlx::Error) -> LockError {
    if let Some(why) = refusal(&err) {
        return LockError::refused(why, Some(err.into()));
    }
    if is_unavailable(&err) || is_lock_contention(&err) {
        LockError::unavailable_because("the database could not do it in time", err)
    } else {
        match err {
            sqlx::Error::Configuration(e) => LockError::InvalidInput(e.to_string()),
            other => LockError::backend(other),
        }
    }
}
