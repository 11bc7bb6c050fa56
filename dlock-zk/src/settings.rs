//! What the backend and all its sessions share: the configuration, the ACL of the nodes
//! this client creates, and what the server was found to support.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use zookeeper_client as zk;

use crate::config::ZkConfig;
use dlock_core::ConnectConfig;

/// What the backend and all its sessions share.
pub(crate) struct Settings {
    pub(crate) config: ZkConfig,
    /// The ACL of every node this client creates.
    pub(crate) acl: Vec<zk::Acl>,
    /// Whether the server knows container nodes (3.5+); lock znodes are plain persistent
    /// nodes otherwise and stay when empty.
    pub(crate) containers: AtomicBool,
}

impl Settings {
    pub(crate) fn new(config: ZkConfig) -> Self {
        let acl = if config.authenticates() {
            // The creator's identity may do everything, others may only look.
            vec![
                zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed()),
                zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
            ]
        } else {
            zk::Acls::anyone_all().to_vec()
        };
        Settings { config, acl, containers: AtomicBool::new(true) }
    }

    pub(crate) fn acls(&self) -> zk::Acls<'_> {
        zk::Acls::new(&self.acl)
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.config.op_timeout()
    }
}
