//! [`Given`]: what the application hands a backend to use (its own pool or client).

use std::sync::atomic::{AtomicU64, Ordering};

/// A pool or client the application gave a backend's configuration instead of an
/// address. Two are equal only if one is a clone of the other: a configuration holding
/// one stays comparable (and printable) without comparing or printing the client, whose
/// options may hold a password.
///
/// ```
/// use dlock_core::Given;
///
/// let pool = Given::new(String::from("the application's pool"));
/// assert_eq!(pool, pool.clone());
/// assert_ne!(pool, Given::new(String::from("the application's pool")));
/// assert_eq!(pool.get(), "the application's pool");
/// assert!(!format!("{pool:?}").contains("pool"));
/// ```
#[derive(Clone)]
pub struct Given<T> {
    value: T,
    id: u64,
}

impl<T> Given<T> {
    /// Wraps what the application gave.
    pub fn new(value: T) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Given { value, id: NEXT.fetch_add(1, Ordering::Relaxed) }
    }

    /// What the application gave.
    pub fn get(&self) -> &T {
        &self.value
    }
}

impl<T> PartialEq for Given<T> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<T> Eq for Given<T> {}

impl<T> std::fmt::Debug for Given<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Given(#{})", self.id)
    }
}
