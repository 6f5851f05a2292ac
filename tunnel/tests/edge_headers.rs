//! Connection-specific headers stay on their own hop through the mock edge, as
//! through Cloudflare's: the eyeball's never reach the connector, the origin's
//! never reach the eyeball, over both transports and real sockets.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::client::connect_http1;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::{Body, ConnectorHandle, Protocol};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `/headers` answers with the request's headers, a `name: value` line each;
/// `/close` answers 200 with an origin's `Connection: close` and `Keep-Alive`;
/// the rest as the shared echo service.
async fn service(req: Request<Body>) -> Result<Response<TestBody>, Infallible> {
    let text = match req.uri().path() {
        "/headers" => req
            .headers()
            .iter()
            .map(|(n, v)| format!("{n}: {}\n", String::from_utf8_lossy(v.as_bytes())))
            .collect::<String>(),
        "/close" => {
            let mut r = Response::new(
                Full::new(Bytes::from_static(b"closing"))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            );
            r.headers_mut()
                .insert("connection", "close".parse().unwrap());
            r.headers_mut()
                .insert("keep-alive", "timeout=1".parse().unwrap());
            return Ok(r);
        }
        _ => return echo(req).await,
    };
    let mut r = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    r.headers_mut()
        .insert("server", "origin/1.0".parse().unwrap());
    Ok(r)
}

async fn serving(edge: &MockEdge, protocol: Protocol) -> ConnectorHandle {
    serving_with(edge, options(edge, protocol, 1)).await
}

/// [`serving`] with `opts`.
async fn serving_with(edge: &MockEdge, opts: cftunnel_tunnel::ConnectorOptions) -> ConnectorHandle {
    let connector =
        cftunnel_tunnel::Connector::new(token(), opts).expect("connector options are valid");
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
    let handle = connector
        .start(hyper::service::service_fn(service), metrics)
        .expect("connector starts");
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    handle
}

/// One HTTP/1.1 eyeball connection to the mock's listener.
async fn eyeball(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<TestBody> {
    connect_http1(addr).await.unwrap().0
}

/// An eyeball request carrying connection-specific headers of every kind. Its
/// second `Connection` line names `Cf-Connecting-Ip`, which the edge sets
/// itself: the edge's value still reaches the service.
fn with_hop_headers(req: http::request::Builder) -> http::request::Builder {
    req.header("host", "app.example.com")
        .header("connection", "keep-alive, X-Hop")
        .header("connection", "Cf-Connecting-Ip")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "x")
        .header("te", "trailers")
        .header("x-app", "kept")
}

async fn eyeball_hop_headers_stop_at_the_edge(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let mut sender = eyeball(edge.http_addr()).await;

    let req = with_hop_headers(Request::get("/headers"))
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The edge answers as itself, with the ray id the service saw.
    assert_eq!(resp.headers()["server"], "cloudflare");
    let ray = resp.headers()["cf-ray"].to_str().unwrap().to_owned();
    let seen = resp.into_body().collect().await.unwrap().to_bytes();
    let seen = String::from_utf8(seen.to_vec()).unwrap();
    assert!(
        seen.lines().any(|l| l == format!("cf-ray: {ray}")),
        "{ray}:\n{seen}"
    );
    let names: Vec<&str> = seen.lines().filter_map(|l| l.split(": ").next()).collect();
    for hop in ["connection", "keep-alive", "proxy-connection", "x-hop"] {
        assert!(
            !names.contains(&hop),
            "{hop} reached the service ({}):\n{seen}",
            label(protocol)
        );
    }
    assert!(
        seen.lines().any(|l| l == "te: trailers"),
        "TE: trailers lost ({}):\n{seen}",
        label(protocol)
    );
    assert!(seen.lines().any(|l| l == "x-app: kept"), "{seen}");
    assert!(
        seen.lines().any(|l| l == "cf-connecting-ip: 127.0.0.1"),
        "{seen}"
    );

    // A chunked upload with the same headers still streams its body to the
    // service (over QUIC the connector reads it because `Transfer-Encoding` stays).
    sender.ready().await.unwrap();
    let chunks = futures_util::stream::iter(["first ", "second"].map(|c| {
        Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::from_static(c.as_bytes())))
    }));
    let req = with_hop_headers(Request::post("/echo"))
        .body(StreamBody::new(chunks).boxed_unsync())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"first second", "{}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn origin_hop_headers_stop_at_the_edge(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let mut sender = eyeball(edge.http_addr()).await;
    // The origin's `Connection: close` is about its own connection: the eyeball's
    // keep-alive connection to the edge serves a second request.
    for round in 0..2 {
        sender.ready().await.unwrap_or_else(|e| {
            panic!(
                "eyeball connection closed before request {round} ({}): {e}",
                label(protocol)
            )
        });
        let req = Request::get("/close")
            .header("host", "app.example.com")
            .body(empty())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        for hop in ["connection", "keep-alive"] {
            assert!(
                !resp.headers().contains_key(hop),
                "{hop} reached the eyeball ({}): {:?}",
                label(protocol),
                resp.headers()
            );
        }
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"closing");
    }
    handle.shutdown().await;
    edge.shutdown().await;
}

/// The switched WebSocket answer keeps the `Connection` and `Upgrade` the eyeball's
/// handshake needs, and the stream then carries bytes both ways.
async fn websocket_upgrades_keep_their_headers(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let resp = upgrade_request(edge.http_addr(), "/ws").await;
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()["upgrade"], "websocket");
    assert!(
        resp.headers()["connection"]
            .to_str()
            .unwrap()
            .eq_ignore_ascii_case("upgrade"),
        "{:?}",
        resp.headers()
    );
    let mut ws = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    ws.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    ws.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    handle.shutdown().await;
    edge.shutdown().await;
}

/// The edge limits a request head by size (a 16 KB URL, 32 KB of headers, 16 KB each), not
/// by line count: 500 short headers reach the service, larger heads are refused at the edge.
async fn heads_are_limited_by_size_not_line_count(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let mut sender = eyeball(edge.http_addr()).await;

    let mut req = Request::get("/headers").header("host", "app.example.com");
    for i in 0..500 {
        req = req.header(format!("x-h{i}"), "v");
    }
    let resp = sender
        .send_request(req.body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    let seen = resp.into_body().collect().await.unwrap().to_bytes();
    let seen = String::from_utf8(seen.to_vec()).unwrap();
    let count = seen.lines().filter(|l| l.starts_with("x-h")).count();
    assert_eq!(count, 500, "{}", label(protocol));
    assert!(seen.lines().any(|l| l == "x-h499: v"), "{seen}");

    let refused = [
        (
            "/headers".to_owned(),
            vec![("x-big".to_owned(), "a".repeat(16 * 1024))],
        ),
        (
            "/headers".to_owned(),
            (0..5)
                .map(|i| (format!("x-b{i}"), "a".repeat(7 * 1024)))
                .collect(),
        ),
        (format!("/{}", "p".repeat(16 * 1024)), vec![]),
    ];
    for (path, headers) in refused {
        sender.ready().await.unwrap();
        let mut req = Request::get(path.as_str()).header("host", "app.example.com");
        for (n, v) in &headers {
            req = req.header(n.as_str(), v.as_str());
        }
        let resp = sender
            .send_request(req.body(empty()).unwrap())
            .await
            .unwrap();
        let want = if headers.is_empty() {
            StatusCode::URI_TOO_LONG
        } else {
            StatusCode::BAD_REQUEST
        };
        assert_eq!(resp.status(), want, "{} {}", label(protocol), path.len());
    }
    // Just under the limits still goes through.
    sender.ready().await.unwrap();
    let req = Request::get(format!("/headers?{}", "q".repeat(15 * 1024)).as_str())
        .header("host", "app.example.com")
        .header("x-big", "a".repeat(15 * 1024))
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(eyeball_hop_headers_stop_at_the_edge);
per_transport!(origin_hop_headers_stop_at_the_edge);
per_transport!(websocket_upgrades_keep_their_headers);
per_transport!(heads_are_limited_by_size_not_line_count);

/// Cookies an HTTP/2 eyeball split over several fields reach the service as one `Cookie`,
/// joined with "; ", over either transport.
async fn split_cookies_reach_the_service_joined(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let req = Request::get("https://app.example.com/headers")
        .header("host", "app.example.com")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = edge.request(req).await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let cookies: Vec<&str> = text.lines().filter(|l| l.starts_with("cookie:")).collect();
    assert_eq!(cookies, ["cookie: a=1; b=2"], "{}: {text}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}
per_transport!(split_cookies_reach_the_service_joined);

/// With the stream bound at one request (`quic_max_streams: 1`), a connection still carries
/// requests over either transport: over HTTP/2 the edge's control stream, which it opens, is
/// not one of them.
async fn a_bound_of_one_stream_still_carries_requests(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let mut opts = options(&edge, protocol, 1);
    opts.quic_max_streams = 1;
    let handle = serving_with(&edge, opts).await;
    for _ in 0..3 {
        let req = Request::get("https://app.example.com/headers")
            .header("host", "app.example.com")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = tokio::time::timeout(std::time::Duration::from_secs(10), edge.request(req))
            .await
            .unwrap_or_else(|_| panic!("{}: the request is carried", label(protocol)));
        assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    }
    handle.shutdown().await;
    edge.shutdown().await;
}
per_transport!(a_bound_of_one_stream_still_carries_requests);
