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
//! as Go's Transport assumes too. The connections open to a backend, dialing ones included,
//! count against its connection limit (shared with its HTTP/1.1 connections, for a TLS
//! backend): with every connection at its share and the limit reached, a request waits for a
//! share to come free, or for a connection to close, as long as its bounds allow, then fails
//! with `Saturated`. A backend that allows one stream a connection, or a burst of long
//! streams, would otherwise have the proxy dial without end. A connection out of use counts
//! until its socket closes, or until it is cut off once it has had no request for a
//! [`KeepAlive::timeout`] (for between one and two): one whose backend stopped reading cannot
//! send its last frames, and would hold its place, and its socket, for good (see [`close`]).
//! A connection other than the oldest open one that carried no stream for a whole
//! [`Settings::idle_timeout`] (so for between one and two) is closed, so connections opened
//! for a burst do not stay open after it.
//!
//! A connection is pinged only while requests are in flight on it and it has read nothing for
//! [`KeepAlive::interval`], longer than gRPC servers let clients ping: grpc-go, grpc-java and
//! gRPC C-core close a connection, and every stream on it, with `GOAWAY ENHANCE_YOUR_CALM` once
//! it is pinged three times in a row (the count starts again whenever they send headers or
//! data) sooner than 5 minutes apart, or, with no stream open, sooner than 2 hours apart. hyper also
//! pings once just ahead of a request sent on a connection that has read nothing for the
//! interval: one early ping, forgiven as that request is answered. A backend that vanished
//! without a reset is found sooner by its requests: once one is given up after they waited 5 s
//! ([`SILENT_AFTER`]) for their answers while nothing at all was read from the connection, it
//! takes no more requests (the others still wait), and the next request dials another (TCP's
//! keep-alive probes nothing while requests are unacknowledged). The connection's own task
//! finds that out, with one timer armed only while requests wait (see [`Silence`]). Waiting
//! alone retires no connection: a long poll, or a gRPC watch that sends its head with its
//! first message, keeps its connection and shares it.
//!
//! A request the backend did not process, by its own word (its stream refused, or left out by
//! a GOAWAY), is sent once more, whatever its method, when its body is held whole: that costs
//! a copy of its head while it is in flight (see [`H2Channel::exchange`]).

use super::connector::{ConnectErrorKind, Connector, Stream};
use super::error::ForwardError;
use super::request::Replay;
use super::wait::Wait;
use crate::body::ProxyBody;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{header, Method, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

pub(super) type Sender = http2::SendRequest<ProxyBody>;
type Connection = http2::Connection<TokioIo<Watched>, ProxyBody, Spawner>;

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
    /// `Shared::silent`). Also how long a connection out of use, with no request left on it,
    /// may take to close before it is cut off, its backend taken for hung.
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
    /// How long a connection other than the oldest open one may carry no stream before it
    /// is closed (it is, after between one and two of these).
    pub(super) idle_timeout: Duration,
}

/// How long requests may wait for their answers, with nothing at all read from their
/// connection meanwhile, before one given up takes the connection out of use (or the ping
/// timeout, if shorter):
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
    /// The open connections, newest last; readers take a handle without a lock. Shared with
    /// the task that closes idle ones, which ends with the channel.
    conns: Arc<ArcSwap<Vec<Arc<Conn>>>>,
    /// Held while dialing; holds the failure of the last dial, which the requests that waited
    /// for it share instead of each dialing again in turn.
    dialing: tokio::sync::Mutex<Option<ForwardError>>,
    /// Dials finished so far, so a waiter can tell that one ended while it waited.
    dials: AtomicU64,
    /// Whether the backend picked `h2` on its latest TLS handshake (assumed until it says
    /// otherwise): new connections are then dialed here, once for all waiting requests.
    picked: AtomicBool,
    settings: Settings,
    /// One permit per connection open to the backend (for a TLS backend, shared with its
    /// HTTP/1.1 connections), held from its dial until its socket is closed, or cut off (see
    /// [`close`]).
    permits: Arc<Semaphore>,
    /// Where requests wait for a share of a connection to come free.
    room: Arc<Room>,
    /// Whether the task that closes idle connections runs.
    sweeping: AtomicBool,
    /// The HTTP/1.1 connections that share `permits` (a TLS backend's, an h2c backend's for
    /// upgrades): at the limit, one of them sitting idle gives its place to a request here
    /// instead of holding it until its idle timeout.
    http1: OnceLock<Weak<dyn IdleHttp1>>,
}

/// Idle HTTP/1.1 connections counted against an [`H2Channel`]'s connection limit.
pub(super) trait IdleHttp1: std::fmt::Debug + Send + Sync {
    /// Closes the connection idle longest, which lets go of its place at the limit once its
    /// task ends; whether there was one.
    fn close_oldest_idle(&self) -> bool;
}

/// Requests waiting for a share of a connection, and the signal that one came free.
#[derive(Debug, Default)]
struct Room {
    freed: Notify,
    /// Requests waiting now: a stream that ends signals `freed` only when one does, which
    /// keeps the shared `Notify` off the path of every other request.
    waiters: AtomicUsize,
}

/// One HTTP/2 connection and the requests in flight on it, each of which holds it: it ends
/// once it is out of the open connections and its last stream is done.
#[derive(Debug)]
struct Conn {
    sender: Sender,
    /// Shared with the connection's I/O, which counts its reads, and its task, which watches
    /// for silence.
    shared: Arc<Shared>,
    /// The connection's task, driven by a task of its own (`drive`) and read here for the
    /// backend's stream limit; `None` once it has ended.
    task: Arc<Mutex<Option<Connection>>>,
    room: Arc<Room>,
    /// How many responses had come when the idle sweep last looked (`u64::MAX`: it has not):
    /// a connection with no stream and none since has been idle a whole sweep.
    looked: AtomicU64,
}

/// What a connection's requests share.
#[derive(Debug, Default)]
struct Shared {
    /// Requests in flight.
    streams: AtomicUsize,
    /// Response heads received so far.
    answered: AtomicU64,
    /// Requests sent and waiting for their response heads.
    awaiting: AtomicUsize,
    /// Requests given up while waiting for their heads (their timeout, or their client gone).
    abandoned: AtomicU64,
    /// Requests have waited [`SILENT_AFTER`] with nothing read from the connection meanwhile:
    /// one given up now marks it silent at once. Set by the connection's task (see
    /// [`Silence`]), cleared by any read.
    hushed: AtomicBool,
    /// Reads from the connection that returned bytes, of any frame.
    reads: AtomicU64,
    /// A request was given up after requests waited [`SILENT_AFTER`] for their answers with
    /// nothing at all read from the connection meanwhile: the backend has gone silent (a node gone without a reset, a
    /// partition), and the connection takes no more requests. Pings alone would find it only
    /// after their interval, minutes, and TCP's keep-alive never does while requests are
    /// unacknowledged. Set by the connection's task (see [`Silence`]).
    silent: AtomicBool,
}

impl Conn {
    /// Whether it takes no more requests.
    fn is_closed(&self) -> bool {
        self.sender.is_closed() || self.shared.silent.load(Ordering::Relaxed)
    }

    /// A stream on this connection, if it is open and below its share.
    fn claim(self: &Arc<Self>) -> Option<Claimed> {
        if self.is_closed() {
            return None;
        }
        let share = self.share();
        // Sequentially consistent, as is the count of a stream that ends and its read of the
        // waiters: a request that counts itself waiting and then finds no share here is seen
        // waiting by the stream that frees one.
        self.shared
            .streams
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < share).then_some(n + 1)
            })
            .ok()?;
        Some(Claimed {
            sender: self.sender.clone(),
            stream: OpenStream(Arc::clone(self)),
        })
    }

    /// Whether it carried no stream since the idle sweep last looked, which then looks again.
    fn idle_since_last_look(&self) -> bool {
        let answered = self.shared.answered.load(Ordering::Relaxed);
        let looked = self.looked.swap(answered, Ordering::Relaxed);
        looked == answered && self.shared.streams.load(Ordering::SeqCst) == 0
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

/// Drives a connection's task until it ends, then drops it; meanwhile watches whether the
/// backend went silent, after `silent_after` (see [`Silence`]). The task can end before the
/// socket does, so the connection's place at the limit is held by its I/O instead: then
/// [`close`] waits for the socket to close, at most `grace` once no request is left on it.
async fn drive(
    task: Arc<Mutex<Option<Connection>>>,
    shared: Arc<Shared>,
    place: Arc<Place>,
    silent_after: Duration,
    grace: Duration,
) {
    let mut silence = Silence {
        after: silent_after,
        quiet: None,
    };
    let tick = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(tick);
    std::future::poll_fn(|cx| {
        {
            let mut slot = task.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(conn) = slot.as_mut() else {
                return Poll::Ready(());
            };
            if let Poll::Ready(ended) = Pin::new(conn).poll(cx) {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "HTTP/2 backend connection ended");
                }
                *slot = None;
                return Poll::Ready(());
            }
        }
        silence.watch(&shared, tick.as_mut(), cx);
        Poll::Pending
    })
    .await;
    close(&place, &shared, grace).await;
}

/// Once a connection's task has ended (dropped out of use, or after the backend's GOAWAY),
/// waits for its socket to close; if it has not `grace` after the last request on it was
/// done (checked every `grace`, so after between one and two), lets go of its place at the
/// limit and cuts it off: ends hyper's own task for it, which owns the socket.
///
/// That task, with the requests gone, sends a GOAWAY and flushes before it shuts the socket;
/// a backend that stopped reading (a process hung, whose kernel keeps its receive window
/// shut) with data of ours still unsent keeps that flush, and so the socket and the place,
/// for good: a backend hung again and again would then use up its connection limit. Requests
/// still open after a graceful GOAWAY carry on for as long as they need, so the connection
/// never holds more places than the limit allows while it may still be in use; a hung one
/// among them ends at its own bounds, or at the ping timeout.
async fn close(place: &Place, shared: &Shared, grace: Duration) {
    loop {
        // Once the task has ended, requests only go: none is added.
        let done = shared.streams.load(Ordering::SeqCst) == 0;
        tokio::select! {
            () = place.closed.notified() => return,
            () = tokio::time::sleep(grace) => {}
        }
        if done {
            break;
        }
    }
    tracing::debug!("HTTP/2 backend connection did not close: cut off, its backend hung");
    place.let_go();
    if let Some(task) = place.task.get() {
        task.abort();
    }
}

/// A connection's place at its backend's connection limit, and the means to cut it off.
#[derive(Debug)]
struct Place {
    /// Let go of when the socket closes (see [`Held`]), or once [`close`] cuts it off.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Signalled when the socket closes.
    closed: Notify,
    /// hyper's own task for the connection, which owns its socket (see [`Spawner`]).
    task: OnceLock<tokio::task::AbortHandle>,
}

impl Place {
    fn let_go(&self) {
        drop(
            self.permit
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}

/// Spawns a connection's tasks on tokio, as hyper's `TokioExecutor` does, and keeps a handle
/// on the first: hyper spawns the connection's own task, which owns its socket, as it starts
/// the connection, before any request's. One load more per spawn, next to its allocation.
#[derive(Debug, Clone)]
struct Spawner(Arc<Place>);

impl<F> hyper::rt::Executor<F> for Spawner
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        if self.0.task.get().is_some() {
            tokio::spawn(fut);
        } else {
            let _ = self.0.task.set(tokio::spawn(fut).abort_handle());
        }
    }
}

/// Holds a connection's place until dropped with its I/O, after the socket (or until the
/// connection is cut off), and then tells [`close`].
#[derive(Debug)]
struct Held(Arc<Place>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.let_go();
        self.0.closed.notify_one();
    }
}

/// Whether a request on a connection was given up after requests waited `after` for their
/// answers while nothing at all was read from it: then the connection is marked silent.
/// Waiting alone is not enough: a healthy backend may be quiet that long (a gRPC watch that
/// sends its head with its first message, a long poll), and retiring its connection would
/// open one per such request. Looked at by the connection's own task, which each request sent
/// wakes anyway, with one timer that ticks only while requests wait, every fifth of `after`:
/// nothing per request. The quiet is counted from a tick (or the first request seen waiting),
/// never from before, so it is never overstated; found at most a tick late.
struct Silence {
    after: Duration,
    /// The reads and the requests given up counted when the connection was last seen quiet
    /// from, and since when; `None` while no request was seen waiting.
    quiet: Option<(u64, u64, Instant)>,
}

impl Silence {
    fn watch(&mut self, shared: &Shared, mut tick: Pin<&mut Sleep>, cx: &mut Context<'_>) {
        let every = (self.after / 5).max(Duration::from_millis(1));
        loop {
            if shared.silent.load(Ordering::Relaxed) {
                return;
            }
            match self.quiet {
                None => {
                    if shared.awaiting.load(Ordering::Relaxed) == 0 {
                        return;
                    }
                    // A quiet starts anew.
                    shared.hushed.store(false, Ordering::Relaxed);
                    let now = Instant::now();
                    self.quiet = Some((
                        shared.reads.load(Ordering::Relaxed),
                        shared.abandoned.load(Ordering::Relaxed),
                        now,
                    ));
                    tick.as_mut().reset(now + every);
                }
                Some((reads, abandoned, since)) => {
                    if tick.as_mut().poll(cx).is_pending() {
                        return;
                    }
                    let now = Instant::now();
                    let read = shared.reads.load(Ordering::Relaxed);
                    let given_up = shared.abandoned.load(Ordering::Relaxed);
                    let waiting = shared.awaiting.load(Ordering::Relaxed) > 0;
                    if read != reads {
                        // A read racing the tick's own store may have found it unset.
                        shared.hushed.store(false, Ordering::Relaxed);
                        if !waiting {
                            self.quiet = None;
                            return;
                        }
                        self.quiet = Some((read, given_up, now));
                    } else if now.duration_since(since) >= self.after && given_up == abandoned {
                        if !waiting {
                            shared.hushed.store(false, Ordering::Relaxed);
                            self.quiet = None;
                            return;
                        }
                        shared.hushed.store(true, Ordering::Relaxed);
                    } else if now.duration_since(since) >= self.after {
                        tracing::debug!(
                            quiet = ?now.duration_since(since),
                            "HTTP/2 backend connection silent: it takes no more requests"
                        );
                        shared.silent.store(true, Ordering::Relaxed);
                        return;
                    } else if !waiting {
                        self.quiet = None;
                        return;
                    }
                    tick.as_mut().reset(now + every);
                }
            }
        }
    }
}

/// A connection's I/O, counting the reads that return bytes into `Shared::reads`: a backend
/// that sends anything at all (an answer, data, a window update, a ping's ack) is not silent.
/// Holds the connection's place at the backend's connection limit until the socket is closed.
#[derive(Debug)]
struct Watched {
    io: Stream,
    shared: Arc<Shared>,
    /// Dropped last, once the socket is closed.
    _held: Held,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() != before {
            this.shared.reads.fetch_add(1, Ordering::Relaxed);
            if this.shared.hushed.load(Ordering::Relaxed) {
                this.shared.hushed.store(false, Ordering::Relaxed);
            }
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A request's place on a connection, given up when its response body is done with (or the
/// request fails).
#[derive(Debug)]
pub struct OpenStream(Arc<Conn>);

impl OpenStream {
    fn on(conn: &Arc<Conn>) -> Self {
        conn.shared.streams.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(conn))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let conn = &self.0;
        // See `Conn::claim` for the ordering.
        conn.shared.streams.fetch_sub(1, Ordering::SeqCst);
        if conn.room.waiters.load(Ordering::SeqCst) > 0 {
            conn.room.freed.notify_one();
        }
    }
}

/// A request waiting for its answer, counted in [`Shared::awaiting`] until its head comes, it
/// fails, or it is given up (its timeout, or its client gone). Counted before it is sent, so
/// the connection's task, woken to send it, sees it waiting.
struct Awaiting<'a> {
    shared: &'a Shared,
    settled: bool,
}

impl<'a> Awaiting<'a> {
    fn on(shared: &'a Shared) -> Self {
        shared.awaiting.fetch_add(1, Ordering::Relaxed);
        Self {
            shared,
            settled: false,
        }
    }

    /// Its head came, or it failed: not given up.
    fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        self.shared.awaiting.fetch_sub(1, Ordering::Relaxed);
        if !self.settled {
            self.shared.abandoned.fetch_add(1, Ordering::Relaxed);
            // Given up after the quiet was found: the next request must not land here.
            if self.shared.hushed.load(Ordering::Relaxed) {
                self.shared.silent.store(true, Ordering::Relaxed);
            }
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
    /// A new TLS connection on which the backend picked HTTP/1.1, and its permit, for the
    /// caller's pool.
    Http1(Stream, OwnedSemaphorePermit),
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
    /// The backend did not process the request (see [`unprocessed`]): a copy of it, which may
    /// be sent again whatever its method.
    Unprocessed(Request<ProxyBody>),
    Failed(ForwardError),
}

impl H2Channel {
    /// A channel whose connections, dialing ones included, each hold one of `permits` while
    /// open.
    pub(super) fn new(
        connector: Connector,
        scheme: Scheme,
        fallback: Authority,
        settings: Settings,
        permits: Arc<Semaphore>,
    ) -> Self {
        Self {
            connector,
            scheme,
            fallback,
            conns: Arc::new(ArcSwap::from_pointee(Vec::new())),
            dialing: tokio::sync::Mutex::new(None),
            dials: AtomicU64::new(0),
            picked: AtomicBool::new(true),
            settings,
            permits,
            room: Arc::default(),
            sweeping: AtomicBool::new(false),
            http1: OnceLock::new(),
        }
    }

    /// Counts `idle` among the connections a request waiting here at the limit may close.
    pub(super) fn share_limit_with(&self, idle: Weak<dyn IdleHttp1>) {
        let _ = self.http1.set(idle);
    }

    /// Sends `req` to an h2c backend. A request the connection closed under before it went out
    /// is sent once more, on a new connection; so is one the backend did not process, when
    /// `replay` holds its whole body (see [`exchange`](Self::exchange)). With every connection
    /// at its share and the connection limit reached, the request waits as `wait` says.
    pub(super) async fn send(
        &self,
        mut req: Request<ProxyBody>,
        wait: &Wait,
        mut replay: Option<&Bytes>,
    ) -> Result<(Response<Incoming>, OpenStream), ForwardError> {
        let mut unsent = false;
        loop {
            let claimed = match self.open() {
                Some(claimed) => claimed,
                // Boxed: dialing is rare, and its future would otherwise be carried by every
                // request's.
                None => match Box::pin(self.dial(wait)).await? {
                    Dialed::Http2(claimed) => claimed,
                    Dialed::Http1(..) | Dialed::UseHttp1 => {
                        return Err(ForwardError::Other("backend refused h2".into()))
                    }
                },
            };
            match self.exchange(claimed, req, replay).await {
                Exchanged::Response(resp, stream) => return Ok((resp, stream)),
                Exchanged::Failed(e) => return Err(e),
                Exchanged::Unsent(back) if !unsent => (req, unsent) = (back, true),
                Exchanged::Unsent(_) => return Err(ForwardError::Canceled),
                // Sent once more, and no more.
                Exchanged::Unprocessed(copy) => (req, replay) = (copy, None),
            }
        }
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
    /// backend now picks HTTP/1.1. At the connection limit, waits as `wait` says for a share
    /// to come free or a connection to close.
    pub(super) async fn dial(&self, wait: &Wait) -> Result<Dialed, ForwardError> {
        // Room for a new connection, found while waiting.
        let mut room = None;
        loop {
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
            let permit = match room.take() {
                Some(permit) => permit,
                None => match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    Err(_) => {
                        // Others may dial meanwhile: a closed connection makes room for one.
                        drop(last_failure);
                        match self.wait_for_room(wait).await? {
                            Space::Stream(claimed) => return Ok(Dialed::Http2(claimed)),
                            Space::Connection(permit) => room = Some(permit),
                        }
                        continue;
                    }
                },
            };
            let dialed = async {
                let io = self.connector.connect().await.map_err(|e| match e.kind {
                    ConnectErrorKind::Tls => ForwardError::Tls(e),
                    ConnectErrorKind::Dial | ConnectErrorKind::Timeout => ForwardError::Dial(e),
                })?;
                if io.is_tls() && !io.negotiated_h2() {
                    self.picked.store(false, Ordering::Relaxed);
                    return Ok(Dialed::Http1(io, permit));
                }
                self.install(io, permit).await.map(Dialed::Http2)
            }
            .await;
            *last_failure = dialed.as_ref().err().map(ForwardError::duplicate);
            self.dials.fetch_add(1, Ordering::Release);
            return dialed;
        }
    }

    /// With every connection at its share and the connection limit reached: the first share
    /// to come free, or room for a new connection once one closes, within `wait`.
    async fn wait_for_room(&self, wait: &Wait) -> Result<Space, ForwardError> {
        // Those that take no more requests go, so they close once their streams are done.
        prune(&self.conns, &[]);
        if let Some(http1) = self.http1.get().and_then(Weak::upgrade) {
            http1.close_oldest_idle();
        }
        let found = async {
            loop {
                let freed = self.room.freed.notified();
                tokio::pin!(freed);
                // Registered before looking, so a share freed after the look wakes this
                // request (or another waiting one).
                freed.as_mut().enable();
                if let Some(claimed) = self.open() {
                    return Ok(Space::Stream(claimed));
                }
                tokio::select! {
                    permit = self.permits.clone().acquire_owned() => {
                        // The semaphore is never closed; an error would mean it was.
                        return permit
                            .map(Space::Connection)
                            .map_err(|_| ForwardError::Saturated);
                    }
                    () = &mut freed => {}
                }
            }
        };
        wait.for_http2(&self.room.waiters, found).await
    }

    /// Adds `io`, a connection on which the backend picked `h2`, to the open connections,
    /// unless one of those has room (then `io` is closed, `permit` let go, and that one used).
    pub(super) async fn adopt(
        &self,
        io: Stream,
        permit: OwnedSemaphorePermit,
    ) -> Result<Claimed, ForwardError> {
        let _dialing = self.dialing.lock().await;
        match self.open() {
            Some(claimed) => Ok(claimed),
            None => self.install(io, permit).await,
        }
    }

    /// Starts HTTP/2 on `io`, which holds `permit` until it is closed.
    async fn install(
        &self,
        io: Stream,
        permit: OwnedSemaphorePermit,
    ) -> Result<Claimed, ForwardError> {
        let Settings {
            keep_alive,
            max_header_list_size,
            idle_timeout,
        } = self.settings;
        let shared = Arc::new(Shared::default());
        let place = Arc::new(Place {
            permit: Mutex::new(Some(permit)),
            closed: Notify::new(),
            task: OnceLock::new(),
        });
        let io = Watched {
            io,
            shared: Arc::clone(&shared),
            _held: Held(Arc::clone(&place)),
        };
        let (sender, conn) = http2::Builder::new(Spawner(Arc::clone(&place)))
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
        let silent_after = keep_alive.timeout.min(SILENT_AFTER);
        tokio::spawn(drive(
            Arc::clone(&task),
            Arc::clone(&shared),
            place,
            silent_after,
            keep_alive.timeout,
        ));
        let conn = Arc::new(Conn {
            sender,
            shared,
            task,
            room: Arc::clone(&self.room),
            looked: AtomicU64::new(u64::MAX),
        });
        // Its stream is claimed before others can see it, so it is this request's to use.
        let claimed = Claimed {
            sender: conn.sender.clone(),
            stream: OpenStream::on(&conn),
        };
        // Closed ones go: they take no more requests, and their streams hold their own handles.
        self.conns.rcu(|conns| {
            let mut open: Vec<Arc<Conn>> =
                conns.iter().filter(|c| !c.is_closed()).cloned().collect();
            open.push(Arc::clone(&conn));
            open
        });
        // Requests waiting at the limit may fit on it: a connection that closed let one of
        // them dial this one, with room for many.
        if self.room.waiters.load(Ordering::SeqCst) > 0 {
            self.room.freed.notify_waiters();
        }
        self.picked.store(true, Ordering::Relaxed);
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(&self.conns), idle_timeout));
        }
        Ok(claimed)
    }

    /// Sends `req` (origin-form, with its host in `Host`) on the claimed connection as an
    /// HTTP/2 request whose `:authority` is that host.
    ///
    /// With `replay`, its whole body, a copy of the request is kept while it is in flight, and
    /// given back if the backend did not process it: the backend refused its stream, or its
    /// GOAWAY left the stream out (RFC 9113 §8.1.4, §8.7 guarantee that neither was processed,
    /// so this holds for any method, as a connection closing under a request does not). Not
    /// for `CONNECT`, whose tunnel a copy cannot carry.
    pub(super) async fn exchange(
        &self,
        claimed: Claimed,
        mut req: Request<ProxyBody>,
        replay: Option<&Bytes>,
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
        // Boxed: kept across the exchange, which is most often answered.
        let copy = replay
            .filter(|_| req.method() != Method::CONNECT)
            .map(|body| Box::new(Replay::of(&req, body)));
        let shared = &*stream.0.shared;
        let awaiting = Awaiting::on(shared);
        let sent = sender.try_send_request(req).await;
        awaiting.settle();
        match sent {
            Ok(resp) => {
                shared.answered.fetch_add(1, Ordering::Relaxed);
                Exchanged::Response(resp, stream)
            }
            Err(mut e) => match e.take_message() {
                Some(req) => Exchanged::Unsent(req),
                None => {
                    let e = e.into_error();
                    match copy {
                        Some(copy) if unprocessed(&e) => {
                            tracing::debug!(error = %e, "backend did not process the request: sent again");
                            Exchanged::Unprocessed(copy.into_request())
                        }
                        _ => Exchanged::Failed(ForwardError::from_hyper(e)),
                    }
                }
            },
        }
    }
}

/// Whether an exchange failed because the backend did not process its request: it reset the
/// stream with `REFUSED_STREAM`, or sent a GOAWAY whose last stream id is below the stream's.
/// h2 fails with the backend's GOAWAY only such streams and those not yet opened; one at or
/// below that id that fails later fails with what ended it (the connection closing, a reset),
/// as the backend may have processed it.
fn unprocessed(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<::h2::Error>() {
            return h2.is_remote()
                && (h2.is_go_away()
                    || h2.is_reset() && h2.reason() == Some(::h2::Reason::REFUSED_STREAM));
        }
        source = cause.source();
    }
    false
}

/// What a request waiting at the connection limit got.
enum Space {
    /// A share of an open connection.
    Stream(Claimed),
    /// Room for a new connection.
    Connection(OwnedSemaphorePermit),
}

/// Every `idle` until the channel is dropped, closes the connections that carried no stream
/// since the last look (all but the oldest open one) and forgets those that take no more
/// requests.
async fn sweep(conns: Weak<ArcSwap<Vec<Arc<Conn>>>>, idle: Duration) {
    loop {
        tokio::time::sleep(idle).await;
        let Some(conns) = conns.upgrade() else { return };
        let current = conns.load_full();
        let mut open = current.iter().filter(|c| !c.is_closed());
        // The oldest open one stays, idle or not, ready for the next request; it is looked at
        // all the same, so it is not taken for idle the moment it stops being the oldest.
        if let Some(oldest) = open.next() {
            oldest.idle_since_last_look();
        }
        let idle: Vec<Arc<Conn>> = open.filter(|c| c.idle_since_last_look()).cloned().collect();
        prune(&conns, &idle);
    }
}

/// Takes out of the open connections those that take no more requests and those in `idle`;
/// a connection taken out ends once its last stream is done.
fn prune(conns: &ArcSwap<Vec<Arc<Conn>>>, idle: &[Arc<Conn>]) {
    let goes = |c: &Arc<Conn>| c.is_closed() || idle.iter().any(|i| Arc::ptr_eq(i, c));
    if !conns.load().iter().any(goes) {
        return;
    }
    conns.rcu(|conns| {
        conns
            .iter()
            .filter(|c| !goes(c))
            .cloned()
            .collect::<Vec<_>>()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioExecutor;

    /// gRPC servers close a connection pinged sooner than 5 minutes after the last ping, three
    /// times in a row.
    #[test]
    fn backends_are_pinged_no_sooner_than_grpc_servers_allow() {
        assert!(KeepAlive::default().interval > Duration::from_secs(5 * 60));
    }

    /// An h2c backend allowing `streams` streams a connection that answers `/hold` with a
    /// head and a body that never ends, anything else with `ok`; counts the connections it
    /// accepted and those that closed.
    async fn backend(streams: u32) -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (addr, accepted, closed, _) = backend_with(move |_| streams).await;
        (addr, accepted, closed)
    }

    /// [`backend`], allowing `streams(n)` streams on its `n`th connection (from 0), whose first
    /// connection ends when the returned sender fires.
    async fn backend_with(
        streams: impl Fn(usize) -> u32 + Send + 'static,
    ) -> (
        std::net::SocketAddr,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        use bytes::Bytes;
        use http_body_util::{Either, Full, StreamBody};
        type Frames = futures_util::stream::Pending<
            Result<http_body::Frame<Bytes>, std::convert::Infallible>,
        >;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (close_first, closing) = tokio::sync::oneshot::channel::<()>();
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            let mut closing = Some(closing);
            while let Ok((tcp, _)) = listener.accept().await {
                let n = a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let body: Either<StreamBody<Frames>, Full<Bytes>> =
                        if req.uri().path() == "/hold" {
                            Either::Left(StreamBody::new(futures_util::stream::pending()))
                        } else {
                            Either::Right(Full::new(Bytes::from_static(b"ok")))
                        };
                    Ok::<_, std::convert::Infallible>(Response::new(body))
                });
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(streams(n))
                    .serve_connection(TokioIo::new(tcp), service);
                // The first connection is dropped when told: it closes under its streams.
                let told = if n == 0 { closing.take() } else { None };
                tokio::spawn(async move {
                    match told {
                        Some(told) => {
                            // A sender dropped unfired never tells.
                            let told = async {
                                if told.await.is_err() {
                                    std::future::pending::<()>().await;
                                }
                            };
                            tokio::select! {
                                _ = conn => {}
                                () = told => {}
                            }
                        }
                        None => {
                            let _ = conn.await;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (addr, accepted, closed, close_first)
    }

    /// A channel to the test backend at `addr` on 127.0.0.1, at most `permits` connections.
    fn channel_to(addr: std::net::SocketAddr, settings: Settings, permits: usize) -> H2Channel {
        let connector =
            Connector::new("127.0.0.1", addr.port(), None, Duration::from_secs(2), None);
        H2Channel::new(
            connector,
            Scheme::HTTP,
            Authority::from_static("backend"),
            settings,
            Arc::new(Semaphore::new(permits)),
        )
    }

    fn request(path: &str) -> Request<ProxyBody> {
        Request::get(path)
            .header(header::HOST, "backend")
            .body(crate::body::full(bytes::Bytes::new()))
            .expect("request")
    }

    async fn wait_for(count: &AtomicUsize, want: usize, within: Duration) -> usize {
        let deadline = std::time::Instant::now() + within;
        while count.load(Ordering::SeqCst) < want && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        count.load(Ordering::SeqCst)
    }

    /// A backend that allows one stream a connection: streams held open take a connection
    /// each up to the limit (two here), and a request past it waits for a share, then fails
    /// with `Saturated`, without a dial. Once they are done, every connection but the oldest
    /// closes after the idle timeout, with or without traffic on the one left.
    #[tokio::test]
    async fn connections_stay_within_the_limit_and_those_beyond_the_first_close_once_idle() {
        let (addr, accepted, closed) = backend(1).await;
        let idle = Duration::from_millis(300);
        let settings = Settings {
            keep_alive: KeepAlive::default(),
            max_header_list_size: 64 << 10,
            idle_timeout: idle,
        };
        let channel = channel_to(addr, settings, 2);
        let unbounded = Wait::until(None);

        // Answered: the backend's SETTINGS (one stream a connection) have come.
        let (resp, stream) = channel
            .send(request("/"), &unbounded, None)
            .await
            .expect("answer");
        assert_eq!(resp.status(), http::StatusCode::OK);
        drop((resp, stream));
        let held = [
            channel
                .send(request("/hold"), &unbounded, None)
                .await
                .expect("held"),
            channel
                .send(request("/hold"), &unbounded, None)
                .await
                .expect("held"),
        ];
        assert_eq!(accepted.load(Ordering::SeqCst), 2);

        // At the limit, a third waits, and fails without a dial.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        let past = channel
            .send(request("/"), &Wait::until(Some(deadline)), None)
            .await;
        assert!(matches!(past, Err(ForwardError::Saturated)), "{past:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "no dial past the limit");

        // A request waiting at the limit gets the first share that comes free.
        let [first, second] = held;
        let waiting = channel.send(request("/"), &unbounded, None);
        let freeing = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(first);
        };
        let (served, ()) = tokio::join!(waiting, freeing);
        let (resp, stream) = served.expect("served once a share came free");
        assert_eq!(resp.status(), http::StatusCode::OK);
        drop((resp, stream, second));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);

        // Idle: the newer connection closes, the oldest stays and serves the next request.
        assert_eq!(wait_for(&closed, 1, idle * 10).await, 1);
        tokio::time::sleep(idle * 3).await;
        assert_eq!(closed.load(Ordering::SeqCst), 1, "the oldest stays open");
        let (resp, _stream) = channel
            .send(request("/"), &unbounded, None)
            .await
            .expect("answer");
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "no new connection");
    }

    /// At a limit of one connection, whose one share is held: requests waiting for room are
    /// all served once that connection closes and one of them dials a new one with room for
    /// many, not only the one that dialled.
    #[tokio::test]
    async fn requests_waiting_at_the_limit_take_the_room_a_new_connection_brings() {
        let (addr, accepted, _, close_first) = backend_with(|n| if n == 0 { 1 } else { 10 }).await;
        let settings = Settings {
            keep_alive: KeepAlive::default(),
            max_header_list_size: 64 << 10,
            idle_timeout: Duration::from_secs(90),
        };
        let channel = channel_to(addr, settings, 1);
        // The backend's SETTINGS (one stream) come with the first answer.
        let (resp, stream) = channel
            .send(request("/"), &Wait::until(None), None)
            .await
            .expect("answer");
        drop((resp, stream));
        let held = channel
            .send(request("/hold"), &Wait::until(None), None)
            .await
            .expect("held");
        let within = Wait::until(Some(tokio::time::Instant::now() + Duration::from_secs(3)));
        let closing = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = close_first.send(());
            // Once the proxy has seen it close, the last stream on it goes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(held);
        };
        let (one, two, three, ()) = tokio::join!(
            channel.send(request("/"), &within, None),
            channel.send(request("/"), &within, None),
            channel.send(request("/"), &within, None),
            closing,
        );
        for served in [one, two, three] {
            let (resp, _stream) = served.expect("served on the new connection");
            assert_eq!(resp.status(), http::StatusCode::OK);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "one new connection");
    }

    /// A backend sends a graceful GOAWAY (last stream id the largest, as servers do as they
    /// shut down) while a stream is in flight: the connection takes no more requests, but its
    /// socket stays open, and counted at the limit (one here), until that stream is done,
    /// however long past the ping timeout. A request meanwhile waits, without a dial, and is
    /// served on a new connection once the first has closed.
    #[tokio::test]
    async fn a_connection_draining_after_goaway_holds_its_place_until_its_socket_closes() {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        // Ends the answer to the first `/slow`.
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(Mutex::new(Some(finished)));
        // Tells the first connection to go away; answered once the proxy has read the GOAWAY
        // (it acknowledged a ping sent after it).
        let (go_away, told) = tokio::sync::oneshot::channel::<()>();
        let (read, gone_away) = tokio::sync::oneshot::channel::<()>();
        let a = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut first = Some((told, read));
            while let Ok((tcp, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let finished = Arc::clone(&finished);
                let (mut told, mut read) = first
                    .take()
                    .map_or((None, None), |(t, r)| (Some(t), Some(r)));
                tokio::spawn(async move {
                    let Ok(mut conn) = ::h2::server::handshake(tcp).await else {
                        return;
                    };
                    let mut pings = conn.ping_pong();
                    loop {
                        let telling = async {
                            match told.as_mut() {
                                Some(told) => {
                                    let _ = told.await;
                                }
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            next = conn.accept() => {
                                let Some(Ok((req, respond))) = next else { break };
                                let finished = if req.uri().path() == "/slow" {
                                    finished.lock().unwrap_or_else(PoisonError::into_inner).take()
                                } else {
                                    None
                                };
                                tokio::spawn(answer(respond, finished));
                            }
                            () = telling => {
                                told = None;
                                conn.graceful_shutdown();
                                if let (Some(mut pings), Some(read)) = (pings.take(), read.take()) {
                                    tokio::spawn(async move {
                                        if pings.ping(::h2::Ping::opaque()).await.is_ok() {
                                            let _ = read.send(());
                                        }
                                    });
                                }
                            }
                        }
                    }
                });
            }
        });
        /// Answers with a head, then, once `finished` fires (at once without it), a body.
        async fn answer(
            mut respond: ::h2::server::SendResponse<Bytes>,
            finished: Option<tokio::sync::oneshot::Receiver<()>>,
        ) {
            let Ok(mut body) = respond.send_response(Response::new(()), false) else {
                return;
            };
            let data = match finished {
                Some(finished) => {
                    let _ = finished.await;
                    Bytes::from_static(b"slow")
                }
                None => Bytes::from_static(b"ok"),
            };
            let _ = body.send_data(data, true);
        }

        let settings = Settings {
            // The stream outlasts the ping timeout: the connection holds its place all the
            // same, as long as the stream is open.
            keep_alive: KeepAlive {
                timeout: Duration::from_millis(100),
                ..KeepAlive::default()
            },
            max_header_list_size: 64 << 10,
            idle_timeout: Duration::from_secs(90),
        };
        let channel = channel_to(addr, settings, 1);
        let (slow, slow_stream) = channel
            .send(request("/slow"), &Wait::until(None), None)
            .await
            .expect("slow answer");
        assert_eq!(slow.status(), http::StatusCode::OK);
        let _ = go_away.send(());
        tokio::time::timeout(Duration::from_secs(3), gone_away)
            .await
            .expect("GOAWAY read in time")
            .expect("GOAWAY read");

        let within = Wait::until(Some(tokio::time::Instant::now() + Duration::from_secs(5)));
        let draining = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                1,
                "no dial while the first connection is open"
            );
            // The stream in flight is answered in full, and the connection then closes.
            let _ = finish.send(());
            let body = slow.into_body().collect().await.expect("slow body");
            assert_eq!(body.to_bytes(), Bytes::from_static(b"slow"));
            drop(slow_stream);
        };
        let (served, ()) = tokio::join!(channel.send(request("/"), &within, None), draining);
        let (resp, stream) = served.expect("served once the first connection closed");
        assert_eq!(resp.status(), http::StatusCode::OK);
        let body = resp.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), Bytes::from_static(b"ok"));
        drop(stream);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// A backend that stops reading (a process hung, whose kernel keeps its receive window
    /// shut) while an upload streams to it through a large window: the upload fills the
    /// socket's buffers and is given up, which marks the connection silent, and the connection
    /// is dropped. Its task then tries to flush its last frames into a socket the backend
    /// never drains. At a limit of one connection, the next request dials anew once the grace
    /// (the ping timeout, short here) is over, and the hung connection's task and socket go.
    #[tokio::test]
    async fn a_connection_whose_backend_stopped_reading_gives_up_its_place_after_a_grace() {
        use http_body_util::StreamBody;
        /// Past what the socket buffers on both sides take.
        const UPLOAD: usize = 32 << 20;
        /// The backend's windows, stream and connection: flow control never stops the upload.
        const WINDOW: u32 = 64 << 20;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let first = a.fetch_add(1, Ordering::SeqCst) == 0;
                tokio::spawn(async move {
                    let Ok(mut conn) = ::h2::server::Builder::new()
                        .initial_window_size(WINDOW)
                        .initial_connection_window_size(WINDOW)
                        .handshake::<_, Bytes>(tcp)
                        .await
                    else {
                        return;
                    };
                    if first {
                        // Takes the upload's head, then never reads again.
                        let held = conn.accept().await;
                        std::future::pending::<()>().await;
                        drop((conn, held));
                        return;
                    }
                    while let Some(Ok((_, mut respond))) = conn.accept().await {
                        if let Ok(mut body) = respond.send_response(Response::new(()), false) {
                            let _ = body.send_data(Bytes::from_static(b"ok"), true);
                        }
                    }
                });
            }
        });

        let grace = Duration::from_millis(500);
        let settings = Settings {
            keep_alive: KeepAlive {
                timeout: grace,
                ..KeepAlive::default()
            },
            max_header_list_size: 64 << 10,
            idle_timeout: Duration::from_secs(90),
        };
        let channel = channel_to(addr, settings, 1);
        let chunk = Bytes::from(vec![0u8; 1 << 20]);
        let frames = futures_util::stream::iter(
            std::iter::repeat_n(chunk, UPLOAD >> 20)
                .map(|data| Ok::<_, std::convert::Infallible>(http_body::Frame::data(data))),
        );
        let upload = Request::post("/upload")
            .header(header::HOST, "backend")
            .body(crate::body::boxed(StreamBody::new(frames)))
            .expect("request");
        // Given up unanswered, with nothing read meanwhile: the connection is marked silent.
        let given_up =
            tokio::time::timeout(grace * 3, channel.send(upload, &Wait::until(None), None)).await;
        assert!(given_up.is_err(), "the upload is never answered");
        let hung = {
            let conns = channel.conns.load();
            let [conn] = conns.as_slice() else {
                panic!("one connection, not {}", conns.len());
            };
            assert!(conn.is_closed(), "the connection takes no more requests");
            Arc::downgrade(&conn.shared)
        };

        // Dropped from the open connections, its task cannot close it; the grace ends that.
        let within = Wait::until(Some(tokio::time::Instant::now() + Duration::from_secs(5)));
        let (resp, stream) = channel
            .send(request("/"), &within, None)
            .await
            .expect("served on a new connection once the grace is over");
        assert_eq!(resp.status(), http::StatusCode::OK);
        drop((resp, stream));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // The hung connection's task, which owned its socket, is gone too.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while hung.upgrade().is_some() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            hung.upgrade().is_none(),
            "the hung connection's I/O is dropped"
        );
    }
}
