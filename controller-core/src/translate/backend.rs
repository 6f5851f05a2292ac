//! Backend references: Service lookup, cross-namespace ReferenceGrant checks, endpoint
//! resolution from EndpointSlices (IPv4 and IPv6 ones), ExternalName admission (see
//! [`super::external_name`]), TLS to the backend (a BackendTLSPolicy, see
//! [`super::backend_tls`], or a port that asks for it), and the even split of a Service's
//! weight across its ready endpoints. ServiceImports and ExternalBackends have modules of
//! their own ([`super::service_import`], [`super::external_backend`]); what they all yield is
//! [`super::backend_ref`]'s.

use cftunnel_config::{Backend, BackendProtocol, BackendTls, Filter};
use k8s_openapi::api::core::v1::ServicePort as KubeServicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::backend_ref::{
    AppProtocol, BackendRefError, BackendRefView, ClusterUrl, Resolved, ServiceUrl,
};
use super::backend_tls::PortKey;
use super::external_name::{self, ExternalNameBackends, HostField};
use super::field::Field;
use super::service_import;
use super::{Index, Options, RouteKind, GATEWAY_CONFIG_GROUP};
use crate::external_backend::EXTERNAL_BACKEND_KIND;

/// Above this many distinct endpoint counts' least common multiple, weights are rounded
/// instead of split exactly.
const MAX_WEIGHT_SCALE: u64 = 10_000;

/// Resolves a backendRef of a route of `from` kind in `from_namespace`.
pub(super) fn resolve<'a>(
    r: BackendRefView<'a>,
    from: RouteKind,
    from_namespace: &'a str,
    field: Field<'_>,
    index: &Index<'_>,
    options: &'a Options,
) -> Result<Resolved<'a>, BackendRefError> {
    if service_import::is_service_import(&r) {
        return service_import::resolve(r, from, from_namespace, field, index);
    }
    let group = r.group.unwrap_or("");
    let kind = r.kind.unwrap_or("Service");
    if group == GATEWAY_CONFIG_GROUP && kind == EXTERNAL_BACKEND_KIND {
        return super::external_backend::resolve(r, from, from_namespace, field, index, options);
    }
    if !group.is_empty() || kind != "Service" {
        return Err(BackendRefError::InvalidKind {
            field: field.to_string(),
            group: group.to_owned(),
            kind: kind.to_owned(),
        });
    }
    let namespace = r.namespace.unwrap_or(from_namespace);
    // Most backendRefs leave the namespace out: no string to compare then.
    if r.namespace.is_some_and(|ns| ns != from_namespace)
        && !index.reference_granted(
            from.as_str(),
            from_namespace,
            "",
            "Service",
            namespace,
            r.name,
        )
    {
        return Err(BackendRefError::RefNotPermitted {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
        });
    }
    let objects = index.services.get(&(namespace, r.name));
    let Some(service) = objects.and_then(|o| o.service) else {
        return Err(BackendRefError::NotFound {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
        });
    };
    let Some(port) = r.port else {
        return Err(BackendRefError::MissingPort {
            field: field.to_string(),
        });
    };
    let spec = service.spec.as_ref();
    // What the route is told of a port whose `appProtocol` is not recognised.
    let unrecognised = |app_protocol: Option<&str>| {
        BackendRefError::unrecognised_protocol(
            field,
            "Service",
            namespace,
            r.name,
            port,
            app_protocol,
        )
    };
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        let external_name = spec
            .and_then(|s| s.external_name.as_deref())
            .unwrap_or_default();
        let host = external_name::dial_host(
            external_name,
            HostField::ExternalName,
            options.external_name_backends,
            &options.cluster_domain,
        )
        .map_err(|refusal| BackendRefError::ExternalNameRefused {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
            refusal,
        })?;
        let service_port = spec
            .and_then(|s| s.ports.as_ref())
            .and_then(|ports| ports.iter().find(|p| p.port == port));
        let app_protocol = service_port.and_then(|p| p.app_protocol.as_deref());
        let app = AppProtocol::of(app_protocol);
        let tls = Tls::of(namespace, r.name, port, service_port, app, index, || {
            host.trim_end_matches('.').to_owned()
        });
        let url = tls.url(&format!("{host}:{port}"));
        let notice = tls.notice(app, from, || unrecognised(app_protocol));
        return Ok(Resolved {
            urls: vec![url],
            service_url: ServiceUrl::Dialled,
            protocol: app.protocol(port),
            websocket: app.websocket(),
            public_only: options.external_name_backends == ExternalNameBackends::External,
            tls: tls.settings,
            tls_refused: tls.refused,
            port: tls.port,
            notice,
        });
    }
    let Some(service_port) = spec
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.port == port))
    else {
        return Err(BackendRefError::PortNotFound {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
            port,
        });
    };
    let app_protocol = service_port.app_protocol.as_deref();
    let app = AppProtocol::of(app_protocol);
    // A headless Service's DNS name resolves to the pods, which listen on the target port.
    let headless = spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    let dns_port = match (&service_port.target_port, headless) {
        (Some(IntOrString::Int(target)), true) => *target,
        _ => port,
    };
    // Every rule resolves its backends: the Service's own name is joined only where a TLS
    // check or a URL needs it.
    let dns_name = || super::joined([r.name, ".", namespace, ".svc.", &options.cluster_domain]);
    let tls = Tls::of(
        namespace,
        r.name,
        port,
        Some(service_port),
        app,
        index,
        dns_name,
    );
    let service_url = ClusterUrl {
        scheme: tls.scheme(),
        name: r.name,
        namespace,
        domain: &options.cluster_domain,
        port: dns_port,
    };
    let (urls, service_url) = match objects.map(|o| o.slices.as_slice()) {
        // Without EndpointSlices the Service is dialled at its name.
        None | Some([]) => (vec![service_url.written()], ServiceUrl::Dialled),
        Some(slices) => (
            endpoint_urls(tls.scheme(), service_port, slices),
            ServiceUrl::Cluster(service_url),
        ),
    };
    let notice = tls.notice(app, from, || unrecognised(app_protocol));
    Ok(Resolved {
        urls,
        service_url,
        protocol: app.protocol(port),
        websocket: app.websocket(),
        public_only: false,
        tls: tls.settings,
        tls_refused: tls.refused,
        port: tls.port,
        notice,
    })
}

/// How a Service port is dialled: over TLS when a BackendTLSPolicy covers it (with the
/// policy's settings), or when the port asks for TLS itself ([`AppProtocol::asks_tls`]), then
/// verified against the platform's web roots for `host` (the name a client of the Service
/// would check).
struct Tls {
    settings: Option<Box<BackendTls>>,
    refused: bool,
    /// A BackendTLSPolicy covers the port (usable or not).
    covered: bool,
    /// Only where BackendTLSPolicies exist (see [`Resolved::port`]).
    port: Option<Box<PortKey>>,
}

impl Tls {
    fn of(
        namespace: &str,
        service: &str,
        port: i32,
        service_port: Option<&KubeServicePort>,
        app: AppProtocol,
        index: &Index<'_>,
        host: impl FnOnce() -> String,
    ) -> Self {
        let port_name = service_port.and_then(|p| p.name.as_deref());
        let key = index.tls_policies.then(|| {
            Box::new((
                namespace.to_owned(),
                service.to_owned(),
                port_name.map(str::to_owned),
            ))
        });
        let asks = app.asks_tls(port);
        match index.policies.covering(namespace, service, port_name) {
            Some(covered) => Self {
                settings: covered.tls.cloned().map(Box::new),
                refused: covered.tls.is_none(),
                covered: true,
                port: key,
            },
            None => Self {
                settings: asks.then(|| {
                    Box::new(BackendTls {
                        server_name: Some(host()),
                        ..BackendTls::default()
                    })
                }),
                refused: false,
                covered: false,
                port: key,
            },
        }
    }

    /// What the route says of a port whose `appProtocol` is not recognised
    /// ([`BackendRefError::UnrecognisedProtocol`], built by `notice`). Nothing when a
    /// BackendTLSPolicy covers the port: it is dialled over TLS, where ALPN picks the protocol
    /// whatever the port's name for it (GKE's `HTTP2`, say). Nothing for a GRPCRoute either,
    /// which speaks HTTP/2 to every backend, whatever its port says.
    fn notice(
        &self,
        app: AppProtocol,
        from: RouteKind,
        notice: impl FnOnce() -> Box<BackendRefError>,
    ) -> Option<Box<BackendRefError>> {
        (app == AppProtocol::Unrecognised && from == RouteKind::Http && !self.covered).then(notice)
    }

    /// The scheme this port is dialled with.
    fn scheme(&self) -> &'static str {
        if self.settings.is_some() || self.refused {
            "https"
        } else {
            "http"
        }
    }

    /// The URL of `authority` (`host:port`) in the scheme this port is dialled with.
    fn url(&self, authority: &str) -> String {
        super::joined([self.scheme(), "://", authority])
    }
}

/// Ready endpoints of `service_port`, as sorted, de-duplicated `scheme://host:port` URLs.
///
/// Only IPv4 and IPv6 slices count, as with kube-proxy. An `FQDN` slice's addresses are names
/// whoever may write EndpointSlices in the namespace picks, with no Service of theirs behind
/// them (`kubernetes.default.svc`, another namespace's Service, `localhost`): dialled, they
/// would pass `--external-name-backends` and ReferenceGrants by.
fn endpoint_urls(
    scheme: &str,
    service_port: &KubeServicePort,
    slices: &[&k8s_openapi::api::discovery::v1::EndpointSlice],
) -> Vec<String> {
    let wanted = service_port.name.as_deref().unwrap_or("");
    let mut urls = Vec::with_capacity(
        slices
            .iter()
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum(),
    );
    for slice in slices {
        let v6 = match slice.address_type.as_str() {
            "IPv4" => false,
            "IPv6" => true,
            _ => continue,
        };
        let Some(target) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == wanted)
            .and_then(|p| p.port)
        else {
            continue;
        };
        let mut port = itoa::Buffer::new();
        let target = port.format(target);
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            let Some(address) = endpoint.addresses.first() else {
                continue;
            };
            if !ready {
                continue;
            }
            // Addresses are short: a plain scan beats a call to `memchr`, and one without a
            // branch per byte (an IPv4 address has no `:` to stop at) beats that.
            let url = if v6 || address.bytes().fold(false, |colon, b| colon | (b == b':')) {
                super::joined([scheme, "://[", address, "]:", target])
            } else {
                super::joined([scheme, "://", address, ":", target])
            };
            urls.push(url);
        }
    }
    // Slices list their endpoints in a stable order, most often already sorted and distinct.
    if !urls.is_sorted_by(|a, b| a < b) {
        urls.sort_unstable();
        urls.dedup();
    }
    urls
}

/// One backendRef of a rule, resolved or not, with its weight and filters.
#[derive(Debug, Clone)]
pub(super) struct WeightedTarget<'a> {
    pub(super) weight: u32,
    pub(super) target: Result<Resolved<'a>, String>,
    pub(super) filters: Vec<Filter>,
    /// Forces the protocol (GRPCRoute backends speak HTTP/2).
    pub(super) protocol: Option<BackendProtocol>,
}

/// Status answered for a backend share whose reference is invalid (Gateway API: 500).
pub(super) const INVALID_REF_STATUS: u16 = 500;
/// Status answered for a Service with no ready endpoint.
pub(super) const NO_ENDPOINTS_STATUS: u16 = 503;

/// Expands targets into weighted backends: a Service's weight is split evenly across its
/// ready endpoints, scaled so that the ratio between Services is kept exactly.
pub(super) fn expand(targets: Vec<WeightedTarget<'_>>) -> Vec<Backend> {
    // Backends a target becomes: one per ready endpoint, or one answering in its place.
    let backends = |t: &WeightedTarget| match &t.target {
        Ok(r) => r.urls.len().max(1),
        Err(_) => 1,
    };
    let scale = targets
        .iter()
        .map(|t| backends(t) as u64)
        .try_fold(1u64, |acc, n| {
            let l = lcm(acc, n);
            (l <= MAX_WEIGHT_SCALE).then_some(l)
        })
        .unwrap_or(MAX_WEIGHT_SCALE);
    let scaled = |weight: u32, n: u64| -> u32 {
        let w = (u64::from(weight) * scale + n / 2) / n;
        u32::try_from(w).unwrap_or(u32::MAX)
    };
    let mut out = Vec::with_capacity(targets.iter().map(backends).sum());
    for t in targets {
        match t.target {
            Err(url) => out.push(Backend {
                url,
                weight: scaled(t.weight, 1),
                filters: t.filters,
                unavailable_status: Some(INVALID_REF_STATUS),
                ..Backend::default()
            }),
            Ok(mut r) if r.urls.is_empty() => out.push(Backend {
                weight: scaled(t.weight, 1),
                protocol: t.protocol.unwrap_or(r.protocol),
                websocket: r.websocket,
                public_only: r.public_only,
                filters: t.filters,
                unavailable_status: Some(NO_ENDPOINTS_STATUS),
                tls: r.tls.take().map(|t| *t),
                url: r.into_service_url(),
            }),
            Ok(mut r) => {
                let n = r.urls.len() as u64;
                let backend = |url, filters, tls| Backend {
                    url,
                    weight: scaled(t.weight, n),
                    protocol: t.protocol.unwrap_or(r.protocol),
                    websocket: r.websocket,
                    public_only: r.public_only,
                    filters,
                    tls,
                    ..Backend::default()
                };
                // The last endpoint takes the filters and TLS settings; the others copy them.
                let last = r.urls.pop();
                for url in r.urls.drain(..) {
                    out.push(backend(url, t.filters.clone(), r.tls.as_deref().cloned()));
                }
                if let Some(url) = last {
                    out.push(backend(url, t.filters, r.tls.take().map(|t| *t)));
                }
            }
        }
    }
    out
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    if a == 0 || b == 0 {
        return a.max(b);
    }
    a / gcd(a, b) * b
}

/// The URL a mirror filter sends copies to: the first ready endpoint (the mirror filter takes
/// one URL), or the Service DNS name; `None` when the Service has no ready endpoint.
pub(super) fn mirror_url(resolved: &Resolved<'_>) -> Option<String> {
    resolved.urls.first().cloned()
}
