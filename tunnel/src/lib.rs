//! Native Cloudflare Tunnel connector (QUIC and HTTP/2 transports).
//!
//! The connector dials Cloudflare's edge the way `cloudflared` does, registers
//! its connections over Cap'n Proto RPC, and hands every request arriving
//! through the tunnel to an in-process [`hyper::service::Service`]. There is no
//! local socket between the tunnel and the service. Routing is left to the
//! service.
//!
//! # Wiring a service
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cftunnel_tunnel::{Body, Connector, ConnectorOptions, Protocol, Token, TunnelMetrics};
//! use http_body_util::Full;
//!
//! let token: Token = std::env::var("TUNNEL_TOKEN")?.parse()?;
//! let opts = ConnectorOptions {
//!     protocol: "auto".parse::<Protocol>()?,
//!     ..ConnectorOptions::default()
//! };
//! let mut registry = prometheus_client::registry::Registry::default();
//! let metrics = TunnelMetrics::register(&mut registry);
//! let service = hyper::service::service_fn(|req: http::Request<Body>| async move {
//!     let _ = req;
//!     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from("hi"))))
//! });
//! let handle = Connector::new(token, opts)?.start(service, metrics)?;
//! // Readiness: at least one connection registered right now.
//! let ready = handle.registered() > 0;
//! # let _ = ready;
//! // On SIGTERM: unregister every connection, keep serving for the grace
//! // period (in-flight requests, and any the edge still routes), then close
//! // with code 0.
//! handle.drain().await;
//! # Ok(()) }
//! ```
//!
//! # Requests as the service sees them
//!
//! - The URI is in absolute form (`https://host/path?query`, scheme and
//!   authority from the edge), the `Host` header is always set to the
//!   eyeball's host (`HttpHost` over QUIC, `:authority` over HTTP/2), and the
//!   version is HTTP/1.1 on both transports. Over QUIC, bytes in the path or
//!   query that Go's URL parser takes (as `cloudflared` does) but
//!   [`http::Uri`] does not, such as a raw space, `<`, `>` or bytes that are
//!   not UTF-8, arrive percent-encoded; a control character is refused.
//! - The body is a [`Body`] that streams from the edge as it is polled, so a
//!   slow service slows the eyeball (backpressure). Over QUIC a body is only
//!   present when the eyeball sent `Content-Length` or chunked
//!   `Transfer-Encoding`, as on the edge. HTTP/2 request trailers are
//!   delivered as body trailers.
//! - Response bodies are streamed back with flow control; response trailers
//!   are forwarded over HTTP/2 (gRPC) and dropped over QUIC, which cannot carry
//!   them (as with `cloudflared`). A drop is counted
//!   (`cftunnel_tunnel_dropped_response_trailers_total`) and logged as a
//!   warning at most once a minute.
//! - A service error is reported to the edge as a connector error (the
//!   eyeball sees a 502); an error while streaming a response body resets
//!   that stream only, as does a write the edge has taken nothing of for
//!   [`ConnectorOptions::send_timeout`] (an eyeball that stopped reading),
//!   which drops the response body.
//!
//! # WebSocket and other upgrades
//!
//! WebSocket requests carry an [`OnUpgrade`] in their extensions (and
//! `Connection: Upgrade`, `Upgrade: websocket` headers, as `cloudflared` adds
//! them towards origins). To accept, the service answers
//! `101 Switching Protocols` and takes the extension; once the 101 has been
//! written to the edge, the [`OnUpgrade`] future resolves to an [`Upgraded`]
//! byte stream (`AsyncRead + AsyncWrite`) carrying the raw WebSocket frames
//! in both directions. Any other status leaves the request un-upgraded and
//! the future fails with [`UpgradeError`].
//!
//! ```no_run
//! # fn demo(mut req: http::Request<cftunnel_tunnel::Body>) {
//! if let Some(on_upgrade) = req.extensions_mut().remove::<cftunnel_tunnel::OnUpgrade>() {
//!     tokio::spawn(async move {
//!         if let Ok(mut stream) = on_upgrade.await {
//!             // copy between `stream` and the backend's upgraded connection
//!             let _ = &mut stream;
//!         }
//!     });
//!     // ...then return a 101 response (with the backend's Sec-WebSocket-Accept).
//! }
//! # }
//! ```
//!
//! # What is left out
//!
//! - Private-network TCP streams and UDP/ICMP datagrams: not advertised;
//!   TCP stream requests are answered with an error.
//! - `updateLocalConfiguration`: configuration comes from the proxy's own
//!   config API, not from a local ingress, so none is pushed. Remote pushes
//!   from the edge are acknowledged and exposed through
//!   [`ConnectorHandle::remote_config`].
//!
//! # The edge's side
//!
//! The crate does not play the edge, but it makes public the pieces an edge shares with a
//! connector, so that a test edge speaks the same wire format from the same code: stream
//! framing and head codecs ([`stream`]), the HTTP/2 byte-stream adapters ([`h2io`]), RPC
//! sessions ([`rpc::LocalWorker`], [`rpc::RpcStream`], the [`tunnelrpc_capnp`] schema),
//! the UDP socket under QUIC endpoints ([`udp::endpoint`]), HTTP/2 liveness
//! ([`liveness`]) and the TLS provider and names ([`tls`]).

mod backoff;
mod body;
mod connection;
mod connector;
pub mod discovery;
pub mod edge;
pub mod h2io;
mod http2;
pub mod liveness;
pub mod metrics;
mod options;
mod preference;
mod quic;
pub mod rpc;
mod send_timeout;
mod service;
pub mod stream;
mod tasks;
pub mod tls;
mod trailers;
/// The connector token, whose format lives with the config contract in `cftunnel-config`.
pub mod token {
    pub use cftunnel_config::{Token, TokenError};
}
pub mod udp;

/// The tunnel's Cap'n Proto schema (`tunnelrpc.capnp`), generated: the registration and
/// configuration interfaces both ends of an RPC session implement or call.
#[allow(clippy::all, clippy::unwrap_used, unreachable_pub, dead_code, missing_docs, unused_qualifications)]
#[rustfmt::skip]
#[path = "rpc/generated/tunnelrpc_capnp.rs"]
pub mod tunnelrpc_capnp;
#[allow(clippy::all, clippy::unwrap_used, unreachable_pub, dead_code, missing_docs, unused_qualifications)]
#[rustfmt::skip]
#[path = "rpc/generated/quic_metadata_protocol_capnp.rs"]
mod quic_metadata_protocol_capnp;

pub use body::{Body, BodyError, BoxError, OnUpgrade, UpgradeError, Upgraded};
pub use cftunnel_config::{Token, TokenError};
pub use connector::{Connector, ConnectorError, ConnectorHandle};
pub use edge::{EdgeAddr, EdgeAddrError, EdgeIpVersion, EdgeIpVersionError};
pub use metrics::TunnelMetrics;
pub use options::{
    ConnectorOptions, Protocol, ProtocolError, DEFAULT_CLIENT_VERSION, DEFAULT_QUIC_MAX_STREAMS,
    FEATURES, FEATURE_POST_QUANTUM,
};
pub use rpc::control::{ConnectionDetails, EdgeRefusal};
pub use rpc::remote_config::RemoteConfig;
pub use service::{Handler, HandlerFuture, ResponseBody};
