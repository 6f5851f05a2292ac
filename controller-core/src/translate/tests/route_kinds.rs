//! HTTPRoutes and GRPCRoutes whose rules would land in the same hosts of a route table: behind
//! the tunnel listeners of one scheme and hostname on different ports take the same requests,
//! so the two kinds are kept apart across them as on one listener.

use super::*;

/// Gateway `split` in `infra` with two HTTP listeners on different ports, `http` for
/// `api.example.com` and `alt` for `alt_hostname`.
fn split_gateway(alt_hostname: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: split, namespace: infra}}\nspec:\n  gatewayClassName: cf\n  listeners:\n  - {{name: http, port: 80, protocol: HTTP, hostname: api.example.com}}\n  - {{name: alt, port: 8080, protocol: HTTP, hostname: \"{alt_hostname}\"}}\n---\n"
    )
}

/// HTTPRoute `site` on listener `http`, taking every path, created `at`.
fn site(at: &str) -> String {
    created(
        http_route(
            "infra",
            "site",
            "  parentRefs: [{name: split, sectionName: http}]\n  rules: [{matches: [{path: {type: PathPrefix, value: /}}], backendRefs: [{name: v2, port: 8080}]}]",
        ),
        "infra",
        at,
    )
}

/// GRPCRoute `api` on listener `alt`, without matches (every gRPC call), created `at`.
fn api(at: &str) -> String {
    created(
        grpc_route(
            "infra",
            "api",
            "  parentRefs: [{name: split, sectionName: alt}]\n  rules: [{backendRefs: [{name: v1, port: 8081}]}]",
        ),
        "infra",
        at,
    )
}

/// The rule the proxy routes a gRPC call for `host` to, by name.
fn grpc_call(out: &Output, host: &str) -> Option<String> {
    let routes = proxy_routes(shared(out));
    proxy_pick(
        &routes,
        "POST",
        host,
        "/api.Svc/Get",
        &[("content-type", "application/grpc")],
    )
    .and_then(|rule| rule.name.as_deref().map(str::to_owned))
}

/// The names of the route rules of the shared plane under `host`.
fn rules_under(out: &Output, host: &str) -> Vec<String> {
    route_rules(out)
        .into_iter()
        .filter(|r| r.hostnames.iter().any(|h| h == host))
        .filter_map(|r| r.name.clone())
        .collect()
}

fn split_attached(out: &Output) -> Vec<(String, i32)> {
    out.statuses.gateways[&ObjectKey::new("infra", "split")]
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.attached_routes))
        .collect()
}

#[test]
fn routes_of_both_kinds_on_listeners_of_one_hostname_on_different_ports_are_not_merged() {
    // The older HTTPRoute keeps api.example.com; the GRPCRoute on the other port is refused.
    let out = run(&format!(
        "{}{}{}",
        split_gateway("api.example.com"),
        site("2026-01-01T00:00:00Z"),
        api("2026-01-02T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "infra", "site"),
        (true, Reason::Accepted)
    );
    let refused = parent_statuses(&out, RouteKind::Grpc, "infra", "api")[0]
        .condition(ConditionType::Accepted)
        .expect("Accepted condition present");
    assert_eq!(
        (refused.status, refused.reason, refused.message.as_str()),
        (
            false,
            Reason::HostnameConflict,
            "on listener alt its hostnames intersect those of HTTPRoute infra/site, which takes precedence (older, or first by namespace/name); HTTPRoutes and GRPCRoutes are not merged on a listener, nor on listeners of the same scheme and hostname (ports do not tell them apart behind a tunnel)"
        )
    );
    assert_eq!(
        split_attached(&out),
        vec![("http".to_owned(), 1), ("alt".to_owned(), 0)]
    );
    assert_eq!(rules_under(&out, "api.example.com"), vec!["infra/site/0"]);
    assert!(!shared(&out).has_grpc_route);
    assert_eq!(
        grpc_call(&out, "api.example.com").as_deref(),
        Some("infra/site/0")
    );

    // The older GRPCRoute keeps it: the HTTPRoute is refused, and gRPC calls reach the
    // GRPCRoute's backend.
    let out = run(&format!(
        "{}{}{}",
        split_gateway("api.example.com"),
        site("2026-01-02T00:00:00Z"),
        api("2026-01-01T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "infra", "api"),
        (true, Reason::Accepted)
    );
    let message = &parent_statuses(&out, RouteKind::Http, "infra", "site")[0].conditions[0];
    assert_eq!(
        (message.status, message.reason),
        (false, Reason::HostnameConflict)
    );
    assert!(
        message
            .message
            .starts_with("on listener http its hostnames intersect those of GRPCRoute infra/api,"),
        "{}",
        message.message
    );
    assert_eq!(
        split_attached(&out),
        vec![("http".to_owned(), 0), ("alt".to_owned(), 1)]
    );
    assert_eq!(rules_under(&out, "api.example.com"), vec!["infra/api/0"]);
    assert_eq!(
        grpc_call(&out, "api.example.com").as_deref(),
        Some("infra/api/0")
    );
}

#[test]
fn routes_of_both_kinds_on_listeners_of_different_hostnames_on_different_ports_are_both_accepted() {
    // A wildcard listener shares no hosts with the exact one: api.example.com is the exact
    // listener's (listener isolation), the rest of example.com the wildcard's.
    let out = run(&format!(
        "{}{}{}",
        split_gateway("*.example.com"),
        site("2026-01-01T00:00:00Z"),
        api("2026-01-02T00:00:00Z"),
    ));
    assert_eq!(
        accepted(&out, RouteKind::Http, "infra", "site"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "infra", "api"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        split_attached(&out),
        vec![("http".to_owned(), 1), ("alt".to_owned(), 1)]
    );
    assert_eq!(rules_under(&out, "api.example.com"), vec!["infra/site/0"]);
    assert_eq!(rules_under(&out, "*.example.com"), vec!["infra/api/0"]);
    assert_eq!(
        grpc_call(&out, "api.example.com").as_deref(),
        Some("infra/site/0")
    );
    assert_eq!(
        grpc_call(&out, "rpc.example.com").as_deref(),
        Some("infra/api/0")
    );
}
