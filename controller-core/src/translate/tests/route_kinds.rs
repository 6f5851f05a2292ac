//! HTTPRoutes and GRPCRoutes whose rules would land in the same hosts of a route table: behind
//! the tunnel listeners of one scheme and hostname take the same requests, whatever their ports
//! and the Gateways on the tunnel they belong to, so the two kinds are kept apart across them
//! as on one listener.

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

/// The rule the proxy serving `plane` routes a gRPC call for `host` to, by name.
fn grpc_call(out: &Output, plane: &PlaneKey, host: &str) -> Option<String> {
    let routes = proxy_routes(&out.configs[plane]);
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
            "on listener alt its hostnames intersect those of HTTPRoute infra/site, which takes precedence (older, or first by namespace/name); HTTPRoutes and GRPCRoutes are not merged on a listener, nor on listeners of the same scheme and hostname on other ports or on other Gateways whose routes the tunnel serves (behind a tunnel they take the same requests)"
        )
    );
    assert_eq!(
        split_attached(&out),
        vec![("http".to_owned(), 1), ("alt".to_owned(), 0)]
    );
    assert_eq!(rules_under(&out, "api.example.com"), vec!["infra/site/0"]);
    assert!(!shared(&out).has_grpc_route);
    assert_eq!(
        grpc_call(&out, &PlaneKey::Shared, "api.example.com").as_deref(),
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
        grpc_call(&out, &PlaneKey::Shared, "api.example.com").as_deref(),
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
        grpc_call(&out, &PlaneKey::Shared, "api.example.com").as_deref(),
        Some("infra/site/0")
    );
    assert_eq!(
        grpc_call(&out, &PlaneKey::Shared, "rpc.example.com").as_deref(),
        Some("infra/api/0")
    );
}

/// Gateway `name` in `ns` with its own GatewayConfig on `tunnel`, created `at`, with an HTTP
/// listener `http` for `api.example.com`.
fn dedicated_api_gateway(ns: &str, name: &str, tunnel: &str, at: &str) -> String {
    let config = gateway_config_on(ns, name, tunnel, b"secret");
    format!(
        r#"{config}apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {ns}, creationTimestamp: "{at}"}}
spec:
  gatewayClassName: cf
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: {name}}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: api.example.com}}]
---
"#
    )
}

/// Routes of `team-a` may use the Services of `infra`.
const GRANT: &str = r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: from-team-a, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: team-a}, {group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: team-a}]
  to: [{group: "", kind: Service}]
---
"#;

/// HTTPRoute `ns/site` on Gateway `gateway` of its namespace, taking every path, created `at`.
fn site_on(ns: &str, gateway: &str, at: &str) -> String {
    created(
        http_route(
            ns,
            "site",
            &format!("  parentRefs: [{{name: {gateway}}}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /}}}}], backendRefs: [{{name: v2, namespace: infra, port: 8080}}]}}]"),
        ),
        ns,
        at,
    )
}

/// GRPCRoute `ns/api` on Gateway `gateway` of its namespace, without matches, created `at`.
fn api_on(ns: &str, gateway: &str, at: &str) -> String {
    created(
        grpc_route(
            ns,
            "api",
            &format!("  parentRefs: [{{name: {gateway}}}]\n  rules: [{{backendRefs: [{{name: v1, namespace: infra, port: 8081}}]}}]"),
        ),
        ns,
        at,
    )
}

fn attached_on(out: &Output, ns: &str, gateway: &str) -> i32 {
    listener_status(out, ns, gateway, "http").attached_routes
}

/// The older of HTTPRoute `site_key` and GRPCRoute `api_key`, on listeners for api.example.com
/// of two Gateways in one route table, keeps the host: the other is refused, and every plane
/// serving the table routes a gRPC call to the older one's rule.
fn assert_older_keeps_the_host(
    out: &Output,
    site_key: (&str, &str),
    api_key: (&str, &str),
    site_older: bool,
    planes: &[PlaneKey],
) {
    let (older, newer, newer_kind, older_kind) = if site_older {
        (site_key, api_key, RouteKind::Grpc, "HTTPRoute")
    } else {
        (api_key, site_key, RouteKind::Http, "GRPCRoute")
    };
    let older_kind_enum = if site_older {
        RouteKind::Http
    } else {
        RouteKind::Grpc
    };
    assert_eq!(
        accepted(out, older_kind_enum, older.0, older.1),
        (true, Reason::Accepted)
    );
    let refused = parent_statuses(out, newer_kind, newer.0, newer.1)[0]
        .condition(ConditionType::Accepted)
        .expect("Accepted condition present");
    assert_eq!(
        (refused.status, refused.reason),
        (false, Reason::HostnameConflict),
        "{}",
        refused.message
    );
    let holder = format!(
        "on listener http its hostnames intersect those of {older_kind} {}/{},",
        older.0, older.1
    );
    assert!(refused.message.starts_with(&holder), "{}", refused.message);
    let older_rule = format!("{}/{}/0", older.0, older.1);
    let newer_rule = format!("{}/{}/0", newer.0, newer.1);
    for plane in planes {
        let config = &out.configs[plane];
        assert!(
            config
                .rules
                .iter()
                .all(|r| r.name.as_deref() != Some(newer_rule.as_str())),
            "{plane}: {:?}",
            config.rules
        );
        assert_eq!(config.has_grpc_route, !site_older, "{plane}");
        assert_eq!(
            grpc_call(out, plane, "api.example.com").as_deref(),
            Some(older_rule.as_str()),
            "{plane}"
        );
    }
}

/// The documented migration path: a dedicated Gateway on the class tunnel shares the shared
/// plane's route table, so its GRPCRoute and a shared-plane Gateway's HTTPRoute for one
/// hostname would be merged in both planes.
#[test]
fn routes_of_both_kinds_of_a_shared_plane_gateway_and_a_dedicated_one_on_the_class_tunnel_are_not_merged(
) {
    let shared_gw = shared_gateway(
        "infra",
        "gs",
        "2026-01-01T00:00:00Z",
        "{name: http, port: 80, protocol: HTTP, hostname: api.example.com}",
    );
    let dedicated = dedicated_api_gateway("team-a", "gd", TUNNEL_A, "2026-01-01T00:00:00Z");
    let planes = [
        PlaneKey::Shared,
        PlaneKey::Dedicated(ObjectKey::new("team-a", "gd")),
    ];
    let options = class_tunnel(TUNNEL_A);

    // The older HTTPRoute keeps api.example.com.
    let out = translate(
        &snapshot(&format!(
            "{shared_gw}{dedicated}{GRANT}{}{}",
            site_on("infra", "gs", "2026-01-01T00:00:00Z"),
            api_on("team-a", "gd", "2026-01-02T00:00:00Z"),
        )),
        &options,
    );
    assert_older_keeps_the_host(&out, ("infra", "site"), ("team-a", "api"), true, &planes);
    assert_eq!(
        (
            attached_on(&out, "infra", "gs"),
            attached_on(&out, "team-a", "gd")
        ),
        (1, 0)
    );

    // The older GRPCRoute keeps it.
    let out = translate(
        &snapshot(&format!(
            "{shared_gw}{dedicated}{GRANT}{}{}",
            site_on("infra", "gs", "2026-01-02T00:00:00Z"),
            api_on("team-a", "gd", "2026-01-01T00:00:00Z"),
        )),
        &options,
    );
    assert_older_keeps_the_host(&out, ("infra", "site"), ("team-a", "api"), false, &planes);
    assert_eq!(
        (
            attached_on(&out, "infra", "gs"),
            attached_on(&out, "team-a", "gd")
        ),
        (0, 1)
    );

    // Without the class tunnel the shared plane is a route table of its own: both are served,
    // each by its own plane.
    let out = translate(
        &snapshot(&format!(
            "{shared_gw}{dedicated}{GRANT}{}{}",
            site_on("infra", "gs", "2026-01-01T00:00:00Z"),
            api_on("team-a", "gd", "2026-01-02T00:00:00Z"),
        )),
        &with_image(),
    );
    assert_eq!(
        accepted(&out, RouteKind::Http, "infra", "site"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "team-a", "api"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        grpc_call(&out, &planes[0], "api.example.com").as_deref(),
        Some("infra/site/0")
    );
    assert_eq!(
        grpc_call(&out, &planes[1], "api.example.com").as_deref(),
        Some("team-a/api/0")
    );
}

/// Two dedicated Gateways of one namespace on one tunnel (not flagged as sharing it) serve
/// each other's routes: the two kinds are kept apart across them.
#[test]
fn routes_of_both_kinds_of_two_dedicated_gateways_on_one_tunnel_are_not_merged() {
    let one = dedicated_api_gateway("team-a", "one", TUNNEL_B, "2026-01-01T00:00:00Z");
    let two = |tunnel| dedicated_api_gateway("team-a", "two", tunnel, "2026-01-01T00:00:00Z");
    let planes = [
        PlaneKey::Dedicated(ObjectKey::new("team-a", "one")),
        PlaneKey::Dedicated(ObjectKey::new("team-a", "two")),
    ];

    let out = translate(
        &snapshot(&format!(
            "{one}{}{GRANT}{}{}",
            two(TUNNEL_B),
            site_on("team-a", "one", "2026-01-01T00:00:00Z"),
            api_on("team-a", "two", "2026-01-02T00:00:00Z"),
        )),
        &with_image(),
    );
    assert_older_keeps_the_host(&out, ("team-a", "site"), ("team-a", "api"), true, &planes);
    assert_eq!(
        (
            attached_on(&out, "team-a", "one"),
            attached_on(&out, "team-a", "two")
        ),
        (1, 0)
    );

    let out = translate(
        &snapshot(&format!(
            "{one}{}{GRANT}{}{}",
            two(TUNNEL_B),
            site_on("team-a", "one", "2026-01-02T00:00:00Z"),
            api_on("team-a", "two", "2026-01-01T00:00:00Z"),
        )),
        &with_image(),
    );
    assert_older_keeps_the_host(&out, ("team-a", "site"), ("team-a", "api"), false, &planes);
    assert_eq!(
        (
            attached_on(&out, "team-a", "one"),
            attached_on(&out, "team-a", "two")
        ),
        (0, 1)
    );

    // On different tunnels they are different route tables: both are served, each by its own
    // Gateway's plane.
    let out = translate(
        &snapshot(&format!(
            "{one}{}{GRANT}{}{}",
            two(TUNNEL_A),
            site_on("team-a", "one", "2026-01-01T00:00:00Z"),
            api_on("team-a", "two", "2026-01-02T00:00:00Z"),
        )),
        &with_image(),
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "team-a", "api"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        grpc_call(&out, &planes[0], "api.example.com").as_deref(),
        Some("team-a/site/0")
    );
    assert_eq!(
        grpc_call(&out, &planes[1], "api.example.com").as_deref(),
        Some("team-a/api/0")
    );
}

/// Dedicated Gateways of different namespaces on one tunnel are flagged `TunnelShared`, and the
/// isolation guide promises their routes stay accepted: routes of the two kinds are not
/// compared across them (each plane serves the tunnel's routes together, as documented).
#[test]
fn routes_of_both_kinds_of_tenants_sharing_a_tunnel_stay_accepted() {
    let grant_b = GRANT.replace("team-a", "team-b");
    let out = translate(
        &snapshot(&format!(
            "{}{}{GRANT}{grant_b}{}{}",
            dedicated_api_gateway("team-a", "one", TUNNEL_B, "2026-01-01T00:00:00Z"),
            dedicated_api_gateway("team-b", "two", TUNNEL_B, "2026-01-01T00:00:00Z"),
            site_on("team-a", "one", "2026-01-01T00:00:00Z"),
            api_on("team-b", "two", "2026-01-02T00:00:00Z"),
        )),
        &with_image(),
    );
    for (kind, ns, name) in [
        (RouteKind::Http, "team-a", "site"),
        (RouteKind::Grpc, "team-b", "api"),
    ] {
        assert_eq!(
            accepted(&out, kind, ns, name),
            (true, Reason::Accepted),
            "{ns}/{name}"
        );
        let shared = parent_statuses(&out, kind, ns, name)
            .first()
            .and_then(|p| p.condition(ConditionType::TunnelShared))
            .map(|c| (c.status, c.reason));
        assert_eq!(shared, Some((true, Reason::TunnelShared)), "{ns}/{name}");
    }
    assert_eq!(
        (
            attached_on(&out, "team-a", "one"),
            attached_on(&out, "team-b", "two")
        ),
        (1, 1)
    );

    // Within one tenant's Gateways on that tunnel, the two kinds are kept apart all the same,
    // whatever the other tenant holds.
    let out = translate(
        &snapshot(&format!(
            "{}{}{}{GRANT}{grant_b}{}{}",
            dedicated_api_gateway("team-a", "one", TUNNEL_B, "2026-01-01T00:00:00Z"),
            dedicated_api_gateway("team-a", "two", TUNNEL_B, "2026-01-01T00:00:00Z"),
            dedicated_api_gateway("team-b", "three", TUNNEL_B, "2026-01-01T00:00:00Z"),
            site_on("team-a", "one", "2026-01-01T00:00:00Z"),
            api_on("team-a", "two", "2026-01-02T00:00:00Z"),
        )),
        &with_image(),
    );
    assert_eq!(
        accepted(&out, RouteKind::Http, "team-a", "site"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        accepted(&out, RouteKind::Grpc, "team-a", "api"),
        (false, Reason::HostnameConflict)
    );
}
