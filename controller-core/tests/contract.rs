//! The invariant between the controller and the proxy: every document the translation emits is
//! one the proxy's own compile accepts, whatever the routes say. Generated HTTPRoutes and
//! GRPCRoutes, hostile ones included (huge and nested regexes, odd hostnames and header names,
//! every filter with arbitrary values), are translated, and every plane's document is compiled
//! with the proxy's code; a rule the contract refuses is left out and its route says why.

use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{
    translate, ConditionType, Options, Output, RouteKey, RouteKind, Snapshot,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A shared Gateway and a dedicated one (its own plane), Services of every kind a backendRef
/// can name, as in a cluster.
const CLUSTER: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: v1
kind: Namespace
metadata: {name: infra}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}, kinds: [{kind: HTTPRoute}, {kind: GRPCRoute}]}}
  - {name: https, port: 443, protocol: HTTPS, hostname: "*.example.com", allowedRoutes: {namespaces: {from: All}, kinds: [{kind: HTTPRoute}, {kind: GRPCRoute}]}}
---
apiVersion: v1
kind: Secret
metadata: {name: edge-token, namespace: infra}
stringData:
  tunnel-token: eyJhIjoiYWNjdCIsInMiOiJjMlZqY21WMGMyVmpjbVYwYzJWamNtVjBjMlZqY21WMGMyVmpjbVYwIiwidCI6IjZmZjQyYWUyLTc2NWQtNGFkZi04MTEyLTMxYzU1YzE1NTFlZiJ9
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {name: edge, namespace: infra}
spec: {tunnelTokenSecretRef: {name: edge-token}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: infra}
spec:
  gatewayClassName: cf
  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: edge}}
  listeners:
  - {name: http, port: 8080, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: GRPCRoute}]}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: infra}
spec:
  ports:
  - {name: http, port: 8080, targetPort: 3000}
  - {name: grpc, port: 9000, targetPort: 3001, appProtocol: kubernetes.io/h2c}
  - {name: wide, port: 65535, targetPort: 65535}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: infra, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 3000}, {name: grpc, port: 3001}, {name: wide, port: 65535}]
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: v1
kind: Service
metadata: {name: outside, namespace: infra}
spec: {type: ExternalName, externalName: api.example.net, ports: [{port: 443}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: infra}
spec: {clusterIP: None, ports: [{port: 80, targetPort: 8080}]}
"#;

/// Text as a route author might write it, well-formed or not.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        24 => "[a-z0-9-]{1,12}",
        1 => Just(String::new()),
        2 => any::<String>(),
        1 => "[ -~]{0,40}",
        1 => "[\\x00-\\x1f\\x7f]{1,3}",
        1 => "\\PC{200,400}",
    ]
}

fn hostname() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => "[a-z]{1,8}\\.example\\.com",
        4 => "\\*\\.[a-z]{1,8}\\.com",
        1 => "[A-Za-z0-9_.*-]{0,20}",
        1 => text(),
        1 => "([a-z]{63}\\.){4}com",
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "/[a-z0-9/._~-]{0,16}",
        2 => Just("/".to_owned()),
        1 => text(),
        1 => "/[ -~]{0,20}",
    ]
}

/// Regular expressions, including ones no engine should take: too large, nested, unbalanced.
fn regex() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => "/[a-z]{1,6}(/[a-z0-9]+)?\\.\\*",
        2 => (1u32..400).prop_map(|n| format!("/\\w{{{n}}}")),
        1 => (1u32..60, 1u32..60).prop_map(|(a, b)| format!("(?:(?:[a-z]{{{a}}}){{{b}}})+")),
        1 => (1usize..6).prop_map(|depth| format!("{}a{}", "(".repeat(depth), "+)".repeat(depth))),
        1 => (1u32..30).prop_map(|n| format!("(?i)\\p{{L}}{{{n}}}\\d+")),
        1 => prop::collection::vec("[a-z]{1,8}", 1..200).prop_map(|w| w.join("|")),
        1 => Just("a)|(b".to_owned()),
        1 => Just("[".to_owned()),
        1 => Just("(?P<name>x)\\1".to_owned()),
        2 => text(),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "[A-Za-z][A-Za-z0-9-]{0,15}",
        1 => Just("X-Forwarded-Proto".to_owned()),
        2 => text(),
    ]
}

fn port() -> impl Strategy<Value = i64> {
    prop_oneof![
        20 => prop::sample::select(vec![8080i64, 9000, 65535, 443, 80]),
        2 => prop::sample::select(vec![0i64, -1, 65536, 70_000]),
        1 => -2i64..70_000,
    ]
}

fn backend_ref() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["web", "outside", "headless", "missing"]),
        port(),
        prop::option::of(-3i64..5),
        prop::option::of(prop::sample::select(vec!["infra", "elsewhere"])),
    )
        .prop_map(|(name, port, weight, namespace)| {
            let mut v = json!({"name": name, "port": port});
            if let Some(w) = weight {
                v["weight"] = json!(w);
            }
            if let Some(ns) = namespace {
                v["namespace"] = json!(ns);
            }
            v
        })
}

fn header_list() -> impl Strategy<Value = Value> {
    prop::collection::vec((header_name(), text()), 0..3).prop_map(|l| {
        Value::Array(
            l.into_iter()
                .map(|(n, v)| json!({"name": n, "value": v}))
                .collect(),
        )
    })
}

fn header_modifier() -> impl Strategy<Value = Value> {
    (
        header_list(),
        header_list(),
        prop::collection::vec(header_name(), 0..3),
    )
        .prop_map(|(set, add, remove)| json!({"set": set, "add": add, "remove": remove}))
}

fn path_modifier(full: bool) -> impl Strategy<Value = Value> {
    path().prop_map(move |p| {
        if full {
            json!({"type": "ReplaceFullPath", "replaceFullPath": p})
        } else {
            json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": p})
        }
    })
}

/// Every HTTPRoute filter type, with arbitrary values where the schema has strings.
fn filter() -> impl Strategy<Value = Value> {
    prop_oneof![
        header_modifier().prop_map(|m| json!({"type": "RequestHeaderModifier", "requestHeaderModifier": m})),
        header_modifier().prop_map(|m| json!({"type": "ResponseHeaderModifier", "responseHeaderModifier": m})),
        (
            prop::option::of(prop::sample::select(vec!["http", "https"])),
            prop::option::of(hostname()),
            prop::option::of(-1i64..70_000),
            prop::option::of(any::<bool>().prop_flat_map(path_modifier)),
            prop::option::of(prop::sample::select(vec![301i64, 302, 303, 307, 308, 200])),
        )
            .prop_map(|(scheme, hostname, port, path, status)| {
                json!({"type": "RequestRedirect", "requestRedirect": {
                    "scheme": scheme, "hostname": hostname, "port": port, "path": path, "statusCode": status}})
            }),
        (
            prop::option::of(hostname()),
            prop::option::of(any::<bool>().prop_flat_map(path_modifier)),
        )
            .prop_map(|(hostname, path)| {
                json!({"type": "URLRewrite", "urlRewrite": {"hostname": hostname, "path": path}})
            }),
        (backend_ref(), prop::option::of(-5i64..150)).prop_map(|(b, percent)| {
            json!({"type": "RequestMirror", "requestMirror": {"backendRef": b, "percent": percent}})
        }),
        (
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(header_name(), 0..3),
            prop::option::of(-5i64..100_000),
        )
            .prop_map(|(origins, methods, headers, max_age)| {
                json!({"type": "CORS", "cors": {
                    "allowOrigins": origins, "allowMethods": methods, "allowHeaders": headers,
                    "exposeHeaders": headers, "maxAge": max_age}})
            }),
        Just(json!({"type": "ExtensionRef", "extensionRef": {"group": "x", "kind": "Y", "name": "z"}})),
    ]
}

fn http_match() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            path().prop_map(|v| json!({"type": "PathPrefix", "value": v})),
            path().prop_map(|v| json!({"type": "Exact", "value": v})),
            regex().prop_map(|v| json!({"type": "RegularExpression", "value": v})),
        ],
        prop::collection::vec(
            (header_name(), prop_oneof![text(), regex()], any::<bool>()),
            0..3,
        ),
        prop::collection::vec((text(), prop_oneof![text(), regex()], any::<bool>()), 0..2),
        prop::option::of(prop::sample::select(vec!["GET", "POST", "PATCH"])),
    )
        .prop_map(|(path, headers, query, method)| {
            let value_match = |(name, value, regex): (String, String, bool)| {
                let kind = if regex { "RegularExpression" } else { "Exact" };
                json!({"type": kind, "name": name, "value": value})
            };
            json!({
                "path": path,
                "headers": headers.into_iter().map(value_match).collect::<Vec<_>>(),
                "queryParams": query.into_iter().map(value_match).collect::<Vec<_>>(),
                "method": method,
            })
        })
}

fn duration() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9]{1,3}(ms|s|m)", Just("0s".to_owned()), text(),]
}

fn http_rule() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(http_match(), 0..3),
        prop::collection::vec(filter(), 0..3),
        prop::collection::vec((backend_ref(), prop::collection::vec(filter(), 0..2)), 0..3),
        prop::option::of((prop::option::of(duration()), prop::option::of(duration()))),
        prop::option::of((
            prop::collection::vec(prop::sample::select(vec![500i64, 503, 404, 200, 999]), 0..3),
            prop::option::of(-1i64..5),
            prop::option::of(duration()),
        )),
        prop::option::of("[a-z0-9-]{1,10}"),
    )
        .prop_map(|(matches, filters, backends, timeouts, retry, name)| {
            let backends: Vec<Value> = backends
                .into_iter()
                .map(|(mut b, filters)| {
                    b["filters"] = json!(filters);
                    b
                })
                .collect();
            let mut rule = json!({"matches": matches, "filters": filters, "backendRefs": backends});
            if let Some((request, backend)) = timeouts {
                rule["timeouts"] = json!({"request": request, "backendRequest": backend});
            }
            if let Some((codes, attempts, backoff)) = retry {
                rule["retry"] = json!({"codes": codes, "attempts": attempts, "backoff": backoff});
            }
            if let Some(name) = name {
                rule["name"] = json!(name);
            }
            rule
        })
}

fn grpc_rule() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(
            (
                any::<bool>(),
                prop::option::of(prop_oneof![text(), regex()]),
                prop::option::of(prop_oneof![text(), regex()]),
                prop::collection::vec((header_name(), text()), 0..2),
            ),
            0..3,
        ),
        prop::collection::vec(
            prop_oneof![
                header_modifier().prop_map(|m| json!({"type": "RequestHeaderModifier", "requestHeaderModifier": m})),
                header_modifier().prop_map(|m| json!({"type": "ResponseHeaderModifier", "responseHeaderModifier": m})),
                (backend_ref(), prop::option::of(0i64..101)).prop_map(|(b, percent)| {
                    json!({"type": "RequestMirror", "requestMirror": {"backendRef": b, "percent": percent}})
                }),
            ],
            0..2,
        ),
        prop::collection::vec(backend_ref(), 0..3),
    )
        .prop_map(|(matches, filters, backends)| {
            let matches: Vec<Value> = matches
                .into_iter()
                .map(|(regex, service, method, headers)| {
                    let kind = if regex { "RegularExpression" } else { "Exact" };
                    json!({
                        "method": {"type": kind, "service": service, "method": method},
                        "headers": headers.into_iter()
                            .map(|(n, v)| json!({"name": n, "value": v}))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({"matches": matches, "filters": filters, "backendRefs": backends})
        })
}

fn parent_refs() -> impl Strategy<Value = Value> {
    prop::collection::vec(
        prop_oneof![
            Just(json!({"name": "gw", "namespace": "infra"})),
            Just(json!({"name": "gw", "namespace": "infra", "sectionName": "https"})),
            Just(json!({"name": "edge", "namespace": "infra"})),
        ],
        1..3,
    )
    .prop_map(Value::Array)
}

fn route(kind: &'static str, rule: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
    (
        "[a-z]{1,6}",
        parent_refs(),
        prop::collection::vec(hostname(), 0..3),
        prop::collection::vec(rule, 1..4),
    )
        .prop_map(move |(name, parents, hostnames, rules)| {
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name, "namespace": "infra"},
                "spec": {"parentRefs": parents, "hostnames": hostnames, "rules": rules},
            })
        })
}

fn routes() -> impl Strategy<Value = Vec<Value>> {
    (
        prop::collection::vec(route("HTTPRoute", http_rule().boxed()), 1..4),
        prop::collection::vec(route("GRPCRoute", grpc_rule().boxed()), 0..3),
    )
        .prop_map(|(mut http, grpc)| {
            http.extend(grpc);
            http
        })
}

fn translated(routes: &[Value]) -> Result<Output, TestCaseError> {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, CLUSTER, "cluster").expect("the cluster parses");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": routes});
    // A value the Gateway API schema itself refuses never reaches the translation.
    if manifest::load_into(&mut snapshot, &list.to_string(), "routes").is_err() {
        return Err(TestCaseError::reject("outside the Gateway API schema"));
    }
    let options = Options {
        proxy_image: Some("proxy:test".to_owned()),
        ..Options::default()
    };
    Ok(translate(&snapshot, &options))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 160,
        max_global_rejects: 4096,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_document_the_translation_emits_compiles_in_the_proxy(routes in routes()) {
        let out = translated(&routes)?;
        prop_assert!(out.configs.len() >= 2, "the shared and the dedicated plane");
        // Each rule's owner is known, so a refusal by a proxy can be reported on its route.
        for (plane, doc) in &out.configs {
            let owners = &out.owners[plane];
            prop_assert_eq!(owners.len(), doc.rules.len());
            for (rule, owner) in doc.rules.iter().zip(owners) {
                let name = rule.name.as_deref().unwrap_or_default();
                match owner {
                    Some(route) => prop_assert!(name.starts_with(&format!("{}/", route.key)), "{name} from {route}"),
                    None => prop_assert!(name.contains("/listener:"), "{name} has no route"),
                }
            }
        }
        let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
        for (plane, doc) in &out.configs {
            if let Err(e) = cftunnel_proxy::config::compile(doc, &metrics, &mut Default::default()) {
                return Err(TestCaseError::fail(format!(
                    "the proxy refuses the document of plane {plane}: {e}\nroutes: {}",
                    serde_json::to_string_pretty(&routes).unwrap_or_default()
                )));
            }
        }
    }
}

/// The regression the invariant is named for, through the same path as the property.
#[test]
fn an_oversized_regex_leaves_the_shared_plane_updating() {
    let routes = vec![
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "greedy", "namespace": "infra"},
               "spec": {"parentRefs": [{"name": "gw"}], "rules": [
                   {"matches": [{"path": {"type": "RegularExpression", "value": "/\\w{500}"}}],
                    "backendRefs": [{"name": "web", "port": 8080}]}]}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "tenant", "namespace": "infra"},
               "spec": {"parentRefs": [{"name": "gw"}], "rules": [
                   {"matches": [{"path": {"value": "/shop"}}],
                    "backendRefs": [{"name": "web", "port": 8080}]}]}}),
    ];
    let out = translated(&routes).expect("valid routes");
    let greedy = &out.statuses.routes[&RouteKey {
        kind: RouteKind::Http,
        key: cftunnel_controller_core::translate::ObjectKey::new("infra", "greedy"),
    }][0];
    let accepted = greedy
        .condition(ConditionType::Accepted)
        .expect("Accepted is set");
    assert!(!accepted.status, "its only rule is refused");
    assert!(
        accepted
            .message
            .contains("spec.rules[0].matches[0].path: regular expression does not compile"),
        "{}",
        accepted.message
    );
    let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
    let shared = &out.configs[&cftunnel_controller_core::translate::PlaneKey::Shared];
    cftunnel_proxy::config::compile(shared, &metrics, &mut Default::default())
        .expect("the shared plane's document compiles");
    assert!(shared
        .rules
        .iter()
        .any(|r| r.name.as_deref() == Some("infra/tenant/0")));
}
