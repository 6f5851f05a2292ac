//! backendRefs to ExternalBackends: the URL their spec makes (base path and query included),
//! admitted as ExternalName Services are (`--external-name-backends`), and ReferenceGrants for
//! another namespace's.

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

#[test]
fn external_backends_are_admitted_as_external_name_backends_are() {
    let objects = format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: http, host: 127.0.0.1, port: 8080}"
        ),
        route_to("infra", None)
    );
    // `external`: an IP literal is dialled only if public, which loopback is not (at dial time).
    let out = translate_with_mode(&objects, ExternalNameBackends::External);
    let backends = app_backends(&out);
    assert_eq!(backends[0].url, "http://127.0.0.1:8080");
    assert!(backends[0].public_only);
    // `any`: as written.
    let out = translate_with_mode(&objects, ExternalNameBackends::Any);
    assert!(!app_backends(&out)[0].public_only);
    // `deny`: refused, the rule's share fails closed.
    let out = translate_with_mode(&objects, ExternalNameBackends::Deny);
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (false, Reason::InvalidKind)
    );
    assert!(app_backends(&out)
        .iter()
        .all(|b| b.unavailable_status.is_some()));
    // A name inside the cluster is refused under `external`.
    let out = run(&format!(
        "{}{}",
        external_backend(
            "infra",
            "api",
            "{scheme: http, host: web.infra.svc.cluster.local, port: 80}"
        ),
        route_to("infra", None)
    ));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (false, Reason::InvalidKind)
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
