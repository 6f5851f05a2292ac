//! One multiplexed HTTP/2 (prior knowledge) connection to one h2c backend.
//!
//! The connection, not the request URI, decides where a request goes, so each request keeps its
//! own host as `:authority` (the client's, or a URL rewrite's): HTTP/2 servers read the host from
//! there, not from a `Host` header. A pool keyed by URI would instead open a connection per host
//! a client cared to send. The connection is dialed on first use and again once it has closed.

use super::connector::{ConnectErrorKind, Connector};
use super::{ForwardError, UpstreamBody};
use crate::body::ProxyBody;
use arc_swap::ArcSwapOption;
use http::{Request, Response};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::sync::Arc;

#[derive(Debug)]
pub(super) struct H2cChannel {
    connector: Connector,
    /// The open connection; readers take a handle without a lock.
    current: ArcSwapOption<http2::SendRequest<ProxyBody>>,
    /// Held while dialing, so concurrent first requests share one new connection.
    dialing: tokio::sync::Mutex<()>,
}

impl H2cChannel {
    pub(super) fn new(connector: Connector) -> Self {
        Self {
            connector,
            current: ArcSwapOption::empty(),
            dialing: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends `req` (an absolute URI whose authority is the request's host).
    pub(super) async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let mut sender = match self.open() {
            Some(sender) => sender,
            // Boxed: dialing is rare, and its future would otherwise be carried by every request's.
            None => Box::pin(self.dial()).await?,
        };
        sender.ready().await.map_err(ForwardError::from_hyper)?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(ForwardError::from_hyper)?;
        Ok(resp.map(UpstreamBody::unpooled))
    }

    fn open(&self) -> Option<http2::SendRequest<ProxyBody>> {
        self.current
            .load()
            .as_deref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    async fn dial(&self) -> Result<http2::SendRequest<ProxyBody>, ForwardError> {
        let _dialing = self.dialing.lock().await;
        if let Some(sender) = self.open() {
            return Ok(sender);
        }
        let io = self.connector.connect().await.map_err(|e| match e.kind {
            ConnectErrorKind::Tls => ForwardError::Tls(e),
            ConnectErrorKind::Dial | ConnectErrorKind::Timeout => ForwardError::Dial(e),
        })?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(io))
            .await
            .map_err(ForwardError::from_hyper)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "h2c backend connection ended");
            }
        });
        self.current.store(Some(Arc::new(sender.clone())));
        Ok(sender)
    }
}
