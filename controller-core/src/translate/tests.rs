use cftunnel_config::{Backend, BackendProtocol, Config, FilterType, PathMatchType, Rule};

use super::hostname::{intersect, Hosts};
use super::*;
use crate::manifest;

const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: someone-else}
spec: {controllerName: example.com/other}
---
apiVersion: v1
kind: Namespace
metadata: {name: infra, labels: {role: infra}}
---
apiVersion: v1
kind: Namespace
metadata: {name: apps, labels: {role: backend}}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Same}}}
---
apiVersion: v1
kind: Service
metadata: {name: v1, namespace: infra}
spec:
  ports:
  - {name: http, port: 8080, targetPort: 3000}
  - {name: grpc, port: 8081, targetPort: 3001, appProtocol: kubernetes.io/h2c}
  - {name: ws, port: 8082, targetPort: 3000, appProtocol: kubernetes.io/ws}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: v1-a, namespace: infra, labels: {kubernetes.io/service-name: v1}}
addressType: IPv4
ports: [{name: http, port: 3000}, {name: grpc, port: 3001}, {name: ws, port: 3000}]
endpoints:
- addresses: [10.0.0.1]
- addresses: [10.0.0.2]
  conditions: {ready: true}
- addresses: [10.0.0.3]
  conditions: {ready: false}
---
apiVersion: v1
kind: Service
metadata: {name: v2, namespace: infra}
spec: {ports: [{name: http, port: 8080, targetPort: 3000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: v2-a, namespace: infra, labels: {kubernetes.io/service-name: v2}}
addressType: IPv4
ports: [{name: http, port: 3000}]
endpoints:
- addresses: [10.0.1.1]
---
apiVersion: v1
kind: Service
metadata: {name: down, namespace: infra}
spec: {ports: [{port: 8080, targetPort: 3000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: down-a, namespace: infra, labels: {kubernetes.io/service-name: down}}
addressType: IPv4
ports: [{port: 3000}]
endpoints:
- addresses: [10.0.2.1]
  conditions: {ready: false}
---
apiVersion: v1
kind: Service
metadata: {name: dns-only, namespace: infra}
spec: {ports: [{port: 9000, targetPort: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless-dns, namespace: infra}
spec: {clusterIP: None, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: external, namespace: infra}
spec: {type: ExternalName, externalName: api.example.net, ports: [{port: 443}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec: {ports: [{name: http, port: 8080, targetPort: 3000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: web, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 3000}]
endpoints:
- addresses: [10.0.3.1]
"#;

fn snapshot(extra: &str) -> Snapshot {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, BASE, "base").expect("base manifests parse");
    manifest::load_into(&mut snapshot, extra, "test").expect("test manifests parse");
    snapshot
}

fn run(extra: &str) -> Output {
    translate(&snapshot(extra), &Options::default())
}

fn shared(out: &Output) -> &Config {
    out.configs.get(&PlaneKey::Shared).expect("shared plane")
}

fn route_status<'a>(out: &'a Output, ns: &str, name: &str) -> &'a [RouteParentStatus] {
    out.statuses
        .routes
        .get(&RouteKey {
            kind: RouteKind::Http,
            key: ObjectKey::new(ns, name),
        })
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn condition(out: &Output, ns: &str, name: &str, kind: ConditionType) -> (bool, Reason) {
    let parents = route_status(out, ns, name);
    let c = parents
        .first()
        .and_then(|p| p.condition(kind))
        .expect("condition present");
    (c.status, c.reason)
}

fn http_route(ns: &str, name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{body}\n---\n"
    )
}

fn grpc_route(ns: &str, name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{body}\n---\n"
    )
}

/// `manifest` (one object) with a creation timestamp.
fn created(manifest: String, ns: &str, at: &str) -> String {
    manifest.replace(
        &format!("namespace: {ns}}}"),
        &format!("namespace: {ns}, creationTimestamp: \"{at}\"}}"),
    )
}

fn parent_statuses<'a>(
    out: &'a Output,
    kind: RouteKind,
    ns: &str,
    name: &str,
) -> &'a [RouteParentStatus] {
    out.statuses
        .routes
        .get(&RouteKey {
            kind,
            key: ObjectKey::new(ns, name),
        })
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn accepted(out: &Output, kind: RouteKind, ns: &str, name: &str) -> (bool, Reason) {
    let c = parent_statuses(out, kind, ns, name)
        .first()
        .and_then(|p| p.condition(ConditionType::Accepted))
        .expect("Accepted condition present");
    (c.status, c.reason)
}

fn backend(url: &str, weight: u32) -> Backend {
    Backend {
        url: url.to_owned(),
        weight,
        ..Backend::default()
    }
}

/// Route rules of the shared plane, without the listener isolation rules.
fn route_rules(out: &Output) -> Vec<&Rule> {
    shared(out)
        .rules
        .iter()
        .filter(|r| !r.name.as_deref().unwrap_or_default().contains("/listener:"))
        .collect()
}

fn only_rule(out: &Output) -> &Rule {
    let rules = route_rules(out);
    assert_eq!(rules.len(), 1, "{rules:#?}");
    rules[0]
}

#[test]
fn hostname_intersection_keeps_the_more_specific_name() {
    let hosts = |v: &[&'static str]| v.to_vec();
    let cases: &[(Option<&str>, &[&str], Option<Hosts>)] = &[
        (None, &[], Some(Hosts::Any)),
        (None, &["a.com"], Some(Hosts::Some(hosts(&["a.com"])))),
        (Some("a.com"), &[], Some(Hosts::Some(hosts(&["a.com"])))),
        (Some("a.com"), &["b.com"], None),
        (
            Some("*.wildcard.io"),
            &["foo.wildcard.io", "wildcard.io", "x.y.wildcard.io"],
            Some(Hosts::Some(hosts(&["foo.wildcard.io", "x.y.wildcard.io"]))),
        ),
        (
            Some("very.specific.com"),
            &["*.specific.com"],
            Some(Hosts::Some(hosts(&["very.specific.com"]))),
        ),
        (
            Some("*.example.com"),
            &["*.foo.example.com"],
            Some(Hosts::Some(hosts(&["*.foo.example.com"]))),
        ),
        (
            Some("*.foo.example.com"),
            &["*.example.com"],
            Some(Hosts::Some(hosts(&["*.foo.example.com"]))),
        ),
        (
            Some("*.example.com"),
            &["*.example.org", "example.com"],
            None,
        ),
        (
            Some("*.anotherwildcard.io"),
            &["*.anotherwildcard.io"],
            Some(Hosts::Some(hosts(&["*.anotherwildcard.io"]))),
        ),
    ];
    for (listener, route, want) in cases {
        assert_eq!(
            &intersect(*listener, &hosts(route)),
            want,
            "{listener:?} x {route:?}"
        );
    }
}

#[test]
fn route_binds_by_section_name_and_port_or_reports_no_matching_parent() {
    let out = run(&(http_route(
        "infra",
        "ok",
        "  parentRefs: [{name: gw, sectionName: http, port: 80}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    ) + &http_route(
        "infra",
        "bad-section",
        "  parentRefs: [{name: gw, sectionName: http1}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    ) + &http_route(
        "infra",
        "bad-port",
        "  parentRefs: [{name: gw, port: 81}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    )));
    assert_eq!(
        condition(&out, "infra", "ok", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    for name in ["bad-section", "bad-port"] {
        assert_eq!(
            condition(&out, "infra", name, ConditionType::Accepted),
            (false, Reason::NoMatchingParent),
            "{name}"
        );
    }
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "gw")];
    assert_eq!(gw.listeners[0].attached_routes, 1);
    assert_eq!(route_rules(&out).len(), 1);
}

#[test]
fn attached_routes_count_each_accepted_route_once_per_listener() {
    let attached = |out: &Output| {
        out.statuses.gateways[&ObjectKey::new("infra", "gw")].listeners[0].attached_routes
    };
    let twice = http_route(
        "infra",
        "twice",
        "  parentRefs: [{name: gw}, {name: gw, sectionName: http}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&twice);
    let parents = route_status(&out, "infra", "twice");
    assert_eq!(parents.len(), 2);
    assert!(parents.iter().all(|p| p
        .condition(ConditionType::Accepted)
        .is_some_and(|c| c.status)));
    assert_eq!(attached(&out), 1, "two parentRefs, one listener: one route");

    // Attached by its parentRef, refused once its rules are translated: not counted (Gateway
    // API: routes whose Accepted condition is not True MUST NOT be included).
    let all_dropped = http_route(
        "infra",
        "all-dropped",
        "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {type: RegularExpression, value: \"(\"}}], backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&all_dropped);
    assert_eq!(
        condition(&out, "infra", "all-dropped", ConditionType::Accepted),
        (false, Reason::UnsupportedValue)
    );
    assert_eq!(attached(&out), 0);
    assert_eq!(attached(&run(&format!("{twice}{all_dropped}"))), 1);

    // Some rules dropped, others kept: accepted, so counted.
    let part_dropped = http_route(
        "infra",
        "part-dropped",
        "  parentRefs: [{name: gw}]\n  rules:\n  - {matches: [{path: {type: RegularExpression, value: \"(\"}}], backendRefs: [{name: v2, port: 8080}]}\n  - {backendRefs: [{name: v2, port: 8080}]}",
    );
    let out = run(&part_dropped);
    assert_eq!(
        condition(&out, "infra", "part-dropped", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        condition(
            &out,
            "infra",
            "part-dropped",
            ConditionType::PartiallyInvalid
        ),
        (true, Reason::UnsupportedValue)
    );
    assert_eq!(attached(&out), 1);
}

/// Gateway API v1.5 counts in a listener's `attachedRoutes` only the routes whose Accepted
/// condition is True: a route attached to the listener by its parentRef but refused on that
/// Gateway is left out, but by a listener that is not valid, which counts the routes it would
/// take, as Gateway API's conformance (`GatewayWithAttachedRoutes`) asks. Each case has a
/// route accepted on the listener beside the refused one, where the listener can take one.
#[test]
fn attached_routes_leave_out_a_route_refused_on_its_gateway() {
    let on = |gateway: &str, name: &str, rules: &str| {
        http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: {gateway}}}]\n  rules: {rules}"),
        )
    };
    let served = "[{backendRefs: [{name: v2, port: 8080}]}]";
    let open_route = |kind: RouteKind, name: &str, hosts: &str, at: &str| {
        let body = format!(
            "  parentRefs: [{{name: open, namespace: infra}}]\n  hostnames: {hosts}\n  rules: [{{backendRefs: [{{name: web, port: 8080}}]}}]"
        );
        let manifest = match kind {
            RouteKind::Http => http_route("web", name, &body),
            RouteKind::Grpc => grpc_route("web", name, &body),
        };
        created(manifest, "web", at)
    };
    let refused_gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: refused, namespace: infra}\nspec:\n  gatewayClassName: cf\n  infrastructure: {parametersRef: {group: example.com, kind: Unknown, name: nothing}}\n  listeners:\n  - {name: http, port: 80, protocol: HTTP}\n---\n";
    let unresolved_listener = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: unresolved, namespace: infra}\nspec:\n  gatewayClassName: cf\n  listeners:\n  - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: does-not-exist}]}}\n---\n";
    // (case, manifests, Gateway, refused route, its Accepted reason, attachedRoutes)
    let cases = [
        (
            "every rule dropped",
            format!(
                "{}{}",
                on("gw", "kept", served),
                on(
                    "gw",
                    "dropped",
                    "[{matches: [{path: {type: RegularExpression, value: \"(\"}}], backendRefs: [{name: v2, port: 8080}]}]"
                )
            ),
            "gw",
            (RouteKind::Http, "infra", "dropped"),
            Reason::UnsupportedValue,
            1,
        ),
        (
            "the listener held by an older route of the other kind",
            format!(
                "{OPEN_GATEWAY}{}{}",
                open_route(RouteKind::Http, "site", "[a.example.com]", "2026-01-01T00:00:00Z"),
                open_route(RouteKind::Grpc, "api", "[a.example.com]", "2026-01-02T00:00:00Z"),
            ),
            "open",
            (RouteKind::Grpc, "web", "api"),
            Reason::HostnameConflict,
            1,
        ),
        (
            "the Gateway not accepted",
            format!("{refused_gateway}{}", on("refused", "on-refused", served)),
            "refused",
            (RouteKind::Http, "infra", "on-refused"),
            Reason::NoMatchingParent,
            0,
        ),
        (
            "the listener not valid",
            format!("{unresolved_listener}{}", on("unresolved", "on-unresolved", served)),
            "unresolved",
            (RouteKind::Http, "infra", "on-unresolved"),
            Reason::NoMatchingParent,
            // Counted by a listener that is not valid, as Gateway API's conformance asks.
            1,
        ),
    ];
    for (case, manifests, gateway, (kind, ns, name), reason, count) in cases {
        let out = run(&manifests);
        assert_eq!(accepted(&out, kind, ns, name), (false, reason), "{case}");
        let listeners = &out.statuses.gateways[&ObjectKey::new("infra", gateway)].listeners;
        let counts: Vec<i32> = listeners.iter().map(|l| l.attached_routes).collect();
        assert_eq!(counts, vec![count], "{case}");
    }
}

/// The status-only conformance tests (`shared/gwapi/SKIPPED.md`): routes that must not attach.
#[test]
fn routes_that_must_not_attach_report_the_spec_reason() {
    let gateways = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tlsroutes-only, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: tls, port: 443, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {kinds: [{kind: TLSRoute}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: from-all, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}], namespaces: {from: All}}}
---
"#;
    let cases = [
        (
            "infra",
            "disallowed-kind",
            "[{name: tlsroutes-only}]",
            Reason::NotAllowedByListeners,
        ),
        (
            "web",
            "cross-namespace-parent",
            "[{name: gw, namespace: infra}]",
            Reason::NotAllowedByListeners,
        ),
        (
            "infra",
            "port-81",
            "[{name: gw, port: 81}]",
            Reason::NoMatchingParent,
        ),
        (
            "infra",
            "section-http1",
            "[{name: gw, port: 80, sectionName: http1}]",
            Reason::NoMatchingParent,
        ),
        (
            "infra",
            "section-ok-port-81",
            "[{name: from-all, sectionName: http, port: 81}]",
            Reason::NoMatchingParent,
        ),
    ];
    let routes: String = cases
        .iter()
        .map(|(ns, name, parents, _)| {
            http_route(
                ns,
                name,
                &format!("  parentRefs: {parents}\n  rules: [{{backendRefs: [{{name: v2, namespace: infra, port: 8080}}]}}]"),
            )
        })
        .collect();
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: infra}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: web}]\n  to: [{group: \"\", kind: Service}]\n---\n";
    let out = run(&format!("{gateways}{grant}{routes}"));
    for (ns, name, _, reason) in cases {
        assert_eq!(
            condition(&out, ns, name, ConditionType::Accepted),
            (false, reason),
            "{name}"
        );
        assert_eq!(
            condition(&out, ns, name, ConditionType::ResolvedRefs),
            (true, Reason::ResolvedRefs),
            "{name}"
        );
    }
    for gw in ["gw", "tlsroutes-only", "from-all"] {
        let status = &out.statuses.gateways[&ObjectKey::new("infra", gw)];
        assert!(
            status.listeners.iter().all(|l| l.attached_routes == 0),
            "{gw}"
        );
    }
    assert!(route_rules(&out).is_empty());
}

#[test]
fn conditions_carry_the_observed_generation() {
    let out = run(&http_route(
        "infra",
        "bumped",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    )
    .replace("namespace: infra}", "namespace: infra, generation: 2}"));
    let parent = &route_status(&out, "infra", "bumped")[0];
    assert!(!parent.conditions.is_empty());
    assert!(parent
        .conditions
        .iter()
        .all(|c| c.observed_generation == Some(2)));
}

#[test]
fn allowed_routes_filter_namespaces_and_kinds() {
    let gateways = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: selector, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: sel.example.com, allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {role: backend}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: grpc-only, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: GRPCRoute}], namespaces: {from: All}}}
---
"#;
    let routes = http_route(
        "web",
        "cross",
        "  parentRefs: [{name: gw, namespace: infra}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    ) + &http_route(
        "apps",
        "selected",
        "  parentRefs: [{name: selector, namespace: infra}]\n  rules: [{backendRefs: [{name: v2, namespace: infra, port: 8080}]}]",
    ) + &http_route(
        "web",
        "not-selected",
        "  parentRefs: [{name: selector, namespace: infra}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    ) + &http_route(
        "infra",
        "wrong-kind",
        "  parentRefs: [{name: grpc-only}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&format!("{gateways}{routes}"));
    assert_eq!(
        condition(&out, "web", "cross", ConditionType::Accepted),
        (false, Reason::NotAllowedByListeners)
    );
    assert_eq!(
        condition(&out, "apps", "selected", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        condition(&out, "web", "not-selected", ConditionType::Accepted),
        (false, Reason::NotAllowedByListeners)
    );
    assert_eq!(
        condition(&out, "infra", "wrong-kind", ConditionType::Accepted),
        (false, Reason::NotAllowedByListeners)
    );
    let rule = only_rule(&out);
    assert_eq!(rule.hostnames, vec!["sel.example.com".to_owned()]);
}

#[test]
fn route_without_intersecting_hostname_is_not_attached() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: named, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: very.specific.com}
  - {name: b, port: 80, protocol: HTTP, hostname: "*.wildcard.io"}
---
"#;
    let out = run(&format!(
        "{gateway}{}{}",
        http_route(
            "infra",
            "none",
            "  parentRefs: [{name: named}]\n  hostnames: [specific.com, wildcard.io]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"
        ),
        http_route(
            "infra",
            "some",
            "  parentRefs: [{name: named}]\n  hostnames: [non.matching.com, very.specific.com, foo.wildcard.io]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"
        )
    ));
    assert_eq!(
        condition(&out, "infra", "none", ConditionType::Accepted),
        (false, Reason::NoMatchingListenerHostname)
    );
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "named")];
    assert_eq!(
        gw.listeners
            .iter()
            .map(|l| l.attached_routes)
            .collect::<Vec<_>>(),
        vec![1, 1]
    );
    assert_eq!(
        only_rule(&out).hostnames,
        vec!["foo.wildcard.io".to_owned(), "very.specific.com".to_owned()]
    );
}

#[test]
fn listener_hostnames_end_with_a_404_rule_so_listeners_stay_isolated() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: iso, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: any, port: 80, protocol: HTTP}
  - {name: wild, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: abc, port: 80, protocol: HTTP, hostname: abc.example.com}
---
"#;
    let out = run(&format!(
        "{gateway}{}",
        http_route(
            "infra",
            "on-any",
            "  parentRefs: [{name: iso, sectionName: any}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"
        )
    ));
    let rules = &shared(&out).rules;
    let tail: Vec<_> = rules
        .iter()
        .map(|r| {
            (
                r.name.as_deref().unwrap_or_default(),
                r.hostnames.clone(),
                r.unavailable_status,
            )
        })
        .collect();
    assert_eq!(
        tail,
        vec![
            ("infra/on-any/0", vec![], None),
            (
                "infra/iso/listener:wild",
                vec!["*.example.com".to_owned()],
                Some(404)
            ),
            (
                "infra/iso/listener:abc",
                vec!["abc.example.com".to_owned()],
                Some(404)
            ),
        ]
    );
    let catch_all = rules[1].matches[0].path.as_ref().expect("path");
    assert_eq!(
        (catch_all.kind, catch_all.value.as_str()),
        (PathMatchType::RegularExpression, ".*")
    );
}

#[test]
fn route_hostnames_inside_a_more_specific_listener_are_left_to_it() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: iso, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: any, port: 80, protocol: HTTP}
  - {name: wild, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: abc, port: 80, protocol: HTTP, hostname: abc.example.com}
---
"#;
    let route = |name: &str, section: &str, hosts: &str| {
        http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: iso, sectionName: {section}}}]\n  hostnames: {hosts}\n  rules: [{{backendRefs: [{{name: v2, port: 8080}}]}}]"),
        )
    };
    let out = run(&format!(
        "{gateway}{}{}{}",
        route(
            "on-any",
            "any",
            "[bar.com, \"*.example.com\", x.example.com]"
        ),
        route("on-wild", "wild", "[abc.example.com, foo.example.com]"),
        route("all-shadowed", "any", "[abc.example.com]"),
    ));
    let hosts: Vec<_> = route_rules(&out)
        .iter()
        .map(|r| (r.name.clone().unwrap_or_default(), r.hostnames.clone()))
        .collect();
    assert_eq!(
        hosts,
        vec![
            ("infra/on-any/0".to_owned(), vec!["bar.com".to_owned()]),
            (
                "infra/on-wild/0".to_owned(),
                vec!["foo.example.com".to_owned()]
            ),
        ]
    );
    assert_eq!(
        condition(&out, "infra", "all-shadowed", ConditionType::Accepted),
        (true, Reason::Accepted),
        "attachment follows the spec's intersection; only the data plane leaves the host to its listener"
    );
}

#[test]
fn service_weight_is_split_evenly_across_ready_endpoints() {
    let out = run(&http_route(
        "infra",
        "split",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v1, port: 8080, weight: 3}, {name: v2, port: 8080, weight: 1}, {name: down, port: 8080, weight: 0}]}]",
    ));
    let rule = only_rule(&out);
    let down = Backend {
        unavailable_status: Some(503),
        ..backend("http://down.infra.svc.cluster.local:8080", 0)
    };
    assert_eq!(
        rule.backends,
        vec![
            backend("http://10.0.0.1:3000", 3),
            backend("http://10.0.0.2:3000", 3),
            backend("http://10.0.1.1:3000", 2),
            down,
        ]
    );
    assert_eq!(rule.name.as_deref(), Some("infra/split/0"));
    assert_eq!(
        condition(&out, "infra", "split", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
}

/// An `FQDN` EndpointSlice names hosts whoever writes EndpointSlices in the namespace picks,
/// with no Service of theirs behind them: its endpoints are left out, as kube-proxy leaves them,
/// so a selector-less Service cannot lead the proxy into the cluster's API server, another
/// namespace's Service or the node. A Service with nothing else has no ready endpoint (503).
#[test]
fn fqdn_endpoint_slices_are_not_dialled() {
    let fqdn_slice = |service: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {service}-fqdn, namespace: infra, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: FQDN\nports: [{{port: 443}}]\nendpoints:\n- addresses: [kubernetes.default.svc.cluster.local]\n- addresses: [web.web.svc.cluster.local]\n- addresses: [localhost]\n---\n"
        )
    };
    let objects = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: names, namespace: infra}}\nspec: {{ports: [{{port: 8080, targetPort: 443}}]}}\n---\n{}apiVersion: v1\nkind: Service\nmetadata: {{name: mixed, namespace: infra}}\nspec: {{ports: [{{port: 8080, targetPort: 443}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: mixed-a, namespace: infra, labels: {{kubernetes.io/service-name: mixed}}}}\naddressType: IPv4\nports: [{{port: 443}}]\nendpoints:\n- addresses: [10.0.4.1]\n---\n{}{}",
        fqdn_slice("names"),
        fqdn_slice("mixed"),
        http_route(
            "infra",
            "r",
            "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: names, port: 8080}, {name: mixed, port: 8080}]}]",
        ),
    );
    let out = run(&objects);
    assert_eq!(
        only_rule(&out).backends,
        vec![
            Backend {
                unavailable_status: Some(503),
                ..backend("http://names.infra.svc.cluster.local:8080", 1)
            },
            backend("http://10.0.4.1:443", 1),
        ]
    );
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
}

#[test]
fn app_protocol_dns_fallback_and_external_name_shape_the_backend() {
    let out = run(&http_route(
        "infra",
        "kinds",
        "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {value: /h2c}}]\n    backendRefs: [{name: v1, port: 8081}]\n  - matches: [{path: {value: /ws}}]\n    backendRefs: [{name: v1, port: 8082}]\n  - matches: [{path: {value: /dns}}]\n    backendRefs: [{name: dns-only, port: 9000}]\n  - matches: [{path: {value: /ext}}]\n    backendRefs: [{name: external, port: 443}]\n  - matches: [{path: {value: /headless}}]\n    backendRefs: [{name: headless-dns, port: 80}]",
    ));
    let rules = &shared(&out).rules;
    let h2c = Backend {
        protocol: BackendProtocol::H2c,
        ..backend("http://10.0.0.1:3001", 1)
    };
    assert_eq!(rules[0].backends[0], h2c);
    assert!(rules[1]
        .backends
        .iter()
        .all(|b| b.websocket && b.url.ends_with(":3000")));
    assert_eq!(
        rules[2].backends,
        vec![backend("http://dns-only.infra.svc.cluster.local:9000", 1)]
    );
    assert_eq!(
        rules[3].backends,
        vec![Backend {
            public_only: true,
            tls: Some(cftunnel_config::BackendTls {
                server_name: Some("api.example.net".to_owned()),
                ..cftunnel_config::BackendTls::default()
            }),
            ..backend("https://api.example.net.:443", 1)
        }],
        "an ExternalName outside the cluster is dialled as an absolute name, at public \
         addresses, over TLS on port 443, checked for its name against the web roots"
    );
    assert_eq!(
        rules[4].backends,
        vec![backend(
            "http://headless-dns.infra.svc.cluster.local:8080",
            1
        )],
        "a headless Service's name resolves to pods, which listen on the target port"
    );
}

#[test]
fn port_443_is_dialled_in_the_clear_when_its_app_protocol_says_so() {
    let mut extra = String::new();
    for (name, app_protocol, target) in [
        ("grpc", "kubernetes.io/h2c", 50051),
        ("plain", "http", 8080),
        ("bare", "", 8443),
    ] {
        let app_protocol = if app_protocol.is_empty() {
            String::new()
        } else {
            format!(", appProtocol: {app_protocol}")
        };
        extra.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: infra}}\nspec: {{ports: [{{port: 443, targetPort: {target}{app_protocol}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-a, namespace: infra, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{port: {target}{app_protocol}}}]\nendpoints: [{{addresses: [10.0.9.1]}}]\n---\n"
        ));
    }
    extra.push_str(&http_route(
        "infra",
        "r",
        "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {value: /grpc}}]\n    backendRefs: [{name: grpc, port: 443}]\n  - matches: [{path: {value: /plain}}]\n    backendRefs: [{name: plain, port: 443}]\n  - matches: [{path: {value: /bare}}]\n    backendRefs: [{name: bare, port: 443}]",
    ));
    let out = run(&extra);
    let urls: Vec<(&str, Option<&str>, BackendProtocol)> = shared(&out)
        .rules
        .iter()
        .map(|r| {
            let b = &r.backends[0];
            let server_name = b.tls.as_ref().and_then(|t| t.server_name.as_deref());
            (b.url.as_str(), server_name, b.protocol)
        })
        .collect();
    assert_eq!(
        urls,
        [
            ("http://10.0.9.1:50051", None, BackendProtocol::H2c),
            ("http://10.0.9.1:8080", None, BackendProtocol::default()),
            (
                "https://10.0.9.1:8443",
                Some("bare.infra.svc.cluster.local"),
                BackendProtocol::default()
            ),
        ]
    );
}

/// What becomes of a rule splitting between ExternalName Service `ext` (to `target`) and
/// Service `v2`, with `options`: the rule's backends and the route's `ResolvedRefs`.
fn external_name_split(target: &str, options: &Options) -> (Vec<Backend>, Condition) {
    let extra = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: infra}}\nspec: {{type: ExternalName, externalName: \"{target}\", ports: [{{port: 8080}}]}}\n---\n{}",
        http_route(
            "infra",
            "r",
            "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: ext, port: 8080}, {name: v2, port: 8080}]}]",
        )
    );
    let out = translate(&snapshot(&extra), options);
    let resolved = route_status(&out, "infra", "r")
        .first()
        .and_then(|p| p.condition(ConditionType::ResolvedRefs))
        .cloned()
        .expect("ResolvedRefs present");
    (only_rule(&out).backends.clone(), resolved)
}

fn external_names(admitted: ExternalNameBackends) -> Options {
    Options {
        external_name_backends: admitted,
        ..Options::default()
    }
}

/// The refused `ext` fails closed with 500 while `v2` keeps serving, and `ResolvedRefs` names
/// the Service and says why.
fn assert_refused(target: &str, options: &Options, why: &str) {
    let (backends, resolved) = external_name_split(target, options);
    assert_eq!(
        backends,
        vec![
            Backend {
                unavailable_status: Some(500),
                ..backend("http://ext.infra.svc.cluster.local:8080", 1)
            },
            backend("http://10.0.1.1:3000", 1),
        ],
        "{target}"
    );
    assert_eq!(
        (resolved.status, resolved.reason),
        (false, Reason::InvalidKind),
        "{target}"
    );
    let message = &resolved.message;
    assert!(
        message.contains("Service infra/ext of type ExternalName is refused")
            && message.contains(why),
        "{target}: {message}"
    );
}

/// The admitted `ext` is dialled at `url`, restricted to public addresses in `external` mode
/// only; `v2`, a Service of the cluster, never is.
fn assert_admitted(target: &str, options: &Options, url: &str) {
    let (backends, resolved) = external_name_split(target, options);
    let ext = Backend {
        public_only: options.external_name_backends == ExternalNameBackends::External,
        ..backend(url, 1)
    };
    assert_eq!(
        backends,
        vec![ext, backend("http://10.0.1.1:3000", 1)],
        "{target}"
    );
    assert_eq!(
        (resolved.status, resolved.reason),
        (true, Reason::ResolvedRefs),
        "{target}"
    );
}

#[test]
fn external_name_backends_outside_the_cluster_are_dialled_as_absolute_names_by_default() {
    let options = Options::default();
    assert_eq!(
        options.external_name_backends,
        ExternalNameBackends::External
    );
    // Absolute, `svc.other-ns.` is never looked up as `svc.other-ns.svc.cluster.local`
    // through the proxy pod's search domains.
    assert_admitted("svc.other-ns", &options, "http://svc.other-ns.:8080");
    assert_admitted("api.example.net", &options, "http://api.example.net.:8080");
    assert_admitted("api.example.net.", &options, "http://api.example.net.:8080");
    assert_admitted(
        "cluster.local.example.com",
        &options,
        "http://cluster.local.example.com.:8080",
    );
}

#[test]
fn external_name_backends_inside_the_cluster_are_refused_by_default() {
    let options = Options::default();
    for (target, why) in [
        (
            "x.other-ns.svc.cluster.local",
            "under the cluster domain cluster.local",
        ),
        (
            "x.other-ns.svc.cluster.local.",
            "under the cluster domain cluster.local",
        ),
        ("cluster.local", "under the cluster domain cluster.local"),
        (
            "10-0-0-7.other-ns.pod.cluster.local",
            "under the cluster domain",
        ),
        ("10.0.0.7", "is an IP address"),
        // Legacy IPv4 forms the resolver reads as addresses too.
        ("10.7", "is an IP address"),
        ("167772167", "is an IP address"),
        ("0x7f000001", "is an IP address"),
        ("localhost", "names the proxy's own host"),
        ("admin.localhost", "names the proxy's own host"),
        ("kubernetes", "is a single label"),
        ("Not A Name", "is not a DNS name"),
        ("", "is not a DNS name"),
    ] {
        assert_refused(target, &options, why);
    }
    // The cluster's own domain, whatever it is.
    let options = Options {
        cluster_domain: "corp.internal".to_owned(),
        ..Options::default()
    };
    let (backends, resolved) = external_name_split("x.other-ns.svc.corp.internal", &options);
    assert_eq!(backends[0].unavailable_status, Some(500));
    assert!(
        resolved
            .message
            .contains("under the cluster domain corp.internal"),
        "{}",
        resolved.message
    );
}

/// Multi-cluster Services (KEP-1645) are named under `clusterset.local`, whatever the cluster
/// domain: such a name reaches Services of this cluster and its peers.
#[test]
fn external_name_backends_under_clusterset_local_are_refused_by_default() {
    let options = Options::default();
    for target in [
        "x.other-ns.svc.clusterset.local",
        "x.other-ns.svc.clusterset.local.",
        "clusterset.local",
    ] {
        assert_refused(target, &options, "is under clusterset.local");
    }
    assert_admitted(
        "clusterset.local.example.com",
        &options,
        "http://clusterset.local.example.com.:8080",
    );
}

/// `external` judges the name as written: where a public name resolves is not known here, so
/// one whose record may point into the cluster is admitted, and left to the proxy, which dials
/// it at public addresses only (`publicOnly`).
#[test]
fn external_name_backends_are_judged_by_name_not_by_where_they_resolve() {
    let options = Options::default();
    for (target, url) in [
        ("10.96.12.34.nip.io", "http://10.96.12.34.nip.io.:8080"),
        ("10-96-12-34.sslip.io", "http://10-96-12-34.sslip.io.:8080"),
        ("db.corp.internal", "http://db.corp.internal.:8080"),
    ] {
        assert_admitted(target, &options, url);
    }
}

/// Only `external` asks the proxy to dial public addresses only: `any` admits in-cluster
/// targets on purpose, and a Service of the cluster is dialled at its endpoints.
#[test]
fn external_name_backends_are_public_only_in_external_mode_alone() {
    let public_only = |admitted| {
        let (backends, _) = external_name_split("api.example.net", &external_names(admitted));
        backends.iter().map(|b| b.public_only).collect::<Vec<_>>()
    };
    assert_eq!(public_only(ExternalNameBackends::External), [true, false]);
    assert_eq!(public_only(ExternalNameBackends::Any), [false, false]);
}

/// A mirror to an ExternalName Service is checked as a backend to one is: its copies go only
/// to public addresses in `external` mode, and anywhere in `any`; a mirror to a Service of the
/// cluster never is.
#[test]
fn mirrors_to_external_name_backends_are_public_only_in_external_mode_alone() {
    let mirrors = |admitted| {
        let extra = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: infra}}\nspec: {{type: ExternalName, externalName: api.example.net, ports: [{{port: 8080}}]}}\n---\n{}",
            http_route(
                "infra",
                "m",
                "  parentRefs: [{name: gw}]\n  rules:\n  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: ext, port: 8080}}}, {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 8080}}}]\n    backendRefs: [{name: v2, port: 8080}]",
            )
        );
        let out = translate(&snapshot(&extra), &external_names(admitted));
        only_rule(&out)
            .filters
            .iter()
            .map(|f| {
                let m = f.request_mirror.as_ref().expect("a mirror");
                (m.backend_url.clone(), m.public_only)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        mirrors(ExternalNameBackends::External),
        [
            ("http://api.example.net.:8080".to_owned(), true),
            ("http://10.0.1.1:3000".to_owned(), false)
        ]
    );
    assert_eq!(
        mirrors(ExternalNameBackends::Any),
        [
            ("http://api.example.net:8080".to_owned(), false),
            ("http://10.0.1.1:3000".to_owned(), false)
        ]
    );
}

#[test]
fn external_name_backends_deny_refuses_every_name() {
    let options = external_names(ExternalNameBackends::Deny);
    for target in [
        "api.example.net",
        "svc.other-ns",
        "x.other-ns.svc.cluster.local",
        "10.0.0.7",
    ] {
        assert_refused(target, &options, "--external-name-backends=deny");
    }
}

#[test]
fn external_name_backends_any_dials_every_name_as_written() {
    let options = external_names(ExternalNameBackends::Any);
    assert_admitted("svc.other-ns", &options, "http://svc.other-ns:8080");
    assert_admitted(
        "x.other-ns.svc.cluster.local",
        &options,
        "http://x.other-ns.svc.cluster.local:8080",
    );
    assert_admitted("10.0.0.7", &options, "http://10.0.0.7:8080");
    assert_admitted("api.example.net", &options, "http://api.example.net:8080");
    // Only what the API server would never store is refused: the proxy would refuse the
    // whole push.
    assert_refused("a b", &options, "is not a DNS name");
}

#[test]
fn refused_external_name_backends_of_grpc_routes_and_mirrors_fail_closed() {
    let ext = "apiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: infra}\nspec: {type: ExternalName, externalName: x.web.svc.cluster.local, ports: [{port: 8080}]}\n---\n";
    let out = run(&format!(
        "{ext}{}{}",
        grpc_route(
            "infra",
            "g",
            "  parentRefs: [{name: gw}]\n  hostnames: [grpc.example.com]\n  rules: [{backendRefs: [{name: ext, port: 8080}]}]",
        ),
        http_route(
            "infra",
            "m",
            "  parentRefs: [{name: gw}]\n  hostnames: [mirror.example.com]\n  rules:\n  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: ext, port: 8080}}}]\n    backendRefs: [{name: v2, port: 8080}]",
        )
    ));
    let grpc = parent_statuses(&out, RouteKind::Grpc, "infra", "g")[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    assert_eq!((grpc.status, grpc.reason), (false, Reason::InvalidKind));
    assert!(
        grpc.message
            .contains("Service infra/ext of type ExternalName is refused"),
        "{}",
        grpc.message
    );
    assert_eq!(
        condition(&out, "infra", "m", ConditionType::ResolvedRefs),
        (false, Reason::InvalidKind)
    );
    for rule in route_rules(&out) {
        match rule.name.as_deref() {
            Some("infra/g/0") => assert!(
                rule.backends
                    .iter()
                    .all(|b| b.unavailable_status == Some(500)),
                "{rule:#?}"
            ),
            Some("infra/m/0") => {
                assert!(rule.filters.is_empty(), "no mirror to a refused name");
                assert_eq!(rule.backends, vec![backend("http://10.0.1.1:3000", 1)]);
            }
            other => panic!("unexpected rule {other:?}"),
        }
    }
}

#[test]
fn invalid_backend_references_fail_closed_with_the_spec_reason() {
    let cases = [
        (
            "{group: unknown.example.com, kind: Thing, name: v1, port: 8080}",
            Reason::InvalidKind,
        ),
        ("{name: missing, port: 8080}", Reason::BackendNotFound),
        (
            "{name: web, namespace: web, port: 8080}",
            Reason::RefNotPermitted,
        ),
        ("{name: v1, port: 9999}", Reason::BackendNotFound),
    ];
    for (backend_ref, reason) in cases {
        let out = run(&http_route(
            "infra",
            "r",
            &format!("  parentRefs: [{{name: gw}}]\n  rules: [{{backendRefs: [{backend_ref}]}}]"),
        ));
        assert_eq!(
            condition(&out, "infra", "r", ConditionType::ResolvedRefs),
            (false, reason),
            "{backend_ref}"
        );
        assert_eq!(
            condition(&out, "infra", "r", ConditionType::Accepted),
            (true, Reason::Accepted)
        );
        let rule = only_rule(&out);
        assert_eq!(rule.backends.len(), 1);
        assert_eq!(
            rule.backends[0].unavailable_status,
            Some(500),
            "{backend_ref}"
        );
    }
}

#[test]
fn reference_grant_permits_cross_namespace_backends() {
    let grant = |to_name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: web}}\nspec:\n  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}}]\n  to: [{{group: \"\", kind: Service, name: {to_name}}}]\n---\n"
        )
    };
    let route = http_route(
        "infra",
        "r",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: web, namespace: web, port: 8080}]}]",
    );
    let out = run(&format!("{}{route}", grant("web")));
    assert_eq!(
        only_rule(&out).backends,
        vec![backend("http://10.0.3.1:3000", 1)]
    );
    let out = run(&format!("{}{route}", grant("other")));
    assert_eq!(only_rule(&out).backends[0].unavailable_status, Some(500));
}

#[test]
fn rules_without_backends_answer_500_unless_they_redirect() {
    let out = run(&http_route(
        "infra",
        "r",
        "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {type: Exact, value: /none}}]\n  - matches: [{path: {type: Exact, value: /redirect}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: example.org}}]",
    ));
    let rules = &shared(&out).rules;
    assert_eq!(rules[0].unavailable_status, Some(500));
    assert_eq!(rules[1].unavailable_status, None);
    let redirect = rules[1].filters[0]
        .request_redirect
        .as_ref()
        .expect("redirect");
    assert_eq!(redirect.hostname.as_deref(), Some("example.org"));
    assert_eq!(
        redirect.port, None,
        "the HTTP listener's port 80 stays out of the redirect"
    );
}

/// A Gateway with an HTTP and an HTTPS listener for one hostname, the HTTP one redirecting to
/// https: both reach the proxy through the tunnel, and the scheme the edge received each
/// request with (`X-Forwarded-Proto`) decides the listener, whichever route is older. A route
/// on both listeners serves both schemes. Without an HTTPS listener nothing changes.
#[test]
fn an_http_listener_redirecting_to_https_does_not_catch_the_https_listener_requests() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: shop.example.com}
  - {name: https, port: 443, protocol: HTTPS, hostname: shop.example.com}
---
"#;
    let redirect = http_route(
        "infra",
        "to-https",
        "  parentRefs: [{name: web, sectionName: http}]\n  rules:\n  - filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]",
    )
    .replace("namespace: infra}", "namespace: infra, creationTimestamp: \"2026-01-01T00:00:00Z\"}");
    let site = http_route(
        "infra",
        "site",
        "  parentRefs: [{name: web, sectionName: https}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let both = created(
        http_route(
            "infra",
            "health",
            "  parentRefs: [{name: web}]\n  rules: [{matches: [{path: {type: Exact, value: /healthz}}], backendRefs: [{name: v2, port: 8080}]}]",
        ),
        "infra",
        "2026-06-01T00:00:00Z",
    );
    // Newer than `health`, on the HTTPS listener only, with the same match: the older route
    // keeps it for https too.
    let shadowed = http_route(
        "infra",
        "zz-health",
        "  parentRefs: [{name: web, sectionName: https}]\n  rules: [{matches: [{path: {type: Exact, value: /healthz}}], backendRefs: [{name: v2, port: 8080}]}]",
    )
    .replace("namespace: infra}", "namespace: infra, creationTimestamp: \"2030-01-01T00:00:00Z\"}");
    let out = run(&format!("{gateway}{redirect}{site}{both}{shadowed}"));
    let routes = proxy_routes(shared(&out));
    let pick = |scheme: &str, path: &str| picked(&routes, scheme, "shop.example.com", path);
    assert_eq!(pick("http", "/cart").as_deref(), Some("infra/to-https/0"));
    assert_eq!(pick("https", "/cart").as_deref(), Some("infra/site/0"));
    assert_eq!(pick("http", "/healthz").as_deref(), Some("infra/health/0"));
    assert_eq!(pick("https", "/healthz").as_deref(), Some("infra/health/0"));

    // Only where both schemes' listeners take a host: an HTTP listener without hostname
    // serves every other host whatever the scheme the edge used (with "Always Use HTTPS"
    // every request arrives as https), and the HTTPS listener's host of either scheme it does
    // not take falls through to it.
    let catch_all = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: web, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: https, port: 443, protocol: HTTPS, hostname: secure.example.com}
---
"#;
    let any = http_route(
        "infra",
        "any",
        "  parentRefs: [{name: web, sectionName: http}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let secure = http_route(
        "infra",
        "secure",
        "  parentRefs: [{name: web, sectionName: https}]\n  rules: [{matches: [{path: {value: /app}}], backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&format!("{catch_all}{any}{secure}"));
    let routes = proxy_routes(shared(&out));
    let pick = |scheme: &str, host: &str, path: &str| picked(&routes, scheme, host, path);
    assert_eq!(
        pick("https", "other.example.com", "/").as_deref(),
        Some("infra/any/0")
    );
    assert_eq!(
        pick("http", "other.example.com", "/").as_deref(),
        Some("infra/any/0")
    );
    assert_eq!(
        pick("https", "secure.example.com", "/app").as_deref(),
        Some("infra/secure/0")
    );
    assert_eq!(
        pick("http", "secure.example.com", "/app").as_deref(),
        Some("infra/any/0"),
        "an http request for the HTTPS listener's host is the HTTP listener's"
    );
    assert_eq!(
        pick("https", "secure.example.com", "/other").as_deref(),
        Some("infra/web/listener:https"),
        "the HTTPS listener keeps its host to its routes"
    );

    // One scheme only: rules are as they were, no header to match.
    let out = run(&format!(
        "{}{redirect}",
        gateway.replace(
            "  - {name: https, port: 443, protocol: HTTPS, hostname: shop.example.com}\n",
            ""
        )
    ));
    assert!(!shared(&out).rules.is_empty());
    assert!(shared(&out)
        .rules
        .iter()
        .all(|r| r.matches.iter().all(|m| m.headers.is_empty())));
}

/// A Gateway `web` in `infra` with an HTTPS listener and an HTTP listener for any host and an
/// HTTP listener for `legacy.example.com`, and `redirect`, attached to the HTTP listener for
/// any host alone, sending every request to https. Older than the base Gateway gw: it keeps its
/// HTTP listener for any host over gw's.
const HTTPS_APP_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: https, port: 443, protocol: HTTPS}
  - {name: http, port: 80, protocol: HTTP}
  - {name: http-legacy, port: 80, protocol: HTTP, hostname: legacy.example.com}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: redirect, namespace: infra, creationTimestamp: "2026-06-01T00:00:00Z"}
spec:
  parentRefs: [{name: web, sectionName: http}]
  rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]}]
---
"#;

/// A route serves each of its hostnames over the schemes of the listeners it is attached
/// through for that hostname, not over every scheme of its listeners: `app2.example.com`,
/// reached only through the HTTPS listener, is not served over http, where the HTTP
/// listener's redirect takes it, while `legacy.example.com`, attached through an HTTP listener
/// too, is served over both.
#[test]
fn a_hostname_attached_only_through_https_is_not_served_over_http() {
    let app2 = created(
        http_route(
            "infra",
            "app2",
            "  parentRefs: [{name: web, sectionName: https}, {name: web, sectionName: http-legacy}]\n  hostnames: [app2.example.com, legacy.example.com]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
        ),
        "infra",
        "2026-01-01T00:00:00Z",
    );
    let out = run(&format!("{HTTPS_APP_GATEWAY}{app2}"));
    assert_eq!(
        accepted(&out, RouteKind::Http, "infra", "app2"),
        (true, Reason::Accepted)
    );
    let routes = proxy_routes(shared(&out));
    picks(
        &routes,
        &[
            ("http", "app2.example.com", "infra/redirect/0"),
            ("https", "app2.example.com", "infra/app2/0"),
            ("http", "legacy.example.com", "infra/app2/0"),
            ("https", "legacy.example.com", "infra/app2/0"),
            ("http", "other.example.com", "infra/redirect/0"),
        ],
    );
}

/// The same with listeners that all have hostnames, the redirect's own listener for
/// `app2.example.com`: the older route does not take that listener's plain requests
/// through its HTTPS listener's wildcard.
#[test]
fn a_hostname_attached_only_through_https_is_not_served_over_http_by_an_older_route() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: https, port: 443, protocol: HTTPS, hostname: "*.example.com"}
  - {name: http, port: 80, protocol: HTTP, hostname: app2.example.com}
  - {name: http-legacy, port: 80, protocol: HTTP, hostname: legacy.example.com}
---
"#;
    let redirect = created(
        http_route(
            "infra",
            "redirect",
            "  parentRefs: [{name: web, sectionName: http}]\n  rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]}]",
        ),
        "infra",
        "2026-06-01T00:00:00Z",
    );
    let app2 = created(
        http_route(
            "infra",
            "app2",
            "  parentRefs: [{name: web, sectionName: https}, {name: web, sectionName: http-legacy}]\n  hostnames: [app2.example.com, legacy.example.com]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
        ),
        "infra",
        "2026-01-01T00:00:00Z",
    );
    let out = run(&format!("{gateway}{redirect}{app2}"));
    let routes = proxy_routes(shared(&out));
    picks(
        &routes,
        &[
            ("http", "app2.example.com", "infra/redirect/0"),
            ("https", "app2.example.com", "infra/app2/0"),
            ("http", "legacy.example.com", "infra/app2/0"),
            ("https", "legacy.example.com", "infra/app2/0"),
        ],
    );
}

/// A parentRef naming the whole Gateway: the HTTP listener for `a.example.com` does not admit
/// the route, and takes that hostname from the HTTP listener for any host, so the route
/// serves `a.example.com` over https alone and `b.example.com` over both.
#[test]
fn a_hostname_whose_http_listener_refuses_the_route_is_served_over_https_alone() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: https, port: 443, protocol: HTTPS}
  - {name: http, port: 80, protocol: HTTP}
  - name: http-a
    port: 80
    protocol: HTTP
    hostname: a.example.com
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {role: backend}}}}
---
"#;
    let app = http_route(
        "infra",
        "app",
        "  parentRefs: [{name: web}]\n  hostnames: [a.example.com, b.example.com]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&format!("{gateway}{app}"));
    assert_eq!(
        accepted(&out, RouteKind::Http, "infra", "app"),
        (true, Reason::Accepted)
    );
    let routes = proxy_routes(shared(&out));
    picks(
        &routes,
        &[
            ("http", "a.example.com", "infra/web/listener:http-a"),
            ("https", "a.example.com", "infra/app/0"),
            ("http", "b.example.com", "infra/app/0"),
            ("https", "b.example.com", "infra/app/0"),
        ],
    );
}

/// A redirect that sets neither scheme nor port carries the port of the listener each
/// hostname is attached through, where a route's listeners have different ports.
#[test]
fn a_redirect_carries_the_port_of_each_hostnames_listener() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ports, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: alt, port: 8080, protocol: HTTP, hostname: a.example.com}
  - {name: std, port: 80, protocol: HTTP, hostname: b.example.com}
---
"#;
    let route = http_route(
        "infra",
        "moved",
        "  parentRefs: [{name: ports, sectionName: alt}, {name: ports, sectionName: std}]\n  rules:\n  - filters: [{type: RequestRedirect, requestRedirect: {hostname: new.example.com}}]\n  - matches: [{path: {value: /app}}]\n    backendRefs: [{name: v2, port: 8080}]",
    );
    let out = run(&format!("{gateway}{route}"));
    let routes = proxy_routes(shared(&out));
    let location = |host: &str| {
        let rule = proxy_pick(&routes, "GET", host, "/x", &[("x-forwarded-proto", "http")])
            .expect("a rule matches");
        let redirect = rule.filters.redirect.as_ref().expect("a redirect");
        redirect
            .location("https", host, "/x", None, None)
            .expect("a valid Location")
            .to_str()
            .expect("ASCII")
            .to_owned()
    };
    assert_eq!(location("a.example.com"), "https://new.example.com:8080/x");
    assert_eq!(location("b.example.com"), "https://new.example.com/x");
    // A rule without a redirect is not split by port.
    let app: Vec<_> = route_rules(&out)
        .into_iter()
        .filter(|r| r.name.as_deref() == Some("infra/moved/1"))
        .collect();
    assert_eq!(app.len(), 1, "{app:#?}");
    assert_eq!(app[0].hostnames, ["a.example.com", "b.example.com"]);
}

/// Compiles a config document the way the proxy does when it is pushed.
fn proxy_routes(config: &Config) -> cftunnel_proxy::proxy::Routes {
    let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
    cftunnel_proxy::config::compile(
        config,
        &metrics,
        &mut cftunnel_proxy::config::Cache::default(),
    )
    .expect("the proxy compiles the config")
}

/// The rule the proxy picks for a request, by name.
fn proxy_pick<'r>(
    routes: &'r cftunnel_proxy::proxy::Routes,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&'static str, &str)],
) -> Option<&'r cftunnel_proxy::rule::Rule> {
    let mut map = http::HeaderMap::new();
    for (name, value) in headers {
        map.append(*name, value.parse().expect("header value"));
    }
    let method = http::Method::from_bytes(method.as_bytes()).expect("method");
    let view = cftunnel_proxy::route::RequestView {
        method: &method,
        path,
        query: None,
        headers: &map,
    };
    routes.table().find(host, &view).map(|hit| &**hit.rule)
}

/// The name of the rule a GET for `host` and `path` arriving with `X-Forwarded-Proto: scheme`
/// reaches, looked up as the proxy does.
/// Asserts the rule each `(scheme, host, rule)` request for `/` is routed to.
fn picks(routes: &cftunnel_proxy::proxy::Routes, cases: &[(&str, &str, &str)]) {
    for (scheme, host, rule) in cases {
        assert_eq!(
            picked(routes, scheme, host, "/").as_deref(),
            Some(*rule),
            "{scheme}://{host}/"
        );
    }
}

fn picked(
    routes: &cftunnel_proxy::proxy::Routes,
    scheme: &str,
    host: &str,
    path: &str,
) -> Option<String> {
    proxy_pick(routes, "GET", host, path, &[("x-forwarded-proto", scheme)])
        .and_then(|r| r.name.as_deref().map(str::to_owned))
}

#[test]
fn a_hostname_only_redirect_carries_the_listener_port_unless_it_is_the_protocol_default() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ports, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: https, port: 443, protocol: HTTPS, hostname: b.example.com}
  - {name: http-8080, port: 8080, protocol: HTTP, hostname: c.example.com}
  - {name: https-8443, port: 8443, protocol: HTTPS, hostname: d.example.com}
---
"#;
    let route = |section: &str| {
        http_route(
            "infra",
            section,
            &format!(
                "  parentRefs: [{{name: ports, sectionName: {section}}}]\n  rules:\n  - matches: [{{path: {{value: /host}}}}]\n    filters: [{{type: RequestRedirect, requestRedirect: {{hostname: new.example.com}}}}]\n  - matches: [{{path: {{value: /scheme}}}}]\n    filters: [{{type: RequestRedirect, requestRedirect: {{scheme: http, hostname: new.example.com}}}}]\n  - matches: [{{path: {{value: /port}}}}]\n    filters: [{{type: RequestRedirect, requestRedirect: {{port: 9000, hostname: new.example.com}}}}]"
            ),
        )
    };
    let out = run(&format!(
        "{gateway}{}{}{}{}",
        route("http"),
        route("https"),
        route("http-8080"),
        route("https-8443")
    ));
    let routes = proxy_routes(shared(&out));
    // Every request reaches the proxy through the tunnel as https; the edge names the scheme
    // it received it with, which tells the HTTP listeners' requests from the HTTPS ones'.
    let location = |host: &str, path: &str| {
        let scheme = if matches!(host, "a.example.com" | "c.example.com") {
            "http"
        } else {
            "https"
        };
        let rule = proxy_pick(&routes, "GET", host, path, &[("x-forwarded-proto", scheme)])
            .expect("a rule matches");
        let redirect = rule.filters.redirect.as_ref().expect("a redirect");
        redirect
            .location("https", host, path, None, None)
            .expect("a valid Location")
            .to_str()
            .expect("ASCII")
            .to_owned()
    };
    let cases = [
        ("a.example.com", "/host", "https://new.example.com/host"),
        ("b.example.com", "/host", "https://new.example.com/host"),
        (
            "c.example.com",
            "/host",
            "https://new.example.com:8080/host",
        ),
        (
            "d.example.com",
            "/host",
            "https://new.example.com:8443/host",
        ),
        ("a.example.com", "/scheme", "http://new.example.com/scheme"),
        ("c.example.com", "/scheme", "http://new.example.com/scheme"),
        (
            "a.example.com",
            "/port",
            "https://new.example.com:9000/port",
        ),
        (
            "c.example.com",
            "/port",
            "https://new.example.com:9000/port",
        ),
    ];
    for (host, path, want) in cases {
        assert_eq!(location(host, path), want, "{host}{path}");
    }
}

#[test]
fn rules_are_ordered_oldest_route_first_then_by_name() {
    let routes = format!(
        "{}{}{}",
        http_route("infra", "b-new", "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /b}}], backendRefs: [{name: v2, port: 8080}]}]")
            .replace("namespace: infra}", "namespace: infra, creationTimestamp: \"2026-01-02T00:00:00Z\"}"),
        http_route("infra", "z-old", "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /z1}}], backendRefs: [{name: v2, port: 8080}]}, {matches: [{path: {value: /z2}}], backendRefs: [{name: v2, port: 8080}]}]")
            .replace("namespace: infra}", "namespace: infra, creationTimestamp: \"2026-01-01T00:00:00Z\"}"),
        http_route("infra", "a-new", "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /a}}], backendRefs: [{name: v2, port: 8080}]}]")
            .replace("namespace: infra}", "namespace: infra, creationTimestamp: \"2026-01-02T00:00:00Z\"}"),
    );
    let out = run(&routes);
    let names: Vec<_> = shared(&out)
        .rules
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(
        names,
        vec![
            "infra/z-old/0",
            "infra/z-old/1",
            "infra/a-new/0",
            "infra/b-new/0"
        ]
    );
}

/// A Gateway in `infra` that admits routes of both kinds from every namespace.
const OPEN_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: open, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
---
"#;

#[test]
fn equally_old_routes_are_ordered_by_the_joined_namespace_and_name() {
    // As a (namespace, name) tuple `team` sorts before `team-a`; as the string
    // "{namespace}/{name}" the spec orders by, `team-a/r` ('-' < '/') comes first.
    let created = "creationTimestamp: \"2026-01-01T00:00:00Z\"}";
    let route = |ns: &str| {
        http_route(
            ns,
            "r",
            "  parentRefs: [{name: open, namespace: infra}]\n  rules: [{matches: [{path: {value: /same}}]}]",
        )
        .replace(&format!("namespace: {ns}}}"), &format!("namespace: {ns}, {created}"))
    };
    let out = run(&format!(
        "{OPEN_GATEWAY}{}{}",
        route("team"),
        route("team-a")
    ));
    let names: Vec<_> = route_rules(&out)
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(names, vec!["team-a/r/0", "team/r/0"]);
}

#[test]
fn a_regex_that_does_not_compile_drops_its_rule() {
    let out = run(&(http_route(
        "infra",
        "partial",
        "  parentRefs: [{name: gw}]\n  rules:\n  - matches: [{path: {type: RegularExpression, value: \"/admin)|(.*\"}}]\n    backendRefs: [{name: v2, port: 8080}]\n  - name: good\n    matches: [{headers: [{type: RegularExpression, name: x, value: \"a+\"}]}]\n    backendRefs: [{name: v2, port: 8080}]",
    ) + &http_route(
        "infra",
        "all-bad",
        "  parentRefs: [{name: gw}]\n  rules: [{matches: [{queryParams: [{type: RegularExpression, name: q, value: \"[\"}]}], backendRefs: [{name: v2, port: 8080}]}]",
    )));
    assert_eq!(
        condition(&out, "infra", "partial", ConditionType::PartiallyInvalid),
        (true, Reason::UnsupportedValue)
    );
    assert_eq!(
        condition(&out, "infra", "partial", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        condition(&out, "infra", "all-bad", ConditionType::Accepted),
        (false, Reason::UnsupportedValue)
    );
    let rule = only_rule(&out);
    assert_eq!(rule.name.as_deref(), Some("infra/partial/good"));
    let message = &route_status(&out, "infra", "partial")[0]
        .condition(ConditionType::PartiallyInvalid)
        .expect("partially invalid")
        .message;
    assert!(
        message.contains("spec.rules[0].matches[0].path"),
        "{message}"
    );
}

/// A pattern the proxy's engine refuses for its size (Unicode `\w` fifty times over) is left
/// out with its route saying why, and the plane's document, with every other rule of this
/// route and of its neighbour, is one the proxy compiles.
#[test]
fn a_regex_over_the_proxy_size_limit_drops_its_rule_and_the_plane_still_compiles() {
    let out = run(&(http_route(
        "infra",
        "greedy",
        "  parentRefs: [{name: gw}]\n  rules:\n  - name: fine\n    matches: [{path: {value: /fine}}]\n    backendRefs: [{name: v2, port: 8080}]\n  - matches: [{path: {type: RegularExpression, value: \"/\\\\w{500}\"}}]\n    backendRefs: [{name: v2, port: 8080}]",
    ) + &http_route(
        "infra",
        "neighbour",
        "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {value: /n}}], backendRefs: [{name: v1, port: 8080}]}]",
    )));
    assert_eq!(
        condition(&out, "infra", "greedy", ConditionType::PartiallyInvalid),
        (true, Reason::UnsupportedValue)
    );
    let message = &route_status(&out, "infra", "greedy")[0]
        .condition(ConditionType::PartiallyInvalid)
        .expect("partially invalid")
        .message;
    assert!(
        message.contains("spec.rules[1].matches[0].path: regular expression does not compile"),
        "{message}"
    );
    assert_eq!(
        condition(&out, "infra", "neighbour", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    let names: Vec<_> = route_rules(&out)
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(names, ["infra/greedy/fine", "infra/neighbour/0"]);
    let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
    for (plane, doc) in &out.configs {
        cftunnel_proxy::config::compile(doc, &metrics, &mut Default::default())
            .unwrap_or_else(|e| panic!("the proxy refuses plane {plane}: {e}"));
    }
}

/// What only the contract's check of the whole rule catches (a backend port out of range
/// makes a URL the proxy cannot parse) is refused the same way, naming the rule's field.
#[test]
fn a_rule_the_contract_refuses_is_left_out_naming_the_field() {
    let out = run(&(String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: wide, namespace: infra}\nspec: {type: ExternalName, externalName: api.example.net, ports: [{port: 70000}]}\n---\n",
    ) + &http_route(
        "infra",
        "wide",
        "  parentRefs: [{name: gw}]\n  rules:\n  - backendRefs: [{name: wide, port: 70000}]\n  - matches: [{path: {value: /ok}}]\n    backendRefs: [{name: v2, port: 8080}]",
    )));
    let message = &route_status(&out, "infra", "wide")[0]
        .condition(ConditionType::PartiallyInvalid)
        .expect("partially invalid")
        .message;
    assert!(
        message.contains("spec.rules[0]: the proxy cannot take this rule: backends[0].url"),
        "{message}"
    );
    assert_eq!(
        only_rule(&out).name.as_deref(),
        Some("infra/wide/1"),
        "the other rule is served"
    );
}

/// A header filter that sets or adds a header framing the message (`Content-Length`,
/// `Transfer-Encoding`) or a hop-by-hop one is refused by the contract, at rule or backend
/// level: its rule is left out with the route naming the field and the header, and the rule
/// that only removes such headers is served.
#[test]
fn a_header_filter_setting_a_framing_header_leaves_its_rule_out_naming_it() {
    let out = run(&http_route(
        "infra",
        "framing",
        r#"  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {value: /poison}}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: Content-Length, value: "0"}]}}
    backendRefs: [{name: v2, port: 8080}]
  - matches: [{path: {value: /smuggle}}]
    backendRefs:
    - name: v2
      port: 8080
      filters:
      - {type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: Transfer-Encoding, value: chunked}]}}
  - name: strip
    matches: [{path: {value: /strip}}]
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {remove: [Content-Length, Connection]}}
    backendRefs: [{name: v2, port: 8080}]"#,
    ));
    assert_eq!(
        condition(&out, "infra", "framing", ConditionType::PartiallyInvalid),
        (true, Reason::UnsupportedValue)
    );
    let message = &route_status(&out, "infra", "framing")[0]
        .condition(ConditionType::PartiallyInvalid)
        .expect("partially invalid")
        .message;
    for refused in [
        "spec.rules[0]: the proxy cannot take this rule: \
         filters[0].responseHeaderModifier.set[0].name: content-length ",
        "spec.rules[1]: the proxy cannot take this rule: \
         backends[0].filters[0].requestHeaderModifier.add[0].name: transfer-encoding ",
    ] {
        assert!(message.contains(refused), "{refused}: {message}");
    }
    assert_eq!(
        condition(&out, "infra", "framing", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs),
        "the backends resolve; the rules are what is refused"
    );
    assert_eq!(only_rule(&out).name.as_deref(), Some("infra/framing/strip"));
}

#[test]
fn filters_timeouts_and_retry_carry_over() {
    let out = run(&http_route(
        "infra",
        "f",
        r#"  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api/}, method: POST}]
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: "1"}], add: [{name: b, value: "2"}], remove: [c]}}
    - {type: URLRewrite, urlRewrite: {hostname: internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 8080}, fraction: {numerator: 25, denominator: 50}}}
    - {type: CORS, cors: {allowOrigins: ["*"], allowMethods: [GET], maxAge: 60}}
    backendRefs:
    - name: v2
      port: 8080
      filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: served-by, value: v2}]}}]
    timeouts: {request: 10s, backendRequest: "0s"}
    retry: {attempts: 2, codes: [500, 503], backoff: 100ms}
  - matches: [{path: {value: /secure}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]"#,
    ));
    let rules = &shared(&out).rules;
    let r = &rules[0];
    let m = &r.matches[0];
    assert_eq!(
        m.path.as_ref().map(|p| (p.kind, p.value.as_str())),
        Some((PathMatchType::PathPrefix, "/api"))
    );
    assert_eq!(m.method.as_deref(), Some("POST"));
    let kinds: Vec<_> = r.filters.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![
            FilterType::RequestHeaderModifier,
            FilterType::URLRewrite,
            FilterType::RequestMirror,
            FilterType::Cors
        ]
    );
    let mirror = r.filters[2].request_mirror.as_ref().expect("mirror");
    assert_eq!(
        (mirror.backend_url.as_str(), mirror.percent, mirror.fraction),
        (
            "http://10.0.1.1:3000",
            Some(50),
            Some(cftunnel_config::Fraction {
                numerator: 25,
                denominator: 50
            })
        )
    );
    assert_eq!(r.filters[3].cors.as_ref().and_then(|c| c.max_age), Some(60));
    assert_eq!(
        r.backends[0].filters[0].kind,
        FilterType::ResponseHeaderModifier
    );
    let timeouts = r.timeouts.as_ref().expect("timeouts");
    assert_eq!(timeouts.request, Some("10s".parse().expect("duration")));
    assert_eq!(
        timeouts.backend,
        Some("0s".parse().expect("duration")),
        "0s disables the timeout, and is passed on so that the proxy's default goes too"
    );
    let retry = r.retry.as_ref().expect("retry");
    assert_eq!(
        (retry.attempts, retry.codes.clone()),
        (Some(2), vec![500, 503])
    );
    let redirect = rules[1].filters[0]
        .request_redirect
        .as_ref()
        .expect("redirect");
    assert_eq!(
        (
            redirect.scheme.as_deref(),
            redirect.port,
            redirect.status_code
        ),
        (Some("https"), Some(443), Some(301))
    );
}

/// Values the proxy cannot compile are refused per rule, so they never make it reject a push.
#[test]
fn values_the_proxy_cannot_compile_drop_their_rule() {
    let cases = [
        ("header-name", "matches: [{headers: [{name: \"bad name\", value: x}]}]"),
        ("query-name", "matches: [{queryParams: [{name: \"\", value: x}]}]"),
        ("modifier-value", "filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: \"x\\ny\"}]}}]"),
        ("modifier-remove", "filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: [\"a b\"]}}]"),
        ("redirect-host", "filters: [{type: RequestRedirect, requestRedirect: {hostname: \"a b.com\"}}]"),
        ("rewrite-path", "filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: relative}}}]"),
        ("twice", "filters: [{type: RequestHeaderModifier, requestHeaderModifier: {}}, {type: RequestHeaderModifier, requestHeaderModifier: {}}]"),
        ("redirect-and-rewrite", "filters: [{type: RequestRedirect, requestRedirect: {hostname: a.com}}, {type: URLRewrite, urlRewrite: {hostname: b.com}}]"),
        ("cors-value", "filters: [{type: CORS, cors: {allowOrigins: [\"https://a\\u0001\"]}}]"),
        ("backend-twice", "backendRefs: [{name: v2, port: 8080, filters: [{type: URLRewrite, urlRewrite: {}}, {type: URLRewrite, urlRewrite: {}}]}]"),
    ];
    for (name, rule) in cases {
        let out = run(&http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: gw}}]\n  rules:\n  - {rule}\n  - backendRefs: [{{name: v2, port: 8080}}]"),
        ));
        assert_eq!(
            condition(&out, "infra", name, ConditionType::PartiallyInvalid),
            (true, Reason::UnsupportedValue),
            "{name}"
        );
        assert_eq!(route_rules(&out).len(), 1, "{name}");
    }
}

#[test]
fn invalid_hostnames_refuse_the_route_or_the_listener() {
    let out = run(&format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: bad-listener, namespace: infra}}
spec:
  gatewayClassName: cf
  listeners:
  - {{name: ok, port: 80, protocol: HTTP, hostname: ok.example.com}}
  - {{name: bad, port: 80, protocol: HTTP, hostname: "bad host"}}
---
{}"#,
        http_route(
            "infra",
            "bad-host",
            "  parentRefs: [{name: gw}]\n  hostnames: [good.example.com, \"bad_$.example.com\"]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"
        )
    ));
    assert_eq!(
        condition(&out, "infra", "bad-host", ConditionType::Accepted),
        (false, Reason::UnsupportedValue)
    );
    assert!(
        route_rules(&out).is_empty(),
        "the route is not widened to fewer hostnames"
    );
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "bad-listener")];
    let bad = gw
        .listeners
        .iter()
        .find(|l| l.name == "bad")
        .expect("listener");
    assert_eq!(
        bad.conditions.first().map(|c| (c.status, c.reason)),
        Some((false, Reason::UnsupportedValue))
    );
    assert!(shared(&out)
        .rules
        .iter()
        .all(|r| r.hostnames.iter().all(|h| h != "bad host")));
}

#[test]
fn replace_prefix_match_needs_prefix_matches() {
    let out = run(&http_route(
        "infra",
        "r",
        "  parentRefs: [{name: gw}]\n  rules: [{matches: [{path: {type: Exact, value: /x}}], filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /y}}}], backendRefs: [{name: v2, port: 8080}]}]",
    ));
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::Accepted),
        (false, Reason::UnsupportedValue)
    );
    assert!(shared(&out).rules.is_empty());
}

/// A GatewayConfig `cfg` in `infra` with the Secret it names.
fn gateway_config(spec_extra: &str) -> String {
    let token = cftunnel_config::Token::new(
        "account",
        b"secret".to_vec(),
        "6ff42ae2-765d-4adf-8112-31c55c1551ef"
            .parse()
            .expect("uuid"),
    )
    .encode();
    format!(
        r#"apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: cfg, namespace: infra}}
spec: {{tunnelTokenSecretRef: {{name: tunnel}}{spec_extra}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: tunnel, namespace: infra}}
stringData: {{tunnel-token: {token}}}
---
"#
    )
}

fn with_image() -> Options {
    Options {
        proxy_image: Some("cftunnel-proxy:1".to_owned()),
        ..Options::default()
    }
}

#[test]
fn gateway_with_gateway_config_gets_its_own_plane() {
    let out = translate(&snapshot(&format!(
        r#"{}apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: tenant, namespace: infra}}
spec:
  gatewayClassName: cf
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: cfg}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: broken, namespace: infra}}
spec:
  gatewayClassName: cf
  infrastructure: {{parametersRef: {{group: example.com, kind: Other, name: cfg}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: foreign, namespace: infra}}
spec:
  gatewayClassName: someone-else
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
{}{}{}"#,
        gateway_config(""),
        http_route("infra", "to-tenant", "  parentRefs: [{name: tenant}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"),
        http_route("infra", "to-shared", "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v1, port: 8080}]}]"),
        http_route("infra", "to-broken", "  parentRefs: [{name: broken}, {name: foreign}]\n  rules: [{backendRefs: [{name: v1, port: 8080}]}]"),
    )), &with_image());
    let tenant = PlaneKey::Dedicated(ObjectKey::new("infra", "tenant"));
    assert_eq!(
        out.planes.get(&ObjectKey::new("infra", "tenant")),
        Some(&tenant)
    );
    let names = |plane: &PlaneKey| -> Vec<String> {
        out.configs[plane]
            .rules
            .iter()
            .filter_map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(names(&tenant), vec!["infra/to-tenant/0".to_owned()]);
    assert_eq!(
        names(&PlaneKey::Shared),
        vec!["infra/to-shared/0".to_owned()]
    );
    let broken = &out.statuses.gateways[&ObjectKey::new("infra", "broken")];
    assert_eq!(broken.conditions[0].reason, Reason::InvalidParameters);
    assert!(!out
        .statuses
        .gateways
        .contains_key(&ObjectKey::new("infra", "foreign")));
    let parents = route_status(&out, "infra", "to-broken");
    assert_eq!(
        parents.len(),
        1,
        "the foreign Gateway's parent is not ours to report"
    );
    assert_eq!(
        parents[0]
            .condition(ConditionType::Accepted)
            .map(|c| c.status),
        Some(false)
    );
}

/// The dedicated Gateway `tenant` of `infra`, on GatewayConfig `cfg` (see [`gateway_config`]).
const TENANT: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tenant, namespace: infra}
spec:
  gatewayClassName: cf
  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: cfg}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;

#[test]
fn a_dedicated_gateway_is_judged_by_the_plane_the_caller_rendered_not_by_rendering_it_again() {
    let snapshot = snapshot(&format!("{}{TENANT}", gateway_config("")));
    let key = ObjectKey::new("infra", "tenant");
    let fresh = BTreeMap::from([(key.clone(), "fresh".to_owned())]);
    let accepted = |out: &Output| {
        let status = &out.statuses.gateways[&key];
        let accepted = status
            .conditions
            .iter()
            .find(|c| c.kind == ConditionType::Accepted)
            .expect("Accepted");
        (accepted.status, accepted.reason, accepted.message.clone())
    };

    // Rendered without an image and translated with one: the render decides, and its error is
    // the condition's message.
    let without_image = render::plan(&snapshot, &RenderSettings::default(), |k| {
        fresh.get(k).cloned()
    });
    let out = translate_with(
        &snapshot,
        &with_image(),
        &without_image,
        &mut valid::Cache::default(),
    );
    let error = without_image[&key].as_ref().expect_err("no image");
    assert_eq!(
        accepted(&out),
        (false, Reason::InvalidParameters, error.to_string())
    );
    assert_eq!(out.planes.get(&key), None);

    // Rendered with an image and translated without one: accepted, on its own plane.
    let settings = RenderSettings {
        proxy_image: Some("cftunnel-proxy:1".to_owned()),
        ..RenderSettings::default()
    };
    let planned = render::plan(&snapshot, &settings, |k| fresh.get(k).cloned());
    let out = translate_with(
        &snapshot,
        &Options::default(),
        &planned,
        &mut valid::Cache::default(),
    );
    assert!(accepted(&out).0, "accepted");
    assert_eq!(
        out.planes.get(&key),
        Some(&PlaneKey::Dedicated(key.clone()))
    );
    // `translate` renders the planes itself, with the options' image: the same outcome.
    assert_eq!(translate(&snapshot, &with_image()), out);

    // Not rendered at all (plans of another snapshot): refused, saying so.
    let out = translate_with(
        &snapshot,
        &with_image(),
        &render::Plans::new(),
        &mut valid::Cache::default(),
    );
    assert_eq!(
        accepted(&out),
        (
            false,
            Reason::InvalidParameters,
            "GatewayConfig infra/cfg (infrastructure.parametersRef) was not rendered".to_owned()
        )
    );
}

#[test]
fn listener_problems_are_reported_on_the_listener() {
    let out = run(r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
# Older than the base Gateway gw: this one keeps its listener for any host over gw's.
metadata: {name: mixed, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: tcp, port: 9000, protocol: TCP}
  - {name: a, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: a-again, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: kinds, port: 81, protocol: HTTP, allowedRoutes: {kinds: [{kind: TCPRoute}, {kind: HTTPRoute}]}}
"#);
    let gw = &out.statuses.gateways[&ObjectKey::new("infra", "mixed")];
    assert_eq!(
        described(&gw.conditions[0]),
        (
            ConditionType::Accepted,
            true,
            Reason::ListenersNotValid,
            "listeners not valid: tcp, a, a-again"
        )
    );
    let find = |listener: &str, kind: ConditionType| {
        gw.listeners
            .iter()
            .find(|l| l.name == listener)
            .and_then(|l| l.conditions.iter().find(|c| c.kind == kind))
            .map(|c| (c.status, c.reason))
    };
    assert_eq!(
        find("tcp", ConditionType::Accepted),
        Some((false, Reason::UnsupportedProtocol))
    );
    assert_eq!(
        find("a", ConditionType::Conflicted),
        Some((true, Reason::HostnameConflict))
    );
    assert_eq!(
        find("kinds", ConditionType::ResolvedRefs),
        Some((false, Reason::InvalidRouteKinds))
    );
    assert_eq!(
        find("kinds", ConditionType::Programmed),
        Some((true, Reason::Programmed))
    );
    let kinds = &gw.listeners[3].supported_kinds;
    assert_eq!(kinds, &vec!["HTTPRoute".to_owned()]);
}

#[test]
fn grpc_routes_match_on_service_and_method_and_speak_h2c() {
    let out = run(r#"apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: infra}
spec:
  parentRefs: [{name: gw}]
  hostnames: [grpc.example.com]
  rules:
  - matches:
    - method: {service: helloworld.Greeter, method: SayHello}
      headers: [{name: version, value: "2"}]
    - method: {service: helloworld.Greeter}
    - method: {method: Check}
    - method: {type: RegularExpression, service: "helloworld\\..*", method: "Say.*"}
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x, value: y}]}}, {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 8080}}}]
    backendRefs: [{name: v1, port: 8080}]
  - matches: [{method: {type: RegularExpression, service: "(", method: "a"}}]
    backendRefs: [{name: v1, port: 8080}]
"#);
    let config = shared(&out);
    assert!(config.has_grpc_route);
    // One config rule per match, in GRPCRoute precedence order: service characters, then
    // method characters.
    let paths: Vec<_> = config
        .rules
        .iter()
        .map(|rule| {
            assert_eq!(rule.matches.len(), 1);
            let p = rule.matches[0].path.as_ref().expect("a path match");
            (p.kind, p.value.as_str())
        })
        .collect();
    assert_eq!(
        paths,
        vec![
            (PathMatchType::Exact, "/helloworld.Greeter/SayHello"),
            (PathMatchType::PathPrefix, "/helloworld.Greeter"),
            (
                PathMatchType::RegularExpression,
                "/(?:helloworld\\..*)/(?:Say.*)"
            ),
            (PathMatchType::RegularExpression, "/[^/]+/Check"),
        ]
    );
    assert_eq!(config.rules[0].matches[0].headers[0].name, "version");
    for rule in &config.rules {
        assert_eq!(rule.name.as_deref(), Some("infra/g/0"));
        assert_eq!(rule.filters[0].kind, FilterType::RequestHeaderModifier);
        let mirror = rule.filters[1].request_mirror.as_ref().expect("a mirror");
        assert_eq!(
            mirror.protocol,
            BackendProtocol::H2c,
            "gRPC mirrors speak h2c too"
        );
        assert!(rule
            .backends
            .iter()
            .all(|b| b.protocol == BackendProtocol::H2c));
        assert_eq!(rule.hostnames, vec!["grpc.example.com".to_owned()]);
    }
    let status = &out.statuses.routes[&RouteKey {
        kind: RouteKind::Grpc,
        key: ObjectKey::new("infra", "g"),
    }][0];
    assert_eq!(
        status
            .condition(ConditionType::PartiallyInvalid)
            .map(|c| c.status),
        Some(true)
    );
}

/// Which GRPCRoute rule the proxy picks for each gRPC path, given routes `(name, rules)`
/// created one second apart in that order.
fn grpc_picks(routes: &[(&str, &str)], paths: &[&str]) -> Vec<String> {
    let manifests: String = routes
        .iter()
        .enumerate()
        .map(|(i, (name, rules))| {
            created(
                grpc_route(
                    "infra",
                    name,
                    &format!("  parentRefs: [{{name: gw}}]\n  hostnames: [grpc.example.com]\n  rules:\n{rules}"),
                ),
                "infra",
                &format!("2026-01-01T00:00:{i:02}Z"),
            )
        })
        .collect();
    let out = run(&manifests);
    let routes = proxy_routes(shared(&out));
    paths
        .iter()
        .map(|path| {
            proxy_pick(
                &routes,
                "POST",
                "grpc.example.com",
                path,
                &[("content-type", "application/grpc")],
            )
            .and_then(|rule| rule.name.as_deref())
            .unwrap_or("none")
            .to_owned()
        })
        .collect()
}

#[test]
fn grpc_matches_rank_by_service_then_method_characters_through_the_proxy() {
    const BACKEND: &str = "    backendRefs: [{name: v1, port: 8081}]\n";
    let rule = |matches: &str| format!("  - matches: {matches}\n{BACKEND}");
    let catch_all = format!("  - {}", BACKEND.trim_start());

    // A method match outranks an older rule without matches.
    assert_eq!(
        grpc_picks(
            &[
                ("catch-all", &catch_all),
                ("method", &rule("[{method: {method: Check}}]")),
            ],
            &["/grpc.health.v1.Health/Check", "/x.Y/Other"]
        ),
        ["infra/method/0", "infra/catch-all/0"]
    );
    // A service match outranks an older method match.
    assert_eq!(
        grpc_picks(
            &[
                ("method", &rule("[{method: {method: Check}}]")),
                (
                    "service",
                    &rule("[{method: {service: grpc.health.v1.Health}}]")
                ),
            ],
            &["/grpc.health.v1.Health/Check", "/other.Svc/Check"]
        ),
        ["infra/service/0", "infra/method/0"]
    );
    // Service and method outrank an older service match.
    assert_eq!(
        grpc_picks(
            &[
                (
                    "service",
                    &rule("[{method: {service: grpc.health.v1.Health}}]")
                ),
                (
                    "exact",
                    &rule("[{method: {service: grpc.health.v1.Health, method: Check}}]")
                ),
            ],
            &[
                "/grpc.health.v1.Health/Check",
                "/grpc.health.v1.Health/Watch"
            ]
        ),
        ["infra/exact/0", "infra/service/0"]
    );
    // A RegularExpression service outranks an older method match.
    assert_eq!(
        grpc_picks(
            &[
                ("method", &rule("[{method: {method: Check}}]")),
                (
                    "regex",
                    &rule(
                        r#"[{method: {type: RegularExpression, service: "grpc\\.health\\..*"}}]"#
                    )
                ),
            ],
            &["/grpc.health.v1.Health/Check", "/other.Svc/Check"]
        ),
        ["infra/regex/0", "infra/method/0"]
    );
    // Matches rank one by one, not by the rule holding them: the older rule's `.*` method
    // pattern (2 characters) ranks below the newer `Check` (5).
    assert_eq!(
        grpc_picks(
            &[
                (
                    "mixed",
                    &rule(
                        r#"[{method: {method: Watch}}, {method: {type: RegularExpression, method: ".*"}}]"#
                    )
                ),
                ("check", &rule("[{method: {method: Check}}]")),
            ],
            &["/a.B/Check", "/a.B/Watch", "/a.B/List"]
        ),
        ["infra/check/0", "infra/mixed/0", "infra/mixed/0"]
    );
    // Equal ranks: the older route first.
    assert_eq!(
        grpc_picks(
            &[
                ("first", &rule("[{method: {method: Check}}]")),
                ("second", &rule("[{method: {method: Check}}]")),
            ],
            &["/a.B/Check"]
        ),
        ["infra/first/0"]
    );
}

#[test]
fn grpc_rules_are_sorted_within_the_places_grpc_rules_hold() {
    use std::cmp::Reverse;
    // (service, method, headers, route, rule, match)
    let method_only = (Reverse(0), Reverse(5), Reverse(0), 0, 0, 0);
    let service = (Reverse(9), Reverse(0), Reverse(0), 1, 0, 0);
    let mut names = ["http-a", "grpc-method", "http-b", "grpc-service"];
    super::grpc_route::order(vec![(method_only, 1), (service, 3)], |a, b| {
        names.swap(a, b)
    });
    assert_eq!(names, ["http-a", "grpc-service", "http-b", "grpc-method"]);

    // Three GRPCRoute rules, each in another's place.
    let rank = |route| (Reverse(0), Reverse(0), Reverse(0), route, 0, 0);
    let mut names = ["second", "http", "third", "first", "http"];
    super::grpc_route::order(vec![(rank(1), 0), (rank(2), 2), (rank(0), 3)], |a, b| {
        names.swap(a, b);
    });
    assert_eq!(names, ["first", "http", "second", "third", "http"]);
}

#[test]
fn an_http_route_and_a_grpc_route_with_intersecting_hostnames_on_one_listener_are_not_merged() {
    let http = |name: &str, hosts: &str, at: &str| {
        created(
            http_route(
                "web",
                name,
                &format!("  parentRefs: [{{name: open, namespace: infra}}]\n  hostnames: {hosts}\n  rules: [{{matches: [{{path: {{value: /{name}}}}}]}}]"),
            ),
            "web",
            at,
        )
    };
    let grpc = |name: &str, hosts: &str, at: &str| {
        created(
            grpc_route(
                "web",
                name,
                &format!("  parentRefs: [{{name: open, namespace: infra}}]\n  hostnames: {hosts}\n  rules: [{{matches: [{{method: {{service: {name}.Svc}}}}]}}]"),
            ),
            "web",
            at,
        )
    };
    let attached = |out: &Output| {
        out.statuses.gateways[&ObjectKey::new("infra", "open")].listeners[0].attached_routes
    };
    let served = |out: &Output| {
        let mut names: Vec<String> = route_rules(out)
            .iter()
            .filter_map(|r| r.name.clone())
            .collect();
        names.sort();
        names
    };

    // The older HTTPRoute holds a.example.com; the GRPCRoute's wildcard covers it. A GRPCRoute
    // on other hostnames is not affected.
    let out = run(&format!(
        "{OPEN_GATEWAY}{}{}{}",
        http("site", "[a.example.com]", "2026-01-01T00:00:00Z"),
        grpc("api", "[\"*.example.com\"]", "2026-01-02T00:00:00Z"),
        grpc("other", "[b.example.net]", "2026-01-02T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "web", "site"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "web", "api"),
        (false, Reason::HostnameConflict)
    );
    let message = &parent_statuses(&out, RouteKind::Grpc, "web", "api")[0].conditions[0].message;
    assert!(message.contains("HTTPRoute web/site"), "{message}");
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "web", "other"),
        (true, Reason::Accepted)
    );
    // The refused route is not counted: Gateway API's attachedRoutes counts only routes
    // whose Accepted condition is True.
    assert_eq!(attached(&out), 2);
    assert_eq!(served(&out), vec!["web/other/0", "web/site/0"]);

    // The older GRPCRoute wins; an HTTPRoute without hostnames intersects every hostname.
    let out = run(&format!(
        "{OPEN_GATEWAY}{}{}",
        http("site", "[]", "2026-01-02T00:00:00Z"),
        grpc("api", "[api.example.com]", "2026-01-01T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "web", "site"),
        (false, Reason::HostnameConflict)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "web", "api"),
        (true, Reason::Accepted)
    );
    assert_eq!(attached(&out), 1);
    assert_eq!(served(&out), vec!["web/api/0"]);
    assert!(shared(&out).has_grpc_route);

    // Equally old: the first by namespace/name wins.
    let out = run(&format!(
        "{OPEN_GATEWAY}{}{}",
        http("b-site", "[a.example.com]", "2026-01-01T00:00:00Z"),
        grpc("a-api", "[a.example.com]", "2026-01-01T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "web", "b-site"),
        (false, Reason::HostnameConflict)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "web", "a-api"),
        (true, Reason::Accepted)
    );
    assert_eq!(served(&out), vec!["web/a-api/0"]);

    // A route that keeps one listener of its parent and loses another to the older route of
    // the other kind counts on the one it keeps only.
    let pair = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: open, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example.com, allowedRoutes: {namespaces: {from: All}}}
  - {name: b, port: 80, protocol: HTTP, hostname: b.example.com, allowedRoutes: {namespaces: {from: All}}}
---
"#;
    let out = run(&format!(
        "{pair}{}{}",
        grpc("api", "[a.example.com]", "2026-01-01T00:00:00Z"),
        http(
            "site",
            "[a.example.com, b.example.com]",
            "2026-01-02T00:00:00Z"
        ),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "web", "site"),
        (true, Reason::Accepted)
    );
    let counts: Vec<_> = out.statuses.gateways[&ObjectKey::new("infra", "open")]
        .listeners
        .iter()
        .map(|l| l.attached_routes)
        .collect();
    assert_eq!(counts, vec![1, 1], "a, b");
}

#[test]
fn output_is_deterministic() {
    let extra = http_route(
        "infra",
        "r",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v1, port: 8080}, {name: v2, port: 8080}]}]",
    );
    let a = run(&extra);
    let mut reversed = snapshot(&extra);
    reversed.endpoint_slices.reverse();
    reversed.services.reverse();
    let b = translate(&reversed, &Options::default());
    assert_eq!(a, b);
    let json = |o: &Output| serde_json::to_string(&o.configs).expect("configs serialise");
    assert_eq!(json(&a), json(&b));
}

#[test]
fn a_gateway_config_that_cannot_make_a_plane_fails_the_gateway_closed() {
    let gateways = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tenant, namespace: infra}
spec:
  gatewayClassName: cf
  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: cfg}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
"#;
    let routes = format!(
        "{}{}",
        http_route("infra", "only-tenant", "  parentRefs: [{name: tenant}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]"),
        http_route("infra", "both", "  parentRefs: [{name: tenant}, {name: gw}]\n  rules: [{backendRefs: [{name: v1, port: 8080}]}]"),
    );
    let cases = [
        ("no GatewayConfig", String::new(), with_image(), "GatewayConfig infra/cfg (infrastructure.parametersRef) not found"),
        ("no image", gateway_config(""), Options::default(), "no proxy image: set spec.image of GatewayConfig infra/cfg or the controller's --proxy-image"),
        ("no Secret", gateway_config("").replace("name: tunnel}", "name: gone}"), with_image(), "Secret infra/gone (spec.tunnelTokenSecretRef of GatewayConfig infra/cfg) does not exist"),
    ];
    let tenant = ObjectKey::new("infra", "tenant");
    for (case, config, options, message) in cases {
        let out = translate(&snapshot(&format!("{config}{gateways}{routes}")), &options);
        let status = &out.statuses.gateways[&tenant];
        let accepted = &status.conditions[0];
        assert_eq!(
            (accepted.status, accepted.reason, accepted.message.as_str()),
            (false, Reason::InvalidParameters, message),
            "{case}"
        );
        // Not programmed anywhere: no config for its plane (the runtime keeps what the plane
        // last got), and not onto the shared plane either.
        assert!(!out.planes.contains_key(&tenant), "{case}");
        assert!(
            !out.configs
                .contains_key(&PlaneKey::Dedicated(tenant.clone())),
            "{case}"
        );
        let accepted_on = |route: &str, gateway: &str| {
            route_status(&out, "infra", route)
                .iter()
                .find(|p| p.parent_ref.name == gateway)
                .and_then(|p| p.condition(ConditionType::Accepted))
                .map(|c| c.status)
        };
        assert_eq!(accepted_on("only-tenant", "tenant"), Some(false), "{case}");
        assert_eq!(accepted_on("both", "tenant"), Some(false), "{case}");
        assert_eq!(
            accepted_on("both", "gw"),
            Some(true),
            "{case}: the healthy parent"
        );
        let shared_names: Vec<_> = shared(&out)
            .rules
            .iter()
            .filter_map(|r| r.name.clone())
            .collect();
        assert_eq!(shared_names, vec!["infra/both/0".to_owned()], "{case}");
    }

    // Fixed, the same Gateway gets its plane back.
    let out = translate(
        &snapshot(&format!("{}{gateways}{routes}", gateway_config(""))),
        &with_image(),
    );
    assert_eq!(
        out.planes.get(&tenant),
        Some(&PlaneKey::Dedicated(tenant.clone()))
    );
    assert!(out.statuses.gateways[&tenant].conditions[0].status);
}

const TUNNEL_A: &str = "6ff42ae2-765d-4adf-8112-31c55c1551ef";
const TUNNEL_B: &str = "0e9c2a7d-3f41-4c55-8a6e-2b7d9c1e4f30";

/// A Gateway `name` in `ns` with its own GatewayConfig on `tunnel`, and an HTTPRoute `name` in
/// `ns` attached to it, routing to Service v1 of `infra` (granted).
fn tenant(ns: &str, name: &str, tunnel: &str) -> String {
    tenant_with_secret(ns, name, tunnel, b"secret")
}

/// GatewayConfig `name` in `ns` on `tunnel`, and the Secret holding its token (with `secret`).
fn gateway_config_on(ns: &str, name: &str, tunnel: &str, secret: &[u8]) -> String {
    let token =
        cftunnel_config::Token::new("account", secret.to_vec(), tunnel.parse().expect("uuid"))
            .encode();
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-tunnel, namespace: {ns}}}
stringData: {{tunnel-token: {token}}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: {name}, namespace: {ns}}}
spec: {{tunnelTokenSecretRef: {{name: {name}-tunnel}}}}
---
"#
    )
}

/// [`tenant`], its token holding `secret`.
fn tenant_with_secret(ns: &str, name: &str, tunnel: &str, secret: &[u8]) -> String {
    let config = gateway_config_on(ns, name, tunnel, secret);
    format!(
        r#"{config}apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {ns}}}
spec:
  gatewayClassName: cf
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: {name}}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: {name}.example.com}}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: from-{ns}, namespace: infra}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {ns}}}]
  to: [{{group: "", kind: Service}}]
---
{route}"#,
        route = http_route(
            ns,
            name,
            &format!("  parentRefs: [{{name: {name}}}]\n  rules: [{{backendRefs: [{{name: v1, namespace: infra, port: 8080}}]}}]")
        ),
    )
}

#[test]
fn a_dedicated_gateway_whose_listeners_are_all_invalid_keeps_a_plane_without_routes() {
    let healthy = tenant("team-a", "a", TUNNEL_A);
    let key = ObjectKey::new("team-a", "a");
    let plane = PlaneKey::Dedicated(key.clone());
    let out = translate(&snapshot(&healthy), &with_image());
    assert!(rule_names(&out, &plane).contains(&"team-a/a/0".to_owned()));

    // Every listener now of a protocol the data plane cannot serve.
    let invalid = healthy.replace("protocol: HTTP,", "protocol: TCP,");
    assert_ne!(invalid, healthy);
    let out = translate(&snapshot(&invalid), &with_image());
    assert_eq!(
        out.planes.get(&key),
        Some(&plane),
        "the plane stays, so its pods can be told to stop serving"
    );
    assert_eq!(out.configs[&plane].rules, Vec::new(), "no route is served");
    let conditions = &out.statuses.gateways[&key].conditions;
    assert_eq!(
        kinds_and_reasons(conditions),
        vec![
            (ConditionType::Accepted, false, Reason::ListenersNotValid),
            (ConditionType::Programmed, false, Reason::Invalid),
        ]
    );
    assert!(
        conditions[1].message.contains("serves no routes"),
        "{}",
        conditions[1].message
    );
    assert!(
        !accepted(&out, RouteKind::Http, "team-a", "a").0,
        "the route is served nowhere"
    );

    // A shared-plane Gateway in that state has no plane; the shared plane serves the rest.
    let shared = shared_gateway(
        "infra",
        "iso",
        "2026-02-01T00:00:00Z",
        "{name: tcp, port: 80, protocol: TCP}",
    );
    let out = translate(&snapshot(&shared), &with_image());
    assert_eq!(out.planes.get(&ObjectKey::new("infra", "iso")), None);
}

/// Such a plane's pods stay connectors of its tunnel: when an accepted Gateway's plane shares
/// the tunnel, they serve that Gateway's routes (the edge hands them its requests), so
/// `Programmed` names it, and that Gateway's routes stay flagged `TunnelShared`: another
/// tenant's pods still get their requests.
#[test]
fn an_invalid_dedicated_gateway_on_a_shared_tunnel_serves_the_other_gateways_routes() {
    let invalid_b = tenant("team-b", "b", TUNNEL_A).replace("protocol: HTTP,", "protocol: TCP,");
    let out = translate(
        &snapshot(&format!("{}{invalid_b}", tenant("team-a", "a", TUNNEL_A))),
        &with_image(),
    );
    let b = ObjectKey::new("team-b", "b");
    let plane = PlaneKey::Dedicated(b.clone());
    assert_eq!(out.planes.get(&b), Some(&plane));
    let mut names = rule_names(&out, &plane);
    names.sort();
    assert_eq!(
        names,
        vec!["team-a/a/0".to_owned(), "team-a/a/listener:http".to_owned()],
        "the tunnel's other routes, none of its own"
    );
    let conditions = &out.statuses.gateways[&b].conditions;
    assert_eq!(
        kinds_and_reasons(conditions),
        vec![
            (ConditionType::Accepted, false, Reason::ListenersNotValid),
            (ConditionType::Programmed, false, Reason::Invalid),
        ]
    );
    assert_eq!(
        conditions[1].message,
        format!(
            "the Gateway is not accepted; until a listener is valid its data plane serves none \
             of its own routes, only those of the other Gateways on its tunnel {TUNNEL_A} \
             (team-a/a)"
        )
    );
    assert!(!accepted(&out, RouteKind::Http, "team-b", "b").0);

    let shared = route_status(&out, "team-a", "a")[0]
        .condition(ConditionType::TunnelShared)
        .cloned()
        .expect("still flagged: team-b's pods get team-a's requests");
    assert!(shared.status);
    assert!(shared.message.contains("team-b/b"), "{}", shared.message);
}

/// A dedicated Gateway refused for its parameters whose plane the caller keeps serving its
/// last config on its tunnel ([`translate_keeping`]): its pods still take the other tenant's
/// requests there, so that tenant's route stays flagged `TunnelShared`, naming it, and gets
/// none of its routes. Kept on the class tunnel, or not kept, it flags nothing; accepted, it
/// is on the tunnel its render names.
#[test]
fn a_kept_plane_of_a_refused_gateway_keeps_the_other_tenants_on_its_tunnel_flagged() {
    let refused_b = tenant("team-b", "b", TUNNEL_A).replace(
        "kind: GatewayConfig, name: b}",
        "kind: GatewayConfig, name: gone}",
    );
    let snapshot = snapshot(&format!(
        "{}{refused_b}{}",
        tenant("team-a", "a", TUNNEL_A),
        tenant("team-c", "c", TUNNEL_B)
    ));
    let on = |tunnel: &str| {
        TunnelIdentity::of(&cftunnel_config::Token::new(
            "account",
            b"secret".to_vec(),
            tunnel.parse().expect("uuid"),
        ))
    };
    let b = ObjectKey::new("team-b", "b");
    let run = |options: &Options, kept: BTreeMap<ObjectKey, TunnelIdentity>| {
        let settings = RenderSettings {
            proxy_image: options.proxy_image.clone(),
            ..RenderSettings::default()
        };
        let plans = render::plan_unapplied(&snapshot, &settings);
        translate_keeping(
            &snapshot,
            options,
            &plans,
            &kept,
            &mut valid::Cache::default(),
        )
    };
    let flag_of = |out: &Output, ns: &str, name: &str| {
        route_status(out, ns, name)[0]
            .condition(ConditionType::TunnelShared)
            .map(|c| c.message.clone())
    };
    let flag = |out: &Output| flag_of(out, "team-a", "a");

    let out = run(&with_image(), BTreeMap::from([(b.clone(), on(TUNNEL_A))]));
    assert_eq!(out.planes.get(&b), None, "refused");
    let message = flag(&out).expect("flagged: team-b's pods get team-a's requests");
    assert!(message.contains("team-b/b"), "{message}");
    let mut names = rule_names(&out, &PlaneKey::Dedicated(ObjectKey::new("team-a", "a")));
    names.sort();
    assert_eq!(
        names,
        vec!["team-a/a/0".to_owned(), "team-a/a/listener:http".to_owned()],
        "none of the refused Gateway's routes"
    );

    assert_eq!(flag(&run(&with_image(), BTreeMap::new())), None, "not kept");
    assert_eq!(
        flag(&run(
            &class_tunnel(TUNNEL_A),
            BTreeMap::from([(b.clone(), on(TUNNEL_A))])
        )),
        None,
        "kept on the class tunnel"
    );
    // team-a's plane kept on tunnel B while its Gateway is accepted on tunnel A: its render
    // decides, and team-c has tunnel B to itself.
    let out = run(
        &with_image(),
        BTreeMap::from([(ObjectKey::new("team-a", "a"), on(TUNNEL_B))]),
    );
    assert_eq!(
        flag_of(&out, "team-c", "c"),
        None,
        "an accepted Gateway is where its render says"
    );
}

fn rule_names(out: &Output, plane: &PlaneKey) -> Vec<String> {
    out.configs[plane]
        .rules
        .iter()
        .filter_map(|r| r.name.clone())
        .collect()
}

#[test]
fn planes_on_one_tunnel_serve_the_union_and_cross_namespace_sharing_is_flagged() {
    let out = translate(
        &snapshot(&format!(
            "{}{}{}{}",
            tenant("team-a", "a", TUNNEL_A),
            tenant("team-b", "b", TUNNEL_A),
            tenant("team-c", "c", TUNNEL_B),
            tenant_with_secret("team-d", "d", TUNNEL_A, b"guessed"),
        )),
        &with_image(),
    );
    let plane = |ns: &str, name: &str| PlaneKey::Dedicated(ObjectKey::new(ns, name));
    let union = vec![
        "team-a/a/0".to_owned(),
        "team-b/b/0".to_owned(),
        "team-a/a/listener:http".to_owned(),
        "team-b/b/listener:http".to_owned(),
    ];
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(rule_names(&out, &plane("team-a", "a"))),
        sorted(union.clone())
    );
    assert_eq!(
        sorted(rule_names(&out, &plane("team-b", "b"))),
        sorted(union)
    );
    assert_eq!(
        sorted(rule_names(&out, &plane("team-c", "c"))),
        vec!["team-c/c/0".to_owned(), "team-c/c/listener:http".to_owned()],
        "another tunnel keeps its own routes"
    );
    // A token naming tunnel A without its secret opens no tunnel: no union with A's planes.
    assert_eq!(
        sorted(rule_names(&out, &plane("team-d", "d"))),
        vec!["team-d/d/0".to_owned(), "team-d/d/listener:http".to_owned()]
    );

    let shared = |ns: &str, name: &str| {
        route_status(&out, ns, name)[0]
            .condition(ConditionType::TunnelShared)
            .cloned()
    };
    let a = shared("team-a", "a").expect("flagged");
    assert!(a.status);
    assert_eq!(a.reason, Reason::TunnelShared);
    assert!(
        a.message.contains(&format!(
            "tunnel {TUNNEL_A} is also used by Gateway team-b/b"
        )),
        "{}",
        a.message
    );
    assert!(shared("team-b", "b")
        .expect("flagged")
        .message
        .contains("team-a/a"));
    assert!(shared("team-c", "c").is_none());
    assert!(shared("team-d", "d").is_none());
    // Still accepted: sharing is supported, it is only not isolation.
    let accepted = route_status(&out, "team-a", "a")[0]
        .condition(ConditionType::Accepted)
        .map(|c| c.status);
    assert_eq!(accepted, Some(true));
}

/// Options with the tunnel `id` (secret `secret`) as the class tunnel.
fn class_tunnel(id: &str) -> Options {
    Options {
        shared_tunnel: Some(TunnelIdentity::of(&cftunnel_config::Token::new(
            "account",
            b"secret".to_vec(),
            id.parse().expect("uuid"),
        ))),
        ..with_image()
    }
}

#[test]
fn sharing_the_class_tunnel_or_a_namespace_is_not_flagged() {
    let gw_route = http_route(
        "infra",
        "to-shared",
        "  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: v1, port: 8080}]}]",
    );
    let options = class_tunnel(TUNNEL_A);
    let out = translate(
        &snapshot(&format!(
            "{}{}{gw_route}",
            tenant("team-a", "a", TUNNEL_A),
            tenant("team-a", "a2", TUNNEL_B).replace("from-team-a", "from-team-a-2"),
        )),
        &options,
    );
    // The class tunnel: the shared plane and the migrating Gateway serve each other's routes.
    let a = PlaneKey::Dedicated(ObjectKey::new("team-a", "a"));
    for plane in [&PlaneKey::Shared, &a] {
        let names = rule_names(&out, plane);
        assert!(
            names.contains(&"team-a/a/0".to_owned()),
            "{plane}: {names:?}"
        );
        assert!(
            names.contains(&"infra/to-shared/0".to_owned()),
            "{plane}: {names:?}"
        );
    }
    assert!(route_status(&out, "team-a", "a")[0]
        .condition(ConditionType::TunnelShared)
        .is_none());

    // Two Gateways of one namespace on one tunnel: served together, not flagged.
    let out = translate(
        &snapshot(&format!(
            "{}{}",
            tenant("team-a", "a", TUNNEL_B),
            tenant("team-a", "a2", TUNNEL_B).replace("from-team-a", "from-team-a-2"),
        )),
        &with_image(),
    );
    let names = rule_names(&out, &PlaneKey::Dedicated(ObjectKey::new("team-a", "a2")));
    assert!(names.contains(&"team-a/a/0".to_owned()), "{names:?}");
    assert!(route_status(&out, "team-a", "a2")[0]
        .condition(ConditionType::TunnelShared)
        .is_none());
}

/// The documented migration path: dedicated Gateways moving onto planes of their own keep the
/// class tunnel for a while. Any number of them, of any namespaces, share it with the shared
/// plane and are not flagged for it; dedicated Gateways of two namespaces on another tunnel
/// still are.
#[test]
fn dedicated_gateways_of_several_namespaces_on_the_class_tunnel_are_not_flagged() {
    let options = class_tunnel(TUNNEL_A);
    let out = translate(
        &snapshot(&format!(
            "{}{}{}{}",
            tenant("team-a", "a", TUNNEL_A),
            tenant("team-b", "b", TUNNEL_A),
            tenant("team-c", "c", TUNNEL_B),
            tenant("team-d", "d", TUNNEL_B),
        )),
        &options,
    );
    let shared = |ns: &str, name: &str| {
        route_status(&out, ns, name)[0]
            .condition(ConditionType::TunnelShared)
            .cloned()
    };
    assert_eq!(shared("team-a", "a"), None);
    assert_eq!(shared("team-b", "b"), None);
    // Still one tunnel: every plane on it serves the union.
    for plane in [
        PlaneKey::Shared,
        PlaneKey::Dedicated(ObjectKey::new("team-a", "a")),
    ] {
        let names = rule_names(&out, &plane);
        assert!(
            names.contains(&"team-b/b/0".to_owned()),
            "{plane}: {names:?}"
        );
    }
    let c = shared("team-c", "c").expect("another tunnel's sharing is flagged");
    assert!(c.status);
    assert!(c.message.contains("team-d/d"), "{}", c.message);
    assert!(shared("team-d", "d").is_some());
}

#[test]
fn a_route_on_two_gateways_of_one_tunnel_is_not_repeated() {
    let both = http_route(
        "team-a",
        "both",
        "  parentRefs: [{name: a}, {name: a2}]\n  hostnames: [x.example.com]\n  rules: [{backendRefs: [{name: v1, namespace: infra, port: 8080}]}]",
    );
    let mut a = tenant("team-a", "a", TUNNEL_B);
    let mut a2 = tenant("team-a", "a2", TUNNEL_B).replace("from-team-a", "from-team-a-2");
    // Listeners that admit any host, so the route attaches to both with the same hostnames.
    a = a.replace(", hostname: a.example.com", "");
    a2 = a2.replace(", hostname: a2.example.com", "");
    let out = translate(&snapshot(&format!("{a}{a2}{both}")), &with_image());
    let parents = route_status(&out, "team-a", "both");
    assert_eq!(parents.len(), 2);
    assert!(
        parents.iter().all(|p| p
            .condition(ConditionType::Accepted)
            .is_some_and(|c| c.status)),
        "{parents:#?}"
    );
    let names = rule_names(&out, &PlaneKey::Dedicated(ObjectKey::new("team-a", "a")));
    assert_eq!(
        names.iter().filter(|n| *n == "team-a/both/0").count(),
        1,
        "{names:?}"
    );
}

/// A Gateway `name` in `ns` on the shared plane, created `at`, with `listeners` (YAML flow
/// mappings, comma-separated).
fn shared_gateway(ns: &str, name: &str, at: &str, listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{at}\"}}\nspec:\n  gatewayClassName: cf\n  listeners: [{listeners}]\n---\n"
    )
}

fn listener_status<'a>(
    out: &'a Output,
    ns: &str,
    gateway: &str,
    listener: &str,
) -> &'a ListenerStatus {
    out.statuses.gateways[&ObjectKey::new(ns, gateway)]
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .expect("listener status present")
}

fn listener_condition(l: &ListenerStatus, kind: ConditionType) -> (bool, Reason) {
    let c = l
        .conditions
        .iter()
        .find(|c| c.kind == kind)
        .expect("listener condition present");
    (c.status, c.reason)
}

/// A condition whole, as `(kind, status, reason, message)`.
fn described(c: &Condition) -> (ConditionType, bool, Reason, &str) {
    (c.kind, c.status, c.reason, c.message.as_str())
}

/// Conditions without their messages, which name different listeners.
fn kinds_and_reasons(conditions: &[Condition]) -> Vec<(ConditionType, bool, Reason)> {
    conditions
        .iter()
        .map(|c| (c.kind, c.status, c.reason))
        .collect()
}

#[test]
fn an_older_gateway_keeps_a_hostname_on_the_shared_plane_and_the_newer_ones_listener_is_conflicted()
{
    let older = shared_gateway(
        "infra",
        "site",
        "2026-01-01T00:00:00Z",
        "{name: https, port: 443, protocol: HTTPS, hostname: app.example.com}",
    );
    // Another tenant, on another port: behind the tunnel it would take the same requests.
    let newer = shared_gateway(
        "web",
        "site",
        "2026-02-01T00:00:00Z",
        "{name: https, port: 8443, protocol: HTTPS, hostname: app.example.com}, {name: own, port: 443, protocol: HTTPS, hostname: web.example.com}",
    );
    let app = http_route(
        "infra",
        "app",
        "  parentRefs: [{name: site}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    // More specific than the older tenant's rule: merged into one host, it would take /login.
    let hijack = http_route(
        "web",
        "hijack",
        "  parentRefs: [{name: site, sectionName: https}]\n  rules: [{matches: [{path: {value: /login}}], backendRefs: [{name: web, port: 8080}]}]",
    );
    let own = http_route(
        "web",
        "own",
        "  parentRefs: [{name: site, sectionName: own}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    );
    let out = run(&format!("{older}{newer}{app}{hijack}{own}"));

    let lost = listener_status(&out, "web", "site", "https");
    assert_eq!(
        listener_condition(lost, ConditionType::Conflicted),
        (true, Reason::HostnameConflict)
    );
    let message = &lost
        .conditions
        .iter()
        .find(|c| c.kind == ConditionType::Conflicted)
        .expect("Conflicted")
        .message;
    assert_eq!(
        message,
        "listener https of Gateway infra/site already serves https://app.example.com on the shared plane and takes precedence (older, or first by namespace/name); ports do not tell listeners apart behind a tunnel"
    );
    assert_eq!(
        listener_condition(lost, ConditionType::Programmed),
        (false, Reason::Invalid)
    );
    // The route on it is refused there (below), and counted, as on any listener not valid.
    assert_eq!(lost.attached_routes, 1);
    let newer_gateway = &out.statuses.gateways[&ObjectKey::new("web", "site")];
    assert_eq!(
        described(&newer_gateway.conditions[0]),
        (
            ConditionType::Accepted,
            true,
            Reason::ListenersNotValid,
            "listeners not valid: https"
        ),
        "the newer Gateway still serves its other listener"
    );

    let kept = listener_status(&out, "infra", "site", "https");
    assert_eq!(
        listener_condition(kept, ConditionType::Conflicted),
        (false, Reason::NoConflicts)
    );
    assert_eq!(kept.attached_routes, 1);
    assert_eq!(
        condition(&out, "web", "hijack", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    assert_eq!(
        condition(&out, "web", "own", ConditionType::Accepted),
        (true, Reason::Accepted)
    );

    let names: Vec<&str> = shared(&out)
        .rules
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert!(names.contains(&"infra/app/0"), "{names:?}");
    assert!(names.contains(&"web/own/0"), "{names:?}");
    assert!(!names.contains(&"web/hijack/0"), "{names:?}");
    assert!(!names.contains(&"web/site/listener:https"), "{names:?}");
    let on_app: Vec<&str> = shared(&out)
        .rules
        .iter()
        .filter(|r| r.hostnames.iter().any(|h| h == "app.example.com"))
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(on_app, vec!["infra/app/0", "infra/site/listener:https"]);
    let routes = proxy_routes(shared(&out));
    let pick = |path: &str| picked(&routes, "https", "app.example.com", path);
    assert_eq!(pick("/login").as_deref(), Some("infra/app/0"));
    assert_eq!(pick("/").as_deref(), Some("infra/app/0"));
}

#[test]
fn equally_old_gateways_keep_a_hostname_by_the_joined_namespace_and_name() {
    // As a (namespace, name) tuple `team` sorts before `team-a`; as the string
    // "{namespace}/{name}" routes are ordered by, `team-a/gw` ('-' < '/') comes first.
    let listener = "{name: http, port: 80, protocol: HTTP, hostname: app.example.com}";
    let at = "2026-01-01T00:00:00Z";
    let out = run(&format!(
        "{}{}",
        shared_gateway("team", "gw", at, listener),
        shared_gateway("team-a", "gw", at, listener),
    ));
    assert_eq!(
        listener_condition(
            listener_status(&out, "team-a", "gw", "http"),
            ConditionType::Conflicted
        ),
        (false, Reason::NoConflicts)
    );
    let lost = listener_status(&out, "team", "gw", "http");
    assert_eq!(
        listener_condition(lost, ConditionType::Conflicted),
        (true, Reason::HostnameConflict)
    );
    assert!(
        lost.conditions
            .iter()
            .any(|c| c.message.contains("listener http of Gateway team-a/gw")),
        "{:?}",
        lost.conditions
    );

    // Without timestamps the same order holds, and a Gateway with one comes before both.
    let untimed =
        |ns: &str| shared_gateway(ns, "gw", "", listener).replace(", creationTimestamp: \"\"", "");
    let out = run(&format!("{}{}", untimed("team"), untimed("team-a")));
    assert_eq!(
        listener_condition(
            listener_status(&out, "team", "gw", "http"),
            ConditionType::Conflicted
        ),
        (true, Reason::HostnameConflict)
    );
    let out = run(&format!(
        "{}{}{}",
        untimed("team"),
        untimed("team-a"),
        shared_gateway("zz", "gw", at, listener)
    ));
    let conflicted = |ns: &str| {
        listener_condition(
            listener_status(&out, ns, "gw", "http"),
            ConditionType::Conflicted,
        )
        .0
    };
    assert_eq!(
        (conflicted("zz"), conflicted("team-a"), conflicted("team")),
        (false, true, true)
    );
}

#[test]
fn listeners_of_other_schemes_or_hostnames_do_not_conflict_across_gateways() {
    let older = shared_gateway(
        "infra",
        "a",
        "2026-01-01T00:00:00Z",
        "{name: http, port: 80, protocol: HTTP, hostname: app.example.com}, {name: wild, port: 443, protocol: HTTPS, hostname: \"*.example.com\"}",
    );
    let newer = shared_gateway(
        "web",
        "b",
        "2026-02-01T00:00:00Z",
        "{name: https, port: 443, protocol: HTTPS, hostname: app.example.com}, {name: wild, port: 80, protocol: HTTP, hostname: \"*.example.com\"}",
    );
    let on_a = http_route(
        "infra",
        "on-a",
        "  parentRefs: [{name: a, sectionName: http}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let on_b = http_route(
        "web",
        "on-b",
        "  parentRefs: [{name: b, sectionName: https}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    );
    let out = run(&format!("{older}{newer}{on_a}{on_b}"));
    for (ns, gateway) in [("infra", "a"), ("web", "b")] {
        for l in &out.statuses.gateways[&ObjectKey::new(ns, gateway)].listeners {
            assert_eq!(
                listener_condition(l, ConditionType::Conflicted),
                (false, Reason::NoConflicts),
                "{ns}/{gateway} listener {}",
                l.name
            );
        }
    }
    let routes = proxy_routes(shared(&out));
    let pick = |scheme: &str| picked(&routes, scheme, "app.example.com", "/");
    assert_eq!(pick("http").as_deref(), Some("infra/on-a/0"));
    assert_eq!(pick("https").as_deref(), Some("web/on-b/0"));
}

#[test]
fn dedicated_gateways_on_different_tunnels_may_share_a_hostname() {
    let out = translate(
        &snapshot(&format!(
            "{}{}",
            tenant("team-a", "a", TUNNEL_A),
            tenant("team-b", "b", TUNNEL_B)
                .replace("hostname: b.example.com", "hostname: a.example.com"),
        )),
        &with_image(),
    );
    for (ns, name) in [("team-a", "a"), ("team-b", "b")] {
        assert_eq!(
            listener_condition(
                listener_status(&out, ns, name, "http"),
                ConditionType::Conflicted
            ),
            (false, Reason::NoConflicts),
            "{ns}/{name}"
        );
        assert_eq!(
            rule_names(&out, &PlaneKey::Dedicated(ObjectKey::new(ns, name))),
            vec![
                format!("{ns}/{name}/0"),
                format!("{ns}/{name}/listener:http")
            ]
        );
    }
}

#[test]
fn dedicated_gateways_on_one_tunnel_with_one_hostname_are_both_served_from_the_union() {
    // team-b/b is older, though team-a/a comes first by name: neither takes the hostname.
    let a = created(
        tenant("team-a", "a", TUNNEL_A),
        "team-a",
        "2026-02-01T00:00:00Z",
    );
    let b = created(
        tenant("team-b", "b", TUNNEL_A)
            .replace("hostname: b.example.com", "hostname: a.example.com"),
        "team-b",
        "2026-01-01T00:00:00Z",
    );
    let out = translate(&snapshot(&format!("{a}{b}")), &with_image());
    let union = ["team-a/a/0", "team-b/b/0"];
    for (ns, name) in [("team-a", "a"), ("team-b", "b")] {
        let key = ObjectKey::new(ns, name);
        let l = listener_status(&out, ns, name, "http");
        assert_eq!(
            listener_condition(l, ConditionType::Conflicted),
            (false, Reason::NoConflicts),
            "{key}"
        );
        assert_eq!(
            listener_condition(l, ConditionType::Programmed),
            (true, Reason::Programmed),
            "{key}"
        );
        assert_eq!(l.attached_routes, 1, "{key}");
        assert_eq!(
            kinds_and_reasons(&out.statuses.gateways[&key].conditions),
            vec![
                (ConditionType::Accepted, true, Reason::Accepted),
                (ConditionType::Programmed, true, Reason::Programmed),
            ],
            "{key}"
        );
        let plane = PlaneKey::Dedicated(key.clone());
        assert_eq!(out.planes.get(&key), Some(&plane));
        // The tunnel's union, on every plane of it.
        let names = rule_names(&out, &plane);
        for route in union {
            assert!(names.contains(&route.to_owned()), "{key}: {names:?}");
        }
        let hosts: BTreeSet<&str> = out.configs[&plane]
            .rules
            .iter()
            .flat_map(|r| r.hostnames.iter().map(String::as_str))
            .collect();
        assert_eq!(hosts, BTreeSet::from(["a.example.com"]), "{key}");
        // Accepted, with the collapsed isolation flagged (different namespaces).
        assert_eq!(
            condition(&out, ns, name, ConditionType::Accepted),
            (true, Reason::Accepted),
            "{key}"
        );
        assert_eq!(
            condition(&out, ns, name, ConditionType::TunnelShared),
            (true, Reason::TunnelShared),
            "{key}"
        );
    }
}

#[test]
fn a_dedicated_gateway_on_the_class_tunnel_keeps_the_listener_of_an_older_shared_plane_gateway() {
    // The isolation guide's example listener, on an older shared-plane Gateway and on a
    // Gateway migrating to its own plane with a token of the class tunnel.
    let listener = "{name: https, port: 443, protocol: HTTPS}";
    let on_shared = shared_gateway("web", "site", "2026-01-01T00:00:00Z", listener);
    let site = http_route(
        "web",
        "site",
        "  parentRefs: [{name: site}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    );
    let migrating = created(
        tenant("team-a", "a", TUNNEL_A).replace(
            "{name: http, port: 80, protocol: HTTP, hostname: a.example.com}",
            listener,
        ),
        "team-a",
        "2026-02-01T00:00:00Z",
    );
    let class_tunnel = Options {
        shared_tunnel: Some(TunnelIdentity::of(&cftunnel_config::Token::new(
            "account",
            b"secret".to_vec(),
            TUNNEL_A.parse().expect("uuid"),
        ))),
        ..with_image()
    };
    let dedicated = ObjectKey::new("team-a", "a");
    for (case, options) in [
        ("class tunnel known", class_tunnel),
        ("class tunnel unknown", with_image()),
    ] {
        let out = translate(
            &snapshot(&format!("{on_shared}{site}{migrating}")),
            &options,
        );
        for (ns, name) in [("web", "site"), ("team-a", "a")] {
            let key = ObjectKey::new(ns, name);
            let l = listener_status(&out, ns, name, "https");
            assert_eq!(
                listener_condition(l, ConditionType::Conflicted),
                (false, Reason::NoConflicts),
                "{case}: {key}"
            );
            assert_eq!(l.attached_routes, 1, "{case}: {key}");
            assert_eq!(
                kinds_and_reasons(&out.statuses.gateways[&key].conditions),
                vec![
                    (ConditionType::Accepted, true, Reason::Accepted),
                    (ConditionType::Programmed, true, Reason::Programmed),
                ],
                "{case}: {key}"
            );
            assert_eq!(
                condition(&out, ns, name, ConditionType::Accepted),
                (true, Reason::Accepted),
                "{case}: {key}"
            );
        }
        assert_eq!(
            out.planes.get(&dedicated),
            Some(&PlaneKey::Dedicated(dedicated.clone())),
            "{case}"
        );
        // Not flagged: sharing the class tunnel is the migration path.
        assert!(
            route_status(&out, "team-a", "a")[0]
                .condition(ConditionType::TunnelShared)
                .is_none(),
            "{case}"
        );
        let on_dedicated = rule_names(&out, &PlaneKey::Dedicated(dedicated.clone()));
        let on_shared_plane = rule_names(&out, &PlaneKey::Shared);
        assert!(
            on_dedicated.contains(&"team-a/a/0".to_owned()),
            "{case}: {on_dedicated:?}"
        );
        assert!(
            on_shared_plane.contains(&"web/site/0".to_owned()),
            "{case}: {on_shared_plane:?}"
        );
        if case == "class tunnel known" {
            // One tunnel: both planes serve the union.
            assert!(
                on_dedicated.contains(&"web/site/0".to_owned()),
                "{case}: {on_dedicated:?}"
            );
            assert!(
                on_shared_plane.contains(&"team-a/a/0".to_owned()),
                "{case}: {on_shared_plane:?}"
            );
        }
    }
}

#[test]
fn a_route_on_a_listener_lost_to_an_older_gateway_is_reported_as_on_a_listener_conflicted_in_its_gateway(
) {
    let older = shared_gateway(
        "infra",
        "old",
        "2026-01-01T00:00:00Z",
        "{name: web, port: 443, protocol: HTTPS, hostname: app.example.com}",
    );
    let route = http_route(
        "web",
        "r",
        "  parentRefs: [{name: new, sectionName: web}]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    );
    let web = "{name: web, port: 443, protocol: HTTPS, hostname: app.example.com}";
    let web_again = "{name: web-again, port: 443, protocol: HTTPS, hostname: app.example.com}";
    // With another listener left to the Gateway, and without.
    for other in [
        ", {name: other, port: 443, protocol: HTTPS, hostname: other.example.com}",
        "",
    ] {
        let newer =
            |listeners: &str| shared_gateway("web", "new", "2026-02-01T00:00:00Z", listeners);
        let across = run(&format!(
            "{older}{}{route}",
            newer(&format!("{web}{other}"))
        ));
        let within = run(&format!(
            "{}{route}",
            newer(&format!("{web}, {web_again}{other}"))
        ));

        let status = route_status(&across, "web", "r");
        assert_eq!(
            condition(&across, "web", "r", ConditionType::Accepted),
            (false, Reason::NoMatchingParent)
        );
        assert_eq!(
            status,
            route_status(&within, "web", "r"),
            "other: {other:?}"
        );

        let lost = listener_status(&across, "web", "new", "web");
        let conflicted = listener_status(&within, "web", "new", "web");
        assert_eq!(lost.attached_routes, conflicted.attached_routes);
        assert_eq!(
            kinds_and_reasons(&lost.conditions),
            kinds_and_reasons(&conflicted.conditions),
            "other: {other:?}"
        );
        let gateway = |out: &Output| {
            kinds_and_reasons(&out.statuses.gateways[&ObjectKey::new("web", "new")].conditions)
        };
        assert_eq!(gateway(&across), gateway(&within), "other: {other:?}");
        assert_eq!(
            across.planes.get(&ObjectKey::new("web", "new")),
            within.planes.get(&ObjectKey::new("web", "new"))
        );
        for out in [&across, &within] {
            assert!(!rule_names(out, &PlaneKey::Shared).contains(&"web/r/0".to_owned()));
        }
    }
}

/// Two tenants on the shared plane: `infra/a` with an HTTPS listener for `app.example.com` and a
/// route for it, and `web/b`, older, with `b_listener` (HTTPS, named `https`) and two routes
/// naming `app.example.com`: `grab`, with a rule more specific than `infra/a`'s that would take
/// its `/login` if both were merged into one host, also naming `other.example.com`, and
/// `only-app`, naming nothing else.
fn tenants_naming_app_example_com(b_listener: &str) -> Output {
    let a = shared_gateway(
        "infra",
        "a",
        "2026-02-01T00:00:00Z",
        "{name: https, port: 443, protocol: HTTPS, hostname: app.example.com}",
    );
    // Older, so nothing here is decided by Gateway precedence.
    let b = shared_gateway("web", "b", "2026-01-01T00:00:00Z", b_listener);
    let app = http_route(
        "infra",
        "app",
        "  parentRefs: [{name: a}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let grab = http_route(
        "web",
        "grab",
        "  parentRefs: [{name: b}]\n  hostnames: [app.example.com, other.example.com]\n  rules: [{matches: [{path: {value: /login}}], backendRefs: [{name: web, port: 8080}]}]",
    );
    let only_app = http_route(
        "web",
        "only-app",
        "  parentRefs: [{name: b}]\n  hostnames: [app.example.com]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]",
    );
    run(&format!("{a}{b}{app}{grab}{only_app}"))
}

/// What [`tenants_naming_app_example_com`] must give, whatever `web/b`'s listener hostname:
/// `app.example.com` is `infra/a`'s alone, `other.example.com` is still `web/b`'s, and the routes
/// of `web/b` stay accepted.
fn assert_app_example_com_is_left_to_its_listener(out: &Output) {
    let routes = proxy_routes(shared(out));
    let pick = |host: &str, path: &str| picked(&routes, "https", host, path);
    assert_eq!(
        pick("app.example.com", "/login").as_deref(),
        Some("infra/app/0")
    );
    assert_eq!(pick("app.example.com", "/").as_deref(), Some("infra/app/0"));
    assert_eq!(
        pick("other.example.com", "/login").as_deref(),
        Some("web/grab/0")
    );
    let on_app: Vec<&str> = shared(out)
        .rules
        .iter()
        .filter(|r| r.hostnames.iter().any(|h| h == "app.example.com"))
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(on_app, vec!["infra/app/0", "infra/a/listener:https"]);
    let names = rule_names(out, &PlaneKey::Shared);
    assert!(!names.contains(&"web/only-app/0".to_owned()), "{names:?}");

    // As when a more specific listener of the route's own Gateway takes its hostnames.
    for route in ["grab", "only-app"] {
        assert_eq!(
            condition(out, "web", route, ConditionType::Accepted),
            (true, Reason::Accepted),
            "{route}"
        );
    }
    assert_eq!(listener_status(out, "web", "b", "https").attached_routes, 2);
    for (ns, gateway) in [("infra", "a"), ("web", "b")] {
        assert_eq!(
            listener_condition(
                listener_status(out, ns, gateway, "https"),
                ConditionType::Conflicted
            ),
            (false, Reason::NoConflicts),
            "{ns}/{gateway}"
        );
    }
}

#[test]
fn a_wildcard_listener_leaves_hostnames_of_another_gateways_more_specific_listener_to_it() {
    let out = tenants_naming_app_example_com(
        "{name: https, port: 443, protocol: HTTPS, hostname: \"*.example.com\"}",
    );
    assert_app_example_com_is_left_to_its_listener(&out);
}

#[test]
fn a_listener_without_hostname_leaves_hostnames_of_another_gateways_listener_to_it() {
    let out = tenants_naming_app_example_com("{name: https, port: 443, protocol: HTTPS}");
    assert_app_example_com_is_left_to_its_listener(&out);
}

#[test]
fn a_more_specific_listener_on_another_tunnel_leaves_the_hostname_to_the_wildcard_listener() {
    let a = tenant("team-a", "a", TUNNEL_A)
        .replace("hostname: a.example.com", "hostname: app.example.com");
    let b = |tunnel: &str| {
        tenant("team-b", "b", tunnel)
            .replace("hostname: b.example.com", "hostname: \"*.example.com\"")
    };
    let grab = http_route(
        "team-b",
        "grab",
        "  parentRefs: [{name: b}]\n  hostnames: [app.example.com, other.example.com]\n  rules: [{matches: [{path: {value: /login}}], backendRefs: [{name: v1, namespace: infra, port: 8080}]}]",
    );
    let picks = |out: &Output, plane: &ObjectKey| {
        let routes = proxy_routes(&out.configs[&PlaneKey::Dedicated(plane.clone())]);
        ["app.example.com", "other.example.com"].map(|host| {
            proxy_pick(&routes, "GET", host, "/login", &[])
                .and_then(|r| r.name.as_deref().map(str::to_owned))
                .unwrap_or_default()
        })
    };
    let plane_a = ObjectKey::new("team-a", "a");
    let plane_b = ObjectKey::new("team-b", "b");

    // Different tunnels, different route tables: each plane serves its own Gateway's listeners.
    let out = translate(
        &snapshot(&format!("{a}{}{grab}", b(TUNNEL_B))),
        &with_image(),
    );
    assert_eq!(picks(&out, &plane_b), ["team-b/grab/0", "team-b/grab/0"]);
    assert_eq!(picks(&out, &plane_a)[0], "team-a/a/0");

    // One tunnel: one table, where `app.example.com` is team-a's listener's alone.
    let out = translate(
        &snapshot(&format!("{a}{}{grab}", b(TUNNEL_A))),
        &with_image(),
    );
    for plane in [&plane_a, &plane_b] {
        assert_eq!(
            picks(&out, plane),
            ["team-a/a/0", "team-b/grab/0"],
            "{plane}"
        );
    }
}

#[test]
fn listeners_of_other_schemes_do_not_take_hostnames_from_each_other() {
    let plain = shared_gateway(
        "web",
        "plain",
        "2026-01-01T00:00:00Z",
        "{name: http, port: 80, protocol: HTTP, hostname: \"*.example.com\"}",
    );
    let secure = shared_gateway(
        "infra",
        "secure",
        "2026-02-01T00:00:00Z",
        "{name: https, port: 443, protocol: HTTPS, hostname: app.example.com}",
    );
    let on_plain = http_route(
        "web",
        "on-plain",
        "  parentRefs: [{name: plain}]\n  hostnames: [app.example.com]\n  rules: [{matches: [{path: {value: /login}}], backendRefs: [{name: web, port: 8080}]}]",
    );
    let on_secure = http_route(
        "infra",
        "on-secure",
        "  parentRefs: [{name: secure}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&format!("{plain}{secure}{on_plain}{on_secure}"));
    let routes = proxy_routes(shared(&out));
    let pick = |scheme: &str, path: &str| picked(&routes, scheme, "app.example.com", path);
    assert_eq!(pick("http", "/login").as_deref(), Some("web/on-plain/0"));
    assert_eq!(
        pick("https", "/login").as_deref(),
        Some("infra/on-secure/0")
    );
    assert_eq!(pick("https", "/").as_deref(), Some("infra/on-secure/0"));
    // The HTTP listener's own isolation rule, not the HTTPS listener's routes.
    assert_eq!(
        pick("http", "/").as_deref(),
        Some("web/plain/listener:http")
    );
}

#[test]
fn a_more_specific_listener_of_a_gateway_not_accepted_leaves_the_hostname_to_the_wildcard_listener()
{
    let wild = shared_gateway(
        "web",
        "wild",
        "2026-01-01T00:00:00Z",
        "{name: https, port: 443, protocol: HTTPS, hostname: \"*.example.com\"}",
    );
    let grab = http_route(
        "web",
        "grab",
        "  parentRefs: [{name: wild}]\n  hostnames: [app.example.com, other.example.com]\n  rules: [{matches: [{path: {value: /login}}], backendRefs: [{name: web, port: 8080}]}]",
    );
    let grab_hostnames = |out: &Output| -> Vec<String> {
        shared(out)
            .rules
            .iter()
            .filter(|r| r.name.as_deref() == Some("web/grab/0"))
            .flat_map(|r| r.hostnames.clone())
            .collect()
    };
    let pick_login = |out: &Output| {
        let routes = proxy_routes(shared(out));
        picked(&routes, "https", "app.example.com", "/login")
    };
    let only_other = vec!["other.example.com".to_owned()];
    let both = vec!["app.example.com".to_owned(), "other.example.com".to_owned()];
    let not_accepted = |out: &Output, key: &ObjectKey, reason: Reason| {
        assert_eq!(
            kinds_and_reasons(&out.statuses.gateways[key].conditions),
            vec![
                (ConditionType::Accepted, false, reason),
                (ConditionType::Programmed, false, Reason::Invalid),
            ],
            "{key}"
        );
        assert_eq!(out.planes.get(key), None, "{key}");
    };
    let app = "{name: app, port: 443, protocol: HTTPS, hostname: app.example.com}";

    // A shared-plane Gateway whose every listener conflicts within it.
    let iso = |listeners: &str| shared_gateway("infra", "iso", "2026-02-01T00:00:00Z", listeners);
    let out = run(&format!("{wild}{grab}{}", iso(app)));
    assert_eq!(
        grab_hostnames(&out),
        only_other,
        "a usable listener takes it"
    );
    let app_again = "{name: app-again, port: 443, protocol: HTTPS, hostname: app.example.com}";
    let out = run(&format!(
        "{wild}{grab}{}",
        iso(&format!("{app}, {app_again}"))
    ));
    not_accepted(
        &out,
        &ObjectKey::new("infra", "iso"),
        Reason::ListenersNotValid,
    );
    assert_eq!(grab_hostnames(&out), both);
    assert_eq!(pick_login(&out).as_deref(), Some("web/grab/0"));

    // A dedicated Gateway on the class tunnel, refused for its parameters.
    let class_tunnel = Options {
        shared_tunnel: Some(TunnelIdentity::of(&cftunnel_config::Token::new(
            "account",
            b"secret".to_vec(),
            TUNNEL_A.parse().expect("uuid"),
        ))),
        ..with_image()
    };
    let healthy = tenant("team-a", "a", TUNNEL_A).replace(
        "{name: http, port: 80, protocol: HTTP, hostname: a.example.com}",
        app,
    );
    let out = translate(&snapshot(&format!("{wild}{grab}{healthy}")), &class_tunnel);
    assert_eq!(
        grab_hostnames(&out),
        only_other,
        "a usable listener takes it"
    );
    assert_eq!(pick_login(&out).as_deref(), Some("team-a/a/0"));
    let missing_config = healthy.replace(
        "kind: GatewayConfig, name: a}",
        "kind: GatewayConfig, name: gone}",
    );
    // The tunnel is known, but no image to render the plane with.
    let no_image = Options {
        proxy_image: None,
        ..class_tunnel.clone()
    };
    for (case, manifests, options) in [
        ("GatewayConfig not found", &missing_config, &class_tunnel),
        ("no proxy image", &healthy, &no_image),
    ] {
        let out = translate(&snapshot(&format!("{wild}{grab}{manifests}")), options);
        not_accepted(
            &out,
            &ObjectKey::new("team-a", "a"),
            Reason::InvalidParameters,
        );
        assert_eq!(grab_hostnames(&out), both, "{case}");
        assert_eq!(pick_login(&out).as_deref(), Some("web/grab/0"), "{case}");
    }
}

#[test]
fn an_owned_class_is_accepted_and_told_whether_the_crds_are_supported() {
    let crd = |plural: &str, version: &str| {
        format!(
            "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.gateway.networking.k8s.io\n  annotations: {{gateway.networking.k8s.io/bundle-version: {version}}}\n"
        )
    };
    let class = |out: &Output| {
        out.statuses
            .gateway_classes
            .get("cf")
            .expect("the owned class has a status")
            .iter()
            .map(|c| (c.kind, c.status, c.reason))
            .collect::<Vec<_>>()
    };
    let supported = run(&(crd("gateways", "v1.6.1") + &crd("httproutes", "v1.5.1")));
    assert_eq!(
        class(&supported),
        vec![
            (ConditionType::Accepted, true, Reason::Accepted),
            (
                ConditionType::SupportedVersion,
                true,
                Reason::SupportedVersion
            ),
        ]
    );
    assert!(
        !supported
            .statuses
            .gateway_classes
            .contains_key("someone-else"),
        "another controller's class gets nothing"
    );
    // Best effort: still accepted, and its Gateways still served.
    let newer = run(&(crd("gateways", "v1.6.1") + &crd("httproutes", "v1.7.0")));
    assert_eq!(
        class(&newer),
        vec![
            (ConditionType::Accepted, true, Reason::Accepted),
            (
                ConditionType::SupportedVersion,
                false,
                Reason::UnsupportedVersion
            ),
        ]
    );
    assert_eq!(newer.planes, supported.planes);
    assert_eq!(
        class(&run(""))[1],
        (
            ConditionType::SupportedVersion,
            false,
            Reason::UnsupportedVersion
        ),
        "no CRD in the snapshot: versions unknown"
    );
}

#[test]
fn with_hostname_ownership_a_route_publishes_only_what_its_namespace_is_labelled_for() {
    let gateway = r#"apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {"hostnames.cf.k8s.lex.la/team-a.example.com": "true"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: open, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: any, port: 80, protocol: HTTP, hostname: "*.example.com", allowedRoutes: {namespaces: {from: All}}}
---
"#;
    let route = |ns: &str, name: &str, hostnames: &str| {
        http_route(
            ns,
            name,
            &format!("  parentRefs: [{{name: open, namespace: infra}}]\n{hostnames}  rules: [{{backendRefs: [{{name: svc, port: 8080}}]}}]"),
        )
    };
    let service = |ns: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: {ns}}}\nspec: {{ports: [{{port: 8080}}]}}\n---\n")
    };
    let manifests = [
        gateway.to_owned(),
        service("team-a"),
        service("team-b"),
        route(
            "team-a",
            "own",
            "  hostnames: [shop.team-a.example.com, \"*.api.team-a.example.com\"]\n",
        ),
        route(
            "team-a",
            "theft",
            "  hostnames: [shop.team-b.example.com]\n",
        ),
        route(
            "team-a",
            "mixed",
            "  hostnames: [x.team-a.example.com, y.other.net]\n",
        ),
        route("team-a", "everything", ""),
        route(
            "team-b",
            "unlabelled",
            "  hostnames: [www.team-b.example.com]\n",
        ),
    ]
    .concat();
    let owned = Options {
        hostname_ownership: true,
        ..Options::default()
    };
    let out = translate(&snapshot(&manifests), &owned);
    assert_eq!(
        condition(&out, "team-a", "own", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    for (ns, name, says) in [
        ("team-a", "theft", "may not publish shop.team-b.example.com"),
        ("team-a", "mixed", "may not publish y.other.net"),
        ("team-a", "everything", "may not publish *.example.com"),
        (
            "team-b",
            "unlabelled",
            "may not publish www.team-b.example.com",
        ),
    ] {
        assert_eq!(
            condition(&out, ns, name, ConditionType::Accepted),
            (false, Reason::HostnameNotPermitted),
            "{ns}/{name}"
        );
        let message = route_status(&out, ns, name)
            .first()
            .and_then(|p| p.condition(ConditionType::Accepted))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(message.contains(says), "{ns}/{name}: {message}");
    }
    // Only the permitted route is published, and a refused route takes no host from it.
    let published: BTreeSet<&str> = route_rules(&out)
        .into_iter()
        .flat_map(|r| r.hostnames.iter().map(String::as_str))
        .collect();
    assert_eq!(
        published,
        BTreeSet::from(["shop.team-a.example.com", "*.api.team-a.example.com"])
    );

    // Off (the default), the same routes are all accepted.
    let out = translate(&snapshot(&manifests), &Options::default());
    for (ns, name) in [
        ("team-a", "theft"),
        ("team-a", "everything"),
        ("team-b", "unlabelled"),
    ] {
        assert_eq!(
            condition(&out, ns, name, ConditionType::Accepted),
            (true, Reason::Accepted),
            "{ns}/{name}"
        );
    }
}

#[test]
fn a_route_whose_matches_an_older_route_takes_is_told_it_is_shadowed() {
    let route = |name: &str, created: &str, rules: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: infra, creationTimestamp: \"{created}\"}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [shop.example.com]\n  rules:\n{rules}---\n"
        )
    };
    let cart = "  - {matches: [{path: {type: PathPrefix, value: /cart}}], backendRefs: [{name: v2, port: 8080}]}\n";
    let other = "  - {matches: [{path: {type: PathPrefix, value: /other}}], backendRefs: [{name: v2, port: 8080}]}\n";
    let out = run(&[
        route("first", "2024-01-01T00:00:00Z", cart),
        route("second", "2024-02-01T00:00:00Z", &format!("{other}{cart}")),
        route("third", "2024-03-01T00:00:00Z", other),
    ]
    .concat());
    let shadowed = |name: &str| {
        route_status(&out, "infra", name)
            .first()
            .and_then(|p| p.condition(ConditionType::RouteShadowed))
            .map(|c| (c.status, c.reason, c.message.clone()))
    };
    assert_eq!(shadowed("first"), None);
    let (status, reason, message) = shadowed("second").expect("second is shadowed");
    assert!(status);
    assert_eq!(reason, Reason::OlderRouteMatches);
    assert!(
        message.contains("HTTPRoute infra/first serves the same matches first on shop.example.com (rules 1 of this route)"),
        "{message}"
    );
    // The third repeats only second's /other, which second serves: shadowed by second.
    let (_, _, message) = shadowed("third").expect("third is shadowed");
    assert!(message.contains("HTTPRoute infra/second"), "{message}");
    // Shadowed routes stay accepted: some of their matches may still be theirs.
    assert_eq!(
        condition(&out, "infra", "second", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
}

mod access;
mod app_protocol;
mod backend_tls;
mod external_backend;
mod listener_set;
mod listener_tls;
mod regex_budget;
mod route_kinds;
mod service_import;

proptest::proptest! {
    /// Precedence compares `{namespace}/{name}` as that one string, whichever way the names
    /// split it.
    #[test]
    fn precedence_compares_the_joined_names(
        a in "[a-c/-]{0,4}", b in "[a-c/-]{0,4}", c in "[a-c/-]{0,4}", d in "[a-c/-]{0,4}",
    ) {
        let left = Precedence::new(None, &a, &b);
        let right = Precedence::new(None, &c, &d);
        proptest::prop_assert_eq!(left.cmp(&right), format!("{a}/{b}").cmp(&format!("{c}/{d}")));
    }

    /// The leading bytes kept for routes order them as the joined names do, including names
    /// longer than those bytes, that end within them, or that hold a zero byte.
    #[test]
    fn keyed_precedence_compares_the_joined_names(
        a in "[a\\x00/-]{0,6}", b in "[a\\x00/-]{0,6}", c in "[a\\x00/-]{0,6}", d in "[a\\x00/-]{0,6}",
    ) {
        let left = Precedence::keyed(None, &a, &b);
        let right = Precedence::keyed(None, &c, &d);
        proptest::prop_assert_eq!(left.cmp(&right), format!("{a}/{b}").cmp(&format!("{c}/{d}")));
        proptest::prop_assert_eq!(left.cmp(&Precedence::new(None, &c, &d)), left.cmp(&right));
    }
}

/// Gateway API: an address `spec.addresses` asks for and the Gateway does not get shows in
/// its conditions. A Gateway is reached at its tunnel's hostname alone: that one, by value or
/// by type, is assigned; anything else is not (the Gateway still serves, at its tunnel).
#[test]
fn addresses_other_than_the_tunnels_hostname_are_not_assigned() {
    let id = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
    let options = Options {
        shared_tunnel: Some(TunnelIdentity::named(id.parse().expect("uuid"))),
        ..Options::default()
    };
    let cases = [
        ("[{type: Hostname, value: \"ID.cfargotunnel.com\"}]", None),
        ("[{type: Hostname}]", None),
        (
            "[{type: IPAddress, value: 203.0.113.10}]",
            Some("spec.addresses asks for IPAddress 203.0.113.10: a Gateway is reached at its tunnel's hostname, ID.cfargotunnel.com, alone"),
        ),
        (
            "[{value: 203.0.113.10}, {type: Hostname, value: edge.example.com}]",
            Some("spec.addresses asks for IPAddress 203.0.113.10, Hostname edge.example.com: a Gateway is reached at its tunnel's hostname, ID.cfargotunnel.com, alone"),
        ),
    ];
    for (addresses, unassigned) in cases {
        let addresses = addresses.replace("ID", id);
        let (programmed, served) = asking_for(&addresses, &options);
        match unassigned {
            None => assert!(programmed.status, "{addresses}: {}", programmed.message),
            Some(message) => assert_eq!(
                described(&programmed),
                (
                    ConditionType::Programmed,
                    false,
                    Reason::AddressNotAssigned,
                    message.replace("ID", id).as_str()
                ),
                "{addresses}"
            ),
        }
        assert!(served, "still served");
    }
    // A class tunnel known by no token here: a Hostname may be its, an IP address is not.
    let unknown = |addresses: &str| {
        let (programmed, _) = asking_for(addresses, &Options::default());
        (programmed.status, programmed.reason)
    };
    assert_eq!(
        unknown("[{type: Hostname, value: x.cfargotunnel.com}]"),
        (true, Reason::Programmed)
    );
    assert_eq!(
        unknown("[{type: IPAddress, value: 203.0.113.10}]"),
        (false, Reason::AddressNotAssigned)
    );
}

/// Gateway `infra/asks` on the shared plane with `spec.addresses: <addresses>`, translated
/// with `options`: its `Programmed`, and whether it has a plane.
fn asking_for(addresses: &str, options: &Options) -> (Condition, bool) {
    let gateway = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: asks, namespace: infra}}\nspec:\n  gatewayClassName: cf\n  addresses: {addresses}\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: asks.example.com}}]\n---\n"
    );
    let out = translate(&snapshot(&gateway), options);
    let key = ObjectKey::new("infra", "asks");
    let programmed = out.statuses.gateways[&key]
        .conditions
        .iter()
        .find(|c| c.kind == ConditionType::Programmed)
        .expect("Programmed")
        .clone();
    (programmed, out.planes.contains_key(&key))
}
