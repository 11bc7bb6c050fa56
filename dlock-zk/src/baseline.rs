//! The raw baseline for benchmarks: the requests of an uncontended acquire and release,
//! of a campaign and resignation, and of a renewal, sent through `zookeeper-client`
//! directly.

use async_trait::async_trait;
use dlock_core::{ConnectConfig, HoldKind, LockError, LockName, OwnerId, RawBaseline, DEFAULT_TTL, MAX_DURATION};
use zookeeper_client as zk;

use crate::backend::token_of;
use crate::config::ZkConfig;
use crate::error::{lock_error, timed_out};
use crate::results;
use crate::session::Tls;
use crate::settings::Settings;
use crate::znode;

/// The requests dlock sends for one uncontended acquire and release (a create of an
/// ephemeral-sequential node with the list of the queue pipelined behind it, then a
/// delete), for a campaign (the same, with the store of the value between) and for one
/// renewal (a read of the node, in a multi-read), over one session.
pub struct ZkBaseline {
    client: zk::Client,
    settings: Settings,
    owner: OwnerId,
}

impl std::fmt::Debug for ZkBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBaseline").finish_non_exhaustive()
    }
}

impl ZkBaseline {
    /// Opens a session with the default ttl as its timeout.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        let settings = Settings::new(config);
        let mut connector = zk::Client::connector().with_session_timeout(DEFAULT_TTL).with_fail_eagerly();
        connector = settings.config.authenticate(connector);
        let tls = Tls::load(&settings.config)?;
        if let Some(tls) = &tls {
            connector = connector.with_tls(tls.options());
        }
        let connect_string = settings.config.connect_string();
        let attempt = async {
            match tls {
                Some(_) => connector.secure_connect(&connect_string).await,
                None => connector.connect(&connect_string).await,
            }
        };
        let timeout = settings.config.connect_timeout();
        let client = match tokio::time::timeout(timeout, attempt).await {
            Ok(client) => client.map_err(|e| lock_error("connect", e))?,
            Err(_) => return Err(timed_out("connect", timeout)),
        };
        Ok(ZkBaseline { client, settings, owner: OwnerId::new("raw-baseline")? })
    }

    /// The acquire of an uncontended hold of `kind`: the create of its ephemeral-sequential
    /// node with the list of the queue pipelined behind it (creating the lock's node when
    /// missing). The node's path and stat, whose czxid is the hold's token.
    async fn create_node(&self, lock_path: &str, kind: HoldKind) -> Result<(String, zk::Stat), LockError> {
        let prefix = znode::node_prefix(lock_path, "raw-baseline", kind);
        let data = znode::encode_data(&self.owner, 1);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.settings.acls());
        loop {
            let create = self.client.create(&prefix, &data, &options);
            let list = self.client.list_children(lock_path);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, sequence)) => {
                    listed.map_err(|e| lock_error("list", e))?;
                    return Ok((format!("{prefix}{sequence}"), stat));
                }
                Err(zk::Error::NoNode) => self.ensure_lock_node(lock_path).await?,
                Err(err) => return Err(lock_error("create", err)),
            }
        }
    }

    async fn ensure_lock_node(&self, lock_path: &str) -> Result<(), LockError> {
        let acls = self.settings.acls();
        self.client
            .mkdir(lock_path, &zk::CreateMode::Persistent.with_acls(acls))
            .await
            .map_err(|e| lock_error("create the lock znode", e))
    }
}

#[async_trait]
impl RawBaseline for ZkBaseline {
    async fn acquire_release(&self, name: &LockName) -> Result<(), LockError> {
        self.acquire_release_kind(name, HoldKind::Exclusive).await
    }

    /// The same requests for every kind: only the node's name differs.
    async fn acquire_release_kind(&self, name: &LockName, kind: HoldKind) -> Result<(), LockError> {
        let (path, _) = self.create_node(&self.settings.config.lock_path(name), kind).await?;
        self.client.delete(&path, None).await.map_err(|e| lock_error("delete", e))
    }

    /// The acquire, the store's read of the result node and its transaction (the hold
    /// node's existence checked, the record set over the version read or created), and
    /// the release, as `results::store` sends them for an uncontended hold.
    async fn campaign_resign(&self, name: &LockName, value: &[u8]) -> Result<(), LockError> {
        let (hold_path, stat) = self.create_node(&self.settings.config.lock_path(name), HoldKind::Exclusive).await?;
        let path = self.settings.config.result_path(name);
        let record = results::encode(token_of(&stat), results::expiry_ms(MAX_DURATION), value);
        // Uncontended, the kept record is always of an earlier token (the library's or an
        // earlier raw run's), so the version read is all the store needs from it.
        let version = results::read(&self.client, &path)
            .await
            .map_err(|e| lock_error("read the result", e))?
            .map(|(_, stat)| stat.version);
        let mut writer = self.client.new_multi_writer();
        let options = zk::CreateMode::Persistent.with_acls(self.settings.acls());
        writer
            .add_check_version(&hold_path, -1)
            .and_then(|()| match version {
                Some(version) => writer.add_set_data(&path, &record, Some(version)),
                None => writer.add_create(&path, &record, &options),
            })
            .map_err(|e| lock_error("prepare the result's transaction", e))?;
        match writer.commit().await {
            Ok(_) => {}
            Err(zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoNode }) => {
                return Err(LockError::not_held())
            }
            Err(err) => return Err(lock_error("store the result", err.into())),
        }
        self.client.delete(&hold_path, None).await.map_err(|e| lock_error("delete", e))
    }

    async fn renew(&self, name: &LockName) -> Result<(), LockError> {
        let mut reader = self.client.new_multi_reader();
        reader.add_get_data(&self.settings.config.lock_path(name)).map_err(|e| lock_error("read", e))?;
        reader.commit().await.map(drop).map_err(|e| lock_error("read", e))
    }
}
