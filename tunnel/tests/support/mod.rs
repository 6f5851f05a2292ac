//! Fixtures of the tunnel's tests: an echo service, a connector pointed at a mock edge
//! and requests to the mock's eyeball listener. What other crates' tests share as well
//! (logs, waiting, connector options, clients) comes from `cftunnel_testkit`.
#![allow(dead_code, unused_imports, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::client::{connect_http1, Pooled};
pub use cftunnel_testkit::client::{pooled, pooled_h2c};
pub use cftunnel_testkit::connector::{options, token};
use cftunnel_testkit::edge::MockEdge;
pub use cftunnel_testkit::trace::trace_init;
pub use cftunnel_testkit::wait::wait_until;
use cftunnel_tunnel::{
    Body, Connector, ConnectorHandle, ConnectorOptions, EdgeRefusal, OnUpgrade, Protocol, Token,
    TunnelMetrics,
};
use futures_util::StreamExt as _;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper_util::rt::TokioIo;

pub type TestBody = UnsyncBoxBody<Bytes, cftunnel_tunnel::BoxError>;

pub const LIMIT: Duration = Duration::from_secs(30);

/// A refusal the connector retries at once.
pub fn retryable(cause: &str) -> EdgeRefusal {
    EdgeRefusal {
        cause: cause.into(),
        retry_after: Duration::ZERO,
        should_retry: true,
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<TestBody> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r
}

/// Echo service: `/hello`, `/echo` (streams the body back), `/download?n=`,
/// `/slow` (answers after 500 ms), `/late-body` (head at once, body 2 s later),
/// `/ended-body` (a body that says it has ended without a final poll), `/cut-body`
/// (a body whose producer panics after its first bytes), `/trailers`,
/// `/ws` (raw byte echo after 101), and `/uri/...` (the request's URI as the body).
pub async fn echo(mut req: Request<Body>) -> Result<Response<TestBody>, Infallible> {
    let path = req.uri().path().to_owned();
    if path.starts_with("/uri/") {
        return Ok(full(StatusCode::OK, req.uri().to_string()));
    }
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let resp = match path.as_str() {
        "/hello" => {
            let mut r = full(StatusCode::OK, "hello");
            r.headers_mut().insert("x-host", host.parse().unwrap());
            r.headers_mut()
                .insert("x-uri", req.uri().to_string().parse().unwrap());
            r.headers_mut()
                .insert("x-version", format!("{:?}", req.version()).parse().unwrap());
            r.headers_mut().append("set-cookie", "a=1".parse().unwrap());
            r.headers_mut().append("set-cookie", "b=2".parse().unwrap());
            r
        }
        "/echo" => {
            let len = req.headers().get(http::header::CONTENT_LENGTH).cloned();
            let mut r = Response::new(req.into_body().map_err(Into::into).boxed_unsync());
            if let Some(len) = len {
                r.headers_mut().insert(http::header::CONTENT_LENGTH, len);
            }
            r
        }
        "/download" => {
            let n: usize = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("n="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let chunks = (0..n.div_ceil(chunk.len())).map(move |i| {
                let len = (n - i * chunk.len()).min(chunk.len());
                Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(chunk.slice(..len)))
            });
            let stream = futures_util::stream::iter(chunks);
            Response::new(StreamBody::new(stream).boxed_unsync())
        }
        "/trailers" => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames = vec![
                Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::from_static(
                    b"data",
                ))),
                Ok(http_body::Frame::trailers(trailers)),
            ];
            let mut r =
                Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync());
            r.headers_mut()
                .insert("content-type", "application/grpc".parse().unwrap());
            r
        }
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(20)).await;
            full(StatusCode::OK, "late")
        }
        "/late-body" => {
            // The head at once, the body 2 s later.
            let late = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::from_static(
                    b"late",
                )))
            });
            Response::new(StreamBody::new(late).boxed_unsync())
        }
        "/ended-body" => Response::new(
            EndedBody {
                data: Some(Bytes::from_static(b"ended")),
            }
            .boxed_unsync(),
        ),
        "/cut-body" => {
            let frames = futures_util::stream::iter([0, 1]).map(|i| {
                if i == 1 {
                    panic!("the response body's producer failed");
                }
                Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::from_static(
                    b"partial",
                )))
            });
            Response::new(StreamBody::new(frames).boxed_unsync())
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            full(StatusCode::OK, "slow")
        }
        "/ws" => match req.extensions_mut().remove::<OnUpgrade>() {
            Some(on) => {
                tokio::spawn(async move {
                    if let Ok(mut up) = on.await {
                        let (mut r, mut w) = tokio::io::split(&mut up);
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    }
                });
                websocket_accepted()
            }
            None => full(StatusCode::BAD_REQUEST, "not an upgrade"),
        },
        _ => full(StatusCode::NOT_FOUND, "no route"),
    };
    Ok(resp)
}

pub fn start_connector(
    opts: ConnectorOptions,
    token: Token,
) -> (
    ConnectorHandle,
    TunnelMetrics,
    prometheus_client::registry::Registry,
) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    let connector = Connector::new(token, opts).expect("connector options are valid");
    let handle = connector
        .start(hyper::service::service_fn(echo), metrics.clone())
        .expect("connector starts");
    (handle, metrics, registry)
}

/// Starts a connector with `ha` connections of `protocol` to `edge` (test token, echo
/// service) and returns once the edge serves through all of them.
pub async fn serving_connector(edge: &MockEdge, protocol: Protocol, ha: usize) -> ConnectorHandle {
    let (handle, _metrics, _registry) = start_connector(options(edge, protocol, ha), token());
    handle.wait_registered(ha).await;
    edge.wait_serving(ha).await;
    handle
}

pub fn metrics_text(registry: &prometheus_client::registry::Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry).unwrap();
    s
}

pub type HttpClient = Pooled<TestBody>;

pub fn empty() -> TestBody {
    Full::new(Bytes::new())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// A bodiless GET of `path` on `app.example.com` through the listener at `addr`.
pub fn get_request(addr: SocketAddr, path: &str) -> Request<TestBody> {
    Request::get(format!("http://{addr}{path}"))
        .header("host", "app.example.com")
        .body(empty())
        .unwrap()
}

pub async fn get(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let req = get_request(addr, path);
    let resp = client.request(req).await.expect("request completes");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("body completes").to_bytes();
    (parts.status, parts.headers, bytes)
}

/// A WebSocket upgrade request for `path` over a fresh HTTP/1.1 connection to the mock;
/// returns the answer as it came.
pub async fn upgrade_request(addr: SocketAddr, path: &str) -> Response<hyper::body::Incoming> {
    let (mut sender, _conn) = connect_http1(addr).await.unwrap();
    let req = Request::get(path)
        .header("host", "app.example.com")
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .body(empty())
        .unwrap();
    sender.send_request(req).await.unwrap()
}

/// Raw HTTP/1.1 upgrade handshake against the mock, then returns the stream.
pub async fn websocket(addr: SocketAddr) -> (StatusCode, TokioIo<hyper::upgrade::Upgraded>) {
    let resp = upgrade_request(addr, "/ws").await;
    let status = resp.status();
    let up = hyper::upgrade::on(resp).await.expect("upgrade");
    (status, TokioIo::new(up))
}

/// Runs a test body, `async fn name(Protocol)`, once per transport, bounded by `LIMIT`.
/// The `protocol` label value metrics carry for a transport.
pub fn label(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Http2 => "http2",
        _ => "quic",
    }
}

macro_rules! per_transport {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quic() {
                tokio::time::timeout(LIMIT, super::$name(Protocol::Quic))
                    .await
                    .expect("test finished in time");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http2() {
                tokio::time::timeout(LIMIT, super::$name(Protocol::Http2))
                    .await
                    .expect("test finished in time");
            }
        }
    };
}

/// A body that reports its end through `is_end_stream` once its data is out, while a poll
/// past the data never completes: so does a backend's body of known length whose
/// connection task has not yet run to close it. Servers stop at `is_end_stream`.
struct EndedBody {
    data: Option<Bytes>,
}

impl http_body::Body for EndedBody {
    type Data = Bytes;
    type Error = cftunnel_tunnel::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.data.take() {
            Some(data) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => std::task::Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }
}

/// An origin's `101` accepting a WebSocket upgrade.
#[allow(dead_code)] // Not every test binary that includes this module answers upgrades.
pub fn websocket_accepted() -> Response<TestBody> {
    let mut r = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let headers = r.headers_mut();
    headers.insert("upgrade", http::HeaderValue::from_static("websocket"));
    headers.insert("connection", http::HeaderValue::from_static("Upgrade"));
    headers.insert(
        "sec-websocket-accept",
        http::HeaderValue::from_static("dGVzdA=="),
    );
    r
}
