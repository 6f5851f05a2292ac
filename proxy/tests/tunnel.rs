//! Tunnel mode of the real binary behind the mock edge, over both transports: requests
//! reach the in-process router, WebSocket upgrades cross the tunnel, readiness follows the
//! registered connections, and SIGTERM unregisters and drains.

use crate::support::*;
use cftunnel_testkit::connector;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_testkit::wait::wait_until;
use futures_util::{SinkExt, StreamExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts a proxy binary in tunnel mode against `edge`; returns it and its admin address.
async fn tunnel_proxy(
    edge: &MockEdge,
    dir: &std::path::Path,
    token: &str,
    protocol: &str,
    backend: std::net::SocketAddr,
) -> (std::process::Child, std::net::SocketAddr) {
    tunnel_proxy_with(edge, dir, token, protocol, backend, &[]).await
}

/// [`tunnel_proxy`] with extra environment variables.
async fn tunnel_proxy_with(
    edge: &MockEdge,
    dir: &std::path::Path,
    token: &str,
    protocol: &str,
    backend: std::net::SocketAddr,
    env: &[(&str, &str)],
) -> (std::process::Child, std::net::SocketAddr) {
    let doc = serde_json::json!({"version": 1, "rules": [
        {"hostnames": ["app.example.com"], "backends": [{"url": url(backend), "weight": 1, "websocket": true}]}
    ]});
    let (child, admin) = spawn_tunnel_proxy(edge, dir, token, protocol, Some(&doc), env).await;
    ready_once_registered(admin, protocol).await;
    (child, admin)
}

/// With `PROXY_TUNNEL_PROTOCOL=auto` the tunnel dials HTTP/2 when the table serves a GRPCRoute,
/// from the config file or from the first push, or when a rule's backend speaks h2c (gRPC
/// through an HTTPRoute), since gRPC's status travels in trailers the edge does not carry over
/// QUIC; without either it dials QUIC.
#[tokio::test]
async fn an_auto_tunnel_serving_grpc_dials_http2() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let rules = serde_json::json!([{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]);
        let grpc = serde_json::json!({"version": 1, "hasGrpcRoute": true, "rules": rules});
        let plain = serde_json::json!({"version": 1, "rules": rules});
        // An HTTPRoute to a Service whose port has `appProtocol: kubernetes.io/h2c`.
        let h2c = serde_json::json!({"version": 1, "rules": [{"backends": [
            {"url": url(a.http_addr()), "weight": 1, "protocol": "h2c"}
        ]}]});
        let http = client();
        let cases = [
            ("file", Some(&grpc), None, "http2"),
            ("push", None, Some(&grpc), "http2"),
            ("h2c-file", Some(&h2c), None, "http2"),
            ("h2c-push", None, Some(&h2c), "http2"),
            ("plain", Some(&plain), None, "quic"),
        ];
        // Nothing is in flight at the SIGTERMs below.
        let grace = [("PROXY_GRACE_PERIOD", "1s")];
        for (name, file, pushed, expected) in cases {
            let edge = MockEdge::start().await.expect("mock edge starts");
            let dir = scratch_dir(&format!("grpc-{name}"));
            let (mut child, admin) = spawn_tunnel_proxy(
                &edge,
                &dir,
                &connector::token().encode(),
                "auto",
                file,
                &grace,
            )
            .await;
            if let Some(doc) = pushed {
                let pushed_by = Instant::now() + Duration::from_secs(10);
                while tokio::net::TcpStream::connect(admin).await.is_err()
                    || push(&http, admin, doc).await.status != 200
                {
                    assert!(Instant::now() < pushed_by, "{name}: the push is taken");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            edge.wait_serving(1).await;
            let protocols: Vec<String> = edge
                .connections()
                .iter()
                .map(|c| format!("{:?}", c.protocol).to_lowercase())
                .collect();
            assert!(
                !protocols.is_empty() && protocols.iter().all(|p| p == expected),
                "{name}: {protocols:?}"
            );
            sigterm(&child);
            assert_eq!(
                wait_exit(&mut child, Duration::from_secs(15)).await,
                Some(0)
            );
            edge.shutdown().await;
        }
    })
    .await
    .expect("test finished in time");
}

/// An `auto` tunnel whose first table serves gRPC prefers HTTP/2 but is not bound to it: where
/// TCP to the edge is blocked and UDP is not, it gives HTTP/2 up, registers over QUIC and
/// serves, saying why gRPC loses its status, instead of never registering at all.
#[tokio::test]
async fn an_auto_tunnel_serving_grpc_registers_over_quic_where_http2_cannot_reach_the_edge() {
    use cftunnel_testkit::edge::EdgeProtocol;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "hasGrpcRoute": true, "rules": [
            {"hostnames": ["app.example.com"], "backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]});
        let edge = MockEdge::builder()
            .disable_http2()
            .start()
            .await
            .expect("mock edge starts");
        let dir = scratch_dir("grpc-tcp-blocked");
        let (mut child, admin) = spawn_tunnel_proxy_logging(
            &edge,
            &dir,
            &connector::token().encode(),
            "auto",
            Some(&doc),
            &[("PROXY_GRACE_PERIOD", "1s"), ("PROXY_LOG_FORMAT", "json")],
            Stdio::piped(),
        )
        .await;
        let stderr = child.stderr.take().expect("stderr is piped");
        let logs = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        ready_once_registered(admin, "auto").await;
        edge.wait_serving(1).await;
        let conns = edge.connections();
        assert!(
            conns.iter().all(|c| c.protocol == EdgeProtocol::Quic),
            "{conns:?}"
        );
        let reply = get(&client(), edge.http_addr(), "app.example.com", "/", &[]).await;
        assert_eq!(reply.status, 200);
        sigterm(&child);
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(15)).await,
            Some(0)
        );
        let logs = logs.join().expect("stderr read");
        let lines = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(lines("the tunnel dials HTTP/2"), 1, "{logs}");
        assert_eq!(lines("HTTP/2 to the edge failed"), 1, "{logs}");
        edge.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// gRPC over a tunnel forced to QUIC loses its status with the trailers the edge cannot carry:
/// the proxy says so at start (its backend speaks h2c), counts every response whose trailers
/// were dropped on `/metrics`, and warns of the drops once, not once per call.
#[tokio::test]
async fn grpc_over_a_quic_tunnel_counts_and_warns_of_dropped_trailers() {
    use cftunnel_testkit::grpc_echo::{client as grpc, proto, GrpcEchoServer};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let identity = cftunnel_testkit::echo::EchoIdentity {
            namespace: "default".into(),
            pod: "grpc-1".into(),
        };
        let backend = GrpcEchoServer::spawn([127, 0, 0, 1].into(), identity)
            .await
            .expect("gRPC echo listens");
        let doc = serde_json::json!({"version": 1, "rules": [{"backends": [
            {"url": url(backend.addr()), "weight": 1, "protocol": "h2c"}
        ]}]});
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = scratch_dir("trailers-quic");
        let (mut child, admin) = spawn_tunnel_proxy_logging(
            &edge,
            &dir,
            &connector::token().encode(),
            "quic",
            Some(&doc),
            &[("PROXY_GRACE_PERIOD", "1s"), ("PROXY_LOG_FORMAT", "json")],
            Stdio::piped(),
        )
        .await;
        let stderr = child.stderr.take().expect("stderr is piped");
        let logs = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        edge.wait_serving(1).await;
        let http = client();
        let series = "cftunnel_tunnel_dropped_response_trailers_total";
        let up_by = Instant::now() + Duration::from_secs(10);
        while metric(&http, admin, series).await.is_none() {
            assert!(Instant::now() < up_by, "{series} is served");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(metric(&http, admin, series).await, Some(0.0));
        let call = grpc::Call {
            authority: "grpc.example.com".into(),
            path: proto::ECHO.into(),
            metadata: Vec::new(),
            timeout: Duration::from_secs(5),
        };
        for _ in 0..3 {
            let outcome = grpc::call_once(edge.http_addr(), &call).await;
            assert!(
                outcome.response.is_none(),
                "no status without trailers: {outcome:?}"
            );
        }
        assert_eq!(metric(&http, admin, series).await, Some(3.0));
        sigterm(&child);
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(15)).await,
            Some(0)
        );
        let logs = logs.join().expect("stderr read");
        let lines = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(
            lines("response trailers dropped"),
            1,
            "one warning for three drops:\n{logs}"
        );
        assert_eq!(lines("PROXY_TUNNEL_PROTOCOL=http2"), 2, "{logs}");
        assert_eq!(lines("a rule's backend speaks h2c"), 1, "{logs}");
        edge.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// An `auto` tunnel whose first table serves no gRPC dials QUIC; a table with a GRPCRoute and
/// an `h2c` backend pushed later (the usual order: a Gateway's routes, then its GRPCRoutes)
/// moves its connections to HTTP/2 while the proxy runs, with no restart, and gRPC calls
/// through the edge then get their status, which travels in trailers QUIC does not carry.
#[tokio::test]
async fn an_auto_tunnel_moves_to_http2_when_a_later_table_serves_grpc() {
    use cftunnel_testkit::edge::EdgeProtocol;
    use cftunnel_testkit::grpc_echo::{client as grpc, proto, GrpcEchoServer};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let plain = echo("svc-a-1").await;
        let identity = cftunnel_testkit::echo::EchoIdentity {
            namespace: "default".into(),
            pod: "grpc-1".into(),
        };
        let backend = GrpcEchoServer::spawn([127, 0, 0, 1].into(), identity)
            .await
            .expect("gRPC echo listens");
        let first = serde_json::json!({"version": 1, "rules": [
            {"hostnames": ["app.example.com"], "backends": [{"url": url(plain.http_addr()), "weight": 1}]}
        ]});
        let later = serde_json::json!({"version": 2, "hasGrpcRoute": true, "rules": [
            {"hostnames": ["app.example.com"], "backends": [{"url": url(plain.http_addr()), "weight": 1}]},
            {"hostnames": ["grpc.example.com"], "backends": [
                {"url": url(backend.addr()), "weight": 1, "protocol": "h2c"}
            ]}
        ]});
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = scratch_dir("grpc-later");
        // Two connections, so that one moves while the other serves.
        let edges = format!("{0},{0}", edge.edge_addr());
        let (mut child, admin) = spawn_tunnel_proxy_logging(
            &edge,
            &dir,
            &connector::token().encode(),
            "auto",
            Some(&first),
            &[
                ("TUNNEL_EDGE", &edges),
                ("PROXY_GRACE_PERIOD", "1s"),
                ("PROXY_LOG_FORMAT", "json"),
            ],
            Stdio::piped(),
        )
        .await;
        let stderr = child.stderr.take().expect("stderr is piped");
        let logs = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        ready_once_registered(admin, "auto").await;
        edge.wait_serving(2).await;
        let on = |protocol: EdgeProtocol| {
            let conns = edge.connections();
            conns.len() == 2
                && conns
                    .iter()
                    .all(|c| c.registered && !c.draining && c.protocol == protocol)
        };
        assert!(on(EdgeProtocol::Quic), "{:?}", edge.connections());

        let http = client();
        assert_eq!(push(&http, admin, &later).await.status, 200);
        let moved_by = Instant::now() + Duration::from_secs(20);
        while !on(EdgeProtocol::Http2) {
            assert!(
                Instant::now() < moved_by,
                "the tunnel moves to HTTP/2: {:?}",
                edge.connections()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let call = grpc::Call {
            authority: "grpc.example.com".into(),
            path: proto::ECHO.into(),
            metadata: Vec::new(),
            timeout: Duration::from_secs(5),
        };
        for _ in 0..3 {
            let outcome = grpc::call_once(edge.http_addr(), &call).await;
            assert!(
                outcome.response.is_some(),
                "the status arrives in the trailers: {outcome:?}"
            );
        }
        sigterm(&child);
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(15)).await,
            Some(0)
        );
        let logs = logs.join().expect("stderr read");
        let lines = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(
            lines("the tunnel moves its connections to HTTP/2"),
            1,
            "{logs}"
        );
        assert_eq!(lines("PROXY_TUNNEL_PROTOCOL=http2"), 0, "{logs}");
        edge.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// A gRPC stream through an HTTP/2 tunnel, cut at its rule's deadline, ends with trailers
/// saying DEADLINE_EXCEEDED (the edge carries trailers over HTTP/2), not with its stream reset.
#[tokio::test]
async fn a_grpc_stream_cut_at_its_deadline_through_the_tunnel_ends_with_deadline_exceeded() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = endless_grpc_backend().await;
        let doc = serde_json::json!({"version": 1, "hasGrpcRoute": true, "rules": [{
            "timeouts": {"request": "500ms"},
            "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]
        }]});
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = scratch_dir("grpc-deadline");
        let token = connector::token().encode();
        let (mut child, admin) =
            spawn_tunnel_proxy(&edge, &dir, &token, "http2", Some(&doc), &[]).await;
        ready_once_registered(admin, "http2").await;
        let (trailers, messages) = watch_to_the_end(edge.http_addr(), "grpc.example.com").await;
        assert!(messages > 0, "messages came before the deadline");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..]),
            "{trailers:?}"
        );
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// The connector registers with the edge only once the proxy has its first table, whatever
/// the transport: the edge sends a registered connection its share of the tunnel's requests at
/// once, and a proxy without routes would answer them 502 until its first push.
#[tokio::test]
async fn the_tunnel_registers_only_once_the_proxy_has_its_routes() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "rules": [
            {"hostnames": ["app.example.com"], "backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]});
        let http = client();
        for protocol in ["quic", "http2"] {
            let edge = MockEdge::start().await.expect("mock edge starts");
            let dir = scratch_dir(&format!("first-table-{protocol}"));
            let (mut child, admin) = spawn_tunnel_proxy(
                &edge,
                &dir,
                &connector::token().encode(),
                protocol,
                None,
                &[("PROXY_GRACE_PERIOD", "1s")],
            )
            .await;
            let up_by = Instant::now() + Duration::from_secs(10);
            while tokio::net::TcpStream::connect(admin).await.is_err() {
                assert!(Instant::now() < up_by, "{protocol}: the config API listens");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Long enough for a connector that does not wait to have registered.
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(
                edge.connections().is_empty(),
                "{protocol}: no connection before the first table"
            );
            assert_eq!(push(&http, admin, &doc).await.status, 200);
            tokio::time::timeout(Duration::from_secs(10), edge.wait_serving(1))
                .await
                .expect("registers once the table is in");
            let r = get(&http, edge.http_addr(), "app.example.com", "/", &[]).await;
            assert_eq!(r.status, 200, "{protocol}: {:?}", r.body);
            sigterm(&child);
            assert_eq!(wait_exit(&mut child, Duration::from_secs(15)).await, Some(0));
            edge.shutdown().await;
        }
    })
    .await
    .expect("test finished in time");
}

/// A fresh directory for one test's CA file and config.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cftunnel-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Sends SIGTERM, as Kubernetes does to a pod being stopped.
fn sigterm(child: &std::process::Child) {
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(sent.success());
}

async fn wait_exit(child: &mut std::process::Child, within: Duration) -> Option<i32> {
    let exit_by = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        assert!(Instant::now() < exit_by, "exits after the drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn rolling_restart_under_load_fails_no_request() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let edge = MockEdge::start().await.expect("mock edge starts");
        let token = connector::token().encode();
        let dir = std::env::temp_dir().join(format!("cftunnel-rolling-{}", std::process::id()));
        let (d1, d2) = (dir.join("one"), dir.join("two"));
        std::fs::create_dir_all(&d1).expect("dir");
        std::fs::create_dir_all(&d2).expect("dir");
        let (mut first, _) = tunnel_proxy(&edge, &d1, &token, "quic", a.http_addr()).await;
        let (mut second, _) = tunnel_proxy(&edge, &d2, &token, "quic", a.http_addr()).await;
        edge.wait_serving(2).await;

        let entry = edge.http_addr();
        let load: Vec<_> = (0..16)
            .map(|_| {
                tokio::spawn(async move {
                    let http = client();
                    let mut failed = Vec::new();
                    for _ in 0..40 {
                        let r = get(&http, entry, "app.example.com", "/roll?delay=20ms", &[]).await;
                        if r.status != 200 {
                            failed.push(r.status);
                        }
                    }
                    failed
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        sigterm(&first);
        let mut failed = Vec::new();
        for task in load {
            failed.extend(task.await.expect("load task"));
        }
        assert!(
            failed.is_empty(),
            "{} requests failed during the restart: {failed:?}",
            failed.len()
        );
        assert_eq!(
            wait_exit(&mut first, Duration::from_secs(15)).await,
            Some(0)
        );
        let _ = second.kill();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// A request still running when the grace period ends does not hold the process, and the
/// tunnel connection is closed (code 0) on the way out, not left to the edge's idle timeout.
#[tokio::test]
async fn the_end_of_the_grace_period_closes_the_tunnel_connection() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let edge = MockEdge::start().await.expect("mock edge starts");
        let token = connector::token().encode();
        let dir = scratch_dir("grace");
        let (mut child, _) = tunnel_proxy_with(
            &edge,
            &dir,
            &token,
            "quic",
            a.http_addr(),
            &[("PROXY_GRACE_PERIOD", "1s")],
        )
        .await;
        let entry = edge.http_addr();
        let slow = tokio::spawn(async move {
            get(&client(), entry, "app.example.com", "/slow?delay=8s", &[]).await
        });
        wait_until(|| edge.connections().iter().any(|c| c.requests > 0)).await;
        sigterm(&child);
        assert_eq!(wait_exit(&mut child, Duration::from_secs(5)).await, Some(0));
        // The mock edge forgets a connection when it closes; one left to its 10 s idle
        // timeout would still be listed.
        let closed_by = Instant::now() + Duration::from_secs(2);
        while !edge.connections().is_empty() {
            assert!(
                Instant::now() < closed_by,
                "the tunnel connection was not closed: {:?}",
                edge.connections()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        slow.abort();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

async fn serve_through(protocol: &str) {
    let a = echo("svc-a-1").await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("tunnel-{protocol}"));
    let token = connector::token().encode();
    let (mut child, admin) = tunnel_proxy(&edge, &dir, &token, protocol, a.http_addr()).await;
    let http = client();
    assert_eq!(
        metric(
            &http,
            admin,
            &format!("cftunnel_tunnel_connections{{protocol=\"{protocol}\"}}")
        )
        .await,
        Some(1.0),
        "{protocol}: one registered connection"
    );

    let r = get(
        &http,
        edge.http_addr(),
        "app.example.com",
        "/through/the/tunnel?x=1",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{protocol}: {:?}", r.body);
    assert_eq!(r.pod(), "svc-a-1");
    assert_eq!(r.json()["path"], "/through/the/tunnel?x=1");
    let r = get(&http, edge.http_addr(), "other.example.com", "/", &[]).await;
    assert_eq!(r.status, 404, "{protocol}: routing happens in the proxy");

    let (mut ws, _) = tokio_tungstenite::connect_async(
        http::Request::get(format!("ws://{}/ws", edge.http_addr()))
            .header("host", "app.example.com")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header(
                "sec-websocket-key",
                tokio_tungstenite::tungstenite::handshake::client::generate_key(),
            )
            .body(())
            .expect("request"),
    )
    .await
    .expect("WebSocket through the tunnel");
    ws.send(tokio_tungstenite::tungstenite::Message::text("ping"))
        .await
        .expect("send");
    let echoed = ws.next().await.expect("a frame").expect("no error");
    assert_eq!(echoed.into_text().expect("text").as_str(), "ping");
    drop(ws);

    // A slow request is in flight when SIGTERM arrives: the connection unregisters (the edge
    // marks it draining and sends it nothing new) and the request still completes.
    let entry = edge.http_addr();
    let slow = tokio::spawn(async move {
        get(
            &client(),
            entry,
            "app.example.com",
            "/slow?delay=1500ms",
            &[],
        )
        .await
    });
    // SIGTERM once the request is at the backend (logged before its delay).
    let arrived_by = Instant::now() + Duration::from_secs(10);
    while a.count_echoed("/slow?delay=1500ms") == 0 {
        assert!(
            Instant::now() < arrived_by,
            "the slow request reaches the backend"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sigterm(&child);
    let mut unregistered = false;
    for _ in 0..50 {
        if edge.connections().iter().any(|c| c.draining) {
            unregistered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        unregistered,
        "{protocol}: the connection called unregisterConnection"
    );
    let r = slow.await.expect("slow request task");
    assert_eq!(r.status, 200, "{protocol}: the in-flight request finished");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(15)).await,
        Some(0),
        "{protocol}: clean exit"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn serves_through_the_tunnel_over_quic() {
    tokio::time::timeout(TEST_TIMEOUT, serve_through("quic"))
        .await
        .expect("test finished in time");
}

#[tokio::test]
async fn serves_through_the_tunnel_over_http2() {
    tokio::time::timeout(TEST_TIMEOUT, serve_through("http2"))
        .await
        .expect("test finished in time");
}

#[tokio::test]
async fn post_quantum_setting_reaches_the_edge() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = scratch_dir("pq");
        let token = connector::token().encode();
        let (mut child, _) = tunnel_proxy_with(
            &edge,
            &dir,
            &token,
            "quic",
            a.http_addr(),
            &[("PROXY_TUNNEL_POST_QUANTUM", "true")],
        )
        .await;
        let records = edge.registrations();
        assert_eq!(records.len(), 1);
        assert!(
            records[0].features.iter().any(|f| f == "postquantum"),
            "{:?}",
            records[0].features
        );
        let conns = edge.connections();
        assert_eq!(
            conns.first().and_then(|c| c.key_exchange_group),
            Some(rustls::NamedGroup::X25519MLKEM768),
            "{conns:?}"
        );
        let r = get(&client(), edge.http_addr(), "app.example.com", "/pq", &[]).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// Starts the binary with `env` (and no `TUNNEL_TOKEN` unless given), expects it to refuse to
/// start, and returns what it printed on stderr.
fn refused_at_start(env: &[(&str, &std::ffi::OsStr)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
        .env_remove("TUNNEL_TOKEN")
        .env("PROXY_CONFIG_ADDR", "127.0.0.1:0")
        .envs(env.iter().copied())
        .output()
        .expect("binary runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_ne!(out.status.code(), Some(0), "{err}");
    err
}

#[test]
fn a_bad_token_is_refused_at_start_naming_the_problem() {
    let err = refused_at_start(&[("TUNNEL_TOKEN", "not-base64-json".as_ref())]);
    assert!(err.contains("TUNNEL_TOKEN"), "{err}");
    // Set to nothing (an unfilled template, a Secret key with no value): said to be empty.
    for empty in ["", "  ", "\n"] {
        let err = refused_at_start(&[("TUNNEL_TOKEN", empty.as_ref())]);
        assert!(
            err.contains("TUNNEL_TOKEN: tunnel token is empty"),
            "{empty:?}: {err}"
        );
    }
}

/// A token as GNU `base64` prints it: wrapped at 76 columns, ending in a newline.
fn wrapped(token: &cftunnel_tunnel::Token) -> String {
    let flat = token.encode();
    assert!(flat.len() > 76, "long enough to wrap");
    let mut out = String::new();
    for line in flat.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out
}

/// A token mounted as a file (`TUNNEL_TOKEN_FILE`, as `cloudflared --token-file`) registers
/// with the credentials in it, wrapped over several lines (as `base64` writes it) and all; an
/// empty `TUNNEL_TOKEN` does not shadow it, and a non-empty one, wrapped too, does.
#[tokio::test]
async fn the_token_can_come_from_a_file() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = scratch_dir("token-file");
        let tunnel = uuid::Uuid::new_v4();
        let token = cftunnel_tunnel::Token::new("file-account", vec![9u8; 32], tunnel);
        let file = dir.join("tunnel-token");
        std::fs::write(&file, wrapped(&token)).expect("token file written");
        let file = file.to_string_lossy().into_owned();
        let (mut child, _admin) = tunnel_proxy_with(
            &edge,
            &dir,
            "",
            "quic",
            a.http_addr(),
            &[("TUNNEL_TOKEN_FILE", file.as_str())],
        )
        .await;
        let records = edge.registrations();
        assert_eq!(
            records
                .first()
                .map(|r| (r.account_tag.as_str(), r.tunnel_id.clone())),
            Some(("file-account", tunnel.as_bytes().to_vec())),
            "registered with the file's credentials"
        );
        let r = get(&client(), edge.http_addr(), "app.example.com", "/", &[]).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let _ = child.kill();
        let _ = child.wait();

        // A non-empty TUNNEL_TOKEN wins over the file.
        let env_edge = MockEdge::start().await.expect("mock edge starts");
        let env_token = connector::token();
        let (mut child, _admin) = tunnel_proxy_with(
            &env_edge,
            &dir,
            &wrapped(&env_token),
            "quic",
            a.http_addr(),
            &[("TUNNEL_TOKEN_FILE", file.as_str())],
        )
        .await;
        assert_eq!(
            env_edge
                .registrations()
                .first()
                .map(|r| r.account_tag.clone()),
            Some(env_token.account_tag().to_owned())
        );
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

#[test]
fn a_token_file_that_cannot_be_used_is_refused_at_start_naming_it() {
    let dir = scratch_dir("bad-token-file");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let malformed = dir.join("malformed");
    std::fs::write(&malformed, "not-base64-json\n").expect("write");
    let missing = dir.join("missing");
    for (path, problem) in [
        (&empty, "the file is empty"),
        (&malformed, "not valid base64"),
        (&missing, "reading the token"),
    ] {
        let err = refused_at_start(&[("TUNNEL_TOKEN_FILE", path.as_ref())]);
        let named = format!("TUNNEL_TOKEN_FILE ({})", path.display());
        assert!(err.contains(&named) && err.contains(problem), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `TUNNEL_REGION` is checked at start: refused with a token that names its own endpoint
/// (`cloudflared` refuses the pair too) and when it cannot be part of a DNS name; so is a
/// token's endpoint.
#[test]
fn a_region_that_cannot_be_used_is_refused_at_start() {
    use base64::Engine as _;
    let fed = base64::engine::general_purpose::STANDARD.encode(format!(
        r#"{{"a":"acct","s":"AAEC","t":"{}","e":"fed"}}"#,
        uuid::Uuid::new_v4()
    ));
    for (token, region, problem) in [
        (fed, "us", "token that has an endpoint (\"fed\")"),
        (
            connector::token().encode(),
            "us.example.com",
            "is not 1 to 63 ASCII letters, digits or '-'",
        ),
    ] {
        let err = refused_at_start(&[
            ("TUNNEL_TOKEN", token.as_ref()),
            ("TUNNEL_REGION", region.as_ref()),
        ]);
        assert!(
            err.contains("TUNNEL_REGION") && err.contains(problem),
            "{err}"
        );
    }
    // A token's own endpoint is held to the same rule: one that discovery could never find
    // is refused at start, not retried for ever.
    for endpoint in ["-fed", "fed_1", &"r".repeat(64)] {
        let token = base64::engine::general_purpose::STANDARD.encode(format!(
            r#"{{"a":"acct","s":"AAEC","t":"{}","e":"{endpoint}"}}"#,
            uuid::Uuid::new_v4()
        ));
        let err = refused_at_start(&[("TUNNEL_TOKEN", token.as_ref())]);
        assert!(
            err.contains("`e` (endpoint)") && err.contains("1 to 63 ASCII letters"),
            "{endpoint}: {err}"
        );
    }
}

/// A visitor that leaves while the backend is still working: the edge cancels the stream and
/// the proxy drops the backend request with it, so `cftunnel_proxy_requests_in_flight`, the
/// autoscaling signal, falls back to zero instead of counting abandoned requests until the
/// backend answers.
async fn a_departed_visitor_leaves_nothing_in_flight(protocol: &str) {
    let a = echo("svc-a-1").await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("departed-{protocol}"));
    let (mut child, admin) = tunnel_proxy(
        &edge,
        &dir,
        &connector::token().encode(),
        protocol,
        a.http_addr(),
    )
    .await;
    let http = client();
    let gauge = "cftunnel_proxy_requests_in_flight";
    let mut visitor = tokio::net::TcpStream::connect(edge.http_addr())
        .await
        .expect("eyeball connects");
    tokio::io::AsyncWriteExt::write_all(
        &mut visitor,
        b"GET /slow?delay=30s HTTP/1.1\r\nhost: app.example.com\r\n\r\n",
    )
    .await
    .expect("request written");
    let seen_by = Instant::now() + Duration::from_secs(5);
    while metric(&http, admin, gauge).await != Some(1.0) {
        assert!(
            Instant::now() < seen_by,
            "{protocol}: the request is in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(visitor);
    let gone_by = Instant::now() + Duration::from_secs(3);
    while metric(&http, admin, gauge).await != Some(0.0) {
        assert!(
            Instant::now() < gone_by,
            "{protocol}: the departed visitor's request is still in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = get(&http, edge.http_addr(), "app.example.com", "/after", &[]).await;
    assert_eq!(r.status, 200, "{protocol}: {:?}", r.body);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_departed_visitor_leaves_nothing_in_flight_over_quic() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_departed_visitor_leaves_nothing_in_flight("quic"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_departed_visitor_leaves_nothing_in_flight_over_http2() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_departed_visitor_leaves_nothing_in_flight("http2"),
    )
    .await
    .expect("test finished in time");
}

/// A backend for the send-timeout tests: `/endless` streams without end until the proxy lets
/// the connection go, and says so on the returned channel; `/big` answers `BIG_BODY` bytes
/// ending in `END`; anything else answers `ok`.
async fn streaming_backend() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (gone_tx, gone) = tokio::sync::mpsc::unbounded_channel();
    let addr = scripted_backend(move |mut conn: tokio::net::TcpStream| {
        let gone_tx = gone_tx.clone();
        async move {
            let Some(head) = request_head(&mut conn).await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let chunk = vec![b'x'; 0x10000];
            if head.starts_with(b"GET /endless") {
                stream_without_end(&mut conn).await;
                let _ = gone_tx.send(());
            } else if head.starts_with(b"GET /big") {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG_BODY}\r\n\r\n");
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let mut left = BIG_BODY - 3;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
                let _ = conn.write_all(b"END").await;
                let _ = conn.read(&mut buf).await;
            } else {
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        }
    })
    .await;
    (addr, gone)
}

/// Size of the body of `streaming_backend`'s `/big`: far more than the edge, the tunnel and
/// the sockets between them buffer, so the tunnel's writes wait on the visitor's reads.
const BIG_BODY: usize = 48 << 20;

/// A visitor connection to `edge` with a small receive buffer (so little of a response waits
/// in the kernel), that has sent `GET path`.
async fn visitor(edge: &MockEdge, path: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .set_recv_buffer_size(16 * 1024)
        .expect("receive buffer set");
    let mut visitor = socket
        .connect(edge.http_addr())
        .await
        .expect("eyeball connects");
    let request = format!("GET {path} HTTP/1.1\r\nhost: app.example.com\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut visitor, request.as_bytes())
        .await
        .expect("request written");
    visitor
}

/// Waits up to `within` for `series` on `admin`'s `/metrics` to read `value`.
async fn metric_reaches(admin: std::net::SocketAddr, series: &str, value: f64, within: Duration) {
    let http = client();
    let by = Instant::now() + within;
    while metric(&http, admin, series).await != Some(value) {
        assert!(Instant::now() < by, "{series} reaches {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A visitor that stops reading its response, and stays connected, holds its tunnel stream
/// only for the send timeout (`PROXY_SEND_TIMEOUT`, the listener's own): the stream is reset
/// and the response dropped, so the backend connection, the place in flight and the stream
/// are let go, and with a single backend connection the next request is served.
async fn a_visitor_that_stops_reading_is_let_go_after_the_send_timeout(protocol: &str) {
    let (backend, mut gone) = streaming_backend().await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("stops-reading-{protocol}"));
    let env = [
        ("PROXY_SEND_TIMEOUT", "1s"),
        ("PROXY_BACKEND_MAX_CONNECTIONS", "1"),
    ];
    let token = connector::token().encode();
    let (mut child, admin) = tunnel_proxy_with(&edge, &dir, &token, protocol, backend, &env).await;
    let stuck = visitor(&edge, "/endless").await;
    tokio::time::timeout(Duration::from_secs(20), gone.recv())
        .await
        .unwrap_or_else(|_| panic!("{protocol}: the backend connection is let go"))
        .expect("the backend says so");
    let streams = format!("cftunnel_tunnel_active_streams{{protocol=\"{protocol}\"}}");
    metric_reaches(admin, &streams, 0.0, Duration::from_secs(5)).await;
    let in_flight = "cftunnel_proxy_requests_in_flight";
    metric_reaches(admin, in_flight, 0.0, Duration::from_secs(5)).await;
    let r = get(
        &client(),
        edge.http_addr(),
        "app.example.com",
        "/after",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{protocol}: {:?}", r.body);
    drop(stuck);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_visitor_that_stops_reading_is_let_go_after_the_send_timeout_over_quic() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_visitor_that_stops_reading_is_let_go_after_the_send_timeout("quic"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_visitor_that_stops_reading_is_let_go_after_the_send_timeout_over_http2() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_visitor_that_stops_reading_is_let_go_after_the_send_timeout("http2"),
    )
    .await
    .expect("test finished in time");
}

/// A visitor that reads slowly but steadily gets its whole response, however much longer than
/// the send timeout it takes: the timeout bounds each blocked write, not the response.
async fn a_visitor_that_reads_slowly_gets_the_whole_response(protocol: &str) {
    use tokio::io::AsyncReadExt as _;
    let (backend, _gone) = streaming_backend().await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("reads-slowly-{protocol}"));
    let send_timeout = Duration::from_secs(2);
    let env = [("PROXY_SEND_TIMEOUT", "2s")];
    let token = connector::token().encode();
    let (mut child, _admin) = tunnel_proxy_with(&edge, &dir, &token, protocol, backend, &env).await;
    let started = Instant::now();
    let mut slow = visitor(&edge, "/big").await;
    let mut buf = vec![0u8; 16 * 1024];
    let mut head = Vec::new();
    let mut body = 0usize;
    // The body's last bytes, where `END` shows up.
    let mut tail = Vec::new();
    loop {
        let n = slow
            .read(&mut buf)
            .await
            .expect("the response keeps coming");
        assert!(
            n > 0,
            "{protocol}: the response was cut after {body} body bytes"
        );
        let mut got = &buf[..n];
        if !head.windows(4).any(|w| w == b"\r\n\r\n") {
            head.extend_from_slice(got);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            got = &head[end + 4..];
            let got = got.to_vec();
            body += got.len();
            tail = got;
        } else {
            body += got.len();
            tail.extend_from_slice(got);
        }
        if tail.windows(3).any(|w| w == b"END") {
            break;
        }
        let keep = tail.len().saturating_sub(2);
        tail.drain(..keep);
        // About 8 MiB/s at most: slower than the tunnel can send.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{protocol}: {:?}",
        String::from_utf8_lossy(&head)
    );
    assert!(body >= BIG_BODY, "{protocol}: {body} body bytes");
    assert!(
        started.elapsed() > 2 * send_timeout,
        "{protocol}: the response took longer than the send timeout ({:?})",
        started.elapsed()
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_visitor_that_reads_slowly_gets_the_whole_response_over_quic() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_visitor_that_reads_slowly_gets_the_whole_response("quic"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_visitor_that_reads_slowly_gets_the_whole_response_over_http2() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_visitor_that_reads_slowly_gets_the_whole_response("http2"),
    )
    .await
    .expect("test finished in time");
}

/// A visitor's upload of stated length trickling in through the tunnel holds no backend
/// connection until it is complete: with a single connection to the backend, the next visitor
/// is served meanwhile, and the upload reaches the backend whole.
async fn a_trickling_upload_holds_no_backend_connection(protocol: &str) {
    use tokio::io::AsyncWriteExt as _;
    let (backend, accepted) = body_echoing_backend().await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("trickling-upload-{protocol}"));
    let env = [("PROXY_BACKEND_MAX_CONNECTIONS", "1")];
    let token = connector::token().encode();
    let (mut child, _admin) = tunnel_proxy_with(&edge, &dir, &token, protocol, backend, &env).await;
    let mut upload = tokio::net::TcpStream::connect(edge.http_addr())
        .await
        .expect("eyeball connects");
    upload
        .write_all(
            b"POST /upload HTTP/1.1\r\nhost: app.example.com\r\ncontent-length: 10\r\n\r\nabc",
        )
        .await
        .expect("head and the first bytes written");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = client();
    let next = get(&http, edge.http_addr(), "app.example.com", "/next", &[]);
    let r = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .unwrap_or_else(|_| {
            panic!("{protocol}: the next visitor waits on the upload's connection")
        });
    assert_eq!(r.status, 200, "{protocol}: {:?}", r.body);

    upload
        .write_all(b"defghij")
        .await
        .expect("the rest written");
    let answer = read_until_ending(&mut upload, b"abcdefghij").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{protocol}: {answer}");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{protocol}: one connection"
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_trickling_upload_holds_no_backend_connection_over_quic() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_trickling_upload_holds_no_backend_connection("quic"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_trickling_upload_holds_no_backend_connection_over_http2() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        a_trickling_upload_holds_no_backend_connection("http2"),
    )
    .await
    .expect("test finished in time");
}

/// A `101` from a backend to a request that asked for no upgrade reaches the visitor as the
/// proxy's 502 through the tunnel too: over HTTP/2, where a `101` has no place, it must not
/// turn into a `200` with an empty body, nor over QUIC into a switch on an ordinary stream.
async fn an_unasked_switch_through_the_tunnel_is_refused(protocol: &str) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let backend = scripted_backend(|mut conn: tokio::net::TcpStream| async move {
        if request_head(&mut conn).await.is_none() {
            return;
        }
        let switch =
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        if conn.write_all(switch).await.is_ok() {
            let _ = conn.read(&mut [0u8; 64]).await;
        }
    })
    .await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let dir = scratch_dir(&format!("unasked-switch-{protocol}"));
    let token = connector::token().encode();
    let (mut child, admin) = tunnel_proxy(&edge, &dir, &token, protocol, backend).await;
    let http = client();
    let r = get(&http, edge.http_addr(), "app.example.com", "/", &[]).await;
    assert_eq!(r.status, 502, "{protocol}: {:?} {:?}", r.headers, r.body);
    let errors =
        "cftunnel_proxy_backend_errors_total{hostname=\"app.example.com\",reason=\"other\"}";
    assert_eq!(metric(&http, admin, errors).await, Some(1.0), "{protocol}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_unasked_switch_through_the_tunnel_is_refused_over_http2() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        an_unasked_switch_through_the_tunnel_is_refused("http2"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn an_unasked_switch_through_the_tunnel_is_refused_over_quic() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        an_unasked_switch_through_the_tunnel_is_refused("quic"),
    )
    .await
    .expect("test finished in time");
}
