//! Cloudflare Access requirements: a GatewayConfig's `access` for every rule of its Gateway's
//! routes, an `AccessPolicy` an ExtensionRef filter names for one rule (it replaces the
//! Gateway's), and what a reference that cannot be used does (the rule fails closed).

use super::*;

const POLICY: &str = r#"apiVersion: cf.k8s.lex.la/v1alpha1
kind: AccessPolicy
metadata: {name: staff, namespace: infra}
spec: {teamName: Acme, audiences: [aud-staff]}
---
"#;

fn access(team: &str, audiences: &[&str]) -> Option<cftunnel_config::Access> {
    Some(cftunnel_config::Access {
        team_name: team.to_owned(),
        audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
    })
}

/// The rules of the `tenant` plane by name, with their requirement.
fn tenant_access(out: &Output) -> Vec<(String, Option<cftunnel_config::Access>)> {
    out.configs[&PlaneKey::Dedicated(ObjectKey::new("infra", "tenant"))]
        .rules
        .iter()
        .filter(|r| !r.name.as_deref().unwrap_or_default().contains("/listener:"))
        .map(|r| (r.name.clone().unwrap_or_default(), r.access.clone()))
        .collect()
}

#[test]
fn a_gateway_configs_access_covers_its_routes_and_a_rules_policy_replaces_it() {
    let route = http_route(
        "infra",
        "app",
        r#"  parentRefs: [{name: tenant}]
  rules:
  - name: public
    backendRefs: [{name: v2, port: 8080}]
  - name: staff
    matches: [{path: {value: /staff}}]
    filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]
    backendRefs: [{name: v2, port: 8080}]"#,
    );
    let out = translate(
        &snapshot(&format!(
            "{}{TENANT}---\n{POLICY}{route}",
            gateway_config(", access: {teamName: acme, audiences: [aud-all]}")
        )),
        &with_image(),
    );
    assert_eq!(
        tenant_access(&out),
        vec![
            ("infra/app/public".to_owned(), access("acme", &["aud-all"])),
            ("infra/app/staff".to_owned(), access("Acme", &["aud-staff"])),
        ]
    );
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::ResolvedRefs),
        (true, Reason::ResolvedRefs)
    );
    // The shared plane's Gateway has no GatewayConfig: its routes carry only their own.
    let shared_route = http_route(
        "infra",
        "open",
        r#"  parentRefs: [{name: gw}]
  rules:
  - backendRefs: [{name: v1, port: 8080}]
  - matches: [{path: {value: /staff}}]
    filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]
    backendRefs: [{name: v1, port: 8080}]"#,
    );
    let out = run(&format!("{POLICY}{shared_route}"));
    let requirements: Vec<_> = route_rules(&out).iter().map(|r| r.access.clone()).collect();
    assert!(requirements.contains(&None));
    assert!(requirements.contains(&access("Acme", &["aud-staff"])));
}

#[test]
fn grpc_route_rules_take_access_policies_too() {
    let route = grpc_route(
        "infra",
        "rpc",
        r#"  parentRefs: [{name: gw}]
  rules:
  - filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]
    backendRefs: [{name: v1, port: 8081}]"#,
    );
    let out = run(&format!("{POLICY}{route}"));
    let rule = only_rule(&out);
    assert_eq!(rule.access, access("Acme", &["aud-staff"]));
    assert_eq!(rule.unavailable_status, None);
}

#[test]
fn an_extension_ref_that_cannot_be_used_fails_its_rule_closed_and_says_why() {
    let filter = |r: &str| {
        http_route(
            "infra",
            "r",
            &format!(
                "  parentRefs: [{{name: gw}}]\n  rules: [{{filters: [{{type: ExtensionRef, extensionRef: {r}}}], backendRefs: [{{name: v1, port: 8080}}]}}]"
            ),
        )
    };
    let invalid_policy = POLICY
        .replace("name: staff", "name: bad")
        .replace("teamName: Acme", "teamName: acme.example");
    let cases = [
        (
            filter("{group: example.com, kind: Thing, name: x}"),
            Reason::InvalidKind,
            "filter ExtensionRef is not supported",
        ),
        (
            filter("{group: cf.k8s.lex.la, kind: AccessPolicy, name: missing}"),
            Reason::BackendNotFound,
            "AccessPolicy infra/missing not found",
        ),
        (
            format!(
                "{invalid_policy}{}",
                filter("{group: cf.k8s.lex.la, kind: AccessPolicy, name: bad}")
            ),
            Reason::BackendNotFound,
            "AccessPolicy infra/bad: spec.teamName:",
        ),
        (
            // A policy of another namespace is not the route's to name.
            format!(
                "{}{}",
                POLICY.replace("namespace: infra", "namespace: web"),
                filter("{group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}")
            ),
            Reason::BackendNotFound,
            "AccessPolicy infra/staff not found",
        ),
    ];
    for (manifests, reason, message) in cases {
        let out = run(&manifests);
        let parents = route_status(&out, "infra", "r");
        let resolved = parents[0]
            .condition(ConditionType::ResolvedRefs)
            .expect("ResolvedRefs");
        assert_eq!(
            (resolved.status, resolved.reason),
            (false, reason),
            "{message}"
        );
        assert!(resolved.message.contains(message), "{}", resolved.message);
        // Gateway API: an unresolvable filter is not skipped; its requests get 500.
        let rule = only_rule(&out);
        assert_eq!(rule.unavailable_status, Some(500), "{message}");
        assert_eq!(
            condition(&out, "infra", "r", ConditionType::Accepted),
            (true, Reason::Accepted)
        );
    }
}

/// A rule with an Access requirement that cannot be translated (here a regular expression the
/// proxy cannot compile) takes the route's other rules with it: its requests would otherwise
/// fall through to the catch-all and reach the backend unchecked.
#[test]
fn a_rule_with_an_access_policy_that_cannot_be_served_takes_its_route_out_whole() {
    let route = http_route(
        "infra",
        "r",
        r#"  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {value: /admin}}, {path: {type: RegularExpression, value: "/internal/(?!health).*"}}]
    filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]
    backendRefs: [{name: v1, port: 8080}]
  - backendRefs: [{name: v1, port: 8080}]"#,
    );
    let out = run(&format!("{POLICY}{route}"));
    assert!(route_rules(&out).is_empty(), "{:?}", route_rules(&out));
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::Accepted),
        (false, Reason::UnsupportedValue)
    );
    // Without the requirement, the broken rule alone is left out.
    let open = route.replace(
        "    filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]\n",
        "",
    );
    assert_ne!(open, route);
    let out = run(&format!("{POLICY}{open}"));
    assert_eq!(route_rules(&out).len(), 1);
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
}

#[test]
fn an_access_policy_in_a_backend_refs_filters_fails_that_backend_closed() {
    let route = http_route(
        "infra",
        "r",
        r#"  parentRefs: [{name: gw}]
  rules:
  - backendRefs:
    - name: v1
      port: 8080
      filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]"#,
    );
    let out = run(&format!("{POLICY}{route}"));
    let rule = only_rule(&out);
    assert_eq!(rule.access, None);
    assert!(rule
        .backends
        .iter()
        .all(|b| b.unavailable_status == Some(500)));
    assert_eq!(
        condition(&out, "infra", "r", ConditionType::ResolvedRefs),
        (false, Reason::BackendNotFound)
    );
}

#[test]
fn an_invalid_gateway_config_access_refuses_the_gateway() {
    let out = translate(
        &snapshot(&format!(
            "{}{TENANT}",
            gateway_config(", access: {teamName: acme, audiences: []}")
        )),
        &with_image(),
    );
    let gateway = &out.statuses.gateways[&ObjectKey::new("infra", "tenant")];
    let accepted = &gateway.conditions[0];
    assert_eq!(accepted.reason, Reason::InvalidParameters);
    assert!(
        accepted
            .message
            .starts_with("spec.access.audiences of GatewayConfig infra/cfg:"),
        "{}",
        accepted.message
    );
}

#[test]
fn the_document_the_controller_emits_is_one_the_proxy_compiles_with_the_check() {
    let route = http_route(
        "infra",
        "r",
        r#"  parentRefs: [{name: gw}]
  rules:
  - filters: [{type: ExtensionRef, extensionRef: {group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}]
    backendRefs: [{name: v1, port: 8080}]"#,
    );
    let out = run(&format!("{POLICY}{route}"));
    let routes = proxy_routes(shared(&out));
    let rule = proxy_pick(&routes, "GET", "any.example.com", "/", &[]).expect("a rule");
    assert_eq!(rule.access.as_ref().map(|a| a.team()), Some("acme"));
}
