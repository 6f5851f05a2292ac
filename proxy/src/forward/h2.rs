//! One multiplexed HTTP/2 connection to one backend: an h2c backend, or a TLS backend that
//! picked `h2` through ALPN.
//!
//! The connection, not the request URI, decides where a request goes, so each request keeps its
//! own host as `:authority` (the client's, or a URL rewrite's): HTTP/2 servers read the host from
//! there, not from a `Host` header. A pool keyed by URI would instead open a connection per host
//! a client cared to send. The connection is dialed on first use and again once it has closed;
//! requests that arrive meanwhile wait for that one dial and share its outcome.
//!
//! A connection carries at most its share of requests at once: the backend's own stream limit
//! (its latest `SETTINGS_MAX_CONCURRENT_STREAMS`: 128 in nginx, 250 in Go, whatever a gRPC
//! server was given), and never more than [`STREAMS_PER_CONNECTION`]. With every open
//! connection at its share, another is dialed, as Go's Transport does: a request past the
//! backend's limit would otherwise wait for a stream, and behind it every later request on that
//! connection, for as long as long-lived streams (gRPC watches, server-sent events) stay open.
//! Until the backend's first SETTINGS arrive a new connection is taken to allow 100 streams,
//! as Go's Transport assumes too.
//!
//! A connection is pinged only while requests are in flight on it and it has read nothing for
//! [`KeepAlive::interval`], longer than gRPC servers let clients ping: grpc-go, grpc-java and
//! gRPC C-core close a connection, and every stream on it, with `GOAWAY ENHANCE_YOUR_CALM` once
//! it is pinged three times in a row (the count starts again whenever they send headers or
//! data) sooner than 5 minutes apart, or, with no stream open, sooner than 2 hours apart. hyper also
//! pings once just ahead of a request sent on a connection that has read nothing for the
//! interval: one early ping, forgiven as that request is answered. A backend that vanished
//! without a reset is found sooner by its requests: one that waits 5 s ([`SILENT_AFTER`]) for
//! its answer while nothing at all is answered on the connection takes the connection out of
//! use, and the next request dials another (TCP's keep-alive probes nothing while requests are
//! unacknowledged). A request whose answer is late on an otherwise idle connection (a long
//! poll, a gRPC watch that sends its head with its first message) costs one dial that way.

use super::connector::{ConnectErrorKind, Connector, Stream};
use super::error::ForwardError;
use crate::body::ProxyBody;
use arc_swap::ArcSwap;
use http::uri::{Authority, Scheme};
use http::{header, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

pub(super) type Sender = http2::SendRequest<ProxyBody>;
type Connection = http2::Connection<TokioIo<Stream>, ProxyBody, TokioExecutor>;

/// When a connection to an HTTP/2 backend is pinged, so that one whose backend stopped
/// answering is closed, and its requests fail, rather than left to hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// A connection with requests in flight that has read nothing for this long is pinged; one
    /// with none in flight never is. gRPC servers take a ping sooner than 5 minutes after the
    /// last one as abuse, and close the connection after the third (see the module docs).
    pub interval: Duration,
    /// How long a ping may go unanswered before the connection is closed; and, if shorter than
    /// 5 s, how long a request may wait for its answer, with nothing at all answered on the
    /// connection meanwhile, before the connection takes no more requests (see
    /// `Shared::silent`).
    pub timeout: Duration,
}

impl Default for KeepAlive {
    fn default() -> Self {
        Self {
            // Twice what gRPC servers require at least (5 minutes), so that a ping is never
            // early by their clock either.
            interval: Duration::from_secs(10 * 60),
            timeout: Duration::from_secs(20),
        }
    }
}

/// What every HTTP/2 connection to a backend is built with.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) keep_alive: KeepAlive,
    /// Largest header block (response head, trailers) the backend may send.
    pub(super) max_header_list_size: u32,
}

/// How long a request may wait for its answer, with nothing at all answered on its connection
/// meanwhile, before the connection takes no more requests (or the ping timeout, if shorter):
/// short enough that a rule's own backend timeout, however short, seldom ends the wait first;
/// a connection wrongly taken out of use costs one dial.
const SILENT_AFTER: Duration = Duration::from_secs(5);
/// Requests in flight on one connection before the next request goes to another: the least a
/// server should allow (RFC 9113 §6.5.2).
const STREAMS_PER_CONNECTION: usize = 100;
/// How much a stream may be sent ahead of its client reading it.
const STREAM_WINDOW: u32 = 2 << 20;
/// How much all streams of the connection together may be sent ahead: as much as its share
/// of streams may take, so it never binds before theirs do. The connection window is taken
/// back only as streams are read: with a window a few streams' worth (hyper's default 5 MiB),
/// a handful of clients that stop reading large answers stall every other answer on the
/// connection. What stalled streams hold stays bounded by their windows; a listener's client
/// that reads nothing is dropped at the send timeout.
const CONNECTION_WINDOW: u32 = STREAMS_PER_CONNECTION as u32 * STREAM_WINDOW;

#[derive(Debug)]
pub(super) struct H2Channel {
    connector: Connector,
    /// `http` for h2c, `https` over TLS: the scheme of the absolute URIs HTTP/2 sends.
    scheme: Scheme,
    /// The authority of a request whose `Host` is not one.
    fallback: Authority,
    /// The open connections, newest last; readers take a handle without a lock.
    conns: ArcSwap<Vec<Arc<Conn>>>,
    /// Held while dialing; holds the failure of the last dial, which the requests that waited
    /// for it share instead of each dialing again in turn.
    dialing: tokio::sync::Mutex<Option<ForwardError>>,
    /// Dials finished so far, so a waiter can tell that one ended while it waited.
    dials: AtomicU64,
    /// Whether the backend picked `h2` on its latest TLS handshake (assumed until it says
    /// otherwise): new connections are then dialed here, once for all waiting requests.
    picked: AtomicBool,
    settings: Settings,
}

/// One HTTP/2 connection and the requests in flight on it.
#[derive(Debug)]
struct Conn {
    sender: Sender,
    shared: Arc<Shared>,
    /// The connection's task, driven by a task of its own (`drive`) and read here for the
    /// backend's stream limit; `None` once it has ended.
    task: Arc<Mutex<Option<Connection>>>,
}

/// What a connection's requests share.
#[derive(Debug, Default)]
struct Shared {
    /// Requests in flight.
    streams: AtomicUsize,
    /// Response heads received so far.
    answered: AtomicU64,
    /// A request waited [`SILENT_AFTER`] for its answer and nothing at all was answered on the
    /// connection meanwhile: the backend has gone silent (a node gone without a reset, a
    /// partition), and the connection takes no more requests. Pings alone would find it only
    /// after their interval, minutes, and TCP's keep-alive never does while requests are
    /// unacknowledged.
    silent: AtomicBool,
}

impl Conn {
    /// Whether it takes no more requests.
    fn is_closed(&self) -> bool {
        self.sender.is_closed() || self.shared.silent.load(Ordering::Relaxed)
    }

    /// A stream on this connection, if it is open and below its share.
    fn claim(&self) -> Option<Claimed> {
        if self.is_closed() {
            return None;
        }
        let share = self.share();
        self.shared
            .streams
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < share).then_some(n + 1)
            })
            .ok()?;
        Some(Claimed {
            sender: self.sender.clone(),
            stream: OpenStream(Arc::clone(&self.shared)),
        })
    }

    /// How many requests the connection may carry at once: as many streams as the backend's
    /// latest SETTINGS allow, at most [`STREAMS_PER_CONNECTION`]; none once it has ended. Read
    /// from the connection itself at each claim: the SETTINGS are applied by hyper's own
    /// connection task, which wakes nothing of ours, so a copy kept by `drive` could be one
    /// taken before they arrived.
    fn share(&self) -> usize {
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        task.as_ref().map_or(0, |task| {
            task.current_max_send_streams().min(STREAMS_PER_CONNECTION)
        })
    }
}

/// Drives a connection's task until it ends, then drops it.
async fn drive(task: Arc<Mutex<Option<Connection>>>) {
    std::future::poll_fn(|cx| {
        let mut slot = task.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(conn) = slot.as_mut() else {
            return Poll::Ready(());
        };
        let ended = std::task::ready!(Pin::new(conn).poll(cx));
        if let Err(e) = ended {
            tracing::debug!(error = %e, "HTTP/2 backend connection ended");
        }
        *slot = None;
        Poll::Ready(())
    })
    .await
}

/// A request's place on a connection, given up when its response body is done with (or the
/// request fails).
#[derive(Debug)]
pub struct OpenStream(Arc<Shared>);

impl OpenStream {
    fn on(shared: &Arc<Shared>) -> Self {
        shared.streams.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request waiting for its answer. Dropped unanswered (its timeout, or its client gone)
/// after `silent_after` with nothing answered on the connection since it went out, it marks
/// the connection silent ([`Shared::silent`]).
struct Awaiting<'a> {
    shared: &'a Shared,
    answered: u64,
    since: std::time::Instant,
    silent_after: Duration,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if self.since.elapsed() >= self.silent_after
            && self.shared.answered.load(Ordering::Relaxed) == self.answered
        {
            self.shared.silent.store(true, Ordering::Relaxed);
        }
    }
}

/// A connection to send one request on, with the request's place on it.
pub(super) struct Claimed {
    pub(super) sender: Sender,
    pub(super) stream: OpenStream,
}

/// What a dial produced.
pub(super) enum Dialed {
    /// An HTTP/2 connection.
    Http2(Claimed),
    /// A new TLS connection on which the backend picked HTTP/1.1, for the caller's pool.
    Http1(Stream),
    /// The dial this request waited for found the backend speaking HTTP/1.1.
    UseHttp1,
}

/// How one exchange on an HTTP/2 connection ended.
pub(super) enum Exchanged {
    /// The backend's answer, and its place on the connection: the connection is shared, not
    /// lent.
    Response(Response<Incoming>, OpenStream),
    /// The connection closed before the request went out: it may be sent on another one.
    Unsent(Request<ProxyBody>),
    Failed(ForwardError),
}

impl H2Channel {
    pub(super) fn new(
        connector: Connector,
        scheme: Scheme,
        fallback: Authority,
        settings: Settings,
    ) -> Self {
        Self {
            connector,
            scheme,
            fallback,
            conns: ArcSwap::from_pointee(Vec::new()),
            dialing: tokio::sync::Mutex::new(None),
            dials: AtomicU64::new(0),
            picked: AtomicBool::new(true),
            settings,
        }
    }

    /// Sends `req` to an h2c backend. A request the connection closed under before it went out
    /// is sent once more, on a new connection.
    pub(super) async fn send(
        &self,
        mut req: Request<ProxyBody>,
    ) -> Result<(Response<Incoming>, OpenStream), ForwardError> {
        for _ in 0..2 {
            let claimed = match self.open() {
                Some(claimed) => claimed,
                // Boxed: dialing is rare, and its future would otherwise be carried by every
                // request's.
                None => match Box::pin(self.dial()).await? {
                    Dialed::Http2(claimed) => claimed,
                    Dialed::Http1(_) | Dialed::UseHttp1 => {
                        return Err(ForwardError::Other("backend refused h2".into()))
                    }
                },
            };
            match self.exchange(claimed, req).await {
                Exchanged::Response(resp, stream) => return Ok((resp, stream)),
                Exchanged::Failed(e) => return Err(e),
                Exchanged::Unsent(unsent) => req = unsent,
            }
        }
        Err(ForwardError::Canceled)
    }

    /// A stream on an open connection below its share, if there is one.
    pub(super) fn open(&self) -> Option<Claimed> {
        self.conns.load().iter().find_map(|conn| conn.claim())
    }

    /// Whether new connections should be dialed here (see `picked`).
    pub(super) fn picked(&self) -> bool {
        self.picked.load(Ordering::Relaxed)
    }

    /// A stream on an open connection, or on a new one. Requests that arrive while a dial runs
    /// wait for it and share its outcome: its connection, its failure, or its finding that the
    /// backend now picks HTTP/1.1.
    pub(super) async fn dial(&self) -> Result<Dialed, ForwardError> {
        let seen = self.dials.load(Ordering::Acquire);
        let mut last_failure = self.dialing.lock().await;
        if let Some(claimed) = self.open() {
            return Ok(Dialed::Http2(claimed));
        }
        if self.dials.load(Ordering::Acquire) != seen {
            if let Some(e) = last_failure.as_ref() {
                return Err(e.duplicate());
            }
            if !self.picked() {
                return Ok(Dialed::UseHttp1);
            }
        }
        let dialed = async {
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
        .await;
        *last_failure = dialed.as_ref().err().map(ForwardError::duplicate);
        self.dials.fetch_add(1, Ordering::Release);
        dialed
    }

    /// Adds `io`, a connection on which the backend picked `h2`, to the open connections,
    /// unless one of those has room (then `io` is closed and that one is used).
    pub(super) async fn adopt(&self, io: Stream) -> Result<Claimed, ForwardError> {
        let _dialing = self.dialing.lock().await;
        match self.open() {
            Some(claimed) => Ok(claimed),
            None => self.install(io).await,
        }
    }

    async fn install(&self, io: Stream) -> Result<Claimed, ForwardError> {
        let Settings {
            keep_alive,
            max_header_list_size,
        } = self.settings;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(keep_alive.interval)
            .keep_alive_timeout(keep_alive.timeout)
            .keep_alive_while_idle(false)
            .max_header_list_size(max_header_list_size)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(TokioIo::new(io))
            .await
            .map_err(ForwardError::from_hyper)?;
        let task = Arc::new(Mutex::new(Some(conn)));
        tokio::spawn(drive(Arc::clone(&task)));
        let conn = Arc::new(Conn {
            sender,
            shared: Arc::default(),
            task,
        });
        // Its stream is claimed before others can see it, so it is this request's to use.
        let claimed = Claimed {
            sender: conn.sender.clone(),
            stream: OpenStream::on(&conn.shared),
        };
        // Closed ones go: they take no more requests, and their streams hold their own handles.
        self.conns.rcu(|conns| {
            let mut open: Vec<Arc<Conn>> =
                conns.iter().filter(|c| !c.is_closed()).cloned().collect();
            open.push(Arc::clone(&conn));
            open
        });
        self.picked.store(true, Ordering::Relaxed);
        Ok(claimed)
    }

    /// Sends `req` (origin-form, with its host in `Host`) on the claimed connection as an
    /// HTTP/2 request whose `:authority` is that host.
    pub(super) async fn exchange(
        &self,
        claimed: Claimed,
        mut req: Request<ProxyBody>,
    ) -> Exchanged {
        let Claimed { mut sender, stream } = claimed;
        *req.version_mut() = http::Version::HTTP_2;
        if req.uri().authority().is_none() {
            let authority = req
                .headers()
                .get(header::HOST)
                .and_then(|h| Authority::try_from(h.as_bytes()).ok())
                .unwrap_or_else(|| self.fallback.clone());
            let mut uri = std::mem::take(req.uri_mut()).into_parts();
            uri.scheme = Some(self.scheme.clone());
            uri.authority = Some(authority);
            match Uri::from_parts(uri) {
                Ok(uri) => *req.uri_mut() = uri,
                Err(e) => return Exchanged::Failed(ForwardError::Other(e.into())),
            }
        }
        if sender.ready().await.is_err() {
            return Exchanged::Unsent(req);
        }
        let shared = &stream.0;
        let awaiting = Awaiting {
            shared,
            answered: shared.answered.load(Ordering::Relaxed),
            since: std::time::Instant::now(),
            silent_after: self.settings.keep_alive.timeout.min(SILENT_AFTER),
        };
        let sent = sender.try_send_request(req).await;
        // Answered, or failed with the connection: it was not silent.
        std::mem::forget(awaiting);
        match sent {
            Ok(resp) => {
                shared.answered.fetch_add(1, Ordering::Relaxed);
                Exchanged::Response(resp, stream)
            }
            Err(mut e) => match e.take_message() {
                Some(req) => Exchanged::Unsent(req),
                None => Exchanged::Failed(ForwardError::from_hyper(e.into_error())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gRPC servers close a connection pinged sooner than 5 minutes after the last ping, three
    /// times in a row.
    #[test]
    fn backends_are_pinged_no_sooner_than_grpc_servers_allow() {
        assert!(KeepAlive::default().interval > Duration::from_secs(5 * 60));
    }
}
