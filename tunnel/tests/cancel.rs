//! An eyeball that goes away mid-request: the edge cancels the stream, and the connector drops
//! the service's work for it at once, as `cloudflared` ends the origin request's context,
//! instead of when it next writes. Real QUIC and TLS/TCP on 127.0.0.1.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::{Body, Connector, ConnectorHandle, Protocol, TunnelMetrics};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody};

/// Counts the service's calls, and its futures and bodies that were dropped.
#[derive(Clone, Default)]
struct Dropped {
    started: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Dropped {
    fn count(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
}

/// Counts one drop when it is dropped.
struct OnDrop(Dropped);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// `/never`: never answers. `/idle-body`: answers a head at once and never sends its body.
/// `/hello`: answers `hello`. Each future or body counts its drop in `dropped`.
async fn service(dropped: Dropped, req: Request<Body>) -> Result<Response<TestBody>, Infallible> {
    dropped.started.fetch_add(1, Ordering::SeqCst);
    let guard = OnDrop(dropped);
    Ok(match req.uri().path() {
        "/never" => {
            std::future::pending::<()>().await;
            drop(guard);
            unreachable!("a pending future never resolves")
        }
        "/idle-body" => {
            let body = futures_util::stream::once(async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::new()))
            });
            Response::new(StreamBody::new(body).boxed_unsync())
        }
        _ => {
            std::mem::forget(guard);
            Response::new(
                Full::new(Bytes::from_static(b"hello"))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
        }
    })
}

/// A connector whose QUIC connection lets the edge open `max_streams` streams at once.
async fn serving(
    edge: &MockEdge,
    protocol: Protocol,
    max_streams: u32,
    dropped: &Dropped,
) -> ConnectorHandle {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    let opts = cftunnel_tunnel::ConnectorOptions {
        quic_max_streams: max_streams,
        ..options(edge, protocol, 1)
    };
    let dropped = dropped.clone();
    let handle = Connector::new(token(), opts)
        .unwrap()
        .start(
            hyper::service::service_fn(move |req| service(dropped.clone(), req)),
            metrics,
        )
        .unwrap();
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    handle
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://app.example.com{path}"))
        .header("host", "app.example.com")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Sends `/never` through the edge and gives up on it (the eyeball goes away) once the
/// service has been called for it, the `n`th call in all.
async fn abandon_once_served(edge: &MockEdge, dropped: &Dropped, n: usize) {
    let request = edge.request(get("/never"));
    tokio::pin!(request);
    tokio::select! {
        _ = &mut request => panic!("/never is never answered"),
        () = wait_until(|| dropped.started() >= n) => {}
    }
}

/// Waits up to 2 s for `dropped` to reach `n`.
async fn dropped_within(dropped: &Dropped, n: usize) -> bool {
    tokio::time::timeout(Duration::from_secs(2), wait_until(|| dropped.count() >= n))
        .await
        .is_ok()
}

/// A request whose eyeball leaves before the answer: the service's future is dropped.
/// A response whose eyeball leaves while its body is idle: the body is dropped.
async fn a_cancelled_stream_drops_the_services_work(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let dropped = Dropped::default();
    let handle = serving(&edge, protocol, 64, &dropped).await;

    // The edge gives up on the request before a head arrives (its eyeball went away).
    abandon_once_served(&edge, &dropped, 1).await;
    assert!(
        dropped_within(&dropped, 1).await,
        "{}: the pending service future was not dropped",
        label(protocol)
    );

    // A head, then the eyeball leaves while the body has nothing to send.
    let resp = edge.request(get("/idle-body")).await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    drop(resp);
    assert!(
        dropped_within(&dropped, 2).await,
        "{}: the idle response body was not dropped",
        label(protocol)
    );

    let resp = edge.request(get("/hello")).await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}
per_transport!(a_cancelled_stream_drops_the_services_work);

/// Cancelled requests give their stream back: more of them than the connection's stream
/// limit leave room for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_streams_return_their_credit() {
    tokio::time::timeout(LIMIT, async {
        trace_init();
        let edge = MockEdge::start().await.unwrap();
        let dropped = Dropped::default();
        let handle = serving(&edge, Protocol::Quic, 4, &dropped).await;
        // Past the fourth, each is served only once an earlier one gave its stream back.
        for i in 1..=8 {
            abandon_once_served(&edge, &dropped, i).await;
        }
        let resp = tokio::time::timeout(Duration::from_secs(2), edge.request(get("/hello")))
            .await
            .expect("a stream is free for the next request");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert!(dropped_within(&dropped, 8).await, "{}", dropped.count());
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
