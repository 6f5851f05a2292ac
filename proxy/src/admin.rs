//! The config API and operational endpoints on the admin port: `/config`, `/healthz`,
//! `/readyz`, `/metrics`.

use crate::body::BoxError;
use crate::config::{ConfigError, Reloader};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;

/// Connections the admin port holds open at once unless configured otherwise: the kubelet's
/// probes, Prometheus and the controller need a handful.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Connections one peer address may hold on the admin port at once. A peer that holds every
/// place it can, idle or not reading its answers, would otherwise keep the kubelet's probes in
/// the listen backlog until they fail and the pod is restarted. Past its share, a peer's new
/// connection takes the place of its oldest one with no request in flight: the probes, which
/// come from the node's address as hostNetwork agents and SNATed traffic do, still get in.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// Largest config document `PUT /config` accepts unless configured otherwise: room for a
/// 50,000-rule document (about 9 MB as the controller writes it) several times over.
pub const DEFAULT_MAX_CONFIG_BYTES: usize = 32 * 1024 * 1024;

/// What `/readyz` reports.
#[derive(Default)]
pub struct Health {
    draining: AtomicBool,
    /// Requests arrive only through a tunnel (no data listener): not ready before the
    /// connector is tracked, even with a table loaded.
    tunnel_mode: bool,
    /// Registered tunnel connections now; unset in standalone mode and until the connector
    /// starts.
    tunnel: std::sync::OnceLock<Box<dyn Fn() -> usize + Send + Sync>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("draining", &self.draining.load(Ordering::Relaxed))
            .field("tunnel", &self.tunnel.get().is_some())
            .finish()
    }
}

impl Health {
    /// Health of a server whose requests arrive only through a tunnel connector.
    pub fn tunnel_mode() -> Self {
        Self {
            tunnel_mode: true,
            ..Self::default()
        }
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Makes readiness depend on live tunnel connections (tunnel mode).
    pub fn track_tunnel(&self, registered: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.tunnel.set(Box::new(registered));
    }
}

/// Everything the admin endpoints use.
pub struct Admin {
    pub reloader: Arc<Reloader>,
    pub registry: Option<Arc<Registry>>,
    pub health: Arc<Health>,
    /// `None`: the config API is open (the operator was warned at start).
    pub auth_token: Option<String>,
    /// Largest config document accepted; larger pushes get 413.
    pub max_config_bytes: usize,
    /// How long a push's body may send nothing before it is answered 408 and its connection
    /// closed: the data listener's request-body timeout.
    pub body_timeout: Duration,
}

type AdminResponse = Response<Full<Bytes>>;

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> AdminResponse {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_error(status: StatusCode, message: impl std::fmt::Display) -> AdminResponse {
    let body = serde_json::json!({ "error": message.to_string() }).to_string();
    respond(status, "application/json", body)
}

/// A document refused for one rule: besides the message, the rule's position and name and the
/// field, so a controller can leave that rule out and push the rest (`error` alone is what
/// clients of the earlier format read).
fn refused(r: &cftunnel_config::valid::RuleRefused) -> AdminResponse {
    let body = serde_json::json!({
        "error": r.to_string(),
        "field": r.field(),
        "rule": r.index,
        "name": r.name,
    });
    respond(
        StatusCode::BAD_REQUEST,
        "application/json",
        body.to_string(),
    )
}

/// Constant-time comparison, so response timing says nothing about the token.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Admin {
    fn authorized(&self, req: &Request<Incoming>) -> bool {
        let Some(token) = &self.auth_token else {
            return true;
        };
        let Some(value) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some((scheme, presented)) = value.split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer")
            && same_secret(presented.trim().as_bytes(), token.as_bytes())
    }

    async fn handle(&self, req: Request<Incoming>, encoder: &MetricsEncoder) -> AdminResponse {
        match (req.method(), req.uri().path()) {
            (&Method::GET | &Method::HEAD, "/healthz") => {
                respond(StatusCode::OK, "text/plain", "ok\n")
            }
            (&Method::GET | &Method::HEAD, "/readyz") => self.readyz(),
            (&Method::GET, "/metrics") => self.metrics(encoder).await,
            (&Method::PUT, "/config") => self.put_config(req).await,
            (&Method::GET, "/config") => self.get_config(&req),
            (&Method::GET, "/config/document") => self.get_document(&req).await,
            (_, "/healthz" | "/readyz" | "/metrics" | "/config" | "/config/document") => {
                json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => json_error(StatusCode::NOT_FOUND, "not found"),
        }
    }

    fn readyz(&self) -> AdminResponse {
        match self.not_ready() {
            Some(reason) => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", reason),
            None => respond(StatusCode::OK, "text/plain", "ready\n"),
        }
    }

    /// Why the proxy is not ready, if it is not: `/readyz` and `GET /config`'s `ready` say
    /// the same.
    fn not_ready(&self) -> Option<&'static str> {
        if self.health.is_draining() {
            return Some("draining\n");
        }
        if !self.reloader.proxy().is_loaded() {
            return Some("no config loaded\n");
        }
        let registered = match self.health.tunnel.get() {
            Some(registered) => Some(registered()),
            None if self.health.tunnel_mode => Some(0),
            None => None,
        };
        (registered == Some(0)).then_some("no tunnel connection is registered\n")
    }

    async fn metrics(&self, encoder: &MetricsEncoder) -> AdminResponse {
        let Some(registry) = &self.registry else {
            return json_error(StatusCode::NOT_FOUND, "metrics are disabled");
        };
        match encoder.encode(registry).await {
            Ok(text) => respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            ),
            Err(e) => {
                tracing::warn!(error = %e, "metrics not encoded");
                json_error(StatusCode::INTERNAL_SERVER_ERROR, e)
            }
        }
    }

    /// Reads nothing a push holds: it answers while a push is being compiled.
    fn get_config(&self, req: &Request<Incoming>) -> AdminResponse {
        if !self.authorized(req) {
            return json_error(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
        }
        let state = cftunnel_config::api::ConfigState {
            version: self.reloader.version(),
            ready: self.not_ready().is_none(),
            enforces: vec![cftunnel_config::api::ENFORCES_ACCESS.to_owned()],
        };
        match serde_json::to_string(&state) {
            Ok(body) => respond(StatusCode::OK, "application/json", body),
            Err(_) => json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the state failed",
            ),
        }
    }

    /// The document being served, as pushed: what a controller that lost it pushes to pods
    /// that start later.
    async fn get_document(&self, req: &Request<Incoming>) -> AdminResponse {
        if !self.authorized(req) {
            return json_error(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
        }
        match self.reloader.document().await {
            Some(text) => respond(StatusCode::OK, "application/json", text),
            None => json_error(StatusCode::NOT_FOUND, "no config document was applied"),
        }
    }

    async fn put_config(&self, req: Request<Incoming>) -> AdminResponse {
        if !self.authorized(&req) {
            return json_error(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
        }
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return json_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/json",
            );
        }
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let limit = self.max_config_bytes;
        if declared.is_some_and(|n| n > limit as u64) {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("config larger than {limit} bytes"),
            );
        }
        let body = match read_body(req.into_body(), limit, declared, self.body_timeout).await {
            Ok(body) => body,
            Err(e) if e.is::<BodyStalled>() => {
                return json_error(StatusCode::REQUEST_TIMEOUT, e);
            }
            Err(e) => {
                if e.is::<http_body_util::LengthLimitError>() {
                    return json_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("config larger than {limit} bytes"),
                    );
                }
                return json_error(StatusCode::BAD_REQUEST, format!("reading body: {e}"));
            }
        };
        match self.reloader.apply_json(body).await {
            Ok(version) => respond(
                StatusCode::OK,
                "application/json",
                serde_json::json!({ "version": version }).to_string(),
            ),
            Err(e @ ConfigError::Stale { .. }) => json_error(StatusCode::CONFLICT, e),
            Err(e @ ConfigError::Internal(_)) => json_error(StatusCode::INTERNAL_SERVER_ERROR, e),
            Err(ConfigError::Refused(r)) => refused(&r),
            Err(e) => json_error(StatusCode::BAD_REQUEST, e),
        }
    }
}

/// Reads a body of at most `limit` bytes into one buffer, sized up front by its declared
/// length: chunks are copied in as they arrive and freed, so a large config is held once, not
/// once in chunks and again joined.
async fn read_body(
    body: Incoming,
    limit: usize,
    declared: Option<u64>,
    stall: Duration,
) -> Result<Bytes, BoxError> {
    let capacity = declared.map_or(0, |n| usize::try_from(n).unwrap_or(limit).min(limit));
    let mut buf = bytes::BytesMut::with_capacity(capacity);
    let mut body = Limited::new(body, limit);
    while let Some(frame) = tokio::time::timeout(stall, body.frame())
        .await
        .map_err(|_| BodyStalled(stall))?
    {
        if let Ok(data) = frame?.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// A push's body sent nothing for this long.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?}")]
struct BodyStalled(Duration);

/// Encodes `/metrics` answers off the runtime's workers, one at a time.
///
/// The text grows with the hostnames served (32 series each): thousands of them take tens of
/// milliseconds to seconds to encode, and on a worker every request that worker also serves
/// (one worker by default) would wait that long. The encoding runs on a thread of its own, not
/// on the runtime's blocking pool: that pool also runs backend name lookups, which hold a
/// thread each for as long as DNS takes to fail, and the metrics that show such an incident
/// must not queue behind it. A scrape whose client goes away leaves its encoding running to
/// its end, so encodings take turns: clients that ask and leave cannot start threads without
/// bound.
#[derive(Debug)]
struct MetricsEncoder {
    turn: Arc<tokio::sync::Semaphore>,
}

/// Why `/metrics` has no answer.
#[derive(Debug, thiserror::Error)]
enum EncodeError {
    #[error("metrics encoding failed")]
    Format,
    #[error("cannot start the metrics encoding thread")]
    Spawn,
    #[error("the metrics encoding thread failed")]
    Lost,
}

impl MetricsEncoder {
    fn new() -> Self {
        Self {
            turn: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The registry in the OpenMetrics text format. Cancel-safe: a caller that stops waiting
    /// gives up its turn, or leaves the encoding it started to end on its thread.
    async fn encode(&self, registry: &Arc<Registry>) -> Result<String, EncodeError> {
        let turn = Arc::clone(&self.turn)
            .acquire_owned()
            .await
            .map_err(|_| EncodeError::Lost)?;
        let registry = Arc::clone(registry);
        let (done, encoded) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("metrics-encode".into())
            .spawn(move || {
                let _turn = turn;
                let mut text = String::new();
                let result = prometheus_client::encoding::text::encode(&mut text, &registry)
                    .map(|()| text)
                    .map_err(|_| EncodeError::Format);
                let _ = done.send(result);
            })
            .map_err(|_| EncodeError::Spawn)?;
        encoded.await.map_err(|_| EncodeError::Lost)?
    }
}

/// Serves the admin endpoints until the process exits.
pub async fn serve(
    listener: TcpListener,
    admin: Arc<Admin>,
    max_connections: usize,
    send_timeout: Duration,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(
        max_connections.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let peers = Arc::new(Peers::default());
    let encoder = Arc::new(MetricsEncoder::new());
    loop {
        // At the limit, connections wait in the listen backlog: each connection is a task and
        // buffers, and the port must not take the memory and descriptors the data path needs.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Past its share, with every one of its connections mid-request, the connection is
        // closed at once and its place given back.
        let Some(place) = Peers::admit(&peers, peer.ip()) else {
            tracing::debug!(%peer, "admin connection refused: the peer's connections are all busy");
            continue;
        };
        let admin = admin.clone();
        let encoder = Arc::clone(&encoder);
        tokio::spawn(async move {
            let _permit = permit;
            let held = Arc::clone(&place.held);
            let service = service_fn(move |req| {
                let admin = admin.clone();
                let encoder = Arc::clone(&encoder);
                let busy = Busy::new(&held);
                async move {
                    let response = admin.handle(req, &encoder).await;
                    drop(busy);
                    Ok::<_, Infallible>(response)
                }
            });
            let stream = Guarded {
                stream,
                send_timeout,
                write_stall: None,
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Some(Duration::from_secs(10)))
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "admin connection ended with error");
                },
                () = place.held.evicted.notified() => {
                    tracing::debug!(%peer, "admin connection closed for a newer one of its peer");
                }
            }
        });
    }
}

/// The admin connections each peer address holds, oldest first.
#[derive(Debug, Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, Vec<Arc<Held>>>>);

/// One admin connection as its peer's share counts it.
#[derive(Debug, Default)]
struct Held {
    /// Requests in flight on it.
    busy: AtomicUsize,
    /// Closes it, for a newer connection of its peer.
    evicted: tokio::sync::Notify,
}

/// A request in flight on a connection, counted until dropped.
struct Busy(Arc<Held>);

impl Busy {
    fn new(held: &Arc<Held>) -> Self {
        held.busy.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(held))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One peer's place on the admin port, given back when dropped.
struct Place {
    peers: Arc<Peers>,
    ip: std::net::IpAddr,
    held: Arc<Held>,
}

impl Peers {
    /// A place for a connection from `ip`: past [`MAX_CONNECTIONS_PER_PEER`], the place of the
    /// peer's oldest connection with no request in flight, which is closed; none if every one
    /// has a request in flight.
    fn admit(peers: &Arc<Self>, ip: std::net::IpAddr) -> Option<Place> {
        // An IPv4 peer on a dual-stack socket is one peer whichever form it comes in.
        let ip = ip.to_canonical();
        let mut all = peers.0.lock().unwrap_or_else(PoisonError::into_inner);
        let held = all.entry(ip).or_default();
        if held.len() >= MAX_CONNECTIONS_PER_PEER {
            let idle = held
                .iter()
                .position(|h| h.busy.load(Ordering::Acquire) == 0)?;
            // Its place is given back here; its task sees the signal and ends.
            held.remove(idle).evicted.notify_one();
        }
        let new = Arc::new(Held::default());
        held.push(Arc::clone(&new));
        Some(Place {
            peers: Arc::clone(peers),
            ip,
            held: new,
        })
    }
}

/// An admin connection's socket, failed once a write has been blocked for the send timeout: a
/// client that stops reading what it is sent (a `/metrics` or `/config/document` answer larger
/// than the socket buffers) would otherwise hold its place on the port for good, and a few of
/// them would keep the kubelet's probes waiting in the listen backlog. (A push's body that
/// stalls is bounded where it is read.)
struct Guarded {
    stream: tokio::net::TcpStream,
    send_timeout: Duration,
    /// Armed while a write is blocked.
    write_stall: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    fn wrote<T>(
        &mut self,
        result: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.write_stall = None;
            return result;
        }
        let timeout = self.send_timeout;
        let stall = self
            .write_stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stall.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the admin client read nothing of its answer",
            )));
        }
        result
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(result, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut all = self.peers.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = all.get_mut(&self.ip) {
            held.retain(|h| !Arc::ptr_eq(h, &self.held));
            if held.is_empty() {
                all.remove(&self.ip);
            }
        }
    }
}
