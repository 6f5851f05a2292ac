//! Native Cloudflare Tunnel connector and a mock edge.

mod backoff;
mod body;
mod connector;
pub mod edge;
mod h2io;
mod http2;
pub mod metrics;
pub mod mock_edge;
mod quic;
pub mod rpc;
mod service;
pub mod stream;
pub mod tls;
pub mod token;

#[allow(clippy::all, clippy::unwrap_used, unreachable_pub, dead_code, missing_docs, unused_qualifications)]
#[rustfmt::skip]
#[path = "rpc/generated/tunnelrpc_capnp.rs"]
mod tunnelrpc_capnp;
#[allow(clippy::all, clippy::unwrap_used, unreachable_pub, dead_code, missing_docs, unused_qualifications)]
#[rustfmt::skip]
#[path = "rpc/generated/quic_metadata_protocol_capnp.rs"]
mod quic_metadata_protocol_capnp;

pub use body::{Body, BodyError, BoxError, OnUpgrade, UpgradeError, Upgraded};
pub use connector::{
    Connector, ConnectorError, ConnectorHandle, ConnectorOptions, Protocol, ProtocolError,
    DEFAULT_CLIENT_VERSION, FEATURES,
};
pub use edge::{EdgeAddr, EdgeAddrError};
pub use metrics::TunnelMetrics;
pub use rpc::control::{ConnectionDetails, EdgeRefusal};
pub use rpc::remote_config::RemoteConfig;
pub use token::{Token, TokenError};
