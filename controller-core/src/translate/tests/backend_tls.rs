//! BackendTLSPolicy selection, conflicts and conditions; TLS asked for by Service ports; the
//! Gateway's backend client certificate.

use cftunnel_testkit::pki::TestPki;

use super::*;

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn config_map(name: &str, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: infra}}\ndata:\n  ca.crt: |\n{}---\n",
        indent(ca, 4)
    )
}

fn policy(name: &str, created_at: &str, target: &str, validation: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: infra, generation: 4, creationTimestamp: \"{created_at}\"}}\nspec:\n  targetRefs: [{target}]\n  validation: {validation}\n---\n"
    )
}

const SECURE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: infra}
spec:
  ports:
  - {name: main, port: 8443, targetPort: 3443}
  - {name: admin, port: 9443, targetPort: 4443}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: secure-a, namespace: infra, labels: {kubernetes.io/service-name: secure}}
addressType: IPv4
ports: [{name: main, port: 3443}, {name: admin, port: 4443}]
endpoints: [{addresses: [10.0.9.1]}]
---
"#;

fn route_to(paths: &[(&str, &str, u16)]) -> String {
    let rules: String = paths
        .iter()
        .map(|(path, service, port)| {
            format!("  - matches: [{{path: {{value: {path}}}}}]\n    backendRefs: [{{name: {service}, port: {port}}}]\n")
        })
        .collect();
    http_route(
        "infra",
        "r",
        &format!("  parentRefs: [{{name: gw}}]\n  rules:\n{rules}"),
    )
}

fn backends_of<'a>(out: &'a Output, path: &str) -> &'a [Backend] {
    shared(out)
        .rules
        .iter()
        .find(|r| {
            r.matches
                .first()
                .and_then(|m| m.path.as_ref())
                .is_some_and(|p| p.value == path)
        })
        .map(|r| r.backends.as_slice())
        .expect("a rule for the path")
}

fn ancestors<'a>(out: &'a Output, name: &str) -> &'a [PolicyAncestorStatus] {
    out.statuses
        .backend_tls_policies
        .get(&ObjectKey::new("infra", name))
        .map(Vec::as_slice)
        .expect("every policy has a status entry")
}

fn policy_conditions(out: &Output, name: &str) -> Vec<(ConditionType, bool, Reason)> {
    ancestors(out, name)
        .first()
        .expect("an ancestor")
        .conditions
        .iter()
        .map(|c| (c.kind, c.status, c.reason))
        .collect()
}

fn policy_message(out: &Output, name: &str, kind: ConditionType) -> String {
    ancestors(out, name)[0]
        .condition(kind)
        .expect("condition")
        .message
        .clone()
}

const ACCEPTED: [(ConditionType, bool, Reason); 2] = [
    (ConditionType::Accepted, true, Reason::Accepted),
    (ConditionType::ResolvedRefs, true, Reason::ResolvedRefs),
];

fn ca_ref(name: &str) -> String {
    format!("{{group: \"\", kind: ConfigMap, name: {name}}}")
}

#[test]
fn a_port_policy_is_used_before_a_service_policy_and_both_are_accepted() {
    let ca = TestPki::for_names(&["x"]).expect("pki");
    let extra = [
        SECURE.to_owned(),
        config_map("ca", ca.ca_pem()),
        policy(
            "whole",
            "2024-01-02T00:00:00Z",
            "{group: \"\", kind: Service, name: secure}",
            &format!("{{caCertificateRefs: [{}], hostname: main.internal}}", ca_ref("ca")),
        ),
        policy(
            "admin-port",
            "2024-01-03T00:00:00Z",
            "{group: \"\", kind: Service, name: secure, sectionName: admin}",
            "{wellKnownCACertificates: System, hostname: admin.internal, subjectAltNames: [{type: Hostname, hostname: admin.example.com}, {type: URI, uri: \"spiffe://c/ns/infra/sa/admin\"}]}",
        ),
        route_to(&[("/main", "secure", 8443), ("/admin", "secure", 9443)]),
    ]
    .concat();
    let out = run(&extra);
    let main = &backends_of(&out, "/main")[0];
    assert_eq!(main.url, "https://10.0.9.1:3443");
    let tls = main.tls.as_ref().expect("TLS");
    assert_eq!(tls.server_name.as_deref(), Some("main.internal"));
    assert_eq!(
        tls.ca_bundle.as_deref().map(str::trim),
        Some(ca.ca_pem().trim())
    );
    assert!(tls.client_certificate.is_none());
    let admin = &backends_of(&out, "/admin")[0];
    assert_eq!(admin.url, "https://10.0.9.1:4443");
    let tls = admin.tls.as_ref().expect("TLS");
    assert_eq!(tls.server_name.as_deref(), Some("admin.internal"));
    assert_eq!(tls.ca_bundle, None, "System: the proxy's web roots");
    assert_eq!(
        tls.subject_alt_names,
        ["admin.example.com", "spiffe://c/ns/infra/sa/admin"]
    );
    assert_eq!(policy_conditions(&out, "whole"), ACCEPTED);
    assert_eq!(policy_conditions(&out, "admin-port"), ACCEPTED);
    let a = &ancestors(&out, "whole")[0];
    assert_eq!(
        (
            a.ancestor_ref.namespace.as_str(),
            a.ancestor_ref.name.as_str()
        ),
        ("infra", "gw")
    );
    assert_eq!(a.conditions[0].observed_generation, Some(4));
}

#[test]
fn conflicting_policies_yield_to_the_oldest_then_to_the_first_by_name() {
    let ca = TestPki::for_names(&["x"]).expect("pki");
    let validation = |host: &str| {
        format!(
            "{{caCertificateRefs: [{}], hostname: {host}}}",
            ca_ref("ca")
        )
    };
    let whole = "{group: \"\", kind: Service, name: secure}";
    let admin = "{group: \"\", kind: Service, name: secure, sectionName: admin}";
    let extra = [
        SECURE.to_owned(),
        config_map("ca", ca.ca_pem()),
        policy(
            "newer",
            "2024-01-05T00:00:00Z",
            whole,
            &validation("newer.internal"),
        ),
        policy(
            "older",
            "2024-01-01T00:00:00Z",
            whole,
            &validation("older.internal"),
        ),
        policy(
            "b-same-age",
            "2024-01-01T00:00:00Z",
            admin,
            &validation("b.internal"),
        ),
        policy(
            "a-same-age",
            "2024-01-01T00:00:00Z",
            admin,
            &validation("a.internal"),
        ),
        route_to(&[("/main", "secure", 8443), ("/admin", "secure", 9443)]),
    ]
    .concat();
    let out = run(&extra);
    let host = |path: &str| {
        backends_of(&out, path)[0]
            .tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
    };
    assert_eq!(host("/main").as_deref(), Some("older.internal"));
    assert_eq!(host("/admin").as_deref(), Some("a.internal"));
    assert_eq!(policy_conditions(&out, "older"), ACCEPTED);
    assert_eq!(policy_conditions(&out, "a-same-age"), ACCEPTED);
    for (loser, winner) in [("newer", "infra/older"), ("b-same-age", "infra/a-same-age")] {
        assert_eq!(
            policy_conditions(&out, loser)[0],
            (ConditionType::Accepted, false, Reason::Conflicted),
            "{loser}"
        );
        let message = policy_message(&out, loser, ConditionType::Accepted);
        assert!(message.contains(winner), "{loser}: {message}");
    }
}

#[test]
fn a_policy_without_a_usable_ca_fails_its_backends_closed_and_names_the_field() {
    let ca = TestPki::for_names(&["x"]).expect("pki");
    let policy_for = |name: &str, service: &str, refs: &str| {
        policy(
            name,
            "2024-01-01T00:00:00Z",
            &format!("{{group: \"\", kind: Service, name: {service}}}"),
            &format!("{{caCertificateRefs: [{refs}], hostname: x.internal}}"),
        )
    };
    let service = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: infra}}\nspec: {{ports: [{{name: https, port: 8443}}]}}\n---\n")
    };
    let extra = [
        config_map("ca", ca.ca_pem()),
        config_map("not-pem", "hello"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: no-key, namespace: infra}\ndata: {other: x}\n---\n".to_owned(),
        service("missing"),
        service("kind"),
        service("partial"),
        policy_for("missing", "missing", &ca_ref("absent")),
        policy_for("kind", "kind", "{group: example.com, kind: Bundle, name: ca}"),
        policy_for(
            "partial",
            "partial",
            &format!("{}, {}, {}", ca_ref("no-key"), ca_ref("ca"), ca_ref("not-pem")),
        ),
        route_to(&[
            ("/missing", "missing", 8443),
            ("/kind", "kind", 8443),
            ("/partial", "partial", 8443),
        ]),
    ]
    .concat();
    let out = run(&extra);
    for path in ["/missing", "/kind"] {
        let b = &backends_of(&out, path)[0];
        assert_eq!(b.unavailable_status, Some(500), "{path}");
        assert!(b.url.starts_with("https://"), "never plain text: {}", b.url);
    }
    assert_eq!(
        policy_conditions(&out, "missing"),
        [
            (ConditionType::Accepted, false, Reason::NoValidCACertificate),
            (
                ConditionType::ResolvedRefs,
                false,
                Reason::InvalidCACertificateRef
            ),
        ]
    );
    assert_eq!(
        policy_message(&out, "missing", ConditionType::ResolvedRefs),
        "spec.validation.caCertificateRefs[0]: ConfigMap infra/absent not found"
    );
    assert_eq!(
        policy_conditions(&out, "kind"),
        [
            (ConditionType::Accepted, false, Reason::NoValidCACertificate),
            (ConditionType::ResolvedRefs, false, Reason::InvalidKind),
        ]
    );
    // One usable CA of three: accepted with it, and the others named.
    let partial = &backends_of(&out, "/partial")[0];
    assert_eq!(partial.unavailable_status, None);
    assert_eq!(
        partial
            .tls
            .as_ref()
            .and_then(|t| t.ca_bundle.as_deref())
            .map(str::trim),
        Some(ca.ca_pem().trim())
    );
    assert_eq!(
        policy_conditions(&out, "partial"),
        [
            (ConditionType::Accepted, true, Reason::Accepted),
            (
                ConditionType::ResolvedRefs,
                false,
                Reason::InvalidCACertificateRef
            ),
        ]
    );
    let message = policy_message(&out, "partial", ConditionType::ResolvedRefs);
    assert!(
        message.starts_with("spec.validation.caCertificateRefs[0]: ConfigMap infra/no-key has no key ca.crt; spec.validation.caCertificateRefs[2]: ca.crt of not-pem:"),
        "{message}"
    );
    // The route itself resolves: the Service is there.
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
}

#[test]
fn invalid_policy_settings_are_refused_on_the_policy() {
    let target = "{group: \"\", kind: Service, name: secure}";
    for (validation, message) in [
        (
            "{wellKnownCACertificates: Mozilla, hostname: a.internal}",
            "spec.validation.wellKnownCACertificates: \"Mozilla\" is not supported",
        ),
        (
            "{hostname: a.internal}",
            "spec.validation: one of caCertificateRefs and wellKnownCACertificates must be set",
        ),
        (
            "{wellKnownCACertificates: System, hostname: \"*.internal\"}",
            "spec.validation.hostname:",
        ),
        (
            "{wellKnownCACertificates: System, hostname: a.internal, subjectAltNames: [{type: URI, uri: \"not a uri\"}]}",
            "spec.validation.subjectAltNames[0]:",
        ),
    ] {
        let extra = [
            SECURE.to_owned(),
            policy("p", "2024-01-01T00:00:00Z", target, validation),
            route_to(&[("/main", "secure", 8443)]),
        ]
        .concat();
        let out = run(&extra);
        assert_eq!(
            policy_conditions(&out, "p")[0],
            (ConditionType::Accepted, false, Reason::Invalid),
            "{validation}"
        );
        let got = policy_message(&out, "p", ConditionType::Accepted);
        assert!(got.starts_with(message), "{validation}: {got}");
        assert_eq!(backends_of(&out, "/main")[0].unavailable_status, Some(500));
    }
}

#[test]
fn a_policy_no_route_uses_has_no_ancestors() {
    let extra = [
        SECURE.to_owned(),
        policy(
            "idle",
            "2024-01-01T00:00:00Z",
            "{group: \"\", kind: Service, name: secure}",
            "{wellKnownCACertificates: System, hostname: a.internal}",
        ),
    ]
    .concat();
    assert!(ancestors(&run(&extra), "idle").is_empty());
}

#[test]
fn ports_that_ask_for_tls_are_dialled_over_tls_against_the_web_roots() {
    let extra = [
        r#"
apiVersion: v1
kind: Service
metadata: {name: asks, namespace: infra}
spec:
  ports:
  - {name: https, port: 8443, targetPort: 3443, appProtocol: https}
  - {name: wss, port: 8444, targetPort: 3444, appProtocol: kubernetes.io/wss}
  - {name: std, port: 443, targetPort: 3445}
  - {name: plain, port: 8080, targetPort: 3080}
---
"#
        .to_owned(),
        route_to(&[
            ("/https", "asks", 8443),
            ("/wss", "asks", 8444),
            ("/std", "asks", 443),
            ("/plain", "asks", 8080),
        ]),
    ]
    .concat();
    let out = run(&extra);
    for (path, port, websocket) in [
        ("/https", 8443, false),
        ("/wss", 8444, true),
        ("/std", 443, false),
    ] {
        let b = &backends_of(&out, path)[0];
        assert_eq!(
            b.url,
            format!("https://asks.infra.svc.cluster.local:{port}")
        );
        assert_eq!(b.websocket, websocket, "{path}");
        let tls = b.tls.as_ref().expect("TLS");
        assert_eq!(
            tls.server_name.as_deref(),
            Some("asks.infra.svc.cluster.local")
        );
        assert_eq!(tls.ca_bundle, None);
    }
    let plain = &backends_of(&out, "/plain")[0];
    assert_eq!(plain.url, "http://asks.infra.svc.cluster.local:8080");
    assert!(plain.tls.is_none());
}

fn gateway_with_client_cert(reference: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: mtls, namespace: infra, generation: 7}}\nspec:\n  gatewayClassName: cf\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: mtls.example.com}}]\n  tls: {{backend: {{clientCertificateRef: {reference}}}}}\n---\n"
    )
}

fn tls_secret(namespace: &str, name: &str, pki: &TestPki) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
        indent(&pki.leaf_pem(), 4),
        indent(&pki.key_pem(), 4)
    )
}

fn gateway_resolved_refs(out: &Output) -> Option<(bool, Reason, String)> {
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "mtls")];
    assert!(
        gw.conditions
            .iter()
            .any(|c| c.kind == ConditionType::Accepted && c.status),
        "the Gateway stays accepted: {:?}",
        gw.conditions
    );
    gw.conditions
        .iter()
        .find(|c| c.kind == ConditionType::ResolvedRefs)
        .map(|c| {
            assert_eq!(c.observed_generation, Some(7));
            (c.status, c.reason, c.message.clone())
        })
}

#[test]
fn a_gateway_client_certificate_must_resolve_or_the_gateway_says_why() {
    let client = TestPki::for_names(&["client"]).expect("pki");
    let other = TestPki::for_names(&["other"]).expect("pki");
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: certs, namespace: apps}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: \"\", kind: Secret, name: granted}]\n---\n";
    let mismatched = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: mismatched, namespace: infra}}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
        indent(&client.leaf_pem(), 4),
        indent(&other.key_pem(), 4)
    );
    let cases = [
        (
            "{name: absent}",
            Some((false, Reason::InvalidClientCertificateRef)),
            "Secret infra/absent not found",
        ),
        (
            "{group: wrong.example.com, kind: Secret, name: own}",
            Some((false, Reason::InvalidClientCertificateRef)),
            "unsupported kind",
        ),
        (
            "{kind: ConfigMap, name: own}",
            Some((false, Reason::InvalidClientCertificateRef)),
            "unsupported kind",
        ),
        (
            "{name: mismatched}",
            Some((false, Reason::InvalidClientCertificateRef)),
            "tls.key of Secret infra/mismatched",
        ),
        (
            "{name: ungranted, namespace: apps}",
            Some((false, Reason::RefNotPermitted)),
            "not permitted",
        ),
        (
            "{name: granted, namespace: apps}",
            Some((true, Reason::ResolvedRefs)),
            "",
        ),
        ("{name: own}", Some((true, Reason::ResolvedRefs)), ""),
    ];
    for (reference, expected, message) in cases {
        let extra = [
            gateway_with_client_cert(reference),
            tls_secret("infra", "own", &client),
            tls_secret("apps", "granted", &client),
            tls_secret("apps", "ungranted", &client),
            mismatched.clone(),
            grant.to_owned(),
        ]
        .concat();
        let got = gateway_resolved_refs(&run(&extra));
        assert_eq!(
            got.as_ref().map(|(s, r, _)| (*s, *r)),
            expected,
            "{reference}"
        );
        let got = got.map(|(_, _, m)| m).unwrap_or_default();
        assert!(got.contains(message), "{reference}: {got}");
    }
    let without = run("");
    let gw = &without.statuses.gateways[&ObjectKey::new("infra", "gw")];
    assert!(
        gw.conditions
            .iter()
            .all(|c| c.kind != ConditionType::ResolvedRefs),
        "no client certificate, no condition about it"
    );
}

/// Gateway `mtls` presenting `client`'s certificate, and Service `secure` under a policy
/// naming `a.internal`.
fn mtls_gateway(client: &TestPki) -> String {
    [
        SECURE.to_owned(),
        gateway_with_client_cert("{name: own}"),
        tls_secret("infra", "own", client),
        policy(
            "p",
            "2024-01-01T00:00:00Z",
            "{group: \"\", kind: Service, name: secure}",
            "{wellKnownCACertificates: System, hostname: a.internal}",
        ),
    ]
    .concat()
}

#[test]
fn a_gateway_presents_its_client_certificate_to_its_tls_backends_only() {
    let client = TestPki::for_names(&["client"]).expect("pki");
    let route = |name: &str, gateway: &str| {
        http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: {gateway}}}]\n  rules:\n  - backendRefs: [{{name: secure, port: 8443}}, {{name: v2, port: 8080}}]"),
        )
    };
    let extra = [
        mtls_gateway(&client),
        route("through-mtls", "mtls"),
        route("through-gw", "gw"),
    ]
    .concat();
    let out = run(&extra);
    let rules_of = |route: &str| -> Vec<&Rule> {
        shared(&out)
            .rules
            .iter()
            .filter(|r| r.name.as_deref() == Some(&format!("infra/{route}/0")))
            .collect()
    };
    let through_mtls = rules_of("through-mtls");
    assert!(!through_mtls.is_empty());
    for rule in through_mtls {
        let presented = rule.backends[0]
            .tls
            .as_ref()
            .and_then(|t| t.client_certificate.as_ref())
            .expect("the TLS backend gets the Gateway's certificate");
        assert_eq!(presented.certificate_chain, client.leaf_pem());
        assert_eq!(presented.private_key.trim(), client.key_pem().trim());
        assert!(
            rule.backends[1].tls.is_none(),
            "a plain backend gets nothing"
        );
    }
    let through_gw = rules_of("through-gw");
    assert!(!through_gw.is_empty());
    for rule in through_gw {
        assert!(
            rule.backends[0]
                .tls
                .as_ref()
                .is_some_and(|t| t.client_certificate.is_none()),
            "another Gateway's routes present no certificate"
        );
    }
    // Both Gateways are ancestors of the policy.
    let names: Vec<&str> = ancestors(&out, "p")
        .iter()
        .map(|a| a.ancestor_ref.name.as_str())
        .collect();
    assert_eq!(names, ["gw", "mtls"]);
}

/// A mirror to a Service port dialled over TLS gets its copies over TLS with the backend's
/// settings: the policy's name, and the Gateway's client certificate.
#[test]
fn a_mirror_to_a_tls_backend_is_sent_over_tls_with_the_gateways_certificate() {
    let client = TestPki::for_names(&["client"]).expect("pki");
    let extra = [
        mtls_gateway(&client),
        http_route(
            "infra",
            "copied",
            "  parentRefs: [{name: mtls}]\n  rules:\n  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: secure, port: 8443}}}]\n    backendRefs: [{name: v2, port: 8080}]",
        ),
    ]
    .concat();
    let out = run(&extra);
    let rule = shared(&out)
        .rules
        .iter()
        .find(|r| r.name.as_deref() == Some("infra/copied/0"))
        .expect("the route's rule");
    let mirror = rule
        .filters
        .iter()
        .find_map(|f| f.request_mirror.as_ref())
        .expect("the mirror is kept");
    assert!(
        mirror.backend_url.starts_with("https://"),
        "{}",
        mirror.backend_url
    );
    let tls = mirror.tls.as_ref().expect("the mirror's TLS settings");
    assert_eq!(tls.server_name.as_deref(), Some("a.internal"));
    assert_eq!(
        tls.client_certificate
            .as_ref()
            .map(|c| c.certificate_chain.as_str()),
        Some(client.leaf_pem().as_str())
    );
}
