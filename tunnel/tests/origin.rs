//! What a service behind the connector is given and what the edge gets back,
//! over real QUIC and TLS/TCP sockets on 127.0.0.1, compared with what
//! `cloudflared` does towards its origins and the edge.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::{Body, Connector, ConnectorHandle, Protocol, TunnelMetrics};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody};
use tokio::time::Instant;

/// How long the test service takes to answer `/late-answer`.
const ANSWER_AFTER: Duration = Duration::from_millis(400);

/// `/headers`: the request's headers as `name: value` lines. `/switch`: a `101`
/// on a plain request. `/late-answer`: drops the request body unread at once and
/// answers [`ANSWER_AFTER`] later.
async fn service(req: Request<Body>) -> Result<Response<TestBody>, Infallible> {
    let body = |status: StatusCode, text: String| {
        let mut r = Response::new(
            Full::new(Bytes::from(text))
                .map_err(|e| match e {})
                .boxed_unsync(),
        );
        *r.status_mut() = status;
        r
    };
    Ok(match req.uri().path() {
        "/headers" => {
            let mut lines = String::new();
            for (name, value) in req.headers() {
                lines.push_str(&format!("{name}: {}\n", value.to_str().unwrap()));
            }
            body(StatusCode::OK, lines)
        }
        "/switch" => body(StatusCode::SWITCHING_PROTOCOLS, "switched".into()),
        "/late-answer" => {
            drop(req);
            tokio::time::sleep(ANSWER_AFTER).await;
            body(StatusCode::OK, "answered".into())
        }
        _ => body(StatusCode::NOT_FOUND, String::new()),
    })
}

async fn serving(edge: &MockEdge, protocol: Protocol) -> ConnectorHandle {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    let handle = Connector::new(token(), options(edge, protocol, 1))
        .unwrap()
        .start(hyper::service::service_fn(service), metrics)
        .unwrap();
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    handle
}

/// Every request reaches the service with `Cf-Warp-Tag-Id` naming the connector
/// (the client id it registered with, as `cloudflared` prints it) and without the
/// edge's `Cf-Trace-Id`, whatever the eyeball sent.
async fn the_service_sees_the_connector_tag_and_no_trace_id(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let req = Request::get(format!("http://{}/headers", edge.http_addr()))
        .header("host", "app.example.com")
        .header("cf-trace-id", "0123:4567:0:1")
        .header("cf-warp-tag-id", "from-the-eyeball")
        .header("x-kept", "1")
        .body(empty())
        .unwrap();
    let resp = pooled().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = resp.into_body().collect().await.unwrap().to_bytes();
    let seen = String::from_utf8(seen.to_vec()).unwrap();
    let id = handle.connector_id().hyphenated().to_string();
    assert_eq!(
        edge.registrations()[0].client_id,
        handle.connector_id().as_bytes()
    );
    assert!(seen.contains(&format!("cf-warp-tag-id: {id}\n")), "{seen}");
    assert!(seen.contains("x-kept: 1\n"), "{seen}");
    assert!(!seen.contains("cf-trace-id"), "{seen}");
    handle.shutdown().await;
    edge.shutdown().await;
}
per_transport!(the_service_sees_the_connector_tag_and_no_trace_id);

/// A private-network (TCP) stream is refused the way `cloudflared` refuses one it cannot
/// serve: an error `ConnectResponse` over QUIC, a 502 marked as the connector's over HTTP/2.
/// The connection keeps serving requests.
async fn tcp_streams_are_refused_and_the_connection_keeps_serving(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving(&edge, protocol).await;
    let refused = edge.open_tcp("127.0.0.1:22".parse().unwrap()).await;
    let Err(cftunnel_testkit::edge::MockEdgeError::Rejected(reason)) = refused else {
        panic!("TCP stream not refused ({}): {refused:?}", label(protocol));
    };
    let want = match protocol {
        Protocol::Quic => "private network (TCP) streams are not served by this connector",
        _ => r#"502 Bad Gateway {"src":"cloudflared"}"#,
    };
    assert_eq!(reason, want, "{}", label(protocol));
    for _ in 0..3 {
        let req = Request::get(format!("http://{}/headers", edge.http_addr()))
            .header("host", "app.example.com")
            .body(empty())
            .unwrap();
        let resp = pooled().request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    }
    assert_eq!(edge.serving(), 1);
    handle.shutdown().await;
    edge.shutdown().await;
}
per_transport!(tcp_streams_are_refused_and_the_connection_keeps_serving);

/// HTTP/2 has no `101`: one on a plain request goes out as `200`, as
/// `cloudflared` writes it, instead of an interim head ending the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_on_a_plain_request_reaches_the_edge_as_200_over_http2() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving(&edge, Protocol::Http2).await;
        let (status, _, body) = get(&pooled(), edge.http_addr(), "/switch").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"switched"[..]));
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A request body the service drops unread is stopped (QUIC STOP_SENDING) only
/// once the response is out, as `cloudflared` stops it, not while the edge still
/// waits for the answer; and it is stopped then, so the edge's upload ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_request_body_is_stopped_after_the_response() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving(&edge, Protocol::Quic).await;
        // An upload that never ends on its own: a chunk every 20 ms, for as long as
        // the edge takes them (it stops polling once its stream write fails).
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((Ok::<_, Infallible>(http_body::Frame::data(chunk)), rx))
        });
        // When the edge stopped taking chunks, by this task's clock.
        let feeder = tokio::spawn(async move {
            loop {
                if tx.send(Bytes::from_static(b"0123456789")).await.is_err() {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let req = Request::post("https://app.example.com/late-answer")
            .header("host", "app.example.com")
            .header("content-length", "1000000")
            .body(StreamBody::new(chunks))
            .unwrap();
        let start = Instant::now();
        let resp = edge.request(req).await;
        let answered = start.elapsed();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(answered >= ANSWER_AFTER, "answered after {answered:?}");
        let stopped_at = tokio::time::timeout(Duration::from_secs(5), feeder)
            .await
            .expect("the upload is stopped once the response is out")
            .unwrap();
        // The service answers no earlier than ANSWER_AFTER after the request was sent, so
        // an upload stopped only after the answer ends no earlier either. (Comparing with
        // when this task saw the answer would race with the two tasks' scheduling.)
        let taken = stopped_at - start;
        assert!(
            taken >= ANSWER_AFTER,
            "the upload was stopped {taken:?} in, before the answer at {answered:?}"
        );
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
