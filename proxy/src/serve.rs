//! The standalone data listener: HTTP/1.1 and h2c on one port, client limits, graceful drain.
//!
//! At most [`Limits::max_connections`] client connections are open at once: at the limit the
//! listener stops accepting until one closes, so a flood waits in the kernel's backlog (and is
//! refused beyond it) instead of taking file descriptors and memory without bound. A place is
//! only worth bounding if it is given back: a connection that sends no request in time
//! ([`Limits::header_read_timeout`]), sits idle too long ([`Limits::idle_timeout`]), stops
//! reading what it is sent or keeps an HTTP/2 stream's window shut ([`Limits::send_timeout`])
//! is closed, and an upgraded one keeps its place until its session ends.

mod stall;

use crate::conn::ConnInfo;
use crate::proxy::Proxy;
use crate::upgrade::SessionHold;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use stall::{Mark, Stalls};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Default bound on client connections open at once on the data listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;

/// How often a listener held at its connection limit says so.
const LIMIT_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Limits that protect the proxy from slow or abusive clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client gets to send a complete request head (slowloris guard). It also bounds
    /// the wait for a new connection's first request, whatever its protocol, and the time a
    /// connection asked to close may take once nothing is in flight on it. An HTTP/1.1
    /// connection reads the next head as soon as it goes idle, so this is also that
    /// protocol's keep-alive when it is shorter than [`Self::idle_timeout`].
    pub header_read_timeout: Duration,
    /// Most header lines in one HTTP/1.1 request.
    pub max_headers: usize,
    /// Largest request head (HTTP/1.1 buffer, HTTP/2 header list); also the largest head or
    /// trailers an HTTP/2 backend may answer with.
    pub max_header_bytes: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Client connections open at once; at the limit, accepting pauses until one closes.
    pub max_connections: usize,
    /// A connection that has served a request and has none in flight for this long is closed
    /// (HTTP/2 with a GOAWAY). HTTP/1.1 keep-alive connections are closed sooner when the
    /// head timeout is shorter. Requests in flight, however long, are never cut by it.
    pub idle_timeout: Duration,
    /// A connection whose writes have been blocked this long (the client reads nothing of
    /// what it is sent) is dropped with its requests: otherwise a client that stops reading
    /// holds its backend connection, and a few hundred such clients a backend's whole pool.
    /// So is an HTTP/2 connection with a response that has had data waiting for the client's
    /// flow-control window this long (looked at every half timeout, so it goes within one and
    /// a half): the client keeps the window shut while it reads the socket. A response that
    /// is merely slow to come from its backend, or that the client lets through at least
    /// 16 KiB per timeout, is not cut by it.
    pub send_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_headers: 100,
            max_header_bytes: crate::headers::DEFAULT_MAX_HEADER_BYTES,
            max_concurrent_streams: 256,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            // nginx's default `keepalive_timeout`.
            idle_timeout: Duration::from_secs(75),
            // nginx's default `send_timeout`.
            send_timeout: Duration::from_secs(60),
        }
    }
}

/// The connection builders of a listener. A connection whose first bytes settle its protocol
/// (nearly all: a client's first read holds its whole first request) is served by that
/// protocol's own builder; only one whose first bytes are a part of the HTTP/2 preface goes
/// through `auto`, which reads on until it can tell. `auto` costs its wrapper on every poll
/// of the connection for the life of it, for a choice made once.
struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<Streams>,
    auto: auto::Builder<Streams>,
}

impl Builders {
    fn new(limits: &Limits, streams: Streams) -> Self {
        // hyper's builders and hyper-util's `auto` ones share these settings' names, not a
        // trait: each list is written once and applied to both.
        macro_rules! http1_limits {
            ($b:expr) => {
                $b.max_headers(limits.max_headers)
                    .max_buf_size(limits.max_header_bytes.max(8192))
                    .keep_alive(true)
            };
        }
        macro_rules! http2_limits {
            ($b:expr) => {
                $b.timer(TokioTimer::new())
                    .max_header_list_size(limits.max_header_bytes as u32)
                    .max_concurrent_streams(limits.max_concurrent_streams)
                    .keep_alive_interval(Some(Duration::from_secs(30)))
            };
        }
        let mut auto = auto::Builder::new(streams.clone());
        // Which protocol an `auto` connection speaks is not known to `drive`, so hyper keeps
        // the head deadline of its HTTP/1.1 side. A connection known to speak HTTP/1.1 has
        // it kept by `drive` instead: hyper's arms a boxed timer for every request.
        http1_limits!(auto.http1())
            .timer(TokioTimer::new())
            .header_read_timeout(Some(limits.header_read_timeout));
        http2_limits!(auto.http2());
        let mut http1 = http1::Builder::new();
        // The buffer bound is only checked while a head is incomplete: a large head read
        // whole in one go would pass it. This one is checked on every head.
        http1_limits!(http1).max_header_size(limits.max_header_bytes);
        let mut http2 = http2::Builder::new(streams);
        http2_limits!(http2);
        Self { http1, http2, auto }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
    /// Only part of the preface so far.
    Unknown,
}

fn protocol_of(first: &[u8]) -> Protocol {
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] != H2_PREFACE[..n] {
        Protocol::Http1
    } else if n == H2_PREFACE.len() {
        Protocol::Http2
    } else {
        Protocol::Unknown
    }
}

/// How long the connections cut at the end of a drain get to be dropped: a connection's task
/// ends at its next poll, and so does each of its HTTP/2 streams'.
const CUT_WAIT: Duration = Duration::from_secs(1);

/// Where the drain is, as the listener's connections are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    Serving,
    /// Close once the requests in flight have ended.
    Close,
    /// The grace period is over: drop the connection, and with it its requests.
    Cut,
}

/// The data listener's open connections, for the drain.
#[derive(Debug)]
pub struct Connections {
    /// Moved on to ask every connection to close, then to cut them. Every connection's task
    /// and every HTTP/2 stream's holds a receiver until it has ended and dropped what it held.
    drain: watch::Sender<Drain>,
}

impl Connections {
    /// Asks every open connection to close once its requests in flight have ended (HTTP/2
    /// with a GOAWAY, HTTP/1.1 after its current response) and waits until all have, or
    /// until `deadline`. Then the connections still open are dropped with their requests,
    /// which are recorded (metrics, access log, spans) as cut off before this returns, while
    /// the process still exports them. Upgraded sessions are not waited for: their HTTP
    /// connections are over. Returns whether every connection closed in time.
    pub async fn shutdown_by(self, deadline: Instant) -> bool {
        self.drain.send_replace(Drain::Close);
        if tokio::time::timeout_at(deadline, self.drain.closed())
            .await
            .is_ok()
        {
            return true;
        }
        self.drain.send_replace(Drain::Cut);
        if tokio::time::timeout(CUT_WAIT, self.drain.closed())
            .await
            .is_err()
        {
            tracing::warn!(
                "client connections cut at the end of the grace period were not dropped in time"
            );
        }
        false
    }
}

/// Spawns the HTTP/2 streams of the listener's connections, each holding a receiver of the
/// drain until it has ended: a drain that cuts the connections waits for their streams too,
/// which hold their requests and end once their connection is dropped.
#[derive(Debug, Clone)]
struct Streams {
    drain: watch::Receiver<Drain>,
}

impl<F> hyper::rt::Executor<F> for Streams
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, stream: F) {
        tokio::spawn(Held {
            task: stream,
            _drain: self.drain.clone(),
        });
    }
}

pin_project_lite::pin_project! {
    /// A task that holds `_drain` until it has ended and dropped `task` (fields drop in
    /// order).
    struct Held<F> {
        #[pin]
        task: F,
        _drain: watch::Receiver<Drain>,
    }
}

impl<F: Future> Future for Held<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().task.poll(cx)
    }
}

/// Resolves once the drain cuts the connections; never if it is given up without.
async fn cut(drain: &mut watch::Receiver<Drain>) {
    if drain.wait_for(|d| *d == Drain::Cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Accepts connections until `stop` flips, then closes the listener (new connections are
/// refused) and returns the handle that tracks the connections still open.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> Connections {
    let (drain, drained) = watch::channel(Drain::Serving);
    let builders = Arc::new(Builders::new(&limits, Streams { drain: drained }));
    let permits = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut warned: Option<Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() >= LIMIT_WARN_INTERVAL) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        max = limits.max_connections,
                        "client connection limit reached: accepting paused until one closes"
                    );
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // Never closed; a closed one could not admit anybody again.
                        Err(_) => break,
                    },
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let info = ConnInfo {
            peer: Some(peer),
            scheme: "http",
            trusted_forwarding: false,
        };
        let activity = Arc::new(Activity::new(permit));
        let service = {
            let proxy = proxy.clone();
            let activity = activity.clone();
            service_fn(move |mut req: http::Request<Incoming>| {
                let busy = Busy::start(&activity, req.version() == http::Version::HTTP_2);
                // Only requests hyper may upgrade carry the connection's place; the proxy
                // hands it to the spliced session, which outlives this connection.
                if req
                    .extensions()
                    .get::<hyper::upgrade::OnUpgrade>()
                    .is_some()
                {
                    req.extensions_mut()
                        .insert(SessionHold::new(activity.clone()));
                }
                let proxy = proxy.clone();
                async move {
                    let response = proxy.handle(req, info).await;
                    Ok::<_, Infallible>(response.map(|body| InFlight::new(body, busy)))
                }
            })
        };
        // Held by the task until it ends, after the connection and its requests are dropped:
        // the drain waits for that.
        let mut close = drain.subscribe();
        let builders = builders.clone();
        let head_timeout = limits.header_read_timeout;
        let deadlines = Deadlines {
            head: head_timeout,
            idle: limits.idle_timeout,
            send: limits.send_timeout,
            drop_unserved: false,
            stalls: true,
        };
        tokio::spawn(async move {
            let mut first = [0u8; H2_PREFACE.len()];
            // A client that sends nothing in time is dropped with its connection, and so is
            // one still silent when the drain cuts the connections.
            let peeked = tokio::select! {
                peeked = tokio::time::timeout(head_timeout, stream.peek(&mut first)) => peeked,
                () = cut(&mut close) => return,
            };
            let protocol = match peeked {
                Ok(Ok(0)) | Err(_) => return,
                Ok(Ok(n)) => protocol_of(&first[..n]),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, %peer, "connection ended with error");
                    return;
                }
            };
            let io = TokioIo::new(Watched {
                stream,
                activity: activity.clone(),
            });
            let ended = match protocol {
                Protocol::Http1 => {
                    let conn = builders.http1.serve_connection(io, service).with_upgrades();
                    let conn = std::pin::pin!(conn);
                    let closes = |conn: Pin<&mut _>| {
                        http1::UpgradeableConnection::graceful_shutdown(conn);
                    };
                    drive(conn, closes, &activity, &mut close, deadlines.http1())
                        .await
                        .map(|r| r.map_err(Box::<dyn std::error::Error + Send + Sync>::from))
                }
                Protocol::Http2 => {
                    let conn = builders.http2.serve_connection(io, service);
                    let conn = std::pin::pin!(conn);
                    let closes = |conn: Pin<&mut _>| http2::Connection::graceful_shutdown(conn);
                    drive(conn, closes, &activity, &mut close, deadlines)
                        .await
                        .map(|r| r.map_err(Box::<dyn std::error::Error + Send + Sync>::from))
                }
                Protocol::Unknown => {
                    let conn = builders.auto.serve_connection_with_upgrades(io, service);
                    let conn = std::pin::pin!(conn);
                    let closes =
                        |conn: Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(conn);
                    drive(conn, closes, &activity, &mut close, deadlines).await
                }
            };
            if let Some(Err(e)) = ended {
                tracing::debug!(error = %e, %peer, "connection ended with error");
            }
        });
    }
    drop(listener);
    Connections { drain }
}

/// How long a client connection may go with nothing in flight.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    /// For the first request, and for a connection asked to close to finish.
    head: Duration,
    /// After a request has ended.
    idle: Duration,
    /// For a write the client does not read.
    send: Duration,
    /// A connection with no request by `head` is dropped rather than asked to close.
    drop_unserved: bool,
    /// HTTP/2 responses waiting for the client's window are looked at every half `send`.
    stalls: bool,
}

impl Deadlines {
    /// HTTP/1.1 reads the next head as soon as a connection goes idle, so the head deadline
    /// bounds the idle time too; and one that has not sent a whole first head has been sent
    /// nothing, so it loses nothing by being dropped (a slow head, too, is not let to run on
    /// for another head timeout).
    ///
    /// HTTP/1.1 has no flow control of its own: a client that holds a response back blocks
    /// the writes, which `send` bounds already.
    fn http1(self) -> Self {
        Self {
            idle: self.idle.min(self.head),
            drop_unserved: true,
            stalls: false,
            ..self
        }
    }

    /// How often HTTP/2 responses waiting for the client's window are looked at: a response
    /// still waiting since two looks ago has waited `send` at least.
    fn stall_tick(self) -> Option<Duration> {
        self.stalls
            .then(|| (self.send / 2).max(Duration::from_millis(1)))
    }
}

/// Runs a client connection until it ends, asking it to close (`closes`: HTTP/2 GOAWAY, or
/// no keep-alive after the current response) when the drain says so or when it has nothing in
/// flight past its deadline, and dropping it (`None`) if it is still open with nothing in
/// flight `deadlines.head` after that, or once its writes have been blocked `deadlines.send`, or
/// a response of its has been waiting for the client's window that long (see [`stall`]), or
/// when the drain cuts the connections.
///
/// One timer per connection keeps every deadline: it is moved when it fires, never armed per
/// request.
async fn drive<C, E>(
    mut conn: Pin<&mut C>,
    closes: impl Fn(Pin<&mut C>),
    activity: &Activity,
    drain: &mut watch::Receiver<Drain>,
    deadlines: Deadlines,
) -> Option<Result<(), E>>
where
    C: Future<Output = Result<(), E>>,
{
    let head_timeout = deadlines.head;
    let stall_tick = deadlines.stall_tick();
    let mut next_tick = stall_tick.map(|every| activity.opened + every);
    let first = activity.opened + head_timeout;
    let check = tokio::time::sleep_until(next_tick.map_or(first, |at| at.min(first)));
    tokio::pin!(check);
    // Since when the connection has been asked to close.
    let mut closing: Option<Instant> = None;
    // Until the drain's handle is dropped.
    let mut watching = true;
    // A drain that began while the connection was still silent has been seen by the wait for
    // its first bytes, and is not a change any more. It is acted on once the connection has
    // been polled: hyper closes a connection asked to close before it has read a request, and
    // this one's first request is already here.
    let mut drained_before = match *drain.borrow() {
        Drain::Cut => return None,
        Drain::Close => true,
        Drain::Serving => false,
    };
    loop {
        tokio::select! {
            // The connection first: it is what nearly every wake-up is for.
            biased;
            ended = conn.as_mut() => return Some(ended),
            () = std::future::ready(()), if drained_before => {
                drained_before = false;
                if closing.is_none() {
                    closes(conn.as_mut());
                    let now = Instant::now();
                    closing = Some(now);
                    check.as_mut().reset(now + head_timeout);
                }
            }
            changed = drain.changed(), if watching => {
                let state = match changed {
                    Ok(()) => *drain.borrow_and_update(),
                    // A dropped handle closes connections too.
                    Err(_) => {
                        watching = false;
                        Drain::Close
                    }
                };
                match state {
                    Drain::Cut => {
                        tracing::debug!("grace period over: connection dropped with its requests");
                        return None;
                    }
                    Drain::Close if closing.is_none() => {
                        closes(conn.as_mut());
                        let now = Instant::now();
                        closing = Some(now);
                        check.as_mut().reset(now + head_timeout);
                    }
                    Drain::Close | Drain::Serving => {}
                }
            }
            () = &mut check => {
                let now = Instant::now();
                // A client that reads nothing of what it is sent loses its requests.
                let unread = activity.blocked_since().map(|since| since + deadlines.send);
                if unread.is_some_and(|by| by <= now) {
                    tracing::debug!("client read nothing it was sent within the send timeout: connection dropped");
                    return None;
                }
                // A client that lets nothing be sent on a stream loses its requests too.
                if let (Some(every), Some(due)) = (stall_tick, next_tick) {
                    if due <= now {
                        if activity.stalls.tick() {
                            tracing::debug!("a response waited for the client's flow-control window for the send timeout: connection dropped");
                            return None;
                        }
                        next_tick = Some(now + every);
                    }
                }
                // Ticks are kept while idle too, so the first ones of a request come on time.
                let ticked = |later: Instant| next_tick.map_or(later, |at| at.min(later));
                let busy_until = |later: Instant| ticked(unread.map_or(later, |by| by.min(later)));
                match activity.quiet_until(deadlines, closing) {
                    // Busy: looked at again later (a request that ends meanwhile moves the
                    // deadline to its end).
                    None if closing.is_some() => check.as_mut().reset(busy_until(now + head_timeout)),
                    // Looked at within the send timeout too, so a write that blocks just after
                    // a look is caught when the timeout ends, not at the next idle deadline.
                    None => check.as_mut().reset(busy_until(now + deadlines.idle.min(deadlines.send))),
                    Some(at) if at > now => check.as_mut().reset(ticked(at)),
                    // Asked to close and still open with nothing in flight: a peer that never
                    // acknowledges a GOAWAY, or never finishes a head, cannot keep it.
                    Some(_) if closing.is_some() => return None,
                    Some(_) if deadlines.drop_unserved && activity.unserved() => return None,
                    Some(_) => {
                        closes(conn.as_mut());
                        closing = Some(now);
                        check.as_mut().reset(now + head_timeout);
                    }
                }
            }
        }
    }
}

/// What a client connection is doing, shared by the task serving it and its requests.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Requests whose response has not ended (an upgraded one's ends at its `101`).
    in_flight: AtomicUsize,
    /// When the last request ended, in milliseconds after `opened`, plus one; 0 before.
    idle_since: AtomicU64,
    /// Since when writes to the client have been blocked, in milliseconds after `opened`,
    /// plus one; 0 while they are not.
    blocked_since: AtomicU64,
    /// HTTP/2 responses with data waiting for the client's flow-control window.
    stalls: Stalls,
    /// The connection's place under the listener's limit, given back when the connection
    /// and any session upgraded from it (which holds this through a [`SessionHold`]) end.
    _permit: OwnedSemaphorePermit,
}

impl Activity {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
            stalls: Stalls::default(),
            _permit: permit,
        }
    }

    /// Since when writes to the client have been blocked, if they are.
    fn blocked_since(&self) -> Option<Instant> {
        match self.blocked_since.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.opened + Duration::from_millis(ms - 1)),
        }
    }

    /// Notes how a write to the client went: the clock is read only when one first blocks.
    fn wrote<T>(&self, result: &Poll<T>) {
        let blocked = self.blocked_since.load(Ordering::Relaxed) != 0;
        match (result.is_pending(), blocked) {
            (true, false) => {
                let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
                self.blocked_since.store(ms + 1, Ordering::Relaxed);
            }
            (false, true) => self.blocked_since.store(0, Ordering::Relaxed),
            _ => {}
        }
    }

    /// No request has come yet.
    fn unserved(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && self.idle_since.load(Ordering::Relaxed) == 0
    }

    /// Until when the connection may stay open with nothing in flight: its first request
    /// must come within `deadlines.head`, later ones within `deadlines.idle` of the last end,
    /// and once `closing` it gets `deadlines.head` to finish. `None` while a request is in
    /// flight.
    fn quiet_until(&self, deadlines: Deadlines, closing: Option<Instant>) -> Option<Instant> {
        let (head_timeout, idle_timeout) = (deadlines.head, deadlines.idle);
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = match self.idle_since.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.opened + Duration::from_millis(ms - 1)),
        };
        Some(match (closing, idle_since) {
            (Some(closing), since) => {
                since.map_or(closing, |since| since.max(closing)) + head_timeout
            }
            (None, Some(since)) => since + idle_timeout,
            (None, None) => self.opened + head_timeout,
        })
    }
}

/// Counts a request as in flight on its connection until its response body ends or is
/// dropped, and an HTTP/2 one's response among those waiting for the client's window while it
/// is.
#[derive(Debug)]
struct Busy {
    activity: Arc<Activity>,
    /// `None` over HTTP/1.1.
    stall: Option<Mark>,
}

impl Busy {
    fn start(activity: &Arc<Activity>, http2: bool) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            activity: activity.clone(),
            stall: http2.then(Mark::default),
        }
    }

    /// Notes what a poll of the response body gave hyper: after data, hyper sends nothing
    /// more (nor polls again) until the stream's window has room for it.
    fn polled<D, E>(&mut self, polled: &Poll<Option<Result<Frame<D>, E>>>) {
        if let Some(mark) = &mut self.stall {
            match polled {
                Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                    self.activity.stalls.handed(mark)
                }
                _ => self.activity.stalls.polled(mark),
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.activity;
        if let Some(mark) = &mut self.stall {
            activity.stalls.polled(mark);
        }
        // Stored before the count drops, so a connection seen with nothing in flight has the
        // end of its last request recorded.
        let ms = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        activity.idle_since.store(ms + 1, Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// A client's socket, noting on its connection's [`Activity`] when writes to it block.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.activity.wrote(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.activity.wrote(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Most data an HTTP/2 response hands hyper at once. hyper asks for more only once the
/// stream's window has taken what it holds, so a response the client lets through at least
/// this much per send timeout is seen to move; a backend's larger chunk (up to hyper's read
/// buffer) goes in pieces. The default largest HTTP/2 frame (RFC 9113 §6.5.2).
const PIECE: usize = 16 * 1024;

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted as in flight until it ends; over
    /// HTTP/2 it hands its data in pieces of at most [`PIECE`].
    struct InFlight<B> {
        #[pin]
        body: B,
        busy: Busy,
        // What is left of a chunk after the piece handed out.
        rest: Option<Bytes>,
    }
}

impl<B: Body> InFlight<B> {
    fn new(body: B, busy: Busy) -> Self {
        Self {
            body,
            busy,
            rest: None,
        }
    }
}

/// The first [`PIECE`] of `data`, the rest left in `rest`.
fn piece(mut data: Bytes, rest: &mut Option<Bytes>) -> Bytes {
    if data.len() > PIECE {
        *rest = Some(data.split_off(PIECE));
    }
    data
}

impl<B: Body<Data = Bytes>> Body for InFlight<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = match this.rest.take() {
            Some(rest) => Poll::Ready(Some(Ok(Frame::data(piece(rest, this.rest))))),
            None => match this.body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if this.busy.stall.is_some() => {
                    Poll::Ready(Some(Ok(match frame.into_data() {
                        Ok(data) => Frame::data(piece(data, this.rest)),
                        Err(frame) => frame,
                    })))
                }
                polled => polled,
            },
        };
        this.busy.polled(&polled);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let body = self.body.size_hint();
        let Some(rest) = &self.rest else {
            return body;
        };
        let rest = rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(body.lower().saturating_add(rest));
        if let Some(upper) = body.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::{protocol_of, Protocol, H2_PREFACE};

    #[test]
    fn the_first_bytes_settle_the_protocol() {
        assert_eq!(protocol_of(b"GET / HTTP/1.1\r\n"), Protocol::Http1);
        assert_eq!(protocol_of(b"PUT"), Protocol::Http1);
        assert_eq!(protocol_of(b"PRI * HTTP/1.1"), Protocol::Http1);
        assert_eq!(protocol_of(H2_PREFACE), Protocol::Http2);
        assert_eq!(protocol_of(b"P"), Protocol::Unknown);
        assert_eq!(protocol_of(b"PRI * HTTP/2.0\r\n"), Protocol::Unknown);
    }
}
