//! The mock edge's bounds on what connectors can hold: stream credit, registration,
//! liveness of HTTP/2 connections, and WebSocket pipes that end as a whole. Over real
//! QUIC and TLS/TCP sockets on 127.0.0.1.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::edge::{MockEdge, MockEdgeError};
use cftunnel_tunnel::{Body, OnUpgrade, Protocol};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, watch, Notify};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn roots(edge: &MockEdge) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut edge.ca_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// A QUIC connection to the mock as a connector makes it (ALPN `argotunnel`) that sends
/// keep-alives and would stay open for 30 s of silence: only the mock closes it.
async fn quic_connection(edge: &MockEdge) -> quinn::Connection {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots(edge))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"argotunnel".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).unwrap();
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(Duration::from_secs(30).try_into().unwrap()))
        .keep_alive_interval(Some(Duration::from_millis(300)));
    config.transport_config(Arc::new(transport));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    endpoint
        .connect(edge.edge_addr(), "quic.cftunnel.com")
        .unwrap()
        .await
        .unwrap()
}

/// A TLS/TCP connection to the mock with the connector's HTTP/2 server on it.
async fn h2_connection(
    edge: &MockEdge,
) -> h2::server::Connection<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Bytes> {
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(edge))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(edge.edge_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("h2.cftunnel.com").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    h2::server::handshake(tls).await.unwrap()
}

/// Waits for a QUIC connection to be closed; returns the close and when it came.
async fn quic_close(
    conn: &quinn::Connection,
    start: Instant,
) -> (quinn::ConnectionError, Duration) {
    let err = tokio::time::timeout(Duration::from_secs(4), conn.closed())
        .await
        .expect("the mock closes the connection");
    (err, start.elapsed())
}

fn closed_with_code_0(err: &quinn::ConnectionError) -> bool {
    matches!(err, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == quinn::VarInt::from_u32(0))
}

/// A connection that opens no control stream, and one that opens it but never calls
/// `registerConnection`, are closed (code 0) once the registration deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connections_that_never_register_are_closed() {
    trace_init();
    let deadline = Duration::from_millis(1000);
    let edge = MockEdge::builder()
        .registration_timeout(deadline)
        .start()
        .await
        .unwrap();
    let start = Instant::now();
    let silent = quic_connection(&edge).await;
    let idle = quic_connection(&edge).await;
    let (mut send, _recv) = idle.open_bi().await.unwrap();
    // The start of a Cap'n Proto frame header, so that the mock sees the stream.
    send.write_all(&[0, 0, 0, 0]).await.unwrap();
    wait_until(|| edge.connections().len() == 2).await;

    for conn in [&silent, &idle] {
        let (err, after) = quic_close(conn, start).await;
        assert!(closed_with_code_0(&err), "{err:?}");
        assert!(after >= deadline - Duration::from_millis(100), "{after:?}");
        assert!(after < deadline + Duration::from_millis(1500), "{after:?}");
    }
    wait_until(|| edge.connections().is_empty()).await;
    edge.shutdown().await;
}

/// An HTTP/2 connection whose control stream is answered but never used to register
/// is closed once the registration deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_that_never_register_are_closed() {
    trace_init();
    let deadline = Duration::from_millis(1000);
    let edge = MockEdge::builder()
        .registration_timeout(deadline)
        .start()
        .await
        .unwrap();
    let start = Instant::now();
    let mut conn = h2_connection(&edge).await;
    let (control, mut respond) = conn.accept().await.unwrap().unwrap();
    assert_eq!(
        control.headers()["cf-cloudflared-proxy-connection-upgrade"],
        "control-stream"
    );
    let _send = respond.send_response(Response::new(()), false).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(4), async {
        while let Some(Ok(_)) = conn.accept().await {}
    })
    .await;
    let after = start.elapsed();
    assert!(ended.is_ok(), "the mock closes the connection");
    assert!(after >= deadline - Duration::from_millis(100), "{after:?}");
    assert!(after < deadline + Duration::from_millis(1500), "{after:?}");
    wait_until(|| edge.connections().is_empty()).await;
    edge.shutdown().await;
}

/// The registration deadline is for registering: a registered connection outlives it.
async fn registered_connections_outlive_the_registration_deadline(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::builder()
        .registration_timeout(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let before = edge.connections();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(edge.connections(), before);
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(registered_connections_outlive_the_registration_deadline);

/// Origin paths for the stream-credit tests: `/hold` answers once `release` is notified,
/// anything else at once.
fn holding_service(
    release: Arc<Notify>,
) -> impl hyper::service::Service<
    Request<Body>,
    Response = Response<TestBody>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + Sync
       + 'static {
    hyper::service::service_fn(move |req: Request<Body>| {
        let release = release.clone();
        async move {
            if req.uri().path() == "/hold" {
                release.notified().await;
            }
            Ok::<_, Infallible>(Response::new(
                http_body_util::Full::new(Bytes::from_static(b"ok"))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            ))
        }
    })
}

/// Two QUIC connections that each let the edge open one stream at a time.
async fn one_stream_connectors(
    edge: &MockEdge,
    release: Arc<Notify>,
) -> cftunnel_tunnel::ConnectorHandle {
    let mut opts = options(edge, Protocol::Quic, 2);
    opts.quic_max_streams = 1;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
    let handle = cftunnel_tunnel::Connector::new(token(), opts)
        .unwrap()
        .start(holding_service(release), metrics)
        .unwrap();
    handle.wait_registered(2).await;
    edge.wait_serving(2).await;
    handle
}

/// Starts a request for `/hold` and returns once a connection has opened its stream;
/// returns that connection's id.
async fn hold_a_stream(edge: &MockEdge) -> u64 {
    let before = edge.connections();
    let addr = edge.http_addr();
    tokio::spawn(async move { get(&pooled(), addr, "/hold").await });
    let mut held = None;
    wait_until(|| {
        held = edge
            .connections()
            .into_iter()
            .find(|c| {
                before
                    .iter()
                    .any(|b| b.id == c.id && b.requests < c.requests)
            })
            .map(|c| c.id);
        held.is_some()
    })
    .await;
    held.unwrap()
}

/// A QUIC connection with no stream credit left is passed over like one on which no
/// stream can be opened: requests go through the other connection, and with no credit
/// anywhere the answer is a 502, not a wait without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_requests_move_past_a_connection_without_stream_credit() {
    trace_init();
    let open_wait = Duration::from_millis(500);
    let edge = MockEdge::builder()
        .stream_open_timeout(open_wait)
        .start()
        .await
        .unwrap();
    let release = Arc::new(Notify::new());
    let handle = one_stream_connectors(&edge, release.clone()).await;
    let stuck = hold_a_stream(&edge).await;

    let http = pooled();
    for _ in 0..3 {
        let asked = Instant::now();
        let (status, _, body) = tokio::time::timeout(
            Duration::from_secs(5),
            get(&http, edge.http_addr(), "/hello"),
        )
        .await
        .expect("the request does not wait for the stuck connection");
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
        // One open timeout at most, with room for a loaded machine.
        assert!(asked.elapsed() < open_wait * 4, "{:?}", asked.elapsed());
    }
    let conns = edge.connections();
    let on_stuck = conns.iter().find(|c| c.id == stuck).map(|c| c.requests);
    assert_eq!(on_stuck, Some(1), "{conns:?}");

    // Both connections held: nothing can carry a request.
    let other = hold_a_stream(&edge).await;
    assert_ne!(other, stuck);
    let asked = Instant::now();
    let (status, _, body) = tokio::time::timeout(
        Duration::from_secs(6),
        get(&http, edge.http_addr(), "/hello"),
    )
    .await
    .expect("the edge answers without a stream");
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body:?}");
    assert!(asked.elapsed() < open_wait * 8, "{:?}", asked.elapsed());

    release.notify_waiters();
    handle.shutdown().await;
    edge.shutdown().await;
}

/// A configuration push goes to every connection at once: one without stream credit
/// fails after the open timeout and holds up no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_config_pushes_do_not_wait_for_a_stuck_connection() {
    trace_init();
    let open_wait = Duration::from_secs(2);
    let edge = MockEdge::builder()
        .stream_open_timeout(open_wait)
        .start()
        .await
        .unwrap();
    let release = Arc::new(Notify::new());
    let handle = one_stream_connectors(&edge, release.clone()).await;
    let stuck = hold_a_stream(&edge).await;
    let applied = |version: i32| {
        edge.connections()
            .iter()
            .any(|c| c.id != stuck && c.config_version == Some(version))
    };

    // Connections are taken in turn, so over two pushes the stuck one comes first once.
    for version in [1, 2] {
        let doc = format!(r#"{{"ingress":[{{"service":"http_status:20{version}"}}]}}"#);
        let pushed = Instant::now();
        let (results, healthy_after) = tokio::time::timeout(Duration::from_secs(8), async {
            tokio::join!(edge.push_config(version, doc.as_bytes()), async {
                wait_until(|| applied(version)).await;
                pushed.elapsed()
            })
        })
        .await
        .expect("the push ends");
        assert!(healthy_after < open_wait / 2, "{healthy_after:?}");
        let done = pushed.elapsed();
        assert!(done < open_wait + Duration::from_secs(2), "{done:?}");
        assert_eq!(results.len(), 2, "{results:?}");
        assert!(
            results.iter().any(|r| matches!(r, Ok(v) if *v == version)),
            "{results:?}"
        );
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(MockEdgeError::Stream(_)))),
            "{results:?}"
        );
    }
    release.notify_waiters();
    handle.shutdown().await;
    edge.shutdown().await;
}

/// A TCP relay between a connector and the mock whose connections can be frozen: they
/// stay open and carry nothing more, as a peer that vanished without FIN or RST.
struct Relay {
    addr: SocketAddr,
    freezes: Arc<Mutex<Vec<watch::Sender<bool>>>>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let freezes = Arc::new(Mutex::new(Vec::new()));
        let list = freezes.clone();
        tokio::spawn(async move {
            while let Ok((near, _)) = listener.accept().await {
                let Ok(far) = tokio::net::TcpStream::connect(to).await else {
                    continue;
                };
                let (freeze, frozen) = watch::channel(false);
                list.lock().unwrap().push(freeze);
                let (near_r, near_w) = near.into_split();
                let (far_r, far_w) = far.into_split();
                tokio::spawn(Self::carry(near_r, far_w, frozen.clone()));
                tokio::spawn(Self::carry(far_r, near_w, frozen));
            }
        });
        Self { addr, freezes }
    }

    async fn carry(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                biased;
                _ = async { let _ = frozen.wait_for(|f| *f).await; } => {
                    // Both sockets stay open, and nothing moves any more.
                    std::future::pending::<()>().await;
                }
                n = from.read(&mut buf) => match n {
                    Ok(0) | Err(_) => {
                        let _ = to.shutdown().await;
                        return;
                    }
                    Ok(n) => {
                        if to.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                },
            }
        }
    }

    /// Freezes every connection relayed so far.
    fn freeze(&self) {
        for f in self.freezes.lock().unwrap().iter() {
            let _ = f.send(true);
        }
    }
}

/// An HTTP/2 connector that goes silent without closing its connection is found by the
/// edge's PINGs and its connection closed, so that it can register again, with the same
/// connector id and connection index, instead of being told `EDUPCONN` for as long as
/// the dead socket lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_that_stop_answering_pings_are_closed() {
    trace_init();
    let (interval, timeout) = (Duration::from_millis(200), Duration::from_millis(800));
    let edge = MockEdge::builder()
        .http2_ping(interval, timeout)
        .start()
        .await
        .unwrap();
    let relay = Relay::start(edge.edge_addr()).await;
    let mut opts = options(&edge, Protocol::Http2, 1);
    opts.edges = vec![relay.addr.into()];
    // The connector notices the silence too, and dials again through the relay.
    opts.http2_keepalive = Duration::from_millis(300);
    let (handle, _metrics, _registry) = start_connector(opts, token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    // Several PINGs answered: the connection stays.
    tokio::time::sleep(interval * 4).await;
    let conns = edge.connections();
    assert_eq!(conns.len(), 1, "{conns:?}");
    let first = conns[0].id;

    relay.freeze();
    let frozen_at = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(4),
        wait_until(|| edge.connections().iter().all(|c| c.id != first)),
    )
    .await
    .expect("the silent connection is closed");
    // The PING outstanding at the freeze may have gone out up to an interval before it.
    let gone = frozen_at.elapsed();
    assert!(gone >= timeout - interval * 2, "{gone:?}");
    tokio::time::timeout(
        Duration::from_secs(3),
        wait_until(|| {
            edge.connections()
                .iter()
                .any(|c| c.id != first && c.registered && c.conn_index == Some(0))
        }),
    )
    .await
    .expect("the connector registers again");
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    let records = edge.registrations();
    assert!(
        records
            .iter()
            .all(|r| r.client_id == handle.connector_id().as_bytes()),
        "one connector"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

/// PINGs leave a connector that answers them alone, busy or idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_pings_leave_healthy_connections_alone() {
    trace_init();
    let edge = MockEdge::builder()
        .http2_ping(Duration::from_millis(100), Duration::from_millis(1000))
        .start()
        .await
        .unwrap();
    let handle = serving_connector(&edge, Protocol::Http2, 1).await;
    let before = edge.connections();
    let start = Instant::now();
    let n = 32 * 1024 * 1024;
    let (status, _, body) = get(&pooled(), edge.http_addr(), &format!("/download?n={n}")).await;
    assert_eq!((status, body.len()), (StatusCode::OK, n));
    let (status, mut ws) = websocket(edge.http_addr()).await;
    assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
    if let Some(idle) = Duration::from_millis(1500).checked_sub(start.elapsed()) {
        tokio::time::sleep(idle).await;
    }
    ws.write_all(b"still there").await.unwrap();
    let mut back = [0u8; 11];
    ws.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still there");
    let after = edge.connections();
    assert_eq!(
        after
            .iter()
            .map(|c| (c.id, c.registered))
            .collect::<Vec<_>>(),
        before
            .iter()
            .map(|c| (c.id, c.registered))
            .collect::<Vec<_>>()
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

/// Reads until the end of the stream (or an error), at most `wait`; `None` if it did
/// not end in time.
async fn read_to_end_within<R: AsyncRead + Unpin>(r: &mut R, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(wait, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(got)
}

/// The origin's side of the WebSocket teardown tests. `/origin-ends`: the origin writes
/// `bye` and ends its direction, then reports what it still reads. `/eyeball-ends`: the
/// origin reads until the eyeball's direction ends, then writes `late`, holds the
/// stream open for 3 s, and reports what it read.
fn teardown_service(
    reports: mpsc::UnboundedSender<Option<Vec<u8>>>,
) -> impl hyper::service::Service<
    Request<Body>,
    Response = Response<TestBody>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + Sync
       + 'static {
    hyper::service::service_fn(move |mut req: Request<Body>| {
        let reports = reports.clone();
        async move {
            let path = req.uri().path().to_owned();
            let on = req.extensions_mut().remove::<OnUpgrade>();
            tokio::spawn(async move {
                let Some(Ok(mut up)) = (match on {
                    Some(on) => Some(on.await),
                    None => None,
                }) else {
                    return;
                };
                let report = if path == "/origin-ends" {
                    let _ = up.write_all(b"bye").await;
                    let _ = up.shutdown().await;
                    read_to_end_within(&mut up, Duration::from_secs(2)).await
                } else {
                    let got = read_to_end_within(&mut up, Duration::from_secs(2)).await;
                    let _ = up.write_all(b"late").await;
                    let _ = up.flush().await;
                    let _ = reports.send(got);
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    return;
                };
                let _ = reports.send(report);
            });
            Ok::<_, Infallible>(websocket_accepted())
        }
    })
}

/// A WebSocket has no half-close: when the origin's direction ends, the edge closes the
/// eyeball's connection and the stream as a whole, and when the eyeball's ends, the same.
/// Nothing sent afterwards in the other direction arrives.
async fn websockets_end_as_a_whole(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (reports_tx, mut reports) = mpsc::unbounded_channel();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
    let handle = cftunnel_tunnel::Connector::new(token(), options(&edge, protocol, 1))
        .unwrap()
        .start(teardown_service(reports_tx), metrics)
        .unwrap();
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    let wait = Duration::from_secs(2);

    // The origin ends its direction.
    let resp = upgrade_request(edge.http_addr(), "/origin-ends").await;
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut ws = hyper_util::rt::TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    let got = read_to_end_within(&mut ws, wait).await;
    assert_eq!(got.as_deref(), Some(&b"bye"[..]), "{protocol:?}");
    let _ = ws.write_all(b"more").await;
    let _ = ws.flush().await;
    let origin_read = tokio::time::timeout(Duration::from_secs(3), reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        origin_read.as_deref(),
        Some(&b""[..]),
        "the origin's stream ended with the edge's side, {protocol:?}"
    );
    drop(ws);

    // The eyeball ends its direction.
    let resp = upgrade_request(edge.http_addr(), "/eyeball-ends").await;
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut ws = hyper_util::rt::TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    ws.write_all(b"hi").await.unwrap();
    ws.shutdown().await.unwrap();
    let got = read_to_end_within(&mut ws, wait).await;
    assert_eq!(
        got.as_deref(),
        Some(&b""[..]),
        "the eyeball's connection is closed, {protocol:?}"
    );
    let origin_read = tokio::time::timeout(Duration::from_secs(3), reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(origin_read.as_deref(), Some(&b"hi"[..]), "{protocol:?}");

    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(websockets_end_as_a_whole);
