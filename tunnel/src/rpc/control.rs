//! Connector side of the control stream: bootstrap the edge's
//! `RegistrationServer`, call `registerConnection` (pipelined on the
//! bootstrap promise, as `cloudflared` does), and later
//! `unregisterConnection`.

use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::RpcSystem;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use super::calls::Questioned;
use super::{LocalWorker, RpcError, RpcStream};
use crate::tunnelrpc_capnp::{connection_response, registration_server};

/// Everything `registerConnection` sends.
#[derive(Debug, Clone)]
pub(crate) struct RegisterParams {
    pub(crate) account_tag: String,
    pub(crate) tunnel_secret: Vec<u8>,
    pub(crate) tunnel_id: Uuid,
    pub(crate) conn_index: u8,
    pub(crate) client_id: Uuid,
    pub(crate) features: Vec<String>,
    pub(crate) version: String,
    pub(crate) arch: String,
    pub(crate) origin_local_ip: Vec<u8>,
    pub(crate) num_previous_attempts: u8,
}

/// A successful registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionDetails {
    /// Per-connection id chosen by the edge.
    pub uuid: Uuid,
    /// Colo code, e.g. `LHR`; cut to 256 bytes (marked `…`) when longer.
    pub location: String,
    /// Whether the tunnel's configuration is managed remotely.
    pub remotely_managed: bool,
}

/// A registration the edge refused (`ConnectionError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeRefusal {
    /// Cause text such as `EDUPCONN` or `Unauthorized: ...`; cut to 256 bytes (marked `…`)
    /// when longer.
    pub cause: String,
    /// The edge's hint; ignored for backoff, as `cloudflared` ignores it.
    pub retry_after: Duration,
    /// Whether the edge considers the error retryable.
    pub should_retry: bool,
}

impl EdgeRefusal {
    /// The edge already has this connection index from this connector.
    pub fn is_duplicate(&self) -> bool {
        self.cause == "EDUPCONN"
    }
}

pub(crate) enum RegisterOutcome {
    Registered(ConnectionDetails),
    Refused(EdgeRefusal),
}

enum Cmd {
    Unregister(Duration, oneshot::Sender<Result<(), RpcError>>),
}

/// `Send` handle on a running control session. Dropping it ends the session.
pub(crate) struct ControlSession {
    cmd: mpsc::Sender<Cmd>,
    closed: watch::Receiver<bool>,
}

impl ControlSession {
    /// Calls `unregisterConnection`, then closes the RPC session cleanly.
    pub(crate) async fn unregister(&self, timeout: Duration) -> Result<(), RpcError> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Cmd::Unregister(timeout, tx))
            .await
            .map_err(|_| RpcError::Failed("control session closed".into()))?;
        rx.await
            .map_err(|_| RpcError::Failed("control session closed".into()))?
    }

    /// Resolves once the RPC session over the control stream has ended.
    pub(crate) async fn closed(&self) {
        let mut rx = self.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// Starts the control session and registers. The session keeps running (and
/// the control stream stays open) until the returned handle is dropped.
pub(crate) async fn register<R, W>(
    worker: &LocalWorker,
    stream: RpcStream<R, W>,
    params: RegisterParams,
    rpc_timeout: Duration,
) -> Result<(ControlSession, RegisterOutcome), RpcError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (cmd_tx, cmd_rx) = mpsc::channel(4);
    let (closed_tx, closed_rx) = watch::channel(false);
    let (result_tx, result_rx) = oneshot::channel();
    worker
        .spawn(move || run(stream, params, rpc_timeout, cmd_rx, closed_tx, result_tx))
        .await?;
    let outcome = result_rx
        .await
        .map_err(|_| RpcError::Failed("control session ended".into()))??;
    Ok((
        ControlSession {
            cmd: cmd_tx,
            closed: closed_rx,
        },
        outcome,
    ))
}

async fn run<R, W>(
    stream: RpcStream<R, W>,
    params: RegisterParams,
    rpc_timeout: Duration,
    mut cmd_rx: mpsc::Receiver<Cmd>,
    closed_tx: watch::Sender<bool>,
    result_tx: oneshot::Sender<Result<RegisterOutcome, RpcError>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let network = Questioned::new(stream.gated_network(Side::Client), "the control stream");
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let disconnector = rpc.get_disconnector();
    let client: registration_server::Client = rpc.bootstrap(Side::Server);
    let rpc_task = tokio::task::spawn_local(async move {
        if let Err(e) = rpc.await {
            tracing::debug!(error = %e, "control rpc session ended");
        }
        let _ = closed_tx.send(true);
    });

    let outcome = tokio::time::timeout(rpc_timeout, call_register(&client, &params))
        .await
        .unwrap_or(Err(RpcError::Timeout));
    match outcome {
        Ok(RegisterOutcome::Registered(_)) => {
            if result_tx.send(outcome).is_err() {
                rpc_task.abort();
                return;
            }
        }
        Ok(RegisterOutcome::Refused(_)) => {
            // As `cloudflared` closes its RPC client on a refusal: Finish, Release and
            // Abort go out and the stream is ended, not reset, before the caller closes the
            // connection.
            drop(client);
            let _ = tokio::time::timeout(Duration::from_secs(1), disconnector).await;
            rpc_task.abort();
            let _ = result_tx.send(outcome);
            return;
        }
        Err(_) => {
            rpc_task.abort();
            let _ = result_tx.send(outcome);
            return;
        }
    }

    tokio::pin!(rpc_task);
    tokio::select! {
        cmd = cmd_rx.recv() => match cmd {
            Some(Cmd::Unregister(timeout, done)) => {
                let req = client.unregister_connection_request();
                let res = match tokio::time::timeout(timeout, req.send().promise).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(RpcError::from(e)),
                    Err(_) => Err(RpcError::Timeout),
                };
                drop(client);
                // Finish, Release and Abort, then the stream closes.
                let _ = tokio::time::timeout(Duration::from_secs(1), disconnector).await;
                let _ = done.send(res);
            }
            None => rpc_task.abort(),
        },
        _ = &mut rpc_task => {
            // The edge ended the session; wait for the owner to notice.
            let _ = cmd_rx.recv().await;
        }
    }
}

async fn call_register(
    client: &registration_server::Client,
    p: &RegisterParams,
) -> Result<RegisterOutcome, RpcError> {
    let mut req = client.register_connection_request();
    {
        let mut b = req.get();
        {
            let mut auth = b.reborrow().init_auth();
            auth.set_account_tag(p.account_tag.as_str());
            auth.set_tunnel_secret(&p.tunnel_secret);
        }
        b.set_tunnel_id(p.tunnel_id.as_bytes());
        b.set_conn_index(p.conn_index);
        let mut opts = b.init_options();
        opts.set_origin_local_ip(&p.origin_local_ip);
        opts.set_replace_existing(false);
        opts.set_compression_quality(0);
        opts.set_num_previous_attempts(p.num_previous_attempts);
        let mut ci = opts.init_client();
        ci.set_client_id(p.client_id.as_bytes());
        ci.set_version(p.version.as_str());
        ci.set_arch(p.arch.as_str());
        let mut features = ci.init_features(p.features.len() as u32);
        for (i, f) in p.features.iter().enumerate() {
            features.set(i as u32, f.as_str());
        }
    }
    let resp = req.send().promise.await?;
    let result = resp.get()?.get_result()?;
    match result.get_result().which()? {
        connection_response::result::Which::Error(e) => {
            let e = e?;
            Ok(RegisterOutcome::Refused(EdgeRefusal {
                cause: edge_text(e.get_cause()?),
                retry_after: Duration::from_nanos(e.get_retry_after().max(0) as u64),
                should_retry: e.get_should_retry(),
            }))
        }
        connection_response::result::Which::ConnectionDetails(d) => {
            let d = d?;
            let uuid = Uuid::from_slice(d.get_uuid()?).unwrap_or(Uuid::nil());
            Ok(RegisterOutcome::Registered(ConnectionDetails {
                uuid,
                location: edge_text(d.get_location_name()?),
                remotely_managed: d.get_tunnel_is_remotely_managed(),
            }))
        }
    }
}

/// The most of a text from the edge that is kept, in bytes: a refusal's cause and a location
/// name are a word or a sentence, but a message may carry megabytes of either, and both are
/// logged, the cause on every retry.
const EDGE_TEXT_BYTES: usize = 256;

/// A text from the edge, cut to [`EDGE_TEXT_BYTES`] on a character boundary and marked `…`
/// where it was cut. Bytes that are not UTF-8 are shown as `U+FFFD`: Go peers put any bytes in
/// a `Text`, and these texts are only logged and matched, so a stray byte must not turn a
/// registration the edge made into a failure retried without end.
fn edge_text(text: capnp::text::Reader<'_>) -> String {
    let bytes = text.as_bytes();
    let Some(head) = bytes
        .get(..EDGE_TEXT_BYTES)
        .filter(|_| bytes.len() > EDGE_TEXT_BYTES)
    else {
        return String::from_utf8_lossy(bytes).into_owned();
    };
    let head = match std::str::from_utf8(head) {
        // The cut went through a character: kept up to it.
        Err(e) if e.error_len().is_none() => &head[..e.valid_up_to()],
        _ => head,
    };
    format!("{}\u{2026}", String::from_utf8_lossy(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: &[u8]) -> String {
        edge_text(capnp::text::Reader::from(bytes))
    }

    #[test]
    fn edge_texts_are_cut_on_a_character_boundary() {
        assert_eq!(text(b"EDUPCONN"), "EDUPCONN");
        let whole = "x".repeat(EDGE_TEXT_BYTES);
        assert_eq!(text(whole.as_bytes()), whole, "kept whole");
        let long = format!("Unauthorized: {}", "x".repeat(1 << 20));
        let cut = text(long.as_bytes());
        assert_eq!(cut, format!("{}\u{2026}", &long[..EDGE_TEXT_BYTES]));
        // `é` is two bytes: the one that would be cut in two goes.
        let accents = "é".repeat(EDGE_TEXT_BYTES);
        let cut = text(format!("a{accents}").as_bytes());
        assert_eq!(
            cut,
            format!("a{}\u{2026}", "é".repeat(EDGE_TEXT_BYTES / 2 - 1))
        );
        // A byte that is not UTF-8 is shown, not refused; what is cut off is not read.
        assert_eq!(text(b"bad \xff byte"), "bad \u{FFFD} byte");
        let mut long_bad = b"\xff".to_vec();
        long_bad.extend(b"x".repeat(EDGE_TEXT_BYTES));
        assert_eq!(
            text(&long_bad),
            format!("\u{FFFD}{}\u{2026}", "x".repeat(EDGE_TEXT_BYTES - 1))
        );
        let mut tail = b"x".repeat(EDGE_TEXT_BYTES);
        tail.push(0xff);
        assert_eq!(
            text(&tail),
            format!("{}\u{2026}", "x".repeat(EDGE_TEXT_BYTES))
        );
    }
}
