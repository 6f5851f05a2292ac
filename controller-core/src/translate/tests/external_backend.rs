//! backendRefs to ExternalBackends: the URL their spec makes (base path and query included),
//! admitted as ExternalName Services are (`--external-name-backends`), and ReferenceGrants for
//! another namespace's.

use cftunnel_testkit::pki::TestPki;

use super::*;

fn external_backend(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: ExternalBackend\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n---\n"
    )
}

fn route_to(ns: &str, backend_ns: Option<&str>) -> String {
    let namespace = backend_ns
        .map(|n| format!(", namespace: {n}"))
        .unwrap_or_default();
    http_route(
        ns,
        "app",
        &format!(
            "  parentRefs: [{{name: gw, namespace: infra}}]\n  rules: [{{backendRefs: [{{group: cf.k8s.lex.la, kind: ExternalBackend, name: api{namespace}}}]}}]"
        ),
    )
}

fn translate_with_mode(extra: &str, mode: ExternalNameBackends) -> Output {
    translate(
        &snapshot(extra),
        &Options {
            external_name_backends: mode,
            ..Options::default()
        },
    )
}

fn app_backends(out: &Output) -> Vec<Backend> {
    shared(out)
        .rules
        .iter()
        .filter(|r| {
            r.name
                .as_deref()
                .is_some_and(|n| n.starts_with("infra/app"))
        })
        .flat_map(|r| r.backends.clone())
        .collect()
}

#[test]
fn an_external_backend_is_dialled_at_its_url_with_base_path_and_query_at_public_addresses() {
    let out = run(&format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: http, host: api.example.com, port: 8080, path: \"/v1?token=abc\"}"
        ),
        route_to("infra", None)
    ));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
    let backends = app_backends(&out);
    assert_eq!(backends.len(), 1);
    // An absolute name, as an ExternalName Service's under `external`.
    assert_eq!(backends[0].url, "http://api.example.com.:8080/v1?token=abc");
    assert!(backends[0].public_only);
    assert_eq!(backends[0].tls, None);
}

#[test]
fn an_https_external_backend_verifies_its_name_without_the_absolute_dot() {
    let out = run(&format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: https, host: api.example.com, port: 443}"
        ),
        route_to("infra", None)
    ));
    let backends = app_backends(&out);
    assert_eq!(backends[0].url, "https://api.example.com.:443");
    assert_eq!(
        backends[0]
            .tls
            .as_ref()
            .and_then(|t| t.server_name.as_deref()),
        Some("api.example.com")
    );
}

/// The route's `ResolvedRefs`: status, reason and message.
fn resolved_refs(out: &Output) -> (bool, Reason, String) {
    let c = route_status(out, "infra", "app")[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    (c.status, c.reason, c.message.clone())
}

/// Route `app` to ExternalBackend `api` at `host:8080`, translated under `mode`.
fn to_host(host: &str, mode: ExternalNameBackends) -> Output {
    translate_with_mode(
        &format!(
            "{}{}",
            external_backend(
                "infra",
                "api",
                &format!("{{scheme: http, host: \"{host}\", port: 8080}}")
            ),
            route_to("infra", None)
        ),
        mode,
    )
}

fn assert_resolved(out: &Output) {
    let (status, reason, message) = resolved_refs(out);
    assert_eq!((status, reason), (true, Reason::ResolvedRefs), "{message}");
}

/// `app`'s share of `api` fails closed (500), and `ResolvedRefs` says why, naming the
/// ExternalBackend and `message`.
fn assert_refused(out: &Output, message: &str) {
    let (status, reason, got) = resolved_refs(out);
    assert_eq!((status, reason), (false, Reason::InvalidKind), "{got}");
    assert!(
        got.contains(&format!("ExternalBackend infra/api is refused: {message}")),
        "{got}"
    );
    let backends = app_backends(out);
    assert!(
        !backends.is_empty() && backends.iter().all(|b| b.unavailable_status == Some(500)),
        "{backends:?}"
    );
}

#[test]
fn external_backends_are_admitted_as_external_name_backends_are() {
    // `external`: an IP literal that is not public is refused, as the proxy would refuse to
    // dial it (`publicOnly`).
    let out = to_host("127.0.0.1", ExternalNameBackends::External);
    assert_refused(
        &out,
        "spec.host \"127.0.0.1\" is an IP address that is not public",
    );
    // `any`: as written.
    let out = to_host("127.0.0.1", ExternalNameBackends::Any);
    assert_resolved(&out);
    assert_eq!(app_backends(&out)[0].url, "http://127.0.0.1:8080");
    assert!(!app_backends(&out)[0].public_only);
    // `deny`: refused, the rule's share fails closed.
    let out = to_host("127.0.0.1", ExternalNameBackends::Deny);
    assert_refused(&out, "external backends are not admitted");
    // A name inside the cluster is refused under `external`.
    let out = to_host(
        "web.infra.svc.cluster.local",
        ExternalNameBackends::External,
    );
    assert_refused(
        &out,
        "spec.host \"web.infra.svc.cluster.local\" is under the cluster domain cluster.local",
    );
}

/// Under `external` an IP literal is judged by the proxy's own rule ahead: one the proxy would
/// never dial (private, loopback, link-local, metadata and host endpoints, IPv6 forms of
/// those) is refused with the reason; a public one is admitted, still dialled `publicOnly`.
#[test]
fn ip_literal_external_backends_are_admitted_under_external_only_if_public() {
    for (host, written) in [
        ("10.0.0.5", "10.0.0.5"),
        ("169.254.169.254", "169.254.169.254"),
        ("168.63.129.16", "168.63.129.16"),
        ("0.0.0.0", "0.0.0.0"),
        ("[::1]", "::1"),
        ("[::ffff:10.0.0.5]", "::ffff:10.0.0.5"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
        ("[FE80::1]", "fe80::1"),
    ] {
        let out = to_host(host, ExternalNameBackends::External);
        assert_refused(
            &out,
            &format!("spec.host \"{written}\" is an IP address that is not public"),
        );
        assert!(
            resolved_refs(&out)
                .2
                .contains("(--external-name-backends=external)"),
            "{host}"
        );
    }
    for (host, url) in [
        ("1.1.1.1", "http://1.1.1.1:8080"),
        ("[2606:4700::1111]", "http://[2606:4700::1111]:8080"),
    ] {
        let out = to_host(host, ExternalNameBackends::External);
        assert_resolved(&out);
        let backends = app_backends(&out);
        assert_eq!(backends.len(), 1);
        assert_eq!(backends[0].url, url);
        assert!(backends[0].public_only);
        assert_eq!(backends[0].unavailable_status, None);
    }
    // `any` dials every address as written.
    let out = to_host("10.0.0.5", ExternalNameBackends::Any);
    assert_eq!(app_backends(&out)[0].url, "http://10.0.0.5:8080");
    assert_eq!(app_backends(&out)[0].unavailable_status, None);
}

/// DNS names are case-insensitive: a host in capitals is read in lower case, so it is admitted
/// or refused as its lower-case spelling is, in every mode, and the proxy dials that spelling.
#[test]
fn an_external_backend_host_in_capitals_is_read_in_lower_case_in_every_mode() {
    let out = to_host("API.Example.com", ExternalNameBackends::External);
    assert_resolved(&out);
    let backends = app_backends(&out);
    assert_eq!(backends[0].url, "http://api.example.com.:8080");
    assert!(backends[0].public_only);
    let out = to_host("API.Example.com", ExternalNameBackends::Any);
    assert_eq!(app_backends(&out)[0].url, "http://api.example.com:8080");
    // A name inside the cluster is one whatever its case.
    let out = to_host(
        "WEB.infra.SVC.Cluster.Local",
        ExternalNameBackends::External,
    );
    assert_refused(
        &out,
        "spec.host \"web.infra.svc.cluster.local\" is under the cluster domain cluster.local",
    );
    // What is refused names the ExternalBackend's field.
    let out = to_host("API_v1.Example.com", ExternalNameBackends::External);
    assert_refused(&out, "spec.host \"api_v1.example.com\" is not a DNS name");
    // TLS verifies the lower-case name.
    let out = run(&format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: https, host: API.Example.com, port: 443}"
        ),
        route_to("infra", None)
    ));
    let backends = app_backends(&out);
    assert_eq!(backends[0].url, "https://api.example.com.:443");
    assert_eq!(
        backends[0]
            .tls
            .as_ref()
            .and_then(|t| t.server_name.as_deref()),
        Some("api.example.com")
    );
}

#[test]
fn a_missing_or_malformed_external_backend_resolves_to_nothing() {
    let out = run(&route_to("infra", None));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (false, Reason::BackendNotFound)
    );
    let out = run(&format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: http, host: \"api.example.com:80\", port: 8080}"
        ),
        route_to("infra", None)
    ));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (false, Reason::InvalidKind)
    );
}

#[test]
fn another_namespaces_external_backend_needs_a_reference_grant() {
    let objects = format!(
        "{}{}",
        external_backend(
            "apps",
            "api",
            "{scheme: http, host: api.example.com, port: 80}"
        ),
        route_to("infra", Some("apps"))
    );
    let out = run(&objects);
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (false, Reason::RefNotPermitted)
    );
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: ext, namespace: apps}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}]\n  to: [{group: cf.k8s.lex.la, kind: ExternalBackend}]\n---\n";
    let out = run(&format!("{objects}{grant}"));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
}

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

/// A ConfigMap and a Secret of `infra` holding `ca` under `ca.crt`, and a ConfigMap without
/// the key.
fn ca_objects(ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: origin-ca, namespace: infra}}\ndata:\n  ca.crt: |\n{pem}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: origin-ca-secret, namespace: infra}}\nstringData:\n  ca.crt: |\n{pem}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: no-key, namespace: infra}}\ndata: {{other: x}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: not-pem, namespace: infra}}\ndata: {{ca.crt: nothing here}}\n---\n",
        pem = indent(ca, 4)
    )
}

/// The route's backend and its `ResolvedRefs` (status, reason, message) for an https
/// ExternalBackend with `tls`.
fn with_tls(scheme: &str, tls: &str, ca: &str) -> (Backend, (bool, Reason, String)) {
    let out = run(&format!(
        "{}{}{}",
        ca_objects(ca),
        external_backend(
            "infra",
            "api",
            &format!("{{scheme: {scheme}, host: api.example.com, port: 443, tls: {tls}}}")
        ),
        route_to("infra", None)
    ));
    let resolved = route_status(&out, "infra", "app")[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    let backends = app_backends(&out);
    assert_eq!(backends.len(), 1);
    (
        backends[0].clone(),
        (resolved.status, resolved.reason, resolved.message.clone()),
    )
}

#[test]
fn an_external_backends_tls_trusts_its_ca_refs_and_checks_its_hostname_and_names() {
    let pki = TestPki::for_names(&["origin.internal"]).expect("pki");
    let ca = pki.ca_pem();
    for kind_and_name in [
        "{kind: ConfigMap, name: origin-ca}",
        "{group: \"\", kind: Secret, name: origin-ca-secret}",
    ] {
        let (backend, resolved) = with_tls(
            "https",
            &format!(
                "{{caCertificateRefs: [{kind_and_name}], hostname: origin.internal, subjectAltNames: [{{type: Hostname, hostname: alt.internal}}, {{type: URI, uri: \"spiffe://shop/api\"}}]}}"
            ),
            ca,
        );
        assert_eq!(resolved, (true, Reason::ResolvedRefs, String::new()));
        assert_eq!(backend.url, "https://api.example.com.:443");
        assert_eq!(backend.unavailable_status, None);
        let tls = backend.tls.expect("TLS settings");
        assert_eq!(
            tls.ca_bundle.as_deref().map(str::trim_end),
            Some(ca.trim_end())
        );
        assert_eq!(tls.server_name.as_deref(), Some("origin.internal"));
        assert_eq!(tls.subject_alt_names, ["alt.internal", "spiffe://shop/api"]);
    }
    // Without CA refs: the web roots, and the host (no absolute dot) as the server name.
    let (backend, resolved) = with_tls(
        "https",
        "{subjectAltNames: [{type: Hostname, hostname: alt.internal}]}",
        ca,
    );
    assert!(resolved.0);
    let tls = backend.tls.expect("TLS settings");
    assert_eq!(tls.ca_bundle, None);
    assert_eq!(tls.server_name.as_deref(), Some("api.example.com"));
    assert_eq!(tls.subject_alt_names, ["alt.internal"]);
}

#[test]
fn an_external_backends_unusable_tls_refuses_the_backend_ref_naming_the_field() {
    let pki = TestPki::for_names(&["origin.internal"]).expect("pki");
    let ca = pki.ca_pem();
    let cm = |name: &str| format!("{{kind: ConfigMap, name: {name}}}");
    for (tls, reason, message) in [
        (
            format!(
                "{{caCertificateRefs: [{}, {}]}}",
                cm("origin-ca"),
                cm("absent")
            ),
            Reason::InvalidCACertificateRef,
            "spec.tls.caCertificateRefs[1]: ConfigMap infra/absent not found".to_owned(),
        ),
        (
            "{caCertificateRefs: [{kind: Secret, name: absent}]}".to_owned(),
            Reason::InvalidCACertificateRef,
            "spec.tls.caCertificateRefs[0]: Secret infra/absent not found".to_owned(),
        ),
        (
            format!("{{caCertificateRefs: [{}]}}", cm("no-key")),
            Reason::InvalidCACertificateRef,
            "spec.tls.caCertificateRefs[0]: ConfigMap infra/no-key has no key ca.crt".to_owned(),
        ),
        (
            format!("{{caCertificateRefs: [{}]}}", cm("not-pem")),
            Reason::InvalidCACertificateRef,
            "spec.tls.caCertificateRefs[0]: ca.crt of not-pem:".to_owned(),
        ),
        (
            "{caCertificateRefs: [{group: apps, kind: Deployment, name: origin-ca}]}".to_owned(),
            Reason::InvalidKind,
            "spec.tls.caCertificateRefs[0]: unsupported kind apps/Deployment".to_owned(),
        ),
        (
            "{hostname: \"*.example.com\"}".to_owned(),
            Reason::InvalidKind,
            "spec.tls.hostname:".to_owned(),
        ),
        (
            "{subjectAltNames: [{type: URI, hostname: a.example.com}]}".to_owned(),
            Reason::InvalidKind,
            "spec.tls.subjectAltNames[0]: the value of its type is missing".to_owned(),
        ),
    ] {
        let (backend, (status, got_reason, got)) = with_tls("https", &tls, ca);
        assert!(!status, "{tls}");
        assert_eq!(got_reason, reason, "{tls}: {got}");
        assert!(
            got.contains(&format!(
                "ExternalBackend infra/api cannot be used: {message}"
            )),
            "{tls}: {got}"
        );
        assert_eq!(backend.unavailable_status, Some(500), "{tls}: fails closed");
        assert_eq!(backend.tls, None, "{tls}");
    }
    let (backend, (status, reason, message)) = with_tls("http", "{hostname: origin.internal}", ca);
    assert_eq!((status, reason), (false, Reason::InvalidKind));
    assert!(
        message.contains("spec.tls: TLS settings need scheme https"),
        "{message}"
    );
    assert_eq!(backend.unavailable_status, Some(500));
}

#[test]
fn an_unusable_external_backend_leaves_other_routes_alone() {
    let objects = format!(
        "{}{}{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: https, host: api.example.com, port: 443, tls: {caCertificateRefs: [{kind: ConfigMap, name: absent}]}}"
        ),
        external_backend("infra", "fine", "{scheme: https, host: fine.example.com, port: 443}"),
        route_to("infra", None),
        http_route(
            "infra",
            "other",
            "  parentRefs: [{name: gw, namespace: infra}]\n  hostnames: [other.example.com]\n  rules: [{backendRefs: [{group: cf.k8s.lex.la, kind: ExternalBackend, name: fine}]}]"
        ),
    );
    let out = run(&objects);
    assert!(!condition(&out, "infra", "app", ConditionType::ResolvedRefs).0);
    assert_eq!(
        condition(&out, "infra", "other", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
    let other: Vec<&Backend> = shared(&out)
        .rules
        .iter()
        .filter(|r| {
            r.name
                .as_deref()
                .is_some_and(|n| n.starts_with("infra/other"))
        })
        .flat_map(|r| &r.backends)
        .collect();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].url, "https://fine.example.com.:443");
    assert_eq!(other[0].unavailable_status, None);
}

#[test]
fn a_grpc_routes_external_backend_is_dialled_over_http2() {
    let out = run(&format!(
        "{}{}",
        external_backend("infra", "api", "{scheme: http, host: api.example.com, port: 50051}"),
        grpc_route(
            "infra",
            "app",
            "  parentRefs: [{name: gw, namespace: infra}]\n  rules: [{backendRefs: [{group: cf.k8s.lex.la, kind: ExternalBackend, name: api}]}]"
        )
    ));
    let backends: Vec<&Backend> = shared(&out)
        .rules
        .iter()
        .filter(|r| {
            r.name
                .as_deref()
                .is_some_and(|n| n.starts_with("infra/app"))
        })
        .flat_map(|r| &r.backends)
        .collect();
    assert_eq!(backends.len(), 1);
    assert_eq!(backends[0].url, "http://api.example.com.:50051");
    assert_eq!(backends[0].protocol, BackendProtocol::H2c);
}
