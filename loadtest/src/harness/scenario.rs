//! What the load is pointed at. Each scenario is one enum variant plus one `start` function
//! that brings the server under test up and returns where to send requests; adding a
//! scenario means a variant, a module and a match arm.

mod direct;
mod nginx;
mod proxy;
pub mod tunnel;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::process::{CpuList, ProcessError, ServerProcess};

/// A server arrangement to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The load generator talks to the echo backend itself: the baseline.
    Direct,
    /// Through `cftunnel-proxy` in standalone mode, one rule forwarding to the echo backend.
    Proxy,
    /// Through nginx configured as the equivalent keep-alive reverse proxy.
    Nginx,
    /// Through the mock edge's HTTP listener, a QUIC tunnel connection and `cftunnel-proxy`
    /// in tunnel mode (same rule as `proxy`).
    TunnelQuic,
    /// As `tunnel-quic`, over the HTTP/2 (TLS over TCP) tunnel transport.
    TunnelHttp2,
    /// As `tunnel-quic`, with the load generator playing the edge: an in-process mock edge
    /// puts each request straight onto a tunnel stream, with no HTTP hop in front of it.
    TunnelQuicEdge,
    /// As `tunnel-quic-edge`, over the HTTP/2 tunnel transport.
    TunnelHttp2Edge,
    /// As `tunnel-quic-edge` with `cloudflared` in the proxy's place, forwarding to the echo
    /// backend itself (one catch-all ingress rule): the connector users run today, measured
    /// on the same path, CPUs and load.
    CloudflaredQuicEdge,
    /// As `cloudflared-quic-edge`, over the HTTP/2 tunnel transport.
    CloudflaredHttp2Edge,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Proxy => "proxy",
            Self::Nginx => "nginx",
            Self::TunnelQuic => "tunnel-quic",
            Self::TunnelHttp2 => "tunnel-http2",
            Self::TunnelQuicEdge => "tunnel-quic-edge",
            Self::TunnelHttp2Edge => "tunnel-http2-edge",
            Self::CloudflaredQuicEdge => "cloudflared-quic-edge",
            Self::CloudflaredHttp2Edge => "cloudflared-http2-edge",
        }
    }

    /// Requests cross a tunnel connection (and are compared with `proxy`).
    pub fn is_tunnel(self) -> bool {
        matches!(
            self,
            Self::TunnelQuic | Self::TunnelHttp2 | Self::TunnelQuicEdge | Self::TunnelHttp2Edge
        )
    }

    /// What the load adds to every request in this scenario ([`EDGE_HEADERS`]): nothing on a
    /// tunnel path, where the edge and the connector add them.
    pub fn edge_headers(self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        let sets_forwarding = match self {
            Self::Proxy => true,
            Self::Direct | Self::Nginx => false,
            _ => return Vec::new(),
        };
        EDGE_HEADERS
            .iter()
            .filter(|(name, _)| !(sets_forwarding && name.starts_with("x-forwarded-")))
            .map(|&(name, value)| {
                (
                    http::HeaderName::from_static(name),
                    http::HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    /// Requests cross `cloudflared` instead of the proxy.
    pub fn is_cloudflared(self) -> bool {
        matches!(self, Self::CloudflaredQuicEdge | Self::CloudflaredHttp2Edge)
    }

    /// The `cloudflared` scenario on the same path and transport as this tunnel scenario.
    pub fn cloudflared_counterpart(self) -> Option<Self> {
        match self {
            Self::TunnelQuicEdge => Some(Self::CloudflaredQuicEdge),
            Self::TunnelHttp2Edge => Some(Self::CloudflaredHttp2Edge),
            _ => None,
        }
    }

    /// Brings the scenario's server under test up.
    pub async fn start(self, env: &ScenarioEnv<'_>) -> Result<Target, StartError> {
        match self {
            Self::Direct => direct::start(env).await,
            Self::Proxy => proxy::start(env).await,
            Self::Nginx => nginx::start(env).await,
            Self::TunnelQuic => {
                tunnel::start(env, tunnel::Transport::Quic, tunnel::Connector::Proxy).await
            }
            Self::TunnelHttp2 => {
                tunnel::start(env, tunnel::Transport::Http2, tunnel::Connector::Proxy).await
            }
            Self::TunnelQuicEdge => {
                tunnel::start_in_process(env, tunnel::Transport::Quic, tunnel::Connector::Proxy)
                    .await
            }
            Self::TunnelHttp2Edge => {
                tunnel::start_in_process(env, tunnel::Transport::Http2, tunnel::Connector::Proxy)
                    .await
            }
            Self::CloudflaredQuicEdge => {
                tunnel::start_in_process(
                    env,
                    tunnel::Transport::Quic,
                    tunnel::Connector::Cloudflared,
                )
                .await
            }
            Self::CloudflaredHttp2Edge => {
                tunnel::start_in_process(
                    env,
                    tunnel::Transport::Http2,
                    tunnel::Connector::Cloudflared,
                )
                .await
            }
        }
    }
}

/// `Host` header of every load request, the same in all scenarios so the bytes on the wire
/// are identical.
pub const LOAD_HOST: &str = "loadtest.example";

/// The headers a tunnel path adds on the way to the origin: the edge's (`Cf-Connecting-Ip`,
/// `X-Forwarded-For`, `X-Forwarded-Proto`, `Cf-Visitor`, `Cf-Ray`, `CDN-Loop`, as the mock edge
/// sets them) and the connector's tag (`Cf-Warp-Tag-Id`, a UUID). On the plain paths the load
/// sends them itself, so the origin gets the same header names on every path and, as the echo
/// backend answers with the headers it got, an answer of the same length (within a byte: the
/// proxy says `http` where the edge says `https`): what a tunnel scenario is compared on is
/// then the tunnel, not the size of the request and answer. `X-Forwarded-For` and `-Proto`
/// are left to the proxy on its own listener, which sets them as the edge does.
const EDGE_HEADERS: [(&str, &str); 7] = [
    ("cf-connecting-ip", "127.0.0.1"),
    ("x-forwarded-for", "127.0.0.1"),
    ("x-forwarded-proto", "https"),
    ("cf-visitor", r#"{"scheme":"https"}"#),
    ("cf-ray", "8f2c41d07a93be65-MCK"),
    ("cdn-loop", "cloudflare"),
    ("cf-warp-tag-id", "6c1f4b2e-93d7-4a58-b0e1-7f25d8c9a346"),
];

/// What every scenario may use.
pub struct ScenarioEnv<'a> {
    /// The echo backend's HTTP address (already running).
    pub echo_addr: SocketAddr,
    /// Worker threads / processes for the server under test.
    pub workers: usize,
    /// HA tunnel connections of the proxy in the tunnel scenarios.
    pub tunnel_connections: usize,
    /// CPUs for the server under test; `None` disables pinning.
    pub server_cpus: Option<&'a CpuList>,
    /// The `cftunnel-proxy` binary.
    pub proxy_bin: &'a Path,
    /// The `cftunnel-mock-edge` binary (tunnel scenarios).
    pub edge_bin: &'a Path,
    /// CPUs for helper processes on the client side of the measurement (the mock edge): the
    /// load generator's CPUs. `None` disables pinning.
    pub client_cpus: Option<&'a CpuList>,
    /// The nginx binary, if one was found.
    pub nginx_bin: Option<&'a PathBuf>,
    /// The `cloudflared` binary, if one was given or found.
    pub cloudflared_bin: Option<&'a Path>,
    /// Directory for generated configs and logs.
    pub scratch: &'a Path,
}

/// A started scenario: where to send load, and the processes to watch and stop.
pub struct Target {
    pub addr: SocketAddr,
    /// `Host` header to send.
    pub host: String,
    /// The server under test, when the scenario started one; its CPU and memory are reported.
    pub server: Option<ServerProcess>,
    /// Processes the scenario needs in front of the server (the mock edge), stopped after
    /// it; the first one's CPU time is reported apart from the server's.
    pub helpers: Vec<ServerProcess>,
    /// An in-process mock edge the load goes through instead of `addr`.
    pub edge: Option<InProcessEdge>,
}

/// A mock edge running inside the load generator.
#[derive(Clone)]
pub struct InProcessEdge(pub std::sync::Arc<cftunnel_testkit::edge::MockEdge>);

impl std::fmt::Debug for InProcessEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InProcessEdge({})", self.0.edge_addr())
    }
}

impl Target {
    pub async fn stop(self) {
        if let Some(server) = self.server {
            server.stop().await;
        }
        for helper in self.helpers {
            helper.stop().await;
        }
        if let Some(edge) = self.edge {
            if let Ok(edge) = std::sync::Arc::try_unwrap(edge.0) {
                edge.shutdown().await;
            }
        }
    }
}

/// Why a scenario did not run.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A prerequisite is missing (e.g. nginx not installed); not a failure of the product.
    #[error("{0}")]
    Skipped(String),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no free port: {0}")]
    Port(std::io::Error),
    #[error("{0}")]
    NotReady(String),
}

impl StartError {
    pub fn is_skip(&self) -> bool {
        matches!(self, Self::Skipped(_))
    }
}
