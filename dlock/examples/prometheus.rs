//! Serves dlock's metrics to Prometheus while a few tasks take turns on a lock.
//!
//! ```text
//! cargo run -p dlock --example prometheus -- [URL] [ADDR]
//! curl http://127.0.0.1:9898/metrics
//! ```
//!
//! URL defaults to `memory://example`; ADDR to `127.0.0.1:9898`. Any recorder of the
//! `metrics` facade works the same way; this one renders the Prometheus text format.

use std::time::Duration;

use dlock::{LockName, LockOptions};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://example".into());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9898".into());
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let locker = dlock::connect(&url).await?;
    for worker in 0..4 {
        let locker = locker.clone();
        tokio::spawn(async move {
            let name = LockName::new("example/prometheus").expect("a valid name");
            let opts = LockOptions::new().wait(Duration::from_secs(5));
            loop {
                match locker.acquire(&name, &opts).await {
                    Ok(lease) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let _ = lease.release().await;
                    }
                    Err(err) => eprintln!("worker {worker}: {err}"),
                }
            }
        });
    }

    let listener = TcpListener::bind(&addr).await?;
    println!("metrics of {} at http://{addr}/metrics", dlock::redact(&url));
    loop {
        let (mut socket, _) = listener.accept().await?;
        let body = metrics.render();
        tokio::spawn(async move {
            // One request per connection; what it asked for does not matter.
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
        });
    }
}
