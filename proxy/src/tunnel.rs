//! Tunnel mode: requests arriving through the native Cloudflare Tunnel connector are handed
//! straight to [`Proxy::handle`], in-process, with no network hop in between.

use crate::conn::ConnInfo;
use crate::proxy::Proxy;
use crate::upgrade::ClientUpgrade;
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use std::net::{IpAddr, SocketAddr};

use cftunnel_tunnel::Protocol;

/// The transport to dial: an `auto` tunnel whose table serves a GRPCRoute goes over HTTP/2,
/// because the edge carries no trailers over QUIC and gRPC's status is a trailer; a transport
/// the operator chose is kept.
pub fn transport_for(configured: Protocol, serves_grpc: bool) -> Protocol {
    match configured {
        Protocol::Auto if serves_grpc => Protocol::Http2,
        other => other,
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

/// Warns, once, when a table that serves gRPC arrives while the tunnel runs over a transport
/// other than HTTP/2: its gRPC responses lose their status until the proxy restarts (it then
/// dials HTTP/2) or `PROXY_TUNNEL_PROTOCOL=http2` is set.
pub async fn warn_on_grpc_without_http2(proxy: Proxy, dialed: Protocol) {
    if dialed == Protocol::Http2 {
        return;
    }
    let mut swaps = proxy.swaps();
    loop {
        if proxy.routes().has_grpc_route() {
            tracing::error!(
                transport = ?dialed,
                "a GRPCRoute is now served, but the tunnel runs over a transport that may carry \
                 no trailers (QUIC drops them, so gRPC loses its status): restart the proxy, \
                 which then dials HTTP/2, or set PROXY_TUNNEL_PROTOCOL=http2"
            );
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

    #[test]
    fn only_an_auto_tunnel_serving_grpc_changes_to_http2() {
        assert_eq!(transport_for(Protocol::Auto, true), Protocol::Http2);
        assert_eq!(transport_for(Protocol::Auto, false), Protocol::Auto);
        assert_eq!(transport_for(Protocol::Quic, true), Protocol::Quic);
        assert_eq!(transport_for(Protocol::Http2, false), Protocol::Http2);
    }
}
