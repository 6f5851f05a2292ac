//! Drain over real sockets against a bare test edge. Unlike the mock edge, this edge keeps
//! routing requests to a connection after answering `unregisterConnection`, as Cloudflare's
//! edge does while an unregistration propagates: the connection must still serve them, and
//! stay open, idle or not, until the grace period ends. A connection attempt still in
//! progress when a drain or shutdown begins is abandoned instead.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use cftunnel_testkit::connector::token;
use cftunnel_testkit::edge::rpc::{serve_registration, RegistrationHooks, RegistrationRecord};
use cftunnel_testkit::pki::TestPki;
use cftunnel_tunnel::h2io::{H2Reader, H2Writer};
use cftunnel_tunnel::rpc::{LocalWorker, RpcStream};
use cftunnel_tunnel::stream::http_map::{
    decode_response_head, encode_request_head, ConnectOutcome,
};
use cftunnel_tunnel::stream::{self, ConnectionType};
use cftunnel_tunnel::tls;
use cftunnel_tunnel::{
    ConnectionDetails, Connector, ConnectorHandle, ConnectorOptions, EdgeRefusal, Protocol,
    TunnelMetrics,
};

const GRACE: Duration = Duration::from_secs(4);
/// How long after the unregistration, with the connection idle meanwhile, the edge still
/// routes a request to it.
const LATE: Duration = Duration::from_secs(1);
/// Slack on a loaded machine for the close at the end of the grace period.
const CLOSE_SLACK: Duration = Duration::from_millis(2500);

struct Hooks {
    unregistered: watch::Sender<bool>,
}

impl RegistrationHooks for Hooks {
    fn register(&self, _: RegistrationRecord) -> Result<ConnectionDetails, EdgeRefusal> {
        Ok(ConnectionDetails {
            uuid: uuid::Uuid::new_v4(),
            location: "TST".into(),
            remotely_managed: true,
        })
    }

    fn unregister(&self) {
        self.unregistered.send_replace(true);
    }

    fn local_config(&self, _: Vec<u8>) {}
}

fn hooks() -> (Arc<dyn RegistrationHooks>, watch::Receiver<bool>) {
    let (tx, rx) = watch::channel(false);
    (Arc::new(Hooks { unregistered: tx }), rx)
}

/// One connection to `edge`, trusting `pki`, over `protocol`.
fn options(pki: &TestPki, edge: SocketAddr, protocol: Protocol) -> ConnectorOptions {
    ConnectorOptions {
        protocol,
        edges: vec![edge.into()],
        edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
        ha_connections: 1,
        grace_period: GRACE,
        ..ConnectorOptions::default()
    }
}

fn start_connector(pki: &TestPki, edge: SocketAddr, protocol: Protocol) -> ConnectorHandle {
    start_with(ConnectorOptions {
        backoff_base: Duration::from_millis(50),
        ..options(pki, edge, protocol)
    })
}

fn start_with(opts: ConnectorOptions) -> ConnectorHandle {
    let service = hyper::service::service_fn(|_req| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    Connector::new(token(), opts)
        .unwrap()
        .start(service, metrics)
        .unwrap()
}

/// Starts the drain; returns when it began and the task that ends with it.
fn drain(handle: &ConnectorHandle) -> (Instant, tokio::task::JoinHandle<()>) {
    let started = Instant::now();
    let handle = handle.clone();
    (started, tokio::spawn(async move { handle.drain().await }))
}

fn late_request() -> http::request::Parts {
    http::Request::get("https://app.example.com/late")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

/// The connection closed at the end of the grace period (measured from `started`), not
/// before, and not long after.
fn assert_closed_after_grace(started: Instant, closed: Instant, label: &str) {
    let held = closed - started;
    assert!(
        held >= GRACE,
        "{label}: closed after {held:?}, within the grace period"
    );
    assert!(held < GRACE + CLOSE_SLACK, "{label}: closed after {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_requests_routed_after_the_unregistration_are_served_until_the_grace_period_ends() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = TestPki::generate().unwrap();
        let server = pki.quic_server(tls::provider()).unwrap();
        let endpoint =
            quinn::Endpoint::server(server, SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let handle = start_connector(&pki, endpoint.local_addr().unwrap(), Protocol::Quic);
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let worker = LocalWorker::start("test-edge").unwrap();
        let (hooks, mut unregistered) = hooks();
        let stream = RpcStream {
            reader: recv,
            writer: send,
        };
        let _session = serve_registration(&worker, stream, hooks).await.unwrap();
        handle.wait_registered(1).await;

        let (started, drained) = drain(&handle);
        unregistered.wait_for(|u| *u).await.unwrap();
        tokio::time::sleep(LATE).await;
        let (mut send, mut recv) = conn.open_bi().await.expect("the connection is still open");
        send.write_all(&encode_request_head(&late_request(), ConnectionType::Http))
            .await
            .unwrap();
        send.finish().unwrap();
        let frame = stream::read_response_frame(&mut recv).await.unwrap();
        let head = match decode_response_head(&Bytes::from(frame)).unwrap().unwrap() {
            ConnectOutcome::Head(head) => head,
            ConnectOutcome::Refused(e) => panic!("refused: {e}"),
        };
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(recv.read_to_end(1024).await.unwrap(), b"hello");

        // Idle from here on; held open until the grace period ends, then closed with code 0.
        let reason = conn.closed().await;
        assert_closed_after_grace(started, Instant::now(), "quic");
        assert!(
            matches!(&reason, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == quinn::VarInt::from_u32(0)),
            "{reason:?}"
        );
        drained.await.unwrap();
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_routed_after_the_unregistration_are_served_until_the_grace_period_ends() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = TestPki::generate().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let handle = start_connector(&pki, listener.local_addr().unwrap(), Protocol::Http2);
        let (tcp, _) = listener.accept().await.unwrap();
        let acceptor =
            tokio_rustls::TlsAcceptor::from(Arc::new(pki.tcp_server(tls::provider()).unwrap()));
        let tls = acceptor.accept(tcp).await.unwrap();
        // The edge is the HTTP/2 client.
        let (send_request, connection) = h2::client::handshake(tls).await.unwrap();
        let (closed_tx, closed_rx) = oneshot::channel();
        tokio::spawn(async move {
            let _ = connection.await;
            let _ = closed_tx.send(Instant::now());
        });
        let control = http::Request::get("https://h2.cftunnel.com/")
            .header(stream::headers::CONNECTION_UPGRADE, "control-stream")
            .body(())
            .unwrap();
        let (resp, send) = send_request
            .clone()
            .ready()
            .await
            .unwrap()
            .send_request(control, false)
            .unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let worker = LocalWorker::start("test-edge").unwrap();
        let (hooks, mut unregistered) = hooks();
        let stream = RpcStream {
            reader: H2Reader::new(resp.into_body()),
            writer: H2Writer::new(send),
        };
        let _session = serve_registration(&worker, stream, hooks).await.unwrap();
        handle.wait_registered(1).await;

        let (started, drained) = drain(&handle);
        unregistered.wait_for(|u| *u).await.unwrap();
        tokio::time::sleep(LATE).await;
        let (parts, ()) = http::Request::get("https://app.example.com/late")
            .body(())
            .unwrap()
            .into_parts();
        let (resp, _) = send_request
            .clone()
            .ready()
            .await
            .expect("the connection is still open")
            .send_request(http::Request::from_parts(parts, ()), true)
            .unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(got, b"hello");

        // Idle from here on; held open until the grace period ends, then closed.
        let closed = closed_rx.await.unwrap();
        assert_closed_after_grace(started, closed, "http2");
        drained.await.unwrap();
    })
    .await
    .expect("test finished in time");
}

/// Longest, with slack for a loaded machine, a drain or shutdown may take to end a connection
/// attempt the edge does not answer: the attempt is dropped at once, and a QUIC connection
/// that got as far as its handshake waits at most 1 s for its close to be delivered. The
/// attempts below would otherwise hold on for 5 s or more (QUIC's idle timeout, the 15 s
/// TLS handshake timeout, the 20 s RPC timeout).
const PROMPT: Duration = Duration::from_secs(3);

/// A connector to `edge` with timeouts long enough that only a drain or shutdown can end an
/// attempt the edge does not answer within a test.
fn start_patient_connector(pki: &TestPki, edge: SocketAddr, protocol: Protocol) -> ConnectorHandle {
    start_with(ConnectorOptions {
        rpc_timeout: Duration::from_secs(20),
        handshake_timeout: Duration::from_secs(20),
        ..options(pki, edge, protocol)
    })
}

/// A shutdown begun while the connection's dial is in progress (the edge address takes
/// the packets or the TCP connection and never answers) ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_does_not_wait_for_a_dial_the_edge_does_not_answer() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = TestPki::generate().unwrap();

        let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let handle = start_patient_connector(&pki, silent.local_addr().unwrap(), Protocol::Quic);
        let mut packet = [0u8; 2048];
        silent.recv_from(&mut packet).await.unwrap();
        tokio::time::timeout(PROMPT, handle.shutdown())
            .await
            .expect("quic: the shutdown ends the handshake in progress");

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let handle = start_patient_connector(&pki, listener.local_addr().unwrap(), Protocol::Http2);
        let (_held, _) = listener.accept().await.unwrap();
        tokio::time::timeout(PROMPT, handle.shutdown())
            .await
            .expect("http2: the shutdown ends the TLS handshake in progress");
    })
    .await
    .expect("test finished in time");
}

/// A drain begun while the edge has not answered the registration abandons it: the
/// connection closes without registering, so the edge cannot route new requests to a
/// connector on its way out, and the drain does not wait for the RPC timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_abandons_a_registration_the_edge_has_not_answered() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = TestPki::generate().unwrap();
        let server = pki.quic_server(tls::provider()).unwrap();
        let endpoint =
            quinn::Endpoint::server(server, SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let handle = start_patient_connector(&pki, endpoint.local_addr().unwrap(), Protocol::Quic);
        // The most connections ever counted registered, until the connector lets the count go.
        let mut registered = handle.subscribe_registered();
        let most = tokio::spawn(async move {
            let mut most = *registered.borrow_and_update();
            while registered.changed().await.is_ok() {
                most = most.max(*registered.borrow_and_update());
            }
            most
        });
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        // The control stream and the registration on it arrive, and stay unanswered.
        let (_send, mut recv) = conn.accept_bi().await.unwrap();
        let mut first = [0u8; 1];
        recv.read_exact(&mut first).await.unwrap();

        let (started, drained) = drain(&handle);
        tokio::time::timeout(PROMPT, conn.closed())
            .await
            .expect("the connector closes the connection");
        tokio::time::timeout(PROMPT.saturating_sub(started.elapsed()), drained)
            .await
            .expect("the drain ends with the attempt")
            .unwrap();
        assert_eq!(handle.registered(), 0);
        drop(handle);
        let most = tokio::time::timeout(PROMPT, most)
            .await
            .expect("the count is let go with the connector")
            .unwrap();
        assert_eq!(most, 0, "the connection never counted as registered");
    })
    .await
    .expect("test finished in time");
}
