//! Prometheus metrics of the tunnel connector.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Transport label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolLabel {
    /// QUIC transport.
    Quic,
    /// HTTP/2 transport.
    Http2,
}

/// Why a connection attempt failed; bounded label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// Could not reach the edge (socket, QUIC or TLS handshake).
    Dial,
    /// The edge already has this connection (`EDUPCONN`).
    Duplicate,
    /// The edge rejected the credentials.
    Unauthorized,
    /// Any other cause the edge returned.
    ServerError,
    /// The control stream or the registration RPC on it failed or timed out.
    Rpc,
}

impl ProtocolLabel {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quic => "quic",
            Self::Http2 => "http2",
        }
    }
}

impl EncodeLabelValue for ProtocolLabel {
    fn encode(&self, enc: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        enc.write_str(self.as_str())
    }
}

impl FailureCause {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dial => "dial",
            Self::Duplicate => "dup_edge_conn",
            Self::Unauthorized => "unauthorized",
            Self::ServerError => "server_error",
            Self::Rpc => "rpc",
        }
    }
}

impl EncodeLabelValue for FailureCause {
    fn encode(&self, enc: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        enc.write_str(self.as_str())
    }
}

/// `{protocol}` labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProtocolLabels {
    /// Transport.
    pub protocol: ProtocolLabel,
}

/// `{protocol, cause}` labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FailureLabels {
    /// Transport.
    pub protocol: ProtocolLabel,
    /// Cause.
    pub cause: FailureCause,
}

/// Connector metrics. Cheap to clone; all clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct TunnelMetrics {
    pub(crate) connections: Family<ProtocolLabels, Gauge>,
    pub(crate) registrations: Family<ProtocolLabels, Counter>,
    pub(crate) failures: Family<FailureLabels, Counter>,
    pub(crate) reconnects: Family<ProtocolLabels, Counter>,
    pub(crate) active_streams: Family<ProtocolLabels, Gauge>,
    pub(crate) config_version: Gauge,
    pub(crate) dropped_trailers: Counter,
}

impl TunnelMetrics {
    /// Registers the metrics:
    /// `cftunnel_tunnel_connections{protocol}` (registered edge connections now),
    /// `cftunnel_tunnel_registrations_total{protocol}`,
    /// `cftunnel_tunnel_registration_failures_total{protocol,cause}`,
    /// `cftunnel_tunnel_reconnects_total{protocol}`,
    /// `cftunnel_tunnel_active_streams{protocol}`,
    /// `cftunnel_tunnel_remote_config_version`,
    /// `cftunnel_tunnel_dropped_response_trailers_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "cftunnel_tunnel_connections",
            "Edge connections registered now",
            m.connections.clone(),
        );
        registry.register(
            "cftunnel_tunnel_registrations",
            "Successful edge registrations",
            m.registrations.clone(),
        );
        registry.register(
            "cftunnel_tunnel_registration_failures",
            "Failed edge connection or registration attempts, by cause",
            m.failures.clone(),
        );
        registry.register(
            "cftunnel_tunnel_reconnects",
            "Reconnect attempts after a connection ended or failed",
            m.reconnects.clone(),
        );
        registry.register(
            "cftunnel_tunnel_active_streams",
            "Request streams being served now",
            m.active_streams.clone(),
        );
        registry.register(
            "cftunnel_tunnel_remote_config_version",
            "Version of the last configuration pushed by the edge (-1: none)",
            m.config_version.clone(),
        );
        registry.register(
            "cftunnel_tunnel_dropped_response_trailers",
            "Responses whose trailers were dropped because the transport (QUIC) cannot carry \
             them; a gRPC response loses its status with them",
            m.dropped_trailers.clone(),
        );
        m.config_version.set(-1);
        m
    }

    pub(crate) fn connections(&self, protocol: ProtocolLabel) -> Gauge {
        self.connections
            .get_or_create(&ProtocolLabels { protocol })
            .clone()
    }

    pub(crate) fn active_streams(&self, protocol: ProtocolLabel) -> Gauge {
        self.active_streams
            .get_or_create(&ProtocolLabels { protocol })
            .clone()
    }

    pub(crate) fn registered(&self, protocol: ProtocolLabel) {
        self.registrations
            .get_or_create(&ProtocolLabels { protocol })
            .inc();
    }

    pub(crate) fn failed(&self, protocol: ProtocolLabel, cause: FailureCause) {
        self.failures
            .get_or_create(&FailureLabels { protocol, cause })
            .inc();
    }

    pub(crate) fn reconnect(&self, protocol: ProtocolLabel) {
        self.reconnects
            .get_or_create(&ProtocolLabels { protocol })
            .inc();
    }
}
