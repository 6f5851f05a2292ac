//! A backendRef and what resolving one yields, whichever kind it names (a Service, a
//! ServiceImport, an ExternalBackend): the reference as routes write it, why it cannot be
//! resolved, and the resolved port with the URLs it is dialled at. The resolution of each kind
//! ([`super::backend`], [`super::service_import`], [`super::external_backend`]) speaks this
//! vocabulary, and the rule translation reads it.

use cftunnel_config::{BackendProtocol, BackendTls};

use super::backend_tls::PortKey;
use super::external_name::Refusal;
use super::field::Field;
use super::status::Reason;

/// `appProtocol` values with a meaning for the data plane (Gateway API GEP-1911).
const APP_PROTOCOL_H2C: &str = "kubernetes.io/h2c";
const APP_PROTOCOL_WS: &str = "kubernetes.io/ws";
const APP_PROTOCOL_WSS: &str = "kubernetes.io/wss";
/// Other names for HTTP/2 in the clear that Services carry for gRPC backends: `h2c` (the
/// ALPN name), `grpc` (Istio's). Service names (RFC 6335) compare in any case. Not GKE's
/// `HTTP2`, which means HTTP/2 over TLS: dialled in the clear, such a port would fail.
/// Unlike `kubernetes.io/h2c`, they do not override port 443's TLS ([`AppProtocol::H2cName`]).
const H2C_NAMES: [&str; 2] = ["h2c", "grpc"];
/// A Service port this number is dialled over TLS unless its `appProtocol` says otherwise.
const HTTPS_PORT: i32 = 443;

/// What a Service (or ServiceImport) port's `appProtocol` asks of the data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AppProtocol {
    /// None: HTTP/1.1 (HTTP/2 if TLS negotiates it), over TLS on port 443.
    Unset,
    /// `http`: HTTP/1.1 in the clear, whatever the port.
    Http,
    /// `https`: over TLS, whatever the port.
    Https,
    /// `kubernetes.io/h2c`: HTTP/2 with prior knowledge, in the clear, whatever the port.
    H2c,
    /// Another name for h2c ([`H2C_NAMES`]): as [`AppProtocol::H2c`], except on port 443,
    /// which is dialled as without `appProtocol` (over TLS, where ALPN picks HTTP/2). These
    /// names label gRPC backends whether or not they speak TLS, and one on 443 most often does
    /// (a partner's endpoint behind an ExternalName Service): dialled in the clear, every call
    /// would fail.
    H2cName,
    /// `kubernetes.io/ws`: WebSocket in the clear.
    Ws,
    /// `kubernetes.io/wss`: WebSocket over TLS.
    Wss,
    /// A value none of the above: dialled as [`AppProtocol::Unset`] is, and reported on the
    /// route ([`BackendRefError::UnrecognisedProtocol`]), as the Go implementation does. A
    /// Service labelled for another mesh or cloud often speaks HTTP/1.1 anyway, so refusing
    /// the backend would take down traffic that works.
    Unrecognised,
}

impl AppProtocol {
    pub(super) fn of(app_protocol: Option<&str>) -> Self {
        let Some(value) = app_protocol.filter(|v| !v.is_empty()) else {
            return Self::Unset;
        };
        match value {
            APP_PROTOCOL_H2C => Self::H2c,
            APP_PROTOCOL_WS => Self::Ws,
            APP_PROTOCOL_WSS => Self::Wss,
            v if v.eq_ignore_ascii_case("http") => Self::Http,
            v if v.eq_ignore_ascii_case("https") => Self::Https,
            v if H2C_NAMES.iter().any(|n| v.eq_ignore_ascii_case(n)) => Self::H2cName,
            _ => Self::Unrecognised,
        }
    }

    /// Whether a port `port` with no BackendTLSPolicy is dialled over TLS: its `appProtocol`
    /// says so (`https`, `kubernetes.io/wss`), or it is port 443 and its `appProtocol` names
    /// no cleartext protocol (`http`, `kubernetes.io/h2c`, `kubernetes.io/ws`).
    pub(super) fn asks_tls(self, port: i32) -> bool {
        match self {
            Self::Https | Self::Wss => true,
            Self::Http | Self::H2c | Self::Ws => false,
            Self::Unset | Self::H2cName | Self::Unrecognised => port == HTTPS_PORT,
        }
    }

    /// The protocol the backend on port `port` is spoken to with.
    pub(super) fn protocol(self, port: i32) -> BackendProtocol {
        match self {
            Self::H2c => BackendProtocol::H2c,
            Self::H2cName if port != HTTPS_PORT => BackendProtocol::H2c,
            _ => BackendProtocol::Http1,
        }
    }

    /// Whether the backend takes WebSocket upgrades.
    pub(super) fn websocket(self) -> bool {
        matches!(self, Self::Ws | Self::Wss)
    }
}

/// A `backendRef` (or a mirror's `backendRef`), whichever the route kind.
#[derive(Debug, Clone, Copy)]
pub(super) struct BackendRefView<'a> {
    pub(super) group: Option<&'a str>,
    pub(super) kind: Option<&'a str>,
    pub(super) name: &'a str,
    pub(super) namespace: Option<&'a str>,
    pub(super) port: Option<i32>,
}

/// Why a backendRef cannot be resolved; each maps to a `ResolvedRefs=False` reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendRefError {
    #[error("{field}: unsupported backend kind {group}/{kind}")]
    InvalidKind {
        field: String,
        group: String,
        kind: String,
    },
    #[error("{field}: Service {namespace}/{name} not found")]
    NotFound {
        field: String,
        namespace: String,
        name: String,
    },
    #[error("{field}: Service {namespace}/{name} has no port {port}")]
    PortNotFound {
        field: String,
        namespace: String,
        name: String,
        port: i32,
    },
    #[error("{field}: a port is required for a Service backend")]
    MissingPort { field: String },
    #[error(
        "{field}: reference to Service {namespace}/{name} is not permitted by a ReferenceGrant"
    )]
    RefNotPermitted {
        field: String,
        namespace: String,
        name: String,
    },
    #[error(
        "{field}: reference to ServiceImport {namespace}/{name} is not permitted by a ReferenceGrant"
    )]
    ServiceImportRefNotPermitted {
        field: String,
        namespace: String,
        name: String,
    },
    #[error("{field}: ServiceImport {namespace}/{name} not found{}", port.map(|p| format!(" exporting port {p}")).unwrap_or_default())]
    ServiceImportNotFound {
        field: String,
        namespace: String,
        name: String,
        port: Option<i32>,
    },
    #[error("{field}: filter {kind} is not supported")]
    UnsupportedFilter { field: String, kind: &'static str },
    #[error("{field}: AccessPolicy {namespace}/{name} not found")]
    AccessPolicyNotFound {
        field: String,
        namespace: String,
        name: String,
    },
    #[error("{field}: {message}")]
    AccessPolicyUnusable { field: String, message: String },
    /// An ExternalBackend that cannot be used ([`super::external_backend`]).
    #[error("{field}: ExternalBackend {namespace}/{name} {message}")]
    ExternalBackend {
        field: String,
        namespace: String,
        name: String,
        reason: Reason,
        message: String,
    },
    #[error("{field}: Service {namespace}/{name} of type ExternalName is refused: {refusal}")]
    ExternalNameRefused {
        field: String,
        namespace: String,
        name: String,
        refusal: Refusal,
    },
    /// A port whose `appProtocol` is [`AppProtocol::Unrecognised`]: unlike the others, the
    /// backend is still dialled.
    #[error(
        "{field}: {kind} {namespace}/{name} port {port} has appProtocol {app_protocol:?}, which is \
         not recognised: it is dialled over HTTP/1.1, as a port without appProtocol is"
    )]
    UnrecognisedProtocol {
        field: String,
        /// `Service` or `ServiceImport`.
        kind: &'static str,
        namespace: String,
        name: String,
        port: i32,
        app_protocol: String,
    },
}

impl BackendRefError {
    /// A port of `kind` (`Service`, `ServiceImport`) whose `appProtocol` is
    /// [`AppProtocol::Unrecognised`].
    pub(super) fn unrecognised_protocol(
        field: Field<'_>,
        kind: &'static str,
        namespace: &str,
        name: &str,
        port: i32,
        app_protocol: Option<&str>,
    ) -> Box<Self> {
        Box::new(Self::UnrecognisedProtocol {
            field: field.to_string(),
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
            app_protocol: app_protocol.unwrap_or_default().to_owned(),
        })
    }

    /// Whether the backend is dialled all the same ([`Self::UnrecognisedProtocol`]), where the
    /// others fail it closed or leave it out.
    pub fn still_dialled(&self) -> bool {
        matches!(self, Self::UnrecognisedProtocol { .. })
    }

    /// The `ResolvedRefs` reason the spec assigns to this failure.
    pub fn reason(&self) -> Reason {
        match self {
            // Gateway API's `kind` support levels set ExternalName Services apart: refusing one
            // is refusing an unsupported kind of backend.
            Self::InvalidKind { .. }
            | Self::UnsupportedFilter { .. }
            | Self::ExternalNameRefused { .. } => Reason::InvalidKind,
            // Gateway API's reason for "a reference to a resource that does not exist"; an
            // AccessPolicy that cannot be used is no policy for the data plane either.
            Self::NotFound { .. }
            | Self::PortNotFound { .. }
            | Self::MissingPort { .. }
            | Self::ServiceImportNotFound { .. }
            | Self::AccessPolicyNotFound { .. }
            | Self::AccessPolicyUnusable { .. } => Reason::BackendNotFound,
            Self::ExternalBackend { reason, .. } => *reason,
            Self::RefNotPermitted { .. } | Self::ServiceImportRefNotPermitted { .. } => {
                Reason::RefNotPermitted
            }
            // GEP-1911: a backend that cannot be spoken to with its stated protocol.
            Self::UnrecognisedProtocol { .. } => Reason::UnsupportedProtocol,
        }
    }
}

/// A resolved Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resolved<'a> {
    /// Backend URLs: one per ready endpoint, or the single DNS name.
    pub(super) urls: Vec<String>,
    /// The URL naming the Service itself (for messages and fail-closed backends).
    pub(super) service_url: ServiceUrl<'a>,
    pub(super) protocol: BackendProtocol,
    pub(super) websocket: bool,
    /// The proxy dials only public addresses: set for ExternalName Services under
    /// `--external-name-backends=external`, whose name is the Service owner's to point anywhere.
    pub(super) public_only: bool,
    /// TLS to the backend (the URLs are then `https`). Boxed, as is `port`: most backends
    /// have neither, and a resolved backend is moved a few times before it is written out.
    pub(super) tls: Option<Box<BackendTls>>,
    /// The BackendTLSPolicy covering the port cannot be used: the backend fails closed.
    pub(super) tls_refused: bool,
    /// The Service port, as BackendTLSPolicies target it (for their status); `None` in a
    /// cluster without BackendTLSPolicies, where no status needs it.
    pub(super) port: Option<Box<PortKey>>,
    /// What the route should say about a backend it still dials: an `appProtocol` that is
    /// not recognised ([`BackendRefError::UnrecognisedProtocol`]).
    pub(super) notice: Option<Box<BackendRefError>>,
}

/// The URL naming a resolved Service. A cluster Service's is kept as its parts and joined
/// only where it is used: one with ready endpoints is dialled at those, and few rules name the
/// Service itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ServiceUrl<'a> {
    /// The one URL of [`Resolved::urls`]: the Service is dialled at its name.
    Dialled,
    Cluster(ClusterUrl<'a>),
}

/// `<scheme>://<name>.<namespace>.svc.<domain>:<port>`, unwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ClusterUrl<'a> {
    pub(super) scheme: &'static str,
    pub(super) name: &'a str,
    pub(super) namespace: &'a str,
    pub(super) domain: &'a str,
    pub(super) port: i32,
}

impl ClusterUrl<'_> {
    pub(super) fn written(self) -> String {
        super::joined([
            self.scheme,
            "://",
            self.name,
            ".",
            self.namespace,
            ".svc.",
            self.domain,
            ":",
            itoa::Buffer::new().format(self.port),
        ])
    }
}

impl Resolved<'_> {
    /// The URL naming the Service itself.
    pub(super) fn into_service_url(mut self) -> String {
        match self.service_url {
            ServiceUrl::Dialled => self.urls.pop().unwrap_or_default(),
            ServiceUrl::Cluster(url) => url.written(),
        }
    }
}
