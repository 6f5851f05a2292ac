//! ListenerSets: which a Gateway admits (`allowedListeners`), routes attached through them,
//! their status and the Gateway's `attachedListenerSets`, and conflicts with the Gateway's
//! listeners and older ListenerSets. The cases follow Gateway API's ListenerSet conformance
//! tests (default not allowed, allowed namespaces, hostname and protocol conflicts, section
//! names of the Gateway that a ListenerSet's listener does not answer to).

use super::*;

/// Gateway `infra/hub` with one listener, admitting ListenerSets as `allowed` says (YAML flow
/// mapping of `allowedListeners`, or empty for none).
fn hub(allowed: &str) -> String {
    let allowed = if allowed.is_empty() {
        String::new()
    } else {
        format!("  allowedListeners: {allowed}\n")
    };
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: hub, namespace: infra}}
spec:
  gatewayClassName: cf
{allowed}  listeners:
  - {{name: main, port: 80, protocol: HTTP, hostname: main.example.com, allowedRoutes: {{namespaces: {{from: All}}}}}}
---
"#
    )
}

/// ListenerSet `ns/name` on Gateway `infra/hub` with `listeners` (YAML flow sequence items).
fn listener_set(ns: &str, name: &str, listeners: &[&str]) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRef: {{name: hub, namespace: infra}}
  listeners: [{}]
---
"#,
        listeners.join(", ")
    )
}

/// An HTTPRoute of `ns` on ListenerSet `set_ns/set` to Service infra/v2 (with a grant where
/// needed the test adds).
fn route_on_set(ns: &str, name: &str, set_ns: &str, set: &str, section: Option<&str>) -> String {
    let section = section
        .map(|s| format!(", sectionName: {s}"))
        .unwrap_or_default();
    http_route(
        ns,
        name,
        &format!(
            "  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: {set}, namespace: {set_ns}{section}}}]\n  rules: [{{backendRefs: [{{name: v2, namespace: infra, port: 8080}}]}}]"
        ),
    )
}

const GRANT_ALL: &str = r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: all, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}, {group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: web}]
  to: [{group: "", kind: Service}]
---
"#;

fn set_status<'a>(out: &'a Output, ns: &str, name: &str) -> &'a ListenerSetStatus {
    out.statuses
        .listener_sets
        .get(&ObjectKey::new(ns, name))
        .expect("the ListenerSet has a status")
}

fn set_condition(out: &Output, ns: &str, name: &str, kind: ConditionType) -> (bool, Reason) {
    let c = set_status(out, ns, name)
        .conditions
        .iter()
        .find(|c| c.kind == kind)
        .expect("condition present");
    (c.status, c.reason)
}

/// The (status, reason) of each condition of listener `listener` of ListenerSet `ns/name`.
fn entry(
    out: &Output,
    ns: &str,
    name: &str,
    listener: &str,
) -> BTreeMap<ConditionType, (bool, Reason)> {
    set_status(out, ns, name)
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .expect("listener present")
        .conditions
        .iter()
        .map(|c| (c.kind, (c.status, c.reason)))
        .collect()
}

fn hub_status(out: &Output) -> &GatewayStatus {
    &out.statuses.gateways[&ObjectKey::new("infra", "hub")]
}

/// Hostnames of the shared plane's route rules (listener isolation rules left out).
fn routed_hostnames(out: &Output) -> BTreeSet<String> {
    shared(out)
        .rules
        .iter()
        .filter(|r| r.unavailable_status.is_none())
        .flat_map(|r| r.hostnames.iter().cloned())
        .collect()
}

#[test]
fn a_gateway_admits_no_listener_set_by_default() {
    let out = run(&format!(
        "{}{}{}",
        hub(""),
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]
        ),
        route_on_set("infra", "app", "infra", "team", None),
    ));
    for kind in [ConditionType::Accepted, ConditionType::Programmed] {
        assert_eq!(
            set_condition(&out, "infra", "team", kind),
            (false, Reason::NotAllowed)
        );
    }
    assert!(set_status(&out, "infra", "team").listeners.is_empty());
    assert_eq!(hub_status(&out).attached_listener_sets, 0);
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    assert!(routed_hostnames(&out).is_empty());
}

#[test]
fn a_route_on_an_admitted_listener_set_serves_its_listeners_hostname() {
    let out = run(&format!(
        "{}{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]
        ),
        route_on_set("infra", "app", "infra", "team", Some("team")),
    ));
    assert_eq!(
        set_condition(&out, "infra", "team", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        set_condition(&out, "infra", "team", ConditionType::Programmed),
        (true, Reason::Programmed)
    );
    let team = entry(&out, "infra", "team", "team");
    assert_eq!(team[&ConditionType::Accepted], (true, Reason::Accepted));
    assert_eq!(
        team[&ConditionType::Conflicted],
        (false, Reason::NoConflicts)
    );
    assert_eq!(team[&ConditionType::Programmed], (true, Reason::Programmed));
    assert_eq!(
        set_status(&out, "infra", "team").listeners[0].attached_routes,
        1
    );
    assert_eq!(
        set_status(&out, "infra", "team").gateway,
        ObjectKey::new("infra", "hub")
    );

    // The Gateway counts the set, and lists only its own listeners.
    let gw = hub_status(&out);
    assert_eq!(gw.attached_listener_sets, 1);
    let names: Vec<&str> = gw.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["main"]);

    // The route is accepted on the ListenerSet and served on its listener's hostname.
    let parents = route_status(&out, "infra", "app");
    assert_eq!(parents[0].parent_ref.kind, ParentKind::ListenerSet);
    assert_eq!(parents[0].parent_ref.name, "team");
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        routed_hostnames(&out),
        BTreeSet::from(["team.example.com".to_owned()])
    );
    // The listener gets an isolation rule like the Gateway's own.
    assert!(shared(&out).rules.iter().any(|r| r.name.as_deref()
        == Some("infra/team/listenerset-listener:team")
        && r.hostnames == ["team.example.com"]));
    assert_eq!(
        out.statuses.parent_gateway(&parents[0].parent_ref),
        Some(ObjectKey::new("infra", "hub"))
    );
}

#[test]
fn allowed_listeners_admit_namespaces_as_from_says() {
    let set = |ns: &str| {
        listener_set(
            ns,
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"],
        )
    };
    let accepted = |allowed: &str, ns: &str| {
        let out = run(&format!("{}{}", hub(allowed), set(ns)));
        set_condition(&out, ns, "team", ConditionType::Accepted)
    };
    assert_eq!(
        accepted("{namespaces: {from: Same}}", "infra"),
        (true, Reason::Accepted)
    );
    assert_eq!(
        accepted("{namespaces: {from: Same}}", "apps"),
        (false, Reason::NotAllowed)
    );
    assert_eq!(
        accepted("{namespaces: {from: None}}", "infra"),
        (false, Reason::NotAllowed)
    );
    assert_eq!(
        accepted("{namespaces: {from: All}}", "apps"),
        (true, Reason::Accepted)
    );
    let selector = "{namespaces: {from: Selector, selector: {matchLabels: {role: backend}}}}";
    assert_eq!(accepted(selector, "apps"), (true, Reason::Accepted));
    assert_eq!(accepted(selector, "web"), (false, Reason::NotAllowed));
}

#[test]
fn a_listener_sets_allowed_routes_same_means_its_own_namespace() {
    let out = run(&format!(
        "{}{}{}{}{}",
        hub("{namespaces: {from: All}}"),
        listener_set("apps", "team", &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com, allowedRoutes: {namespaces: {from: Same}}}"]),
        route_on_set("apps", "mine", "apps", "team", None),
        route_on_set("infra", "theirs", "apps", "team", None),
        GRANT_ALL,
    ));
    assert_eq!(
        condition(&out, "apps", "mine", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        condition(&out, "infra", "theirs", ConditionType::Accepted),
        (false, Reason::NotAllowedByListeners)
    );
}

#[test]
fn a_gateway_parent_ref_does_not_reach_a_listener_sets_listeners() {
    let gateway_route = |name: &str, section: &str| {
        http_route(
            "infra",
            name,
            &format!("  parentRefs: [{{name: hub{section}}}]\n  rules: [{{backendRefs: [{{name: v2, port: 8080}}]}}]"),
        )
    };
    let out = run(&format!(
        "{}{}{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]
        ),
        gateway_route("by-section", ", sectionName: team"),
        gateway_route("whole", ""),
    ));
    assert_eq!(
        condition(&out, "infra", "by-section", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    assert_eq!(
        condition(&out, "infra", "whole", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        routed_hostnames(&out),
        BTreeSet::from(["main.example.com".to_owned()])
    );
    assert_eq!(
        set_status(&out, "infra", "team").listeners[0].attached_routes,
        0
    );
}

#[test]
fn the_gateways_listeners_win_conflicts_then_older_listener_sets() {
    let at = |manifest: String, time: &str| created(manifest, "infra", time);
    let out = run(&format!(
        "{}{}{}{}",
        hub("{namespaces: {from: Same}}").replace(
            "  listeners:\n",
            "  listeners:\n  - {name: conflict-gw, port: 80, protocol: HTTP, hostname: b.example.com}\n"
        ),
        at(listener_set("infra", "first", &[
            "{name: own, port: 80, protocol: HTTP, hostname: c.example.com}",
            "{name: conflict-gw, port: 80, protocol: HTTP, hostname: b.example.com}",
            "{name: conflict-set, port: 80, protocol: HTTP, hostname: d.example.com}",
        ]), "2024-01-01T00:00:00Z"),
        at(listener_set("infra", "second", &[
            "{name: conflict-gw, port: 80, protocol: HTTP, hostname: b.example.com}",
        ]), "2024-01-02T00:00:00Z"),
        at(listener_set("infra", "third", &[
            "{name: own, port: 80, protocol: HTTP, hostname: e.example.com}",
            "{name: conflict-set, port: 80, protocol: HTTP, hostname: d.example.com}",
        ]), "2024-01-03T00:00:00Z"),
    ));
    let conflicted = BTreeMap::from([
        (ConditionType::Accepted, (false, Reason::HostnameConflict)),
        (ConditionType::ResolvedRefs, (true, Reason::ResolvedRefs)),
        (ConditionType::Conflicted, (true, Reason::HostnameConflict)),
        (ConditionType::Programmed, (false, Reason::HostnameConflict)),
    ]);
    let fine = BTreeMap::from([
        (ConditionType::Accepted, (true, Reason::Accepted)),
        (ConditionType::ResolvedRefs, (true, Reason::ResolvedRefs)),
        (ConditionType::Conflicted, (false, Reason::NoConflicts)),
        (ConditionType::Programmed, (true, Reason::Programmed)),
    ]);
    // The Gateway's own listeners are untouched.
    for l in &hub_status(&out).listeners {
        let programmed = l
            .conditions
            .iter()
            .find(|c| c.kind == ConditionType::Programmed);
        assert!(programmed.is_some_and(|c| c.status), "{}", l.name);
    }
    assert_eq!(entry(&out, "infra", "first", "own"), fine);
    assert_eq!(entry(&out, "infra", "first", "conflict-gw"), conflicted);
    assert_eq!(entry(&out, "infra", "first", "conflict-set"), fine);
    assert!(set_condition(&out, "infra", "first", ConditionType::Accepted).0);
    assert_eq!(
        set_condition(&out, "infra", "first", ConditionType::Programmed),
        (true, Reason::Programmed)
    );
    assert_eq!(entry(&out, "infra", "second", "conflict-gw"), conflicted);
    for kind in [ConditionType::Accepted, ConditionType::Programmed] {
        assert_eq!(
            set_condition(&out, "infra", "second", kind),
            (false, Reason::ListenersNotValid)
        );
    }
    assert_eq!(entry(&out, "infra", "third", "own"), fine);
    assert_eq!(entry(&out, "infra", "third", "conflict-set"), conflicted);
    assert!(set_condition(&out, "infra", "third", ConditionType::Accepted).0);
    assert_eq!(hub_status(&out).attached_listener_sets, 2);
}

#[test]
fn a_listener_on_a_gateways_port_with_another_protocol_conflicts() {
    let out = run(&format!(
        "{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &[
                "{name: tls, port: 80, protocol: HTTPS, hostname: team.example.com}",
                "{name: web, port: 8080, protocol: HTTP, hostname: team.example.com}",
            ]
        ),
    ));
    let tls = entry(&out, "infra", "team", "tls");
    assert_eq!(
        tls[&ConditionType::Conflicted],
        (true, Reason::ProtocolConflict)
    );
    assert_eq!(
        tls[&ConditionType::Accepted],
        (false, Reason::ProtocolConflict)
    );
    let web = entry(&out, "infra", "team", "web");
    assert_eq!(web[&ConditionType::Programmed], (true, Reason::Programmed));
}

#[test]
fn a_listener_set_of_a_gateway_that_is_not_accepted_is_not_either() {
    let out = run(&format!(
        "{}{}",
        hub("{namespaces: {from: Same}}").replace(
            "  listeners:\n",
            "  infrastructure: {parametersRef: {group: example.com, kind: Other, name: x}}\n  listeners:\n"
        ),
        listener_set("infra", "team", &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]),
    ));
    assert_eq!(
        set_condition(&out, "infra", "team", ConditionType::Accepted),
        (false, Reason::ParentNotAccepted)
    );
}

#[test]
fn listener_sets_of_other_controllers_gateways_are_left_alone() {
    let out = run(&format!(
        "{}{}",
        hub("{namespaces: {from: Same}}")
            .replace("gatewayClassName: cf", "gatewayClassName: someone-else"),
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]
        ),
    ));
    assert!(out.statuses.listener_sets.is_empty());
}

/// A ListenerSet whose Gateway is gone while its status still says it is accepted is told that
/// it no longer is (nothing else would: no controller owns a Gateway that does not exist). One
/// whose Gateway is another controller's, or that nobody marked accepted, is left alone.
#[test]
fn a_listener_set_still_accepted_by_a_gateway_that_is_gone_is_told_so() {
    let accepted = |set: String| {
        set.replace(
            "---\n",
            "status:\n  conditions: [{type: Accepted, status: \"True\", reason: Accepted, message: \"\", lastTransitionTime: \"2026-01-01T00:00:00Z\"}]\n---\n",
        )
    };
    let team = || {
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"],
        )
    };

    let out = run(&accepted(team()));
    let status = set_status(&out, "infra", "team");
    assert!(status.listeners.is_empty());
    for kind in [ConditionType::Accepted, ConditionType::Programmed] {
        let c = status
            .conditions
            .iter()
            .find(|c| c.kind == kind)
            .expect("condition");
        assert_eq!(
            (c.status, c.reason),
            (false, Reason::ParentNotAccepted),
            "{kind:?}"
        );
        assert_eq!(c.message, "Gateway infra/hub does not exist");
    }

    let elsewhere = hub("{namespaces: {from: Same}}")
        .replace("gatewayClassName: cf", "gatewayClassName: someone-else");
    let out = run(&format!("{elsewhere}{}", accepted(team())));
    assert!(
        out.statuses.listener_sets.is_empty(),
        "another controller's Gateway"
    );

    let out = run(&team());
    assert!(
        out.statuses.listener_sets.is_empty(),
        "never marked accepted"
    );

    // A Gateway this build cannot read still exists: whoever wrote the status may be right.
    let mut cluster = snapshot(&accepted(team()));
    cluster
        .unreadable_gateways
        .push(crate::snapshot::UnreadableObject {
            namespace: "infra".into(),
            name: "hub".into(),
            error: "unknown variant".into(),
        });
    let out = translate(&cluster, &Options::default());
    assert!(
        out.statuses.listener_sets.is_empty(),
        "a Gateway that cannot be read"
    );
}

#[test]
fn an_experimental_xlistenerset_is_read_as_a_listener_set() {
    let out = run(&format!(
        "{}{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"]
        )
        .replace(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet",
            "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XListenerSet"
        ),
        route_on_set("infra", "app", "infra", "team", None),
    ));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        routed_hostnames(&out),
        BTreeSet::from(["team.example.com".to_owned()])
    );
}

#[test]
fn a_route_naming_an_xlistenerset_parent_the_experimental_way_attaches() {
    let set = listener_set(
        "infra",
        "team",
        &["{name: team, port: 80, protocol: HTTP, hostname: team.example.com}"],
    )
    .replace(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet",
        "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XListenerSet",
    );
    let route = route_on_set("infra", "app", "infra", "team", None).replace(
        "group: gateway.networking.k8s.io, kind: ListenerSet",
        "group: gateway.networking.x-k8s.io, kind: XListenerSet",
    );
    let out = run(&format!(
        "{}{set}{route}",
        hub("{namespaces: {from: Same}}")
    ));
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert_eq!(
        routed_hostnames(&out),
        BTreeSet::from(["team.example.com".to_owned()])
    );
    // The status entry names the parent as the route does.
    let parents = route_status(&out, "infra", "app");
    assert_eq!(parents[0].parent_ref.kind, ParentKind::XListenerSet);
    assert_eq!(
        parents[0].parent_ref.kind.group(),
        "gateway.networking.x-k8s.io"
    );
}

#[test]
fn a_dedicated_gateway_that_is_not_accepted_takes_no_route_through_a_listener_set() {
    let gateway = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tenant, namespace: infra}
spec:
  gatewayClassName: cf
  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: cfg}}
  allowedListeners: {namespaces: {from: Same}}
  listeners: [{name: tcp, port: 9000, protocol: TCP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: infra}
spec:
  parentRef: {name: tenant}
  listeners: [{name: team, port: 80, protocol: HTTP, hostname: team.example.com}]
---
"#;
    let route = http_route(
        "infra",
        "app",
        "  parentRefs: [{group: gateway.networking.k8s.io, kind: ListenerSet, name: team}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = translate(
        &snapshot(&format!("{}{gateway}{route}", gateway_config(""))),
        &with_image(),
    );
    let key = ObjectKey::new("infra", "tenant");
    let accepted = out.statuses.gateways[&key]
        .conditions
        .iter()
        .find(|c| c.kind == ConditionType::Accepted)
        .expect("Accepted");
    assert!(!accepted.status, "no valid listener of its own");
    assert_eq!(
        condition(&out, "infra", "app", ConditionType::Accepted),
        (false, Reason::NoMatchingParent)
    );
    let plane = PlaneKey::Dedicated(key);
    assert!(out.configs.get(&plane).is_none_or(|c| c
        .rules
        .iter()
        .all(|r| r.name.as_deref() != Some("infra/app/0"))));
}

#[test]
fn a_listener_set_cannot_take_a_hostname_of_the_gateway_on_another_port() {
    let gateway = hub("{namespaces: {from: All}}").replace(
        "allowedRoutes: {namespaces: {from: All}}",
        "allowedRoutes: {namespaces: {from: Same}}",
    );
    let out = run(&format!(
        "{gateway}{}{}{GRANT_ALL}",
        listener_set(
            "web",
            "team",
            &[
                "{name: alt, port: 8080, protocol: HTTP, hostname: main.example.com, allowedRoutes: {namespaces: {from: Same}}}",
                "{name: tls, port: 443, protocol: HTTPS, hostname: main.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}, allowedRoutes: {namespaces: {from: Same}}}",
            ]
        ),
        route_on_set("web", "steal", "web", "team", Some("alt")),
    ));
    assert_eq!(
        entry(&out, "web", "team", "alt")[&ConditionType::Conflicted],
        (true, Reason::HostnameConflict)
    );
    // Another scheme is another listener behind the tunnel.
    assert!(!entry(&out, "web", "team", "tls")[&ConditionType::Conflicted].0);
    assert!(!routed_hostnames(&out).contains("main.example.com"));
}

#[test]
fn a_listener_sets_certificate_in_another_namespace_needs_a_reference_grant() {
    let set = listener_set(
        "web",
        "team",
        &["{name: tls, port: 443, protocol: HTTPS, hostname: team.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert, namespace: infra}]}}"],
    );
    let out = run(&format!("{}{set}", hub("{namespaces: {from: All}}")));
    let tls = entry(&out, "web", "team", "tls");
    assert_eq!(
        tls[&ConditionType::ResolvedRefs],
        (false, Reason::RefNotPermitted)
    );
    assert!(!tls[&ConditionType::Programmed].0);

    // A grant from ListenerSets of the set's namespace permits it (the Secret is then looked
    // for, and is not there); one from Gateways does not.
    let grant = |kind: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{name: certs-{kind}, namespace: infra}}\nspec:\n  from: [{{group: gateway.networking.k8s.io, kind: {kind}, namespace: web}}]\n  to: [{{group: \"\", kind: Secret}}]\n---\n"
        )
    };
    for (from, reason) in [
        ("Gateway", Reason::RefNotPermitted),
        ("ListenerSet", Reason::InvalidCertificateRef),
    ] {
        let out = run(&format!(
            "{}{set}{}",
            hub("{namespaces: {from: All}}"),
            grant(from)
        ));
        assert_eq!(
            entry(&out, "web", "team", "tls")[&ConditionType::ResolvedRefs],
            (false, reason),
            "a grant from {from}"
        );
    }
}

/// A Gateway that is not accepted (its one listener names a certificate that does not exist)
/// serves nothing, so the listeners of its ListenerSets take no hostname from another Gateway
/// on the shared plane: the newer Gateway's listener for it is not conflicted.
#[test]
fn the_listener_sets_of_a_gateway_not_accepted_take_no_hostname() {
    let broken = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: hub, namespace: infra, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  allowedListeners: {namespaces: {from: Same}}
  listeners:
  - {name: main, port: 443, protocol: HTTPS, hostname: main.example.com, tls: {certificateRefs: [{name: not-issued-yet}]}}
---
"#;
    let late = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: late, namespace: infra, creationTimestamp: "2021-01-01T00:00:00Z"}
spec:
  gatewayClassName: cf
  listeners:
  - {name: b, port: 80, protocol: HTTP, hostname: b.example.com}
---
"#;
    let set = listener_set(
        "infra",
        "extra",
        &["{name: b, port: 80, protocol: HTTP, hostname: b.example.com}"],
    );
    let route = http_route(
        "infra",
        "on-late",
        "  parentRefs: [{name: late}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&[broken, late, set.as_str(), route.as_str()].concat());
    let b = listener_status(&out, "infra", "late", "b");
    assert_eq!(
        listener_condition(b, ConditionType::Conflicted),
        (false, Reason::NoConflicts)
    );
    assert_eq!(
        condition(&out, "infra", "on-late", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    assert!(route_rules(&out)
        .iter()
        .any(|r| r.name.as_deref() == Some("infra/on-late/0") && r.hostnames == ["b.example.com"]));
}

/// Likewise a Gateway whose own listeners all lose to an older Gateway's on the shared plane:
/// not accepted, its ListenerSets' listeners take no hostname from a newer Gateway.
#[test]
fn the_listener_sets_of_a_gateway_that_loses_its_own_listeners_take_no_hostname() {
    let gateway = |name: &str, at: &str, allowed: &str, listeners: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra, creationTimestamp: \"{at}\"}}\nspec:\n  gatewayClassName: cf\n{allowed}  listeners: [{listeners}]\n---\n"
        )
    };
    let oldest = gateway(
        "hub",
        "2020-01-01T00:00:00Z",
        "",
        "{name: http, port: 80, protocol: HTTP}",
    );
    let loser = gateway(
        "loser",
        "2020-06-01T00:00:00Z",
        "  allowedListeners: {namespaces: {from: Same}}\n",
        "{name: http, port: 80, protocol: HTTP}",
    );
    let newest = gateway(
        "late",
        "2021-01-01T00:00:00Z",
        "",
        "{name: shop, port: 80, protocol: HTTP, hostname: shop.example.com}",
    );
    let set = r#"apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: infra}
spec:
  parentRef: {name: loser, namespace: infra}
  listeners: [{name: shop, port: 80, protocol: HTTP, hostname: shop.example.com}]
---
"#;
    let route = http_route(
        "infra",
        "on-late",
        "  parentRefs: [{name: late}]\n  rules: [{backendRefs: [{name: v2, port: 8080}]}]",
    );
    let out = run(&[oldest, loser, newest, set.to_owned(), route].concat());
    let loser = &out.statuses.gateways[&ObjectKey::new("infra", "loser")];
    assert!(
        loser
            .conditions
            .iter()
            .any(|c| c.kind == ConditionType::Accepted && !c.status),
        "{:?}",
        loser.conditions
    );
    assert_eq!(
        listener_condition(
            listener_status(&out, "infra", "loser", "http"),
            ConditionType::Conflicted
        ),
        (true, Reason::HostnameConflict),
        "the loser's own listener keeps its conflict"
    );
    let shop = listener_status(&out, "infra", "late", "shop");
    assert_eq!(
        listener_condition(shop, ConditionType::Conflicted),
        (false, Reason::NoConflicts)
    );
    assert!(route_rules(&out).iter().any(
        |r| r.name.as_deref() == Some("infra/on-late/0") && r.hostnames == ["shop.example.com"]
    ));
}

/// A ListenerSet's listeners count, as a Gateway's do, only the routes whose Accepted
/// condition is True on the ListenerSet: one refused there (every rule dropped, the listener
/// held by an older route of the other kind, the Gateway not accepted) is left out, but by a
/// listener that is not valid, which counts the routes it would take, as Gateway API's
/// conformance asks. Each case has a route accepted on the listener beside the refused one,
/// where the listener can take one.
#[test]
fn a_listener_sets_listener_counts_only_the_routes_accepted_through_it() {
    let team = |listener: &str| listener_set("infra", "team", &[listener]);
    let http = "{name: team, port: 80, protocol: HTTP, hostname: team.example.com}";
    let on_set = |kind: RouteKind, name: &str, rules: &str, at: &str| {
        let body = format!(
            "  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: team}}]\n  rules: {rules}"
        );
        let manifest = match kind {
            RouteKind::Http => http_route("infra", name, &body),
            RouteKind::Grpc => grpc_route("infra", name, &body),
        };
        created(manifest, "infra", at)
    };
    let served = "[{backendRefs: [{name: v2, port: 8080}]}]";
    let (older, newer) = ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z");
    let admitting = hub("{namespaces: {from: Same}}");
    let not_accepted = admitting.replace(
        "  listeners:\n",
        "  infrastructure: {parametersRef: {group: example.com, kind: Other, name: x}}\n  listeners:\n",
    );
    // (case, manifests, refused route, its Accepted reason, attachedRoutes)
    let cases = [
        (
            "every rule dropped",
            format!(
                "{admitting}{}{}{}",
                team(http),
                on_set(RouteKind::Http, "kept", served, older),
                on_set(
                    RouteKind::Http,
                    "dropped",
                    "[{matches: [{path: {type: RegularExpression, value: \"(\"}}], backendRefs: [{name: v2, port: 8080}]}]",
                    older,
                ),
            ),
            (RouteKind::Http, "dropped"),
            Reason::UnsupportedValue,
            1,
        ),
        (
            "the listener held by an older route of the other kind",
            format!(
                "{admitting}{}{}{}",
                team(http),
                on_set(RouteKind::Http, "site", served, older),
                on_set(RouteKind::Grpc, "api", served, newer),
            ),
            (RouteKind::Grpc, "api"),
            Reason::HostnameConflict,
            1,
        ),
        (
            "the listener not valid",
            format!(
                "{admitting}{}{}",
                team("{name: team, port: 443, protocol: HTTPS, hostname: team.example.com, tls: {certificateRefs: [{name: does-not-exist}]}}"),
                on_set(RouteKind::Http, "refused", served, older),
            ),
            (RouteKind::Http, "refused"),
            Reason::NoMatchingParent,
            // Counted by a listener that is not valid, as Gateway API's conformance asks.
            1,
        ),
        (
            "the Gateway not accepted",
            format!(
                "{not_accepted}{}{}",
                team(http),
                on_set(RouteKind::Http, "refused", served, older),
            ),
            (RouteKind::Http, "refused"),
            Reason::NoMatchingParent,
            0,
        ),
    ];
    for (case, manifests, (kind, name), reason, count) in cases {
        let out = run(&manifests);
        assert_eq!(
            accepted(&out, kind, "infra", name),
            (false, reason),
            "{case}"
        );
        let counts: Vec<i32> = set_status(&out, "infra", "team")
            .listeners
            .iter()
            .map(|l| l.attached_routes)
            .collect();
        assert_eq!(counts, vec![count], "{case}");
    }
}

/// A dedicated Gateway whose own listeners all become invalid keeps its plane (its pods must be
/// told to stop serving), but is not accepted: the listeners of its ListenerSets serve nothing,
/// so they take no hostname from another Gateway on its tunnel. A shared-plane Gateway's
/// `*.example.com` route for `app.example.com` is served, and no isolation rule answers 404
/// for that host.
#[test]
fn the_listener_sets_of_a_dedicated_gateway_not_accepted_take_no_hostname_on_its_tunnel() {
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
    // Dedicated Gateway `team-d/d` on the class tunnel, admitting ListenerSets of its namespace.
    let dedicated = |own: &str| {
        tenant("team-d", "d", TUNNEL_A).replace(
            "  listeners: [{name: http, port: 80, protocol: HTTP, hostname: d.example.com}]",
            &format!("  allowedListeners: {{namespaces: {{from: Same}}}}\n  listeners: [{own}]"),
        )
    };
    let healthy = dedicated("{name: https, port: 443, protocol: HTTPS, hostname: d.example.com}");
    // Its one listener's certificate Secret is gone.
    let broken = dedicated(
        "{name: https, port: 443, protocol: HTTPS, hostname: d.example.com, tls: {certificateRefs: [{name: gone}]}}",
    );
    assert_ne!(healthy, broken);
    let set = r#"apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: team-d}
spec:
  parentRef: {name: d}
  listeners: [{name: app, port: 443, protocol: HTTPS, hostname: app.example.com}]
---
"#;
    let d = ObjectKey::new("team-d", "d");
    let d_plane = PlaneKey::Dedicated(d.clone());
    let options = class_tunnel(TUNNEL_A);
    let grab_hostnames = |out: &Output, plane: &PlaneKey| -> Vec<String> {
        out.configs[plane]
            .rules
            .iter()
            .filter(|r| r.name.as_deref() == Some("web/grab/0"))
            .flat_map(|r| r.hostnames.clone())
            .collect()
    };
    let isolates_app = |out: &Output, plane: &PlaneKey| {
        out.configs[plane].rules.iter().any(|r| {
            r.unavailable_status == Some(gateway::NO_ROUTE_STATUS)
                && r.hostnames.iter().any(|h| h == "app.example.com")
        })
    };

    // While the Gateway is accepted, its ListenerSet's listener holds app.example.com on every
    // plane of the tunnel.
    let out = translate(&snapshot(&format!("{wild}{grab}{healthy}{set}")), &options);
    assert_eq!(
        set_condition(&out, "team-d", "team", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    for plane in [&PlaneKey::Shared, &d_plane] {
        assert_eq!(
            grab_hostnames(&out, plane),
            ["other.example.com"],
            "{plane}"
        );
        assert!(isolates_app(&out, plane), "{plane}");
    }

    let out = translate(&snapshot(&format!("{wild}{grab}{broken}{set}")), &options);
    assert_eq!(
        kinds_and_reasons(&out.statuses.gateways[&d].conditions),
        vec![
            (ConditionType::Accepted, false, Reason::ListenersNotValid),
            (ConditionType::Programmed, false, Reason::Invalid),
        ]
    );
    assert_eq!(out.planes.get(&d), Some(&d_plane), "the plane stays");
    assert_eq!(
        set_condition(&out, "team-d", "team", ConditionType::Accepted),
        (false, Reason::ParentNotAccepted)
    );
    assert_eq!(
        condition(&out, "web", "grab", ConditionType::Accepted),
        (true, Reason::Accepted)
    );
    for plane in [&PlaneKey::Shared, &d_plane] {
        assert_eq!(
            grab_hostnames(&out, plane),
            ["app.example.com", "other.example.com"],
            "{plane}"
        );
        assert!(!isolates_app(&out, plane), "{plane}");
        let routes = proxy_routes(&out.configs[plane]);
        assert_eq!(
            picked(&routes, "https", "app.example.com", "/login").as_deref(),
            Some("web/grab/0"),
            "{plane}"
        );
    }
}

/// Across ports, only listeners that serve conflict: a Gateway listener of a protocol the data
/// plane does not serve (TLS, TCP), which takes no request, leaves a ListenerSet's HTTP
/// listener for the same hostname (or, without one, for any host) unconflicted, and a
/// ListenerSet listener that serves nothing is told why, not that it conflicts. A Gateway
/// listener that serves the same scheme and hostname on another port still conflicts.
#[test]
fn across_ports_only_listeners_that_serve_conflict_with_a_listener_sets() {
    let fine = BTreeMap::from([
        (ConditionType::Accepted, (true, Reason::Accepted)),
        (ConditionType::ResolvedRefs, (true, Reason::ResolvedRefs)),
        (ConditionType::Conflicted, (false, Reason::NoConflicts)),
        (ConditionType::Programmed, (true, Reason::Programmed)),
    ]);
    // Older than the base Gateway `infra/gw`, so the shared plane's HTTP listener for any host
    // is the hub's.
    let with_own = |listener: &str| {
        let gateway = hub("{namespaces: {from: Same}}")
            .replace("  listeners:\n", &format!("  listeners:\n  - {listener}\n"));
        created(gateway, "infra", "2020-01-01T00:00:00Z")
    };
    // (case, Gateway, the ListenerSet's listener `web`, the host a route on it is served at)
    let cases = [
        (
            "a TLS listener for the hostname",
            with_own("{name: tls, port: 443, protocol: TLS, hostname: app.example.com}"),
            "{name: web, port: 80, protocol: HTTP, hostname: app.example.com}",
            "app.example.com",
        ),
        (
            "a TCP listener without hostname",
            with_own("{name: tcp, port: 9000, protocol: TCP}"),
            "{name: web, port: 8080, protocol: HTTP}",
            "*",
        ),
    ];
    for (case, gateway, web, host) in cases {
        let out = run(&format!(
            "{gateway}{}{}",
            listener_set("infra", "team", &[web]),
            route_on_set("infra", "app", "infra", "team", Some("web")),
        ));
        assert_eq!(entry(&out, "infra", "team", "web"), fine, "{case}");
        assert_eq!(
            set_condition(&out, "infra", "team", ConditionType::Accepted),
            (true, Reason::Accepted),
            "{case}"
        );
        assert_eq!(
            condition(&out, "infra", "app", ConditionType::Accepted),
            (true, Reason::Accepted),
            "{case}"
        );
        let served: BTreeSet<String> = shared(&out)
            .rules
            .iter()
            .filter(|r| r.name.as_deref() == Some("infra/app/0"))
            .flat_map(|r| r.hostnames.clone())
            .collect();
        let expected = match host {
            "*" => BTreeSet::new(),
            host => BTreeSet::from([host.to_owned()]),
        };
        assert_eq!(served, expected, "{case}");
        assert!(
            shared(&out)
                .rules
                .iter()
                .any(|r| r.name.as_deref() == Some("infra/app/0")),
            "{case}: the route is served"
        );
    }

    // A Gateway listener of a protocol served keeps its hostname on other ports whatever its
    // state: here two of them on one port conflict with each other and serve nothing until
    // that is mended, when the set's listener would lose the hostname under its routes.
    let gateway = with_own(
        "{name: a, port: 81, protocol: HTTP, hostname: app.example.com}\n  - {name: b, port: 81, protocol: HTTP, hostname: app.example.com}",
    );
    let out = run(&format!(
        "{gateway}{}",
        listener_set(
            "infra",
            "team",
            &["{name: web, port: 8080, protocol: HTTP, hostname: app.example.com}"]
        ),
    ));
    let web = entry(&out, "infra", "team", "web");
    assert_eq!(
        web[&ConditionType::Conflicted],
        (true, Reason::HostnameConflict),
        "{web:?}"
    );

    // A ListenerSet listener of a protocol not served keeps its own reason.
    let out = run(&format!(
        "{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &["{name: tls, port: 8443, protocol: TLS, hostname: main.example.com}"]
        ),
    ));
    let tls = entry(&out, "infra", "team", "tls");
    assert_eq!(
        tls[&ConditionType::Accepted],
        (false, Reason::UnsupportedProtocol)
    );
    assert_eq!(
        tls[&ConditionType::Conflicted],
        (false, Reason::NoConflicts)
    );

    // The Gateway's HTTP listener for main.example.com serves it on port 80.
    let out = run(&format!(
        "{}{}",
        hub("{namespaces: {from: Same}}"),
        listener_set(
            "infra",
            "team",
            &["{name: alt, port: 8080, protocol: HTTP, hostname: main.example.com}"]
        ),
    ));
    let alt = set_status(&out, "infra", "team")
        .listeners
        .iter()
        .find(|l| l.name == "alt")
        .and_then(|l| {
            l.conditions
                .iter()
                .find(|c| c.kind == ConditionType::Conflicted)
        })
        .expect("Conflicted");
    assert_eq!(
        described(alt),
        (
            ConditionType::Conflicted,
            true,
            Reason::HostnameConflict,
            "listener main of the Gateway serves http://main.example.com on port 80; ports do not tell listeners apart behind a tunnel"
        )
    );
}
