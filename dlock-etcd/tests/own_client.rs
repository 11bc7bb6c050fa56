//! Locks over the application's own `etcd_client::Client` (`EtcdConfig::with_client`):
//! on a server with authentication on, clients made from the application's client (which
//! carries the credentials; the lock's config has none) pass the suite's core properties.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::properties;
use dlock_conformance::{Fixture, Timing};
use dlock_core::{ConnectConfig, LockError, Locker};
use dlock_etcd::etcd_client::{Client, ConnectOptions};
use dlock_etcd::EtcdConfig;
use dlock_testkit::supervisor::etcd::{EtcdConfig as ServerConfig, EtcdServer};

const PASSWORD: &str = "s3cret";

struct Clients(EtcdServer);

impl Clients {
    async fn app_client(&self) -> Client {
        let options = ConnectOptions::new().with_user("root", PASSWORD);
        Client::connect([self.0.addr().to_string()], Some(options)).await.expect("the application's client")
    }
}

#[async_trait]
impl Fixture for Clients {
    fn timing(&self) -> Timing {
        Timing::SHORT
    }

    async fn client(&self) -> Arc<dyn Locker> {
        let config = EtcdConfig::new([self.0.addr().to_string()])
            .with_client(self.app_client().await)
            .with_op_timeout(Duration::from_secs(2));
        Arc::new(dlock_etcd::connect(config).await.expect("connect over the application's client"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_client_passes_the_core_properties() {
    let server = tokio::task::spawn_blocking(|| EtcdServer::start(&ServerConfig::default()))
        .await
        .expect("spawn_blocking")
        .expect("start etcd");
    let mut admin = Client::connect([server.addr().to_string()], None).await.expect("admin");
    admin.user_add("root", PASSWORD, None).await.expect("add user root");
    let _ = admin.role_add("root").await;
    admin.user_grant_role("root", "root").await.expect("grant the root role");
    admin.auth_enable().await.expect("enable authentication");

    // Without the application's client the lock's config has no credentials: refused.
    let bare = EtcdConfig::new([server.addr().to_string()]).with_connect_timeout(Duration::from_secs(2));
    assert!(matches!(dlock_etcd::connect(bare).await, Err(LockError::Refused { .. })));

    let clients = Clients(server);
    properties::core(&clients).await;

    // Credentials are the client's: a config that sets its own beside it is refused.
    let twice = EtcdConfig::new([clients.0.addr().to_string()])
        .with_credentials("root", PASSWORD)
        .with_client(clients.app_client().await);
    assert!(matches!(dlock_etcd::connect(twice).await, Err(LockError::InvalidInput(_))));
}
