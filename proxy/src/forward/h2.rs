//! One multiplexed HTTP/2 connection to one backend: an h2c backend, or a TLS backend that
//! picked `h2` through ALPN.
//!
//! The connection, not the request URI, decides where a request goes, so each request keeps its
//! own host as `:authority` (the client's, or a URL rewrite's): HTTP/2 servers read the host from
//! there, not from a `Host` header. A pool keyed by URI would instead open a connection per host
//! a client cared to send. The connection is dialed on first use and again once it has closed.

use super::connector::{ConnectErrorKind, Connector, Stream};
use super::{ForwardError, UpstreamBody};
use crate::body::ProxyBody;
use arc_swap::ArcSwapOption;
use http::{Request, Response};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(super) type Sender = http2::SendRequest<ProxyBody>;

#[derive(Debug)]
pub(super) struct H2Channel {
    connector: Connector,
    /// The open connection; readers take a handle without a lock.
    current: ArcSwapOption<Sender>,
    /// Held while dialing, so concurrent first requests share one new connection.
    dialing: tokio::sync::Mutex<()>,
    /// Whether the backend picked `h2` on its latest TLS handshake: new connections are then
    /// dialed here, one at a time, rather than by every waiting HTTP/1.1 request.
    picked: AtomicBool,
}

/// What a dial produced: an HTTP/2 connection, or a TLS connection on which the backend picked
/// HTTP/1.1 (for the caller's HTTP/1.1 pool).
pub(super) enum Dialed {
    Http2(Sender),
    Http1(Stream),
}

impl H2Channel {
    pub(super) fn new(connector: Connector) -> Self {
        Self {
            connector,
            current: ArcSwapOption::empty(),
            dialing: tokio::sync::Mutex::new(()),
            picked: AtomicBool::new(false),
        }
    }

    /// Sends `req` (an absolute URI whose authority is the request's host) to an h2c backend.
    pub(super) async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let sender = match self.open() {
            Some(sender) => sender,
            // Boxed: dialing is rare, and its future would otherwise be carried by every request's.
            None => match Box::pin(self.dial()).await? {
                Dialed::Http2(sender) => sender,
                Dialed::Http1(_) => return Err(ForwardError::Other("backend refused h2".into())),
            },
        };
        exchange(sender, req).await
    }

    /// The open connection, if any.
    pub(super) fn open(&self) -> Option<Sender> {
        self.current
            .load()
            .as_deref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    /// Whether the backend picked `h2` when it was last dialed.
    pub(super) fn picked(&self) -> bool {
        self.picked.load(Ordering::Relaxed)
    }

    /// The open connection, or a new one. A TLS backend that picks HTTP/1.1 on the new
    /// connection gets it back as [`Dialed::Http1`].
    pub(super) async fn dial(&self) -> Result<Dialed, ForwardError> {
        let _dialing = self.dialing.lock().await;
        if let Some(sender) = self.open() {
            return Ok(Dialed::Http2(sender));
        }
        let io = self.connector.connect().await.map_err(|e| match e.kind {
            ConnectErrorKind::Tls => ForwardError::Tls(e),
            ConnectErrorKind::Dial | ConnectErrorKind::Timeout => ForwardError::Dial(e),
        })?;
        if io.is_tls() && !io.negotiated_h2() {
            self.picked.store(false, Ordering::Relaxed);
            return Ok(Dialed::Http1(io));
        }
        self.install(io).await.map(Dialed::Http2)
    }

    /// Makes `io`, a connection on which the backend picked `h2`, the open connection, unless
    /// another request installed one first (then `io` is closed and that one is used).
    pub(super) async fn adopt(&self, io: Stream) -> Result<Sender, ForwardError> {
        let _dialing = self.dialing.lock().await;
        match self.open() {
            Some(sender) => Ok(sender),
            None => self.install(io).await,
        }
    }

    async fn install(&self, io: Stream) -> Result<Sender, ForwardError> {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(io))
            .await
            .map_err(ForwardError::from_hyper)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP/2 backend connection ended");
            }
        });
        self.current.store(Some(Arc::new(sender.clone())));
        self.picked.store(true, Ordering::Relaxed);
        Ok(sender)
    }
}

/// Sends `req` (absolute URI) on `sender` once the connection can take another stream.
pub(super) async fn exchange(
    mut sender: Sender,
    mut req: Request<ProxyBody>,
) -> Result<Response<UpstreamBody>, ForwardError> {
    *req.version_mut() = http::Version::HTTP_2;
    sender.ready().await.map_err(ForwardError::from_hyper)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(ForwardError::from_hyper)?;
    Ok(resp.map(UpstreamBody::unpooled))
}
