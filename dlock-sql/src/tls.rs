//! TLS options of the server URLs, in each database's own client's names: libpq's for
//! PostgreSQL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`), the `mysql` client's for
//! MySQL/MariaDB (`ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`). They are checked when the URL
//! is read, their files when the client connects, and then handed to the driver.
//!
//! Certificates are checked against the system's roots plus the CA file the URL names.
//! As with libpq, `sslmode=require` with an `sslrootcert` verifies the server's certificate
//! against it (as `verify-ca` does), and so does `ssl-mode=REQUIRED` (or no mode) with an
//! `ssl-ca`: a CA given is never ignored.

use dlock_core::LockError;

use crate::config::Dialect;

/// The TLS modes, weakest first, as each database spells them.
const POSTGRES_MODES: [&str; 6] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];
const MYSQL_MODES: [&str; 5] = ["DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"];

/// The option that chooses the mode, and those that name files, per dialect.
fn names(dialect: Dialect) -> (&'static str, [&'static str; 3]) {
    match dialect {
        Dialect::MySql => ("ssl-mode", ["ssl-ca", "ssl-cert", "ssl-key"]),
        Dialect::Postgres | Dialect::Sqlite => ("sslmode", ["sslrootcert", "sslcert", "sslkey"]),
    }
}

/// Whether `key` is a TLS option of `dialect`'s URLs.
pub(crate) fn is_option(dialect: Dialect, key: &str) -> bool {
    let (mode, files) = names(dialect);
    dialect != Dialect::Sqlite && (key == mode || files.contains(&key))
}

/// Checks a TLS option's value: a known mode, a non-empty file path.
pub(crate) fn check(dialect: Dialect, key: &str, value: &str) -> Result<(), LockError> {
    let (mode, _) = names(dialect);
    let known: &[&str] = if dialect == Dialect::MySql { &MYSQL_MODES } else { &POSTGRES_MODES };
    let fine = if key == mode { known.iter().any(|m| m.eq_ignore_ascii_case(value)) } else { !value.is_empty() };
    if fine {
        Ok(())
    } else if key == mode {
        Err(LockError::InvalidInput(format!("bad value {value:?} for {key}: one of {}", known.join(", "))))
    } else {
        Err(LockError::InvalidInput(format!("{key} needs a file path")))
    }
}

/// Checks that every file the options name can be read, so that a wrong path is reported
/// as such at connect, not as a TLS failure.
pub(crate) fn check_files(dialect: Dialect, options: &[(String, String)]) -> Result<(), LockError> {
    let (mode, _) = names(dialect);
    for (key, path) in options.iter().filter(|(key, _)| key != mode) {
        if let Err(err) = std::fs::File::open(path) {
            return Err(LockError::InvalidInput(format!("{key}: cannot read {path}: {err}")));
        }
    }
    Ok(())
}

/// Whether the options turn TLS off.
pub(crate) fn is_off(options: &[(String, String)]) -> bool {
    value(options, "sslmode")
        .or(value(options, "ssl-mode"))
        .is_some_and(|mode| mode.eq_ignore_ascii_case("disable") || mode.eq_ignore_ascii_case("disabled"))
}

/// Whether the application's pool checks the server's host name.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn pool_verifies_host(pool: &crate::db::Pool) -> bool {
    match pool {
        #[cfg(feature = "postgres")]
        crate::db::Pool::Postgres(p) | crate::db::Pool::PostgresPooled(p) => {
            matches!(p.connect_options().get_ssl_mode(), sqlx::postgres::PgSslMode::VerifyFull)
        }
        #[cfg(feature = "mysql")]
        crate::db::Pool::MySql(p) => {
            matches!(p.connect_options().get_ssl_mode(), sqlx::mysql::MySqlSslMode::VerifyIdentity)
        }
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// Whether the options ask for the server's host name to be checked.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn verifies_host(options: &[(String, String)]) -> bool {
    options.iter().any(|(key, mode)| {
        (key == "sslmode" && mode.eq_ignore_ascii_case("verify-full"))
            || (key == "ssl-mode" && mode.eq_ignore_ascii_case("verify_identity"))
    })
}

fn value<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
    options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// PostgreSQL's connect options with the URL's TLS options applied.
#[cfg(feature = "postgres")]
pub(crate) fn postgres(
    mut opts: sqlx::postgres::PgConnectOptions,
    options: &[(String, String)],
) -> sqlx::postgres::PgConnectOptions {
    use sqlx::postgres::PgSslMode;
    let root = value(options, "sslrootcert");
    if let Some(mode) = value(options, "sslmode") {
        opts = opts.ssl_mode(match mode.to_ascii_lowercase().as_str() {
            "disable" => PgSslMode::Disable,
            "allow" => PgSslMode::Allow,
            "prefer" => PgSslMode::Prefer,
            "require" if root.is_some() => PgSslMode::VerifyCa,
            "require" => PgSslMode::Require,
            "verify-ca" => PgSslMode::VerifyCa,
            _ => PgSslMode::VerifyFull,
        });
    }
    if let Some(root) = root {
        opts = opts.ssl_root_cert(root);
    }
    if let Some(cert) = value(options, "sslcert") {
        opts = opts.ssl_client_cert(cert);
    }
    if let Some(key) = value(options, "sslkey") {
        opts = opts.ssl_client_key(key);
    }
    opts
}

/// MySQL/MariaDB's connect options with the URL's TLS options applied.
#[cfg(feature = "mysql")]
pub(crate) fn mysql(
    mut opts: sqlx::mysql::MySqlConnectOptions,
    options: &[(String, String)],
) -> sqlx::mysql::MySqlConnectOptions {
    use sqlx::mysql::MySqlSslMode;
    let ca = value(options, "ssl-ca");
    let mode = value(options, "ssl-mode").map(str::to_ascii_uppercase);
    match (mode.as_deref(), ca) {
        (None, None) => {}
        // As the mysql client does when given a CA and no mode.
        (None | Some("REQUIRED"), Some(_)) => opts = opts.ssl_mode(MySqlSslMode::VerifyCa),
        (Some(mode), _) => {
            opts = opts.ssl_mode(match mode {
                "DISABLED" => MySqlSslMode::Disabled,
                "PREFERRED" => MySqlSslMode::Preferred,
                "REQUIRED" => MySqlSslMode::Required,
                "VERIFY_CA" => MySqlSslMode::VerifyCa,
                _ => MySqlSslMode::VerifyIdentity,
            })
        }
    }
    if let Some(ca) = ca {
        opts = opts.ssl_ca(ca);
    }
    if let Some(cert) = value(options, "ssl-cert") {
        opts = opts.ssl_client_cert(cert);
    }
    if let Some(key) = value(options, "ssl-key") {
        opts = opts.ssl_client_key(key);
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_each_databases_own() {
        assert!(is_option(Dialect::Postgres, "sslmode") && is_option(Dialect::Postgres, "sslrootcert"));
        assert!(!is_option(Dialect::Postgres, "ssl-ca") && !is_option(Dialect::MySql, "sslmode"));
        assert!(is_option(Dialect::MySql, "ssl-mode") && is_option(Dialect::MySql, "ssl-key"));
        assert!(!is_option(Dialect::Sqlite, "sslmode"));
    }

    #[test]
    fn modes_are_checked() {
        assert!(check(Dialect::Postgres, "sslmode", "verify-full").is_ok());
        assert!(check(Dialect::MySql, "ssl-mode", "verify_identity").is_ok());
        assert!(check(Dialect::MySql, "ssl-mode", "REQUIRED").is_ok());
        for (dialect, key, bad) in [
            (Dialect::Postgres, "sslmode", "verify_full"),
            (Dialect::Postgres, "sslmode", ""),
            (Dialect::MySql, "ssl-mode", "require"),
            (Dialect::Postgres, "sslrootcert", ""),
        ] {
            assert!(matches!(check(dialect, key, bad), Err(LockError::InvalidInput(_))), "{key}={bad}");
        }
    }

    #[test]
    fn unreadable_files_are_named() {
        let options =
            [("sslmode".to_string(), "verify-full".to_string()), ("sslrootcert".into(), "/no/such/ca.pem".into())];
        match check_files(Dialect::Postgres, &options) {
            Err(LockError::InvalidInput(why)) => {
                assert!(why.contains("sslrootcert") && why.contains("/no/such/ca.pem"))
            }
            other => panic!("{other:?}"),
        }
        assert!(check_files(Dialect::Postgres, &options[..1]).is_ok());
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn require_with_a_root_certificate_verifies_it() {
        use sqlx::postgres::{PgConnectOptions, PgSslMode};
        let with = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            postgres(PgConnectOptions::new(), &pairs).get_ssl_mode()
        };
        assert!(matches!(with(&[("sslmode", "require")]), PgSslMode::Require));
        assert!(matches!(with(&[("sslmode", "require"), ("sslrootcert", "/ca.pem")]), PgSslMode::VerifyCa));
        assert!(matches!(with(&[("sslmode", "verify-full")]), PgSslMode::VerifyFull));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_mysql_ca_is_verified_unless_the_mode_says_how() {
        use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
        let with = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            mysql(MySqlConnectOptions::new(), &pairs).get_ssl_mode()
        };
        assert!(matches!(with(&[("ssl-mode", "required")]), MySqlSslMode::Required));
        assert!(matches!(with(&[("ssl-ca", "/ca.pem")]), MySqlSslMode::VerifyCa));
        assert!(matches!(with(&[("ssl-mode", "REQUIRED"), ("ssl-ca", "/ca.pem")]), MySqlSslMode::VerifyCa));
        assert!(matches!(
            with(&[("ssl-mode", "VERIFY_IDENTITY"), ("ssl-ca", "/ca.pem")]),
            MySqlSslMode::VerifyIdentity
        ));
    }
}
