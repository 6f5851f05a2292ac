//! TLS key exchange with the edge, over real QUIC and TLS/TCP sockets on
//! 127.0.0.1: the connector offers groups as `cloudflared` does
//! (X25519MLKEM768, then P-256; only X25519MLKEM768 in strict post-quantum
//! mode) and the mock edge records what each handshake negotiated.
#![allow(clippy::unwrap_used)]

#[macro_use]
mod support;

use std::time::Duration;

use cftunnel_tunnel::mock_edge::{ConnectionInfo, MockEdge};
use cftunnel_tunnel::{ConnectorHandle, ConnectorOptions, Protocol, FEATURE_POST_QUANTUM};
use rustls::NamedGroup;
use support::*;

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
        cftunnel_tunnel::tls::key_exchange_group_by_name("x25519mlkem768"),
        Some(NamedGroup::X25519MLKEM768)
    );
    assert_eq!(
        cftunnel_tunnel::tls::key_exchange_group_by_name("secp256r1"),
        Some(NamedGroup::secp256r1)
    );
    assert_eq!(
        cftunnel_tunnel::tls::key_exchange_group_by_name("P256Kyber768Draft00"),
        None
    );
}
