//! Keep-alive HTTP/1.1 connections to one backend, plain or TLS: a connection is checked out
//! for one exchange and put back by the response body once read to the end (no task, no pool
//! key), reused last in first out, closed once idle past the timeout, and at most a fixed
//! number are open at once. A TLS backend that picks `h2` through ALPN is served over one
//! [`H2Channel`] instead. See docs/design/backend-connection-pools.md.

use super::connector::{ConnectErrorKind, Connector, Stream};
use super::error::ForwardError;
use super::h2::{Dialed, Exchanged, H2Channel, IdleHttp1, OpenStream};
use super::request::Replay;
use super::wait::Wait;
use crate::body::ProxyBody;
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Connections of one backend that are waiting for their next request.
#[derive(Debug)]
pub(super) struct H1Pool {
    connector: Connector,
    /// Oldest first: connections are pushed as they come back, so `since` never decreases.
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    /// A connection unused for this long is closed instead of reused.
    idle_timeout: Duration,
    /// Whether the task that closes expired connections without traffic runs.
    sweeping: AtomicBool,
    /// For a TLS backend offered `h2` through ALPN: where its requests go once it picks it.
    alpn_h2: Option<Box<AlpnSide>>,
    /// One permit per connection that may be open at once (dialing, busy, idle); each
    /// connection's task holds its permit until the connection closes.
    permits: Arc<Semaphore>,
    /// Signalled when a connection comes back to the pool, for requests waiting at the limit.
    returned: Notify,
    /// Requests waiting at the limit now: a connection put back signals `returned` only when
    /// one does, which keeps the shared `Notify` off the path of every completed request.
    waiters: AtomicUsize,
}

/// How long a connection may sit idle before a request on it keeps a copy to send again:
/// the backend's keep-alive timer may close it as the request goes out (Node and uvicorn
/// after 5 s, gunicorn after 2 s). A connection reused sooner, as under steady traffic, costs
/// its request no copy of its head.
const RESEND_AFTER_IDLE: Duration = Duration::from_millis(500);

/// Where the connection an exchange goes out on comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// Dialed for it.
    New,
    /// From the pool, used within [`RESEND_AFTER_IDLE`].
    Recent,
    /// From the pool, idle longer: the backend may close it under the request.
    Aged,
}

impl Reuse {
    fn reused(self) -> bool {
        self != Self::New
    }
}

/// What a request at the limit got.
enum Slot {
    /// A connection that came back to the pool.
    Idle(http1::SendRequest<ProxyBody>, Reuse),
    /// Room for a new connection.
    New(OwnedSemaphorePermit),
}

/// A TLS backend that may pick `h2` through ALPN.
#[derive(Debug)]
pub(super) struct Alpn {
    /// The scheme of the HTTP/2 connection's absolute URIs.
    pub(super) scheme: Scheme,
    /// The authority of a request whose `Host` is not one.
    pub(super) fallback: Authority,
    /// Dials offering HTTP/1.1 only, for upgrades (HTTP/2 cannot carry them).
    pub(super) upgrades: Connector,
    pub(super) settings: super::h2::Settings,
}

#[derive(Debug)]
struct AlpnSide {
    channel: H2Channel,
    upgrades: Connector,
}

/// How one HTTP/1.1 exchange went.
enum Tried {
    Done(Response<UpstreamBody>),
    /// A reused connection closed before taking the request.
    Unsent(Request<ProxyBody>),
    /// A reused connection closed under the request before any answer: the copy of an
    /// idempotent request, to write once more on another connection.
    Closed(Request<ProxyBody>),
}

/// What [`H1Pool::send_h1`] did with a request.
enum Sent {
    Response(Response<UpstreamBody>),
    /// The new connection picked `h2`: the request, unsent, the connection and its permit.
    PickedH2(Request<ProxyBody>, Stream, OwnedSemaphorePermit),
}

#[derive(Debug)]
struct Idle {
    sender: http1::SendRequest<ProxyBody>,
    since: Instant,
}

impl H1Pool {
    /// A pool for `connector`'s backend, with at most `max_connections` connections open at
    /// once (at least one). With `alpn_h2` its TLS handshake offers `h2`, and when the backend
    /// picks it requests go to its HTTP/2 connections instead, counted against the same
    /// limit.
    pub(super) fn new(
        connector: Connector,
        max_idle: usize,
        idle_timeout: Duration,
        max_connections: usize,
        alpn_h2: Option<Alpn>,
    ) -> Arc<Self> {
        // HTTP/1.1 and HTTP/2 connections to the backend count against one limit.
        let permits = Arc::new(Semaphore::new(
            max_connections.clamp(1, Semaphore::MAX_PERMITS),
        ));
        Self::sharing(connector, max_idle, idle_timeout, permits, alpn_h2)
    }

    /// [`H1Pool::new`], its connections counted against `permits`, a limit it shares (an h2c
    /// backend's HTTP/1.1 connections for upgrades count with its HTTP/2 ones).
    pub(super) fn sharing(
        connector: Connector,
        max_idle: usize,
        idle_timeout: Duration,
        permits: Arc<Semaphore>,
        alpn_h2: Option<Alpn>,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            alpn_h2: alpn_h2.map(|alpn| {
                Box::new(AlpnSide {
                    channel: H2Channel::new(
                        connector.clone(),
                        alpn.scheme,
                        alpn.fallback,
                        alpn.settings,
                        Arc::clone(&permits),
                    ),
                    upgrades: alpn.upgrades,
                })
            }),
            connector,
            idle: Mutex::new(Vec::new()),
            max_idle,
            idle_timeout,
            sweeping: AtomicBool::new(false),
            permits,
            returned: Notify::new(),
            waiters: AtomicUsize::new(0),
        });
        if let Some(alpn) = &pool.alpn_h2 {
            alpn.channel.share_limit_with(pool.idle_handle());
        }
        pool
    }

    /// This pool's idle connections, as an HTTP/2 channel sharing its limit may close them.
    pub(super) fn idle_handle(self: &Arc<Self>) -> std::sync::Weak<dyn IdleHttp1> {
        let idle: std::sync::Weak<Self> = Arc::downgrade(self);
        idle
    }

    /// Whether the backend's TLS handshake offers `h2`.
    pub(super) fn offers_h2(&self) -> bool {
        self.alpn_h2.is_some()
    }

    /// Sends `req` (origin-form URI, its host in `Host`) on an idle connection or a new one;
    /// to a backend that picked `h2`, over its HTTP/2 connection.
    ///
    /// A pooled connection the backend closed while it sat idle gives the request back
    /// unsent; it is then sent on the next connection, as the backend never saw it. One that
    /// closes under the request before any answer (the backend's keep-alive timeout fired as
    /// the request went out) fails it, unless the request is idempotent and `replay` holds
    /// its whole body: then it is written once more, on a new connection, as Go's transport
    /// does. At the connection limit the request waits as `wait` says, then fails with
    /// `Saturated`.
    pub(super) async fn send(
        self: &Arc<Self>,
        mut req: Request<ProxyBody>,
        wait: &Wait,
        mut replay: Option<&Bytes>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        if let Some(alpn) = &self.alpn_h2 {
            // Boxed: TLS backends only, so the plain path's future stays as small as it was.
            return if req.headers().contains_key(http::header::UPGRADE) {
                Box::pin(self.send_upgrade(&alpn.upgrades, req, wait, replay)).await
            } else {
                Box::pin(self.send_alpn(&alpn.channel, req, wait, replay)).await
            };
        }
        let mut fresh = false;
        loop {
            // After a connection closed under the request, its copy goes on a new one.
            let idle = if fresh { None } else { self.checkout() };
            let (sender, reused) = match idle {
                Some(checked) => checked,
                // Boxed: dialing (and waiting at the limit) is rare, and its large future would
                // otherwise be carried (and copied) by every request's future.
                None => Box::pin(self.dial_or_wait(&self.connector, wait)).await?,
            };
            match self.exchange(sender, reused, req, replay).await? {
                Tried::Done(resp) => return Ok(resp),
                Tried::Unsent(unsent) => req = unsent,
                Tried::Closed(copy) => (req, replay, fresh) = (copy, None, true),
            }
        }
    }

    /// An upgrade to a TLS backend offered `h2`, which HTTP/2 cannot carry: on an idle
    /// HTTP/1.1 connection, else on a new one dialed with `upgrades` (HTTP/1.1 only).
    async fn send_upgrade(
        self: &Arc<Self>,
        upgrades: &Connector,
        mut req: Request<ProxyBody>,
        wait: &Wait,
        mut replay: Option<&Bytes>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let mut fresh = false;
        loop {
            let idle = if fresh { None } else { self.checkout() };
            let (sender, reused) = match idle {
                Some(checked) => checked,
                None => self.dial_or_wait(upgrades, wait).await?,
            };
            match self.exchange(sender, reused, req, replay).await? {
                Tried::Done(resp) => return Ok(resp),
                Tried::Unsent(unsent) => req = unsent,
                Tried::Closed(copy) => (req, replay, fresh) = (copy, None, true),
            }
        }
    }

    /// [`send`](Self::send) to a TLS backend offered `h2`. A request the HTTP/2 connection
    /// closed under before it went out is sent once more, and so is one the backend did not
    /// process (see [`H2Channel::exchange`]) when `replay` holds its body. Going out over
    /// HTTP/2 is what tells `wait` that a gRPC call's own bounds hold (see
    /// [`Wait::goes_over_http2`]).
    async fn send_alpn(
        self: &Arc<Self>,
        channel: &H2Channel,
        mut req: Request<ProxyBody>,
        wait: &Wait,
        mut replay: Option<&Bytes>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let mut unsent = false;
        loop {
            let claimed = match channel.open() {
                Some(claimed) => Some(claimed),
                None if channel.picked() => match channel.dial(wait).await? {
                    Dialed::Http2(claimed) => Some(claimed),
                    Dialed::Http1(io, permit) => {
                        let fresh = Some((io, permit));
                        return match self.send_h1(req, fresh, wait, replay).await? {
                            Sent::Response(resp) => Ok(resp),
                            Sent::PickedH2(..) => {
                                Err(ForwardError::Other("backend spoke h2".into()))
                            }
                        };
                    }
                    Dialed::UseHttp1 => None,
                },
                None => None,
            };
            let claimed = match claimed {
                Some(claimed) => claimed,
                None => match self.send_h1(req, None, wait, replay).await? {
                    Sent::Response(resp) => return Ok(resp),
                    Sent::PickedH2(unsent, io, permit) => {
                        req = unsent;
                        channel.adopt(io, permit).await?
                    }
                },
            };
            wait.goes_over_http2();
            match channel.exchange(claimed, req, replay).await {
                Exchanged::Response(resp, stream) => {
                    return Ok(resp.map(|body| UpstreamBody::on_stream(body, stream)))
                }
                Exchanged::Failed(e) => return Err(e),
                Exchanged::Unsent(back) if !unsent => (req, unsent) = (back, true),
                Exchanged::Unsent(_) => return Err(ForwardError::Canceled),
                // Sent once more, and no more.
                Exchanged::Unprocessed(copy) => (req, replay) = (copy, None),
            }
        }
    }

    /// HTTP/1.1 to a TLS backend offered `h2`: on `fresh` (with its permit), else on an idle
    /// connection or a new one. A new connection on which the backend picked `h2` comes back
    /// with the request, unsent, and its permit, for the HTTP/2 side to hold.
    async fn send_h1(
        self: &Arc<Self>,
        mut req: Request<ProxyBody>,
        mut fresh: Option<(Stream, OwnedSemaphorePermit)>,
        wait: &Wait,
        mut replay: Option<&Bytes>,
    ) -> Result<Sent, ForwardError> {
        let mut closed_under = false;
        loop {
            let slot = if let Some((io, permit)) = fresh.take() {
                Err((io, permit))
            } else {
                // After a connection closed under the request, its copy goes on a new one.
                let idle = if closed_under { None } else { self.checkout() };
                match idle {
                    Some(checked) => Ok(checked),
                    None => match self.slot(wait).await? {
                        Slot::Idle(sender, reuse) => Ok((sender, reuse)),
                        Slot::New(permit) => Err((self.connect().await?, permit)),
                    },
                }
            };
            let (sender, reused) = match slot {
                Ok(checked) => checked,
                Err((io, permit)) => {
                    if io.negotiated_h2() {
                        return Ok(Sent::PickedH2(req, io, permit));
                    }
                    (handshake(io, permit).await?, Reuse::New)
                }
            };
            match self.exchange(sender, reused, req, replay).await? {
                Tried::Done(resp) => return Ok(Sent::Response(resp)),
                Tried::Unsent(unsent) => req = unsent,
                Tried::Closed(copy) => (req, replay, closed_under) = (copy, None, true),
            }
        }
    }

    /// One exchange on `sender`. A request that a reused connection gave back unsent is
    /// returned for the next connection; so is a copy of an idempotent one whose body
    /// `replay` holds, when a connection that sat idle a while ([`Reuse::Aged`]) closed under
    /// it before any answer.
    async fn exchange(
        self: &Arc<Self>,
        mut sender: http1::SendRequest<ProxyBody>,
        reused: Reuse,
        mut req: Request<ProxyBody>,
        replay: Option<&Bytes>,
    ) -> Result<Tried, ForwardError> {
        // hyper frames a GET or HEAD body of unknown length as no body at all (length 0): such
        // a body (a chunked search query) goes chunked instead of being dropped.
        if matches!(*req.method(), http::Method::GET | http::Method::HEAD)
            && !req.body().is_end_stream()
            && req.body().size_hint().exact().is_none()
        {
            req.headers_mut().insert(
                http::header::TRANSFER_ENCODING,
                http::HeaderValue::from_static("chunked"),
            );
        }
        // Only a connection that sat idle can have been closed by the backend's keep-alive
        // timer as the request goes out.
        let copy = replay
            .filter(|_| reused == Reuse::Aged && req.method().is_idempotent())
            // Boxed: kept across the exchange, where it is rarely made.
            .map(|body| Box::new(Replay::of(&req, body)));
        match sender.try_send_request(req).await {
            // After a `101` the connection belongs to the upgrade, never to the pool.
            Ok(resp) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                Ok(Tried::Done(resp.map(UpstreamBody::unpooled)))
            }
            Ok(resp) => {
                let lease = Lease {
                    pool: self.clone(),
                    sender,
                };
                Ok(Tried::Done(
                    resp.map(|body| UpstreamBody::leased(body, lease)),
                ))
            }
            Err(mut e) => match e.take_message() {
                Some(unsent) if reused.reused() => Ok(Tried::Unsent(unsent)),
                _ => {
                    let e = e.into_error();
                    match copy {
                        Some(copy) if closed_before_answer(&e) => {
                            tracing::debug!(error = %e, "reused connection closed under the request: sent again");
                            Ok(Tried::Closed(copy.into_request()))
                        }
                        _ => Err(ForwardError::from_hyper(e)),
                    }
                }
            },
        }
    }

    /// The most recently used idle connection that is still open and ready.
    ///
    /// A connection is put back when its response has been read, which normally leaves it
    /// ready at once. One that is still busy (its request body is still being sent) is not
    /// waited for here: it goes back to the pool when it becomes ready.
    fn checkout(self: &Arc<Self>) -> Option<(http1::SendRequest<ProxyBody>, Reuse)> {
        loop {
            let idle = self.idle.lock().ok()?.pop()?;
            let idled = idle.since.elapsed();
            if idle.sender.is_closed() || idled > self.idle_timeout {
                continue;
            }
            let reuse = if idled >= RESEND_AFTER_IDLE {
                Reuse::Aged
            } else {
                Reuse::Recent
            };
            let mut sender = idle.sender;
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match sender.poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => return Some((sender, reuse)),
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

    async fn connect(&self) -> Result<Stream, ForwardError> {
        connect(&self.connector).await
    }

    /// A new connection through `connector`, or, at the limit, the first one to come back to
    /// the pool or be made room for by another's closing, and where it comes from.
    async fn dial_or_wait(
        self: &Arc<Self>,
        connector: &Connector,
        wait: &Wait,
    ) -> Result<(http1::SendRequest<ProxyBody>, Reuse), ForwardError> {
        match self.slot(wait).await? {
            Slot::Idle(sender, reuse) => Ok((sender, reuse)),
            Slot::New(permit) => Ok((dial(connector, permit).await?, Reuse::New)),
        }
    }

    /// Room for a new connection when the pool is below its limit (the caller has found
    /// no idle one); else waits, as long as `wait` allows, for a connection to come back or
    /// close.
    async fn slot(self: &Arc<Self>, wait: &Wait) -> Result<Slot, ForwardError> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(Slot::New(permit));
        }
        // Counted before the first look at the idle stack, whose lock orders it before the
        // count a connection put back after that look reads; uncounted however the wait ends.
        let found = async {
            loop {
                let returned = self.returned.notified();
                tokio::pin!(returned);
                // Registered before looking, so a connection put back after the look wakes
                // this request (or another waiting one) instead of sitting idle.
                returned.as_mut().enable();
                if let Some((sender, reuse)) = self.checkout() {
                    return Ok(Slot::Idle(sender, reuse));
                }
                tokio::select! {
                    permit = self.permits.clone().acquire_owned() => {
                        // The semaphore is never closed; an error would mean it was.
                        return permit.map(Slot::New).map_err(|_| ForwardError::Saturated);
                    }
                    () = &mut returned => {}
                }
            }
        };
        wait.for_http1(&self.waiters, found).await
    }

    fn put_back(self: &Arc<Self>, sender: http1::SendRequest<ProxyBody>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        if let Ok(mut idle) = self.idle.lock() {
            self.evict_expired(&mut idle, now);
            if idle.len() < self.max_idle {
                idle.push(Idle { sender, since: now });
                drop(idle);
                // Read after the lock is let go: a request that counted itself and then
                // found the stack empty under that lock is seen here.
                if self.waiters.load(Ordering::Relaxed) > 0 {
                    self.returned.notify_one();
                }
            }
        }
        if !self.sweeping.load(Ordering::Relaxed) {
            self.start_sweeping();
        }
    }

    /// Closes the connections idle longer than the timeout (dropping a sender ends its
    /// connection task, which closes the socket). They are the oldest, at the bottom.
    fn evict_expired(&self, idle: &mut Vec<Idle>, now: Instant) {
        let is_expired = |i: &Idle| now.saturating_duration_since(i.since) > self.idle_timeout;
        // The common case, nothing expired, costs one comparison.
        if idle.first().is_some_and(is_expired) {
            let expired = idle.partition_point(is_expired);
            idle.drain(..expired);
        }
    }

    /// Starts the timer that closes expired connections when no request comes to do it. It
    /// holds the pool weakly and ends with it.
    fn start_sweeping(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(self);
        let timeout = self.idle_timeout;
        runtime.spawn(async move {
            let mut next = tokio::time::Instant::now() + timeout;
            loop {
                tokio::time::sleep_until(next).await;
                let Some(pool) = weak.upgrade() else { return };
                let now = Instant::now();
                let Ok(mut idle) = pool.idle.lock() else {
                    return;
                };
                pool.evict_expired(&mut idle, now);
                // Wake when the oldest remaining connection expires (a little after, so it
                // is past the timeout), or one timeout from now if none is left.
                let wait = idle.first().map_or(timeout, |oldest| {
                    timeout.saturating_sub(now.saturating_duration_since(oldest.since))
                        + Duration::from_millis(1)
                });
                next = tokio::time::Instant::now() + wait;
            }
        });
    }
}

impl IdleHttp1 for H1Pool {
    fn close_oldest_idle(&self) -> bool {
        let oldest = match self.idle.lock() {
            Ok(mut idle) if !idle.is_empty() => idle.remove(0),
            _ => return false,
        };
        // Dropped outside the lock: its connection task ends, and with it the permit.
        drop(oldest);
        true
    }
}

/// Whether an exchange failed because its connection ended (closed or reset) before a
/// complete response head came: what a backend closing an idle keep-alive connection as the
/// request arrives looks like. Any other failure, a malformed answer included, is not
/// repeated.
fn closed_before_answer(e: &hyper::Error) -> bool {
    use std::io::ErrorKind;
    if e.is_incomplete_message() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            );
        }
        source = cause.source();
    }
    false
}

async fn connect(connector: &Connector) -> Result<Stream, ForwardError> {
    connector.connect().await.map_err(|e| match e.kind {
        ConnectErrorKind::Tls => ForwardError::Tls(e),
        ConnectErrorKind::Dial | ConnectErrorKind::Timeout => ForwardError::Dial(e),
    })
}

/// A new HTTP/1.1 connection through `connector`, counted by `permit`.
async fn dial(
    connector: &Connector,
    permit: OwnedSemaphorePermit,
) -> Result<http1::SendRequest<ProxyBody>, ForwardError> {
    handshake(connect(connector).await?, permit).await
}

/// Starts HTTP/1.1 on a new connection; its task runs until the connection closes and holds
/// `permit` until then. After an upgrade the connection's bytes belong to the spliced session
/// and it no longer counts against the pool's limit.
async fn handshake(
    io: Stream,
    permit: OwnedSemaphorePermit,
) -> Result<http1::SendRequest<ProxyBody>, ForwardError> {
    let (sender, conn) = http1::Builder::new()
        .handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(ForwardError::from_hyper)?;
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "backend connection ended");
        }
    });
    Ok(sender)
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
        // The request's place on a shared HTTP/2 connection, given up with the body.
        stream: Option<OpenStream>,
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
    pub(super) fn unpooled(body: Incoming) -> Self {
        Self {
            body,
            lease: None,
            stream: None,
        }
    }

    /// A body on a shared HTTP/2 connection, holding the request's place there.
    pub(super) fn on_stream(body: Incoming, stream: OpenStream) -> Self {
        Self {
            body,
            lease: None,
            stream: Some(stream),
        }
    }

    fn leased(body: Incoming, lease: Lease) -> Self {
        Self {
            body,
            lease: Some(lease),
            stream: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A keep-alive backend answering every request with `ok`; counts the connections it
    /// accepted and those the client closed.
    async fn backend() -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (addr, accepted, closed)
    }

    /// A `GET /` to the test backend.
    fn request() -> Request<ProxyBody> {
        Request::get("/")
            .header(http::header::HOST, "backend")
            .body(crate::body::full(Bytes::new()))
            .expect("request")
    }

    async fn get(pool: &Arc<H1Pool>) {
        let req = request();
        let resp = pool
            .send(req, &Wait::until(None), None)
            .await
            .expect("response");
        assert_eq!(resp.status(), http::StatusCode::OK);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok");
    }

    async fn wait_for(count: &AtomicUsize, want: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        while count.load(Ordering::SeqCst) < want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        count.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn connections_idle_past_the_timeout_are_closed_under_traffic_and_without() {
        let (addr, accepted, closed) = backend().await;
        // Long enough that a stall of a loaded machine between two steady requests does not
        // expire the connection in use.
        let timeout = Duration::from_secs(1);
        let connector =
            Connector::new("127.0.0.1", addr.port(), None, Duration::from_secs(2), None);
        let pool = H1Pool::new(connector, 64, timeout, 1024, None);

        // A burst opens eight connections; all go back to the pool.
        futures_util::future::join_all((0..8).map(|_| get(&pool))).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 8);
        assert_eq!(closed.load(Ordering::SeqCst), 0);

        // Steady traffic, one request at a time, reuses the most recent connection only: the
        // other seven expire at the bottom of the stack and are closed, not kept for ever.
        let started = Instant::now();
        while started.elapsed() < timeout * 2 {
            get(&pool).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 8, "no new connections");
        assert_eq!(wait_for(&closed, 7, Duration::from_secs(5)).await, 7);

        // No traffic at all: the last one is closed by the pool's own timer.
        assert_eq!(wait_for(&closed, 8, timeout * 5).await, 8);
        assert_eq!(pool.idle.lock().map(|i| i.len()).unwrap_or(usize::MAX), 0);

        // The pool still dials when it has nothing left.
        get(&pool).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 9);
    }

    /// Whether `returned` holds a stored signal, which the next request to wait would take
    /// and loop on for nothing.
    fn signal_stored(pool: &H1Pool) -> bool {
        let returned = pool.returned.notified();
        tokio::pin!(returned);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        std::future::Future::poll(returned, &mut cx).is_ready()
    }

    #[tokio::test]
    async fn a_connection_put_back_signals_only_requests_that_wait_for_one() {
        let (addr, accepted, _) = backend().await;
        let connector =
            Connector::new("127.0.0.1", addr.port(), None, Duration::from_secs(2), None);
        let pool = H1Pool::new(connector, 64, Duration::from_secs(60), 1, None);

        // Nobody waits: the connection goes back without a signal.
        get(&pool).await;
        get(&pool).await;
        assert!(
            !signal_stored(&pool),
            "no signal left for a request that never waited"
        );

        // At the limit, a request waits for the one connection and gets it when it is put back.
        let req = request();
        let held = pool
            .send(req, &Wait::until(None), None)
            .await
            .expect("response");
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move { get(&pool).await }
        });
        let counted = Instant::now() + Duration::from_secs(10);
        while pool.waiters.load(Ordering::SeqCst) == 0 && Instant::now() < counted {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(pool.waiters.load(Ordering::SeqCst), 1);
        let body = held.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok");
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting request is served")
            .expect("task");
        assert_eq!(pool.waiters.load(Ordering::SeqCst), 0);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection throughout"
        );

        // A wait cut off by its deadline is uncounted too.
        let req = request();
        let held = pool
            .send(req, &Wait::until(None), None)
            .await
            .expect("response");
        let req = request();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let saturated = pool.send(req, &Wait::until(Some(deadline)), None).await;
        assert!(
            matches!(saturated, Err(ForwardError::Saturated)),
            "{saturated:?}"
        );
        assert_eq!(pool.waiters.load(Ordering::SeqCst), 0);
        drop(held.into_body().collect().await);
        assert!(!signal_stored(&pool), "nobody waits any more");
    }
}
