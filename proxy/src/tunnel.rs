//! Tunnel mode: requests arriving through the native Cloudflare Tunnel connector are handed
//! straight to [`Proxy::handle`], in-process, with no network hop in between.

use crate::body::ResponseBody;
use crate::proxy::{ClientUpgrade, ConnInfo, Proxy};
use http::{HeaderName, Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

/// Parsed once: a `&str` key is re-validated as a header name on every lookup.
static CF_CONNECTING_IP: HeaderName = HeaderName::from_static("cf-connecting-ip");

/// The connector's view of the proxy: a `hyper` service over tunnel request bodies.
#[derive(Debug, Clone)]
pub struct TunnelService {
    proxy: Proxy,
}

impl TunnelService {
    pub fn new(proxy: Proxy) -> Self {
        Self { proxy }
    }
}

impl hyper::service::Service<Request<cftunnel_tunnel::Body>> for TunnelService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

    fn call(&self, mut req: Request<cftunnel_tunnel::Body>) -> Self::Future {
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
        Box::pin(async move { Ok(proxy.handle(req, info).await) })
    }
}
