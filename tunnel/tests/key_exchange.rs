//! TLS key exchange with the edge, over real QUIC and TLS/TCP sockets on
//! 127.0.0.1: the connector offers groups as `cloudflared` does
//! (X25519MLKEM768, then P-256; only X25519MLKEM768 in strict post-quantum
//! mode) and the mock edge records what each handshake negotiated. The cipher
//! suites it offers follow `cloudflared`'s order too.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use cftunnel_testkit::edge::{ConnectionInfo, MockEdge};
use cftunnel_testkit::pki::TestPki;
use cftunnel_tunnel::{ConnectorHandle, ConnectorOptions, Protocol, FEATURE_POST_QUANTUM};
use rustls::NamedGroup;

fn post_quantum(edge: &MockEdge, protocol: Protocol) -> ConnectorOptions {
    ConnectorOptions {
        post_quantum: true,
        ..options(edge, protocol, 1)
    }
}

fn only_connection(edge: &MockEdge) -> ConnectionInfo {
    let conns = edge.connections();
    assert_eq!(conns.len(), 1, "{conns:?}");
    conns[0].clone()
}

/// Starts one connector with `opts`, waits until the edge serves through it,
/// and returns it with the key exchange group its connection negotiated.
async fn serve_once(
    edge: &MockEdge,
    opts: ConnectorOptions,
) -> (ConnectorHandle, Option<NamedGroup>) {
    let (handle, _m, _r) = start_connector(opts, token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    (handle, only_connection(edge).key_exchange_group)
}

async fn default_mode_negotiates_x25519mlkem768(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, group) = serve_once(&edge, options(&edge, protocol, 1)).await;
    assert_eq!(group, Some(NamedGroup::X25519MLKEM768));
    let records = edge.registrations();
    assert_eq!(records.len(), 1);
    assert!(
        !records[0]
            .features
            .iter()
            .any(|f| f == FEATURE_POST_QUANTUM),
        "{:?}",
        records[0].features
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn strict_mode_negotiates_x25519mlkem768_and_sends_the_feature(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, group) = serve_once(&edge, post_quantum(&edge, protocol)).await;
    assert_eq!(group, Some(NamedGroup::X25519MLKEM768));
    let records = edge.registrations();
    assert_eq!(records.len(), 1);
    let features = &records[0].features;
    assert!(features.iter().any(|f| f == "postquantum"), "{features:?}");
    for f in cftunnel_tunnel::FEATURES {
        assert!(features.iter().any(|g| g == f), "{f} missing: {features:?}");
    }
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn classic_edge_refuses_strict_mode_and_serves_default_mode_over_p256(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::builder()
        .key_exchange_groups([NamedGroup::X25519, NamedGroup::secp256r1])
        .start()
        .await
        .unwrap();

    // Strict: the handshake fails every time, nothing registers.
    let (strict, _m, registry) = start_connector(post_quantum(&edge, protocol), token());
    let failures = format!(
        "cftunnel_tunnel_registration_failures_total{{protocol=\"{}\",cause=\"dial\"}}",
        label(protocol)
    );
    while !metrics_text(&registry)
        .lines()
        .any(|l| l.starts_with(&failures) && !l.ends_with(" 0"))
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(strict.registered(), 0);
    assert!(edge.registrations().is_empty());
    assert!(edge.connections().is_empty(), "{:?}", edge.connections());
    strict.shutdown().await;

    // Default: X25519MLKEM768 is refused, the connector falls back to P-256.
    let (handle, group) = serve_once(&edge, options(&edge, protocol, 1)).await;
    assert_eq!(group, Some(NamedGroup::secp256r1));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(default_mode_negotiates_x25519mlkem768);
per_transport!(strict_mode_negotiates_x25519mlkem768_and_sends_the_feature);
per_transport!(classic_edge_refuses_strict_mode_and_serves_default_mode_over_p256);

#[test]
fn offered_groups_match_cloudflared() {
    use cftunnel_tunnel::tls::edge_key_exchange_groups;
    assert_eq!(
        edge_key_exchange_groups(false),
        vec![NamedGroup::X25519MLKEM768, NamedGroup::secp256r1]
    );
    assert_eq!(
        edge_key_exchange_groups(true),
        vec![NamedGroup::X25519MLKEM768]
    );
    assert_eq!(FEATURE_POST_QUANTUM, "postquantum");
}

#[tokio::test]
async fn mock_edge_refuses_unknown_key_exchange_groups() {
    let err = MockEdge::builder()
        .key_exchange_groups([NamedGroup::FFDHE2048])
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("FFDHE2048"), "{err}");
    assert_eq!(
        cftunnel_testkit::edge::key_exchange_group_by_name("x25519mlkem768"),
        Some(NamedGroup::X25519MLKEM768)
    );
    assert_eq!(
        cftunnel_testkit::edge::key_exchange_group_by_name("secp256r1"),
        Some(NamedGroup::secp256r1)
    );
    assert_eq!(
        cftunnel_testkit::edge::key_exchange_group_by_name("P256Kyber768Draft00"),
        None
    );
}

/// Whether AES-GCM runs on dedicated instructions, as Go decides it for its TLS defaults.
fn aes_gcm_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// A server certificate resolver that keeps the cipher suites each client hello offers.
#[derive(Debug)]
struct OfferedSuites {
    inner: Arc<dyn rustls::server::ResolvesServerCert>,
    offered: Mutex<Vec<rustls::CipherSuite>>,
}

impl rustls::server::ResolvesServerCert for OfferedSuites {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        *self.offered.lock().unwrap() = hello.cipher_suites().to_vec();
        self.inner.resolve(hello)
    }
}

/// The connector offers the suites in `cloudflared`'s order, and a server that follows
/// the client's order (as the mock edge does) settles on its first choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_connections_prefer_the_suites_cloudflared_prefers() {
    use rustls::CipherSuite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    tokio::time::timeout(LIMIT, async {
        let pki = TestPki::generate().unwrap();
        let mut server = pki.tcp_server(cftunnel_tunnel::tls::provider()).unwrap();
        let hello = Arc::new(OfferedSuites {
            inner: server.cert_resolver.clone(),
            offered: Mutex::new(Vec::new()),
        });
        server.cert_resolver = hello.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let opts = ConnectorOptions {
            protocol: Protocol::Http2,
            edges: vec![listener.local_addr().unwrap().into()],
            edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
            ha_connections: 1,
            ..ConnectorOptions::default()
        };
        let (handle, _m, _r) = start_connector(opts, token());
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.unwrap();

        let all = hello.offered.lock().unwrap().clone();
        let tls13 = |s: &rustls::CipherSuite| format!("{s:?}").starts_with("TLS13_");
        let offered: Vec<_> = all.iter().copied().filter(tls13).collect();
        let expected = if aes_gcm_in_hardware() {
            [
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
            ]
        } else {
            [
                TLS13_CHACHA20_POLY1305_SHA256,
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
            ]
        };
        assert_eq!(offered, expected);
        assert!(
            all.iter()
                .any(|s| format!("{s:?}").starts_with("TLS_ECDHE_")),
            "TLS 1.2 suites stay for the HTTP/2 transport: {all:?}"
        );
        assert_eq!(
            tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite()),
            Some(expected[0])
        );
        drop(handle);
    })
    .await
    .expect("test finished in time");
}
