//! Clocks that misbehave on a Redis server: one that runs fast, and one that jumps.
//!
//! Redis expires a key when the server's clock passes the key's expiry, so a clock that
//! runs `k` times too fast does to every key what shortening its remaining time by
//! `(k - 1)` times the time passed does, and a jump forward by `d` what shortening it by
//! `d` does. Both are played that way, by a script over the server's keys, since Debian's
//! redis-server (linked with jemalloc) does not start under libfaketime.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Shortens every key's remaining time by `ARGV[1]` ms; a key with less left expires.
const SHORTEN: &str = r"
local step = tonumber(ARGV[1])
local cursor = '0'
repeat
  local page = redis.call('scan', cursor, 'count', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local left = redis.call('pttl', key)
    if left > 0 then
      redis.call('pexpire', key, math.max(1, left - step))
    end
  end
until cursor == '0'
return 0
";

/// Sends `EVAL SHORTEN 0 <step_ms>` to the server at `addr` on a fresh connection.
pub(crate) fn shorten(addr: SocketAddr, step: Duration) -> io::Result<()> {
    command(addr, &["EVAL", SHORTEN, "0", &step.as_millis().to_string()]).map(drop)
}

/// Sends one command to the Redis server at `addr` on a fresh connection; its reply's
/// first line, or an error for an error reply.
pub(crate) fn command(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend(format!("${}\r\n", arg.len()).into_bytes());
        request.extend(arg.as_bytes());
        request.extend(b"\r\n");
    }
    conn.write_all(&request)?;
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply)?;
    if reply.starts_with('-') {
        return Err(io::Error::other(format!("{} failed: {}", args[0], reply.trim())));
    }
    Ok(reply.trim().to_string())
}

/// A server whose clock runs `factor` times too fast, for as long as this value lives.
/// A server that is down (killed by the run) is simply skipped until it is back.
#[derive(Debug)]
pub(crate) struct FastClock {
    stop: Arc<AtomicBool>,
}

impl FastClock {
    /// Every this often, each key loses `(factor - 1)` times as much.
    const TICK: Duration = Duration::from_millis(50);

    pub(crate) fn start(addr: SocketAddr, factor: f64) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let step = Self::TICK.mul_f64((factor - 1.0).max(0.0));
        thread::Builder::new().name(format!("fast-clock-{}", addr.port())).spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                thread::sleep(Self::TICK);
                let _ = shorten(addr, step);
            }
        })?;
        Ok(FastClock { stop })
    }
}

impl Drop for FastClock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
