//! Hostname ownership in the chart: the controller is started with the rule on, and the
//! ValidatingAdmissionPolicy's CEL is the controller's own rule, character for character and
//! in effect: evaluated (by a CEL interpreter) on routes and namespaces, it admits exactly the
//! hostnames the controller's code permits, and only on routes with a parent the controller
//! lists as its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use cftunnel_controller::manifest;
use cftunnel_controller::runtime::ownership_parents::{self, ADMISSION_PARENTS_EXPRESSION};
use cftunnel_controller::translate::ownership::{permitted, ADMISSION_EXPRESSION};
use cftunnel_controller::translate::{self, Snapshot};
use serde_json::json;

use super::{
    cluster_name, controller_name, controller_run, options, render, tools, NAMESPACE, RELEASE,
};

const FILE: &str = "hostname-ownership-values.yaml";

#[test]
fn the_controller_enforces_ownership_and_admission_enforces_the_same_rule() {
    let Some(tools) =
        tools("the_controller_enforces_ownership_and_admission_enforces_the_same_rule")
    else {
        return;
    };
    let rendered = render(tools, FILE, "");
    let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
    assert!(options(&run).translate.hostname_ownership);

    let name = cluster_name(RELEASE, NAMESPACE, "hostname-ownership");
    let policy = rendered.raw("ValidatingAdmissionPolicy", &name);
    assert_eq!(
        policy["apiVersion"].as_str(),
        Some("admissionregistration.k8s.io/v1")
    );
    let validation = &policy["spec"]["validations"][0];
    let expression = validation["expression"].as_str().unwrap_or_default();
    assert_eq!(
        expression,
        format!("!({ADMISSION_PARENTS_EXPRESSION}) || ({ADMISSION_EXPRESSION})")
    );
    let binding = rendered.raw("ValidatingAdmissionPolicyBinding", &name);
    assert_eq!(binding["spec"]["policyName"].as_str(), Some(name.as_str()));
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
            ["cf.k8s.lex.la/tenant"]
            .as_str(),
        Some("true")
    );

    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension");
    let env = Arc::new(env);
    let program = env.compile(expression).expect("the expression compiles");
    // A route of the controller's Gateway, which it lists in the policy's parameter.
    let params = json!({ "data": { "parents": "Gateway/infra/edge\n" } });
    let admits = |hostnames: Option<&[&str]>, labels: &BTreeMap<String, String>| {
        let mut context = cel::Context::with_env(Arc::clone(&env));
        let mut spec =
            json!({ "parentRefs": [{"name": "edge", "namespace": "infra"}], "rules": [] });
        if let Some(h) = hostnames {
            spec["hostnames"] = json!(h);
        }
        context
            .add_variable("object", json!({ "spec": spec }))
            .expect("object");
        context
            .add_variable("request", json!({ "namespace": "team-a" }))
            .expect("request");
        context
            .add_variable("params", params.clone())
            .expect("params");
        context
            .add_variable(
                "namespaceObject",
                json!({"metadata": {"name": "team-a", "labels": labels}}),
            )
            .expect("namespaceObject");
        match program.execute(&context) {
            Ok(value) => value == cel::Value::Bool(true),
            Err(e) => panic!("{hostnames:?} with {labels:?}: {e}"),
        }
    };
    let namespaces: Vec<BTreeMap<String, String>> = vec![
        BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            "team-a".to_owned(),
        )]),
        BTreeMap::from([
            (
                "hostnames.cf.k8s.lex.la/example.com".to_owned(),
                "true".to_owned(),
            ),
            (
                "hostnames.cf.k8s.lex.la/shop.example.org".to_owned(),
                "false".to_owned(),
            ),
        ]),
        BTreeMap::from([
            (
                "hostnames.cf.k8s.lex.la/a.example.net".to_owned(),
                "true".to_owned(),
            ),
            (
                "hostnames.cf.k8s.lex.la/b.example.net".to_owned(),
                "true".to_owned(),
            ),
        ]),
    ];
    let hosts = [
        "example.com",
        "www.example.com",
        "*.example.com",
        "*.api.example.com",
        "badexample.com",
        "example.com.evil.net",
        "com",
        "*.com",
        "shop.example.org",
        "x.a.example.net",
        "b.example.net",
        "c.example.net",
        "*.example.net",
    ];
    let mut refused = 0;
    for labels in &namespaces {
        assert!(
            admits(None, labels),
            "a route without hostnames is admitted"
        );
        for host in hosts {
            let expected = permitted(host, Some(labels));
            assert_eq!(
                admits(Some(&[host]), labels),
                expected,
                "{host} with {labels:?}"
            );
            refused += usize::from(!expected);
        }
        // A route is admitted only when every hostname is.
        for pair in hosts.windows(2) {
            let expected = pair.iter().all(|h| permitted(h, Some(labels)));
            assert_eq!(
                admits(Some(pair), labels),
                expected,
                "{pair:?} with {labels:?}"
            );
        }
    }
    assert!(refused > 0 && refused < namespaces.len() * hosts.len());

    // Updates are judged only when they set the hostnames or the parents: a route stored before
    // the rule refused its hostnames can still be relabelled and lose its finalizers.
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    let condition = env.compile(condition).expect("the condition compiles");
    let judged_on = |operation: &str,
                     old: Option<&[&str]>,
                     new: Option<&[&str]>,
                     old_parent: &str,
                     new_parent: &str| {
        let spec = |h: Option<&[&str]>, parent: &str| {
            let mut spec = json!({ "parentRefs": [{"name": parent}], "rules": [] });
            if let Some(h) = h {
                spec["hostnames"] = json!(h);
            }
            json!({ "spec": spec })
        };
        let mut context = cel::Context::with_env(Arc::clone(&env));
        context
            .add_variable("request", json!({ "operation": operation }))
            .expect("request");
        context
            .add_variable("object", spec(new, new_parent))
            .expect("object");
        let previous = if operation == "UPDATE" {
            spec(old, old_parent)
        } else {
            serde_json::Value::Null
        };
        context
            .add_variable("oldObject", previous)
            .expect("oldObject");
        match condition.execute(&context) {
            Ok(value) => value == cel::Value::Bool(true),
            Err(e) => panic!("{operation} {old:?} -> {new:?}: {e}"),
        }
    };
    let judged = |operation: &str, old: Option<&[&str]>, new: Option<&[&str]>| {
        judged_on(operation, old, new, "edge", "edge")
    };
    let a: &[&str] = &["a.example.com"];
    let b: &[&str] = &["b.example.com"];
    assert!(judged("CREATE", None, Some(a)));
    assert!(judged("CREATE", None, None));
    assert!(
        !judged("UPDATE", Some(a), Some(a)),
        "hostnames as they were"
    );
    assert!(!judged("UPDATE", None, None));
    assert!(judged("UPDATE", Some(a), Some(b)));
    assert!(judged("UPDATE", None, Some(a)));
    assert!(judged("UPDATE", Some(a), None));
    assert!(
        judged_on("UPDATE", Some(a), Some(a), "mesh", "edge"),
        "moved onto another Gateway"
    );
}

/// The routes the policy judges are those with a parent of this installation, as the
/// controller lists them: routes of other implementations' Gateways in the same cluster are
/// admitted whatever their hostnames.
#[test]
fn admission_judges_only_routes_naming_a_parent_the_controller_lists() {
    let Some(tools) = tools("admission_judges_only_routes_naming_a_parent_the_controller_lists")
    else {
        return;
    };
    let rendered = render(tools, FILE, "");
    let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
    let options = options(&run);
    let name = format!("{RELEASE}-hostname-ownership");

    // The controller writes its list into the ConfigMap the chart renders and the binding
    // passes the policy, and a missing one refuses nothing.
    let configmap = options
        .ownership_parents
        .clone()
        .expect("a ConfigMap to list parents in");
    assert_eq!(
        (configmap.namespace.as_str(), configmap.name.as_str()),
        (NAMESPACE, name.as_str())
    );
    rendered.raw("ConfigMap", &name);
    let policy_name = cluster_name(RELEASE, NAMESPACE, "hostname-ownership");
    let policy = rendered.raw("ValidatingAdmissionPolicy", &policy_name);
    assert_eq!(
        policy["spec"]["paramKind"]["apiVersion"].as_str(),
        Some("v1")
    );
    assert_eq!(
        policy["spec"]["paramKind"]["kind"].as_str(),
        Some("ConfigMap")
    );
    let binding =
        &rendered.raw("ValidatingAdmissionPolicyBinding", &policy_name)["spec"]["paramRef"];
    assert_eq!(binding["name"].as_str(), Some(name.as_str()));
    assert_eq!(binding["namespace"].as_str(), Some(NAMESPACE));
    assert_eq!(binding["parameterNotFoundAction"].as_str(), Some("Allow"));

    // The list the controller writes for a cluster where Istio serves Gateways too.
    let cluster = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cloudflare-tunnel}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: infra}
spec:
  gatewayClassName: cloudflare-tunnel
  allowedListeners: {namespaces: {from: All}}
  listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mesh, namespace: infra}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: team-a}
spec:
  parentRef: {name: edge, namespace: infra}
  listeners: [{name: web, port: 80, protocol: HTTP, hostname: team.example.com}]
"#;
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, cluster, "cluster.yaml").expect("the cluster loads");
    let output = translate::translate(&snapshot, &options.translate);
    let list = ownership_parents::parents(&output.statuses);
    assert_eq!(list, "Gateway/infra/edge\nListenerSet/team-a/team\n");

    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension");
    let env = Arc::new(env);
    let expression = policy["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    let program = env.compile(expression).expect("the expression compiles");
    // team-a may publish example.com and names under it only.
    let admits = |parent_refs: serde_json::Value, params: &serde_json::Value| {
        let mut context = cel::Context::with_env(Arc::clone(&env));
        let object = json!({"spec": {"parentRefs": parent_refs, "hostnames": ["shop.evil.net"], "rules": []}});
        context.add_variable("object", object).expect("object");
        context
            .add_variable("request", json!({ "namespace": "team-a" }))
            .expect("request");
        context
            .add_variable(
                "namespaceObject",
                json!({"metadata": {"name": "team-a", "labels": {"hostnames.cf.k8s.lex.la/example.com": "true"}}}),
            )
            .expect("namespaceObject");
        context
            .add_variable("params", params.clone())
            .expect("params");
        match program.execute(&context) {
            Ok(value) => value == cel::Value::Bool(true),
            Err(e) => panic!("{parent_refs}: {e}"),
        }
    };
    let listed = json!({ "data": { ownership_parents::DATA_KEY: list } });
    let gx = "gateway.networking.x-k8s.io";
    let gw = "gateway.networking.k8s.io";
    for (parent_refs, judged) in [
        (json!([{"name": "edge", "namespace": "infra"}]), true),
        (
            json!([{"group": gw, "kind": "Gateway", "name": "edge", "namespace": "infra"}]),
            true,
        ),
        (json!([{"kind": "ListenerSet", "name": "team"}]), true),
        (
            json!([{"group": gx, "kind": "XListenerSet", "name": "team"}]),
            true,
        ),
        // One parent of ours among others is enough.
        (
            json!([{"name": "mesh", "namespace": "infra"}, {"name": "edge", "namespace": "infra"}]),
            true,
        ),
        // Another implementation's Gateway, a Gateway of that name in the route's namespace.
        (json!([{"name": "mesh", "namespace": "infra"}]), false),
        (json!([{"name": "edge"}]), false),
        // Names the controller would not bind to its Gateway either.
        (json!([{"name": "ed", "namespace": "infra"}]), false),
        (json!([{"name": "edge", "namespace": "infr"}]), false),
        (
            json!([{"group": gx, "kind": "Gateway", "name": "edge", "namespace": "infra"}]),
            false,
        ),
        (
            json!([{"group": "", "kind": "Service", "name": "edge", "namespace": "infra"}]),
            false,
        ),
        (json!([{"kind": "XListenerSet", "name": "team"}]), false),
        (
            json!([{"group": gx, "kind": "ListenerSet", "name": "team"}]),
            false,
        ),
        (json!([]), false),
    ] {
        assert_eq!(
            admits(parent_refs.clone(), &listed),
            !judged,
            "{parent_refs}"
        );
    }
    // Before the controller lists anything, nothing is judged here.
    let ours = json!([{"name": "edge", "namespace": "infra"}]);
    assert!(admits(ours.clone(), &json!({})));
    assert!(admits(ours.clone(), &json!({ "data": {} })));
    assert!(admits(
        ours,
        &json!({ "data": { ownership_parents::DATA_KEY: "" } })
    ));
}

#[test]
fn ownership_is_off_and_no_policy_is_rendered_by_default() {
    let Some(tools) = tools("ownership_is_off_and_no_policy_is_rendered_by_default") else {
        return;
    };
    let rendered = render(tools, "default-values.yaml", "");
    let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
    assert!(!options(&run).translate.hostname_ownership);
    assert!(rendered
        .names()
        .iter()
        .all(|n| !n.starts_with("ValidatingAdmissionPolicy")));
}
