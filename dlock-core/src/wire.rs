//! [`Wire`]: the link between one client and its server, played in process, for
//! fault-injection tests of backends that have no network to hurt (the [`memory`]
//! backend, an embedded database); the backend carries its calls over the wire, and tests
//! play [`Fault`]s on it with its [`Switch`].
//!
//! A networked backend is hurt with a TCP proxy between the client and the server. A
//! `Wire` plays the same faults at the client's edge, with the semantics a proxy gives,
//! so that one backend's fault tests mean the same as another's:
//!
//! - a request that got through is applied even if its caller gave up meanwhile (the
//!   client's operation timeout), and its reply comes back only as the fault lets it
//!   (held back, delayed, or thrown away while the caller waits on);
//! - requests held back by a fault reach the server in the order they were sent, as over
//!   one TCP stream, when the fault lifts.
//!
//! [`memory`]: crate::memory

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::error::LockError;

/// A network fault a [`Wire`] (or a TCP proxy) plays between a client and its server.
///
/// A request that got through is applied even if its caller gave up meanwhile (the
/// client's operation timeout), and a request held back flows on when the fault lifts:
/// the outcome of a call is then unknown to its caller, as over a real network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Everything flows.
    #[default]
    None,
    /// The connection is refused: calls fail at once, and a call whose request got through
    /// loses its reply and fails too.
    Cut,
    /// Nothing flows either way, as when a host freezes; what was held back flows on when
    /// the fault changes.
    Blackhole,
    /// Requests are held back (not applied); replies flow.
    BlackholeRequests,
    /// Requests flow and are applied; replies are held back.
    BlackholeReplies,
    /// Requests flow and are applied; replies are thrown away. The connection stays open
    /// while the fault lasts, so callers wait until they give up; over TCP, a connection
    /// that lost replies is closed when the fault ends, since its stream is broken.
    DropReplies,
    /// Requests flow and are applied; each reply arrives this much later.
    DelayReplies(Duration),
    /// Requests and replies each arrive this much later.
    Delay(Duration),
}

/// One client's link to its server: the [`Fault`] it plays, and the order of the requests
/// a fault holds back. Clones share the link.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use dlock_core::wire::{Fault, Wire};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let wire = Wire::new("demo link");
/// let applied = Arc::new(Mutex::new(Vec::new()));
/// let send = |n: u32| {
///     let applied = applied.clone();
///     wire.carry(move || async move {
///         applied.lock().unwrap().push(n);
///         Ok(n)
///     })
/// };
///
/// // Held back, the requests still reach the server in the order they were sent.
/// wire.set(Fault::BlackholeRequests);
/// let (a, b, ()) = tokio::join!(send(1), send(2), async { wire.set(Fault::None) });
/// assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
/// assert_eq!(*applied.lock().unwrap(), [1, 2]);
///
/// wire.set(Fault::Cut);
/// let refused = send(3).await.unwrap_err();
/// assert_eq!(refused.to_string(), "backend unavailable: demo link is cut");
/// assert_eq!(*applied.lock().unwrap(), [1, 2]);
/// # }
/// ```
#[derive(Clone)]
pub struct Wire {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the errors of a cut call name, such as "the link to postgres".
    name: String,
    on_cut: Option<Box<dyn Fn() + Send + Sync>>,
    fault: watch::Sender<Fault>,
    /// Requests sent while a fault was (or requests were) held back, not yet through: while
    /// any is, a new request must queue behind it even if the fault has lifted.
    held: AtomicU64,
    /// The sequence number the next such request gets.
    next: AtomicU64,
    /// The sequence number of the request allowed through next.
    through: watch::Sender<u64>,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire")
            .field("name", &self.inner.name)
            .field("fault", &self.fault())
            .field("held", &self.inner.held.load(Ordering::SeqCst))
            .finish()
    }
}

/// Lets the next held request through when the current one is done with, whatever path
/// it took.
struct Turn<'a>(&'a Inner);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.through.send_modify(|n| *n += 1);
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

impl Wire {
    /// A healthy link. `name` is what the `Unavailable` errors of cut calls name ("`name`
    /// is cut"), so that a test failure says which backend's link it was.
    pub fn new(name: impl Into<String>) -> Self {
        Self::build(name.into(), None)
    }

    /// A healthy link (see [`new`](Self::new)) that runs `on_cut` each time it is set to
    /// [`Fault::Cut`], right after the fault: for what a refused connection takes down at
    /// once, such as the connections a pool holds open (and the file locks they hold),
    /// before the next call could use them.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    /// use dlock_core::wire::Wire;
    ///
    /// let closed = Arc::new(AtomicBool::new(false));
    /// let flag = closed.clone();
    /// let wire = Wire::with_cut_hook("demo link", move || flag.store(true, Ordering::SeqCst));
    /// wire.switch().blackhole();
    /// assert!(!closed.load(Ordering::SeqCst));
    /// wire.switch().cut();
    /// assert!(closed.load(Ordering::SeqCst));
    /// ```
    pub fn with_cut_hook(name: impl Into<String>, on_cut: impl Fn() + Send + Sync + 'static) -> Self {
        Self::build(name.into(), Some(Box::new(on_cut)))
    }

    fn build(name: String, on_cut: Option<Box<dyn Fn() + Send + Sync>>) -> Self {
        Wire {
            inner: Arc::new(Inner {
                name,
                on_cut,
                fault: watch::channel(Fault::None).0,
                held: AtomicU64::new(0),
                next: AtomicU64::new(0),
                through: watch::channel(0).0,
            }),
        }
    }

    /// Plays `fault` from now on, for calls under way too.
    pub fn set(&self, fault: Fault) {
        self.inner.fault.send_replace(fault);
        if fault == Fault::Cut {
            if let Some(on_cut) = &self.inner.on_cut {
                on_cut();
            }
        }
    }

    /// The fault played now.
    pub fn fault(&self) -> Fault {
        *self.inner.fault.borrow()
    }

    /// The switch tests play faults with, while the backend keeps the wire to carry its
    /// calls.
    pub fn switch(&self) -> Switch {
        Switch { wire: self.clone() }
    }

    /// Carries one call over the link: `op` runs (its future is awaited) when the request
    /// gets through, even if the caller has gone by then, and its answer comes back as the
    /// fault lets it. Whatever the backend needs to reach its server (a pool, a check that
    /// the server is up) belongs in `op`, so that it is looked up when the request arrives.
    ///
    /// With no fault and nothing held back, `op` runs in the caller's task and its answer
    /// comes back at once. Otherwise the call is handed to a task of its own, so that it
    /// outlives its caller as a request on the network does, and:
    ///
    /// - a request cut before it got through fails with `Unavailable` ("... is cut") and
    ///   `op` never runs; one cut after it got through fails with "... was cut before the
    ///   reply";
    /// - a reply thrown away ([`Fault::DropReplies`]) never comes: the returned future
    ///   stays pending (until the caller's operation timeout gives up on it).
    ///
    /// Must be called within a Tokio runtime, which the held call's task runs on.
    ///
    /// ```
    /// use dlock_core::wire::{Fault, Wire};
    /// use dlock_core::LockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let wire = Wire::new("demo link");
    /// wire.set(Fault::DropReplies);
    /// let lost = tokio::time::timeout(std::time::Duration::from_millis(10), wire.carry(|| async { Ok(1) }));
    /// assert!(lost.await.is_err(), "a dropped reply never comes");
    ///
    /// wire.set(Fault::None);
    /// let failed = wire.carry(|| async { Err::<u32, _>(LockError::backend("refused")) }).await;
    /// assert!(matches!(failed, Err(LockError::Backend(_))));
    /// # }
    /// ```
    pub async fn carry<T, F, Fut>(&self, op: F) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let inner = &self.inner;
        // A request sent behind held ones must not overtake them once the fault lifts.
        if *inner.fault.borrow() == Fault::None && inner.held.load(Ordering::SeqCst) == 0 {
            return op().await;
        }
        inner.held.fetch_add(1, Ordering::SeqCst);
        let turn = inner.next.fetch_add(1, Ordering::SeqCst);
        let (reply, answer) = oneshot::channel();
        let inner = inner.clone();
        tokio::spawn(async move {
            let mut fault = inner.fault.subscribe();
            let mut through = inner.through.subscribe();
            // Held or delayed requests wait side by side, then reach the server in order.
            let passage = pass(&mut fault, Direction::Request).await;
            if let Some(delay) = passage {
                tokio::time::sleep(delay).await;
            }
            let _ = through.wait_for(|n| *n == turn).await;
            let ours = Turn(&inner);
            if passage.is_none() {
                let _ = reply.send(Err(inner.cut()));
                return;
            }
            let outcome = op().await;
            drop(ours);
            match pass(&mut fault, Direction::Reply).await {
                Some(delay) => {
                    tokio::time::sleep(delay).await;
                    let _ = reply.send(outcome);
                }
                None if *fault.borrow() == Fault::DropReplies => {
                    // Thrown away with the connection still open: the caller waits on (an
                    // answer that never comes) until it gives up.
                    let _ = fault.changed().await;
                    drop(reply);
                }
                None => {
                    let _ = reply.send(Err(LockError::unavailable(format!("{} was cut before the reply", inner.name))));
                }
            }
        });
        match answer.await {
            Ok(outcome) => outcome,
            Err(_) => std::future::pending().await,
        }
    }

    /// Waits until a request may pass, for work that reaches the server outside
    /// [`carry`](Self::carry) (a subscription, a dedicated session): held back while
    /// requests are, delayed as they are, `Unavailable` ("... is cut") while cut. It takes
    /// no place in the order of held requests.
    ///
    /// With no fault it is ready on the first poll: even a zero sleep would wait for the
    /// timer's next tick (about a millisecond), which every such call would pay.
    pub async fn admit(&self) -> Result<(), LockError> {
        let mut fault = self.inner.fault.subscribe();
        match pass(&mut fault, Direction::Request).await {
            Some(delay) if !delay.is_zero() => tokio::time::sleep(delay).await,
            Some(_) => {}
            None => return Err(self.inner.cut()),
        }
        Ok(())
    }
}

/// The fault switch on a [`Wire`], for tests: what a backend hands out as its link (see
/// [`MemoryLink`](crate::memory::MemoryLink)).
///
/// ```
/// use dlock_core::memory::MemoryStore;
/// use dlock_core::wire::Fault;
///
/// let backend = MemoryStore::new().backend();
/// let link = backend.link();
/// link.set(Fault::DelayReplies(std::time::Duration::from_millis(50)));
/// link.restore();
/// ```
#[derive(Clone)]
pub struct Switch {
    wire: Wire,
}

impl fmt::Debug for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Switch").field("name", &self.wire.inner.name).field("fault", &self.wire.fault()).finish()
    }
}

impl Switch {
    /// Plays `fault` from now on, for calls under way too (see [`Wire::set`]).
    pub fn set(&self, fault: Fault) {
        self.wire.set(fault);
    }

    /// Every call fails at once with `Unavailable`, as on a refused connection.
    pub fn cut(&self) {
        self.set(Fault::Cut);
    }

    /// Every call hangs until the link is restored or cut (or the client's operation
    /// timeout gives up on it), as when packets vanish.
    pub fn blackhole(&self) {
        self.set(Fault::Blackhole);
    }

    /// The link works again; what it held back flows on.
    pub fn restore(&self) {
        self.set(Fault::None);
    }
}

impl Inner {
    fn cut(&self) -> LockError {
        LockError::unavailable(format!("{} is cut", self.name))
    }
}

/// Waits until `direction` may pass: `Some(delay)` when it passes after that delay, `None`
/// when it never will (cut, or replies dropped).
async fn pass(fault: &mut watch::Receiver<Fault>, direction: Direction) -> Option<Duration> {
    loop {
        let current = *fault.borrow_and_update();
        let held = match (current, direction) {
            (Fault::None, _) => return Some(Duration::ZERO),
            (Fault::Cut, _) => return None,
            (Fault::Blackhole, _) => true,
            (Fault::BlackholeRequests, Direction::Request) | (Fault::BlackholeReplies, Direction::Reply) => true,
            (Fault::BlackholeRequests | Fault::BlackholeReplies, _) => false,
            (Fault::DropReplies, Direction::Request) => false,
            (Fault::DropReplies, Direction::Reply) => return None,
            (Fault::DelayReplies(d), Direction::Reply) | (Fault::Delay(d), _) => return Some(d),
            (Fault::DelayReplies(_), Direction::Request) => false,
        };
        if !held {
            return Some(Duration::ZERO);
        }
        if fault.changed().await.is_err() {
            return None;
        }
    }
}
