//! Hostname ownership in the chart: the controller is started with the rule on, and the
//! ValidatingAdmissionPolicy's CEL is the controller's own rule, character for character and
//! in effect: evaluated (by a CEL interpreter) on routes and namespaces, it admits exactly the
//! hostnames the controller's code permits.

use std::collections::BTreeMap;
use std::sync::Arc;

use cftunnel_controller::translate::ownership::{permitted, ADMISSION_EXPRESSION};
use serde_json::json;

use super::{controller_name, controller_run, options, render, tools, RELEASE};

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

    let name = format!("{RELEASE}-hostname-ownership");
    let policy = rendered.raw("ValidatingAdmissionPolicy", &name);
    assert_eq!(
        policy["apiVersion"].as_str(),
        Some("admissionregistration.k8s.io/v1")
    );
    let validation = &policy["spec"]["validations"][0];
    let expression = validation["expression"].as_str().unwrap_or_default();
    assert_eq!(expression, ADMISSION_EXPRESSION);
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
    let admits = |hostnames: Option<&[&str]>, labels: &BTreeMap<String, String>| {
        let mut context = cel::Context::with_env(Arc::clone(&env));
        let spec = match hostnames {
            Some(h) => json!({ "hostnames": h, "rules": [] }),
            None => json!({ "rules": [] }),
        };
        context
            .add_variable("object", json!({ "spec": spec }))
            .expect("object");
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

    // Updates are judged only when they set the hostnames: a route stored before the rule
    // refused its hostnames can still be relabelled and lose its finalizers.
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    let condition = env.compile(condition).expect("the condition compiles");
    let judged = |operation: &str, old: Option<&[&str]>, new: Option<&[&str]>| {
        let spec = |h: Option<&[&str]>| match h {
            Some(h) => json!({ "spec": { "hostnames": h, "rules": [] } }),
            None => json!({ "spec": { "rules": [] } }),
        };
        let mut context = cel::Context::with_env(Arc::clone(&env));
        context
            .add_variable("request", json!({ "operation": operation }))
            .expect("request");
        context.add_variable("object", spec(new)).expect("object");
        let previous = if operation == "UPDATE" {
            spec(old)
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
