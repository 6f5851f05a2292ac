//! Backends of kind ServiceImport (Multi-Cluster Services API).

use super::*;

const IMPORTS: &str = r#"
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceImport
metadata: {name: shop, namespace: infra}
spec:
  type: ClusterSetIP
  ips: [10.9.0.1]
  ports:
  - {name: http, port: 8080, protocol: TCP}
  - {name: grpc, port: 9090, protocol: TCP, appProtocol: kubernetes.io/h2c}
  - {name: https, port: 443, protocol: TCP}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceImport
metadata: {name: billing, namespace: apps}
spec:
  ports: [{port: 8080}]
---
"#;

fn route_to(backend: &str) -> String {
    http_route(
        "infra",
        "r",
        &format!("  parentRefs: [{{name: gw}}]\n  rules:\n  - backendRefs: [{backend}]"),
    )
}

fn import_ref(name: &str, rest: &str) -> String {
    format!("{{group: multicluster.x-k8s.io, kind: ServiceImport, name: {name}{rest}}}")
}

fn resolved_refs(out: &Output) -> (bool, Reason, String) {
    let c = route_status(out, "infra", "r")[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    (c.status, c.reason, c.message.clone())
}

#[test]
fn a_service_import_is_dialled_at_its_cluster_set_name() {
    let cases = [
        (
            ", port: 8080",
            "http://shop.infra.svc.clusterset.local:8080",
            BackendProtocol::Http1,
            false,
        ),
        (
            ", port: 9090",
            "http://shop.infra.svc.clusterset.local:9090",
            BackendProtocol::H2c,
            false,
        ),
        (
            ", port: 443",
            "https://shop.infra.svc.clusterset.local:443",
            BackendProtocol::Http1,
            true,
        ),
    ];
    for (rest, url, protocol, tls) in cases {
        let out = run(&[IMPORTS.to_owned(), route_to(&import_ref("shop", rest))].concat());
        assert!(resolved_refs(&out).0, "{rest}");
        let rule = only_rule(&out);
        assert_eq!(rule.backends.len(), 1);
        let backend = &rule.backends[0];
        assert_eq!(backend.url, url);
        assert_eq!(backend.protocol, protocol);
        assert_eq!(backend.unavailable_status, None);
        assert_eq!(
            backend.tls.as_ref().and_then(|t| t.server_name.as_deref()),
            tls.then_some("shop.infra.svc.clusterset.local"),
            "{rest}"
        );
    }
}

#[test]
fn service_import_references_that_do_not_resolve_fail_closed_with_the_spec_reason() {
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: imports, namespace: apps}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}]\n  to: [{group: multicluster.x-k8s.io, kind: ServiceImport}]\n---\n";
    let service_grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: services, namespace: apps}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}]\n  to: [{group: \"\", kind: Service}]\n---\n";
    /// Name, route, extra manifests, and the expected failure (none: resolves).
    type Case<'a> = (&'a str, String, &'a str, Option<(Reason, &'a str)>);
    let cases: [Case<'_>; 6] = [
        (
            "not served",
            route_to(&import_ref("shop", ", port: 8080")),
            "",
            Some((
                Reason::InvalidKind,
                "does not serve multicluster.x-k8s.io/v1alpha1",
            )),
        ),
        (
            "absent",
            route_to(&import_ref("absent", ", port: 8080")),
            IMPORTS,
            Some((
                Reason::BackendNotFound,
                "ServiceImport infra/absent not found",
            )),
        ),
        (
            "port not exported",
            route_to(&import_ref("shop", ", port: 8081")),
            IMPORTS,
            Some((
                Reason::BackendNotFound,
                "ServiceImport infra/shop not found exporting port 8081",
            )),
        ),
        (
            "no grant",
            route_to(&import_ref("billing", ", namespace: apps, port: 8080")),
            IMPORTS,
            Some((
                Reason::RefNotPermitted,
                "reference to ServiceImport apps/billing is not permitted",
            )),
        ),
        (
            "a grant to Services is not one to ServiceImports",
            route_to(&import_ref("billing", ", namespace: apps, port: 8080")),
            &[IMPORTS, service_grant].concat(),
            Some((Reason::RefNotPermitted, "not permitted")),
        ),
        (
            "granted",
            route_to(&import_ref("billing", ", namespace: apps, port: 8080")),
            &[IMPORTS, grant].concat(),
            None,
        ),
    ];
    for (name, route, extra, expected) in cases {
        let out = run(&[extra.to_owned(), route].concat());
        let (status, reason, message) = resolved_refs(&out);
        let backend = &only_rule(&out).backends[0];
        match expected {
            Some((want, text)) => {
                assert_eq!((status, reason), (false, want), "{name}");
                assert!(message.contains(text), "{name}: {message}");
                assert_eq!(backend.unavailable_status, Some(500), "{name}");
            }
            None => {
                assert!(status, "{name}: {message}");
                assert_eq!(backend.url, "http://billing.apps.svc.clusterset.local:8080");
                assert_eq!(backend.unavailable_status, None);
            }
        }
    }
}

#[test]
fn manifests_with_the_service_import_crd_serve_the_api() {
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: serviceimports.multicluster.x-k8s.io}\n---\n";
    let out = run(&[
        crd.to_owned(),
        route_to(&import_ref("absent", ", port: 80")),
    ]
    .concat());
    assert_eq!(resolved_refs(&out).1, Reason::BackendNotFound);
}
