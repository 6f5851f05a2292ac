//! Sending requests to backends: per-backend pooled clients, TLS, and the error kinds the
//! metrics and the error responses are built from.

mod connector;
mod h2c;
mod pool;
mod tls;

pub use connector::{ConnectError, ConnectErrorKind};
pub use pool::UpstreamBody;

use crate::body::{BoxError, ProxyBody};
use bytes::Bytes;
use cftunnel_config::BackendProtocol;
use connector::Connector;
use http::uri::{Authority, Scheme};
use http::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

/// How long a dial may take before the backend counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on idle connections kept per backend.
const POOL_MAX_IDLE: usize = 512;

/// Errors of one try against a backend; `label()` is the metrics reason.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot connect to backend: {0}")]
    Dial(#[source] ConnectError),
    #[error("TLS handshake with backend failed: {0}")]
    Tls(#[source] ConnectError),
    #[error("backend did not answer in time")]
    Timeout,
    /// The pooled connection closed before the request could be sent on it.
    #[error("backend connection closed before the request was sent")]
    Canceled,
    #[error("backend exchange failed: {0}")]
    Other(#[source] BoxError),
}

impl ForwardError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Dial(_) => "dial",
            Self::Tls(_) => "tls",
            Self::Timeout => "timeout",
            Self::Canceled => "canceled",
            Self::Other(_) => "other",
        }
    }

    /// Failures a retry may cure: the backend was unreachable, dropped the exchange, or did not
    /// answer within the per-try timeout. TLS failures are configuration and are not retried.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Dial(_) | Self::Timeout | Self::Canceled | Self::Other(_)
        )
    }

    fn from_client(err: hyper_util::client::legacy::Error) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(&err);
        while let Some(e) = source {
            if let Some(c) = e.downcast_ref::<ConnectError>() {
                let c = c.clone();
                return match c.kind {
                    ConnectErrorKind::Tls => Self::Tls(c),
                    ConnectErrorKind::Timeout | ConnectErrorKind::Dial => Self::Dial(c),
                };
            }
            if let Some(h) = e.downcast_ref::<hyper::Error>() {
                if h.is_canceled() {
                    return Self::Canceled;
                }
            }
            source = e.source();
        }
        Self::Other(err.into())
    }

    fn from_hyper(err: hyper::Error) -> Self {
        if err.is_canceled() {
            Self::Canceled
        } else {
            Self::Other(err.into())
        }
    }
}

/// One backend: a URL turned into a pooled client that always dials that backend.
#[derive(Debug)]
pub struct Upstream {
    /// Built on first use: a table may name thousands of backends that never see a request,
    /// and an idle client with its pool costs a few kilobytes.
    client: std::sync::OnceLock<Client<Connector, ProxyBody>>,
    /// Plain HTTP/1.1 backends (the common case in a cluster) use a leaner pool of their own.
    h1: Option<Arc<pool::H1Pool>>,
    /// h2c backends: one multiplexed connection that each request's own host travels over.
    h2c: Option<h2c::H2cChannel>,
    connector: Connector,
    scheme: Scheme,
    /// The backend's own `host:port`, used when the request carries no usable host.
    authority: Authority,
    /// Path of the backend URL (`https://api.example.com/base`), prepended to request paths.
    base_path: Option<Box<str>>,
    h2: bool,
}

/// What identifies an upstream across config pushes, so connection pools survive reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamKey(String);

/// Why a backend URL or TLS setting was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid URL: {0}")]
    Url(String),
    #[error("unsupported scheme {0:?} (want http or https)")]
    Scheme(String),
    #[error("tls: {0}")]
    Tls(String),
}

impl Upstream {
    pub fn key(
        url: &str,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&cftunnel_config::BackendTls>,
    ) -> UpstreamKey {
        UpstreamKey(format!("{url}|{protocol:?}|{websocket}|{tls:?}"))
    }

    /// Builds the client for a backend URL; fails on anything that could only fail later.
    pub fn new(
        url: &str,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&cftunnel_config::BackendTls>,
    ) -> Result<Self, UpstreamError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| UpstreamError::Url(e.to_string()))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| UpstreamError::Url("missing scheme".into()))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| UpstreamError::Url("missing host".into()))?;
        if authority.as_str().contains('@') {
            return Err(UpstreamError::Url("user info is not allowed".into()));
        }
        let secure = match scheme.as_str() {
            "http" => false,
            "https" => true,
            other => return Err(UpstreamError::Scheme(other.to_owned())),
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(UpstreamError::Url("missing host".into()));
        }
        let port = authority
            .port_u16()
            .unwrap_or(if secure { 443 } else { 80 });
        let tls = if secure {
            let alpn_h2 = !websocket || protocol == BackendProtocol::H2c;
            Some(tls::target(host, tls, alpn_h2)?)
        } else if tls.is_some() {
            return Err(UpstreamError::Tls("tls settings need an https URL".into()));
        } else {
            None
        };
        let h2 = protocol == BackendProtocol::H2c && !secure;
        let connector = Connector::new(host, port, tls, CONNECT_TIMEOUT);
        let base_path = match uri.path() {
            "" | "/" => None,
            p => Some(p.trim_end_matches('/').into()),
        };
        let h1 = (!secure && !h2)
            .then(|| pool::H1Pool::new(connector.clone(), POOL_MAX_IDLE, POOL_IDLE_TIMEOUT));
        let h2c = h2.then(|| h2c::H2cChannel::new(connector.clone()));
        Ok(Self {
            client: std::sync::OnceLock::new(),
            h1,
            h2c,
            connector,
            scheme,
            authority,
            base_path,
            h2,
        })
    }

    fn client(&self) -> &Client<Connector, ProxyBody> {
        self.client.get_or_init(|| {
            let mut builder = Client::builder(TokioExecutor::new());
            builder
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(POOL_MAX_IDLE)
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .set_host(false)
                .http2_only(self.h2);
            builder.build(self.connector.clone())
        })
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn base_path(&self) -> Option<&str> {
        self.base_path.as_deref()
    }

    pub fn is_h2(&self) -> bool {
        self.h2
    }

    /// Whether requests to this backend carry an origin-form target (`/path?query`) rather
    /// than an absolute URI.
    pub fn origin_form(&self) -> bool {
        self.h1.is_some()
    }

    /// Whether a request's URI authority may be its own host (the `:authority` an HTTP/2
    /// backend reads) rather than the backend's: the connection is chosen without it.
    pub fn request_authority(&self) -> bool {
        self.h2c.is_some()
    }

    /// One try: sends the request and waits for the response head, bounded by `timeout`.
    ///
    /// With `body_sent`, the timeout starts once the request body has been handed over (the
    /// channel closes when the client drops the body), so a long upload is not cut short: the
    /// timeout bounds the backend's think time, as Go's `ResponseHeaderTimeout` does.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        timeout: Option<Duration>,
        body_sent: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let fut = async {
            match (&self.h1, &self.h2c) {
                (Some(pool), _) => pool.send(req).await,
                (None, Some(channel)) => channel.send(req).await,
                (None, None) => self
                    .client()
                    .request(req)
                    .await
                    .map(|resp| resp.map(UpstreamBody::unpooled))
                    .map_err(ForwardError::from_client),
            }
        };
        tokio::pin!(fut);
        if let (Some(sent), Some(_)) = (body_sent, timeout) {
            tokio::select! {
                res = &mut fut => return res,
                _ = sent => {}
            }
        }
        match timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ForwardError::Timeout)?,
            None => fut.await,
        }
    }
}

/// An empty request body for mirrors and retries of body-less requests.
pub fn empty_body() -> ProxyBody {
    crate::body::full(Bytes::new())
}
