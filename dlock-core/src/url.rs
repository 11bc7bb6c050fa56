//! Backend URLs split into their parts, once for every backend:
//! `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query]`.

use std::fmt;

use crate::connect::{percent_decode, ConnectOptions};
use crate::error::LockError;

/// One `host:port` of a backend URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// A host name or IP address (IPv6 without brackets).
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl HostPort {
    /// The server at `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        HostPort { host: host.into(), port }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A backend URL, parsed and percent-decoded. Errors about it never show its password.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::BackendUrl;
///
/// let url = BackendUrl::parse("zk://app:s%40cret@[::1]:2181,zk2/locks?op_timeout=2s&tls=1", 2181)?;
/// assert_eq!(url.scheme, "zk");
/// assert_eq!(url.user.as_deref(), Some("app"));
/// assert_eq!(url.password.as_deref(), Some("s@cret"));
/// assert_eq!(url.hosts[0].to_string(), "[::1]:2181");
/// assert_eq!(url.hosts[1].to_string(), "zk2:2181");
/// assert_eq!(url.path, "/locks");
/// assert_eq!(url.options.op_timeout, Duration::from_secs(2));
/// assert_eq!(url.extra, vec![("tls".to_string(), "1".to_string())]);
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// The scheme, lowercased.
    pub scheme: String,
    /// The user name, if any.
    pub user: Option<String>,
    /// The password, if any.
    pub password: Option<String>,
    /// The servers, in order (at least one).
    pub hosts: Vec<HostPort>,
    /// The decoded path, `""` or starting with `/`.
    pub path: String,
    /// The common query options.
    pub options: ConnectOptions,
    /// Whether the query set `prefix` explicitly.
    pub prefix_given: bool,
    /// The other query options, for the backend to interpret or reject.
    pub extra: Vec<(String, String)>,
    redacted: String,
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendUrl").field(&self.redacted).finish()
    }
}

impl BackendUrl {
    /// Splits `url`; hosts without a port get `default_port`.
    pub fn parse(url: &str, default_port: u16) -> Result<Self, LockError> {
        let redacted = redact(url);
        let bad = |why: String| LockError::InvalidInput(format!("{why} in {redacted:?}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme".into()))?;
        if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) {
            return Err(bad(format!("bad scheme {scheme:?}")));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => {
                        let password =
                            percent_decode(password).map_err(|_| bad("a bad percent escape in the password".into()))?;
                        (user, Some(password))
                    }
                    None => (userinfo, None),
                };
                let user = percent_decode(user).map_err(|_| bad("a bad percent escape in the user name".into()))?;
                (Some(user).filter(|u| !u.is_empty()), password)
            }
        };
        let hosts = hosts
            .split(',')
            .map(|item| parse_host_port(item, default_port).map_err(&bad))
            .collect::<Result<Vec<_>, _>>()?;
        let (options, extra) = ConnectOptions::from_query(query).map_err(|e| match e {
            LockError::InvalidInput(why) => bad(why),
            other => other,
        })?;
        let prefix_given = query.split('&').any(|pair| pair.split('=').next() == Some("prefix"));
        Ok(BackendUrl {
            scheme: scheme.to_ascii_lowercase(),
            user,
            password,
            hosts,
            path: percent_decode(path)?,
            options,
            prefix_given,
            extra,
            redacted,
        })
    }

    /// The URL as given, with the password replaced: safe in messages.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// An `InvalidInput` error about this URL.
    pub fn invalid(&self, why: impl fmt::Display) -> LockError {
        LockError::InvalidInput(format!("{why} in {:?}", self.redacted))
    }

    /// Fails with `InvalidInput` on the first query option the backend did not take.
    pub fn reject_extra(&self) -> Result<(), LockError> {
        match self.extra.first() {
            Some((key, _)) => Err(self.invalid(format!("unknown option {key:?}"))),
            None => Ok(()),
        }
    }
}

/// `host`, `host:port` or `[v6]:port`.
fn parse_host_port(item: &str, default_port: u16) -> Result<HostPort, String> {
    let item = item.trim();
    if item.is_empty() {
        return Err("an empty host".into());
    }
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| format!("unclosed '[' in {item:?}"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("junk after ']' in {item:?}")),
        }
    } else {
        match item.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (item, None),
        }
    };
    if host.is_empty() || host.contains(['/', '@', '?', '#', '%', ' ', '\0', '[', ']']) {
        return Err(format!("bad host {host:?}"));
    }
    let port = match port {
        Some(port) => port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("bad port {port:?}"))?,
        None => default_port,
    };
    Ok(HostPort::new(host, port))
}

/// `scheme://user:secret@host` becomes `scheme://user:***@host`; anything else is unchanged.
///
/// ```
/// assert_eq!(dlock_core::redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
/// assert_eq!(dlock_core::redact("redis://h:1"), "redis://h:1");
/// ```
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let authority_end = url[start..].find(['/', '?']).map_or(url.len(), |i| start + i);
    let Some(at) = url[start..authority_end].rfind('@').map(|i| start + i) else { return url.to_string() };
    match url[start..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_urls_without_showing_passwords() {
        for url in [
            "nothing",
            "://h",
            "x://u:hunter2@",
            "x://u:hunter2@h:0",
            "x://u:hunter2@h:99999",
            "x://u:hunter2@h:1,,h:2",
            "x://u:hunter2@[::1",
            "x://u:hunter2@[::1]x",
            "x://u:hunter2@h:1?op_timeout=0s",
            "x://u:hunter2@h%zz",
            "x://u:hunter2%zz@h",
        ] {
            match BackendUrl::parse(url, 1) {
                Err(LockError::InvalidInput(why)) => assert!(!why.contains("hunter2"), "{url}: {why}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn defaults_and_lists() {
        let url = BackendUrl::parse("Redis://h", 6379).unwrap();
        assert_eq!(
            (url.scheme.as_str(), url.hosts.clone(), url.path.as_str()),
            ("redis", vec![HostPort::new("h", 6379)], "")
        );
        assert_eq!((url.user, url.password, url.prefix_given), (None, None, false));
        let url = BackendUrl::parse("x://:pw@a:1,b,[fe80::1]:3/p/q?prefix=z", 2).unwrap();
        assert_eq!(url.user, None);
        assert_eq!(url.password.as_deref(), Some("pw"));
        let hosts: Vec<String> = url.hosts.iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["a:1", "b:2", "[fe80::1]:3"]);
        assert_eq!(url.path, "/p/q");
        assert!(url.prefix_given);
        assert_eq!(format!("{url:?}"), "BackendUrl(\"x://:***@a:1,b,[fe80::1]:3/p/q?prefix=z\")");
    }

    #[test]
    fn redacts_only_the_password() {
        assert_eq!(redact("x://u@h/p"), "x://u@h/p");
        assert_eq!(redact("x://h/p@q"), "x://h/p@q");
        assert_eq!(redact("sqlite::memory:"), "sqlite::memory:");
        assert_eq!(redact("x://u:a:b@h"), "x://u:***@h");
    }
}
