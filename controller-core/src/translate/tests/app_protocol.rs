//! A Service port's `appProtocol`: the protocol its backend is spoken to with, and what the
//! route says of a value the translation does not know.

use super::*;

/// Service `name` in `infra` with one port, `port`, to target 3000 of one endpoint at `ip`,
/// with `app_protocol` when given.
fn service(name: &str, port: i32, app_protocol: Option<&str>, ip: &str) -> String {
    let app_protocol = app_protocol
        .map(|a| format!(", appProtocol: \"{a}\""))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: infra}}\nspec: {{ports: [{{name: p, port: {port}, targetPort: 3000{app_protocol}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-a, namespace: infra, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: 3000}}]\nendpoints: [{{addresses: [{ip}]}}]\n---\n"
    )
}

/// HTTPRoute `name` in `infra` with one rule to `backend_refs`.
fn route(name: &str, backend_refs: &str) -> String {
    http_route(
        "infra",
        name,
        &format!("  parentRefs: [{{name: gw}}]\n  rules:\n  - matches: [{{path: {{value: /{name}}}}}]\n    backendRefs: {backend_refs}"),
    )
}

/// The rule of route `name` in `infra`.
fn rule_of<'a>(out: &'a Output, name: &str) -> &'a Rule {
    let wanted = format!("infra/{name}/0");
    route_rules(out)
        .into_iter()
        .find(|r| r.name.as_deref() == Some(wanted.as_str()))
        .unwrap_or_else(|| panic!("no rule {wanted}"))
}

fn resolved_refs(out: &Output, kind: RouteKind, name: &str) -> Condition {
    parent_statuses(out, kind, "infra", name)
        .first()
        .and_then(|p| p.condition(ConditionType::ResolvedRefs))
        .cloned()
        .expect("ResolvedRefs present")
}

/// `appProtocol`, port, then what is dialled: URL scheme, protocol, whether WebSocket
/// upgrades are allowed, whether over TLS (checked for the Service's name).
type Spelling = (
    Option<&'static str>,
    i32,
    &'static str,
    BackendProtocol,
    bool,
    bool,
);

/// The spellings of HTTP/2 in the clear that Services carry for gRPC (`kubernetes.io/h2c`,
/// the ALPN name, Istio's `grpc`, in any case) are dialled h2c; `kubernetes.io/h2c` is
/// cleartext even on port 443, where the other names keep the port's TLS (ALPN then picks
/// HTTP/2); `http` and `https` in any case pick the clear and TLS; the WebSocket names
/// allow upgrades. Every one of them resolves.
#[test]
fn every_known_spelling_of_an_app_protocol_picks_the_backend_protocol() {
    let h2c = BackendProtocol::H2c;
    let h1 = BackendProtocol::Http1;
    let cases: &[Spelling] = &[
        (Some("kubernetes.io/h2c"), 8080, "http", h2c, false, false),
        (Some("h2c"), 8080, "http", h2c, false, false),
        (Some("H2C"), 8080, "http", h2c, false, false),
        (Some("grpc"), 8080, "http", h2c, false, false),
        (Some("kubernetes.io/h2c"), 443, "http", h2c, false, false),
        (Some("GRPC"), 443, "https", h1, false, true),
        (Some("h2c"), 443, "https", h1, false, true),
        (Some("http"), 443, "http", h1, false, false),
        (Some("HTTP"), 8080, "http", h1, false, false),
        (Some("https"), 8080, "https", h1, false, true),
        (Some("HTTPS"), 8443, "https", h1, false, true),
        (Some("kubernetes.io/ws"), 8080, "http", h1, true, false),
        (Some("kubernetes.io/wss"), 8080, "https", h1, true, true),
        (None, 8080, "http", h1, false, false),
        (None, 443, "https", h1, false, true),
    ];
    let mut extra = String::new();
    for (i, (app_protocol, port, ..)) in cases.iter().enumerate() {
        let name = format!("s{i}");
        extra.push_str(&service(
            &name,
            *port,
            *app_protocol,
            &format!("10.0.8.{i}"),
        ));
        extra.push_str(&route(&name, &format!("[{{name: {name}, port: {port}}}]")));
    }
    let out = run(&extra);
    for (i, &(app_protocol, port, scheme, protocol, websocket, tls)) in cases.iter().enumerate() {
        let name = format!("s{i}");
        let case = format!("appProtocol {app_protocol:?} on port {port}");
        let backend = &rule_of(&out, &name).backends[0];
        assert_eq!(
            (
                backend.url.as_str(),
                backend.protocol,
                backend.websocket,
                backend.unavailable_status,
            ),
            (
                format!("{scheme}://10.0.8.{i}:3000").as_str(),
                protocol,
                websocket,
                None,
            ),
            "{case}"
        );
        let server_name = format!("{name}.infra.svc.cluster.local");
        assert_eq!(
            backend.tls.as_ref().and_then(|t| t.server_name.as_deref()),
            tls.then_some(server_name.as_str()),
            "{case}"
        );
        let resolved = resolved_refs(&out, RouteKind::Http, &name);
        assert_eq!(
            (resolved.status, resolved.reason),
            (true, Reason::ResolvedRefs),
            "{case}: {}",
            resolved.message
        );
    }
}

/// A value the translation does not know is dialled as a port without one is (HTTP/1.1; TLS
/// on port 443), by its backends and its mirrors, as the Go implementation does, and the
/// route says so: `ResolvedRefs=False`, `UnsupportedProtocol` (GEP-1911), naming the
/// backendRef and the value. A reference that fails its backend outranks it; a GRPCRoute,
/// which speaks h2c to every backend, has nothing to say.
#[test]
fn an_unrecognised_app_protocol_is_dialled_over_http1_and_reported_on_the_route() {
    let extra = [
        service("odd", 8080, Some("example.com/custom"), "10.0.8.1"),
        service("odd-tls", 443, Some("tcp"), "10.0.8.2"),
        route(
            "odd",
            "[{name: odd, port: 8080}]\n    filters: [{type: RequestMirror, requestMirror: {backendRef: {name: odd-tls, port: 443}}}]",
        ),
        route("mixed", "[{name: odd, port: 8080}, {name: gone, port: 8080}]"),
    ]
    .concat();
    let out = run(&extra);

    let rule = rule_of(&out, "odd");
    let backend = &rule.backends[0];
    assert_eq!(
        (
            backend.url.as_str(),
            backend.protocol,
            backend.unavailable_status
        ),
        ("http://10.0.8.1:3000", BackendProtocol::Http1, None),
        "served as without appProtocol"
    );
    let mirror = rule
        .filters
        .iter()
        .find_map(|f| f.request_mirror.as_ref())
        .expect("the mirror is kept");
    assert_eq!(
        (mirror.backend_url.as_str(), mirror.protocol),
        ("https://10.0.8.2:3000", BackendProtocol::Http1),
        "port 443 without a known appProtocol is dialled over TLS"
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "odd");
    assert_eq!(
        (resolved.status, resolved.reason),
        (false, Reason::UnsupportedProtocol)
    );
    assert_eq!(
        resolved.message,
        "spec.rules[0].filters[0].requestMirror.backendRef: Service infra/odd-tls port 443 has \
         appProtocol \"tcp\", which is not recognised: it is dialled over HTTP/1.1, as a port \
         without appProtocol is; \
         spec.rules[0].backendRefs[0]: Service infra/odd port 8080 has appProtocol \
         \"example.com/custom\", which is not recognised: it is dialled over HTTP/1.1, as a port \
         without appProtocol is"
    );
    assert_eq!(
        condition(&out, "infra", "odd", ConditionType::Accepted),
        (true, Reason::Accepted)
    );

    let mixed = resolved_refs(&out, RouteKind::Http, "mixed");
    assert_eq!(
        (mixed.status, mixed.reason),
        (false, Reason::BackendNotFound),
        "{}",
        mixed.message
    );
    assert!(
        mixed
            .message
            .contains("backendRefs[0]: Service infra/odd port 8080 has appProtocol")
            && mixed
                .message
                .contains("backendRefs[1]: Service infra/gone not found"),
        "{}",
        mixed.message
    );
    let mixed_backends = &rule_of(&out, "mixed").backends;
    assert_eq!(mixed_backends[0].unavailable_status, None, "still served");

    // HTTPRoutes and GRPCRoutes on one listener conflict: the GRPCRoute is translated alone.
    let out = run(&[
        service("odd", 8080, Some("example.com/custom"), "10.0.8.1"),
        grpc_route(
            "infra",
            "g",
            "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: odd, port: 8080}]}]",
        ),
    ]
    .concat());
    let grpc = resolved_refs(&out, RouteKind::Grpc, "g");
    assert_eq!((grpc.status, grpc.reason), (true, Reason::ResolvedRefs));
    let grpc_rule = shared(&out)
        .rules
        .iter()
        .find(|r| r.name.as_deref().is_some_and(|n| n.starts_with("infra/g/")))
        .expect("the GRPCRoute's rule");
    assert_eq!(grpc_rule.backends[0].protocol, BackendProtocol::H2c);
}

/// A ServiceImport's ports read `appProtocol` as a Service's do.
#[test]
fn a_service_import_port_reads_app_protocol_as_a_service_port_does() {
    let extra = [
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: shop, namespace: infra}\nspec:\n  ports:\n  - {port: 9090, appProtocol: grpc}\n  - {port: 9091, appProtocol: example.com/custom}\n  - {port: 443, appProtocol: grpc}\n---\n".to_owned(),
        route("grpc", "[{group: multicluster.x-k8s.io, kind: ServiceImport, name: shop, port: 9090}]"),
        route("grpc-tls", "[{group: multicluster.x-k8s.io, kind: ServiceImport, name: shop, port: 443}]"),
        route("odd", "[{group: multicluster.x-k8s.io, kind: ServiceImport, name: shop, port: 9091}]"),
    ]
    .concat();
    let out = run(&extra);
    let grpc = &rule_of(&out, "grpc").backends[0];
    assert_eq!(
        (grpc.url.as_str(), grpc.protocol),
        (
            "http://shop.infra.svc.clusterset.local:9090",
            BackendProtocol::H2c
        )
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "grpc");
    assert_eq!(
        (resolved.status, resolved.reason),
        (true, Reason::ResolvedRefs)
    );
    let grpc_tls = &rule_of(&out, "grpc-tls").backends[0];
    assert_eq!(
        (
            grpc_tls.url.as_str(),
            grpc_tls.protocol,
            grpc_tls.tls.as_ref().and_then(|t| t.server_name.as_deref())
        ),
        (
            "https://shop.infra.svc.clusterset.local:443",
            BackendProtocol::Http1,
            Some("shop.infra.svc.clusterset.local")
        ),
        "`grpc` on port 443 keeps the port's TLS"
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "grpc-tls");
    assert_eq!(
        (resolved.status, resolved.reason),
        (true, Reason::ResolvedRefs)
    );

    let odd = &rule_of(&out, "odd").backends[0];
    assert_eq!(
        (odd.url.as_str(), odd.protocol, odd.unavailable_status),
        (
            "http://shop.infra.svc.clusterset.local:9091",
            BackendProtocol::Http1,
            None
        )
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "odd");
    assert_eq!(
        (resolved.status, resolved.reason, resolved.message.as_str()),
        (
            false,
            Reason::UnsupportedProtocol,
            "spec.rules[0].backendRefs[0]: ServiceImport infra/shop port 9091 has appProtocol \
             \"example.com/custom\", which is not recognised: it is dialled over HTTP/1.1, as a \
             port without appProtocol is"
        )
    );
}

/// ExternalName Service `name` in `infra` for `host`, with one port, `port`, and
/// `app_protocol` when given.
fn external_name(name: &str, host: &str, port: i32, app_protocol: Option<&str>) -> String {
    let app_protocol = app_protocol
        .map(|a| format!(", appProtocol: \"{a}\""))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: infra}}\nspec: {{type: ExternalName, externalName: {host}, ports: [{{name: p, port: {port}{app_protocol}}}]}}\n---\n"
    )
}

/// The backend's URL, protocol and TLS server name.
fn dialled(backend: &Backend) -> (&str, BackendProtocol, Option<&str>) {
    (
        backend.url.as_str(),
        backend.protocol,
        backend.tls.as_ref().and_then(|t| t.server_name.as_deref()),
    )
}

/// An ExternalName Service's port reads `appProtocol` as a Service's does: `grpc` on port 443
/// (a partner's gRPC endpoint) is dialled over TLS, checked for the external name, where
/// `kubernetes.io/h2c`, and `grpc` off port 443, are dialled h2c in the clear;
/// `kubernetes.io/ws` allows WebSocket upgrades; and an unrecognised value is reported on the
/// route as for any Service.
#[test]
fn an_external_name_port_reads_app_protocol_as_a_service_port_does() {
    let extra = [
        external_name("partner", "grpc.partner.example", 443, Some("grpc")),
        external_name(
            "partner-h2c",
            "h2c.partner.example",
            443,
            Some("kubernetes.io/h2c"),
        ),
        external_name("partner-grpc", "rpc.partner.example", 8080, Some("grpc")),
        external_name(
            "partner-ws",
            "ws.partner.example",
            8080,
            Some("kubernetes.io/ws"),
        ),
        external_name(
            "partner-odd",
            "odd.partner.example",
            8443,
            Some("example.com/custom"),
        ),
        route("partner", "[{name: partner, port: 443}]"),
        route("partner-h2c", "[{name: partner-h2c, port: 443}]"),
        route("partner-grpc", "[{name: partner-grpc, port: 8080}]"),
        route("partner-ws", "[{name: partner-ws, port: 8080}]"),
        route("partner-odd", "[{name: partner-odd, port: 8443}]"),
    ]
    .concat();
    let out = run(&extra);

    assert_eq!(
        dialled(&rule_of(&out, "partner").backends[0]),
        (
            "https://grpc.partner.example.:443",
            BackendProtocol::Http1,
            Some("grpc.partner.example")
        ),
        "`grpc` on port 443 keeps the port's TLS"
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "partner");
    assert_eq!(
        (resolved.status, resolved.reason),
        (true, Reason::ResolvedRefs),
        "{}",
        resolved.message
    );

    assert_eq!(
        dialled(&rule_of(&out, "partner-h2c").backends[0]),
        (
            "http://h2c.partner.example.:443",
            BackendProtocol::H2c,
            None
        ),
        "`kubernetes.io/h2c` is h2c in the clear whatever the port"
    );
    assert_eq!(
        dialled(&rule_of(&out, "partner-grpc").backends[0]),
        (
            "http://rpc.partner.example.:8080",
            BackendProtocol::H2c,
            None
        ),
        "`grpc` off port 443 is h2c"
    );
    let ws = &rule_of(&out, "partner-ws").backends[0];
    assert_eq!(
        (ws.url.as_str(), ws.protocol, ws.websocket),
        (
            "http://ws.partner.example.:8080",
            BackendProtocol::Http1,
            true
        ),
        "`kubernetes.io/ws` allows WebSocket upgrades"
    );
    for name in ["partner-ws", "partner-grpc"] {
        let resolved = resolved_refs(&out, RouteKind::Http, name);
        assert_eq!(
            (resolved.status, resolved.reason),
            (true, Reason::ResolvedRefs),
            "{name}: {}",
            resolved.message
        );
    }

    let odd = &rule_of(&out, "partner-odd").backends[0];
    assert_eq!(
        (odd.url.as_str(), odd.unavailable_status),
        ("http://odd.partner.example.:8443", None),
        "still served"
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "partner-odd");
    assert_eq!(
        (resolved.status, resolved.reason, resolved.message.as_str()),
        (
            false,
            Reason::UnsupportedProtocol,
            "spec.rules[0].backendRefs[0]: Service infra/partner-odd port 8443 has appProtocol \
             \"example.com/custom\", which is not recognised: it is dialled over HTTP/1.1, as a \
             port without appProtocol is"
        )
    );
}

/// A BackendTLSPolicy on port `section` of Service `service` in `infra`, trusting the
/// system's roots for `hostname`.
fn policy(name: &str, service: &str, section: &str, hostname: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: infra}}\nspec:\n  targetRefs: [{{group: \"\", kind: Service, name: {service}, sectionName: {section}}}]\n  validation: {{wellKnownCACertificates: System, hostname: {hostname}}}\n---\n"
    )
}

/// A port a BackendTLSPolicy covers is dialled over TLS, where ALPN picks the protocol
/// whatever its `appProtocol` calls it (GKE's `HTTP2`): the route has nothing to report, for
/// a Service or an ExternalName Service. The same value on a port no policy covers is still
/// reported.
#[test]
fn an_unrecognised_app_protocol_on_a_port_a_policy_covers_is_not_reported() {
    let extra = [
        service("gke", 8443, Some("HTTP2"), "10.0.8.1"),
        policy("gke", "gke", "p", "gke.internal"),
        route("gke", "[{name: gke, port: 8443}]"),
        external_name("partner", "api.partner.example", 8443, Some("HTTP2")),
        policy("partner", "partner", "p", "api.partner.example"),
        route("partner", "[{name: partner, port: 8443}]"),
        service("bare", 8443, Some("HTTP2"), "10.0.8.2"),
        route("bare", "[{name: bare, port: 8443}]"),
    ]
    .concat();
    let out = run(&extra);

    for (name, url, server_name) in [
        ("gke", "https://10.0.8.1:3000", "gke.internal"),
        (
            "partner",
            "https://api.partner.example.:8443",
            "api.partner.example",
        ),
    ] {
        let backend = &rule_of(&out, name).backends[0];
        assert_eq!(
            (dialled(backend), backend.unavailable_status),
            ((url, BackendProtocol::Http1, Some(server_name)), None),
            "{name}"
        );
        let resolved = resolved_refs(&out, RouteKind::Http, name);
        assert_eq!(
            (resolved.status, resolved.reason),
            (true, Reason::ResolvedRefs),
            "{name}: {}",
            resolved.message
        );
    }

    assert_eq!(
        dialled(&rule_of(&out, "bare").backends[0]),
        ("http://10.0.8.2:3000", BackendProtocol::Http1, None)
    );
    let resolved = resolved_refs(&out, RouteKind::Http, "bare");
    assert_eq!(
        (resolved.status, resolved.reason),
        (false, Reason::UnsupportedProtocol),
        "{}",
        resolved.message
    );
}
