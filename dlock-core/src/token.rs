//! Fencing tokens.

use std::fmt;

/// A number that strictly increases over the successive grants of one lock name.
///
/// Pass it to the resource the lock protects and have the resource refuse any write
/// that carries a token lower than the highest it has seen: a holder whose lease
/// silently ran out (a long GC pause, a network delay) is then refused instead of
/// corrupting data. A re-entrant acquire returns the holder's token again.
///
/// ```
/// use dlock_core::FencingToken;
///
/// let older = FencingToken::new(41);
/// let newer = FencingToken::new(42);
/// assert!(newer > older);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token with the given value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The token's value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
