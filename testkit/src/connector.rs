//! Fixtures for a connector under test facing the mock edge: credentials and options.

use std::time::Duration;

use cftunnel_tunnel::{ConnectorOptions, Protocol, Token};

use crate::edge::MockEdge;

/// Tunnel credentials for a test: a fresh tunnel id each call. The mock edge accepts any
/// unless it was started with [`credentials`](crate::edge::MockEdgeBuilder::credentials).
pub fn token() -> Token {
    Token::new("test-account", vec![7u8; 32], uuid::Uuid::new_v4())
}

/// Options for a connector with `ha` connections of `protocol` to `edge`, trusting its CA,
/// with the timers short enough for tests: a 2 s grace period, a 3 s RPC timeout, 50 ms
/// backoffs and a 2 s handshake timeout.
pub fn options(edge: &MockEdge, protocol: Protocol, ha: usize) -> ConnectorOptions {
    ConnectorOptions {
        protocol,
        edges: vec![edge.edge_addr().into(); ha],
        edge_ca_pem: Some(edge.ca_pem().as_bytes().to_vec()),
        ha_connections: ha,
        // A drain holds its connections for the whole grace period: kept short here.
        grace_period: Duration::from_secs(2),
        rpc_timeout: Duration::from_secs(3),
        backoff_base: Duration::from_millis(50),
        ha_backoff_base: Duration::from_millis(50),
        ha_start_interval: Duration::from_millis(20),
        handshake_timeout: Duration::from_secs(2),
        ..ConnectorOptions::default()
    }
}
