//! How the lock scripts are composed and called: each is the text of its file under
//! `src/lua/` behind the libraries it calls (in two sets, which publish with `PUBLISH` or,
//! on a Cluster of Redis 7 or later, `SPUBLISH`: [`Publish`]), sent with `EVALSHA`, and
//! sent whole with `EVAL` (which also caches it there) when the server answers
//! `NOSCRIPT`: after a restart or a `SCRIPT FLUSH`, and on a Cluster, whose nodes are not
//! loaded up front (one may be down, or a replica promoted later). Calls are optionally
//! pipelined with `WAIT` for replicas. What the scripts answer is read by the types
//! re-exported here.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{cmd, Arg, Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

use crate::config::ReplicaAck;
use crate::lua::{
    ABANDON, ABOVE_LIB, ACQUIRE, ACQUIRE_SHARED, CLOCK_LIB, FENCE_LIB, GIVE_BACK, GIVE_BACK_SHARED, GRANT, HOLD_LIB,
    INSPECT, INSPECT_QUEUE, LEASES_LIB, LENGTHEN_LIB, PUBLISH_LIB, QUEUE_LIB, READ_FENCE, RELEASE, RELEASE_SHARED,
    RENEW, RENEW_SHARED, REPORTED_FENCE_LIB, SPUBLISH_LIB,
};
pub use crate::replies::{
    parse_given_back, parse_inspect_queue, AcquireReply, GrantReply, HoldView, ReleaseReply, RenewReply,
};

/// One Lua script: its text and the SHA1 the server caches it under.
pub struct LuaScript {
    code: String,
    script: Script,
}

impl std::fmt::Debug for LuaScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaScript").field("sha1", &self.script.get_hash()).finish_non_exhaustive()
    }
}

impl LuaScript {
    /// A script of this text, hashed once.
    pub fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        let script = Script::new(&code);
        LuaScript { code, script }
    }

    /// The SHA1 of the text in hex, as `EVALSHA` names it.
    pub fn get_hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The text, as `EVAL` sends it.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// `SCRIPT LOAD`s the script (on every node of a Cluster, all of which must answer).
    pub async fn load_async<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<()> {
        self.script.load_async(conn).await.map(drop)
    }
}

/// The lock scripts, hashed once per process, each composed of the libraries it calls
/// and its own text; one set per [`Publish`] way.
pub struct Scripts {
    /// See `src/lua/acquire.lua`.
    pub acquire: LuaScript,
    /// See `src/lua/renew.lua`.
    pub renew: LuaScript,
    /// See `src/lua/release.lua`.
    pub release: LuaScript,
    /// See `src/lua/give_back.lua`.
    pub give_back: LuaScript,
    /// See `src/lua/inspect.lua`.
    pub inspect: LuaScript,
    /// See `src/lua/abandon.lua`.
    pub abandon: LuaScript,
    /// See `src/lua/inspect_queue.lua` (the inspect script that counts the queue too).
    pub inspect_queue: LuaScript,
    /// See `src/lua/redlock/grant.lua` (one RedLock node's part of a grant).
    pub grant: LuaScript,
    /// See `src/lua/redlock/read_fence.lua` (one RedLock node's fence counter).
    pub read_fence: LuaScript,
    /// See `src/lua/acquire_shared.lua` (readers and permits).
    pub acquire_shared: LuaScript,
    /// See `src/lua/renew_shared.lua` (readers and permits).
    pub renew_shared: LuaScript,
    /// See `src/lua/release_shared.lua` (readers and permits).
    pub release_shared: LuaScript,
    /// See `src/lua/give_back_shared.lua` (readers and permits).
    pub give_back_shared: LuaScript,
}

impl std::fmt::Debug for Scripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripts").finish_non_exhaustive()
    }
}

/// How the scripts publish their wake-ups, which must be how the client's waiters listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Publish {
    /// `PUBLISH`, heard by `SUBSCRIBE`: a single server, Sentinel, RedLock, and a Cluster
    /// of servers before Redis 7 (where the message goes to every node).
    Classic,
    /// `SPUBLISH`, heard by `SSUBSCRIBE` on the shard that serves the channel's slot: a
    /// Cluster of Redis 7 or later.
    Sharded,
}

impl Publish {
    /// The lock scripts that publish this way.
    pub fn scripts(self) -> &'static Scripts {
        match self {
            Publish::Classic => &CLASSIC,
            Publish::Sharded => &SHARDED,
        }
    }
}

static CLASSIC: LazyLock<Scripts> = LazyLock::new(|| Scripts::compose(PUBLISH_LIB));
static SHARDED: LazyLock<Scripts> = LazyLock::new(|| Scripts::compose(SPUBLISH_LIB));

/// The lock scripts of this crate that publish with `PUBLISH` ([`Publish::Classic`]).
pub fn scripts() -> &'static Scripts {
    &CLASSIC
}

impl Scripts {
    /// The lock scripts, with `publish` (the text of `lib/publish.lua` or
    /// `lib/spublish.lua`) in front of every one that includes the queue library, which
    /// publishes: the two sets differ in the publishing command alone.
    fn compose(publish: &str) -> Self {
        let queued = |body: &str| LuaScript::new(format!("{publish}{CLOCK_LIB}{QUEUE_LIB}{LENGTHEN_LIB}{body}"));
        let fenced =
            |body: &str| LuaScript::new(format!("{publish}{FENCE_LIB}{CLOCK_LIB}{QUEUE_LIB}{LENGTHEN_LIB}{body}"));
        let leased =
            |body: &str| LuaScript::new(format!("{publish}{FENCE_LIB}{CLOCK_LIB}{QUEUE_LIB}{LEASES_LIB}{body}"));
        Scripts {
            acquire: fenced(ACQUIRE),
            renew: LuaScript::new(format!("{FENCE_LIB}{CLOCK_LIB}{LENGTHEN_LIB}{RENEW}")),
            release: fenced(RELEASE),
            give_back: queued(GIVE_BACK),
            inspect: LuaScript::new(format!("{HOLD_LIB}{INSPECT}")),
            abandon: queued(ABANDON),
            inspect_queue: LuaScript::new(format!(
                "{publish}{ABOVE_LIB}{CLOCK_LIB}{QUEUE_LIB}{HOLD_LIB}{INSPECT_QUEUE}"
            )),
            grant: LuaScript::new(format!("{ABOVE_LIB}{REPORTED_FENCE_LIB}{CLOCK_LIB}{LENGTHEN_LIB}{GRANT}")),
            read_fence: LuaScript::new(format!("{REPORTED_FENCE_LIB}{READ_FENCE}")),
            acquire_shared: leased(ACQUIRE_SHARED),
            renew_shared: leased(RENEW_SHARED),
            release_shared: leased(RELEASE_SHARED),
            give_back_shared: leased(GIVE_BACK_SHARED),
        }
    }

    /// Every lock script, for loading them up front.
    pub fn all(&self) -> [&LuaScript; 13] {
        [
            &self.acquire,
            &self.renew,
            &self.release,
            &self.give_back,
            &self.inspect,
            &self.abandon,
            &self.inspect_queue,
            &self.grant,
            &self.read_fence,
            &self.acquire_shared,
            &self.renew_shared,
            &self.release_shared,
            &self.give_back_shared,
        ]
    }

    /// `SCRIPT LOAD`s every lock script (on every node of a Cluster), so that the first
    /// call of each is a plain `EVALSHA` (a node that lacks one is sent it whole). Scripts built on this layer (the stored
    /// results') are not among them: a client loads those beside these when it connects.
    pub async fn load_all<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<()> {
        for script in self.all() {
            script.load_async(conn).await?;
        }
        Ok(())
    }
}

/// One `EVALSHA` of a script with its keys and arguments, built once and sent as often
/// as needed.
pub struct Invocation {
    script: &'static LuaScript,
    cmd: Cmd,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation").finish_non_exhaustive()
    }
}

impl Invocation {
    /// `EVALSHA <sha> <number of keys> <keys...>`; add the arguments with [`arg`](Self::arg).
    pub fn new(script: &'static LuaScript, keys: &[&str]) -> Self {
        let mut cmd = cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        Invocation { script, cmd }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call, loading the script again if the server lost it, and once more on
    /// a fresh connection if the connection broke under it. Every script of this crate
    /// is idempotent per request (each grant is recorded under its request), so a call the broken
    /// connection did deliver changes nothing the second time.
    pub async fn run<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<Value> {
        self.run_again_if_broken(conn).await.map(|(reply, _)| reply)
    }

    /// As [`run`](Self::run), also telling whether the call was sent twice (so that its
    /// first delivery may have been applied, and the reply is to the second).
    pub async fn run_again_if_broken<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<(Value, bool)> {
        match self.run_once(conn).await {
            Err(err) if connection_broke(&err) => {
                tracing::debug!(%err, "the connection broke under a script call; sending it again");
                self.run_once(conn).await.map(|reply| (reply, true))
            }
            other => other.map(|reply| (reply, false)),
        }
    }

    async fn run_once<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<Value> {
        match self.cmd.query_async(conn).await {
            // Sent whole to the node that lacks it (routed by its first key, as the
            // `EVALSHA` was), not loaded on every node: one node down would fail that.
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(sha1 = self.script.get_hash(), "the server lacks a script; sending it whole");
                self.eval().query_async(conn).await
            }
            other => other,
        }
    }

    /// The same call as `EVAL <text>`: the `EVALSHA` command with its hash replaced.
    fn eval(&self) -> Cmd {
        let mut eval = cmd("EVAL");
        eval.arg(self.script.code());
        for arg in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// Waits until `ack.replicas` replicas have every write this connection made so far (the
/// grant or renewal just sent on it), or `ack.timeout`; returns how many acknowledged.
///
/// `WAIT` blocks the connection it is sent on, so it goes on a connection of its own
/// (never the one every lease shares), and only after a write worth acknowledging. It is
/// pipelined behind a read of the hold's key, which routes it, on a Cluster, to the node
/// (and the connection) that took the write.
pub async fn wait_replicas<C: ConnectionLike + Send>(conn: &mut C, hold: &str, ack: ReplicaAck) -> RedisResult<u32> {
    let mut pipe = redis::pipe();
    pipe.cmd("PTTL").arg(hold).ignore().cmd("WAIT").arg(ack.replicas).arg(wait_millis(ack.timeout));
    let (acked,): (u32,) = pipe.query_async(conn).await?;
    Ok(acked)
}

/// Whether the connection broke (reset, closed, refused) rather than the server
/// answering or the time running out: a reconnecting connection can send again.
fn connection_broke(err: &redis::RedisError) -> bool {
    !err.is_timeout() && (err.is_connection_dropped() || err.is_connection_refusal() || err.is_io_error())
}

/// `WAIT`'s timeout in ms, never 0 (which would wait forever).
fn wait_millis(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A ttl in whole milliseconds, rounded up: the server must keep a hold at least as long
/// as the client counts on it.
pub fn ttl_millis(ttl: Duration) -> u64 {
    let nanos = ttl.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_sets_differ_in_the_publishing_command_alone() {
        let (classic, sharded) = (Publish::Classic.scripts().all(), Publish::Sharded.scripts().all());
        for (classic, sharded) in classic.iter().zip(sharded) {
            let spublish = classic.code().replace(PUBLISH_LIB, SPUBLISH_LIB);
            assert_eq!(spublish, sharded.code());
            assert_eq!(classic.code().contains(PUBLISH_LIB), classic.get_hash() != sharded.get_hash());
        }
        for publishing in [&Publish::Sharded.scripts().release, &Publish::Sharded.scripts().acquire] {
            assert!(publishing.code().starts_with(SPUBLISH_LIB));
        }
        assert!(std::ptr::eq(scripts(), Publish::Classic.scripts()));
    }

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(10)), 10);
        assert_eq!(ttl_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
        assert_eq!(wait_millis(Duration::from_micros(10)), 1);
    }
}
