//! What a connector is built with: its transport, edges, timeouts and what it tells the edge
//! about itself. `Default` gives `cloudflared`'s defaults.

use std::str::FromStr;
use std::time::Duration;

use crate::edge::{EdgeAddr, EdgeIpVersion};

/// Version string sent in `ClientInfo.version` unless overridden.
pub const DEFAULT_CLIENT_VERSION: &str = "2026.8.2";

/// Features advertised in `ClientInfo.features`: only what this connector
/// implements (no datagrams, no management logs).
pub const FEATURES: &[&str] = &[
    "allow_remote_config",
    "serialized_headers",
    "support_quic_eof",
];

/// Feature added to `ClientInfo.features` in strict post-quantum mode
/// ([`ConnectorOptions::post_quantum`]), as `cloudflared --post-quantum` does.
pub const FEATURE_POST_QUANTUM: &str = "postquantum";

/// `PROXY_TUNNEL_PROTOCOL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// QUIC first; a connection moves to HTTP/2 when QUIC keeps failing and
    /// no connection ever registered over QUIC, and back to QUIC after an
    /// HTTP/2 connection that registered is lost. After
    /// [`ConnectorHandle::prefer_http2`](crate::ConnectorHandle::prefer_http2),
    /// connections move to HTTP/2 one at a time and stay there; started with
    /// [`Connector::prefer_http2`](crate::Connector::prefer_http2), they dial
    /// HTTP/2 first. Where the edge does not take HTTP/2 (three failed attempts
    /// in a row) and QUIC reaches it, the preference is given up and the tunnel
    /// runs on QUIC until HTTP/2 is tried again
    /// ([`ConnectorOptions::http2_retry`]); where QUIC fails as well (an
    /// outage), HTTP/2 stays preferred.
    #[default]
    Auto,
    /// QUIC only.
    Quic,
    /// HTTP/2 only.
    Http2,
}

/// A protocol name other than `auto`, `quic` or `http2`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tunnel protocol {0:?} is not one of auto, quic, http2")]
pub struct ProtocolError(pub String);

impl FromStr for Protocol {
    type Err = ProtocolError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "quic" => Ok(Self::Quic),
            "http2" => Ok(Self::Http2),
            other => Err(ProtocolError(other.to_owned())),
        }
    }
}

/// Connector settings. `Default` gives `cloudflared`'s defaults.
#[derive(Debug, Clone)]
pub struct ConnectorOptions {
    /// Transport choice.
    pub protocol: Protocol,
    /// Static edges (`--edge`, `TUNNEL_EDGE`); repeat an entry for more HA
    /// connections to one listener. Empty: SRV discovery (region from the
    /// `region` or the token's `e`), then, for the global edge, the well-known region hosts.
    pub edges: Vec<EdgeAddr>,
    /// PEM roots replacing all others (`--edge-ca-file`, `TUNNEL_CACERT`).
    pub edge_ca_pem: Option<Vec<u8>>,
    /// Edge region to discover (`cloudflared --region`, `TUNNEL_REGION`; `us`
    /// is Cloudflare's US-only edge): SRV discovery asks for
    /// `_<region>-v2-origintunneld` as it does for a token's endpoint. `None`
    /// or empty: the token's endpoint, else the global edge. Refused with a
    /// token that has an endpoint, as in `cloudflared`.
    pub region: Option<String>,
    /// Address family of discovered edges (`--edge-ip-version`,
    /// `TUNNEL_EDGE_IP_VERSION`; default `auto`). Static edges are used as
    /// given, as in `cloudflared`.
    pub edge_ip_version: EdgeIpVersion,
    /// HA connections (default 4), capped at the number of edge entries.
    pub ha_connections: usize,
    /// How long a drain holds each connection open, from the start of the
    /// drain, unregistering included (default 30 s, `cloudflared`'s
    /// `--grace-period`).
    pub grace_period: Duration,
    /// Per-call RPC timeout (default 5 s).
    pub rpc_timeout: Duration,
    /// Backoff exponent cap (default 5, `cloudflared --retries`): reconnect waits are random
    /// below 2 s, 4 s, ... 32 s, then below 32 s for as long as it takes, plus up to 320 s
    /// more for connections other than the first. (`cloudflared` waits the same, though
    /// once capped its log announces "up to 1m4s".)
    pub retries: u32,
    /// Backoff base (default 1 s).
    pub backoff_base: Duration,
    /// Base of the backoff shared by connections other than the first, which
    /// they wait out after their own before restarting (default 10 s, as in
    /// `cloudflared`).
    pub ha_backoff_base: Duration,
    /// Delay between starting HA connections once the first registered
    /// (default 1 s).
    pub ha_start_interval: Duration,
    /// QUIC handshake timeout (default 10 s, as `cloudflared`'s; a handshake
    /// that hears nothing from the edge ends after the 5 s idle timeout).
    pub handshake_timeout: Duration,
    /// `ClientInfo.version`.
    pub client_version: String,
    /// Strict post-quantum key exchange (`cloudflared --post-quantum`): TLS
    /// offers only X25519MLKEM768, so an edge without it fails the handshake,
    /// and registration adds the `postquantum` feature. Default (false):
    /// X25519MLKEM768 preferred, P-256 as the fallback; see
    /// [`edge_key_exchange_groups`](crate::tls::edge_key_exchange_groups).
    pub post_quantum: bool,
    /// Concurrent request streams the edge may open on one tunnel connection, QUIC or
    /// HTTP/2 (default [`DEFAULT_QUIC_MAX_STREAMS`];
    /// at least 1). Further requests wait at the edge for a stream to finish.
    /// Memory grows with it: each stream of credit a QUIC connection has used keeps
    /// about 480 bytes, so 16,384 comes to about 7.4 MiB per connection under
    /// sustained load. (`cloudflared` bounds neither transport.)
    pub quic_max_streams: u32,
    /// HTTP/2 liveness (default 15 s): a PING goes to the edge after this long, and a
    /// connection that then hears nothing at all for as long again is dropped and redialed,
    /// as QUIC's idle timeout does. `cloudflared` relies on TCP keep-alive alone (150 s, or
    /// as long as retransmission takes when data is in flight). At least 1 ms.
    pub http2_keepalive: Duration,
    /// How long a write of a response to the edge may stay blocked before that stream is reset
    /// (default 60 s, nginx's `send_timeout`): a QUIC write, or a wait for HTTP/2 stream
    /// capacity. The edge stops taking a response when its eyeball stops reading; unbounded,
    /// such a stream would keep the service's response (and the backend connection behind
    /// it), its place in flight and its stream credit for as long as the eyeball stays
    /// connected. The timer runs only while a write waits and starts over with every write
    /// that goes through, so a response slow to come from the service, or one its eyeball
    /// reads slowly but steadily, is not cut. Other streams and the connection are untouched.
    pub send_timeout: Duration,
    /// How long an `auto` connector that prefers HTTP/2
    /// ([`ConnectorHandle::prefer_http2`](crate::ConnectorHandle::prefer_http2)) runs on QUIC
    /// after giving HTTP/2 up, before it tries HTTP/2 again (default 5 min; at least 1 s,
    /// else [`Connector::new`](crate::Connector::new) refuses it). Doubled each time HTTP/2 is
    /// given up again with no connection registered over it in between, up to an hour (or
    /// this, if longer): a path that never carries HTTP/2 has a connection taken down for
    /// nothing once an hour at most. (An outage of the edge or the network, which QUIC does
    /// not get through either, does not have HTTP/2 given up: see
    /// [`ConnectorHandle::prefer_http2`](crate::ConnectorHandle::prefer_http2).)
    pub http2_retry: Duration,
}

impl Default for ConnectorOptions {
    fn default() -> Self {
        Self {
            protocol: Protocol::Auto,
            edges: Vec::new(),
            edge_ca_pem: None,
            region: None,
            edge_ip_version: EdgeIpVersion::Auto,
            ha_connections: 4,
            grace_period: Duration::from_secs(30),
            rpc_timeout: Duration::from_secs(5),
            retries: 5,
            backoff_base: Duration::from_secs(1),
            ha_backoff_base: Duration::from_secs(10),
            ha_start_interval: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            client_version: DEFAULT_CLIENT_VERSION.to_owned(),
            post_quantum: false,
            quic_max_streams: DEFAULT_QUIC_MAX_STREAMS,
            http2_keepalive: Duration::from_secs(15),
            send_timeout: Duration::from_secs(60),
            http2_retry: DEFAULT_HTTP2_RETRY,
        }
    }
}

/// Default for [`ConnectorOptions::http2_retry`].
pub(crate) const DEFAULT_HTTP2_RETRY: Duration = Duration::from_secs(5 * 60);

/// Default for [`ConnectorOptions::quic_max_streams`]: concurrent edge-opened
/// request streams allowed per connection. `cloudflared` advertises 2^60;
/// quinn keeps state for every stream the credit allows (a few hundred bytes
/// each once used), so the limit is a large practical number instead. The
/// credit is renewed as streams finish.
pub const DEFAULT_QUIC_MAX_STREAMS: u32 = 16_384;
