//! The Helm chart, rendered by real Helm (the oldest and the newest release it supports) with
//! its defaults and with every values file of `charts/cftunnel/ci/`, against the code it
//! deploys and the Kubernetes API: `helm lint --strict` passes; every object is valid for the
//! oldest and newest Kubernetes the chart supports (`kubernetes-validate --strict`); the CRD is
//! the one the controller defines, and structural; the roles grant exactly the calls the
//! runtime makes; the controller accepts the arguments the chart passes and the proxy the
//! settings, as the values mean them; the shared pool's NetworkPolicy admits whom the
//! controller's planes admit; every value exists in `values.yaml`, its schema and the README.
//!
//! The tools are found as `chart/tools.rs` says; without them the tests that need them skip,
//! saying so, except under CI.

#[path = "chart/alerts.rs"]
mod alerts;
#[path = "chart/controller.rs"]
mod controller;
#[path = "chart/files.rs"]
mod files;
#[path = "chart/isolation.rs"]
mod isolation;
#[path = "chart/ownership.rs"]
mod ownership;
#[path = "chart/pods.rs"]
mod pods;
#[path = "chart/pool.rs"]
mod pool;
#[path = "chart/rendering.rs"]
mod rendering;
#[path = "chart/text.rs"]
mod text;
#[path = "chart/tools.rs"]
mod tools;
#[path = "chart/tracing.rs"]
mod tracing;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cftunnel_controller::cli::{Cli, Command, RunArgs};
use cftunnel_controller::runtime::RuntimeOptions;
use cftunnel_controller::translate::Snapshot;
use cftunnel_controller::{manifest, render};
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml_ng::Value;
use tools::{tools, Release, Tools};

/// The release namespace of the rendering checks.
const NAMESPACE: &str = "cf-system";
/// The release name of the rendering checks.
const RELEASE: &str = "cf";
/// API groups of objects the chart renders whose schemas come with CRDs, not with Kubernetes:
/// Gateway API's (installed before the chart) and the Prometheus Operator's. The tests check
/// those objects against the code and the chart's other objects instead.
const CRD_GROUPS: &[&str] = &["gateway.networking.k8s.io/", "monitoring.coreos.com/"];

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/cftunnel")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The values files of `ci/`, by name.
fn values_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(chart().join("ci"))
        .expect("ci/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-values.yaml"))
        .collect();
    names.sort();
    assert!(names.len() > 1, "{names:?}");
    names
}

/// The chart's templates, by file name.
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

/// The oldest and the newest Kubernetes release of `kubeVersion` in Chart.yaml
/// (`>=1.A.0-0 <1.B.0-0`: 1.A.0 and 1.(B-1).0).
fn kube_versions() -> (String, String) {
    let meta = yaml(&chart().join("Chart.yaml"));
    let range = meta["kubeVersion"].as_str().expect("kubeVersion");
    let re = regex::Regex::new(r"^>=\s*(\d+)\.(\d+)\.0-0\s+<\s*(\d+)\.(\d+)\.0-0$").expect("regex");
    let c = re
        .captures(range)
        .unwrap_or_else(|| panic!("kubeVersion {range:?} is not `>=1.A.0-0 <1.B.0-0`"));
    let n = |i: usize| c[i].parse::<u32>().expect("a number");
    (
        format!("{}.{}.0", n(1), n(2)),
        format!("{}.{}.0", n(3), n(4) - 1),
    )
}

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

/// The values a render of `file` (in `ci/`) with `overrides` over it reads.
fn values(file: &str, overrides: &str) -> Value {
    let mut values = yaml(&chart().join("values.yaml"));
    merge(&mut values, yaml(&chart().join("ci").join(file)));
    let over: Value = serde_yaml_ng::from_str(overrides).expect("overrides are YAML");
    if !over.is_null() {
        merge(&mut values, over);
    }
    values
}

/// The value at a dotted path.
fn at<'a>(values: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .try_fold(values, |v, key| v.get(key))
        .unwrap_or_else(|| panic!("no value {path}"))
}

fn string(values: &Value, path: &str) -> String {
    match at(values, path) {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        v => panic!("{path}: {v:?} is not a scalar"),
    }
}

/// The objects Helm renders.
struct Rendered {
    docs: Vec<Value>,
}

impl Rendered {
    /// The documents of `text`, a multi-document YAML stream.
    fn parse(text: &str) -> Self {
        let docs = serde_yaml_ng::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{e}\n{text}")))
            .filter(|doc| !doc.is_null())
            .collect();
        Self { docs }
    }

    fn all<T: DeserializeOwned>(&self, kind: &str) -> Vec<T> {
        self.docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some(kind))
            .map(|d| serde_yaml_ng::from_value(d.clone()).unwrap_or_else(|e| panic!("{kind}: {e}")))
            .collect()
    }

    /// The object of `kind` named `name`, typed.
    fn get<T: DeserializeOwned>(&self, kind: &str, name: &str) -> Option<T> {
        self.docs
            .iter()
            .find(|d| {
                d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
            })
            .map(|d| {
                serde_yaml_ng::from_value(d.clone())
                    .unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
            })
    }

    fn one<T: DeserializeOwned>(&self, kind: &str, name: &str) -> T {
        self.get(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", self.names()))
    }

    fn raw(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| {
                d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", self.names()))
    }

    fn names(&self) -> Vec<String> {
        self.docs
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["kind"].as_str().unwrap_or("?"),
                    d["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }
}

/// `file` (in `ci/`) with `overrides`, rendered by the newest Helm for the newest Kubernetes,
/// release `release` in `namespace`; or Helm's error.
fn render_as(
    tools: &Tools,
    release: &str,
    namespace: &str,
    file: &str,
    overrides: &str,
) -> Result<Rendered, String> {
    let (_, newest) = kube_versions();
    tools
        .helm
        .template(
            &chart(),
            &Release {
                name: release,
                namespace,
                values_files: vec![chart().join("ci").join(file)],
                values: overrides,
                kube_version: &newest,
            },
        )
        .map(|text| Rendered::parse(&text))
}

/// `file` (in `ci/`) with `overrides`, then `set` as on a command line (`--set=KEY=VALUE`,
/// `--set-string=KEY=VALUE`), rendered by the newest Helm for Kubernetes `kube_version`: the
/// manifests, or Helm's error.
fn render_set(
    tools: &Tools,
    file: &str,
    overrides: &str,
    set: &[&str],
    kube_version: &str,
) -> Result<String, String> {
    tools.helm.template_with(
        &chart(),
        &Release {
            name: RELEASE,
            namespace: NAMESPACE,
            values_files: vec![chart().join("ci").join(file)],
            values: overrides,
            kube_version,
        },
        set,
    )
}

/// Whether `kubernetes-validate --strict` takes `manifests` for Kubernetes `kube_version`, all
/// but the objects of [`CRD_GROUPS`]; what it said otherwise.
fn valid_for(tools: &Tools, manifests: &str, kube_version: &str) -> Result<(), String> {
    let unknown = tools.validate(manifests, kube_version)?;
    match unknown.iter().find(|kind| {
        let api_version = kind.split_once(' ').map(|(_, v)| v).unwrap_or_default();
        !CRD_GROUPS.iter().any(|g| api_version.starts_with(g))
    }) {
        Some(kind) => Err(format!("no Kubernetes {kube_version} schema for {kind}")),
        None => Ok(()),
    }
}

fn render(tools: &Tools, file: &str, overrides: &str) -> Rendered {
    render_as(tools, RELEASE, NAMESPACE, file, overrides)
        .unwrap_or_else(|e| panic!("{file} with {overrides:?}: {e}"))
}

fn controller_name(release: &str) -> String {
    format!("{release}-controller")
}

/// The name of the release's cluster-wide object `name` (`controller`, `hostname-ownership`):
/// its namespace's, so that releases of one name in two namespaces do not share it.
fn cluster_name(release: &str, namespace: &str, name: &str) -> String {
    format!("{namespace}.{release}-{name}")
}

fn pool_name(release: &str) -> String {
    format!("{release}-proxy")
}

fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod spec")
}

fn container(deployment: &Deployment) -> &Container {
    let pod = pod_spec(deployment);
    assert_eq!(pod.containers.len(), 1, "one container");
    &pod.containers[0]
}

fn env<'a>(container: &'a Container, name: &str) -> Option<&'a EnvVar> {
    container.env.iter().flatten().find(|e| e.name == name)
}

/// The Secret and key an environment variable is read from.
fn secret_key(container: &Container, name: &str) -> (String, String) {
    let key = env(container, name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{name} from a Secret"));
    (key.name.clone(), key.key.clone())
}

fn selector_labels(deployment: &Deployment) -> BTreeMap<String, String> {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .expect("matchLabels")
}

fn selector(labels: BTreeMap<String, String>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    })
}

/// A map of strings (labels, annotations); none when absent.
fn label_map(value: &Value) -> BTreeMap<String, String> {
    if value.is_null() {
        return BTreeMap::new();
    }
    serde_yaml_ng::from_value(value.clone()).expect("string labels")
}

/// The controller's `run` arguments as the chart passes them, parsed by the controller, its
/// namespace set as the Deployment's downward API sets it.
fn controller_run(deployment: &Deployment) -> RunArgs {
    let container = container(deployment);
    let namespace = env(container, "POD_NAMESPACE")
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
    run.controller_namespace = deployment.metadata.namespace.clone().expect("a namespace");
    *run
}

fn options(run: &RunArgs) -> RuntimeOptions {
    run.options()
        .unwrap_or_else(|e| panic!("the controller takes its arguments: {e}"))
}

/// The peers of the only ingress rule of `policy`, which admits `port` alone.
fn ingress_peers(policy: &NetworkPolicy, port: i32) -> Vec<NetworkPolicyPeer> {
    let rules = policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("ingress rules");
    assert_eq!(rules.len(), 1, "one rule");
    let rule = &rules[0];
    assert_eq!(
        rule.ports.as_deref(),
        Some(
            &[NetworkPolicyPort {
                port: Some(IntOrString::Int(port)),
                protocol: Some("TCP".to_owned()),
                end_port: None,
            }][..]
        )
    );
    rule.from.clone().expect("peers")
}

/// The pool's config port: its container's port that its Service and probes name.
fn config_port(rendered: &Rendered) -> i32 {
    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    let service: Service = rendered.one("Service", &pool_name(RELEASE));
    let main = container(&pool);
    let ports = service.spec.and_then(|s| s.ports).expect("Service ports");
    assert_eq!(ports.len(), 1, "the config port alone");
    let Some(IntOrString::String(name)) = ports[0].target_port.clone() else {
        panic!("the Service targets a named port")
    };
    for probe in [&main.readiness_probe, &main.liveness_probe] {
        let port = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| h.port.clone());
        assert_eq!(port, Some(IntOrString::String(name.clone())));
    }
    let port = main
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name.as_str()))
        .unwrap_or_else(|| panic!("the container has port {name}"))
        .container_port;
    assert_eq!(ports[0].port, port, "the Service's port is the container's");
    port
}

/// The config-port peers of a dedicated plane the controller renders with `options`, and its
/// autoscaler.
fn plane(options: &RuntimeOptions) -> render::DataPlane {
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
    render::render(gateway, config, &credentials, &options.render).expect("the plane renders")
}
