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

pub use connector::{ConnectError, ConnectErrorKind};
pub use error::ForwardError;
pub use h2::KeepAlive;
pub use payload::empty_body;
pub use pool::UpstreamBody;
pub use tls::UpstreamError;

use crate::body::ProxyBody;
use bytes::Bytes;
use cftunnel_config::{valid, BackendProtocol};
use connector::Connector;
use futures_util::future::{Either, FutureExt};
use http::uri::Authority;
use http::{Request, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long a dial may take before the backend counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on idle connections kept per backend.
const POOL_MAX_IDLE: usize = 512;
/// Default bound on HTTP/1.1 connections open at once to one backend.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How the proxy speaks to every backend; set once for the process.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// HTTP/1.1 connections open at once to one backend; requests beyond wait for one.
    pub max_connections: usize,
    /// Largest header block an HTTP/2 backend may answer with (a response head, or its
    /// trailers): the listener's bound on a request head, so that the gRPC metadata a client
    /// may send is not refused on its way back. A larger one fails its request (as the
    /// backend's error), and one far larger the whole connection.
    pub max_header_bytes: usize,
    /// When connections to HTTP/2 backends are pinged.
    pub keep_alive: KeepAlive,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: crate::headers::DEFAULT_MAX_HEADER_BYTES,
            keep_alive: KeepAlive::default(),
        }
    }
}

impl BackendOptions {
    fn http2(&self) -> h2::Settings {
        h2::Settings {
            keep_alive: self.keep_alive,
            max_header_list_size: u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX),
        }
    }
}

/// What a try's request body is, as [`Upstream::send`] needs to know it.
#[derive(Debug)]
pub enum TryBody {
    /// The whole body, held (empty: none): the request can be written again, once, when a
    /// reused connection closes under it before any answer (idempotent methods only).
    Held(Bytes),
    /// A body streamed from the client, written once. The receiver closes once it has been
    /// sent, which is when the try's timeout starts.
    Streamed(tokio::sync::oneshot::Receiver<()>),
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
    /// Whether the backend is spoken to over HTTP/2 (`h2c`, or over TLS), as gRPC is.
    http2: bool,
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
    /// h2c backends: one multiplexed connection that each request's own host travels over.
    H2c(Box<h2::H2Channel>),
}

impl Upstream {
    /// Builds the client for a checked target, speaking to it as `options` say; with
    /// `public_only`, every dial connects only to public addresses of the URL's host.
    pub fn new(target: &valid::Target, options: &BackendOptions) -> Result<Self, UpstreamError> {
        let (host, port) = (&*target.host, target.port);
        let secure = target.tls.is_some();
        let protocol = target.protocol;
        let public_only = target.public_only;
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
                public_only,
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
            Client::H2c(Box::new(h2::H2Channel::new(
                connector,
                scheme,
                authority.clone(),
                options.http2(),
            )))
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
            // A TLS backend offered HTTP/2 speaks it when it picks it, as a gRPC server does.
            http2: protocol == BackendProtocol::H2c || alpn_h2,
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

    /// Whether the backend is spoken to over HTTP/2, as a gRPC backend is.
    pub fn http2(&self) -> bool {
        self.http2
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

    /// One try: sends the request and waits for the response head, bounded by `timeout`.
    /// With the head comes the instant that timeout ends, for a caller that bounds the
    /// response body by it too.
    ///
    /// With a streamed `body`, the timeout starts once the request body has been handed over
    /// (the channel closes when the client drops the body), so a long upload is not cut short:
    /// the timeout bounds the backend's think time, as Go's `ResponseHeaderTimeout` does. A
    /// head that arrives before the body has been sent keeps the timeout counted from the
    /// start. A held body lets an idempotent request be written once more when the reused
    /// HTTP/1.1 connection it went out on closes before answering.
    ///
    /// A request that finds the backend at its connection limit waits for a connection within
    /// the timeout counted from the start, then fails with [`ForwardError::Saturated`].
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        timeout: Option<Duration>,
        body: TryBody,
    ) -> Result<(Response<UpstreamBody>, Option<Instant>), ForwardError> {
        let start_deadline = timeout.map(|t| Instant::now() + t);
        let wait = pool::Wait::until(start_deadline);
        let (held, body_sent) = match body {
            TryBody::Held(bytes) => (Some(bytes), None),
            TryBody::Streamed(sent) => (None, Some(sent)),
        };
        // The client's own future, not a block around it that would carry `req` once more.
        let fut = match &self.client {
            Client::Http1(pool) => Either::Left(pool.send(req, &wait, held.as_ref())),
            Client::H2c(channel) => Either::Right(channel.send(req).map(|sent| {
                sent.map(|(r, stream)| r.map(|body| UpstreamBody::on_stream(body, stream)))
            })),
        };
        tokio::pin!(fut);
        let (Some(timeout), Some(mut deadline)) = (timeout, start_deadline) else {
            return fut.await.map(|resp| (resp, None));
        };
        if let Some(sent) = body_sent {
            tokio::select! {
                res = &mut fut => return res.map(|resp| (resp, Some(deadline))),
                _ = sent => deadline = Instant::now() + timeout,
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
