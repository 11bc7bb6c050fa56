//! The lease server: one in-process map from lock names to holds, served over TCP.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_core::backend::lock_unpoisoned;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::protocol::{read_line, Reply, Request, VERSION};

/// The most names one `SWEEP` removes, whatever the client asks: each request holds the
/// map's lock, so it must stay short.
const MAX_SWEEP_BATCH: u64 = 10_000;

/// A lease server on a TCP port: the map of holds and fence counters, and the tasks that
/// serve it.
///
/// [`stop`](LeaseServer::stop) is the equivalent of `kill -9` of a server that keeps its
/// data: the port closes, every connection drops at once, and nothing is written or
/// answered any more; the map stays, and [`start_again`](LeaseServer::start_again) serves
/// it again on the same port. Holds keep expiring on the server's clock meanwhile, as
/// they would on a real server's disk and clock.
///
/// Needs a Tokio runtime: its tasks run on the runtime that starts it.
///
/// ```
/// use dlock_example_outside_backend::LeaseServer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let server = LeaseServer::start("127.0.0.1:0").await?;
/// let port = server.addr().port();
/// server.stop().await;
/// assert!(!server.is_running());
/// server.start_again().await?;
/// assert_eq!(server.addr().port(), port);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaseServer {
    addr: SocketAddr,
    map: Arc<Mutex<Map>>,
    running: Mutex<Option<Running>>,
}

/// The serving tasks: the accept loop, which owns every connection's task.
#[derive(Debug)]
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl LeaseServer {
    /// Binds `addr` (port 0 picks a free one) and serves an empty map on it.
    pub async fn start(addr: impl ToSocketAddrs) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let server = LeaseServer {
            addr: listener.local_addr()?,
            map: Arc::new(Mutex::new(Map::default())),
            running: Mutex::new(None),
        };
        server.listen(listener);
        Ok(server)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the server is serving (not stopped).
    pub fn is_running(&self) -> bool {
        lock_unpoisoned(&self.running).is_some()
    }

    /// Stops serving, as a `kill -9`: closes the port and every connection; keeps the map.
    /// Returns once the port and the connections are closed.
    pub async fn stop(&self) {
        let running = lock_unpoisoned(&self.running).take();
        if let Some(running) = running {
            let _ = running.stop.send(());
            let _ = running.task.await;
        }
    }

    /// Serves the kept map again on the same port, after [`stop`](LeaseServer::stop).
    /// Does nothing if the server is running.
    ///
    /// Fails when the port cannot be bound again (another process took it meanwhile);
    /// callers that race other processes for ports may retry.
    pub async fn start_again(&self) -> io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let listener = TcpListener::bind(self.addr).await?;
        self.listen(listener);
        Ok(())
    }

    fn listen(&self, listener: TcpListener) {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, self.map.clone(), stopped));
        let replaced = lock_unpoisoned(&self.running).replace(Running { stop, task });
        if let Some(old) = replaced {
            let _ = old.stop.send(());
        }
    }
}

impl Drop for LeaseServer {
    fn drop(&mut self) {
        if let Some(running) = lock_unpoisoned(&self.running).take() {
            let _ = running.stop.send(());
        }
    }
}

async fn accept(listener: TcpListener, map: Arc<Mutex<Map>>, mut stop: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // A stop, or the server value dropped.
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, map.clone()));
                }
                // Out of file descriptors and the like: pause rather than spin.
                Err(err) => {
                    tracing::debug!(%err, "lease server: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    // Every connection ends at once, mid-request or not, as when the process is killed.
    connections.shutdown().await;
}

/// Answers one connection's requests in order, flushing whenever no request is waiting,
/// so that pipelined requests are answered in one write.
async fn serve(stream: TcpStream, map: Arc<Mutex<Map>>) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let (mut reader, mut writer) = (BufReader::new(read), BufWriter::new(write));
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::debug!(%err, "lease server: closing a connection");
                return;
            }
        }
        let (tag, request) = Request::parse(&line);
        let reply = match request {
            Ok(request) => lock_unpoisoned(&map).apply(request, Instant::now()),
            Err(message) => Reply::Err { message },
        };
        if writer.write_all(&reply.to_line(tag)).await.is_err() {
            return;
        }
        if reader.buffer().is_empty() && writer.flush().await.is_err() {
            return;
        }
    }
}

/// Everything the server keeps, on its own monotonic clock.
#[derive(Debug, Default)]
struct Map {
    names: HashMap<String, Entry>,
    /// The highest token of every name a sweep removed: a name's counter starts here
    /// when it comes back, so that its tokens never go back.
    floor: u64,
}

#[derive(Debug)]
struct Entry {
    hold: Option<Hold>,
    /// The last token granted; it only rises, and outlives the holds.
    fence: u64,
    /// Requests given back, and until when a late delivery of one is refused.
    voided: Vec<(String, Instant)>,
    /// The last request about the name, for the sweep.
    used_at: Instant,
}

#[derive(Debug)]
struct Hold {
    owner: String,
    token: u64,
    /// The requests that hold it (more than one when the owner re-entered): a release
    /// or give-back takes back exactly its own.
    grants: Vec<String>,
    expires_at: Instant,
}

impl Entry {
    /// Forgets an expired hold and lapsed markers.
    fn tidy(&mut self, now: Instant) {
        if self.hold.as_ref().is_some_and(|hold| hold.expires_at <= now) {
            self.hold = None;
        }
        self.voided.retain(|(_, until)| *until > now);
    }

    fn is_idle(&self, now: Instant, keep: Duration) -> bool {
        self.hold.is_none() && self.voided.is_empty() && now.saturating_duration_since(self.used_at) >= keep
    }
}

impl Map {
    fn apply(&mut self, request: Request, now: Instant) -> Reply {
        match request {
            Request::Hello { version } if version == VERSION => Reply::Hello { version },
            Request::Hello { version } => {
                Reply::Err { message: format!("protocol version {version} is not spoken here") }
            }
            Request::Acquire { name, owner, grant, ttl_ms } => self.acquire(name, owner, grant, ttl_ms, now),
            Request::Renew { name, owner, token, ttl_ms } => self.renew(&name, &owner, token, ttl_ms, now),
            Request::Release { name, owner, token, grant } => self.release(&name, &owner, token, &grant, now),
            Request::GiveBack { name, owner, grant, ttl_ms } => self.give_back(name, &owner, grant, ttl_ms, now),
            Request::Inspect { name } => self.inspect(&name, now),
            Request::Sweep { keep_ms, batch } => self.sweep(Duration::from_millis(keep_ms), batch, now),
            Request::Evict { name } => {
                if let Some(entry) = self.names.get_mut(&name) {
                    entry.hold = None;
                }
                Reply::Ok
            }
            Request::Count { prefix } => {
                let names = self.names.keys().filter(|name| name.starts_with(&prefix)).count();
                Reply::Count { names: u64::try_from(names).unwrap_or(u64::MAX) }
            }
        }
    }

    /// The entry of `name`, made with its counter at the floor if missing, marked used.
    fn entry(&mut self, name: String, now: Instant) -> &mut Entry {
        let floor = self.floor;
        let entry = self.names.entry(name).or_insert_with(|| Entry {
            hold: None,
            fence: floor,
            voided: Vec::new(),
            used_at: now,
        });
        entry.tidy(now);
        entry.used_at = now;
        entry
    }

    fn acquire(&mut self, name: String, owner: String, grant: String, ttl_ms: u64, now: Instant) -> Reply {
        let Some(until) = now.checked_add(Duration::from_millis(ttl_ms)) else {
            return Reply::Err { message: "the ttl overflows the server's clock".into() };
        };
        let entry = self.entry(name, now);
        if entry.voided.iter().any(|(voided, _)| *voided == grant) {
            return Reply::Void;
        }
        match &mut entry.hold {
            Some(hold) if hold.owner == owner => {
                // A second delivery of the same request answers its grant again and
                // counts nothing twice; another request of the owner re-enters.
                if !hold.grants.contains(&grant) {
                    hold.grants.push(grant);
                }
                // Never shortened: the client counts this grant from when it was sent.
                hold.expires_at = hold.expires_at.max(until);
                Reply::Granted { token: hold.token }
            }
            Some(hold) => Reply::Busy { ms_left: millis_left(hold.expires_at, now) },
            None => {
                let Some(token) = entry.fence.checked_add(1) else {
                    return Reply::Err { message: "the name's token counter is exhausted".into() };
                };
                entry.fence = token;
                entry.hold = Some(Hold { owner, token, grants: vec![grant], expires_at: until });
                Reply::Granted { token }
            }
        }
    }

    fn renew(&mut self, name: &str, owner: &str, token: u64, ttl_ms: u64, now: Instant) -> Reply {
        let Some(until) = now.checked_add(Duration::from_millis(ttl_ms)) else {
            return Reply::Err { message: "the ttl overflows the server's clock".into() };
        };
        let Some(entry) = self.names.get_mut(name) else { return Reply::Expired };
        entry.tidy(now);
        entry.used_at = now;
        match &mut entry.hold {
            Some(hold) if hold.owner == owner && hold.token == token => {
                hold.expires_at = hold.expires_at.max(until);
                Reply::Renewed
            }
            Some(_) => Reply::Stolen,
            None => Reply::Expired,
        }
    }

    fn release(&mut self, name: &str, owner: &str, token: u64, grant: &str, now: Instant) -> Reply {
        let Some(entry) = self.names.get_mut(name) else { return Reply::NotHeld };
        entry.tidy(now);
        entry.used_at = now;
        let Some(hold) = entry.hold.as_mut() else { return Reply::NotHeld };
        if hold.owner != owner || hold.token != token || !hold.grants.iter().any(|g| g == grant) {
            return Reply::NotHeld;
        }
        hold.grants.retain(|g| g != grant);
        if hold.grants.is_empty() {
            entry.hold = None;
        }
        Reply::Released
    }

    /// Takes back the grant `grant` may have made, whatever its token, and refuses a late
    /// delivery of it for the request's ttl: a request held up longer than that would
    /// make a hold nobody knows of, which then lasts one ttl, as a holder that died does.
    fn give_back(&mut self, name: String, owner: &str, grant: String, ttl_ms: u64, now: Instant) -> Reply {
        let until = now.checked_add(Duration::from_millis(ttl_ms)).unwrap_or(now);
        let entry = self.entry(name, now);
        if let Some(hold) = entry.hold.as_mut().filter(|hold| hold.owner == owner) {
            hold.grants.retain(|g| *g != grant);
            if hold.grants.is_empty() {
                entry.hold = None;
            }
        }
        entry.voided.push((grant, until));
        Reply::Ok
    }

    fn inspect(&mut self, name: &str, now: Instant) -> Reply {
        let Some(entry) = self.names.get_mut(name) else { return Reply::Free };
        entry.tidy(now);
        match &entry.hold {
            Some(hold) => Reply::Held {
                owner: hold.owner.clone(),
                token: hold.token,
                count: u32::try_from(hold.grants.len()).unwrap_or(u32::MAX),
                ms_left: millis_left(hold.expires_at, now),
            },
            None => Reply::Free,
        }
    }

    /// Removes up to `batch` names idle for `keep` (no hold, no marker, no request),
    /// raising the floor to their counters.
    fn sweep(&mut self, keep: Duration, batch: u64, now: Instant) -> Reply {
        let batch = usize::try_from(batch.clamp(1, MAX_SWEEP_BATCH)).unwrap_or(1);
        let mut idle = Vec::new();
        let mut more = false;
        for (name, entry) in &mut self.names {
            entry.tidy(now);
            if entry.is_idle(now, keep) {
                if idle.len() == batch {
                    more = true;
                    break;
                }
                idle.push(name.clone());
            }
        }
        for name in &idle {
            if let Some(entry) = self.names.remove(name) {
                self.floor = self.floor.max(entry.fence);
            }
        }
        Reply::Swept { removed: u64::try_from(idle.len()).unwrap_or(u64::MAX), more }
    }
}

/// The time left until `until`, in whole milliseconds rounded up.
fn millis_left(until: Instant, now: Instant) -> u64 {
    crate::protocol::ceil_millis(until.saturating_duration_since(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(map: &mut Map, name: &str, owner: &str, grant: &str, now: Instant) -> Reply {
        map.apply(Request::Acquire { name: name.into(), owner: owner.into(), grant: grant.into(), ttl_ms: 1000 }, now)
    }

    #[test]
    fn tokens_rise_across_holders_expiry_and_sweeps() {
        let mut map = Map::default();
        let now = Instant::now();
        assert_eq!(acquire(&mut map, "n", "a", "a:1", now), Reply::Granted { token: 1 });
        assert_eq!(acquire(&mut map, "n", "b", "b:1", now), Reply::Busy { ms_left: 1000 });
        let later = now + Duration::from_secs(2);
        assert_eq!(acquire(&mut map, "n", "b", "b:2", later), Reply::Granted { token: 2 }, "expired");
        let release = Request::Release { name: "n".into(), owner: "b".into(), token: 2, grant: "b:2".into() };
        assert_eq!(map.apply(release.clone(), later), Reply::Released);
        assert_eq!(map.apply(release, later), Reply::NotHeld, "released once");
        let swept = map.apply(Request::Sweep { keep_ms: 1000, batch: 10 }, later + Duration::from_secs(2));
        assert_eq!(swept, Reply::Swept { removed: 1, more: false });
        assert!(map.names.is_empty());
        assert_eq!(acquire(&mut map, "n", "c", "c:1", later), Reply::Granted { token: 3 }, "above the floor");
    }

    #[test]
    fn a_give_back_takes_back_only_its_own_grant_and_refuses_late_deliveries() {
        let mut map = Map::default();
        let now = Instant::now();
        assert_eq!(acquire(&mut map, "n", "o", "o:1", now), Reply::Granted { token: 1 });
        assert_eq!(acquire(&mut map, "n", "o", "o:2", now), Reply::Granted { token: 1 });
        assert_eq!(acquire(&mut map, "n", "o", "o:2", now), Reply::Granted { token: 1 }, "a second delivery");
        let give_back = Request::GiveBack { name: "n".into(), owner: "o".into(), grant: "o:2".into(), ttl_ms: 1000 };
        assert_eq!(map.apply(give_back, now), Reply::Ok);
        assert_eq!(acquire(&mut map, "n", "o", "o:2", now), Reply::Void);
        let inspected = map.apply(Request::Inspect { name: "n".into() }, now);
        assert!(matches!(inspected, Reply::Held { count: 1, token: 1, .. }), "{inspected:?}");
    }

    #[test]
    fn renewals_check_owner_and_token() {
        let mut map = Map::default();
        let now = Instant::now();
        assert_eq!(acquire(&mut map, "n", "a", "a:1", now), Reply::Granted { token: 1 });
        let renew = |owner: &str, token| Request::Renew { name: "n".into(), owner: owner.into(), token, ttl_ms: 5000 };
        assert_eq!(map.apply(renew("a", 1), now), Reply::Renewed);
        assert_eq!(map.apply(renew("b", 1), now), Reply::Stolen);
        map.apply(Request::Evict { name: "n".into() }, now);
        assert_eq!(map.apply(renew("a", 1), now), Reply::Expired);
        assert_eq!(map.apply(Request::Count { prefix: String::new() }, now), Reply::Count { names: 1 });
    }
}
