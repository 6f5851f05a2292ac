//! Registration errors, credentials, reconnects, drain, configuration
//! pushes and protocol fallback against the mock edge, over real sockets.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use cftunnel_testkit::edge::{MockEdge, MockEdgeError};
use cftunnel_tunnel::{EdgeRefusal, Protocol, Token, TokenError};
use http::StatusCode;
use http_body_util::BodyExt as _;

async fn registration_errors_are_retried_then_recover(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    edge.set_registration_error(Some(EdgeRefusal {
        cause: "server busy".into(),
        retry_after: Duration::from_secs(30),
        should_retry: true,
    }));
    let (handle, _m, registry) = start_connector(options(&edge, protocol, 1), token());
    wait_until(|| edge.registrations().len() >= 3).await;
    assert_eq!(handle.registered(), 0);
    let records = edge.registrations();
    assert!(records[2].num_previous_attempts >= 2, "{records:?}");
    let text = metrics_text(&registry);
    let p = label(protocol);
    assert!(
        text.contains(&format!(
            "cftunnel_tunnel_registration_failures_total{{protocol=\"{p}\",cause=\"server_error\"}}"
        )),
        "{text}"
    );
    edge.set_registration_error(None);
    handle.wait_registered(1).await;
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    assert!(metrics_text(&registry).contains(&format!(
        "cftunnel_tunnel_reconnects_total{{protocol=\"{p}\"}}"
    )));
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn wrong_credentials_are_refused(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::builder()
        .credentials(token())
        .start()
        .await
        .unwrap();
    let (handle, _m, registry) = start_connector(options(&edge, protocol, 1), token());
    wait_until(|| edge.registrations().len() >= 2).await;
    assert_eq!(handle.registered(), 0);
    let p = label(protocol);
    let text = metrics_text(&registry);
    assert!(text.contains(&format!(
        "cftunnel_tunnel_registration_failures_total{{protocol=\"{p}\",cause=\"unauthorized\"}}"
    )));
    // Never connected, and it says so: the not-connected alerts match a 0, not a missing series.
    assert!(
        text.contains(&format!(
            "cftunnel_tunnel_connections{{protocol=\"{p}\"}} 0"
        )),
        "{text}"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn reconnects_after_edge_restart(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, _m, _r) = start_connector(options(&edge, protocol, 1), token());
    handle.wait_registered(1).await;
    let (addr, pki) = (edge.edge_addr(), edge.pki().clone());
    edge.shutdown().await;
    let mut registered = handle.subscribe_registered();
    registered.wait_for(|n| *n == 0).await.unwrap();
    let edge = MockEdge::builder()
        .edge_addr(addr)
        .pki(pki)
        .start()
        .await
        .unwrap();
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    let (status, _, _) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!(status, StatusCode::OK);
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn drain_finishes_in_flight_requests(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 2).await;
    let http = edge.http_addr();
    let in_flight = tokio::spawn(async move { get(&pooled(), http, "/slow").await });
    wait_until(|| edge.connections().iter().any(|c| c.requests > 0)).await;
    let drain = tokio::spawn({
        let handle = handle.clone();
        async move { handle.drain().await }
    });
    // The edge stops routing to a connection as soon as it unregisters.
    edge.wait_serving(0).await;
    assert_eq!(handle.registered(), 0);
    // With no connection serving, the eyeball gets Cloudflare's 530 (error 1033).
    let (status, _, body) = get(&pooled(), http, "/hello").await;
    assert_eq!(
        (status.as_u16(), &body[..]),
        (530, &b"error code: 1033\n"[..])
    );
    let (status, _, body) = in_flight.await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"slow"[..]));
    drain.await.unwrap();
    wait_until(|| edge.connections().is_empty()).await;
    edge.shutdown().await;
}

async fn config_pushes_are_acknowledged(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, _m, registry) = start_connector(options(&edge, protocol, 1), token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    // Keys out of order and spaces: the document arrives as the edge holds it, on
    // both transports.
    let doc = br#"{"warp-routing": {"enabled": false}, "ingress":[{"service":"http_status:404"}]}"#;
    let res = edge.push_config(3, doc).await;
    assert_eq!(res.len(), 1);
    assert_eq!(*res[0].as_ref().unwrap(), 3);
    let cfg = handle.remote_config().borrow().clone();
    assert_eq!(cfg.version, 3);
    assert_eq!(
        String::from_utf8_lossy(&cfg.config),
        String::from_utf8_lossy(doc)
    );
    let stale = edge.push_config(2, b"{}").await;
    assert_eq!(*stale[0].as_ref().unwrap(), 3);
    // A malformed document reaches the connector, which refuses it.
    let refused = edge.push_config(4, b"{not json").await;
    let Err(MockEdgeError::Rejected(why)) = &refused[0] else {
        panic!("refused: {refused:?}");
    };
    if protocol == Protocol::Http2 {
        assert!(why.contains("502"), "the connector's answer: {why}");
    }
    assert_eq!(handle.remote_config().borrow().version, 3);
    assert!(metrics_text(&registry).contains("cftunnel_tunnel_remote_config_version 3"));
    handle.shutdown().await;
    edge.shutdown().await;
}

/// The edge keeps a remotely managed tunnel's configuration: a connector that
/// registers after the last push gets it without another one.
async fn connectors_that_register_later_get_the_current_config(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let doc = br#"{"ingress":[{"service":"http_status:404"}]}"#;
    assert!(
        edge.push_config(5, doc).await.is_empty(),
        "nobody to push to yet"
    );
    // Neither an older version nor a malformed document replaces the kept one.
    assert!(edge.push_config(3, b"{}").await.is_empty());
    assert!(edge.push_config(9, b"{not json").await.is_empty());
    let handle = serving_connector(&edge, protocol, 1).await;
    let mut config = handle.remote_config();
    tokio::time::timeout(Duration::from_secs(5), config.wait_for(|c| c.version == 5))
        .await
        .expect("the configuration arrives after registration")
        .unwrap();
    let pushed: serde_json::Value = serde_json::from_slice(&config.borrow().config).unwrap();
    assert_eq!(
        pushed,
        serde_json::from_slice::<serde_json::Value>(doc).unwrap()
    );
    // The edge knows what the connection applied; a newer push is awaited again.
    tokio::time::timeout(Duration::from_secs(5), edge.wait_configured(1))
        .await
        .expect("the connection reports version 5 applied");
    assert_eq!(edge.connections()[0].config_version, Some(5));
    let res = edge.push_config(6, doc).await;
    assert_eq!(*res[0].as_ref().unwrap(), 6);
    assert_eq!(edge.connections()[0].config_version, Some(6));
    edge.wait_configured(1).await;
    handle.shutdown().await;
    edge.shutdown().await;
}

/// No response head within the edge's timeout: the eyeball gets Cloudflare's 524.
async fn a_response_head_that_never_comes_is_a_524(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::builder()
        .response_timeout(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let (status, _, _) = get(&pooled(), edge.http_addr(), "/hang").await;
    assert_eq!(status.as_u16(), 524);
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"hello"[..]),
        "a head in time still serves"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

/// Over HTTP/2 the connector answers a push as `cloudflared` does: its Go response
/// JSON-encoded (`err` null, or an object: `{}` here, where Go may name a JSON syntax
/// error's offset), an undecodable push a connector 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_config_push_replies_match_cloudflared() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Http2, 1).await;
        let resp = edge
            .send_raw_config_push(br#"{"version":3,"config":{"z":1, "ingress": [],"a":2}}"#)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            &handle.remote_config().borrow().config[..],
            br#"{"z":1, "ingress": [],"a":2}"#,
            "the document as pushed"
        );
        assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(&resp.body()[..], br#"{"lastAppliedVersion":3,"err":null}"#);
        let resp = edge
            .send_raw_config_push(br#"{"version":4}"#)
            .await
            .unwrap();
        assert_eq!(&resp.body()[..], br#"{"lastAppliedVersion":3,"err":{}}"#);
        let resp = edge.send_raw_config_push(b"{not json").await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            resp.headers()["cf-cloudflared-response-meta"],
            r#"{"src":"cloudflared"}"#
        );
        assert_eq!(resp.headers()["content-length"], "0");
        let date = resp.headers()["date"].to_str().unwrap();
        assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
        assert!(resp.body().is_empty());
        assert_eq!(handle.remote_config().borrow().version, 3);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket open when the drain starts keeps working through the grace period, as a
/// request in flight does; the drain ends with the grace period, not before.
async fn drain_keeps_open_websockets(protocol: Protocol) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let mut opts = options(&edge, protocol, 1);
    let grace = Duration::from_secs(3);
    opts.grace_period = grace;
    let (handle, _m, _registry) = start_connector(opts, token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    let (status, mut ws) = websocket(edge.http_addr()).await;
    assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
    let started = tokio::time::Instant::now();
    let drain = tokio::spawn({
        let handle = handle.clone();
        async move { handle.drain().await }
    });
    edge.wait_serving(0).await;
    // Well after the unregistration.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    ws.write_all(b"still there").await.unwrap();
    let mut back = [0u8; 11];
    ws.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still there", "{}", label(protocol));
    assert!(!drain.is_finished());
    drop(ws);
    tokio::time::timeout(grace + Duration::from_secs(2), drain)
        .await
        .expect("the drain ends with the grace period")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= grace,
        "{}: the drain ended after {took:?}, within the grace period",
        label(protocol)
    );
    edge.shutdown().await;
}

per_transport!(drain_keeps_open_websockets);
per_transport!(connectors_that_register_later_get_the_current_config);
per_transport!(a_response_head_that_never_comes_is_a_524);
per_transport!(registration_errors_are_retried_then_recover);
per_transport!(wrong_credentials_are_refused);
per_transport!(reconnects_after_edge_restart);
per_transport!(drain_finishes_in_flight_requests);
per_transport!(config_pushes_are_acknowledged);

/// Dial failures `cloudflared` allows on QUIC before it falls back: one past its
/// default `--max-edge-addr-retries` (8).
const QUIC_DIAL_FAILURES_BEFORE_FALLBACK: u64 = 9;

/// `auto` options against an edge without QUIC: short handshakes and backoff, so the
/// failures before the fallback pass quickly.
fn blocked_quic_options(edge: &MockEdge, ha: usize) -> cftunnel_tunnel::ConnectorOptions {
    let mut opts = options(edge, Protocol::Auto, ha);
    opts.handshake_timeout = Duration::from_millis(300);
    opts.backoff_base = Duration::from_millis(10);
    opts
}

/// `cftunnel_tunnel_registration_failures_total` for one protocol and cause (0 before
/// the first).
fn registration_failures(text: &str, protocol: &str, cause: &str) -> u64 {
    let series = format!(
        "cftunnel_tunnel_registration_failures_total{{protocol=\"{protocol}\",cause=\"{cause}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

/// With UDP blocked, `ha` connections register over HTTP/2, and only the first one
/// dialled QUIC (as many times as `cloudflared` does before it falls back).
async fn falls_back_to_http2(ha: usize) {
    trace_init();
    let edge = MockEdge::builder().disable_quic().start().await.unwrap();
    let (handle, _m, registry) = start_connector(blocked_quic_options(&edge, ha), token());
    handle.wait_registered(ha).await;
    let text = metrics_text(&registry);
    assert!(
        text.contains(&format!(
            "cftunnel_tunnel_connections{{protocol=\"http2\"}} {ha}"
        )),
        "{text}"
    );
    assert_eq!(
        registration_failures(&text, "quic", "dial"),
        QUIC_DIAL_FAILURES_BEFORE_FALLBACK,
        "only the first connection tried QUIC: {text}"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_to_http2_when_quic_is_blocked() {
    tokio::time::timeout(LIMIT, falls_back_to_http2(1))
        .await
        .expect("test finished in time");
}

/// Once the first connection has fallen back, the others start on HTTP/2 (the protocol
/// it is on) instead of each trying QUIC first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_fallback_the_other_connections_start_on_http2() {
    tokio::time::timeout(LIMIT, falls_back_to_http2(3))
        .await
        .expect("test finished in time");
}

/// A fallback is per connection and not for good: an HTTP/2 connection that registered
/// and is then lost tries QUIC again, as `cloudflared`'s does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_http2_fallback_returns_to_quic() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder().disable_quic().start().await.unwrap();
        let (handle, _m, registry) = start_connector(blocked_quic_options(&edge, 1), token());
        handle.wait_registered(1).await;
        let (addr, pki) = (edge.edge_addr(), edge.pki().clone());
        edge.shutdown().await;
        let edge = MockEdge::builder()
            .edge_addr(addr)
            .pki(pki)
            .start()
            .await
            .unwrap();
        wait_until(|| {
            metrics_text(&registry).contains("cftunnel_tunnel_connections{protocol=\"quic\"} 1")
        })
        .await;
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Registration failures on QUIC count towards the fallback too: after the retry count
/// (5) of them in a row the connection moves to HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_registration_failures_fall_back_to_http2() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        edge.set_registration_error(Some(retryable("server busy")));
        let mut opts = options(&edge, Protocol::Auto, 1);
        opts.backoff_base = Duration::from_millis(10);
        let (handle, _m, registry) = start_connector(opts, token());
        let failures = |p: &str| registration_failures(&metrics_text(&registry), p, "server_error");
        wait_until(|| failures("http2") >= 1).await;
        assert_eq!(failures("quic"), 5);
        edge.set_registration_error(None);
        handle.wait_registered(1).await;
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_connection_is_counted_and_retried() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        edge.set_registration_error(Some(retryable("EDUPCONN")));
        let (handle, _m, registry) = start_connector(options(&edge, Protocol::Quic, 1), token());
        wait_until(|| edge.registrations().len() >= 2).await;
        assert!(metrics_text(&registry).contains("cause=\"dup_edge_conn\""));
        edge.set_registration_error(None);
        handle.wait_registered(1).await;
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Every dial failure moves the connection to another edge address, picked at random,
/// so it gets past any number of unreachable edges to a reachable one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dial_failures_move_on_until_an_edge_answers() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        // Bound but not listening: dials are refused, and the ports stay taken for
        // the whole test, so no other test's listener can land on one.
        let mut edges = Vec::new();
        let mut refusing = Vec::new();
        for _ in 0..3 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            edges.push(socket.local_addr().unwrap().into());
            refusing.push(socket);
        }
        edges.push(edge.edge_addr().into());
        let mut opts = options(&edge, Protocol::Http2, 1);
        opts.edges = edges;
        opts.backoff_base = Duration::from_millis(5);
        let (handle, _m, registry) = start_connector(opts, token());
        handle.wait_registered(1).await;
        edge.wait_serving(1).await;
        let text = metrics_text(&registry);
        assert!(
            text.contains("cftunnel_tunnel_connections{protocol=\"http2\"} 1"),
            "{text}"
        );
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A UDP relay in front of the mock edge for one connection: forwards datagrams both
/// ways, or drops every one of them while paused (an edge gone silent). Counts what the
/// connector sends it, paused or not.
struct UdpRelay {
    addr: std::net::SocketAddr,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl UdpRelay {
    async fn start(target: std::net::SocketAddr) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let back = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        back.connect(target).await.unwrap();
        let addr = front.local_addr().unwrap();
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, r) = (paused.clone(), received.clone());
        let task = tokio::spawn(async move {
            let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
            let mut client = None;
            loop {
                tokio::select! {
                    Ok((n, from)) = front.recv_from(&mut up) => {
                        r.fetch_add(1, Relaxed);
                        if !p.load(Relaxed) {
                            client = Some(from);
                            let _ = back.send(&up[..n]).await;
                        }
                    }
                    Ok(n) = back.recv(&mut down) => {
                        if let (false, Some(to)) = (p.load(Relaxed), client) {
                            let _ = front.send_to(&down[..n], to).await;
                        }
                    }
                    // Both receives failed (an ICMP error on the edge side): try again.
                    else => {}
                }
            }
        });
        Self {
            addr,
            paused,
            received,
            task,
        }
    }

    fn received(&self) -> usize {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn pause(&self, yes: bool) {
        self.paused.store(yes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An edge that goes silent ends the QUIC connection with an idle timeout; the connection
/// then dials the same edge address again rather than another one, as `cloudflared`'s
/// does (its idle timeout reaches the address logic wrapped as a stream-listener error,
/// which keeps the address). What follows may move it (the edge can still hold the old
/// connection and refuse the new one as a duplicate), so only the first dial is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_idle_timeout_the_connection_dials_its_edge_again() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let relays = [
            UdpRelay::start(edge.edge_addr()).await,
            UdpRelay::start(edge.edge_addr()).await,
        ];
        let mut opts = options(&edge, Protocol::Quic, 1);
        opts.edges = relays.iter().map(|r| r.addr.into()).collect();
        opts.handshake_timeout = Duration::from_secs(5);
        let (handle, _m, _registry) = start_connector(opts, token());
        handle.wait_registered(1).await;
        let (used, other) = if relays[0].received() > 0 {
            (&relays[0], &relays[1])
        } else {
            (&relays[1], &relays[0])
        };
        assert_eq!(other.received(), 0);
        used.pause(true);
        // quinn's 5 s idle timeout, as `cloudflared`'s.
        wait_until(|| handle.registered() == 0).await;
        let before = used.received();
        wait_until(|| used.received() > before).await;
        assert_eq!(
            other.received(),
            0,
            "the connection moved to the other edge"
        );
        used.pause(false);
        handle.wait_registered(1).await;
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A TCP relay in front of the mock edge: each connection is forwarded both ways until
/// `freeze`, which stops the connections open at that moment in both directions while
/// keeping their sockets open (a half-open path: no FIN, no RST); `cut` then closes them.
/// Connections made later are forwarded.
struct TcpRelay {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<u64>,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, _) = tokio::sync::watch::channel(0u64);
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (f, c) = (frozen.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((front, _)) = listener.accept().await {
                let Ok(back) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                // A connection stops at the first freeze after it was opened.
                let (mut frozen, mut cut) = (f.subscribe(), c.subscribe());
                let (born_f, born_c) = (*frozen.borrow_and_update(), *cut.borrow_and_update());
                tokio::spawn(async move {
                    let (mut front, mut back) = (front, back);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut front, &mut back) => return,
                        _ = frozen.wait_for(|g| *g > born_f) => {}
                    }
                    let _ = cut.wait_for(|g| *g > born_c).await;
                });
            }
        });
        Self {
            addr,
            frozen,
            cut,
            task,
        }
    }

    fn freeze(&self) {
        self.frozen.send_modify(|g| *g += 1);
    }

    fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Over HTTP/2 an edge that goes silent is noticed by PINGs: once one goes unanswered with
/// nothing else heard for the keep-alive interval, the connection is dropped and dialed
/// again, where TCP keep-alive alone would take 150 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_edge_gone_silent_is_dropped_and_redialed() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let relay = TcpRelay::start(edge.edge_addr()).await;
        let mut opts = options(&edge, Protocol::Http2, 1);
        opts.edges = vec![relay.addr.into()];
        // Long enough that a loaded test machine still answers in time.
        opts.http2_keepalive = Duration::from_secs(1);
        let (handle, _m, registry) = start_connector(opts, token());
        handle.wait_registered(1).await;
        edge.wait_serving(1).await;
        // An edge that answers stays: several intervals pass with no reconnect.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(handle.registered(), 1);
        assert_eq!(
            edge.registrations().len(),
            1,
            "a live connection was dropped"
        );
        let (status, _, _) = get(&pooled(), edge.http_addr(), "/hello").await;
        assert_eq!(status, StatusCode::OK);

        relay.freeze();
        let frozen_at = tokio::time::Instant::now();
        wait_until(|| handle.registered() == 0).await;
        let noticed = frozen_at.elapsed();
        // A ping goes out within one interval and is given one more.
        assert!(
            noticed < Duration::from_secs(8),
            "noticed after {noticed:?}"
        );
        // The edge still holds the frozen connection; once it is gone the redial registers.
        relay.cut();
        handle.wait_registered(1).await;
        assert!(edge.registrations().len() >= 2);
        // One retry for the silent connection, and one more for any redial the edge refused
        // as a duplicate while it still held the frozen connection.
        let text = metrics_text(&registry);
        let reconnects = text.lines().find_map(|l| {
            l.strip_prefix(r#"cftunnel_tunnel_reconnects_total{protocol="http2"} "#)
                .and_then(|v| v.parse::<u64>().ok())
        });
        assert!(reconnects >= Some(1), "{text}");
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[test]
fn bad_tokens_name_the_field() {
    assert_eq!(
        "not base64!".parse::<Token>().unwrap_err(),
        TokenError::Base64
    );
    let no_secret = base64_json(r#"{"a":"x","t":"6ff42ae2-765d-4adf-8112-31c55c1551ef"}"#);
    let err = no_secret.parse::<Token>().unwrap_err();
    assert_eq!(err, TokenError::Secret);
    assert!(err.to_string().contains("`s`"));
}

fn base64_json(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn rolling_restart_loses_no_requests(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (old, _m1, _r1) = start_connector(options(&edge, protocol, 2), token());
    let (new, _m2, _r2) = start_connector(options(&edge, protocol, 2), token());
    old.wait_registered(2).await;
    new.wait_registered(2).await;
    edge.wait_serving(4).await;
    let http = edge.http_addr();
    let client = pooled();
    let load = tokio::spawn(async move {
        let mut failures = 0;
        for _ in 0..40 {
            let batch =
                futures_util::future::join_all((0..10).map(|_| get(&client, http, "/hello"))).await;
            failures += batch
                .iter()
                .filter(|(s, _, _)| *s != StatusCode::OK)
                .count();
        }
        failures
    });
    wait_until(|| edge.connections().iter().map(|c| c.requests).sum::<u64>() > 50).await;
    old.drain().await;
    assert_eq!(load.await.unwrap(), 0);
    assert_eq!(edge.serving(), 2);
    new.shutdown().await;
    edge.shutdown().await;
}

per_transport!(rolling_restart_loses_no_requests);

async fn shutdown_cuts_a_drain_short(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let http = edge.http_addr();
    let hung = tokio::spawn(async move {
        let req = get_request(http, "/hang");
        pooled().request(req).await.map(|r| r.status())
    });
    wait_until(|| edge.connections().iter().any(|c| c.requests > 0)).await;
    let drain = tokio::spawn({
        let handle = handle.clone();
        async move { handle.drain().await }
    });
    edge.wait_serving(0).await;
    // The grace period is 2 s; a second signal must not wait for it, nor for the request
    // in flight.
    tokio::time::timeout(Duration::from_millis(800), handle.shutdown())
        .await
        .expect("shutdown is immediate");
    drain.await.unwrap();
    let outcome = hung.await.unwrap();
    assert!(!matches!(outcome, Ok(StatusCode::OK)), "{outcome:?}");
    edge.shutdown().await;
}

per_transport!(shutdown_cuts_a_drain_short);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_edge_admin_api_pushes_config_and_lists_connections() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        let client = pooled();
        let (status, _, body) = get(&client, edge.http_addr(), "/__mock-edge/connections").await;
        assert_eq!(status, StatusCode::OK);
        let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(list[0]["registered"], true);
        let put_config = |version: u32, doc: &'static [u8]| {
            http::Request::put(format!(
                "http://{}/__mock-edge/config?version={version}",
                edge.http_addr()
            ))
            .body(http_body_util::BodyExt::boxed_unsync(
                http_body_util::Full::new(bytes::Bytes::from_static(doc)).map_err(|e| match e {}),
            ))
            .unwrap()
        };
        let resp = client
            .request(put_config(7, b"{\"ingress\":[]}"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(handle.remote_config().borrow().version, 7);
        let resp = client.request(put_config(8, b"{not json")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(handle.remote_config().borrow().version, 7);
        let req = http::Request::put(format!(
            "http://{}/__mock-edge/registration-error?cause=EDUPCONN",
            edge.http_addr()
        ))
        .body(empty())
        .unwrap();
        assert_eq!(
            client.request(req).await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A locally managed tunnel's connectors bring their own configuration: the edge refuses
/// to push one, and the connector keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locally_managed_edge_refuses_config_pushes() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::builder()
            .remotely_managed(false)
            .start()
            .await
            .unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        let before = handle.remote_config().borrow().version;
        let req = http::Request::put(format!(
            "http://{}/__mock-edge/config?version=3",
            edge.http_addr()
        ))
        .body(http_body_util::BodyExt::boxed_unsync(
            http_body_util::Full::new(bytes::Bytes::from_static(b"{\"ingress\":[]}"))
                .map_err(|e| match e {}),
        ))
        .unwrap();
        let resp = pooled::<TestBody>().request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("locally managed"),
            "{body:?}"
        );
        assert_eq!(handle.remote_config().borrow().version, before);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// An edge slow to act on `unregisterConnection` keeps sending requests meanwhile; the
/// connector serves them while its unregistration is on its way, not after.
async fn requests_during_a_slow_unregistration_are_served(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let mut opts = options(&edge, protocol, 1);
    opts.grace_period = Duration::from_secs(5);
    let (handle, _m, _registry) = start_connector(opts, token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    // Within the 5 s grace period, and far longer than a request takes.
    edge.set_unregister_delay(Duration::from_secs(4));
    let drain = tokio::spawn({
        let handle = handle.clone();
        async move { handle.drain().await }
    });
    // The unregistration is on its way once the drain has begun; give it a moment to leave.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = tokio::time::Instant::now();
    let (status, _, _) = get(&pooled(), edge.http_addr(), "/hello").await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{}", label(protocol));
    assert!(
        took < Duration::from_millis(2500),
        "{}: answered after {took:?}, behind the unregistration",
        label(protocol)
    );
    assert!(
        edge.connections().iter().all(|c| !c.draining),
        "{}: the edge has not acted on the unregistration yet",
        label(protocol)
    );
    drain.await.unwrap();
    edge.shutdown().await;
}
per_transport!(requests_during_a_slow_unregistration_are_served);

/// An edge that completes the handshake but grants no bidirectional stream cannot hold
/// the attempt: opening the control stream gives up after the RPC timeout, and the
/// connection dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_that_grants_no_control_stream_is_dialed_again() {
    use cftunnel_tunnel::ConnectorOptions;
    use quinn::VarInt;
    use std::net::SocketAddr;
    use std::sync::Arc;
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = cftunnel_testkit::pki::TestPki::generate().unwrap();
        let mut server = pki.quic_server(cftunnel_tunnel::tls::provider()).unwrap();
        let mut transport = quinn::TransportConfig::default();
        transport.max_concurrent_bidi_streams(VarInt::from_u32(0));
        server.transport_config(Arc::new(transport));
        let endpoint =
            quinn::Endpoint::server(server, SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let rpc_timeout = Duration::from_millis(500);
        let opts = ConnectorOptions {
            protocol: Protocol::Quic,
            edges: vec![endpoint.local_addr().unwrap().into()],
            edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
            ha_connections: 1,
            rpc_timeout,
            backoff_base: Duration::from_millis(10),
            ..ConnectorOptions::default()
        };
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let first = endpoint.accept().await.unwrap().await.unwrap();
        let accepted = tokio::time::Instant::now();
        // The first connection stays up (keep-alives are answered) and never gets a stream.
        let again = tokio::time::timeout(Duration::from_secs(5), endpoint.accept())
            .await
            .expect("the connection is dialed again");
        assert!(again.is_some());
        let waited = accepted.elapsed();
        assert!(waited >= rpc_timeout, "gave up after {waited:?}");
        let reason = first.close_reason();
        assert!(
            matches!(&reason, Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == VarInt::from_u32(0)),
            "the attempt ended with a close: {reason:?}"
        );
        assert_eq!(handle.registered(), 0);
        drop(handle);
    })
    .await
    .expect("test finished in time");
}

/// An edge that completes TLS and then never sends its HTTP/2 preface is given up on after
/// 10 s (Go's HTTP/2 server, `cloudflared`'s, waits as long), and the connection dials again
/// instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_edge_that_never_speaks_is_dialed_again() {
    tokio::time::timeout(LIMIT, async {
        trace_init();
        let pki = cftunnel_testkit::pki::TestPki::generate().unwrap();
        let pem = pki.to_pem();
        let certs = rustls_pemfile::certs(&mut pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pemfile::private_key(&mut pem.as_bytes())
            .unwrap()
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certs[1].clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tls_tx, mut tls_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let tls_tx = tls_tx.clone();
                tokio::spawn(async move {
                    // TLS completes; then silence, the connection held open.
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = tls_tx.send(tokio::time::Instant::now());
                        std::future::pending::<()>().await;
                        drop(tls);
                    }
                });
            }
        });
        let opts = cftunnel_tunnel::ConnectorOptions {
            protocol: Protocol::Http2,
            edges: vec![addr.into()],
            edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
            ha_connections: 1,
            backoff_base: Duration::from_millis(50),
            ..cftunnel_tunnel::ConnectorOptions::default()
        };
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let first = tls_rx.recv().await.expect("the connector completes TLS");
        let again = tokio::time::timeout(Duration::from_secs(14), tls_rx.recv())
            .await
            .expect("the connection is dialed again")
            .expect("a second TLS handshake");
        let waited = again - first;
        assert!(
            waited >= Duration::from_secs(10),
            "gave up after {waited:?}, before the preface timeout"
        );
        assert_eq!(handle.registered(), 0);
        // Not `shutdown`: it would wait out the handshake in progress on the silent edge.
        drop(handle);
    })
    .await
    .expect("test finished in time");
}

/// A push that never completed, started at `started`, ended once the test connector's RPC
/// timeout (3 s) had passed, by `within`; the complete push behind it was answered only after
/// that: pushes are read one at a time. (Comparing the two tasks' clocks would race with their
/// scheduling.)
fn pushed_in_turn(
    started: tokio::time::Instant,
    stuck_at: tokio::time::Instant,
    complete_at: tokio::time::Instant,
    within: Duration,
) {
    let waited = stuck_at - started;
    assert!(
        waited >= Duration::from_millis(2900) && waited < within,
        "{waited:?}"
    );
    let complete_waited = complete_at - started;
    assert!(
        complete_waited >= Duration::from_millis(2900),
        "the complete push waited its turn, answered after {complete_waited:?}"
    );
}

/// Over QUIC too, configuration pushes are read one at a time: an RPC session whose message
/// never completes holds the turn until the RPC timeout ends it, and the push behind it is
/// then read and applied. Pushes read at once would each take a buffer of the size the edge
/// announces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_config_push_waits_for_one_that_never_completes() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = std::sync::Arc::new(MockEdge::start().await.unwrap());
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        let started = tokio::time::Instant::now();
        let stuck = tokio::spawn({
            let edge = edge.clone();
            async move {
                // The RPC signature, then a message framed as one segment of 4096 words of
                // which only the first arrive.
                let mut bytes = cftunnel_tunnel::stream::RPC_SIGNATURE.to_vec();
                bytes.extend_from_slice(&0u32.to_le_bytes());
                bytes.extend_from_slice(&4096u32.to_le_bytes());
                bytes.extend_from_slice(&[0; 64]);
                let _ = edge.send_unfinished_quic_stream(&bytes).await;
                tokio::time::Instant::now()
            }
        });
        // Sent once the stuck session has surely taken its turn (it has 3 s).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let applied = edge.push_config(8, br#"{"ingress":[]}"#).await;
        let complete_at = tokio::time::Instant::now();
        assert!(matches!(applied.as_slice(), [Ok(8)]), "{applied:?}");
        let stuck_at = stuck.await.unwrap();
        pushed_in_turn(started, stuck_at, complete_at, Duration::from_secs(6));
        assert_eq!(handle.remote_config().borrow().version, 8);
        handle.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Over HTTP/2 configuration pushes are read one at a time, and one whose document never
/// completes is answered 502 once the RPC timeout has passed; a push waiting behind it is
/// then read and applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_config_push_that_never_completes_times_out() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = std::sync::Arc::new(MockEdge::start().await.unwrap());
        let handle = serving_connector(&edge, Protocol::Http2, 1).await;
        let started = tokio::time::Instant::now();
        let stuck = tokio::spawn({
            let edge = edge.clone();
            async move {
                let resp = edge
                    .send_unfinished_config_push(br#"{"version":7,"con"#)
                    .await;
                (resp, tokio::time::Instant::now())
            }
        });
        // Behind it, a complete push: sent once the stuck one has surely taken its turn
        // (it has 3 s before it times out).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let resp = edge
            .send_raw_config_push(br#"{"version":8,"config":{"ingress":[]}}"#)
            .await
            .unwrap();
        let complete_at = tokio::time::Instant::now();
        assert_eq!(&resp.body()[..], br#"{"lastAppliedVersion":8,"err":null}"#);
        let (stuck, stuck_at) = stuck.await.unwrap();
        let stuck = stuck.unwrap();
        assert_eq!(stuck.status(), StatusCode::BAD_GATEWAY);
        pushed_in_turn(started, stuck_at, complete_at, Duration::from_secs(5));
        assert_eq!(handle.remote_config().borrow().version, 8);
        handle.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
