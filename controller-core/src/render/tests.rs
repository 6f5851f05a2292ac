use cftunnel_config::Token;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::*;
use crate::manifest;
use crate::snapshot::{ObjectKey, Snapshot};

const TUNNEL_ID: &str = "6ff42ae2-765d-4adf-8112-31c55c1551ef";

fn token() -> String {
    let id = TUNNEL_ID.parse().expect("uuid");
    Token::new("account", b"a tunnel secret of some length".to_vec(), id).encode()
}

/// A namespace holding the documented example: Gateway `edge`, GatewayConfig `edge-config`,
/// the token Secret; `config` is the GatewayConfig's spec, `extra` more documents.
fn snapshot(config: &str, extra: &str) -> Snapshot {
    let text = format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: edge-tunnel-token, namespace: tenant-a}}
stringData: {{tunnel-token: "{token}\n"}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec: {config}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: tenant-a, uid: 0a7c0c3e-1}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure:
    labels: {{team: a, cf.k8s.lex.la/gateway: not-ours, cf.k8s.lex.la/pool: x}}
    annotations: {{owner: team-a, cf.k8s.lex.la/tunnel-before: 8c3b7d0e-0000-4000-8000-000000000000, sub.cf.k8s.lex.la/x: y, deployment.kubernetes.io/revision: "7", cluster-autoscaler.kubernetes.io/safe-to-evict: "true"}}
    parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}
  listeners: [{{name: https, port: 443, protocol: HTTPS}}]
{extra}"#,
        token = token()
    );
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &text, "test.yaml").expect("manifests parse");
    snapshot
}

const BASIC: &str = "{tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 3}";

fn settings() -> RenderSettings {
    RenderSettings {
        proxy_image: Some("registry.example/cftunnel-proxy:1.0".to_owned()),
        proxy_image_pull_policy: None,
        controller_namespace: "cf-system".to_owned(),
        controller_pod_labels: BTreeMap::from([
            ("app.kubernetes.io/instance".to_owned(), "cf".to_owned()),
            (
                "app.kubernetes.io/name".to_owned(),
                "cftunnel-controller".to_owned(),
            ),
        ]),
        monitoring_namespace_selector: None,
        monitoring_pod_selector: None,
        grace_period_seconds: 30,
        proxy_env: Vec::new(),
        network_policy: true,
    }
}

fn plane_with(s: &Snapshot, settings: &RenderSettings) -> Result<DataPlane, RenderError> {
    let credentials = resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh")?;
    render(
        &s.gateways[0],
        &s.gateway_configs[0],
        &credentials,
        settings,
    )
}

fn plane(config: &str, extra: &str) -> DataPlane {
    plane_with(&snapshot(config, extra), &settings()).expect("renders")
}

fn pod_spec(p: &DataPlane) -> &PodSpec {
    p.deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn container(p: &DataPlane) -> &Container {
    &pod_spec(p).containers[0]
}

fn env_secret(c: &Container, name: &str) -> (String, String) {
    let var = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} is set"));
    let r = var
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{name} comes from a Secret"));
    (r.name.clone(), r.key.clone())
}

fn pod_annotation(p: &DataPlane, key: &str) -> Option<String> {
    p.deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(key).cloned())
}

#[test]
fn the_documented_example_renders_the_documented_objects() {
    let p = plane(BASIC, "");
    assert_eq!(p.address, format!("{TUNNEL_ID}.cfargotunnel.com"));
    assert_eq!(p.deployment.metadata.name.as_deref(), Some("cf-proxy-edge"));
    assert_eq!(
        p.service.metadata.name.as_deref(),
        Some("cf-proxy-edge-config")
    );
    let secret = p.auth_secret.as_ref().expect("a token Secret is generated");
    assert_eq!(secret.metadata.name.as_deref(), Some("cf-proxy-edge-auth"));
    assert_eq!(
        secret.data.as_ref().and_then(|d| d.get("token")),
        Some(&ByteString(b"fresh".to_vec()))
    );
    assert!(p.autoscaler.is_none());

    let metas = [
        &p.deployment.metadata,
        &p.service.metadata,
        &p.network_policy.as_ref().expect("a NetworkPolicy").metadata,
        &secret.metadata,
    ];
    for m in metas {
        assert_eq!(m.namespace.as_deref(), Some("tenant-a"));
        let labels = m.labels.as_ref().expect("labels");
        // Infrastructure labels propagate, but cannot take over the plane's own label.
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(labels.get(GATEWAY_LABEL).map(String::as_str), Some("edge"));
        for (k, v) in [
            ("gateway.networking.k8s.io/gateway-name", "edge"),
            (
                "gateway.networking.k8s.io/gateway-class-name",
                "cloudflare-tunnel",
            ),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        let annotations = m.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get("owner").map(String::as_str), Some("team-a"));
        assert_tenant_keys_only(labels, annotations);
        let owner = &m.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Gateway", "edge", "0a7c0c3e-1")
        );
        assert_eq!(owner.controller, Some(true));
    }

    let spec = p.deployment.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let template = spec.template.metadata.as_ref().expect("template metadata");
    assert_eq!(
        template
            .labels
            .as_ref()
            .and_then(|l| l.get("team"))
            .map(String::as_str),
        Some("a")
    );
    assert_eq!(pod_annotation(&p, "owner").as_deref(), Some("team-a"));
    assert_tenant_keys_only(
        template.labels.as_ref().expect("template labels"),
        template.annotations.as_ref().expect("template annotations"),
    );
    // One selector for the Deployment, the Service and the NetworkPolicy.
    let selector = spec.selector.match_labels.clone().expect("selector");
    assert_eq!(
        p.service.spec.as_ref().and_then(|s| s.selector.clone()),
        Some(selector.clone())
    );
    assert_eq!(
        p.network_policy
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.pod_selector.as_ref())
            .and_then(|s| s.match_labels.clone()),
        Some(selector.clone())
    );
    for (k, v) in &selector {
        assert_eq!(template.labels.as_ref().and_then(|l| l.get(k)), Some(v));
    }
}

/// The Helm chart selects its shared pool's pods by `app.kubernetes.io/instance` and
/// `app.kubernetes.io/name`: a Gateway in the release namespace whose infrastructure labels
/// name the release must not put its plane's pods behind the pool's Service, budget, policies
/// and monitor. Other `app.kubernetes.io/` labels are the tenant's to set.
#[test]
fn infrastructure_labels_cannot_give_a_plane_the_shared_pools_labels() {
    let mut s = snapshot(BASIC, "");
    std::sync::Arc::make_mut(&mut s.gateways[0])
        .spec
        .infrastructure
        .as_mut()
        .and_then(|i| i.labels.as_mut())
        .expect("the Gateway has infrastructure labels")
        .extend(
            [
                ("app.kubernetes.io/instance", "cf"),
                ("app.kubernetes.io/name", "cftunnel-proxy-pool"),
                ("app.kubernetes.io/part-of", "billing"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
    let p = plane_with(&s, &settings()).expect("renders");
    let template = p
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .expect("template metadata");
    let carriers = [
        ("Deployment", &p.deployment.metadata.labels),
        ("pod template", &template.labels),
        ("Service", &p.service.metadata.labels),
        (
            "NetworkPolicy",
            &p.network_policy
                .as_ref()
                .expect("a NetworkPolicy")
                .metadata
                .labels,
        ),
    ];
    for (what, labels) in carriers {
        let labels = labels.as_ref().expect("labels");
        let get = |k: &str| labels.get(k).map(String::as_str);
        assert_eq!(get("team"), Some("a"), "{what}: {labels:?}");
        assert_eq!(
            get("app.kubernetes.io/part-of"),
            Some("billing"),
            "{what}: {labels:?}"
        );
        assert_eq!(
            get("app.kubernetes.io/instance"),
            None,
            "{what}: {labels:?}"
        );
        assert_eq!(
            get(PROXY_POD_LABEL.0),
            Some(PROXY_POD_LABEL.1),
            "{what}: {labels:?}"
        );
    }
}

/// A GatewayClass name may run to 253 characters, a label value to 63: the plane of a Gateway
/// of such a class still says which class it was rendered for, on every object and the pods,
/// so another installation cannot take it for one of its own.
#[test]
fn a_class_name_too_long_for_a_label_value_labels_the_plane_shortened() {
    let class = format!("{}.example.com", "tenant-isolation".repeat(6));
    assert!(class.len() > 63);
    let mut s = snapshot(BASIC, "");
    std::sync::Arc::make_mut(&mut s.gateways[0])
        .spec
        .gateway_class_name = class.clone();
    let p = plane_with(&s, &settings()).expect("renders");
    let template = p
        .deployment
        .spec
        .as_ref()
        .expect("spec")
        .template
        .metadata
        .clone();
    let metas = [
        &p.deployment.metadata,
        &p.service.metadata,
        &p.network_policy.as_ref().expect("a NetworkPolicy").metadata,
        &p.auth_secret.as_ref().expect("a token Secret").metadata,
        template.as_ref().expect("template metadata"),
    ];
    let expected = class_label(&class);
    assert_ne!(expected, class);
    assert!(expected.len() <= 63 && expected.starts_with("tenant-isolation"));
    for m in metas {
        let labels = m.labels.as_ref().expect("labels");
        assert_eq!(labels.get(CLASS_LABEL), Some(&expected), "{:?}", m.name);
    }
}

#[test]
fn the_pod_runs_the_proxy_as_the_contract_configures_it() {
    let p = plane(BASIC, "");
    let c = container(&p);
    assert_eq!(
        c.image.as_deref(),
        Some("registry.example/cftunnel-proxy:1.0")
    );
    assert_eq!(
        env_secret(c, "TUNNEL_TOKEN"),
        ("edge-tunnel-token".to_owned(), "tunnel-token".to_owned())
    );
    assert_eq!(
        env_secret(c, "PROXY_AUTH_TOKEN"),
        ("cf-proxy-edge-auth".to_owned(), "token".to_owned())
    );
    let value = |name: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value("PROXY_GRACE_PERIOD").as_deref(), Some("30s"));
    assert_eq!(value("PROXY_CONFIG_ADDR").as_deref(), Some(":8081"));
    let pod = pod_spec(&p);
    // The kubelet waits out the proxy's drain window before it kills.
    assert_eq!(pod.termination_grace_period_seconds, Some(45));
    let ready = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref());
    assert_eq!(ready.and_then(|g| g.path.as_deref()), Some("/readyz"));
    let live = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref());
    assert_eq!(live.and_then(|g| g.path.as_deref()), Some("/healthz"));
    let port = &c.ports.as_ref().expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("config"), 8081)
    );

    // The image named in the GatewayConfig wins over the controller's default.
    let p = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, image: own/proxy:2}",
        "",
    );
    assert_eq!(container(&p).image.as_deref(), Some("own/proxy:2"));
    assert_eq!(
        p.deployment.spec.as_ref().and_then(|s| s.replicas),
        Some(DEFAULT_REPLICAS)
    );
}

/// The pod runs as the image's numeric non-root user: it names no UID or GID, which OpenShift's
/// `restricted-v2` SCC (MustRunAsRange) refuses outside the namespace's range, and still
/// passes the `restricted` Pod Security Standard.
/// Without resources in the GatewayConfig the proxy requests some, so a node under memory
/// pressure does not evict it first, and is not limited; resources given are used as given.
#[test]
fn the_proxy_requests_resources_unless_the_config_sets_its_own() {
    let p = plane(BASIC, "");
    let resources = container(&p).resources.as_ref().expect("resources");
    let requests = resources.requests.as_ref().expect("requests");
    assert_eq!(requests["cpu"].0, "100m");
    assert_eq!(requests["memory"].0, "128Mi");
    assert_eq!(resources.limits, None);

    let given = BASIC.replace(
        "replicas: 3",
        "replicas: 3, resources: {limits: {memory: 96Mi}}",
    );
    assert_ne!(given, BASIC, "the config sets resources");
    let p = plane(&given, "");
    let resources = container(&p).resources.as_ref().expect("resources");
    assert_eq!(resources.requests, None);
    assert_eq!(
        resources.limits.as_ref().expect("limits")["memory"].0,
        "96Mi"
    );
}

#[test]
fn the_pod_runs_as_the_images_non_root_user_and_asks_for_no_uid() {
    let p = plane(BASIC, "");
    let pod = pod_spec(&p);
    assert_eq!(
        pod.security_context,
        Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        })
    );
    assert_eq!(
        container(&p).security_context,
        Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..SecurityContext::default()
        })
    );
}

#[test]
fn the_controllers_tracing_settings_reach_every_planes_proxy() {
    let names = |p: &DataPlane| -> Vec<String> {
        container(p)
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect()
    };
    let plain = plane(BASIC, "");
    assert!(
        !names(&plain).iter().any(|n| n.starts_with("OTEL_")),
        "none while the controller does not trace"
    );
    let traced = plane_with(
        &snapshot(BASIC, ""),
        &RenderSettings {
            proxy_env: vec![
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                    "http://c:4318".to_owned(),
                ),
                ("OTEL_TRACES_SAMPLER_ARG".to_owned(), "0.1".to_owned()),
            ],
            ..settings()
        },
    )
    .expect("renders");
    let c = container(&traced);
    let value = |name: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(
        value("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://c:4318")
    );
    assert_eq!(value("OTEL_TRACES_SAMPLER_ARG").as_deref(), Some("0.1"));
    assert_eq!(names(&traced)[..names(&plain).len()], names(&plain)[..]);
}

#[test]
fn the_service_is_headless_and_reaches_pods_before_they_are_ready() {
    let spec = plane(BASIC, "").service.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    let ports = spec.ports.expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, CONFIG_PORT);
}

#[test]
fn the_config_api_admits_only_the_controller_and_the_data_port_nothing() {
    let spec = plane(BASIC, "")
        .network_policy
        .and_then(|n| n.spec)
        .expect("spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let rules = spec.ingress.expect("ingress rules");
    assert_eq!(rules.len(), 1, "one rule: no other port is admitted");
    let ports = rules[0].ports.as_ref().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, Some(IntOrString::Int(8081)));
    let from = rules[0].from.as_ref().expect("peers");
    assert_eq!(from.len(), 1);
    // One peer with both selectors: the controller's pods, in the controller's namespace (a
    // pod selector alone would pick pods of the tenant's namespace), and not the other pods
    // there, such as the shared proxy pool.
    let controller = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                "cf-system".to_owned(),
            )])),
            match_expressions: None,
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(settings().controller_pod_labels),
            match_expressions: None,
        }),
        ip_block: None,
    };
    assert_eq!(from[0], controller);

    let mut with_monitoring = settings();
    let monitoring = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "monitoring".to_owned(),
            "yes".to_owned(),
        )])),
        match_expressions: None,
    };
    with_monitoring.monitoring_namespace_selector = Some(monitoring.clone());
    let p = plane_with(&snapshot(BASIC, ""), &with_monitoring).expect("renders");
    let rules = p
        .network_policy
        .and_then(|n| n.spec)
        .and_then(|s| s.ingress)
        .expect("rules");
    let from = rules[0].from.as_ref().expect("peers");
    assert_eq!(from.len(), 2);
    assert_eq!(from[0], controller, "the controller's peer is unchanged");
    // Every pod of the monitoring namespaces, where Prometheus scrapes from.
    let monitoring_namespaces = NetworkPolicyPeer {
        namespace_selector: Some(monitoring),
        ..NetworkPolicyPeer::default()
    };
    assert_eq!(from[1], monitoring_namespaces);

    // A Prometheus in the controller's namespace: its pods there, by their labels, as a peer
    // of their own (both selectors again), and still no other pod of that namespace.
    let prometheus = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "prometheus".to_owned(),
        )])),
        match_expressions: None,
    };
    let mut with_pods = with_monitoring.clone();
    with_pods.monitoring_pod_selector = Some(prometheus.clone());
    let monitoring_pods = NetworkPolicyPeer {
        namespace_selector: controller.namespace_selector.clone(),
        pod_selector: Some(prometheus),
        ip_block: None,
    };
    let peers = |settings: &RenderSettings| {
        let p = plane_with(&snapshot(BASIC, ""), settings).expect("renders");
        let mut rules = p
            .network_policy
            .and_then(|n| n.spec)
            .and_then(|s| s.ingress)
            .expect("rules");
        assert_eq!(rules.len(), 1);
        rules.remove(0).from.expect("peers")
    };
    assert_eq!(
        peers(&with_pods),
        [
            controller.clone(),
            monitoring_pods.clone(),
            monitoring_namespaces
        ]
    );
    with_pods.monitoring_namespace_selector = None;
    assert_eq!(peers(&with_pods), [controller, monitoring_pods]);
}

#[test]
fn without_configured_labels_the_config_api_admits_the_pods_the_chart_labels_as_the_controller() {
    let p = plane_with(
        &snapshot(BASIC, ""),
        &RenderSettings {
            proxy_image: Some("p".to_owned()),
            ..RenderSettings::default()
        },
    )
    .expect("renders");
    let rules = p
        .network_policy
        .and_then(|n| n.spec)
        .and_then(|s| s.ingress)
        .expect("rules");
    let peer = &rules[0].from.as_ref().expect("peers")[0];
    assert_eq!(
        peer.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref()),
        Some(&BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "cftunnel-controller".to_owned()
        )]))
    );
    assert_eq!(
        peer.namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|l| l.get("kubernetes.io/metadata.name"))
            .map(String::as_str),
        Some("cftunnel-system")
    );
}

#[test]
fn autoscaling_hands_the_replica_count_to_an_autoscaler_on_the_in_flight_gauge() {
    let p = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 5, autoscaling: {maxReplicas: 10}}",
        "",
    );
    assert_eq!(p.deployment.spec.as_ref().and_then(|s| s.replicas), None);
    let hpa = p.autoscaler.expect("an autoscaler");
    assert_eq!(hpa.metadata.name.as_deref(), Some("cf-proxy-edge"));
    // Labelled as every other object of the plane: the Gateway's, its own, the well-known ones.
    let labels = hpa.metadata.labels.as_ref().expect("labels");
    for (k, v) in [
        ("team", "a"),
        (GATEWAY_LABEL, "edge"),
        ("gateway.networking.k8s.io/gateway-name", "edge"),
        (
            "gateway.networking.k8s.io/gateway-class-name",
            "cloudflare-tunnel",
        ),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let annotations = hpa.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(annotations.get("owner").map(String::as_str), Some("team-a"));
    assert_tenant_keys_only(labels, annotations);
    assert_eq!(hpa.spec.scale_target_ref.kind, "Deployment");
    assert_eq!(hpa.spec.scale_target_ref.name, "cf-proxy-edge");
    assert_eq!(
        (hpa.spec.min_replicas, hpa.spec.max_replicas),
        (Some(2), 10)
    );
    let metric = &hpa.spec.metrics.expect("metrics")[0];
    assert_eq!(metric.type_, "Pods");
    let pods = metric.pods.as_ref().expect("pods metric");
    assert_eq!(pods.metric.name, IN_FLIGHT_METRIC);
    assert_eq!(pods.target.type_, "AverageValue");
    assert_eq!(pods.target.average_value, Some(Quantity("50".to_owned())));

    let hpa = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {minReplicas: 3, maxReplicas: 4, targetInflightPerPod: 20}}",
        "",
    )
    .autoscaler
    .expect("an autoscaler");
    assert_eq!((hpa.spec.min_replicas, hpa.spec.max_replicas), (Some(3), 4));
    let target = &hpa.spec.metrics.expect("metrics")[0];
    assert_eq!(
        target
            .pods
            .as_ref()
            .and_then(|p| p.target.average_value.clone()),
        Some(Quantity("20".to_owned()))
    );
    // A ceiling of one lowers the default floor with it.
    let hpa = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {maxReplicas: 1}}",
        "",
    )
    .autoscaler
    .expect("an autoscaler");
    assert_eq!((hpa.spec.min_replicas, hpa.spec.max_replicas), (Some(1), 1));

    let err = plane_with(
        &snapshot(
            "{tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {minReplicas: 5, maxReplicas: 4}}",
            "",
        ),
        &settings(),
    )
    .expect_err("contradicting bounds");
    assert_eq!(
        err.to_string(),
        "spec.autoscaling of GatewayConfig tenant-a/edge-config: minReplicas 5 is above maxReplicas 4"
    );
}

#[test]
fn the_controllers_pull_policy_goes_with_its_image_only() {
    let container = |p: &DataPlane| {
        let pod = p
            .deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref());
        pod.map(|p| p.containers[0].clone()).expect("a container")
    };
    let always = RenderSettings {
        proxy_image_pull_policy: Some("Always".to_owned()),
        ..settings()
    };
    let p = plane_with(&snapshot(BASIC, ""), &always).expect("renders");
    let c = container(&p);
    assert_eq!(c.image, always.proxy_image);
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    // Unset, Kubernetes' default for the tag.
    let p = plane_with(&snapshot(BASIC, ""), &settings()).expect("renders");
    assert_eq!(container(&p).image_pull_policy, None);
    // A GatewayConfig's own image is not the one the policy was given for.
    let own = "{tunnelTokenSecretRef: {name: edge-tunnel-token}, image: 'tenant.example/proxy:2'}";
    let p = plane_with(&snapshot(own, ""), &always).expect("renders");
    let c = container(&p);
    assert_eq!(c.image.as_deref(), Some("tenant.example/proxy:2"));
    assert_eq!(c.image_pull_policy, None);
}

#[test]
fn without_an_image_rendering_fails_naming_both_places_to_set_one() {
    let mut none = settings();
    none.proxy_image = None;
    let err = plane_with(&snapshot(BASIC, ""), &none).expect_err("no image");
    let message = err.to_string();
    assert!(matches!(err, RenderError::NoImage { .. }));
    assert!(message.contains("spec.image"), "{message}");
    assert!(message.contains("--proxy-image"), "{message}");
    assert!(message.contains("tenant-a/edge-config"), "{message}");
}

#[test]
fn unresolvable_secrets_say_which_secret_key_and_field() {
    let s = snapshot("{tunnelTokenSecretRef: {name: missing}}", "");
    let err = resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "f").expect_err("missing");
    assert_eq!(
        err.to_string(),
        "Secret tenant-a/missing (spec.tunnelTokenSecretRef of GatewayConfig tenant-a/edge-config) does not exist"
    );

    let s = snapshot(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token, key: token}}",
        "",
    );
    let err = resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "f").expect_err("no key");
    assert!(
        err.to_string()
            .starts_with("Secret tenant-a/edge-tunnel-token has no key \"token\""),
        "{err}"
    );

    // A Secret of the same name in another namespace is not the one the reference names.
    let s = snapshot(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api}}",
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: api, namespace: other}\nstringData: {token: x}\n",
    );
    let err =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "f").expect_err("elsewhere");
    assert!(
        matches!(
            err,
            RenderError::SecretNotFound {
                field: "authTokenSecretRef",
                ..
            }
        ),
        "{err}"
    );

    let bad = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: bad, namespace: tenant-a}\nstringData: {tunnel-token: eyJhIjoieCJ9}\n";
    let s = snapshot("{tunnelTokenSecretRef: {name: bad}}", bad);
    let err =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "f").expect_err("bad token");
    let message = err.to_string();
    assert!(
        message.starts_with("key \"tunnel-token\" of Secret tenant-a/bad: tunnel token field `s`"),
        "{message}"
    );
}

#[test]
fn a_bring_your_own_token_replaces_the_generated_secret() {
    let byo = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: api, namespace: tenant-a}\ndata: {bearer: czNjcjN0Cg==}\n";
    let s = snapshot(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api, key: bearer}}",
        byo,
    );
    let credentials =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh").expect("resolves");
    // base64 of "s3cr3t\n": the newline a file leaves is not part of the token.
    assert_eq!(credentials.auth_token, "s3cr3t");
    assert!(!credentials.auth_generated);
    let p = render(
        &s.gateways[0],
        &s.gateway_configs[0],
        &credentials,
        &settings(),
    )
    .expect("renders");
    assert!(p.auth_secret.is_none());
    assert_eq!(
        env_secret(container(&p), "PROXY_AUTH_TOKEN"),
        ("api".to_owned(), "bearer".to_owned())
    );
}

#[test]
fn the_generated_token_is_never_rotated() {
    let existing = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: cf-proxy-edge-auth, namespace: tenant-a}\nstringData: {token: kept}\n";
    let s = snapshot(BASIC, existing);
    let credentials =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh").expect("resolves");
    assert_eq!(credentials.auth_token, "kept");
    assert!(credentials.auth_generated, "still the controller's Secret");
}

/// The Go controller's config-API tokens are read where they are: the Secret it generated
/// holds the token under `auth-token`, which is also its default key for a bring-your-own
/// Secret. The pods then read that key, and the token is not replaced.
#[test]
fn the_go_controllers_auth_token_key_is_read_where_no_key_is_named() {
    let generated = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: cf-proxy-edge-auth, namespace: tenant-a}\nstringData: {auth-token: from-go}\n";
    let s = snapshot(BASIC, generated);
    let credentials =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh").expect("resolves");
    assert_eq!(credentials.auth_token, "from-go");
    assert!(credentials.auth_generated);
    let p = render(
        &s.gateways[0],
        &s.gateway_configs[0],
        &credentials,
        &settings(),
    )
    .expect("renders");
    assert_eq!(
        env_secret(container(&p), "PROXY_AUTH_TOKEN"),
        ("cf-proxy-edge-auth".to_owned(), "auth-token".to_owned())
    );
    let data = p.auth_secret.and_then(|s| s.data).unwrap_or_default();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["auth-token"]);

    // A bring-your-own Secret: `token` first, then `auth-token`; a key named is the only one.
    let byo = |data: &str, key: &str| {
        let config = format!(
            "{{tunnelTokenSecretRef: {{name: edge-tunnel-token}}, authTokenSecretRef: {{name: api{key}}}}}"
        );
        let extra = format!("---\napiVersion: v1\nkind: Secret\nmetadata: {{name: api, namespace: tenant-a}}\nstringData: {data}\n");
        let s = snapshot(&config, &extra);
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh")
            .map(|c| (c.auth_token, c.auth_ref.key))
    };
    assert_eq!(
        byo("{auth-token: old}", ""),
        Ok(("old".to_owned(), "auth-token".to_owned()))
    );
    assert_eq!(
        byo("{auth-token: old, token: new}", ""),
        Ok(("new".to_owned(), "token".to_owned()))
    );
    let named = byo("{auth-token: old}", ", key: token").expect_err("only the named key");
    assert!(
        matches!(named, RenderError::SecretKeyMissing { .. }),
        "{named}"
    );
    assert_eq!(
        byo("{other: x}", "").expect_err("neither key").to_string(),
        "Secret tenant-a/api has neither key \"token\" nor \"auth-token\" (spec.authTokenSecretRef of GatewayConfig tenant-a/edge-config)"
    );
}

/// `autoscaling.metricName`, a field of the Go controller's GatewayConfig, names the metric the
/// autoscaler reads.
#[test]
fn the_autoscaler_reads_the_metric_the_gateway_config_names() {
    let hpa = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {maxReplicas: 4, targetInflightPerPod: 20, metricName: proxy_inflight}}",
        "",
    )
    .autoscaler
    .expect("an autoscaler");
    let metric = &hpa.spec.metrics.expect("metrics")[0];
    assert_eq!(
        metric.pods.as_ref().map(|p| p.metric.name.as_str()),
        Some("proxy_inflight")
    );
}

#[test]
fn a_plan_renders_each_gateway_naming_a_gateway_config_once_with_its_own_fresh_token() {
    let others = r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: lost, namespace: tenant-a}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: gone}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shared, namespace: tenant-a}
spec:
  gatewayClassName: cloudflare-tunnel
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: elsewhere, namespace: tenant-a}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {parametersRef: {group: example.com, kind: Other, name: edge-config}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;
    let s = snapshot(BASIC, others);
    let edge = ObjectKey::new("tenant-a", "edge");
    let lost = ObjectKey::new("tenant-a", "lost");
    let fresh = BTreeMap::from([
        (edge.clone(), "fresh for edge".to_owned()),
        (lost.clone(), "fresh for lost".to_owned()),
    ]);
    let plans = plan(&s, &settings(), |k| fresh.get(k).cloned());
    assert_eq!(
        plans.keys().collect::<Vec<_>>(),
        vec![&edge, &lost],
        "only the Gateways naming a GatewayConfig"
    );
    let rendered = plans[&edge].as_ref().expect("edge renders");
    assert_eq!(rendered.credentials.auth_token, "fresh for edge");
    // The same objects resolve and render give with that token.
    let credentials = resolve(
        &s.gateways[0],
        &s.gateway_configs[0],
        &s.secrets,
        "fresh for edge",
    )
    .expect("resolves");
    assert_eq!(rendered.credentials, credentials);
    assert_eq!(
        Ok(&rendered.plane),
        plane_with_token(&s, "fresh for edge").as_ref()
    );
    assert_eq!(
        plans[&lost]
            .as_ref()
            .map(|_| ())
            .map_err(ToString::to_string),
        Err("GatewayConfig tenant-a/gone (infrastructure.parametersRef) not found".to_owned())
    );
}

fn plane_with_token(s: &Snapshot, fresh: &str) -> Result<DataPlane, RenderError> {
    let credentials = resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, fresh)?;
    render(
        &s.gateways[0],
        &s.gateway_configs[0],
        &credentials,
        &settings(),
    )
}

#[test]
fn a_plan_needs_a_fresh_token_only_for_a_generated_secret_that_does_not_exist_yet() {
    let edge = ObjectKey::new("tenant-a", "edge");
    // Asked only where the token must be generated: what it is asked for says which those are.
    let mut asked = Vec::new();
    let mut none = |key: &ObjectKey| {
        asked.push(key.clone());
        None
    };
    let missing = plan(&snapshot(BASIC, ""), &settings(), &mut none);
    assert_eq!(missing[&edge], Err(RenderError::Random));

    let existing = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: cf-proxy-edge-auth, namespace: tenant-a}\nstringData: {token: kept}\n";
    let kept = plan(&snapshot(BASIC, existing), &settings(), &mut none);
    let rendered = kept[&edge]
        .as_ref()
        .expect("renders with the Secret's token");
    assert_eq!(rendered.credentials.auth_token, "kept");

    let byo = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: api, namespace: tenant-a}\nstringData: {token: mine}\n";
    let own = plan(
        &snapshot(
            "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api}}",
            byo,
        ),
        &settings(),
        &mut none,
    );
    assert_eq!(
        asked,
        std::slice::from_ref(&edge),
        "asked for the missing Secret only"
    );
    let rendered = own[&edge]
        .as_ref()
        .expect("renders with the operator's token");
    assert_eq!(rendered.credentials.auth_token, "mine");
}

#[test]
fn rotating_a_token_rolls_the_pods_and_nothing_else_does() {
    let hash = |config: &str, extra: &str, fresh: &str| {
        let s = snapshot(config, extra);
        let credentials =
            resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, fresh).expect("resolves");
        let p = render(
            &s.gateways[0],
            &s.gateway_configs[0],
            &credentials,
            &settings(),
        )
        .expect("renders");
        pod_annotation(&p, CREDENTIALS_HASH_ANNOTATION).expect("hash annotation")
    };
    let byo = |value: &str| {
        format!("---\napiVersion: v1\nkind: Secret\nmetadata: {{name: api, namespace: tenant-a}}\nstringData: {{token: {value}}}\n")
    };
    let with_byo =
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api}}";
    let base = hash(with_byo, &byo("one"), "x");
    assert_eq!(base, hash(with_byo, &byo("one"), "x"), "stable");
    assert_ne!(base, hash(with_byo, &byo("two"), "x"), "auth token rotated");
    assert_eq!(
        base,
        hash(
            "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api}, replicas: 7}",
            &byo("one"),
            "x"
        ),
        "a replica change does not roll pods through the hash"
    );
    let other_token = Token::new(
        "account",
        b"another secret".to_vec(),
        TUNNEL_ID.parse().expect("uuid"),
    )
    .encode();
    let rotated = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: rotated, namespace: tenant-a}}\nstringData: {{tunnel-token: {other_token}}}\n{}",
        byo("one")
    );
    assert_ne!(
        base,
        hash(
            "{tunnelTokenSecretRef: {name: rotated}, authTokenSecretRef: {name: api}}",
            &rotated,
            "x"
        ),
        "connector token rotated"
    );
    assert!(
        base.len() == 64 && !base.contains("one"),
        "a digest, not the token"
    );
}

#[test]
fn a_gateway_read_from_a_manifest_renders_without_an_owner() {
    let mut s = snapshot(BASIC, "");
    Arc::make_mut(&mut s.gateways[0]).metadata.uid = None;
    let p = plane_with(&s, &settings()).expect("renders");
    assert!(p.deployment.metadata.owner_references.is_none());
}

#[test]
fn pull_secrets_and_placement_reach_the_pod() {
    let p = plane(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, imagePullSecrets: [{name: registry}], \
         nodeSelector: {pool: edge}, tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}], \
         affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}, \
         priorityClassName: edge-critical}",
        "",
    );
    let pod = p
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let names: Vec<&str> = pod
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["registry"]);
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|n| n.get("pool"))
            .map(String::as_str),
        Some("edge")
    );
    let toleration = pod.tolerations.as_ref().map(|t| &t[0]).expect("toleration");
    assert_eq!(
        (toleration.key.as_deref(), toleration.effect.as_deref()),
        (Some("dedicated"), Some("NoSchedule"))
    );
    assert!(pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .is_some());
    assert_eq!(pod.priority_class_name.as_deref(), Some("edge-critical"));

    let without = plane(BASIC, "");
    let pod = without
        .deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec");
    assert!(pod.image_pull_secrets.is_none() && pod.node_selector.is_none());
    assert!(pod.tolerations.is_none() && pod.affinity.is_none());
    assert!(pod.priority_class_name.is_none());
}

/// Replicas spread over nodes, then zones, as the chart spreads the shared pool by default:
/// counted on the plane's own pods (another plane's do not skew it) per ReplicaSet, never left
/// unscheduled for it. Placement a GatewayConfig sets goes beside it.
#[test]
fn the_replicas_spread_over_nodes_and_zones_counting_the_planes_own_pods() {
    let placed = "{tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 2, \
                  nodeSelector: {pool: edge}, \
                  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}}";
    for config in [BASIC, placed] {
        let p = plane(config, "");
        let spec = p.deployment.spec.as_ref().expect("spec");
        let selector = spec.selector.clone();
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .expect("pod labels");
        let own = selector.match_labels.clone().expect("matchLabels");
        assert!(own.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        assert_eq!(
            own.get(GATEWAY_LABEL).map(String::as_str),
            Some(p.names.gateway_label.as_str())
        );
        let expected: Vec<TopologySpreadConstraint> =
            ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
                .map(|key| TopologySpreadConstraint {
                    max_skew: 1,
                    topology_key: key.to_owned(),
                    when_unsatisfiable: "ScheduleAnyway".to_owned(),
                    match_label_keys: Some(vec!["pod-template-hash".to_owned()]),
                    label_selector: Some(selector.clone()),
                    ..TopologySpreadConstraint::default()
                })
                .into();
        assert_eq!(
            pod_spec(&p).topology_spread_constraints.as_ref(),
            Some(&expected),
            "{config}"
        );
    }
}

/// With the planes' NetworkPolicy switched off the plane has none, and nothing else of it
/// changes: the pods, their Service and their token are rendered alike.
#[test]
fn without_the_network_policy_switch_a_plane_has_no_policy_and_nothing_else_changes() {
    let on = plane(BASIC, "");
    assert!(on.network_policy.is_some(), "on by default");
    let off = plane_with(
        &snapshot(BASIC, ""),
        &RenderSettings {
            network_policy: false,
            ..settings()
        },
    )
    .expect("renders");
    assert_eq!(off.network_policy, None);
    assert_eq!(
        DataPlane {
            network_policy: None,
            ..on
        },
        off
    );
}

/// The shared pool's token digest is plain SHA-256 of the trimmed token, as Helm's
/// `sha256sum` writes it (the digest of "abc" is the standard test vector).
#[test]
fn the_token_digest_is_the_sha256_of_the_trimmed_token() {
    assert_eq!(
        token_digest("abc\n"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(token_digest(" abc"), token_digest("abc"));
    assert_ne!(token_digest("abd"), token_digest("abc"));
}

/// A key added to a selector of the rendered plane narrows or widens what it selects: it is a
/// departure from the render ([`owned_fields`] differs), and a key added to a map that is not
/// a selector (labels, annotations) is not.
#[test]
fn keys_added_to_the_planes_selectors_depart_from_the_render() {
    use serde_json::{json, Value};
    fn value(object: &impl serde::Serialize) -> Value {
        serde_json::to_value(object).expect("serialises")
    }
    let p = plane(BASIC, "");
    let policy = value(p.network_policy.as_ref().expect("a NetworkPolicy"));
    let service = value(&p.service);
    let deployment = value(&p.deployment);
    let departs = |rendered: &Value, pointer: &str, key: &str, added: Value| {
        let mut live = rendered.clone();
        live.pointer_mut(pointer)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{pointer} is a map"))
            .insert(key.to_owned(), added);
        owned_fields(rendered, &live) != owned_fields(rendered, rendered)
    };
    let exists = json!([{"key": "tier", "operator": "Exists"}]);
    assert!(departs(
        &policy,
        "/spec/podSelector/matchLabels",
        "extra",
        json!("x")
    ));
    assert!(departs(
        &policy,
        "/spec/podSelector",
        "matchExpressions",
        exists
    ));
    assert!(departs(
        &policy,
        "/spec/ingress/0/from/0/podSelector/matchLabels",
        "extra",
        json!("x")
    ));
    assert!(departs(&service, "/spec/selector", "extra", json!("x")));
    assert!(departs(
        &deployment,
        "/spec/template/spec/topologySpreadConstraints/0/labelSelector/matchLabels",
        "extra",
        json!("x")
    ));
    assert!(!departs(&service, "/metadata/labels", "extra", json!("x")));
    assert!(!departs(
        &deployment,
        "/spec/template/metadata/annotations",
        "extra",
        json!("x")
    ));
}

#[test]
fn a_secret_keys_text_says_why_there_is_none() {
    let secret: Arc<Secret> = Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cf", "namespace": "tenant-a"},
            // "  \n", "\xff", " tok \n"
            "data": {"blank": "ICAK", "binary": "/w==", "token": "IHRvayAK"},
        }))
        .expect("a Secret"),
    );
    let secrets = [secret];
    let read = |name: &str, key: &str| read_secret_text(&secrets, "tenant-a", name, key);
    let which = |key: &str| ("tenant-a".to_owned(), "cf".to_owned(), key.to_owned());
    assert_eq!(read("cf", "token"), Ok("tok".to_owned()));
    assert_eq!(
        read("gone", "token"),
        Err(SecretTextError::NotFound {
            namespace: "tenant-a".to_owned(),
            name: "gone".to_owned()
        })
    );
    let (namespace, name, key) = which("api-token");
    assert_eq!(
        read("cf", "api-token"),
        Err(SecretTextError::NoKey {
            namespace,
            name,
            key
        })
    );
    let (namespace, name, key) = which("blank");
    assert_eq!(
        read("cf", "blank"),
        Err(SecretTextError::Empty {
            namespace,
            name,
            key
        })
    );
    let (namespace, name, key) = which("binary");
    let err = read("cf", "binary").expect_err("not text");
    assert_eq!(
        err,
        SecretTextError::NotText {
            namespace,
            name,
            key
        }
    );
    assert_eq!(
        err.to_string(),
        "key \"binary\" of Secret tenant-a/cf is not UTF-8 text"
    );
}

#[test]
fn the_deployment_names_its_tunnel_and_proves_it_for_its_gateway_only() {
    let p = plane(BASIC, "");
    let annotations = p
        .deployment
        .metadata
        .annotations
        .as_ref()
        .expect("annotations");
    assert_eq!(
        annotations.get(TUNNEL_ANNOTATION).map(String::as_str),
        Some(format!("account/{TUNNEL_ID}").as_str())
    );
    let proof = annotations
        .get(TUNNEL_PROOF_ANNOTATION)
        .expect("a proof")
        .clone();
    assert!(!proof.contains("tunnel secret"));
    assert_eq!(
        annotated_tunnel(&p.deployment),
        Some((TUNNEL_ID.parse().expect("uuid"), proof.as_str()))
    );
    // On the Deployment's metadata only: writing it rolls no pod.
    assert_eq!(pod_annotation(&p, TUNNEL_ANNOTATION), None);
    assert_eq!(pod_annotation(&p, TUNNEL_PROOF_ANNOTATION), None);

    let id = TUNNEL_ID.parse().expect("uuid");
    let ours = crate::translate::TunnelIdentity::of(&token().parse().expect("a token"));
    assert!(ours.proven_by("0a7c0c3e-1", &proof));
    assert!(
        !ours.proven_by("0a7c0c3e-2", &proof),
        "not another Gateway's"
    );
    let other_secret = crate::translate::TunnelIdentity::of(&Token::new(
        "account",
        b"another secret".to_vec(),
        id,
    ));
    assert!(
        !other_secret.proven_by("0a7c0c3e-1", &proof),
        "not a token of the same id with another secret"
    );
    let named = crate::translate::TunnelIdentity::named(id);
    assert!(
        !named.proven_by("0a7c0c3e-1", &tunnel_proof(&[0; 32], "0a7c0c3e-1")),
        "never a tunnel known by its id alone"
    );
}

/// A Gateway's infrastructure keys under the controller's own prefix, or that the Deployment
/// controller writes, are not carried; other system prefixes a tenant may want are.
fn assert_tenant_keys_only(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) {
    assert_eq!(labels.get("cf.k8s.lex.la/pool"), None, "{labels:?}");
    for key in [
        "cf.k8s.lex.la/tunnel-before",
        "sub.cf.k8s.lex.la/x",
        "deployment.kubernetes.io/revision",
    ] {
        assert_eq!(annotations.get(key), None, "{key} in {annotations:?}");
    }
    assert_eq!(
        annotations
            .get("cluster-autoscaler.kubernetes.io/safe-to-evict")
            .map(String::as_str),
        Some("true")
    );
}

#[test]
fn a_token_no_proxy_takes_is_refused_naming_its_secret() {
    // "pässword" (UTF-8): a proxy refuses it at start, so every pod would crash-loop.
    let byo = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: api, namespace: tenant-a}\nstringData: {bearer: p\u{e4}ssword}\n";
    let s = snapshot(
        "{tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: api, key: bearer}}",
        byo,
    );
    let refused =
        resolve(&s.gateways[0], &s.gateway_configs[0], &s.secrets, "fresh").expect_err("refused");
    assert!(
        matches!(refused, RenderError::BadAuthToken { ref name, ref key, .. } if name == "api" && key == "bearer"),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("Secret tenant-a/api"),
        "{refused}"
    );
}
