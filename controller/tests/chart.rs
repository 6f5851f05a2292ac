//! The Helm chart against the code it deploys: its CRD is the one the controller defines, its
//! roles grant every call the runtime makes, every value its templates read exists, and the
//! controller accepts the arguments it passes. (Rendering the templates needs `helm`; these
//! checks read them as text.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cftunnel_controller::cli::{Cli, Command};
use cftunnel_controller::gateway_config::GatewayConfig;
use cftunnel_controller::runtime::REQUIRED_RBAC;
use clap::Parser;
use kube::CustomResourceExt;
use serde::Deserialize;
use serde_yaml_ng::Value;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/cftunnel")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn templates() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(chart().join("templates"))
        .expect("templates")
        .map(|e| e.expect("entry").path())
        .map(|p| (p.display().to_string(), read(&p)))
        .collect();
    out.sort();
    out
}

fn values() -> Value {
    serde_yaml_ng::from_str(&read(&chart().join("values.yaml"))).expect("values.yaml is YAML")
}

/// The value at a dotted `.Values` path.
fn lookup<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(values, |v, key| v.get(key))
}

/// The template text with each `{{ ... }}` replaced: a plain `.Values.a.b` by its default, all
/// else by `x`.
fn neutralize(text: &str, values: &Value) -> String {
    let re = regex::Regex::new(r"\{\{-?\s*(.*?)\s*-?\}\}").expect("regex");
    re.replace_all(text, |c: &regex::Captures<'_>| {
        let expr = &c[1];
        match expr.strip_prefix(".Values.") {
            Some(path) if !path.contains(' ') => match lookup(values, path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => "x".to_owned(),
            },
            _ => "x".to_owned(),
        }
    })
    .into_owned()
}

#[test]
fn the_charts_crd_is_the_one_the_controller_defines() {
    let generated = serde_yaml_ng::to_string(&GatewayConfig::crd()).expect("CRD encodes");
    let shipped = read(&chart().join("crds/gatewayconfigs.cf.k8s.lex.la.yaml"));
    assert_eq!(
        shipped, generated,
        "regenerate with: cftunnel-controller crd > charts/cftunnel/crds/gatewayconfigs.cf.k8s.lex.la.yaml"
    );
}

#[test]
fn the_charts_roles_grant_exactly_the_calls_the_runtime_makes() {
    let values = values();
    let text = neutralize(&read(&chart().join("templates/rbac.yaml")), &values);
    let mut granted: Vec<(String, String, String)> = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let doc = Value::deserialize(doc).expect("rbac.yaml documents are YAML");
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind != "ClusterRole" && kind != "Role" {
            continue;
        }
        for rule in doc
            .get("rules")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let list = |k: &str| -> Vec<String> {
                rule.get(k)
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        granted.push((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    let required: std::collections::BTreeSet<(String, String, String)> = REQUIRED_RBAC
        .iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(|v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect();
    let granted: std::collections::BTreeSet<_> = granted.into_iter().collect();
    let missing: Vec<_> = required.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&required).collect();
    assert!(missing.is_empty(), "the chart does not grant: {missing:?}");
    assert!(
        extra.is_empty(),
        "the chart grants more than the controller calls: {extra:?}"
    );
}

#[test]
fn every_value_the_templates_read_exists() {
    let values = values();
    let re = regex::Regex::new(r"\.Values\.([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)").expect("regex");
    let mut read_any = false;
    for (file, text) in templates() {
        for c in re.captures_iter(&text) {
            read_any = true;
            // A key of a free-form map (a selector left empty) may be absent; Helm reads nil.
            let path = &c[1];
            let optional = path
                .rsplit_once('.')
                .and_then(|(parent, _)| lookup(&values, parent))
                .is_some_and(|p| p.as_mapping().is_some_and(|m| m.is_empty()));
            assert!(
                optional || lookup(&values, path).is_some(),
                "{file} reads .Values.{} which values.yaml does not define",
                &c[1]
            );
        }
    }
    assert!(read_any);
}

#[test]
fn the_controller_accepts_the_arguments_the_chart_passes() {
    let values = values();
    let text = read(&chart().join("templates/controller.yaml"));
    let args: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|a| format!("--{}", neutralize(a, &values)))
        .collect();
    assert!(
        args.iter().any(|a| a.starts_with("--shared-service=")),
        "{args:?}"
    );
    let line = std::iter::once("cftunnel-controller".to_owned())
        .chain(std::iter::once("run".to_owned()))
        .chain(args.iter().cloned());
    let cli = Cli::try_parse_from(line).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("not the run command")
    };
    let options = run.options().expect("options");
    // The probes reach the port the controller serves them on.
    assert!(
        text.contains(&format!("containerPort: {}", run.health_addr.port())),
        "containerPort {} in controller.yaml",
        run.health_addr.port()
    );
    assert!(options.shared.is_some(), "the shared pool gets configs");
    assert!(options.lease.is_some(), "leader election is on by default");
}

/// The `key: value` lines of the block under the `matchLabels:` reached by finding each of
/// `anchors` (trimmed lines, in order) in `text`, template expressions left as written.
fn match_labels_after(text: &str, anchors: &[&str]) -> BTreeMap<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut at = 0;
    for anchor in anchors.iter().chain(std::iter::once(&"matchLabels:")) {
        at += lines[at..]
            .iter()
            .position(|l| l.trim() == *anchor)
            .unwrap_or_else(|| panic!("no {anchor:?} after line {at}"));
        at += 1;
    }
    let indent = |l: &str| l.len() - l.trim_start().len();
    let depth = indent(lines[at - 1]);
    let labels: BTreeMap<String, String> = lines[at..]
        .iter()
        .take_while(|l| indent(l) > depth)
        .map(|l| {
            let (k, v) = l.trim().split_once(": ").expect("key: value");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert!(!labels.is_empty(), "labels under {anchors:?}");
    labels
}

/// The controller Deployment's selector, as the template writes it.
fn controller_selector() -> BTreeMap<String, String> {
    let text = read(&chart().join("templates/controller.yaml"));
    match_labels_after(&text, &["kind: Deployment", "selector:"])
}

#[test]
fn the_controller_admits_its_own_pods_by_exactly_its_deployments_selector() {
    let text = read(&chart().join("templates/controller.yaml"));
    let passed: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --controller-pod-label="))
        .flat_map(|a| a.split(','))
        .map(|a| {
            let (k, v) = a.split_once('=').expect("KEY=VALUE");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    // The same labels, the same template expressions: the policy's peer is the Deployment's
    // pods, which carry the selector's labels, and no other pod of the namespace.
    assert_eq!(passed, controller_selector());
    // And the controller takes them all (the values neutralized).
    let values = values();
    let args = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|a| format!("--{}", neutralize(a, &values)));
    let line = ["cftunnel-controller".to_owned(), "run".to_owned()];
    let cli =
        Cli::try_parse_from(line.into_iter().chain(args)).expect("the chart's arguments parse");
    let Command::Run(run) = cli.command else {
        panic!("not the run command")
    };
    let neutralized: BTreeMap<String, String> = passed
        .iter()
        .map(|(k, v)| (k.clone(), neutralize(v, &values)))
        .collect();
    let options = run.options().expect("options");
    assert_eq!(options.render.controller_pod_labels, neutralized);
}

#[test]
fn the_shared_pools_config_port_admits_the_controllers_pods_not_its_namespace() {
    let text = read(&chart().join("templates/proxy.yaml"));
    let policy = text
        .split("\n---")
        .find(|doc| doc.contains("\nkind: NetworkPolicy"))
        .expect("proxy.yaml renders a NetworkPolicy");
    assert_eq!(
        match_labels_after(policy, &["- from:", "podSelector:"]),
        controller_selector()
    );
    // Both selectors in the one peer: the pod selector is not a peer of its own.
    let from = policy
        .lines()
        .skip_while(|l| l.trim() != "- from:")
        .skip(1)
        .take_while(|l| l.trim() != "ports:")
        .map(str::trim)
        .filter(|l| !l.starts_with("{{"))
        .collect::<Vec<_>>();
    assert_eq!(from[0], "- namespaceSelector:");
    assert_eq!(
        from[1..3],
        [
            "matchLabels:",
            "kubernetes.io/metadata.name: {{ .Release.Namespace }}"
        ]
    );
    assert_eq!(from[3], "podSelector:", "{from:?}");
}
