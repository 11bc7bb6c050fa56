//! Reading back what a client sent to a redis-server, with MONITOR.

use std::time::Duration;

use dlock_testkit::supervisor::redis::RedisServer;
use futures::{Stream, StreamExt};

/// One line of MONITOR output: who sent it (`lua` for a script's own calls) and the
/// command with its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub source: String,
    pub args: Vec<String>,
}

impl Sent {
    pub(crate) fn parse(line: &str) -> Option<Sent> {
        let open = line.find('[')?;
        let close = open + line[open..].find(']')?;
        // "[0 127.0.0.1:4242]" or "[0 lua]"
        let source = line[open + 1..close].split_once(' ')?.1.to_string();
        let args = line[close + 1..].split('"').skip(1).step_by(2).map(str::to_string).collect();
        Some(Sent { source, args })
    }

    pub(crate) fn command(&self) -> String {
        self.args.first().map(|c| c.to_ascii_lowercase()).unwrap_or_default()
    }

    pub(crate) fn is_script(&self, sha: &str) -> bool {
        self.command() == "evalsha" && self.args.get(1).is_some_and(|a| a == sha)
    }
}

/// Everything sent to the server from now until [`Monitor::collect`].
pub(crate) struct Monitor {
    lines: std::pin::Pin<Box<dyn Stream<Item = String> + Send>>,
    admin: redis::aio::MultiplexedConnection,
}

impl Monitor {
    pub(crate) async fn start(server: &RedisServer) -> Monitor {
        let client = redis::Client::open(server.url()).unwrap();
        let monitor = client.get_async_monitor().await.expect("MONITOR");
        let admin = client.get_multiplexed_async_connection().await.unwrap();
        Monitor { lines: Box::pin(monitor.into_on_message::<String>()), admin }
    }

    /// Sends a marker and returns what was sent before it, without the marker.
    pub(crate) async fn collect(&mut self) -> Vec<Sent> {
        let marker = format!("marker-{:016x}", fastrand::u64(..));
        let _: String = redis::cmd("ECHO").arg(&marker).query_async(&mut self.admin).await.unwrap();
        let mut sent = Vec::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next())
                .await
                .expect("MONITOR output")
                .expect("MONITOR stream");
            let Some(entry) = Sent::parse(&line) else { continue };
            if entry.command() == "echo" && entry.args.get(1) == Some(&marker) {
                return sent;
            }
            sent.push(entry);
        }
    }
}

pub(crate) fn client_commands(sent: &[Sent]) -> Vec<&Sent> {
    sent.iter().filter(|s| s.source != "lua").collect()
}
