//! The edge's side of the RPC sessions: a `RegistrationServer` on each control stream and
//! a `ConfigurationManager` client for configuration pushes. Public so that a test can
//! stand up a bare edge of its own (one that routes requests after an unregistration, say)
//! with the registration answered as the mock edge answers it.

use std::sync::Arc;
use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::RpcSystem;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use uuid::Uuid;

use cftunnel_tunnel::rpc::{LocalWorker, RpcError, RpcStream};
use cftunnel_tunnel::tunnelrpc_capnp::{configuration_manager, registration_server};
use cftunnel_tunnel::{ConnectionDetails, EdgeRefusal};

/// What a connector sent in `registerConnection`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationRecord {
    /// `auth.accountTag`.
    pub account_tag: String,
    /// `auth.tunnelSecret`.
    pub tunnel_secret: Vec<u8>,
    /// `tunnelId` (16 raw bytes).
    pub tunnel_id: Vec<u8>,
    /// `connIndex`.
    pub conn_index: u8,
    /// `options.client.clientId`.
    pub client_id: Vec<u8>,
    /// `options.client.features`.
    pub features: Vec<String>,
    /// `options.client.version`.
    pub version: String,
    /// `options.client.arch`.
    pub arch: String,
    /// `options.originLocalIp`.
    pub origin_local_ip: Vec<u8>,
    /// `options.numPreviousAttempts`.
    pub num_previous_attempts: u8,
}

/// Decisions and notifications of an edge-side registration server.
pub trait RegistrationHooks: Send + Sync + 'static {
    /// Answers `registerConnection`: the connection's details, or a refusal.
    fn register(&self, record: RegistrationRecord) -> Result<ConnectionDetails, EdgeRefusal>;
    /// Told of `unregisterConnection`, after [`unregister_delay`](Self::unregister_delay).
    fn unregister(&self);
    /// How long `unregisterConnection` takes before it is acted on and answered.
    fn unregister_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// Given the document of `updateLocalConfiguration`.
    fn local_config(&self, config: Vec<u8>);
}

struct Server {
    hooks: Arc<dyn RegistrationHooks>,
}

fn read_record(
    p: registration_server::register_connection_params::Reader<'_>,
) -> Result<RegistrationRecord, capnp::Error> {
    let auth = p.get_auth()?;
    let opts = p.get_options()?;
    let client = opts.get_client()?;
    let mut features = Vec::new();
    for f in client.get_features()?.iter() {
        features.push(f?.to_string()?);
    }
    Ok(RegistrationRecord {
        account_tag: auth.get_account_tag()?.to_string()?,
        tunnel_secret: auth.get_tunnel_secret()?.to_vec(),
        tunnel_id: p.get_tunnel_id()?.to_vec(),
        conn_index: p.get_conn_index(),
        client_id: client.get_client_id()?.to_vec(),
        features,
        version: client.get_version()?.to_string()?,
        arch: client.get_arch()?.to_string()?,
        origin_local_ip: opts.get_origin_local_ip()?.to_vec(),
        num_previous_attempts: opts.get_num_previous_attempts(),
    })
}

impl registration_server::Server for Server {
    async fn register_connection(
        self: capnp::capability::Rc<Self>,
        params: registration_server::RegisterConnectionParams,
        mut results: registration_server::RegisterConnectionResults,
    ) -> Result<(), capnp::Error> {
        let record = read_record(params.get()?)?;
        let reply = self.hooks.register(record);
        let result = results.get().init_result().init_result();
        match reply {
            Ok(d) => {
                let mut b = result.init_connection_details();
                b.set_uuid(d.uuid.as_bytes());
                b.set_location_name(d.location.as_str());
                b.set_tunnel_is_remotely_managed(d.remotely_managed);
            }
            Err(e) => {
                let mut b = result.init_error();
                b.set_cause(e.cause.as_str());
                b.set_retry_after(i64::try_from(e.retry_after.as_nanos()).unwrap_or(i64::MAX));
                b.set_should_retry(e.should_retry);
            }
        }
        Ok(())
    }

    async fn unregister_connection(
        self: capnp::capability::Rc<Self>,
        _: registration_server::UnregisterConnectionParams,
        _: registration_server::UnregisterConnectionResults,
    ) -> Result<(), capnp::Error> {
        let delay = self.hooks.unregister_delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.hooks.unregister();
        Ok(())
    }

    async fn update_local_configuration(
        self: capnp::capability::Rc<Self>,
        params: registration_server::UpdateLocalConfigurationParams,
        _: registration_server::UpdateLocalConfigurationResults,
    ) -> Result<(), capnp::Error> {
        self.hooks
            .local_config(params.get()?.get_config()?.to_vec());
        Ok(())
    }
}

/// Serves a `RegistrationServer` over a control stream. The returned
/// receiver fires when the session ends.
pub async fn serve_registration<R, W>(
    worker: &LocalWorker,
    stream: RpcStream<R, W>,
    hooks: Arc<dyn RegistrationHooks>,
) -> Result<oneshot::Receiver<()>, RpcError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (done_tx, done_rx) = oneshot::channel();
    worker
        .spawn(move || async move {
            let client: registration_server::Client = capnp_rpc::new_client(Server { hooks });
            let rpc = RpcSystem::new(Box::new(stream.network(Side::Server)), Some(client.client));
            if let Err(e) = rpc.await {
                tracing::debug!(error = %e, "registration session ended");
            }
            let _ = done_tx.send(());
        })
        .await?;
    Ok(done_rx)
}

/// Calls `updateConfiguration(version, config)` over a fresh RPC stream
/// (the RPC signature must already be written). Returns
/// `(latestAppliedVersion, err)`.
pub(crate) async fn push_config<R, W>(
    worker: &LocalWorker,
    stream: RpcStream<R, W>,
    version: i32,
    config: Vec<u8>,
    timeout: Duration,
) -> Result<(i32, String), RpcError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    worker
        .spawn(move || async move {
            let mut rpc = RpcSystem::new(Box::new(stream.network(Side::Client)), None);
            let disconnector = rpc.get_disconnector();
            let client: configuration_manager::Client = rpc.bootstrap(Side::Server);
            let task = tokio::task::spawn_local(rpc);
            let call = async {
                let mut req = client.update_configuration_request();
                req.get().set_version(version);
                req.get().set_config(&config);
                let resp = req.send().promise.await?;
                let r = resp.get()?.get_result()?;
                Ok::<_, RpcError>((r.get_latest_applied_version(), r.get_err()?.to_string()?))
            };
            let res = tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(RpcError::Timeout));
            drop(client);
            let _ = tokio::time::timeout(Duration::from_secs(1), disconnector).await;
            task.abort();
            let _ = tx.send(res);
        })
        .await?;
    rx.await.map_err(|_| RpcError::WorkerGone)?
}

/// A fresh per-connection id for `ConnectionDetails.uuid`.
pub(crate) fn new_connection_id() -> Uuid {
    Uuid::new_v4()
}
