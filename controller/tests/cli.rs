//! The command line: `translate` and `render`, run as a binary on fixtures, and `run`'s flags.

use std::process::Command;

use cftunnel_controller::cli::{Cli, Command as CliCommand};
use cftunnel_controller::runtime::RuntimeOptions;
use cftunnel_controller::translate::ExternalNameBackends;
use clap::Parser;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use cftunnel_config::{Backend, Config};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/shop.yaml");

fn translate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .arg("translate")
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn translate_prints_the_shared_plane_config_and_conditions() {
    let out = translate(&["-f", FIXTURE]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Config = serde_json::from_slice(&out.stdout).expect("stdout is a config document");
    assert_eq!(
        config.rules.len(),
        2,
        "the rule with a broken regex is dropped; the listener hostname gets its 404 rule"
    );
    let isolation = &config.rules[1];
    assert_eq!(
        (isolation.hostnames.clone(), isolation.unavailable_status),
        (vec!["*.example.com".to_owned()], Some(404))
    );
    let rule = &config.rules[0];
    assert_eq!(rule.hostnames, vec!["shop.example.com".to_owned()]);
    assert_eq!(rule.name.as_deref(), Some("shop/storefront/api"));
    let backend = |url: &str, weight: u32, unavailable: Option<u16>| Backend {
        url: url.to_owned(),
        weight,
        unavailable_status: unavailable,
        ..Backend::default()
    };
    assert_eq!(
        rule.backends,
        vec![
            backend("http://10.0.0.7:8080", 3, None),
            backend("http://10.0.0.8:8080", 3, None),
            backend("http://legacy-api.shop.svc.cluster.local:80", 2, Some(500)),
        ]
    );

    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in [
        "GatewayClass cloudflare-tunnel: Accepted=True (Accepted)",
        "Gateway shop/edge (shared): Accepted=True (Accepted); Programmed=True (Programmed)",
        "  listener web: attachedRoutes=1;",
        "HTTPRoute shop/storefront",
        "ResolvedRefs=False (BackendNotFound): spec.rules[0].backendRefs[1]: Service shop/legacy-api not found",
        "PartiallyInvalid=True (UnsupportedValue): dropped rules: spec.rules[1].matches[0].path: regular expression does not compile: error: unclosed character class",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in:\n{stderr}");
    }
}

/// The whole document, byte for byte: the translation is deterministic. After an intended
/// change, regenerate with
/// `cargo run -p cftunnel-controller -- translate -f controller/tests/fixtures/shop.yaml > controller/tests/golden/shop.json`.
#[test]
fn translate_output_matches_the_golden_file() {
    let out = translate(&["-f", FIXTURE]);
    assert!(out.status.success());
    let golden = include_str!("golden/shop.json");
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden);
}

#[test]
fn translate_of_a_named_gateway_and_a_folder() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let out = translate(&["-f", dir, "--gateway", "shop/edge"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Config = serde_json::from_slice(&out.stdout).expect("stdout is a config document");
    assert_eq!(config.rules.len(), 2);
}

#[test]
fn translate_prints_every_plane_on_request() {
    let out = translate(&["-f", FIXTURE, "--all-planes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let planes: std::collections::BTreeMap<String, Config> =
        serde_json::from_slice(&out.stdout).expect("stdout maps planes to configs");
    assert_eq!(planes.keys().collect::<Vec<_>>(), vec!["shared"]);
    assert_eq!(planes["shared"].rules.len(), 2);

    let out = translate(&["-f", FIXTURE, "--all-planes", "--gateway", "shop/edge"]);
    assert!(
        !out.status.success(),
        "--all-planes and --gateway exclude each other"
    );
}

#[test]
fn translate_refuses_an_unknown_gateway_and_unowned_manifests() {
    let out = translate(&["-f", FIXTURE, "--gateway", "shop/nope"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Gateway shop/nope is not in the manifests")
    );

    let out = translate(&["-f", FIXTURE, "--controller-name", "example.com/other"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --gateway-class-name or --gateway"));

    let out = translate(&["-f", FIXTURE, "--gateway", "not-a-name"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAMESPACE/NAME"));
}

const TENANT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tenant.yaml");

fn controller(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .env_remove("PROXY_IMAGE")
        .args(args)
        .output()
        .expect("the binary runs")
}

#[test]
fn render_prints_the_data_plane_in_apply_order_and_the_address() {
    let out = controller(&[
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/edge",
        "--proxy-image",
        "cftunnel-proxy:1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "Gateway tenant-a/edge: address 6ff42ae2-765d-4adf-8112-31c55c1551ef.cfargotunnel.com"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut kinds = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&stdout) {
        let value = serde_yaml_ng::Value::deserialize(doc).expect("each document is YAML");
        let field = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_owned();
        kinds.push((field("apiVersion"), field("kind"), name));
    }
    let expected = [
        ("v1", "Secret", "cf-proxy-edge-auth"),
        ("v1", "Service", "cf-proxy-edge-config"),
        ("networking.k8s.io/v1", "NetworkPolicy", "cf-proxy-edge"),
        ("apps/v1", "Deployment", "cf-proxy-edge"),
        ("autoscaling/v2", "HorizontalPodAutoscaler", "cf-proxy-edge"),
    ]
    .map(|(a, k, n)| (a.to_owned(), k.to_owned(), n.to_owned()));
    assert_eq!(kinds, expected);
    // Typed, the documents are the Kubernetes objects they claim to be.
    let mut docs = serde_yaml_ng::Deserializer::from_str(&stdout).skip(3);
    let deployment =
        k8s_openapi::api::apps::v1::Deployment::deserialize(docs.next().expect("a Deployment"))
            .expect("a valid Deployment");
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec");
    assert_eq!(pod.containers[0].image.as_deref(), Some("cftunnel-proxy:1"));
}

#[test]
fn render_refuses_what_the_gateway_condition_would_report() {
    let run = |args: &[&str]| {
        let out = controller(args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["render", "-f", TENANT, "--gateway", "tenant-a/edge"]);
    assert!(
        err.contains("no proxy image: set spec.image of GatewayConfig tenant-a/edge-config or the controller's --proxy-image"),
        "{err}"
    );
    let err = run(&[
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/shared",
        "--proxy-image",
        "p",
    ]);
    assert!(err.contains("the shared data plane serves it"), "{err}");
    let err = run(&[
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/nope",
        "--proxy-image",
        "p",
    ]);
    assert!(
        err.contains("Gateway tenant-a/nope is not in the manifests"),
        "{err}"
    );
}

/// The peers of the one ingress rule of the NetworkPolicy `render` prints for tenant-a/edge.
fn rendered_peers(extra: &[&str]) -> Vec<NetworkPolicyPeer> {
    let mut args = vec![
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/edge",
        "--proxy-image",
        "p",
    ];
    args.extend_from_slice(extra);
    let out = controller(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let policy = serde_yaml_ng::Deserializer::from_str(&stdout)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).expect("each document is YAML"))
        .find(|v| v.get("kind").and_then(|k| k.as_str()) == Some("NetworkPolicy"))
        .expect("a NetworkPolicy");
    let policy: NetworkPolicy = serde_yaml_ng::from_value(policy).expect("a valid NetworkPolicy");
    let mut rules = policy.spec.and_then(|s| s.ingress).expect("ingress rules");
    assert_eq!(rules.len(), 1);
    rules.remove(0).from.expect("peers")
}

fn labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        match_expressions: None,
    })
}

#[test]
fn render_admits_the_controllers_pods_by_their_labels_and_the_monitoring_namespaces() {
    // By default: the pods labelled as the chart labels the controller's, in its namespace.
    assert_eq!(
        rendered_peers(&[]),
        vec![NetworkPolicyPeer {
            namespace_selector: labels(&[("kubernetes.io/metadata.name", "cftunnel-system")]),
            pod_selector: labels(&[("app.kubernetes.io/name", "cftunnel-controller")]),
            ip_block: None,
        }]
    );
    assert_eq!(
        rendered_peers(&[
            "--controller-namespace",
            "cf",
            "--controller-pod-label",
            "app.kubernetes.io/instance=cf,app.kubernetes.io/name=cftunnel-controller",
            "--monitoring-namespace-label",
            "team=obs",
        ]),
        vec![
            NetworkPolicyPeer {
                namespace_selector: labels(&[("kubernetes.io/metadata.name", "cf")]),
                pod_selector: labels(&[
                    ("app.kubernetes.io/instance", "cf"),
                    ("app.kubernetes.io/name", "cftunnel-controller"),
                ]),
                ip_block: None,
            },
            NetworkPolicyPeer {
                namespace_selector: labels(&[("team", "obs")]),
                pod_selector: None,
                ip_block: None,
            },
        ]
    );
    // A Prometheus in the controller's namespace: its pods, and only them, in that namespace.
    assert_eq!(
        rendered_peers(&[
            "--controller-namespace",
            "cf",
            "--monitoring-pod-label",
            "app.kubernetes.io/name=prometheus,app.kubernetes.io/instance=k8s",
            "--monitoring-pod-label",
            "team=obs",
        ]),
        vec![
            NetworkPolicyPeer {
                namespace_selector: labels(&[("kubernetes.io/metadata.name", "cf")]),
                pod_selector: labels(&[("app.kubernetes.io/name", "cftunnel-controller")]),
                ip_block: None,
            },
            NetworkPolicyPeer {
                namespace_selector: labels(&[("kubernetes.io/metadata.name", "cf")]),
                pod_selector: labels(&[
                    ("app.kubernetes.io/instance", "k8s"),
                    ("app.kubernetes.io/name", "prometheus"),
                    ("team", "obs"),
                ]),
                ip_block: None,
            },
        ]
    );
}

/// The options `run` takes from `args`; panics if they do not parse or are refused.
fn run_options(args: &[&str]) -> RuntimeOptions {
    let cli = Cli::try_parse_from(["cftunnel-controller", "run"].iter().chain(args))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let CliCommand::Run(run) = cli.command else {
        panic!("not the run command")
    };
    run.options().expect("options")
}

#[test]
fn run_takes_the_monitoring_pod_labels_from_flags_or_the_environment() {
    let selector = |args: &[&str]| run_options(args).render.monitoring_pod_selector;
    assert_eq!(
        selector(&[
            "--monitoring-pod-label=app.kubernetes.io/name=prometheus",
            "--monitoring-pod-label",
            "a=1,b=2"
        ]),
        labels(&[
            ("a", "1"),
            ("app.kubernetes.io/name", "prometheus"),
            ("b", "2")
        ])
    );
    if std::env::var_os("MONITORING_POD_LABELS").is_none() {
        assert_eq!(selector(&[]), None, "no such peer by default");
    }
    // The environment variable is read.
    let stderr = refused_run_env(
        "MONITORING_POD_LABELS",
        "app.kubernetes.io/name=prometheus,a",
    );
    assert!(
        stderr.contains("--monitoring-pod-label") && stderr.contains("expected KEY=VALUE"),
        "{stderr}"
    );
}

#[test]
fn run_takes_the_controller_pod_labels_from_flags_or_the_environment() {
    let labels = |args: &[&str]| run_options(args).render.controller_pod_labels;
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        labels(&[
            "--controller-pod-label=a=1",
            "--controller-pod-label",
            "b=2,c=3"
        ]),
        map(&[("a", "1"), ("b", "2"), ("c", "3")])
    );
    if std::env::var_os("CONTROLLER_POD_LABELS").is_none() {
        assert_eq!(
            labels(&[]),
            map(&[("app.kubernetes.io/name", "cftunnel-controller")])
        );
    }
    // The environment variable is read, and a label must be KEY=VALUE.
    let stderr = refused_run_env("CONTROLLER_POD_LABELS", "app.kubernetes.io/name");
    assert!(
        stderr.contains("--controller-pod-label") && stderr.contains("expected KEY=VALUE"),
        "{stderr}"
    );
}

#[test]
fn external_name_backends_come_from_the_flag_or_the_environment() {
    let admitted = |args: &[&str]| run_options(args).translate.external_name_backends;
    if std::env::var_os("EXTERNAL_NAME_BACKENDS").is_none() {
        assert_eq!(admitted(&[]), ExternalNameBackends::External);
    }
    assert_eq!(
        admitted(&["--external-name-backends=deny"]),
        ExternalNameBackends::Deny
    );
    assert_eq!(
        admitted(&["--external-name-backends", "any"]),
        ExternalNameBackends::Any
    );
    let err = run_error(&["--external-name-backends=allow"]).expect("refused");
    assert!(
        err.contains("--external-name-backends") && err.contains("deny, external, any"),
        "{err}"
    );
    // The environment variable is read.
    let stderr = refused_run_env("EXTERNAL_NAME_BACKENDS", "allow");
    assert!(stderr.contains("--external-name-backends"), "{stderr}");
}

/// Tunnel documents are read back every five minutes unless the flag says otherwise; never
/// continuously.
#[test]
fn the_tunnel_read_back_period_comes_from_its_flag() {
    let period = |args: &[&str]| run_options(args).tunnel_read_back;
    assert_eq!(period(&[]), std::time::Duration::from_secs(300));
    assert_eq!(
        period(&["--tunnel-read-back-seconds=60"]),
        std::time::Duration::from_secs(60)
    );
    let err = run_error(&["--tunnel-read-back-seconds=0"]).expect("refused");
    assert!(err.contains("--tunnel-read-back-seconds"), "{err}");
}

#[test]
fn translate_dials_external_names_as_the_flag_says() {
    let dir = std::env::temp_dir().join(format!("cftunnel-external-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("external.yaml");
    std::fs::write(
        &file,
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec:
  gatewayClassName: cf
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: a}
spec: {type: ExternalName, externalName: svc.b, ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: a}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: ext, port: 80}]}]
"#,
    )
    .expect("manifest written");
    let backend_of = |extra: &[&str]| {
        let path = file.to_string_lossy().into_owned();
        let mut args = vec!["-f", path.as_str()];
        args.extend_from_slice(extra);
        let out = translate(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let config: Config = serde_json::from_slice(&out.stdout).expect("config JSON");
        let rule = config
            .rules
            .iter()
            .find(|r| r.name.as_deref() == Some("a/r/0"))
            .expect("the route's rule");
        (
            rule.backends[0].url.clone(),
            rule.backends[0].unavailable_status,
        )
    };
    assert_eq!(backend_of(&[]), ("http://svc.b.:80".to_owned(), None));
    assert_eq!(
        backend_of(&["--external-name-backends=any"]),
        ("http://svc.b:80".to_owned(), None)
    );
    assert_eq!(backend_of(&["--external-name-backends=deny"]).1, Some(500));
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `run` says of `args`: the parse error, else the error of its options; `None` if both
/// pass.
fn run_error(args: &[&str]) -> Option<String> {
    match Cli::try_parse_from(["cftunnel-controller", "run"].iter().chain(args)) {
        Err(e) => Some(e.to_string()),
        Ok(Cli {
            command: CliCommand::Run(run),
        }) => run.options().err().map(|e| format!("{e:#}")),
        Ok(_) => panic!("not the run command"),
    }
}

/// `--plane-env` settings reach every dedicated plane's proxy, after the controller's own
/// tracing settings; names the render sets itself, or tracing's, are refused at start, naming
/// the setting.
#[test]
fn plane_settings_reach_every_plane_and_cannot_take_the_controllers() {
    let env = run_options(&[
        "--plane-env=TUNNEL_REGION=us",
        "--plane-env=RUST_LOG=info,cftunnel=debug",
        "--plane-env=PROXY_TUNNEL_POST_QUANTUM=true",
        "--otel-endpoint=http://collector:4318",
    ])
    .render
    .proxy_env;
    let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        names.first().is_some_and(|n| n.starts_with("OTEL_")),
        "{names:?}"
    );
    assert_eq!(
        env.iter()
            .filter(|(name, _)| !name.starts_with("OTEL_"))
            .cloned()
            .collect::<Vec<_>>(),
        [
            ("TUNNEL_REGION", "us"),
            ("RUST_LOG", "info,cftunnel=debug"),
            ("PROXY_TUNNEL_POST_QUANTUM", "true"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
    for (bad, says) in [
        (
            "TUNNEL_TOKEN=x",
            "TUNNEL_TOKEN is set by the controller for each plane",
        ),
        (
            "PROXY_AUTH_TOKEN=x",
            "PROXY_AUTH_TOKEN is set by the controller",
        ),
        (
            "PROXY_GRACE_PERIOD=5s",
            "PROXY_GRACE_PERIOD is set by the controller",
        ),
        (
            "PROXY_CONFIG_ADDR=:1",
            "PROXY_CONFIG_ADDR is set by the controller",
        ),
        (
            "OTEL_TRACES_SAMPLER=always_on",
            "from its own OTEL_* variables",
        ),
        ("TUNNEL_REGION", "expected NAME=VALUE"),
        ("1X=y", "is not an environment variable name"),
        ("A-B=y", "is not an environment variable name"),
    ] {
        let error = run_error(&[&format!("--plane-env={bad}")]).unwrap_or_default();
        assert!(
            error.contains("--plane-env") && error.contains(says),
            "{bad}: {error}"
        );
    }
}

/// The proxy container of the Deployment `render` prints for tenant-a/edge with `extra`; or
/// what `render` said when it failed.
fn rendered_proxy(extra: &[&str]) -> Result<k8s_openapi::api::core::v1::Container, String> {
    let mut args = vec![
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/edge",
        "--proxy-image",
        "p",
    ];
    args.extend_from_slice(extra);
    let out = controller(&args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deployment = serde_yaml_ng::Deserializer::from_str(&stdout)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).expect("each document is YAML"))
        .find(|v| v.get("kind").and_then(|k| k.as_str()) == Some("Deployment"))
        .expect("a Deployment");
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_yaml_ng::from_value(deployment).expect("a valid Deployment");
    let mut pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("a pod spec");
    Ok(pod.containers.remove(0))
}

/// `render` takes `--plane-env` as `run` does: the plane it prints runs its proxy with the
/// environment `run` gives that plane, and it refuses what `run` refuses, saying the same.
#[test]
fn render_takes_the_plane_settings_run_applies() {
    let flags = [
        "--plane-env=TUNNEL_REGION=us",
        "--plane-env=RUST_LOG=info,cftunnel=debug",
        "--plane-env=PROXY_TUNNEL_POST_QUANTUM=true",
    ];
    let printed = rendered_proxy(&flags).unwrap_or_else(|e| panic!("{e}"));
    // The plane `run` renders with the same flags, from the same manifests.
    let mut run_flags = vec!["--proxy-image=p"];
    run_flags.extend_from_slice(&flags);
    let options = run_options(&run_flags);
    let mut snapshot = cftunnel_controller::translate::Snapshot::default();
    let tenant = std::fs::read_to_string(TENANT).expect("the fixture");
    cftunnel_controller::manifest::load_into(&mut snapshot, &tenant, "tenant.yaml")
        .expect("the fixture loads");
    let gateway = snapshot
        .gateways
        .iter()
        .find(|g| g.metadata.name.as_deref() == Some("edge"))
        .expect("Gateway edge");
    let config = &snapshot.gateway_configs[0];
    let credentials =
        cftunnel_controller::render::resolve(gateway, config, &snapshot.secrets, "fresh")
            .expect("credentials");
    let applied =
        cftunnel_controller::render::render(gateway, config, &credentials, &options.render)
            .expect("the plane renders")
            .deployment;
    let applied = applied
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].env.clone())
        .expect("a pod spec");
    assert_eq!(printed.env, applied);
    let value = |name: &str| {
        printed
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value("TUNNEL_REGION").as_deref(), Some("us"));
    assert_eq!(value("RUST_LOG").as_deref(), Some("info,cftunnel=debug"));
    for (bad, says) in [
        (
            "TUNNEL_TOKEN=x",
            "TUNNEL_TOKEN is set by the controller for each plane",
        ),
        (
            "OTEL_TRACES_SAMPLER=always_on",
            "from its own OTEL_* variables",
        ),
        ("1X=y", "is not an environment variable name"),
    ] {
        let flag = format!("--plane-env={bad}");
        for (command, error) in [
            ("render", rendered_proxy(&[&flag]).err()),
            ("run", run_error(&[&flag])),
        ] {
            let error = error.unwrap_or_else(|| panic!("{command} takes {bad}"));
            assert!(
                error.contains("--plane-env") && error.contains(says),
                "{command}, {bad}: {error}"
            );
        }
    }
}

#[test]
fn label_flags_take_kubernetes_label_syntax_and_name_the_flag_and_the_bad_part() {
    let flags = [
        "--controller-pod-label",
        "--monitoring-namespace-label",
        "--monitoring-pod-label",
    ];
    for flag in flags {
        for good in [
            "team=",
            "team=obs",
            "a/b=c",
            "example.com/Name_1.x-y=Value_1.x-y",
            "a-b.c/d=e",
        ] {
            let arg = format!("{flag}={good}");
            assert_eq!(run_error(&[&arg]), None, "{arg}");
        }
        let long = "n".repeat(64);
        let long_prefix = format!("{}.com", "a".repeat(250));
        for (bad, part) in [
            ("team", "expected KEY=VALUE"),
            ("=obs", "empty"),
            ("-team=obs", "\"-team\""),
            ("team.=obs", "\"team.\""),
            ("te am=obs", "\"te am\""),
            ("a/b/c=d", "\"a/b/c\""),
            ("/name=x", "empty"),
            ("a/=x", "empty"),
            ("Example.com/name=x", "\"Example.com\""),
            ("example..com/name=x", "\"example..com\""),
            ("-example.com/name=x", "\"-example.com\""),
            (&format!("{long}=x"), "63"),
            (&format!("{long_prefix}/name=x"), "253"),
            ("team=obs!", "\"obs!\""),
            ("team=-obs", "\"-obs\""),
            ("team=a b", "\"a b\""),
            (&format!("team={long}"), "63"),
        ] {
            let arg = format!("{flag}={bad}");
            let err = run_error(&[&arg]).unwrap_or_else(|| panic!("{arg} is refused"));
            assert!(err.contains(flag) && err.contains(part), "{arg}: {err}");
        }
        // The same key twice: the same value is harmless, two values a mistake to report
        // rather than settle by the order of the flags.
        let same = [format!("{flag}=team=obs"), format!("{flag}=team=obs")];
        assert_eq!(run_error(&same.each_ref().map(String::as_str)), None);
        let twice = [format!("{flag}=team=obs"), format!("{flag}=team=dev")];
        let err = run_error(&twice.each_ref().map(String::as_str)).expect("refused");
        assert!(
            err.contains(flag)
                && err.contains("\"team\"")
                && err.contains("\"obs\"")
                && err.contains("\"dev\""),
            "{err}"
        );
    }
    // The environment variable is held to the same syntax, and a comma list to one value per
    // key.
    for (labels, part) in [
        (
            "app.kubernetes.io/name=cftunnel controller",
            "\"cftunnel controller\"",
        ),
        ("a=1,a=2", "\"a\""),
    ] {
        let stderr = refused_run_env("CONTROLLER_POD_LABELS", labels);
        assert!(
            stderr.contains("--controller-pod-label") && stderr.contains(part),
            "{labels}: {stderr}"
        );
    }
    // `render` takes the same flags the same way.
    let out = controller(&[
        "render",
        "-f",
        TENANT,
        "--gateway",
        "tenant-a/edge",
        "--proxy-image",
        "p",
        "--controller-pod-label",
        "a=1,a=2",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--controller-pod-label") && stderr.contains("\"a\""),
        "{stderr}"
    );
}

#[test]
fn crd_prints_the_gateway_config_definition() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use serde::Deserialize;
    // Every kind of the group by default, one document each.
    let all = controller(&["crd"]);
    assert!(all.status.success());
    let text = String::from_utf8_lossy(&all.stdout).into_owned();
    let names: Vec<String> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            CustomResourceDefinition::deserialize(doc)
                .expect("a CustomResourceDefinition")
                .metadata
                .name
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        names,
        [
            "gatewayconfigs.cf.k8s.lex.la",
            "accesspolicies.cf.k8s.lex.la",
            "externalbackends.cf.k8s.lex.la",
            "gatewayclassconfigs.cf.k8s.lex.la"
        ]
    );
    let policy: CustomResourceDefinition =
        serde_yaml_ng::from_slice(&controller(&["crd", "AccessPolicy"]).stdout)
            .expect("a CustomResourceDefinition");
    assert_eq!(policy.spec.names.kind, "AccessPolicy");

    let out = controller(&["crd", "GatewayConfig"]);
    assert!(out.status.success());
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_slice(&out.stdout).expect("a CustomResourceDefinition");
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("gatewayconfigs.cf.k8s.lex.la")
    );
    assert_eq!(crd.spec.names.kind, "GatewayConfig");
    assert_eq!(crd.spec.scope, "Namespaced");
    let version = &crd.spec.versions[0];
    assert_eq!(
        (version.name.as_str(), version.served, version.storage),
        ("v1alpha1", true, true)
    );
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .expect("a spec schema");
    assert_eq!(
        schema.required,
        Some(vec!["tunnelTokenSecretRef".to_owned()])
    );
    let fields: Vec<&String> = schema.properties.as_ref().expect("fields").keys().collect();
    for field in [
        "tunnelTokenSecretRef",
        "replicas",
        "image",
        "autoscaling",
        "authTokenSecretRef",
        "cloudflareCredentialsSecretRef",
        "resources",
        "access",
    ] {
        assert!(fields.iter().any(|f| *f == field), "{field} in {fields:?}");
    }
}

/// Starts `cftunnel-controller run` with `var=value` in its environment, expects it to refuse
/// to start, and returns what it said.
fn refused_run_env(var: &str, value: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .arg("run")
        .env(var, value)
        .output()
        .expect("the binary runs");
    assert!(!out.status.success(), "{var}={value} is refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
