//! Options every network backend reads from its URL's query string, parsed in one place.

use std::time::Duration;

use crate::client::ClientConfig;
use crate::error::LockError;

/// Connection options common to every backend, read from `?key=value` pairs of a URL:
/// `connect_timeout`, `op_timeout` (durations such as `500ms`, `5s`, `2m`), `prefix`
/// (the key, path or table prefix under which the backend keeps its locks), `keep_idle`
/// (how long a name's token counter outlives the name's last use; backends whose tokens
/// are the server's revisions, ZooKeeper and etcd, keep no counter and ignore it) and
/// `sweep_every` (how often the client sweeps idle names in the background; `off` never
/// does).
///
/// ```
/// use std::time::Duration;
/// use dlock_core::ConnectOptions;
///
/// let (opts, rest) = ConnectOptions::from_query("op_timeout=250ms&prefix=shop%2Flocks&tls=true")?;
/// assert_eq!(opts.op_timeout, Duration::from_millis(250));
/// assert_eq!(opts.prefix, "shop/locks");
/// assert_eq!(rest, vec![("tls".to_string(), "true".to_string())]);
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The longest a connection attempt may take before `Unavailable`.
    pub connect_timeout: Duration,
    /// The longest one backend operation may take before `Unavailable`.
    pub op_timeout: Duration,
    /// Where the backend keeps its locks (a key prefix, a znode root, a table prefix).
    pub prefix: String,
    /// How long a name's token counter outlives its last grant, renewal or release.
    pub keep_idle: Duration,
    /// How often the client sweeps idle names in the background; `None` never.
    pub sweep_every: Option<Duration>,
}

impl Default for ConnectOptions {
    /// 5 s to connect, 5 s per operation, prefix `dlock`, names kept for
    /// [`DEFAULT_KEEP_IDLE`](crate::DEFAULT_KEEP_IDLE), a sweep every
    /// [`DEFAULT_SWEEP_EVERY`](crate::DEFAULT_SWEEP_EVERY).
    fn default() -> Self {
        ConnectOptions {
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(5),
            prefix: "dlock".to_string(),
            keep_idle: crate::DEFAULT_KEEP_IDLE,
            sweep_every: Some(crate::DEFAULT_SWEEP_EVERY),
        }
    }
}

impl ConnectOptions {
    /// Parses a query string (without the `?`), returning the common options and every
    /// other pair, percent-decoded, for the backend to interpret (or reject).
    pub fn from_query(query: &str) -> Result<(Self, Vec<(String, String)>), LockError> {
        let mut opts = ConnectOptions::default();
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (key, value) = (percent_decode(key)?, percent_decode(value)?);
            match key.as_str() {
                "connect_timeout" => opts.connect_timeout = parse_duration(&value)?,
                "op_timeout" => opts.op_timeout = parse_duration(&value)?,
                "prefix" => {
                    if value.is_empty() || value.contains('\0') {
                        return Err(LockError::InvalidInput("prefix must be non-empty text without NUL".into()));
                    }
                    opts.prefix = value;
                }
                "keep_idle" => opts.keep_idle = parse_duration(&value)?,
                "sweep_every" => {
                    opts.sweep_every = if value == "off" { None } else { Some(parse_duration(&value)?) };
                }
                _ => rest.push((key, value)),
            }
        }
        Ok((opts, rest))
    }

    /// Checks what a builder may have set: timeouts above zero, a keep time of 1 ms to
    /// [`MAX_DURATION`](crate::MAX_DURATION), a sweep period above zero.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.connect_timeout.is_zero() || self.op_timeout.is_zero() {
            return Err(LockError::InvalidInput("timeouts must be above zero".into()));
        }
        if self.keep_idle < Duration::from_millis(1) || self.keep_idle > crate::MAX_DURATION {
            return Err(LockError::InvalidInput(format!(
                "keep_idle {:?} must be at least 1ms and at most a year",
                self.keep_idle
            )));
        }
        if self.sweep_every.is_some_and(|every| every.is_zero() || every > crate::MAX_DURATION) {
            return Err(LockError::InvalidInput("sweep_every must be above zero and at most a year".into()));
        }
        Ok(())
    }

    /// The settings of the client a backend connected with these options gets.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig { op_timeout: self.op_timeout, sweep_every: self.sweep_every }
    }
}

/// The builder methods every backend's configuration shares, over the [`ConnectOptions`]
/// it embeds: `with_*` setters that take and return the configuration, bare getters.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{ConnectConfig, ConnectOptions};
///
/// #[derive(Default)]
/// struct MyConfig {
///     common: ConnectOptions,
/// }
///
/// impl ConnectConfig for MyConfig {
///     fn common(&self) -> &ConnectOptions {
///         &self.common
///     }
///     fn common_mut(&mut self) -> &mut ConnectOptions {
///         &mut self.common
///     }
/// }
///
/// let config = MyConfig::default().with_op_timeout(Duration::from_secs(2)).with_prefix("shop");
/// assert_eq!(config.op_timeout(), Duration::from_secs(2));
/// assert_eq!(config.prefix(), "shop");
/// ```
pub trait ConnectConfig: Sized {
    /// The embedded common options.
    fn common(&self) -> &ConnectOptions;

    /// The embedded common options, to change them.
    fn common_mut(&mut self) -> &mut ConnectOptions;

    /// The longest a connection attempt may take before `Unavailable` (default 5 s).
    fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.common_mut().connect_timeout = timeout;
        self
    }

    /// The longest one backend operation may take before `Unavailable` (default 5 s).
    fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.common_mut().op_timeout = timeout;
        self
    }

    /// Where the backend keeps its locks (default `dlock`). Each backend says which
    /// prefixes it accepts, and refuses others when it connects.
    fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.common_mut().prefix = prefix.into();
        self
    }

    /// How long a name's token counter (and what else the backend keeps for it) outlives
    /// the name's last grant, renewal or release (default
    /// [`DEFAULT_KEEP_IDLE`](crate::DEFAULT_KEEP_IDLE), an hour). A backend whose counters
    /// restart from its clock relies on that clock never stepping back by as much.
    fn with_keep_idle(mut self, keep: Duration) -> Self {
        self.common_mut().keep_idle = keep;
        self
    }

    /// How often the client sweeps idle names in the background (default
    /// [`DEFAULT_SWEEP_EVERY`](crate::DEFAULT_SWEEP_EVERY)); `None` never does
    /// ([`Locker::sweep`](crate::Locker::sweep) still sweeps on demand).
    fn with_sweep_every(mut self, every: Option<Duration>) -> Self {
        self.common_mut().sweep_every = every;
        self
    }

    /// See [`with_keep_idle`](ConnectConfig::with_keep_idle).
    fn keep_idle(&self) -> Duration {
        self.common().keep_idle
    }

    /// See [`with_sweep_every`](ConnectConfig::with_sweep_every).
    fn sweep_every(&self) -> Option<Duration> {
        self.common().sweep_every
    }

    /// See [`with_connect_timeout`](ConnectConfig::with_connect_timeout).
    fn connect_timeout(&self) -> Duration {
        self.common().connect_timeout
    }

    /// See [`with_op_timeout`](ConnectConfig::with_op_timeout).
    fn op_timeout(&self) -> Duration {
        self.common().op_timeout
    }

    /// See [`with_prefix`](ConnectConfig::with_prefix).
    fn prefix(&self) -> &str {
        &self.common().prefix
    }
}

/// Parses a duration such as `250ms`, `5s`, `2m`, `1h` (a bare number is seconds).
/// Zero and values above [`MAX_DURATION`](crate::MAX_DURATION) are `InvalidInput`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(dlock_core::parse_duration("1500ms")?, Duration::from_millis(1500));
/// assert_eq!(dlock_core::parse_duration("30")?, Duration::from_secs(30));
/// assert!(dlock_core::parse_duration("-1s").is_err());
/// # Ok::<(), dlock_core::LockError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, LockError> {
    let bad = || LockError::InvalidInput(format!("not a duration: {text:?} (use e.g. 500ms, 5s, 2m)"));
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if d.is_zero() || d > crate::MAX_DURATION {
        return Err(bad());
    }
    Ok(d)
}

/// Decodes `%XX` escapes (and `+` as a space, as in form-encoded queries).
pub fn percent_decode(text: &str) -> Result<String, LockError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(byte.ok_or_else(|| LockError::InvalidInput(format!("bad percent escape in {text:?}")))?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| LockError::InvalidInput(format!("{text:?} does not decode to UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_values() {
        for q in [
            "op_timeout=0s",
            "op_timeout=abc",
            "connect_timeout=5y",
            "prefix=",
            "prefix=%zz",
            "op_timeout=99999999999999h",
            "keep_idle=0s",
            "sweep_every=never",
        ] {
            assert!(matches!(ConnectOptions::from_query(q), Err(LockError::InvalidInput(_))), "{q}");
        }
    }

    #[test]
    fn defaults_when_empty() {
        assert_eq!(ConnectOptions::from_query("").unwrap(), (ConnectOptions::default(), vec![]));
    }

    #[test]
    fn keep_time_and_sweeps() {
        let (opts, _) = ConnectOptions::from_query("keep_idle=90s&sweep_every=off").unwrap();
        assert_eq!((opts.keep_idle, opts.sweep_every), (Duration::from_secs(90), None));
        assert_eq!(opts.client_config().sweep_every, None);
        let (opts, _) = ConnectOptions::from_query("sweep_every=2m").unwrap();
        assert_eq!(opts.sweep_every, Some(Duration::from_secs(120)));
        assert!(opts.validate().is_ok());
        for bad in [
            ConnectOptions { keep_idle: Duration::ZERO, ..ConnectOptions::default() },
            ConnectOptions { keep_idle: crate::MAX_DURATION * 2, ..ConnectOptions::default() },
            ConnectOptions { sweep_every: Some(Duration::ZERO), ..ConnectOptions::default() },
            ConnectOptions { op_timeout: Duration::ZERO, ..ConnectOptions::default() },
        ] {
            assert!(matches!(bad.validate(), Err(LockError::InvalidInput(_))), "{bad:?}");
        }
    }
}
