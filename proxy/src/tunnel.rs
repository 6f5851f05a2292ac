//! Tunnel mode: requests arriving through the native Cloudflare Tunnel connector are handed
//! straight to [`Proxy::handle`], in-process, with no network hop in between.

use crate::conn::ConnInfo;
use crate::proxy::Proxy;
use crate::routes::Routes;
use crate::upgrade::ClientUpgrade;
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use std::net::{IpAddr, SocketAddr};

use cftunnel_tunnel::Protocol;

/// Why a table's responses may need trailers, which the edge carries over HTTP/2 and not
/// over QUIC (gRPC's status is a trailer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailersNeeded {
    /// The table serves a GRPCRoute (`hasGrpcRoute`).
    GrpcRoute,
    /// A rule's backend is marked `h2c`: how gRPC is served through an HTTPRoute.
    H2cBackend,
}

impl TrailersNeeded {
    /// Why, for a table, if it needs them at all. A GRPCRoute is named first.
    pub fn of(routes: &Routes) -> Option<Self> {
        if routes.has_grpc_route() {
            Some(Self::GrpcRoute)
        } else if routes.has_h2c_backend() {
            Some(Self::H2cBackend)
        } else {
            None
        }
    }

    /// How logs name the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GrpcRoute => "a GRPCRoute",
            Self::H2cBackend => "an h2c backend",
        }
    }
}

/// Waits until a table is loaded (from the config file or the first push). The connector
/// registers only then: the edge sends a registered connection its share of the tunnel's
/// requests at once, and a proxy without routes could only answer them 502.
pub async fn await_first_table(proxy: &Proxy) {
    let mut swaps = proxy.swaps();
    while !proxy.is_loaded() {
        if swaps.changed().await.is_err() {
            return;
        }
    }
}

/// Moves an `auto` tunnel running over QUIC to HTTP/2 once a table that needs trailers (a
/// GRPCRoute, or an `h2c` backend as gRPC through an HTTPRoute has) is loaded: the edge
/// carries no trailers over QUIC, so gRPC would lose its status. Tables usually come in
/// order (a Gateway's routes, then its GRPCRoutes), so the first one may well serve no gRPC
/// and have the tunnel dial QUIC. The connector replaces its QUIC connections one at a time
/// without dropping requests, and stays on HTTP/2 if gRPC goes away again.
pub async fn http2_once_trailers_needed(proxy: Proxy, tunnel: cftunnel_tunnel::ConnectorHandle) {
    let mut swaps = proxy.swaps();
    loop {
        if let Some(needs) = TrailersNeeded::of(&proxy.routes()) {
            if tunnel.prefer_http2() {
                tracing::info!(
                    reason = needs.as_str(),
                    "the table serves gRPC: the tunnel moves its connections to HTTP/2, one at \
                     a time, since HTTP/2 carries the trailers gRPC needs (QUIC does not)"
                );
            }
            return;
        }
        if swaps.changed().await.is_err() {
            return;
        }
    }
}

/// Logs, once, when a table that needs trailers (a GRPCRoute, or an `h2c` backend as gRPC
/// through an HTTPRoute has) is served while the tunnel is forced to QUIC: its gRPC responses
/// lose their status, and only `PROXY_TUNNEL_PROTOCOL=http2` helps. A GRPCRoute is an error;
/// an `h2c` backend, which may not be gRPC, a warning. Any other transport returns at once:
/// HTTP/2 carries trailers, and `auto` moves to it (see [`http2_once_trailers_needed`]).
pub async fn warn_on_trailers_without_http2(proxy: Proxy, dialed: Protocol) {
    if dialed != Protocol::Quic {
        return;
    }
    let mut swaps = proxy.swaps();
    loop {
        if let Some(needs) = TrailersNeeded::of(&proxy.routes()) {
            let reason = needs.as_str();
            match needs {
                TrailersNeeded::GrpcRoute => tracing::error!(
                    transport = ?dialed,
                    reason,
                    "the table serves gRPC, but the tunnel runs over QUIC, which drops \
                     trailers, so gRPC loses its status: set PROXY_TUNNEL_PROTOCOL=http2"
                ),
                TrailersNeeded::H2cBackend => tracing::warn!(
                    transport = ?dialed,
                    reason,
                    "a rule's backend speaks h2c, as gRPC backends do, but the tunnel runs over \
                     QUIC, which drops trailers, so gRPC loses its status: set \
                     PROXY_TUNNEL_PROTOCOL=http2"
                ),
            }
            return;
        }
        if swaps.changed().await.is_err() {
            return;
        }
    }
}

/// Parsed once: a `&str` key is re-validated as a header name on every lookup.
static CF_CONNECTING_IP: HeaderName = HeaderName::from_static("cf-connecting-ip");

/// The connector's view of the proxy: each request's future is boxed once, where the
/// connector takes it.
#[derive(Debug, Clone)]
pub struct TunnelService {
    proxy: Proxy,
}

impl TunnelService {
    pub fn new(proxy: Proxy) -> Self {
        Self { proxy }
    }
}

impl cftunnel_tunnel::Handler for TunnelService {
    fn call(&self, mut req: Request<cftunnel_tunnel::Body>) -> cftunnel_tunnel::HandlerFuture {
        if let Some(on_upgrade) = req.extensions_mut().remove::<cftunnel_tunnel::OnUpgrade>() {
            req.extensions_mut().insert(ClientUpgrade::new(on_upgrade));
        }
        // The edge terminated the client's connection and states who it was; its forwarding
        // headers are authoritative, the client's own are not reachable from here.
        let peer = req
            .headers()
            .get(&CF_CONNECTING_IP)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 0));
        let info = ConnInfo {
            peer,
            scheme: "https",
            trusted_forwarding: true,
        };
        let proxy = self.proxy.clone();
        Box::pin(async move {
            let response = proxy.handle(req, info).await;
            Ok(response.map(BodyExt::boxed_unsync))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{compile, Cache};
    use crate::metrics::ProxyMetrics;

    /// What a compiled table says it needs: a GRPCRoute, or (an HTTPRoute serving gRPC) a
    /// rule whose backend is marked `h2c`; not an `h2c` mirror, whose answers go nowhere, nor
    /// a TLS backend that only may pick HTTP/2.
    #[test]
    fn a_table_needs_trailers_for_a_grpc_route_or_an_h2c_backend() {
        let metrics = ProxyMetrics::register(&mut prometheus_client::registry::Registry::default());
        let mut cache = Cache::default();
        let mut needs = |doc: serde_json::Value| {
            let doc: cftunnel_config::Config = serde_json::from_value(doc).expect("a document");
            let routes = compile(&doc, &metrics, &mut cache).expect("compiles");
            TrailersNeeded::of(&routes)
        };
        let plain = serde_json::json!({"url": "http://127.0.0.1:8080", "weight": 1});
        let h2c =
            serde_json::json!({"url": "http://127.0.0.1:8081", "weight": 1, "protocol": "h2c"});
        let tls =
            serde_json::json!({"url": "https://backend.example:8443", "weight": 1, "tls": {}});
        let mirror = serde_json::json!([{"type": "RequestMirror", "requestMirror":
            {"backendUrl": "http://127.0.0.1:8082", "percent": 100, "protocol": "h2c"}}]);
        let cases = [
            (serde_json::json!({"rules": [{"backends": [plain]}]}), None),
            (
                serde_json::json!({"hasGrpcRoute": true, "rules": [{"backends": [h2c]}]}),
                Some(TrailersNeeded::GrpcRoute),
            ),
            (
                serde_json::json!({"rules": [{"backends": [plain]}, {"backends": [plain, h2c]}]}),
                Some(TrailersNeeded::H2cBackend),
            ),
            (
                serde_json::json!({"rules": [{"backends": [plain], "filters": mirror}]}),
                None,
            ),
            (serde_json::json!({"rules": [{"backends": [tls]}]}), None),
        ];
        for (doc, expected) in cases {
            assert_eq!(needs(doc.clone()), expected, "{doc}");
        }
    }
}
