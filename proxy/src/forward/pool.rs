//! Keep-alive HTTP/1.1 connections to one plain-HTTP backend.
//!
//! The generic pooled client costs, per request, a pool-key hash, a pool lock, a spawned task
//! that waits for the connection to become reusable, and several large future moves. A backend
//! here is one fixed address, so a connection is simply checked out, used for one exchange, and
//! put back when the response body has been read to the end, from the body itself: no task and
//! no key. Connections are reused last-in first-out, so connections left over from a burst sit
//! unused and are closed once idle longer than [`IDLE_TIMEOUT`].

use super::connector::{ConnectErrorKind, Connector};
use super::ForwardError;
use crate::body::ProxyBody;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

/// A connection unused for this long is closed instead of reused.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Connections of one backend that are waiting for their next request.
#[derive(Debug)]
pub(super) struct H1Pool {
    connector: Connector,
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
}

#[derive(Debug)]
struct Idle {
    sender: http1::SendRequest<ProxyBody>,
    since: Instant,
}

impl H1Pool {
    pub(super) fn new(connector: Connector, max_idle: usize) -> Arc<Self> {
        Arc::new(Self {
            connector,
            idle: Mutex::new(Vec::new()),
            max_idle,
        })
    }

    /// Sends `req` (origin-form URI) on an idle connection or a new one.
    ///
    /// A pooled connection the backend closed while it sat idle gives the request back
    /// unsent; it is then sent on the next connection, as the backend never saw it.
    pub(super) async fn send(
        self: &Arc<Self>,
        mut req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                // Boxed: dialing is rare, and its large future would otherwise be carried
                // (and copied) by every request's future.
                None => (Box::pin(self.dial()).await?, false),
            };
            match sender.try_send_request(req).await {
                // After a `101` the connection belongs to the upgrade, never to the pool.
                Ok(resp) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    return Ok(resp.map(UpstreamBody::unpooled));
                }
                Ok(resp) => {
                    let lease = Lease {
                        pool: self.clone(),
                        sender,
                    };
                    return Ok(resp.map(|body| UpstreamBody::leased(body, lease)));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(ForwardError::from_hyper(e.into_error())),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and ready.
    ///
    /// A connection is put back when its response has been read, which normally leaves it
    /// ready at once. One that is still busy (its request body is still being sent) is not
    /// waited for here: it goes back to the pool when it becomes ready.
    fn checkout(self: &Arc<Self>) -> Option<http1::SendRequest<ProxyBody>> {
        loop {
            let idle = self.idle.lock().ok()?.pop()?;
            if idle.sender.is_closed() || idle.since.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            let mut sender = idle.sender;
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match sender.poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => return Some(sender),
                Poll::Ready(Err(_)) => continue,
                Poll::Pending => {
                    let pool = self.clone();
                    tokio::spawn(async move {
                        if sender.ready().await.is_ok() {
                            pool.put_back(sender);
                        }
                    });
                }
            }
        }
    }

    async fn dial(&self) -> Result<http1::SendRequest<ProxyBody>, ForwardError> {
        let io = self.connector.connect().await.map_err(|e| match e.kind {
            ConnectErrorKind::Tls => ForwardError::Tls(e),
            ConnectErrorKind::Dial | ConnectErrorKind::Timeout => ForwardError::Dial(e),
        })?;
        let (sender, conn) = http1::Builder::new()
            .handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(ForwardError::from_hyper)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "backend connection ended");
            }
        });
        Ok(sender)
    }

    fn put_back(&self, sender: http1::SendRequest<ProxyBody>) {
        if sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.max_idle {
                idle.push(Idle {
                    sender,
                    since: Instant::now(),
                });
            }
        }
    }
}

/// A connection lent to one exchange, returned when its response body has ended.
#[derive(Debug)]
struct Lease {
    pool: Arc<H1Pool>,
    sender: http1::SendRequest<ProxyBody>,
}

pin_project_lite::pin_project! {
    /// A backend's response body. A pooled connection goes back to its pool when the body
    /// ends; a body dropped before its end takes the connection down with it (hyper closes
    /// a connection whose response was not read through).
    #[derive(Debug)]
    pub struct UpstreamBody {
        #[pin]
        body: Incoming,
        lease: Option<Lease>,
    }

    impl PinnedDrop for UpstreamBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.body.is_end_stream() {
                if let Some(lease) = this.lease.take() {
                    lease.pool.put_back(lease.sender);
                }
            }
        }
    }
}

impl UpstreamBody {
    /// A body whose connection is managed elsewhere.
    pub(crate) fn unpooled(body: Incoming) -> Self {
        Self { body, lease: None }
    }

    fn leased(body: Incoming, lease: Lease) -> Self {
        Self {
            body,
            lease: Some(lease),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.project();
        let frame = ready!(this.body.poll_frame(cx));
        if frame.is_none() {
            if let Some(lease) = this.lease.take() {
                lease.pool.put_back(lease.sender);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
