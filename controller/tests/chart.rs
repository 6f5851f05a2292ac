//! The Helm chart against the code it deploys: its CRD is the one the controller defines, its
//! roles grant every call the runtime makes, every value its templates read exists, the
//! controller accepts the arguments it passes (the ExternalName backends it admits among them),
//! and the shared pool's NetworkPolicy admits whom the controller's planes admit. The suite does not run `helm`: some checks read the templates
//! as text, others render them with [`template`], a small interpreter of the part of Helm's
//! template language the chart uses, and compare the objects, typed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cftunnel_controller::cli::{Cli, Command};
use cftunnel_controller::gateway_config::GatewayConfig;
use cftunnel_controller::runtime::{RuntimeOptions, REQUIRED_RBAC};
use cftunnel_controller::translate::{ExternalNameBackends, Snapshot};
use cftunnel_controller::{manifest, render};
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde::Deserialize;
use serde_yaml_ng::Value;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/cftunnel")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every template of the chart, by file name.
fn templates() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(chart().join("templates"))
        .expect("templates")
        .map(|e| e.expect("entry").path())
        .map(|p| {
            let name = p
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            (name, read(&p))
        })
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

/// The release namespace of the rendering checks.
const NAMESPACE: &str = "cf-system";

/// `over` merged into `base`, as Helm merges a values file over the chart's.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(base), Value::Mapping(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) if slot.is_mapping() && value.is_mapping() => merge(slot, value),
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// The documents `file` renders to for a release `release` in namespace `namespace`, with
/// `ci/default-values.yaml` and then `overrides` (YAML) over the chart's values; or the
/// template's error (a `fail`, a `required`).
fn render(
    file: &str,
    release: &str,
    namespace: &str,
    overrides: &str,
) -> Result<Vec<Value>, String> {
    let mut values = values();
    for over in [
        read(&chart().join("ci/default-values.yaml")).as_str(),
        overrides,
    ] {
        let over: Value = serde_yaml_ng::from_str(over).expect("overrides are YAML");
        if !over.is_null() {
            merge(&mut values, over);
        }
    }
    let meta: Value =
        serde_yaml_ng::from_str(&read(&chart().join("Chart.yaml"))).expect("Chart.yaml");
    let map = |pairs: Vec<(&str, Value)>| {
        Value::Mapping(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    };
    let root = map(vec![
        ("Values", values),
        (
            "Release",
            map(vec![
                ("Name", release.into()),
                ("Namespace", namespace.into()),
                ("Service", "Helm".into()),
            ]),
        ),
        (
            "Chart",
            map(vec![
                ("Name", meta["name"].clone()),
                ("Version", meta["version"].clone()),
                ("AppVersion", meta["appVersion"].clone()),
            ]),
        ),
    ]);
    let chart = template::Chart::parse(&templates()).expect("the templates parse");
    let text = chart.render(file, &root)?;
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).map_err(|e| format!("{file}: {e}\n{text}")))
        .filter(|doc| !matches!(doc, Ok(Value::Null)))
        .collect()
}

/// The one object of `kind` among `docs`, typed.
fn object<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let mut found = docs.iter().filter(|d| d["kind"].as_str() == Some(kind));
    let doc = found
        .next()
        .unwrap_or_else(|| panic!("no {kind} in {docs:?}"));
    assert!(found.next().is_none(), "one {kind}");
    serde_yaml_ng::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    })
}

/// The peers of the only ingress rule of `policy`, which admits the config port alone.
fn config_port_peers(policy: NetworkPolicy) -> Vec<NetworkPolicyPeer> {
    let mut rules = policy.spec.and_then(|s| s.ingress).expect("ingress rules");
    assert_eq!(rules.len(), 1, "one rule");
    let rule = rules.remove(0);
    let ports = rule.ports.expect("ports");
    assert_eq!(
        (
            ports.len(),
            ports[0].port.clone(),
            ports[0].protocol.as_deref()
        ),
        (1, Some(IntOrString::Int(8081)), Some("TCP"))
    );
    rule.from.expect("peers")
}

/// What the controller the chart deploys with `overrides` makes of its arguments: its run
/// options, its namespace set as the Deployment's downward API sets it.
fn controller_options(release: &str, overrides: &str) -> (Deployment, RuntimeOptions) {
    let deployment: Deployment = object(
        &render("controller.yaml", release, NAMESPACE, overrides).expect("controller.yaml renders"),
        "Deployment",
    );
    let container = &deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod spec")
        .containers[0];
    let namespace = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAMESPACE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(namespace, Some("metadata.namespace"));
    let args = container.args.clone().expect("arguments");
    let cli = Cli::try_parse_from(std::iter::once("cftunnel-controller".to_owned()).chain(args))
        .unwrap_or_else(|e| panic!("the chart's arguments parse: {e}"));
    let Command::Run(mut run) = cli.command else {
        panic!("not the run command")
    };
    run.controller_namespace = NAMESPACE.to_owned();
    (deployment, run.options().expect("options"))
}

/// The config-port peers of a dedicated plane the controller renders with `options`.
fn plane_peers(options: &RuntimeOptions) -> Vec<NetworkPolicyPeer> {
    let mut snapshot = Snapshot::default();
    let tenant = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tenant.yaml");
    manifest::load_into(&mut snapshot, &read(&tenant), "tenant.yaml").expect("the fixture loads");
    let gateway = snapshot
        .gateways
        .iter()
        .find(|g| g.metadata.name.as_deref() == Some("edge"))
        .expect("Gateway edge");
    let config = &snapshot.gateway_configs[0];
    let credentials =
        render::resolve(gateway, config, &snapshot.secrets, "fresh").expect("credentials");
    let plane =
        render::render(gateway, config, &credentials, &options.render).expect("the plane renders");
    config_port_peers(plane.network_policy)
}

#[test]
fn the_shared_pools_config_port_admits_the_controllers_pods_not_its_namespace() {
    let (controller, options) = controller_options("cf", "");
    let spec = controller.spec.expect("spec");
    let controller_selector = spec.selector.match_labels.expect("matchLabels");
    assert_eq!(
        controller_selector,
        labels(&[
            ("app.kubernetes.io/instance", "cf"),
            ("app.kubernetes.io/name", "cftunnel-controller")
        ])
    );
    // The controller's pods carry the labels the controller is told are its own.
    let pod_labels = spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .expect("pod labels");
    assert!(
        controller_selector
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{pod_labels:?}"
    );
    assert_eq!(options.render.controller_pod_labels, controller_selector);

    let docs = render("proxy.yaml", "cf", NAMESPACE, "").expect("proxy.yaml renders");
    let pool: Deployment = object(&docs, "Deployment");
    let policy: NetworkPolicy = object(&docs, "NetworkPolicy");
    assert_eq!(
        policy.spec.as_ref().and_then(|s| s.pod_selector.clone()),
        pool.spec.map(|s| s.selector),
        "the policy covers the pool's pods"
    );
    // One peer with both selectors: the controller's pods, in the release namespace; not the
    // release namespace (the pool's own pods), nor those labels in any namespace.
    let controller_peer = NetworkPolicyPeer {
        namespace_selector: selector(&[("kubernetes.io/metadata.name", NAMESPACE)]),
        pod_selector: Some(LabelSelector {
            match_labels: Some(controller_selector),
            match_expressions: None,
        }),
        ip_block: None,
    };
    assert_eq!(
        config_port_peers(policy),
        std::slice::from_ref(&controller_peer)
    );
    // The same peers as every dedicated plane's.
    assert_eq!(plane_peers(&options), [controller_peer]);
}

#[test]
fn the_controller_admits_the_external_name_backends_and_cluster_domain_the_values_say() {
    let (_, options) = controller_options("cf", "");
    assert_eq!(
        options.translate.external_name_backends,
        ExternalNameBackends::External,
        "names outside the cluster only, by default"
    );
    assert_eq!(options.translate.cluster_domain, "cluster.local");
    for (value, expected) in [
        ("deny", ExternalNameBackends::Deny),
        ("external", ExternalNameBackends::External),
        ("any", ExternalNameBackends::Any),
    ] {
        let overrides =
            format!("controller: {{externalNameBackends: {value}}}\nclusterDomain: corp.internal");
        let (_, options) = controller_options("cf", &overrides);
        assert_eq!(options.translate.external_name_backends, expected);
        assert_eq!(options.translate.cluster_domain, "corp.internal");
    }
    // A value the controller does not know stops it at start, naming the flag.
    let docs = render(
        "controller.yaml",
        "cf",
        NAMESPACE,
        "controller: {externalNameBackends: allow}",
    )
    .expect("controller.yaml renders");
    let controller: Deployment = object(&docs, "Deployment");
    let args = controller
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers[0].args.clone())
        .expect("arguments");
    let err = Cli::try_parse_from(std::iter::once("cftunnel-controller".to_owned()).chain(args))
        .expect_err("an unknown value is refused");
    assert!(
        err.to_string().contains("--external-name-backends"),
        "{err}"
    );
}

#[test]
fn a_prometheus_in_the_release_namespace_is_admitted_by_its_pods_labels() {
    let overrides = "
proxy:
  networkPolicy:
    monitoringPodSelector:
      matchLabels: {app.kubernetes.io/name: prometheus, app.kubernetes.io/instance: k8s}
    monitoringNamespaceSelector:
      matchLabels: {team: obs}
";
    // The value becomes the controller's flags...
    let (controller, options) = controller_options("cf", overrides);
    let args = controller
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers[0].args.clone())
        .expect("arguments");
    let flags: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| a.starts_with("--monitoring-"))
        .collect();
    assert_eq!(
        flags,
        [
            "--monitoring-namespace-label=team=obs",
            "--monitoring-pod-label=app.kubernetes.io/instance=k8s",
            "--monitoring-pod-label=app.kubernetes.io/name=prometheus",
        ]
    );
    let prometheus = selector(&[
        ("app.kubernetes.io/instance", "k8s"),
        ("app.kubernetes.io/name", "prometheus"),
    ]);
    assert_eq!(options.render.monitoring_pod_selector, prometheus);
    // ...and, in the pool's policy and every plane's, a peer of those pods in the release
    // namespace, besides the controller's pods and the monitoring namespaces.
    let release_namespace = selector(&[("kubernetes.io/metadata.name", NAMESPACE)]);
    let expected = [
        NetworkPolicyPeer {
            namespace_selector: release_namespace.clone(),
            pod_selector: selector(&[
                ("app.kubernetes.io/instance", "cf"),
                ("app.kubernetes.io/name", "cftunnel-controller"),
            ]),
            ip_block: None,
        },
        NetworkPolicyPeer {
            namespace_selector: release_namespace,
            pod_selector: prometheus,
            ip_block: None,
        },
        NetworkPolicyPeer {
            namespace_selector: selector(&[("team", "obs")]),
            pod_selector: None,
            ip_block: None,
        },
    ];
    let docs = render("proxy.yaml", "cf", NAMESPACE, overrides).expect("proxy.yaml renders");
    assert_eq!(config_port_peers(object(&docs, "NetworkPolicy")), expected);
    assert_eq!(plane_peers(&options), expected);

    // Without it, no such peer and no such flag.
    let (_, options) = controller_options("cf", "");
    assert_eq!(options.render.monitoring_pod_selector, None);
    let docs = render("proxy.yaml", "cf", NAMESPACE, "").expect("proxy.yaml renders");
    assert_eq!(
        config_port_peers(object(&docs, "NetworkPolicy")),
        expected[..1]
    );

    // matchExpressions cannot become flags: the chart refuses them, as for the namespaces.
    for value in ["monitoringPodSelector", "monitoringNamespaceSelector"] {
        let overrides = format!(
            "proxy: {{networkPolicy: {{{value}: {{matchExpressions: \
             [{{key: app, operator: In, values: [prometheus]}}]}}}}}}"
        );
        let err = render("controller.yaml", "cf", NAMESPACE, &overrides)
            .expect_err("matchExpressions are refused");
        assert!(
            err.contains(&format!("proxy.networkPolicy.{value}: only matchLabels")),
            "{err}"
        );
    }
}

#[test]
fn an_all_digit_release_name_stays_a_string_in_selectors_and_labels() {
    // In every label and selector the templates write (`labels`, `matchLabels`, a Service's
    // `selector`, a ServiceMonitor's `matchNames`) the release's name and namespace are
    // strings: YAML would read `123` as a number, which no label or selector takes.
    fn check(value: &Value, found: &mut usize) {
        let expected = |key: &str| match key {
            "app.kubernetes.io/instance" => Some("123"),
            "kubernetes.io/metadata.name" | "matchNames" => Some("456"),
            _ => None,
        };
        match value {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let key = k.as_str().unwrap_or_default();
                    if let Some(want) = expected(key) {
                        let got = v.as_sequence().map_or(v, |s| &s[0]);
                        assert_eq!(got, &Value::String(want.to_owned()), "{key} in {m:?}");
                        *found += 1;
                    }
                    check(v, found);
                }
            }
            Value::Sequence(s) => s.iter().for_each(|v| check(v, found)),
            _ => {}
        }
    }
    let overrides =
        "proxy: {serviceMonitor: {enabled: true}, podDisruptionBudget: {enabled: true}}";
    let mut found = 0;
    for file in ["controller.yaml", "proxy.yaml", "servicemonitor.yaml"] {
        for doc in render(file, "123", "456", overrides).expect("renders") {
            check(&doc, &mut found);
        }
    }
    // The selectors of both Deployments, their pods' spread, the pool's Service and budget,
    // its policy, the ServiceMonitor, and every object's and pod's labels.
    assert!(found >= 20, "{found} label and selector values checked");
    // The controller's flag carries the name as it is: the pods it admits are its selector's.
    let docs = render("controller.yaml", "123", "456", "").expect("renders");
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("a Deployment");
    let selector: BTreeMap<String, String> =
        serde_yaml_ng::from_value(deployment["spec"]["selector"]["matchLabels"].clone())
            .expect("string labels");
    let args: Vec<String> = serde_yaml_ng::from_value(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )
    .expect("arguments");
    let cli = Cli::try_parse_from(std::iter::once("cftunnel-controller".to_owned()).chain(args))
        .unwrap_or_else(|e| panic!("the chart's arguments parse: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("not the run command")
    };
    assert_eq!(
        run.options().expect("options").render.controller_pod_labels,
        selector
    );
}

/// Enough of Helm's template language (Go's `text/template` with the Sprig functions the chart
/// calls) to render the chart's templates without `helm`: a template that uses anything else
/// fails to render, naming it, rather than rendering something Helm would not.
mod template {
    use std::collections::BTreeMap;

    use serde_yaml_ng::{Mapping, Value};

    #[derive(Debug, Clone)]
    enum Arg {
        /// `.a.b` (`.` alone: no fields).
        Field(Vec<String>),
        /// `$x.a.b`; `$` is named "$".
        Var(String, Vec<String>),
        /// `(pipeline).a.b`.
        Sub(Box<Pipe>, Vec<String>),
        Func(String),
        Lit(Value),
    }

    #[derive(Debug, Clone, Default)]
    struct Pipe {
        /// Variables declared (`:=`, true) or assigned (`=`, false).
        vars: Vec<String>,
        declare: bool,
        cmds: Vec<Vec<Arg>>,
    }

    #[derive(Debug, Clone)]
    enum Node {
        Text(String),
        Out(Pipe),
        /// `if`/`else if`/`with` branches (`with` sets dot), then the `else` list.
        Cond(Vec<(bool, Pipe, Vec<Node>)>, Vec<Node>),
        Range(Pipe, Vec<Node>, Vec<Node>),
    }

    /// Template text, or what one action holds between `{{ }}` (trim markers and comments
    /// dropped).
    enum Token {
        Text(String),
        Action(String),
    }

    fn lex(src: &str) -> Result<Vec<Token>, String> {
        let mut out = Vec::new();
        let mut rest = src;
        let mut trim_next = false;
        loop {
            let Some(open) = rest.find("{{") else {
                let text = if trim_next { rest.trim_start() } else { rest };
                out.push(Token::Text(text.to_owned()));
                return Ok(out);
            };
            let mut text = &rest[..open];
            if trim_next {
                text = text.trim_start();
            }
            let mut body = &rest[open + 2..];
            if body.starts_with('-') && body[1..].starts_with(|c: char| c.is_ascii_whitespace()) {
                text = text.trim_end();
                body = &body[1..];
            }
            out.push(Token::Text(text.to_owned()));
            let trimmed = body.trim_start();
            let end = if trimmed.starts_with("/*") {
                let close = trimmed.find("*/").ok_or("an unclosed comment")?;
                body.len() - trimmed.len() + close + 2
            } else {
                // The first `}}` outside a string literal.
                let bytes = body.as_bytes();
                let mut i = 0;
                loop {
                    match bytes.get(i) {
                        None => return Err("an unclosed action".to_owned()),
                        Some(b'"') => {
                            i += 1;
                            while bytes.get(i).is_some_and(|b| *b != b'"') {
                                i += if bytes[i] == b'\\' { 2 } else { 1 };
                            }
                        }
                        Some(b'`') => {
                            i += 1;
                            while bytes.get(i).is_some_and(|b| *b != b'`') {
                                i += 1;
                            }
                        }
                        Some(b'}') if bytes.get(i + 1) == Some(&b'}') => break i,
                        Some(_) => {}
                    }
                    i += 1;
                }
            };
            let close = end + body[end..].find("}}").ok_or("an unclosed action")?;
            let mut inner = &body[..close];
            trim_next = false;
            if let Some(stripped) = inner.strip_suffix('-') {
                if stripped.ends_with(|c: char| c.is_ascii_whitespace()) {
                    inner = stripped;
                    trim_next = true;
                }
            }
            let inner = inner.trim();
            if !inner.starts_with("/*") {
                out.push(Token::Action(inner.to_owned()));
            }
            rest = &body[close + 2..];
        }
    }

    fn parse_pipe(src: &str) -> Result<Pipe, String> {
        let chars: Vec<char> = src.chars().collect();
        let mut at = 0;
        let pipe = pipe_at(&chars, &mut at)?;
        match chars.get(at) {
            None => Ok(pipe),
            Some(c) => Err(format!("{src:?}: unexpected {c:?}")),
        }
    }

    fn is_delim(c: char) -> bool {
        c.is_whitespace() || matches!(c, '(' | ')' | '|' | ',')
    }

    /// A pipeline from `at`, to its end or a closing parenthesis.
    fn pipe_at(chars: &[char], at: &mut usize) -> Result<Pipe, String> {
        let word = |at: &mut usize| {
            let start = *at;
            while chars.get(*at).is_some_and(|c| !is_delim(*c)) {
                *at += 1;
            }
            chars[start..*at].iter().collect::<String>()
        };
        let skip = |at: &mut usize| {
            while chars.get(*at).is_some_and(|c| c.is_whitespace()) {
                *at += 1;
            }
        };
        let fields = |w: &str| -> Vec<String> {
            w.split('.')
                .skip(1)
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let mut pipe = Pipe::default();
        // A declaration: `$a := ` or `$a, $b := ` or `$a = `.
        let rest: String = chars[*at..].iter().collect();
        let decl =
            regex::Regex::new(r"^\s*(\$\w*)\s*(?:,\s*(\$\w*)\s*)?(:=|=)[^=]").expect("regex");
        if let Some(c) = decl.captures(&rest) {
            pipe.vars = [c.get(1), c.get(2)]
                .into_iter()
                .flatten()
                .map(|m| m.as_str().to_owned())
                .collect();
            pipe.declare = &c[3] == ":=";
            *at += c.get(3).expect("operator").end();
        }
        let mut cmd = Vec::new();
        loop {
            skip(at);
            let Some(&c) = chars.get(*at) else { break };
            match c {
                ')' => break,
                '|' => {
                    *at += 1;
                    pipe.cmds.push(std::mem::take(&mut cmd));
                }
                '(' => {
                    *at += 1;
                    let inner = pipe_at(chars, at)?;
                    if chars.get(*at) != Some(&')') {
                        return Err("an unclosed parenthesis".to_owned());
                    }
                    *at += 1;
                    let chain = if chars.get(*at) == Some(&'.') {
                        fields(&word(at))
                    } else {
                        Vec::new()
                    };
                    cmd.push(Arg::Sub(Box::new(inner), chain));
                }
                '"' => {
                    *at += 1;
                    let mut s = String::new();
                    loop {
                        match chars.get(*at) {
                            None => return Err("an unclosed string".to_owned()),
                            Some('"') => break,
                            Some('\\') => {
                                *at += 1;
                                s.push(match chars.get(*at) {
                                    Some('n') => '\n',
                                    Some('t') => '\t',
                                    Some(c) => *c,
                                    None => return Err("an unclosed string".to_owned()),
                                });
                            }
                            Some(c) => s.push(*c),
                        }
                        *at += 1;
                    }
                    *at += 1;
                    cmd.push(Arg::Lit(Value::String(s)));
                }
                '.' => cmd.push(Arg::Field(fields(&word(at)))),
                '$' => {
                    let w = word(at);
                    let name = w.split('.').next().unwrap_or_default();
                    let name = if name.len() > 1 { name } else { "$" };
                    cmd.push(Arg::Var(name.to_owned(), fields(&w)));
                }
                _ => {
                    let w = word(at);
                    if w.is_empty() {
                        return Err(format!("unexpected {c:?}"));
                    }
                    cmd.push(match w.as_str() {
                        "true" => Arg::Lit(Value::Bool(true)),
                        "false" => Arg::Lit(Value::Bool(false)),
                        "nil" => Arg::Lit(Value::Null),
                        _ => match w.parse::<i64>() {
                            Ok(n) => Arg::Lit(Value::Number(n.into())),
                            Err(_) if w.starts_with(|c: char| c.is_ascii_digit()) => {
                                return Err(format!("the number {w:?}"))
                            }
                            Err(_) => Arg::Func(w),
                        },
                    });
                }
            }
        }
        if cmd.is_empty() {
            return Err("an empty command".to_owned());
        }
        pipe.cmds.push(cmd);
        Ok(pipe)
    }

    /// What closed a list of nodes.
    enum Close {
        End,
        Else(String),
        Eof,
    }

    /// Nodes up to the `end` or `else` closing them; `define`s go to `defines`.
    fn parse_list(
        tokens: &[Token],
        at: &mut usize,
        defines: &mut BTreeMap<String, Vec<Node>>,
    ) -> Result<(Vec<Node>, Close), String> {
        let mut nodes = Vec::new();
        while let Some(token) = tokens.get(*at) {
            *at += 1;
            let action = match token {
                Token::Text(t) => {
                    nodes.push(Node::Text(t.clone()));
                    continue;
                }
                Token::Action(a) => a.as_str(),
            };
            let (keyword, rest) = action
                .split_once(char::is_whitespace)
                .map_or((action, ""), |(k, r)| (k, r.trim()));
            match keyword {
                "end" => return Ok((nodes, Close::End)),
                "else" => return Ok((nodes, Close::Else(rest.to_owned()))),
                "if" | "with" => nodes.push(parse_cond(keyword, rest, tokens, at, defines)?),
                "range" => {
                    let pipe = parse_pipe(rest)?;
                    let (body, end) = parse_list(tokens, at, defines)?;
                    let otherwise = match end {
                        Close::End => Vec::new(),
                        Close::Else(e) if e.is_empty() => match parse_list(tokens, at, defines)? {
                            (list, Close::End) => list,
                            _ => return Err("range: no end".to_owned()),
                        },
                        _ => return Err("range: no end".to_owned()),
                    };
                    nodes.push(Node::Range(pipe, body, otherwise));
                }
                "define" => {
                    let name = rest.trim_matches('"').to_owned();
                    match parse_list(tokens, at, defines)? {
                        (body, Close::End) => defines.insert(name, body),
                        _ => return Err(format!("define {name}: no end")),
                    };
                }
                "template" | "block" | "break" | "continue" => {
                    return Err(format!("{keyword} is not supported here"))
                }
                _ => nodes.push(Node::Out(parse_pipe(action)?)),
            }
        }
        Ok((nodes, Close::Eof))
    }

    fn parse_cond(
        keyword: &str,
        rest: &str,
        tokens: &[Token],
        at: &mut usize,
        defines: &mut BTreeMap<String, Vec<Node>>,
    ) -> Result<Node, String> {
        let mut branches = Vec::new();
        let (mut keyword, mut rest) = (keyword.to_owned(), rest.to_owned());
        loop {
            let pipe = parse_pipe(&rest)?;
            let (body, end) = parse_list(tokens, at, defines)?;
            branches.push((keyword == "with", pipe, body));
            match end {
                Close::End => return Ok(Node::Cond(branches, Vec::new())),
                Close::Else(e) if e.is_empty() => match parse_list(tokens, at, defines)? {
                    (list, Close::End) => return Ok(Node::Cond(branches, list)),
                    _ => return Err(format!("{keyword}: no end")),
                },
                Close::Else(e) => {
                    let (k, r) = e.split_once(char::is_whitespace).unwrap_or((&e, ""));
                    if k != "if" && k != "with" {
                        return Err(format!("else {e}"));
                    }
                    (keyword, rest) = (k.to_owned(), r.trim().to_owned());
                }
                Close::Eof => return Err(format!("{keyword}: no end")),
            }
        }
    }

    fn truthy(v: &Value) -> bool {
        match v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            Value::Sequence(s) => !s.is_empty(),
            Value::Mapping(m) => !m.is_empty(),
            Value::Tagged(_) => true,
        }
    }

    /// As the template prints it (nil as nothing, as Helm does).
    fn print(v: &Value) -> Result<String, String> {
        match v {
            Value::Null => Ok(String::new()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => Ok(n.to_string()),
            Value::String(s) => Ok(s.clone()),
            _ => Err(format!("printing {v:?}")),
        }
    }

    fn field(v: &Value, name: &str) -> Result<Value, String> {
        match v {
            Value::Mapping(m) => Ok(m.get(name).cloned().unwrap_or(Value::Null)),
            _ => Err(format!("field {name} of {v:?}")),
        }
    }

    /// `v` with its maps' keys in order, as Go's YAML encoder writes them.
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Mapping(m) => {
                let mut entries: Vec<(String, Value)> = m
                    .iter()
                    .map(|(k, v)| (print(k).unwrap_or_default(), sorted(v)))
                    .collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Mapping(
                    entries
                        .into_iter()
                        .map(|(k, v)| (Value::String(k), v))
                        .collect(),
                )
            }
            Value::Sequence(s) => Value::Sequence(s.iter().map(sorted).collect()),
            v => v.clone(),
        }
    }

    fn int(v: &Value) -> Result<i64, String> {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| format!("not a number: {v:?}"))
    }

    pub struct Chart {
        defines: BTreeMap<String, Vec<Node>>,
        files: BTreeMap<String, Vec<Node>>,
    }

    impl Chart {
        /// The templates (`name` → text); `_*.tpl` ones only define.
        pub fn parse(templates: &[(String, String)]) -> Result<Self, String> {
            let mut defines = BTreeMap::new();
            let mut files = BTreeMap::new();
            for (name, text) in templates {
                let tokens = lex(text).map_err(|e| format!("{name}: {e}"))?;
                let mut at = 0;
                match parse_list(&tokens, &mut at, &mut defines)
                    .map_err(|e| format!("{name}: {e}"))?
                {
                    (nodes, Close::Eof) => files.insert(name.clone(), nodes),
                    _ => return Err(format!("{name}: an end or else too many")),
                };
            }
            Ok(Self { defines, files })
        }

        /// The text template `name` renders with `root` (`.Values`, `.Release`, `.Chart`).
        pub fn render(&self, name: &str, root: &Value) -> Result<String, String> {
            let nodes = self
                .files
                .get(name)
                .ok_or_else(|| format!("no template {name}"))?;
            let mut out = String::new();
            let mut vars = vec![("$".to_owned(), root.clone())];
            self.exec(nodes, root, &mut vars, &mut out)
                .map_err(|e| format!("{name}: {e}"))?;
            Ok(out)
        }

        fn exec(
            &self,
            nodes: &[Node],
            dot: &Value,
            vars: &mut Vec<(String, Value)>,
            out: &mut String,
        ) -> Result<(), String> {
            for node in nodes {
                match node {
                    Node::Text(t) => out.push_str(t),
                    Node::Out(pipe) => {
                        let v = self.pipe(pipe, dot, vars)?;
                        if pipe.vars.is_empty() {
                            out.push_str(&print(&v)?);
                        }
                    }
                    Node::Cond(branches, otherwise) => {
                        let mark = vars.len();
                        let mut taken = false;
                        for (with, pipe, body) in branches {
                            let v = self.pipe(pipe, dot, vars)?;
                            if truthy(&v) {
                                self.exec(body, if *with { &v } else { dot }, vars, out)?;
                                taken = true;
                                break;
                            }
                        }
                        if !taken {
                            self.exec(otherwise, dot, vars, out)?;
                        }
                        vars.truncate(mark);
                    }
                    Node::Range(pipe, body, otherwise) => {
                        let mark = vars.len();
                        let over = self.pipe(
                            &Pipe {
                                vars: Vec::new(),
                                ..pipe.clone()
                            },
                            dot,
                            vars,
                        )?;
                        let items: Vec<(Value, Value)> = match &over {
                            Value::Null => Vec::new(),
                            Value::Sequence(s) => s
                                .iter()
                                .enumerate()
                                .map(|(i, v)| (Value::Number((i as u64).into()), v.clone()))
                                .collect(),
                            Value::Mapping(m) => {
                                let mut entries: Vec<(Value, Value)> =
                                    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                                entries.sort_by_key(|(k, _)| print(k).unwrap_or_default());
                                entries
                            }
                            v => return Err(format!("range over {v:?}")),
                        };
                        if items.is_empty() {
                            self.exec(otherwise, dot, vars, out)?;
                        }
                        for (key, item) in items {
                            match pipe.vars.as_slice() {
                                [] => {}
                                [v] => vars.push((v.clone(), item.clone())),
                                [k, v] => {
                                    vars.push((k.clone(), key));
                                    vars.push((v.clone(), item.clone()));
                                }
                                _ => return Err("range: too many variables".to_owned()),
                            }
                            self.exec(body, &item, vars, out)?;
                            vars.truncate(mark);
                        }
                    }
                }
            }
            Ok(())
        }

        fn pipe(
            &self,
            pipe: &Pipe,
            dot: &Value,
            vars: &mut Vec<(String, Value)>,
        ) -> Result<Value, String> {
            let mut value = None;
            for cmd in &pipe.cmds {
                value = Some(self.command(cmd, value, dot, vars)?);
            }
            let value = value.unwrap_or(Value::Null);
            match (pipe.vars.as_slice(), pipe.declare) {
                ([], _) => {}
                ([name], true) => vars.push((name.clone(), value.clone())),
                ([name], false) => {
                    let slot = vars
                        .iter_mut()
                        .rev()
                        .find(|(n, _)| n == name)
                        .ok_or_else(|| format!("undefined variable {name}"))?;
                    slot.1 = value.clone();
                }
                _ => return Err("two variables outside range".to_owned()),
            }
            Ok(value)
        }

        fn arg(
            &self,
            arg: &Arg,
            dot: &Value,
            vars: &mut Vec<(String, Value)>,
        ) -> Result<Value, String> {
            let (base, chain) = match arg {
                Arg::Lit(v) => return Ok(v.clone()),
                Arg::Func(f) => return self.call(f, Vec::new()),
                Arg::Field(chain) => (dot.clone(), chain),
                Arg::Var(name, chain) => (
                    vars.iter()
                        .rev()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                        .ok_or_else(|| format!("undefined variable {name}"))?,
                    chain,
                ),
                Arg::Sub(pipe, chain) => (self.pipe(pipe, dot, vars)?, chain),
            };
            chain.iter().try_fold(base, |v, f| field(&v, f))
        }

        fn command(
            &self,
            cmd: &[Arg],
            piped: Option<Value>,
            dot: &Value,
            vars: &mut Vec<(String, Value)>,
        ) -> Result<Value, String> {
            let Some(Arg::Func(name)) = cmd.first() else {
                return match (cmd, piped) {
                    ([arg], None) => self.arg(arg, dot, vars),
                    _ => Err(format!("{cmd:?} is not a function")),
                };
            };
            let mut args = Vec::new();
            // `and` and `or` stop at the first argument that decides.
            if name == "and" || name == "or" {
                let mut last = Value::Null;
                for a in &cmd[1..] {
                    last = self.arg(a, dot, vars)?;
                    if truthy(&last) != (name == "and") {
                        return Ok(last);
                    }
                }
                return Ok(last);
            }
            for a in &cmd[1..] {
                args.push(self.arg(a, dot, vars)?);
            }
            args.extend(piped);
            self.call(name, args)
        }

        /// The function `name` (Go's or Sprig's, as Helm has them) on `args`.
        fn call(&self, name: &str, args: Vec<Value>) -> Result<Value, String> {
            let s = |v: String| Ok(Value::String(v));
            let arity = |n: usize| {
                if args.len() == n {
                    Ok(())
                } else {
                    Err(format!("{name} takes {n} arguments, got {args:?}"))
                }
            };
            match name {
                "include" => {
                    arity(2)?;
                    let template = print(&args[0])?;
                    let body = self
                        .defines
                        .get(&template)
                        .ok_or_else(|| format!("no template {template:?} to include"))?;
                    let mut out = String::new();
                    let mut vars = vec![("$".to_owned(), args[1].clone())];
                    self.exec(body, &args[1], &mut vars, &mut out)?;
                    s(out)
                }
                "default" => {
                    arity(2)?;
                    Ok(if truthy(&args[1]) {
                        args[1].clone()
                    } else {
                        args[0].clone()
                    })
                }
                "required" => {
                    arity(2)?;
                    if args[1].is_null() || args[1].as_str() == Some("") {
                        return Err(print(&args[0])?);
                    }
                    Ok(args[1].clone())
                }
                "fail" => {
                    arity(1)?;
                    Err(print(&args[0])?)
                }
                "dict" => {
                    let mut m = Mapping::new();
                    for pair in args.chunks(2) {
                        m.insert(pair[0].clone(), pair.get(1).cloned().unwrap_or(Value::Null));
                    }
                    Ok(Value::Mapping(m))
                }
                "list" => Ok(Value::Sequence(args)),
                "quote" => s(args
                    .iter()
                    .filter(|a| !a.is_null())
                    .map(|a| print(a).map(|t| serde_json::Value::String(t).to_string()))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(" ")),
                "toYaml" => {
                    arity(1)?;
                    let text =
                        serde_yaml_ng::to_string(&sorted(&args[0])).map_err(|e| e.to_string())?;
                    s(text.trim_end_matches('\n').to_owned())
                }
                "indent" | "nindent" => {
                    arity(2)?;
                    let pad =
                        " ".repeat(usize::try_from(int(&args[0])?).map_err(|e| e.to_string())?);
                    let text = format!(
                        "{pad}{}",
                        print(&args[1])?.replace('\n', &format!("\n{pad}"))
                    );
                    s(if name == "nindent" {
                        format!("\n{text}")
                    } else {
                        text
                    })
                }
                "trim" => {
                    arity(1)?;
                    s(print(&args[0])?.trim().to_owned())
                }
                "trunc" => {
                    arity(2)?;
                    let n = usize::try_from(int(&args[0])?).map_err(|e| e.to_string())?;
                    s(print(&args[1])?.chars().take(n).collect())
                }
                "trimSuffix" => {
                    arity(2)?;
                    let text = print(&args[1])?;
                    s(text
                        .strip_suffix(&print(&args[0])?)
                        .unwrap_or(&text)
                        .to_owned())
                }
                "replace" => {
                    arity(3)?;
                    s(print(&args[2])?.replace(&print(&args[0])?, &print(&args[1])?))
                }
                "printf" => {
                    let mut parts = print(&args[0])?
                        .split("%s")
                        .map(str::to_owned)
                        .collect::<Vec<_>>();
                    if parts.len() != args.len() || parts.iter().any(|p| p.contains('%')) {
                        return Err(format!("printf {args:?}: only %s is supported"));
                    }
                    let mut text = parts.remove(0);
                    for (part, arg) in parts.iter().zip(&args[1..]) {
                        text.push_str(&print(arg)?);
                        text.push_str(part);
                    }
                    s(text)
                }
                "not" => {
                    arity(1)?;
                    Ok(Value::Bool(!truthy(&args[0])))
                }
                "eq" => {
                    arity(2)?;
                    Ok(Value::Bool(args[0] == args[1]))
                }
                "add" => Ok(Value::Number(
                    args.iter().map(int).sum::<Result<i64, _>>()?.into(),
                )),
                "hasKey" => {
                    arity(2)?;
                    Ok(Value::Bool(
                        args[0]
                            .as_mapping()
                            .is_some_and(|m| m.contains_key(&args[1])),
                    ))
                }
                "index" => {
                    let (map, keys) = args.split_first().ok_or("index of nothing")?;
                    keys.iter().try_fold(map.clone(), |v, k| match &v {
                        Value::Mapping(m) => Ok(m.get(k).cloned().unwrap_or(Value::Null)),
                        _ => Err(format!("index of {v:?}")),
                    })
                }
                // No cluster to look up, as under `helm template`.
                "lookup" => Ok(Value::Mapping(Mapping::new())),
                // Not random: the same token on every render.
                "randAlphaNum" => {
                    arity(1)?;
                    s("r".repeat(usize::try_from(int(&args[0])?).map_err(|e| e.to_string())?))
                }
                "b64enc" => {
                    use base64::Engine;
                    arity(1)?;
                    s(base64::engine::general_purpose::STANDARD.encode(print(&args[0])?))
                }
                "sha256sum" => {
                    arity(1)?;
                    let digest = aws_lc_rs::digest::digest(
                        &aws_lc_rs::digest::SHA256,
                        print(&args[0])?.as_bytes(),
                    );
                    s(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
                }
                _ => Err(format!("the function {name} is not supported here")),
            }
        }
    }
}
