//! An `auto` connector moved to HTTP/2 while it runs, as the proxy asks once its table needs
//! response trailers (gRPC's status is one, and QUIC cannot carry it), against the mock edge
//! over real QUIC and TLS/TCP sockets: its QUIC connections are replaced one at a time, a
//! request in flight on one of them completes, a WebSocket session on one of them lasts, and
//! the tunnel keeps serving meanwhile; an edge HTTP/2 cannot reach has the move abandoned
//! with the tunnel still on QUIC. A connector started preferring HTTP/2 (the proxy's, when its
//! first table already serves gRPC) dials HTTP/2 first, and goes to QUIC where HTTP/2 does not
//! reach the edge, at start or later.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::edge::{ConnectionInfo, EdgeProtocol, MockEdge};
use cftunnel_tunnel::{
    Body, Connector, ConnectorHandle, ConnectorOptions, Protocol, TunnelMetrics,
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use tokio::sync::{mpsc, watch};

const HA: usize = 4;
/// The body of the request held in flight across the move.
const SLOW_BODY_BYTES: usize = 1024 * 1024;

/// Answers `/slow` once `release` says so, with `SLOW_BODY_BYTES`, after telling `arrived`
/// it came; anything else with `hello`.
async fn answer(
    req: Request<Body>,
    arrived: mpsc::UnboundedSender<()>,
    mut release: watch::Receiver<bool>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/slow" {
        return Ok(Response::new(Full::new(Bytes::from_static(b"hello"))));
    }
    let _ = arrived.send(());
    let _ = release.wait_for(|r| *r).await;
    let body = Bytes::from(vec![b's'; SLOW_BODY_BYTES]);
    Ok(Response::new(Full::new(body)))
}

fn serving(c: &ConnectionInfo) -> bool {
    c.registered && !c.draining
}

fn series(registry: &prometheus_client::registry::Registry, protocol: &str) -> String {
    let text = metrics_text(registry);
    let name = format!("cftunnel_tunnel_connections{{protocol=\"{protocol}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&name).map(str::to_owned))
        .unwrap_or_else(|| panic!("{name} is served:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_connector_moves_its_quic_connections_to_http2_one_at_a_time() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
        let (release, release_rx) = watch::channel(false);
        let opts = ConnectorOptions {
            // Room for the request held in flight, so the move, not the grace period, is
            // what waits for it.
            grace_period: Duration::from_secs(15),
            ..options(&edge, Protocol::Auto, HA)
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = TunnelMetrics::register(&mut registry);
        let handle = Connector::new(token(), opts)
            .unwrap()
            .start(
                hyper::service::service_fn(move |req| {
                    answer(req, arrived_tx.clone(), release_rx.clone())
                }),
                metrics,
            )
            .unwrap();
        handle.wait_registered(HA).await;
        edge.wait_serving(HA).await;
        let conns = edge.connections();
        assert!(
            conns.iter().all(|c| c.protocol == EdgeProtocol::Quic),
            "auto starts on QUIC: {conns:?}"
        );
        assert_eq!(series(&registry, "quic"), "4");
        assert_eq!(series(&registry, "http2"), "0");

        // Every value the registered count takes from here on.
        let mut counts = handle.subscribe_registered();
        let lowest = Arc::new(AtomicUsize::new(*counts.borrow_and_update()));
        let sampler = tokio::spawn({
            let lowest = lowest.clone();
            async move {
                while counts.changed().await.is_ok() {
                    lowest.fetch_min(*counts.borrow_and_update(), Ordering::SeqCst);
                }
            }
        });

        // A request held in flight on one QUIC connection.
        let before = edge.connections();
        let slow = tokio::spawn({
            let addr = edge.http_addr();
            async move { get(&pooled(), addr, "/slow").await }
        });
        arrived.recv().await.unwrap();
        let carrying = edge
            .connections()
            .into_iter()
            .find(|c| {
                before
                    .iter()
                    .any(|b| b.id == c.id && b.requests + 1 == c.requests)
            })
            .expect("one connection took the request");
        assert_eq!(carrying.protocol, EdgeProtocol::Quic);

        // Requests one after the other all through the move.
        let (stop_load, stop) = watch::channel(false);
        let load = tokio::spawn({
            let addr = edge.http_addr();
            async move {
                let client = pooled();
                let mut stop = stop;
                let (mut served, mut failed) = (0usize, Vec::new());
                while !*stop.borrow_and_update() {
                    let req = get_request(addr, "/hello");
                    match client.request(req).await {
                        Ok(resp) if resp.status() == StatusCode::OK => {
                            match resp.into_body().collect().await.map(|b| b.to_bytes()) {
                                Ok(b) if b == "hello" => served += 1,
                                other => failed.push(format!("body: {other:?}")),
                            }
                        }
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (served, failed)
            }
        });

        assert!(handle.prefer_http2(), "the first call moves the connector");
        assert!(!handle.prefer_http2(), "idempotent");

        // The connection carrying the request unregisters (the edge sends it nothing more)
        // and stays open while its request is in flight.
        wait_until(|| {
            let conns = edge.connections();
            let conn = conns.iter().find(|c| c.id == carrying.id);
            conn.is_none_or(|c| c.draining)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            edge.connections().iter().any(|c| c.id == carrying.id),
            "still open with a request in flight"
        );
        release.send_replace(true);
        let (status, _, body) = slow.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.len(), SLOW_BODY_BYTES, "the whole body arrived");
        assert!(body.iter().all(|b| *b == b's'));

        wait_until(|| {
            let conns = edge.connections();
            conns.len() == HA
                && conns
                    .iter()
                    .all(|c| serving(c) && c.protocol == EdgeProtocol::Http2)
        })
        .await;
        handle.wait_registered(HA).await;
        stop_load.send_replace(true);
        let (served, failed) = load.await.unwrap();
        assert!(
            failed.is_empty(),
            "{} requests failed during the move, the first: {:?}",
            failed.len(),
            failed.first()
        );
        assert!(served > 0);
        sampler.abort();
        let lowest = lowest.load(Ordering::SeqCst);
        assert!(
            lowest >= HA - 1,
            "at most one connection fewer at any time, never none: {lowest}"
        );
        assert_eq!(series(&registry, "quic"), "0");
        assert_eq!(series(&registry, "http2"), "4");

        // For good: connections lost now come back over HTTP/2.
        let moved: Vec<u64> = edge.connections().iter().map(|c| c.id).collect();
        edge.close_connections();
        wait_until(|| {
            let conns = edge.connections();
            conns.len() == HA
                && conns.iter().all(|c| {
                    !moved.contains(&c.id) && serving(c) && c.protocol == EdgeProtocol::Http2
                })
        })
        .await;

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A connector configured for QUIC only is not moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_connector_ignores_the_move_to_http2() {
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 2).await;
        assert!(!handle.prefer_http2());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let conns = edge.connections();
        assert_eq!(conns.len(), 2);
        assert!(
            conns
                .iter()
                .all(|c| serving(c) && c.protocol == EdgeProtocol::Quic),
            "{conns:?}"
        );
        assert_eq!(handle.registered(), 2);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// HTTP/2 registration failures the connector has counted (`registration_failures_total`,
/// every cause).
fn http2_failures(registry: &prometheus_client::registry::Registry) -> u64 {
    let prefix = "cftunnel_tunnel_registration_failures_total{protocol=\"http2\"";
    metrics_text(registry)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Where UDP reaches the edge and TCP does not (its port 7844 blocked), a move to HTTP/2 can
/// never register: the moving connection keeps its turn through a few failed attempts, so no
/// other connection moves, then gives the move up and registers over QUIC again. The tunnel
/// never has more than one connection fewer, and ends with every connection on QUIC, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_http2_the_edge_never_accepts_is_abandoned_with_the_tunnel_on_quic() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().disable_http2().start().await.unwrap();
        let (handle, _metrics, registry) =
            start_connector(options(&edge, Protocol::Auto, HA), token());
        handle.wait_registered(HA).await;
        edge.wait_serving(HA).await;
        let before: Vec<u64> = edge.connections().iter().map(|c| c.id).collect();
        assert!(
            edge.connections()
                .iter()
                .all(|c| serving(c) && c.protocol == EdgeProtocol::Quic),
            "auto starts on QUIC"
        );

        let mut counts = handle.subscribe_registered();
        let lowest = Arc::new(AtomicUsize::new(*counts.borrow_and_update()));
        let sampler = tokio::spawn({
            let lowest = lowest.clone();
            async move {
                while counts.changed().await.is_ok() {
                    lowest.fetch_min(*counts.borrow_and_update(), Ordering::SeqCst);
                }
            }
        });

        assert!(handle.prefer_http2());
        // One connection moved, failed over HTTP/2, and came back over QUIC; the others
        // never left.
        let back_on_quic = || {
            let conns = edge.connections();
            conns.len() == HA
                && conns
                    .iter()
                    .all(|c| serving(c) && c.protocol == EdgeProtocol::Quic)
                && conns.iter().filter(|c| !before.contains(&c.id)).count() == 1
        };
        if tokio::time::timeout(Duration::from_secs(15), wait_until(back_on_quic))
            .await
            .is_err()
        {
            panic!(
                "the tunnel is not back on QUIC: lowest registered {}, connections {:?}",
                lowest.load(Ordering::SeqCst),
                edge.connections()
            );
        }
        handle.wait_registered(HA).await;
        assert_eq!(
            http2_failures(&registry),
            3,
            "three HTTP/2 attempts, then QUIC"
        );

        // For good: no other connection moves, and the move is not tried again.
        assert!(!handle.prefer_http2(), "the move is not started again");
        let settled: Vec<u64> = edge.connections().iter().map(|c| c.id).collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let conns = edge.connections();
        assert!(
            conns.len() == HA
                && conns.iter().all(|c| settled.contains(&c.id)
                    && serving(c)
                    && c.protocol == EdgeProtocol::Quic),
            "the connections stay on QUIC: {conns:?}"
        );
        assert_eq!(handle.registered(), HA);
        assert_eq!(http2_failures(&registry), 3);
        sampler.abort();
        let lowest = lowest.load(Ordering::SeqCst);
        assert!(
            lowest >= HA - 1,
            "at most one connection fewer at any time: {lowest}"
        );
        assert_eq!(series(&registry, "quic"), "4");
        assert_eq!(series(&registry, "http2"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket session on a QUIC connection outlasts the start of its connection's move: the
/// connection unregisters but stays open while the session goes on (up to the grace period),
/// and moves to HTTP/2 once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_keeps_its_quic_connection_through_a_move_until_it_ends() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let opts = ConnectorOptions {
            // Far past the session, so that its end, not the grace period, ends the move.
            grace_period: Duration::from_secs(20),
            ..options(&edge, Protocol::Auto, 1)
        };
        let (handle, _metrics, registry) = start_connector(opts, token());
        handle.wait_registered(1).await;
        edge.wait_serving(1).await;
        let carrying = edge.connections()[0].id;

        let (status, mut ws) = websocket(edge.http_addr()).await;
        assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
        let mut echo = async |i: u32| {
            let msg = format!("message {i}");
            ws.write_all(msg.as_bytes()).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            ws.read_exact(&mut back)
                .await
                .unwrap_or_else(|e| panic!("echo {i} after the move started: {e}"));
            assert_eq!(back, msg.as_bytes());
        };
        echo(0).await;

        assert!(handle.prefer_http2());
        wait_until(|| {
            edge.connections()
                .iter()
                .any(|c| c.id == carrying && c.draining)
        })
        .await;
        // Well past the quiet second after which a moving connection with nothing in flight
        // closes.
        for i in 1..=30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            echo(i).await;
        }
        let conns = edge.connections();
        assert!(
            conns.iter().any(|c| c.id == carrying) && conns.len() == 1,
            "the session's connection is still open, and the only one: {conns:?}"
        );

        // The session ends (the service's side closes once the eyeball's has): the move
        // completes, well within the grace period.
        ws.shutdown().await.unwrap();
        let mut rest = Vec::new();
        ws.read_to_end(&mut rest).await.unwrap();
        let ended = tokio::time::Instant::now();
        wait_until(|| {
            let conns = edge.connections();
            conns.len() == 1 && serving(&conns[0]) && conns[0].protocol == EdgeProtocol::Http2
        })
        .await;
        assert!(
            ended.elapsed() < Duration::from_secs(10),
            "{:?}",
            ended.elapsed()
        );
        handle.wait_registered(1).await;
        assert_eq!(series(&registry, "http2"), "1");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// An edge that answers the moving connection's HTTP/2 registrations with a retryable
/// refusal, more times than a move tries an edge HTTP/2 cannot reach, does not have the move
/// given up: the connection keeps retrying over HTTP/2 with its turn, so no other connection
/// moves meanwhile, and once the edge takes registrations again every connection moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_http2_outlasts_retryable_refusals_of_its_registrations() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let (handle, _metrics, registry) =
            start_connector(options(&edge, Protocol::Auto, HA), token());
        handle.wait_registered(HA).await;
        edge.wait_serving(HA).await;

        let mut counts = handle.subscribe_registered();
        let lowest = Arc::new(AtomicUsize::new(*counts.borrow_and_update()));
        let sampler = tokio::spawn({
            let lowest = lowest.clone();
            async move {
                while counts.changed().await.is_ok() {
                    lowest.fetch_min(*counts.borrow_and_update(), Ordering::SeqCst);
                }
            }
        });

        // The connections registered over QUIC keep serving; the one that moves is refused.
        edge.set_registration_error(Some(retryable("transient edge error")));
        assert!(handle.prefer_http2());
        // Past the attempts after which an unreachable edge has the move given up.
        if tokio::time::timeout(
            Duration::from_secs(10),
            wait_until(|| http2_failures(&registry) >= 5),
        )
        .await
        .is_err()
        {
            panic!(
                "the move stopped retrying over HTTP/2 after {} refusals: {:?}",
                http2_failures(&registry),
                edge.connections()
            );
        }
        let conns = edge.connections();
        assert_eq!(
            conns
                .iter()
                .filter(|c| serving(c) && c.protocol == EdgeProtocol::Quic)
                .count(),
            HA - 1,
            "only the moving connection is down: {conns:?}"
        );

        edge.set_registration_error(None);
        let all_on_http2 = || {
            let conns = edge.connections();
            conns.len() == HA
                && conns
                    .iter()
                    .all(|c| serving(c) && c.protocol == EdgeProtocol::Http2)
        };
        if tokio::time::timeout(Duration::from_secs(20), wait_until(all_on_http2))
            .await
            .is_err()
        {
            panic!("not every connection moved: {:?}", edge.connections());
        }
        handle.wait_registered(HA).await;
        sampler.abort();
        let lowest = lowest.load(Ordering::SeqCst);
        assert!(
            lowest >= HA - 1,
            "at most one connection fewer at any time: {lowest}"
        );
        assert_eq!(series(&registry, "http2"), HA.to_string());
        assert_eq!(series(&registry, "quic"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Starts a connector with `opts` that prefers HTTP/2 from the start (echo service).
fn start_preferring_http2(
    opts: ConnectorOptions,
) -> (ConnectorHandle, prometheus_client::registry::Registry) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    let mut connector = Connector::new(token(), opts).unwrap();
    assert!(connector.prefer_http2(), "an auto connector takes it");
    let handle = connector
        .start(hyper::service::service_fn(echo), metrics)
        .unwrap();
    (handle, registry)
}

/// Every connection of `edge` serving over `protocol`, `n` of them.
fn all_serving_on(edge: &MockEdge, protocol: EdgeProtocol, n: usize) -> bool {
    let conns = edge.connections();
    conns.len() == n && conns.iter().all(|c| serving(c) && c.protocol == protocol)
}

/// Waits up to `within` for every connection of `edge` to serve over `protocol`, `n` of them;
/// fails with `what` and the connections otherwise.
async fn serving_on(
    edge: &MockEdge,
    protocol: EdgeProtocol,
    n: usize,
    within: Duration,
    what: &str,
) {
    if tokio::time::timeout(within, wait_until(|| all_serving_on(edge, protocol, n)))
        .await
        .is_err()
    {
        panic!("{what}: {:?}", edge.connections());
    }
}

/// The connections stay as they are, on QUIC, for a while: none is moved to HTTP/2 again.
async fn settled_on_quic(edge: &MockEdge, handle: &ConnectorHandle, n: usize) {
    assert!(
        !handle.prefer_http2(),
        "the preference is not taken up again"
    );
    let settled: Vec<u64> = edge.connections().iter().map(|c| c.id).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let conns = edge.connections();
    assert!(
        conns.len() == n
            && conns
                .iter()
                .all(|c| settled.contains(&c.id) && serving(c) && c.protocol == EdgeProtocol::Quic),
        "the connections stay on QUIC: {conns:?}"
    );
    assert_eq!(handle.registered(), n);
}

/// A connector started preferring HTTP/2, where UDP reaches the edge and TCP does not: the
/// first connection gives HTTP/2 up after three failed attempts, as a move does, and every
/// connection registers over QUIC and serves, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_started_preferring_http2_runs_on_quic_where_the_edge_refuses_tcp() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().disable_http2().start().await.unwrap();
        let (handle, registry) = start_preferring_http2(options(&edge, Protocol::Auto, HA));
        let on_quic = || all_serving_on(&edge, EdgeProtocol::Quic, HA);
        if tokio::time::timeout(Duration::from_secs(15), wait_until(on_quic))
            .await
            .is_err()
        {
            panic!(
                "not on QUIC: {} HTTP/2 failures, connections {:?}",
                http2_failures(&registry),
                edge.connections()
            );
        }
        handle.wait_registered(HA).await;
        assert_eq!(
            http2_failures(&registry),
            3,
            "three HTTP/2 attempts of the first connection, then QUIC for all"
        );
        let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
        settled_on_quic(&edge, &handle, HA).await;
        assert_eq!(http2_failures(&registry), 3);
        assert_eq!(series(&registry, "quic"), HA.to_string());
        assert_eq!(series(&registry, "http2"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A connector started preferring HTTP/2 against an edge that takes it registers every
/// connection over HTTP/2 from the start, none over QUIC, and response trailers arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_started_preferring_http2_registers_over_http2() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let (handle, registry) = start_preferring_http2(options(&edge, Protocol::Auto, HA));
        handle.wait_registered(HA).await;
        edge.wait_serving(HA).await;
        assert!(
            all_serving_on(&edge, EdgeProtocol::Http2, HA),
            "{:?}",
            edge.connections()
        );
        assert!(
            edge.registrations().len() == HA,
            "registered once each, never over QUIC: {:?}",
            edge.registrations()
        );
        assert!(!handle.prefer_http2(), "preferred already");
        let req = Request::post(format!("http://{}/trailers", edge.http_addr()))
            .header("host", "grpc.example.com")
            .body(empty())
            .unwrap();
        let resp = pooled_h2c().request(req).await.unwrap();
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers arrive");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(series(&registry, "http2"), HA.to_string());
        assert_eq!(series(&registry, "quic"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Connections on HTTP/2 by preference (`moved`: moved from QUIC while running, else
/// preferred from the start), registered, whose edge then drops them and refuses TCP from
/// then on: they give HTTP/2 up as a move does and register over QUIC again, and stay there
/// rather than be moved back.
async fn http2_by_preference_lost_to_an_edge_refusing_tcp_goes_back_to_quic(moved: bool) {
    const N: usize = 2;
    let edge = MockEdge::start().await.unwrap();
    let opts = options(&edge, Protocol::Auto, N);
    let (handle, registry) = if moved {
        let (handle, _metrics, registry) = start_connector(opts, token());
        handle.wait_registered(N).await;
        edge.wait_serving(N).await;
        assert!(handle.prefer_http2());
        (handle, registry)
    } else {
        start_preferring_http2(opts)
    };
    serving_on(
        &edge,
        EdgeProtocol::Http2,
        N,
        Duration::from_secs(15),
        "not on HTTP/2",
    )
    .await;
    handle.wait_registered(N).await;
    let failed_before = http2_failures(&registry);

    // TCP to the edge blocked from now on: the HTTP/2 connections are dropped, and QUIC
    // still gets through.
    let (addr, pki) = (edge.edge_addr(), edge.pki().clone());
    edge.shutdown().await;
    let edge = MockEdge::builder()
        .edge_addr(addr)
        .pki(pki)
        .disable_http2()
        .start()
        .await
        .unwrap();
    let on_quic = || all_serving_on(&edge, EdgeProtocol::Quic, N);
    if tokio::time::timeout(Duration::from_secs(20), wait_until(on_quic))
        .await
        .is_err()
    {
        panic!(
            "not back on QUIC: {} HTTP/2 failures since, connections {:?}",
            http2_failures(&registry) - failed_before,
            edge.connections()
        );
    }
    handle.wait_registered(N).await;
    assert!(
        http2_failures(&registry) - failed_before >= 3,
        "given up after three failures"
    );
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    settled_on_quic(&edge, &handle, N).await;
    assert_eq!(series(&registry, "quic"), N.to_string());
    assert_eq!(series(&registry, "http2"), "0");

    handle.shutdown().await;
    edge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_preferring_http2_from_the_start_go_back_to_quic_when_tcp_is_blocked_later() {
    trace_init();
    tokio::time::timeout(
        LIMIT,
        http2_by_preference_lost_to_an_edge_refusing_tcp_goes_back_to_quic(false),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_moved_to_http2_go_back_to_quic_when_tcp_is_blocked_later() {
    trace_init();
    tokio::time::timeout(
        LIMIT,
        http2_by_preference_lost_to_an_edge_refusing_tcp_goes_back_to_quic(true),
    )
    .await
    .expect("test finished in time");
}

/// Connections on HTTP/2 by preference, through an outage of HTTP/2 to the edge (the edge back
/// with TCP refused, UDP open): they give HTTP/2 up and serve over QUIC. Once the edge takes
/// HTTP/2 again, the connector tries it again by itself, after its retry wait: the connections
/// on QUIC move one at a time and end on HTTP/2, and response trailers come through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_given_up_in_an_outage_is_tried_again_and_the_tunnel_goes_back_to_it() {
    trace_init();
    const N: usize = 2;
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = MockEdge::start().await.unwrap();
        let opts = ConnectorOptions {
            http2_retry: Duration::from_secs(4),
            ..options(&edge, Protocol::Auto, N)
        };
        let (handle, registry) = start_preferring_http2(opts);
        let on = |edge: &MockEdge, protocol| all_serving_on(edge, protocol, N);
        if tokio::time::timeout(
            Duration::from_secs(15),
            wait_until(|| on(&edge, EdgeProtocol::Http2)),
        )
        .await
        .is_err()
        {
            panic!("not on HTTP/2: {:?}", edge.connections());
        }

        // The outage: the edge comes back with TCP refused.
        let (addr, pki) = (edge.edge_addr(), edge.pki().clone());
        edge.shutdown().await;
        let edge = MockEdge::builder()
            .edge_addr(addr)
            .pki(pki.clone())
            .disable_http2()
            .start()
            .await
            .unwrap();
        if tokio::time::timeout(
            Duration::from_secs(15),
            wait_until(|| on(&edge, EdgeProtocol::Quic)),
        )
        .await
        .is_err()
        {
            panic!("not on QUIC: {:?}", edge.connections());
        }
        let failed = http2_failures(&registry);
        assert!(failed >= 3, "given up after three failures: {failed}");

        // Over: the edge takes HTTP/2 again. The connections, back over QUIC, move to it
        // once HTTP/2 is tried again.
        edge.shutdown().await;
        let edge = MockEdge::builder()
            .edge_addr(addr)
            .pki(pki)
            .start()
            .await
            .unwrap();
        if tokio::time::timeout(
            Duration::from_secs(30),
            wait_until(|| on(&edge, EdgeProtocol::Http2)),
        )
        .await
        .is_err()
        {
            panic!(
                "not back on HTTP/2: {} HTTP/2 failures, connections {:?}",
                http2_failures(&registry),
                edge.connections()
            );
        }
        handle.wait_registered(N).await;
        let req = Request::post(format!("http://{}/trailers", edge.http_addr()))
            .header("host", "grpc.example.com")
            .body(empty())
            .unwrap();
        let resp = pooled_h2c().request(req).await.unwrap();
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers arrive");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(series(&registry, "http2"), N.to_string());
        assert_eq!(series(&registry, "quic"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A drain while HTTP/2, given up, waits to be tried again ends with its grace period: the
/// wait for the next try is dropped, not waited out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_while_http2_waits_to_be_tried_again_ends_without_waiting_for_it() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().disable_http2().start().await.unwrap();
        let opts = ConnectorOptions {
            http2_retry: Duration::from_secs(120),
            grace_period: Duration::from_secs(1),
            ..options(&edge, Protocol::Auto, 2)
        };
        let (handle, registry) = start_preferring_http2(opts);
        serving_on(
            &edge,
            EdgeProtocol::Quic,
            2,
            Duration::from_secs(15),
            "not on QUIC",
        )
        .await;
        assert_eq!(http2_failures(&registry), 3, "HTTP/2 given up");

        let draining = tokio::time::Instant::now();
        if tokio::time::timeout(Duration::from_secs(10), handle.drain())
            .await
            .is_err()
        {
            panic!("the drain waits for the next try of HTTP/2");
        }
        assert!(
            draining.elapsed() < Duration::from_secs(5),
            "{:?}",
            draining.elapsed()
        );
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Dropping every handle of a connector whose HTTP/2, given up, waits to be tried again stops
/// its connections at once, as it does any connector's: the wait holds none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_while_http2_waits_to_be_tried_again_stops_the_connections() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().disable_http2().start().await.unwrap();
        let opts = ConnectorOptions {
            http2_retry: Duration::from_secs(120),
            ..options(&edge, Protocol::Auto, 2)
        };
        let (handle, registry) = start_preferring_http2(opts);
        serving_on(
            &edge,
            EdgeProtocol::Quic,
            2,
            Duration::from_secs(15),
            "not on QUIC",
        )
        .await;
        assert_eq!(http2_failures(&registry), 3, "HTTP/2 given up");

        drop(handle);
        if tokio::time::timeout(
            Duration::from_secs(5),
            wait_until(|| edge.connections().is_empty()),
        )
        .await
        .is_err()
        {
            panic!(
                "the connections outlive the handle: {:?}",
                edge.connections()
            );
        }
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Registration failures the connector has counted over `protocol` (every cause).
fn failures(registry: &prometheus_client::registry::Registry, protocol: &str) -> u64 {
    let prefix = format!("cftunnel_tunnel_registration_failures_total{{protocol=\"{protocol}\"");
    metrics_text(registry)
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Connections on HTTP/2 by preference through an outage of the edge (down for 10 s, then back
/// as it was): HTTP/2 fails, and so does QUIC, so the preference is not given up for the
/// retry wait. Every connection is back on HTTP/2 soon after the edge is, and one lost then
/// comes back over HTTP/2 too: no give-up was left standing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_preferred_through_an_outage_of_the_edge_is_back_once_the_edge_is() {
    trace_init();
    const N: usize = 2;
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = MockEdge::start().await.unwrap();
        let opts = ConnectorOptions {
            http2_retry: Duration::from_secs(120),
            ..options(&edge, Protocol::Auto, N)
        };
        let (handle, registry) = start_preferring_http2(opts);
        serving_on(
            &edge,
            EdgeProtocol::Http2,
            N,
            Duration::from_secs(15),
            "not on HTTP/2",
        )
        .await;
        handle.wait_registered(N).await;
        let quic_failed_before = failures(&registry, "quic");

        // The outage: the edge is gone for 10 s, then back as it was, HTTP/2 included.
        let (addr, pki) = (edge.edge_addr(), edge.pki().clone());
        edge.shutdown().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            failures(&registry, "quic") > quic_failed_before,
            "HTTP/2 was given up in the outage and QUIC tried"
        );
        let edge = MockEdge::builder()
            .edge_addr(addr)
            .pki(pki)
            .start()
            .await
            .unwrap();
        let back = tokio::time::Instant::now();
        if tokio::time::timeout(
            Duration::from_secs(20),
            wait_until(|| all_serving_on(&edge, EdgeProtocol::Http2, N)),
        )
        .await
        .is_err()
        {
            panic!(
                "not back on HTTP/2 {:?} after the edge: connections {:?}",
                back.elapsed(),
                edge.connections()
            );
        }
        handle.wait_registered(N).await;

        // The preference stands: connections lost now come back over HTTP/2, not QUIC.
        let before: Vec<u64> = edge.connections().iter().map(|c| c.id).collect();
        edge.close_connections();
        let again = || {
            all_serving_on(&edge, EdgeProtocol::Http2, N)
                && edge.connections().iter().all(|c| !before.contains(&c.id))
        };
        if tokio::time::timeout(Duration::from_secs(10), wait_until(again))
            .await
            .is_err()
        {
            panic!(
                "lost connections not back on HTTP/2: {:?}",
                edge.connections()
            );
        }
        handle.wait_registered(N).await;
        assert_eq!(series(&registry, "http2"), N.to_string());
        assert_eq!(series(&registry, "quic"), "0");

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// `prefer_http2` called while the HA connections are still starting, where TCP to the edge
/// gets no answer: the first connection, registered over QUIC, moves (and is down while its
/// HTTP/2 attempts time out), but the ones that start meanwhile start on QUIC, register and
/// serve, and would move only in their turn. The tunnel is without a connection no longer
/// than it takes the next one to start, not for as long as HTTP/2 takes to be given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_starting_during_a_move_start_on_quic_and_serve() {
    trace_init();
    const HA: usize = 4;
    const START_INTERVAL: Duration = Duration::from_secs(2);
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().silent_http2().start().await.unwrap();
        let opts = ConnectorOptions {
            ha_start_interval: START_INTERVAL,
            ..options(&edge, Protocol::Auto, HA)
        };
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let mut counts = handle.subscribe_registered();
        counts.wait_for(|n| *n >= 1).await.unwrap();
        assert!(handle.prefer_http2());

        // The first connection moves: the only one registered, so none is, until the next
        // one starts and registers.
        tokio::time::timeout(Duration::from_secs(5), counts.wait_for(|n| *n == 0))
            .await
            .expect("the first connection moves")
            .unwrap();
        let down = tokio::time::Instant::now();
        if tokio::time::timeout(
            START_INTERVAL * 2 + Duration::from_secs(1),
            counts.wait_for(|n| *n >= 1),
        )
        .await
        .is_err()
        {
            panic!(
                "no connection registered {:?} after the first one moved: {:?}",
                down.elapsed(),
                edge.connections()
            );
        }

        // From then on never none: the others start on QUIC and serve, while the first one's
        // HTTP/2 attempts time out.
        let lowest = Arc::new(AtomicUsize::new(*counts.borrow_and_update()));
        let sampler = tokio::spawn({
            let lowest = lowest.clone();
            async move {
                while counts.changed().await.is_ok() {
                    lowest.fetch_min(*counts.borrow_and_update(), Ordering::SeqCst);
                }
            }
        });
        tokio::time::timeout(START_INTERVAL * 4, handle.wait_registered(HA - 1))
            .await
            .expect("the other connections register");
        let conns = edge.connections();
        assert_eq!(
            conns
                .iter()
                .filter(|c| serving(c) && c.protocol == EdgeProtocol::Quic)
                .count(),
            HA - 1,
            "the connections started during the move serve over QUIC: {conns:?}"
        );
        sampler.abort();
        assert!(
            lowest.load(Ordering::SeqCst) >= 1,
            "a connection serves at all times once the next one has started"
        );

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A connector started preferring HTTP/2 where TCP connections to the edge get no answer (a
/// path that drops them): each HTTP/2 attempt made by preference times out within seconds,
/// not the 15 s of a connector configured for HTTP/2, so the tunnel registers over QUIC and
/// is ready within about 15 s, not 45.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_preferring_http2_where_tcp_gets_no_answer_is_on_quic_within_seconds() {
    trace_init();
    tokio::time::timeout(Duration::from_secs(40), async {
        let edge = MockEdge::builder().silent_http2().start().await.unwrap();
        let started = tokio::time::Instant::now();
        let (handle, registry) = start_preferring_http2(options(&edge, Protocol::Auto, 1));
        if tokio::time::timeout(Duration::from_secs(20), handle.wait_registered(1))
            .await
            .is_err()
        {
            panic!(
                "not registered {:?} after start: {} HTTP/2 failures",
                started.elapsed(),
                http2_failures(&registry)
            );
        }
        edge.wait_serving(1).await;
        assert!(all_serving_on(&edge, EdgeProtocol::Quic, 1));
        assert_eq!(
            http2_failures(&registry),
            3,
            "three HTTP/2 attempts, then QUIC"
        );

        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
