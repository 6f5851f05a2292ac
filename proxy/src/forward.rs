//! Sending requests to backends: per-backend pooled clients and TLS ([`Upstream`]), the
//! tries a request gets ([`retry`]) with the body they replay ([`payload`]), mirror copies
//! ([`mirror`]), and the error kinds the metrics and the error responses are built from.
//!
//! Nothing here knows routes or rules: the handler passes in what a rule decides (timeouts,
//! retry policy, another endpoint to retry on).

mod budget;
mod connector;
mod error;
mod h2;
pub mod mirror;
pub mod payload;
mod pool;
pub mod request;
pub mod retry;
mod tls;
mod wait;

pub use connector::{ConnectError, ConnectErrorKind};
pub use error::ForwardError;
pub use h2::KeepAlive;
pub use payload::empty_body;
pub use pool::UpstreamBody;
pub use tls::UpstreamError;

use crate::body::{ProxyBody, QuietState};
use bytes::Bytes;
use cftunnel_config::address::ClusterRanges;
use cftunnel_config::{valid, BackendProtocol};
use connector::Connector;
use futures_util::future::{Either, FutureExt};
use http::uri::Authority;
use http::{Request, Response};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use wait::Wait;

/// How long a dial may take before the backend counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on idle connections kept per backend.
const POOL_MAX_IDLE: usize = 512;
/// Default bound on connections open at once to one backend.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How the proxy speaks to every backend; set once for the process.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Connections open at once to one backend, HTTP/1.1 and HTTP/2 alike; requests beyond
    /// wait for one (or, over HTTP/2, for a share of one).
    pub max_connections: usize,
    /// Largest header block an HTTP/2 backend may answer with (a response head, or its
    /// trailers): the listener's bound on a request head, so that the gRPC metadata a client
    /// may send is not refused on its way back. A larger one fails its request (as the
    /// backend's error), and one far larger the whole connection.
    pub max_header_bytes: usize,
    /// When connections to HTTP/2 backends are pinged.
    pub keep_alive: KeepAlive,
    /// The cluster's own ranges, which `publicOnly` backends are not dialled at either.
    pub cluster_ranges: ClusterRanges,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: crate::headers::DEFAULT_MAX_HEADER_BYTES,
            keep_alive: KeepAlive::default(),
            cluster_ranges: ClusterRanges::default(),
        }
    }
}

impl BackendOptions {
    fn http2(&self) -> h2::Settings {
        h2::Settings {
            keep_alive: self.keep_alive,
            max_header_list_size: u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX),
            idle_timeout: POOL_IDLE_TIMEOUT,
        }
    }
}

/// What a try's request body is, as [`Upstream::send`] needs to know it.
#[derive(Debug)]
pub enum TryBody {
    /// The whole body, held (empty: none): the request can be written again, once, when a
    /// reused connection closes under it before any answer (idempotent methods only), or
    /// when an HTTP/2 backend did not process it (any method). Either is part of the same
    /// try, for a retry policy's count and budget.
    Held(Bytes),
    /// A body streamed from the client, written once.
    Streamed {
        /// Closes once the body has been sent, which is when the try's timeout starts.
        sent: crate::body::Sent,
        /// A gRPC call's stall bound on the body, lifted if the try goes over HTTP/2.
        lift: Option<Arc<QuietState>>,
    },
}

/// What bounds one try: the wait for its response head, or its whole exchange when the rule
/// sets a backend timeout (`None`: nothing). A gRPC call's bound differs by protocol: over
/// HTTP/2 its own deadline holds, over HTTP/1.1 the proxy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TryBounds {
    /// Over HTTP/1.1.
    pub http1: Option<Duration>,
    /// Over HTTP/2.
    pub http2: Option<Duration>,
}

impl TryBounds {
    /// The same bound whatever the protocol.
    pub fn same(bound: Option<Duration>) -> Self {
        Self {
            http1: bound,
            http2: bound,
        }
    }
}

/// One backend: a URL turned into a pooled client that always dials that backend.
#[derive(Debug)]
pub struct Upstream {
    client: Client,
    /// The backend's own `host:port`, used when the request carries no usable host.
    authority: Authority,
    /// Path of the backend URL (`https://api.example.com/base`), prepended to request paths.
    base_path: Option<Box<str>>,
    /// Query of the backend URL, merged into every request's.
    base_query: Option<Box<str>>,
    name: BackendName,
    /// Whether the config marks the backend `h2c` (HTTP/2 with prior knowledge, or offered
    /// over TLS), as it marks gRPC backends.
    h2c: bool,
    /// The retries its requests may take, kept with the client across pushes.
    pub(crate) retry_budget: budget::RetryBudget,
}

/// A backend as the access log and spans name it, made once per push so a request only
/// copies pointers.
#[derive(Debug, Clone)]
pub struct BackendName {
    /// The URL as the config wrote it.
    pub url: Arc<str>,
    /// The host dialed (an IPv6 literal without brackets).
    pub host: Arc<str>,
    pub port: u16,
    /// `scheme://host:port`: a request's `url.full` is this and its path.
    pub origin: Arc<str>,
}

/// How requests reach one backend.
#[derive(Debug)]
enum Client {
    /// HTTP/1.1 and TLS backends (a TLS one may pick HTTP/2 through ALPN).
    Http1(Arc<pool::H1Pool>),
    /// h2c backends: one multiplexed connection that each request's own host travels over;
    /// for one that takes WebSockets, HTTP/1.1 connections for the upgrades, which HTTP/2
    /// cannot carry (a server such as Go's `h2c.NewHandler` speaks both on one port).
    H2c(Box<h2::H2Channel>, Option<Arc<pool::H1Pool>>),
}

impl Upstream {
    /// Builds the client for a checked target, speaking to it as `options` say; with
    /// `public_only`, every dial connects only to public addresses of the URL's host outside
    /// the cluster's ranges.
    pub fn new(target: &valid::Target, options: &BackendOptions) -> Result<Self, UpstreamError> {
        let (host, port) = (&*target.host, target.port);
        let secure = target.tls.is_some();
        let protocol = target.protocol;
        let public_only = target.public_only.then(|| options.cluster_ranges.clone());
        let scheme = target.scheme.clone();
        let authority = target.authority.clone();
        // A WebSocket needs HTTP/1.1's upgrade, so its TLS handshake offers only that.
        let alpn_h2 = secure && (!target.websocket || protocol == BackendProtocol::H2c);
        let tls = target
            .tls
            .as_ref()
            .map(|tls| tls::target(tls, alpn_h2))
            .transpose()?;
        let h2 = protocol == BackendProtocol::H2c && !secure;
        // HTTP/2 cannot carry an upgrade: where the backend may pick it, upgrades dial
        // connections that offer HTTP/1.1 only.
        let upgrades = tls.as_ref().filter(|_| alpn_h2).map(|t| {
            Connector::new(
                host,
                port,
                Some(t.http1_only()),
                CONNECT_TIMEOUT,
                public_only.clone(),
            )
        });
        // An h2c backend's connections, HTTP/2 and HTTP/1.1 for upgrades, count against one
        // limit.
        let h2c_permits = Arc::new(tokio::sync::Semaphore::new(
            options
                .max_connections
                .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        ));
        let h2c_upgrades = (h2 && target.websocket).then(|| {
            let connector = Connector::new(host, port, None, CONNECT_TIMEOUT, public_only.clone());
            pool::H1Pool::sharing(
                connector,
                POOL_MAX_IDLE,
                POOL_IDLE_TIMEOUT,
                Arc::clone(&h2c_permits),
                None,
            )
        });
        let connector = Connector::new(host, port, tls, CONNECT_TIMEOUT, public_only);
        let base_path = target.base_path.clone();
        let base_query = target.base_query.clone();
        let name = BackendName {
            url: Arc::from(&*target.url),
            host: Arc::from(host),
            port,
            origin: Arc::from(format!("{}://{}", target.scheme, target.authority)),
        };
        let client = if h2 {
            let channel = h2::H2Channel::new(
                connector,
                scheme,
                authority.clone(),
                options.http2(),
                h2c_permits,
            );
            if let Some(upgrades) = &h2c_upgrades {
                channel.share_limit_with(upgrades.idle_handle());
            }
            Client::H2c(Box::new(channel), h2c_upgrades)
        } else {
            let alpn_h2 = upgrades.map(|upgrades| pool::Alpn {
                scheme,
                fallback: authority.clone(),
                upgrades,
                settings: options.http2(),
            });
            let pool = pool::H1Pool::new(
                connector,
                POOL_MAX_IDLE,
                POOL_IDLE_TIMEOUT,
                options.max_connections,
                alpn_h2,
            );
            Client::Http1(pool)
        };
        Ok(Self {
            client,
            authority,
            base_path,
            base_query,
            name,
            h2c: protocol == BackendProtocol::H2c,
            retry_budget: budget::RetryBudget::new(),
        })
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// How logs and spans name this backend.
    pub fn name(&self) -> &BackendName {
        &self.name
    }

    pub fn base_path(&self) -> Option<&str> {
        self.base_path.as_deref()
    }

    /// Whether every request to the backend goes over HTTP/2: an `h2c` backend without TLS.
    /// A TLS backend offered `h2` speaks it only on the connections where it picked it, which
    /// each try finds out for itself.
    pub fn always_http2(&self) -> bool {
        matches!(self.client, Client::H2c(..))
    }

    /// Whether the config marks the backend `h2c`: the controller does for GRPCRoute backends
    /// and for Services whose port has `appProtocol: kubernetes.io/h2c`, which is how gRPC is
    /// served through an HTTPRoute. A TLS backend that merely picks HTTP/2 by ALPN is not.
    pub fn h2c(&self) -> bool {
        self.h2c
    }

    pub fn base_query(&self) -> Option<&str> {
        self.base_query.as_deref()
    }

    /// One try: sends the request and waits for the response head, bounded by `bounds`.
    /// With the head comes the instant that bound ends, for a caller that bounds the
    /// response body by it too.
    ///
    /// With a streamed `body`, the timeout starts once the request body has been handed over
    /// (the channel closes when the client drops the body), so a long upload is not cut short:
    /// the timeout bounds the backend's think time, as Go's `ResponseHeaderTimeout` does. A
    /// backend whose connection stops taking the body for as long fails the try all the same
    /// ([`ForwardError::Timeout`]), however patient the client. A
    /// head that arrives before the body has been sent keeps the timeout counted from the
    /// start. A held body lets an idempotent request be written once more when the reused
    /// HTTP/1.1 connection it went out on closes before answering.
    ///
    /// The bound of the protocol the try goes over holds: `bounds.http2` for an `h2c` backend,
    /// `bounds.http1` for an HTTP/1.1 one, and for a TLS backend offered `h2` the HTTP/1.1
    /// bound until the try goes out on a connection where the backend picked `h2`.
    ///
    /// A request that finds the backend at its connection limit waits for a connection (or a
    /// share of one) within the bound counted from the start, then fails with
    /// [`ForwardError::Saturated`].
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        bounds: TryBounds,
        body: TryBody,
    ) -> Result<(Response<UpstreamBody>, Option<Instant>), ForwardError> {
        let (held, body_sent, lift) = match body {
            TryBody::Held(bytes) => (Some(bytes), None, None),
            TryBody::Streamed { sent, lift } => (None, Some(sent), lift),
        };
        // The HTTP/2 bound of a try whose protocol its connection decides, where it differs.
        let (timeout, then_http2) = match &self.client {
            Client::H2c(..) => (bounds.http2, None),
            Client::Http1(pool) if pool.offers_h2() && bounds.http2 != bounds.http1 => {
                (bounds.http1, Some(bounds.http2))
            }
            Client::Http1(_) => (bounds.http1, None),
        };
        let start_deadline = timeout.map(|t| Instant::now() + t);
        let http2_deadline = then_http2.map_or(start_deadline, |t| t.map(|t| Instant::now() + t));
        let wait = Wait::new(start_deadline, http2_deadline, lift);
        // The client's own future, not a block around it that would carry `req` once more.
        let fut = match &self.client {
            Client::Http1(pool) => Either::Left(pool.send(req, &wait, held.as_ref())),
            Client::H2c(_, Some(pool)) if req.headers().contains_key(http::header::UPGRADE) => {
                Either::Left(pool.send(req, &wait, held.as_ref()))
            }
            Client::H2c(channel, _) => {
                Either::Right(channel.send(req, &wait, held.as_ref()).map(|sent| {
                    sent.map(|(r, stream)| r.map(|body| UpstreamBody::on_stream(body, stream)))
                }))
            }
        };
        tokio::pin!(fut);
        if let Some(http2) = then_http2 {
            // Boxed: gRPC calls to TLS backends only.
            return Box::pin(bounded_by_protocol(fut, &wait, timeout, http2, body_sent)).await;
        }
        let (Some(timeout), Some(mut deadline)) = (timeout, start_deadline) else {
            return fut.await.map(|resp| (resp, None));
        };
        if let Some(mut sent) = body_sent {
            let by = deadline;
            tokio::select! {
                res = &mut fut => return res.map(|resp| (resp, Some(deadline))),
                // `Err`: the backend's connection took part of the body and then nothing for
                // the timeout (waiting for the rest would hold the request, its client and the
                // connection for as long as the client keeps its upload open), or the try had
                // no connection to send it on by its deadline.
                sent = sent.closed_within(|| Some(timeout), move || Some(by)) => match sent {
                    Ok(()) => deadline = Instant::now() + timeout,
                    Err(_) if wait.is_waiting() => return Err(ForwardError::Saturated),
                    Err(_) => return Err(ForwardError::Timeout),
                },
            }
        }
        match tokio::time::timeout_at(deadline, fut).await {
            Ok(res) => res.map(|resp| (resp, Some(deadline))),
            // Cut off while still waiting for a connection: the backend never saw it.
            Err(_) if wait.is_waiting() => Err(ForwardError::Saturated),
            Err(_) => Err(ForwardError::Timeout),
        }
    }
}

/// [`Upstream::send`]'s bound on a try whose protocol its connection decides, with bounds that
/// differ by protocol (a gRPC call to a TLS backend offered `h2`): `http1` until the try goes
/// out over HTTP/2, `http2` from then on, counted from the start or, for a streamed body, from
/// once it has been sent. A try that goes over HTTP/2 only after its `http2` bound has ended
/// is cut off when its `http1` one does.
async fn bounded_by_protocol<F>(
    mut fut: Pin<&mut F>,
    wait: &Wait,
    http1: Option<Duration>,
    http2: Option<Duration>,
    body_sent: Option<crate::body::Sent>,
) -> Result<(Response<UpstreamBody>, Option<Instant>), ForwardError>
where
    F: Future<Output = Result<Response<UpstreamBody>, ForwardError>>,
{
    let mut from = Instant::now();
    if let Some(mut sent) = body_sent {
        // A backend that stops taking the body gets the bound of the protocol the try goes
        // over, as one that is slow to answer does.
        let limit = || if wait.went_over_http2() { http2 } else { http1 };
        // Until the body is first asked for, the bound of the protocol the try goes over,
        // from its start.
        let start = from;
        let unasked_until = || limit().map(|t| start + t);
        tokio::select! {
            res = fut.as_mut() => return res.map(|resp| (resp, None)),
            sent = sent.closed_within(limit, unasked_until) => match sent {
                Ok(()) => from = Instant::now(),
                Err(_) if wait.is_waiting() => return Err(ForwardError::Saturated),
                Err(_) => return Err(ForwardError::Timeout),
            },
        }
    }
    loop {
        let over_http2 = wait.went_over_http2();
        let end = if over_http2 { http2 } else { http1 }.map(|t| from + t);
        let now = Instant::now();
        if end.is_some_and(|end| end <= now) {
            // Cut off while still waiting for a connection: the backend never saw it.
            return Err(if wait.is_waiting() {
                ForwardError::Saturated
            } else {
                ForwardError::Timeout
            });
        }
        // Not yet over HTTP/2, the try is looked at again when its HTTP/2 bound ends first.
        let look = match http2.map(|t| from + t) {
            Some(at) if !over_http2 && at > now && end.is_none_or(|end| at < end) => Some(at),
            _ => end,
        };
        let Some(look) = look else {
            return fut.await.map(|resp| (resp, None));
        };
        if let Ok(res) = tokio::time::timeout_at(look, fut.as_mut()).await {
            return res.map(|resp| (resp, end));
        }
    }
}
