//! Validated identifiers: the name of a lock and the identity of its owner.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::LockError;

/// The longest lock name accepted, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 1024;

/// The longest owner identity accepted, in bytes of UTF-8.
pub const MAX_OWNER_LEN: usize = 256;

/// The name of a lock, validated once.
///
/// Any UTF-8 string of 1 to [`MAX_NAME_LEN`] bytes without a NUL byte is a legal
/// name: spaces, `/`, `:` and emoji included. Two different names never share a lock
/// on any backend; backends whose keys or paths cannot hold every character use
/// [`LockName::encoded`], which is injective.
///
/// ```
/// use dlock_core::LockName;
///
/// let name = LockName::new("orders/42: ship")?;
/// assert_eq!(name.as_str(), "orders/42: ship");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("a\0b").is_err());
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name` and makes a lock name of it.
    ///
    /// Fails with [`LockError::InvalidInput`] when the name is empty, longer than
    /// [`MAX_NAME_LEN`] bytes, or contains a NUL byte.
    pub fn new(name: impl AsRef<str>) -> Result<Self, LockError> {
        let name = name.as_ref();
        validate_text("lock name", name, MAX_NAME_LEN)?;
        Ok(LockName(Arc::from(name)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name percent-encoded so that only `A-Z a-z 0-9 _ -` remain unescaped.
    ///
    /// The encoding is injective (every other byte, `%` included, becomes `%XX`), so
    /// two different names never map to one key, path segment or channel. It is safe
    /// as a ZooKeeper path segment (never `.` or `..`, never a `/`) and in any key space.
    ///
    /// ```
    /// use dlock_core::LockName;
    ///
    /// assert_eq!(LockName::new("a/b c")?.encoded(), "a%2Fb%20c");
    /// assert_eq!(LockName::new("..")?.encoded(), "%2E%2E");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn encoded(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        for byte in self.0.bytes() {
            if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
                out.push(byte as char);
            } else {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(HEX[usize::from(byte >> 4)] as char);
                out.push(HEX[usize::from(byte & 0xF)] as char);
            }
        }
        out
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockName {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LockName::new(s)
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        LockName::new(s)
    }
}

/// Who holds a lock: the identity that makes an acquire re-entrant.
///
/// Re-entrancy follows the owner, not the thread (tasks move between threads): when an
/// owner acquires a lock it already holds, the hold count rises and the same fencing
/// token comes back; the lock is free again when every hold was released. Without an
/// explicit owner in [`LockOptions`](crate::LockOptions), each acquire gets a fresh
/// owner and is therefore never re-entrant.
///
/// ```
/// use dlock_core::OwnerId;
///
/// let owner = OwnerId::new("billing-job-7")?;
/// assert_eq!(owner.as_str(), "billing-job-7");
/// # Ok::<(), dlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(Arc<str>);

impl OwnerId {
    /// Validates an owner identity: 1 to [`MAX_OWNER_LEN`] bytes, no NUL byte.
    pub fn new(owner: impl AsRef<str>) -> Result<Self, LockError> {
        let owner = owner.as_ref();
        validate_text("owner", owner, MAX_OWNER_LEN)?;
        Ok(OwnerId(Arc::from(owner)))
    }

    /// A fresh owner identity that no other process will ever use.
    pub fn unique() -> Self {
        OwnerId(Arc::from(uuid::Uuid::new_v4().to_string()))
    }

    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for OwnerId {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OwnerId::new(s)
    }
}

fn validate_text(what: &str, text: &str, max: usize) -> Result<(), LockError> {
    if text.is_empty() {
        return Err(LockError::InvalidInput(format!("{what} is empty")));
    }
    if text.len() > max {
        return Err(LockError::InvalidInput(format!("{what} is {} bytes long; at most {max} are allowed", text.len())));
    }
    if text.contains('\0') {
        return Err(LockError::InvalidInput(format!("{what} contains a NUL byte")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(LockName::new(""), Err(LockError::InvalidInput(_))));
        assert!(matches!(LockName::new("x".repeat(MAX_NAME_LEN + 1)), Err(LockError::InvalidInput(_))));
        assert!(matches!(LockName::new("a\0"), Err(LockError::InvalidInput(_))));
        assert!(LockName::new("x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(LockName::new("🔒 a/b:c").is_ok());
    }

    #[test]
    fn encoding_is_injective_on_tricky_names() {
        let names = ["a/b", "a%2Fb", "a b", "a+b", "A", "a", ".", "..", "%", "%25", "é", "🔒", "a-b", "a_b"];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let enc = LockName::new(n).unwrap().encoded();
            assert!(enc.bytes().all(|b| b.is_ascii_alphanumeric() || b"%_-".contains(&b)), "{enc}");
            assert!(seen.insert(enc), "collision for {n}");
        }
    }

    #[test]
    fn owners_are_validated() {
        assert!(OwnerId::new("").is_err());
        assert!(OwnerId::new("x".repeat(MAX_OWNER_LEN + 1)).is_err());
        assert_ne!(OwnerId::unique(), OwnerId::unique());
    }
}
