//! A listener's `tls.certificateRefs`: resolved as the spec asks, though the edge terminates
//! TLS.

use cftunnel_testkit::pki::TestPki;

use super::*;

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn secret(namespace: &str, name: &str, type_: &str, crt: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: {type_}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
        indent(crt, 4),
        indent(key, 4)
    )
}

/// Gateway `edge` in `infra` (generation 3) with an HTTP listener and an HTTPS one naming
/// `reference`, and a route on each.
fn gateway_with_certificate(reference: &str) -> String {
    let gateway = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: infra, generation: 3}}\nspec:\n  gatewayClassName: cf\n  listeners:\n  - {{name: plain, port: 80, protocol: HTTP, hostname: plain.example.com}}\n  - {{name: secure, port: 443, protocol: HTTPS, hostname: secure.example.com, tls: {{certificateRefs: [{reference}]}}}}\n---\n"
    );
    let route = |name: &str, section: &str| {
        http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: edge, sectionName: {section}}}]\n  rules:\n  - backendRefs: [{{name: v2, port: 8080}}]"),
        )
    };
    [
        gateway,
        route("to-plain", "plain"),
        route("to-secure", "secure"),
    ]
    .concat()
}

#[test]
fn listener_certificates_must_resolve_or_the_listener_is_not_programmed() {
    let pki = TestPki::for_names(&["secure.example.com"]).expect("pki");
    let other = TestPki::for_names(&["other"]).expect("pki");
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: certs, namespace: apps}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: \"\", kind: Secret, name: granted}]\n---\n";
    let tls = "kubernetes.io/tls";
    let secrets = [
        secret("infra", "own", tls, &pki.leaf_pem(), &pki.key_pem()),
        secret("apps", "granted", tls, &pki.leaf_pem(), &pki.key_pem()),
        secret("apps", "ungranted", tls, &pki.leaf_pem(), &pki.key_pem()),
        secret("infra", "opaque", "Opaque", &pki.leaf_pem(), &pki.key_pem()),
        secret(
            "infra",
            "malformed",
            tls,
            "not a certificate",
            &pki.key_pem(),
        ),
        secret(
            "infra",
            "mismatched",
            tls,
            &pki.leaf_pem(),
            &other.key_pem(),
        ),
        grant.to_owned(),
    ]
    .concat();
    let invalid = Some((false, Reason::InvalidCertificateRef));
    let cases = [
        ("{name: own}", Some((true, Reason::ResolvedRefs)), ""),
        (
            "{name: granted, namespace: apps}",
            Some((true, Reason::ResolvedRefs)),
            "",
        ),
        (
            "{name: absent}",
            invalid,
            "spec.listeners[1].tls.certificateRefs[0]: Secret infra/absent not found",
        ),
        (
            "{group: example.com, kind: Secret, name: own}",
            invalid,
            "unsupported kind example.com/Secret",
        ),
        ("{kind: ConfigMap, name: own}", invalid, "unsupported kind"),
        (
            "{name: opaque}",
            invalid,
            "is not of type kubernetes.io/tls",
        ),
        (
            "{name: malformed}",
            invalid,
            "tls.crt of Secret infra/malformed",
        ),
        (
            "{name: mismatched}",
            invalid,
            "tls.key of Secret infra/mismatched",
        ),
        (
            "{name: ungranted, namespace: apps}",
            Some((false, Reason::RefNotPermitted)),
            "not permitted by a ReferenceGrant",
        ),
        (
            // Not permitted whether or not the Secret exists: nothing is told of it.
            "{name: absent, namespace: apps}",
            Some((false, Reason::RefNotPermitted)),
            "not permitted by a ReferenceGrant",
        ),
        (
            // One bad reference of two is enough.
            "{name: own}, {name: absent}",
            invalid,
            "certificateRefs[1]: Secret infra/absent not found",
        ),
    ];
    for (reference, expected, message) in cases {
        let out = run(&[gateway_with_certificate(reference), secrets.clone()].concat());
        let secure = listener_status(&out, "infra", "edge", "secure");
        let resolved = secure
            .conditions
            .iter()
            .find(|c| c.kind == ConditionType::ResolvedRefs)
            .expect("ResolvedRefs on the listener");
        assert_eq!(
            Some((resolved.status, resolved.reason)),
            expected,
            "{reference}"
        );
        assert!(
            resolved.message.contains(message),
            "{reference}: {}",
            resolved.message
        );
        assert_eq!(resolved.observed_generation, Some(3));
        let ok = resolved.status;
        // The listener itself is well formed: still accepted, but not programmed.
        assert_eq!(
            listener_condition(secure, ConditionType::Accepted),
            (true, Reason::Accepted),
            "{reference}"
        );
        assert_eq!(
            listener_condition(secure, ConditionType::Programmed),
            if ok {
                (true, Reason::Programmed)
            } else {
                (false, Reason::Invalid)
            },
            "{reference}"
        );
        // Refused on a listener whose references do not resolve, and counted there all the
        // same, as Gateway API's conformance suite asks: the count says what the listener
        // takes down.
        assert_eq!(
            condition(&out, "infra", "to-secure", ConditionType::Accepted),
            if ok {
                (true, Reason::Accepted)
            } else {
                (false, Reason::NoMatchingParent)
            },
            "{reference}"
        );
        assert_eq!(secure.attached_routes, 1, "{reference}");
        let served: Vec<&str> = route_rules(&out)
            .iter()
            .filter(|r| r.name.as_deref() == Some("infra/to-secure/0"))
            .flat_map(|r| r.hostnames.iter().map(String::as_str))
            .collect();
        if ok {
            assert_eq!(served, ["secure.example.com"], "{reference}");
        } else {
            assert!(served.is_empty(), "{reference}: {served:?}");
        }
        // The other listener and the Gateway carry on.
        let plain = listener_status(&out, "infra", "edge", "plain");
        assert_eq!(
            listener_condition(plain, ConditionType::Programmed),
            (true, Reason::Programmed)
        );
        assert_eq!(plain.attached_routes, 1);
        let gw = &out.statuses.gateways[&ObjectKey::new("infra", "edge")];
        let accepted = gw
            .conditions
            .iter()
            .find(|c| c.kind == ConditionType::Accepted)
            .expect("Accepted");
        assert!(accepted.status, "{reference}");
        assert_eq!(
            accepted.reason,
            if ok {
                Reason::Accepted
            } else {
                Reason::ListenersNotValid
            },
            "{reference}"
        );
    }
}

/// Gateway API's GatewayWithAttachedRoutes: a Gateway whose one listener names a Secret that
/// does not exist is not accepted, the route on that listener is refused there
/// (`NoMatchingParent`), and the listener counts it all the same, as that conformance test
/// asks; the route's own missing backend shows in its ResolvedRefs.
#[test]
fn a_listener_with_unresolved_refs_counts_the_routes_attached_to_it() {
    let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: unresolved, namespace: infra}\nspec:\n  gatewayClassName: cf\n  listeners:\n  - {name: tls, port: 443, protocol: HTTPS, allowedRoutes: {kinds: [{kind: HTTPRoute}], namespaces: {from: Same}}, tls: {certificateRefs: [{group: \"\", kind: Secret, name: does-not-exist}], mode: Terminate}}\n---\n";
    let route = http_route(
        "infra",
        "http-route-4",
        "  parentRefs: [{kind: Gateway, name: unresolved, namespace: infra, sectionName: tls}]\n  rules:\n  - backendRefs: [{name: does-not-exist, port: 8080}]",
    );
    let out = run(&[gateway, route.as_str()].concat());
    let tls = listener_status(&out, "infra", "unresolved", "tls");
    assert_eq!(
        condition(&out, "infra", "http-route-4", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    assert_eq!(tls.attached_routes, 1);
    assert!(!listener_condition(tls, ConditionType::Programmed).0);
    assert!(!listener_condition(tls, ConditionType::ResolvedRefs).0);
    assert!(!condition(&out, "infra", "http-route-4", ConditionType::ResolvedRefs).0);
    assert!(route_rules(&out)
        .iter()
        .all(|r| r.name.as_deref() != Some("infra/http-route-4/0")));
}

/// A Gateway that is not accepted serves nothing: its listeners, valid as they are, are not
/// programmed, and the routes on them are refused, so not counted.
#[test]
fn the_listeners_of_a_gateway_not_accepted_are_not_programmed() {
    let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: refused, namespace: infra}\nspec:\n  gatewayClassName: cf\n  infrastructure: {parametersRef: {group: example.com, kind: Unknown, name: nothing}}\n  listeners:\n  - {name: http, port: 80, protocol: HTTP, hostname: refused.example.com}\n---\n";
    let route = http_route(
        "infra",
        "on-refused",
        "  parentRefs: [{name: refused}]\n  rules:\n  - backendRefs: [{name: v2, port: 8080}]",
    );
    let out = run(&[gateway, route.as_str()].concat());
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "refused")];
    let accepted = gw
        .conditions
        .iter()
        .find(|c| c.kind == ConditionType::Accepted)
        .expect("Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (false, Reason::InvalidParameters)
    );
    let http = listener_status(&out, "infra", "refused", "http");
    assert_eq!(
        listener_condition(http, ConditionType::Programmed),
        (false, Reason::Invalid)
    );
    assert_eq!(
        condition(&out, "infra", "on-refused", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    assert_eq!(http.attached_routes, 0);
}

#[test]
fn a_listener_naming_no_certificate_and_an_unknown_route_kind_reports_the_kind() {
    let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: infra}\nspec:\n  gatewayClassName: cf\n  listeners:\n  - {name: none, port: 443, protocol: HTTPS, hostname: a.example.com}\n  - {name: kinds, port: 443, protocol: HTTPS, hostname: b.example.com, allowedRoutes: {kinds: [{kind: TLSRoute}]}, tls: {certificateRefs: [{name: absent}]}}\n---\n";
    let out = run(gateway);
    assert_eq!(
        listener_condition(
            listener_status(&out, "infra", "edge", "none"),
            ConditionType::ResolvedRefs
        ),
        (true, Reason::ResolvedRefs),
        "nothing to resolve: the edge holds the certificate"
    );
    assert_eq!(
        listener_condition(
            listener_status(&out, "infra", "edge", "kinds"),
            ConditionType::ResolvedRefs
        ),
        (false, Reason::InvalidRouteKinds),
        "the first problem found keeps its reason"
    );
}
