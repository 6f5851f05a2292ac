//! WebSocket upgrades: the client's and the backend's connections, once both have switched
//! protocols, are joined and their bytes copied both ways until either side ends.
//!
//! The client's side is a hyper connection's upgrade (standalone listener) or a
//! [`ClientUpgrade`] the tunnel connector puts in the request; a [`SessionHold`] keeps the
//! client connection's place under the listener's limit while the session lasts. Only
//! WebSocket is spliced: a raw tunnel of another protocol past the router would carry later
//! requests around routing and filters.
//!
//! A session is ended by the proxy too when no bytes have moved either way for the idle
//! timeout, or a peer has read nothing it was sent for the send timeout ([`SessionLimits`]):
//! otherwise a session whose peers vanished, or whose client stopped reading, would hold its
//! place (and a drain) until a peer closes.

use crate::body::BoxError;
use crate::forward::UpstreamBody;
use http::{header, HeaderMap, HeaderValue, Response};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

mod liveness;

use liveness::{Metered, Peer, Traffic};
pub use liveness::{SessionLimits, DEFAULT_IDLE_TIMEOUT};

/// A byte stream after an HTTP upgrade.
pub trait UpgradedIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> UpgradedIo for T {}

type UpgradeFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Box<dyn UpgradedIo>, BoxError>> + Send>,
>;

/// Request extension for upgrades whose client side is not a hyper connection (the tunnel):
/// resolves to the client's byte stream once the `101` has been delivered to it.
#[derive(Clone)]
pub struct ClientUpgrade(Arc<std::sync::Mutex<Option<UpgradeFuture>>>);

impl std::fmt::Debug for ClientUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientUpgrade")
    }
}

impl ClientUpgrade {
    pub fn new<F, Io, E>(upgrade: F) -> Self
    where
        F: std::future::Future<Output = Result<Io, E>> + Send + 'static,
        Io: UpgradedIo + 'static,
        E: Into<BoxError>,
    {
        let fut: UpgradeFuture = Box::pin(async move {
            upgrade
                .await
                .map(|io| Box::new(io) as Box<dyn UpgradedIo>)
                .map_err(Into::into)
        });
        Self(Arc::new(std::sync::Mutex::new(Some(fut))))
    }

    async fn take(self) -> Result<Box<dyn UpgradedIo>, BoxError> {
        let fut = self.0.lock().ok().and_then(|mut slot| slot.take());
        match fut {
            Some(fut) => fut.await,
            None => Err("upgrade already taken".into()),
        }
    }
}

/// Request extension: what the client's connection holds while it is open (its place under the
/// listener's connection limit). An upgraded session outlives that HTTP connection on the same
/// socket, so the proxy keeps this until the session's splice ends.
#[derive(Clone)]
pub struct SessionHold {
    _held: Arc<dyn std::any::Any + Send + Sync>,
}

impl SessionHold {
    pub fn new<T: Send + Sync + 'static>(held: Arc<T>) -> Self {
        Self { _held: held }
    }
}

impl std::fmt::Debug for SessionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionHold")
    }
}

/// The client's side of an upgrade: a hyper connection's, or another's (the tunnel's).
enum ClientSide {
    Hyper(hyper::upgrade::OnUpgrade),
    Other(ClientUpgrade),
}

/// A WebSocket upgrade a request asks for: the client's side of the connection to be, and what
/// the client's connection holds while the session is open.
pub(crate) struct Upgrade {
    client_side: ClientSide,
    hold: Option<SessionHold>,
}

impl Upgrade {
    /// Takes the upgrade out of a request's extensions. `None` for a request that is not a
    /// WebSocket upgrade, or whose client side cannot be upgraded; it is forwarded as a plain
    /// request then.
    pub(crate) fn take(parts: &mut http::request::Parts) -> Option<Self> {
        if !is_upgrade(&parts.headers) {
            return None;
        }
        // Exactly the protocol that is spliced goes on: with a second `Upgrade` value a
        // backend could switch to one (`h2c`) whose bytes would then pass the router raw.
        parts
            .headers
            .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let client_side = match parts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
            Some(on) => Some(ClientSide::Hyper(on)),
            None => parts
                .extensions
                .remove::<ClientUpgrade>()
                .map(ClientSide::Other),
        };
        let hold = parts.extensions.remove::<SessionHold>();
        client_side.map(|client_side| Self { client_side, hold })
    }

    /// Joins the client's and the backend's upgraded connections after the backend's `101`,
    /// counting the session in `sessions` while it is open; the client connection's hold is
    /// kept until the session ends.
    pub(crate) fn splice(self, response: &mut Response<UpstreamBody>, sessions: &Sessions) {
        let Self { client_side, hold } = self;
        let backend_side = hyper::upgrade::on(&mut *response);
        let gauge = sessions.open.clone();
        let limits = sessions.limits;
        // Taken before the `101` goes out, so a drain that finds the request ended finds
        // the session open.
        let open = sessions.ended.subscribe();
        tokio::spawn(async move {
            let _open = open;
            let _hold = hold;
            let client = async {
                match client_side {
                    ClientSide::Hyper(on) => on
                        .await
                        .map(|io| Box::new(hyper_util::rt::TokioIo::new(io)) as Box<dyn UpgradedIo>)
                        .map_err(BoxError::from),
                    ClientSide::Other(up) => up.take().await,
                }
            };
            let backend = async { backend_side.await.map_err(BoxError::from) };
            let (mut client, backend) = match tokio::try_join!(client, backend) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed");
                    return;
                }
            };
            gauge.inc();
            splice(&mut client, hyper_util::rt::TokioIo::new(backend), limits).await;
            gauge.dec();
        });
    }
}

/// The upgraded sessions of a proxy. They outlive the requests that opened them (a request
/// ends at its `101`), so a drain waits for them on their own ([`Sessions::closed`]).
#[derive(Debug)]
pub(crate) struct Sessions {
    /// Sessions spliced now (`websocket_active_sessions`).
    open: Gauge,
    /// Every session, from its `101` until it ends, holds a receiver of this; it is closed
    /// once none is left. Touched once per upgrade, never by other requests.
    ended: watch::Sender<()>,
    /// When the proxy ends a session its peers have not.
    limits: SessionLimits,
}

impl Sessions {
    /// Sessions counted in `open` while they are spliced, ended past `limits`.
    pub(crate) fn new(open: Gauge, limits: SessionLimits) -> Self {
        let (ended, _) = watch::channel(());
        Self {
            open,
            ended,
            limits,
        }
    }

    /// Resolves once no upgraded session is open (at once when none is). Sessions that open
    /// meanwhile are waited for too.
    pub(crate) async fn closed(&self) {
        self.ended.closed().await;
    }
}

/// Copies both ways until either side ends its half, then ends both connections, as Go's
/// reverse proxy does (and `cloudflared` for its streams): no half-closed session lingers on
/// a peer that ignores the other's end of stream. A session past its `limits` is ended the
/// same way.
async fn splice(client: &mut Box<dyn UpgradedIo>, backend: impl UpgradedIo, limits: SessionLimits) {
    use tokio::io::AsyncWriteExt as _;
    let traffic = Traffic::default();
    let client = Metered::new(client, &traffic, Peer::Client);
    let backend = Metered::new(backend, &traffic, Peer::Backend);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut backend_read, mut backend_write) = tokio::io::split(backend);
    tokio::select! {
        _ = tokio::io::copy(&mut client_read, &mut backend_write) => {}
        _ = tokio::io::copy(&mut backend_read, &mut client_write) => {}
        ended = liveness::watch(&traffic, limits) => {
            tracing::debug!(reason = ended.label(), "websocket session ended by the proxy");
        }
    }
    // Bounded: a TLS close_notify to a peer that has stopped reading could wait forever.
    let _ = tokio::time::timeout(
        SPLICE_SHUTDOWN,
        futures_util::future::join(client_write.shutdown(), backend_write.shutdown()),
    )
    .await;
}

/// How long ending a spliced session may take before its connections are simply dropped.
const SPLICE_SHUTDOWN: Duration = Duration::from_secs(5);

/// Whether a `101` switched to WebSocket, the one protocol spliced.
pub(crate) fn switched_to_websocket(headers: &HeaderMap) -> bool {
    let mut upgrade = headers.get_all(header::UPGRADE).iter();
    upgrade
        .next()
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
        && upgrade.next().is_none()
}

/// A WebSocket upgrade. Other protocols (`h2c`, ...) are never spliced: a raw tunnel past the
/// router would carry later requests around routing and filters.
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
        && headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}
