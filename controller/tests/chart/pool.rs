//! The shared proxy pool: its proxy's settings, tunnel token, egress, autoscaler and
//! ServiceMonitor.

use super::*;
use clap::CommandFactory;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyEgressRule};

/// The proxy's flags as the pool's container sets them through its environment: each
/// variable becomes the flag that reads it (a Secret's value a placeholder naming it).
fn proxy_flags(container: &Container) -> Vec<String> {
    let command = cftunnel_proxy::cli::Args::command();
    let mut flags = Vec::new();
    for var in container.env.iter().flatten() {
        // The log filter's, not a flag (the test compares it on its own); the tracing
        // variables are compared in `tracing.rs`.
        if var.name == "RUST_LOG" || var.name.starts_with("OTEL_") {
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == var.name.as_str()))
            .unwrap_or_else(|| panic!("the proxy reads no {}", var.name));
        let value = match (&var.value, &var.value_from) {
            (Some(value), None) => value.clone(),
            (None, Some(from)) => {
                let key = from.secret_key_ref.as_ref().expect("a Secret key");
                format!("secret:{}/{}", key.name, key.key)
            }
            other => panic!("{}: {other:?}", var.name),
        };
        flags.push(format!(
            "--{}={value}",
            arg.get_long().expect("a long flag")
        ));
    }
    flags
}

#[test]
fn the_proxy_settings_reach_the_pools_proxy_as_the_values_mean_them() {
    let Some(tools) = tools("the_proxy_settings_reach_the_pools_proxy_as_the_values_mean_them")
    else {
        return;
    };
    // Each setting's value and the proxy flag it means.
    let settings = [
        ("proxy.accessLog.enabled", "access-log-enabled"),
        ("proxy.accessLog.query", "access-log-query"),
        ("proxy.accessLog.sampleEvery", "access-log-sample"),
        ("proxy.metrics.enabled", "metrics-enabled"),
        ("proxy.tunnel.protocol", "tunnel-protocol"),
        ("proxy.tunnel.postQuantum", "tunnel-post-quantum"),
        ("proxy.tunnel.edgeIpVersion", "edge-ip-version"),
        ("proxy.tunnel.region", "region"),
        ("proxy.tunnel.quicMaxStreams", "tunnel-quic-max-streams"),
        ("proxy.backend.maxConnections", "backend-max-connections"),
        ("proxy.backend.headerTimeout", "backend-header-timeout"),
        ("proxy.requestBodyTimeout", "request-body-timeout"),
        ("proxy.sendTimeout", "send-timeout"),
        ("proxy.websocketIdleTimeout", "websocket-idle-timeout"),
        ("proxy.logFormat", "log-format"),
    ];
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let container = container(&pool);
        let actual = cftunnel_proxy::cli::Args::try_parse_from(
            std::iter::once("cftunnel-proxy".to_owned()).chain(proxy_flags(container)),
        )
        .unwrap_or_else(|e| panic!("{file}: the proxy takes the chart's settings: {e}"));
        actual.validate().unwrap_or_else(|e| panic!("{file}: {e}"));

        // What the values say, given to the proxy directly.
        let mut expected = vec!["cftunnel-proxy".to_owned()];
        for (path, flag) in settings {
            let value = string(&values, path);
            if !value.is_empty() {
                expected.push(format!("--{flag}={value}"));
            }
        }
        // The cluster's own ranges, a list, as the one comma-separated setting.
        let ranges: Vec<String> =
            serde_yaml_ng::from_value(at(&values, "clusterCIDRs").clone()).expect("clusterCIDRs");
        if !ranges.is_empty() {
            expected.push(format!("--cluster-cidrs={}", ranges.join(",")));
        }
        expected.push(format!(
            "--grace-period={}s",
            string(&values, "proxy.gracePeriodSeconds")
        ));
        // The Secrets, the config port and the extra environment, as the container has them.
        for var in ["TUNNEL_TOKEN", "PROXY_AUTH_TOKEN", "PROXY_CONFIG_ADDR"] {
            let single = Container {
                env: env(container, var).cloned().map(|e| vec![e]),
                ..Container::default()
            };
            expected.extend(proxy_flags(&single));
        }
        let extra: Vec<EnvVar> =
            serde_yaml_ng::from_value(at(&values, "proxy.extraEnv").clone()).expect("extraEnv");
        expected.extend(proxy_flags(&Container {
            env: Some(extra),
            ..Container::default()
        }));
        let expected = cftunnel_proxy::cli::Args::try_parse_from(expected)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(format!("{actual:?}"), format!("{expected:?}"), "{file}");
        assert_eq!(
            env(container, "RUST_LOG").and_then(|e| e.value.clone()),
            Some(string(&values, "proxy.logLevel")),
            "{file}"
        );
        // The config port is the one the container, the Service and the probes name.
        assert_eq!(
            config_port(&rendered),
            i32::from(actual.config_addr.0.port()),
            "{file}"
        );
        // The controller judges ExternalBackends by the same ranges, and a dedicated plane it
        // renders dials by them as the pool does.
        let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
        assert_eq!(
            run.class.cluster_cidrs, actual.cluster_cidrs,
            "{file}: the controller's ranges"
        );
        let dedicated = plane(&options(&run)).deployment;
        let on_plane = cftunnel_proxy::cli::Args::try_parse_from(
            std::iter::once("cftunnel-proxy".to_owned())
                .chain(proxy_flags(super::container(&dedicated))),
        )
        .unwrap_or_else(|e| panic!("{file}: a plane's proxy takes its settings: {e}"));
        assert_eq!(
            on_plane.cluster_cidrs, actual.cluster_cidrs,
            "{file}: a dedicated plane's ranges"
        );
    }
}

#[test]
fn metrics_switched_off_refuse_the_autoscaler_and_the_service_monitor() {
    let Some(tools) = tools("metrics_switched_off_refuse_the_autoscaler_and_the_service_monitor")
    else {
        return;
    };
    for needs in ["autoscaling", "serviceMonitor"] {
        let err = render_as(
            tools,
            RELEASE,
            NAMESPACE,
            "default-values.yaml",
            &format!("proxy: {{metrics: {{enabled: false}}, {needs}: {{enabled: true}}}}"),
        )
        .err()
        .unwrap_or_else(|| panic!("{needs} without metrics renders"));
        assert!(
            err.contains("proxy.metrics.enabled") && err.contains(needs),
            "{err}"
        );
    }
}

#[test]
fn a_tunnel_token_given_as_a_value_is_the_secret_both_read_and_a_new_one_rolls_the_pool() {
    let Some(tools) = tools(
        "a_tunnel_token_given_as_a_value_is_the_secret_both_read_and_a_new_one_rolls_the_pool",
    ) else {
        return;
    };
    let file = "proxy-settings-values.yaml";
    let values = values(file, "");
    let token = string(&values, "proxy.tunnelToken.value");
    assert!(!token.is_empty(), "{file} gives the token");
    let checksum = |rendered: &Rendered| {
        let pool = rendered.raw("Deployment", &pool_name(RELEASE));
        pool["spec"]["template"]["metadata"]["annotations"]["cf.k8s.lex.la/tunnel-token-hash"]
            .clone()
    };
    let rendered = render(tools, file, "");
    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    let (name, key) = secret_key(container(&pool), "TUNNEL_TOKEN");
    let secret: Secret = rendered.one("Secret", &name);
    let stored = secret
        .data
        .and_then(|d| d.get(&key).cloned())
        .expect("the token");
    assert_eq!(String::from_utf8(stored.0).expect("UTF-8"), token);
    let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
    let shared = options(&run).shared.expect("shared");
    assert_eq!(
        shared.tunnel_secret.map(|(s, k)| (s.name, k)),
        Some((name, key))
    );
    // The same token, the same pods; another token, new pods. The digest is the one the
    // controller stamps when the Secret changes between upgrades, and never the token.
    assert_eq!(
        checksum(&rendered),
        Value::String(render::token_digest(&token))
    );
    assert!(!checksum(&rendered)
        .as_str()
        .is_some_and(|digest| digest.contains(&token)));
    assert_eq!(
        shared.deployment.as_ref().map(|d| d.name.clone()),
        pool.metadata.name.clone(),
        "the controller keeps the chart's pool stamped"
    );
    assert_eq!(checksum(&render(tools, file, "")), checksum(&rendered));
    let rotated = render(
        tools,
        file,
        &format!("proxy: {{tunnelToken: {{value: {token}x}}}}"),
    );
    assert_ne!(checksum(&rotated), checksum(&rendered));
    // An existing Secret with no cluster to read it from (`helm template`): no digest; the
    // controller stamps it.
    assert!(checksum(&render(tools, "default-values.yaml", "")).is_null());

    // One of the two, not both, not neither.
    for (overrides, says) in [
        ("proxy: {tunnelToken: {existingSecret: mine}}", "not both"),
        ("proxy: {tunnelToken: {value: \"\"}}", "is required"),
    ] {
        let err = render_as(tools, RELEASE, NAMESPACE, file, overrides)
            .err()
            .unwrap_or_else(|| panic!("{overrides} renders"));
        assert!(
            err.contains("proxy.tunnelToken") && err.contains(says),
            "{err}"
        );
    }
}

#[test]
fn extra_environment_naming_a_variable_the_chart_sets_fails_the_render_naming_it() {
    let Some(tools) =
        tools("extra_environment_naming_a_variable_the_chart_sets_fails_the_render_naming_it")
    else {
        return;
    };
    // Every variable the chart sets, tracing and the optional region included.
    let everything = "{tracing: {endpoint: 'http://collector:4318', \
                      headers: {existingSecret: otlp}}, proxy: {tunnel: {region: us}}}";
    let rendered = render(tools, "default-values.yaml", everything);
    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    let names: Vec<String> = container(&pool)
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    assert!(names.len() > 15, "{names:?}");
    let with_extra = |name: &str| {
        format!(
            "{{tracing: {{endpoint: 'http://collector:4318', headers: {{existingSecret: otlp}}}}, \
             proxy: {{tunnel: {{region: us}}, extraEnv: [{{name: {name}, value: 'x'}}]}}}}"
        )
    };
    // A second entry of one name would win over the chart's: a drain longer than the pod's
    // grace period, a config port the probes and Service do not name.
    for name in &names {
        let err = render_as(
            tools,
            RELEASE,
            NAMESPACE,
            "default-values.yaml",
            &with_extra(name),
        )
        .err()
        .unwrap_or_else(|| panic!("extraEnv may set {name}"));
        assert!(
            err.contains(&format!("proxy.extraEnv[0]: {name} ")),
            "{err}"
        );
    }
    // A setting the chart leaves alone is the extra environment's to give.
    let rendered = render(
        tools,
        "default-values.yaml",
        &with_extra("PROXY_WORKER_THREADS"),
    );
    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    assert_eq!(
        env(container(&pool), "PROXY_WORKER_THREADS").and_then(|e| e.value.as_deref()),
        Some("x")
    );
}

#[test]
fn the_pools_egress_policy_admits_dns_the_edge_and_the_backends_the_values_name() {
    let Some(tools) =
        tools("the_pools_egress_policy_admits_dns_the_edge_and_the_backends_the_values_name")
    else {
        return;
    };
    let egress_name = format!("{}-egress", pool_name(RELEASE));
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let policy = rendered.get::<NetworkPolicy>("NetworkPolicy", &egress_name);
        let egress = at(&values, "proxy.networkPolicy.egress");
        assert_eq!(
            policy.is_some(),
            egress["enabled"].as_bool() == Some(true),
            "{file}"
        );
        let Some(policy) = policy else { continue };
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let spec = policy.spec.expect("spec");
        assert_eq!(spec.pod_selector, pool.spec.map(|s| s.selector), "{file}");
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Egress".to_owned()][..])
        );
        let rules = spec.egress.expect("rules");
        let ports = |port: i32, protocols: &[&str]| -> Option<Vec<NetworkPolicyPort>> {
            Some(
                protocols
                    .iter()
                    .map(|p| NetworkPolicyPort {
                        port: Some(IntOrString::Int(port)),
                        protocol: Some((*p).to_owned()),
                        end_port: None,
                    })
                    .collect(),
            )
        };
        let peers = |value: &Value| -> Option<Vec<NetworkPolicyPeer>> {
            let peers: Vec<NetworkPolicyPeer> =
                serde_yaml_ng::from_value(value.clone()).expect("peers");
            (!peers.is_empty()).then_some(peers)
        };
        let blocks = |cidrs: Vec<(String, Vec<String>)>| {
            cidrs
                .into_iter()
                .map(|(cidr, except)| NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr,
                        except: (!except.is_empty()).then_some(except),
                    }),
                    ..NetworkPolicyPeer::default()
                })
                .collect::<Vec<_>>()
        };
        let strings = |value: &Value| -> Vec<String> {
            serde_yaml_ng::from_value(value.clone()).expect("strings")
        };
        let dns = NetworkPolicyEgressRule {
            to: peers(&egress["dns"]),
            ports: ports(53, &["UDP", "TCP"]),
        };
        let edge = NetworkPolicyEgressRule {
            to: Some(blocks(
                strings(&egress["edgeCIDRs"])
                    .into_iter()
                    .map(|c| (c, Vec::new()))
                    .collect(),
            ))
            .filter(|b| !b.is_empty()),
            // The port the connector dials, QUIC and HTTP/2.
            ports: ports(i32::from(cftunnel_tunnel::edge::EDGE_PORT), &["UDP", "TCP"]),
        };
        let cidrs = strings(&egress["backends"]["cidrs"]);
        let except = strings(&egress["backends"]["except"]);
        let backends = NetworkPolicyEgressRule {
            to: Some(if cidrs.is_empty() {
                let (v6, v4): (Vec<String>, Vec<String>) =
                    except.into_iter().partition(|c| c.contains(':'));
                // Any address: every pod by selector too, since some CNIs (Cilium) match
                // an ipBlock only against addresses outside the cluster.
                let every_pod = NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector::default()),
                    ..NetworkPolicyPeer::default()
                };
                let all_pods = egress["backends"]["allPods"].as_bool() == Some(true);
                all_pods
                    .then_some(every_pod)
                    .into_iter()
                    .chain(blocks(vec![
                        ("0.0.0.0/0".to_owned(), v4),
                        ("::/0".to_owned(), v6),
                    ]))
                    .collect()
            } else {
                blocks(cidrs.into_iter().map(|c| (c, Vec::new())).collect())
            }),
            ports: None,
        };
        let extra: Vec<NetworkPolicyEgressRule> =
            serde_yaml_ng::from_value(egress["extraRules"].clone()).expect("rules");
        let expected: Vec<NetworkPolicyEgressRule> =
            [dns, edge, backends].into_iter().chain(extra).collect();
        assert_eq!(rules, expected, "{file}");
    }
    // Pods by selector only with allPods: `except` then bounds them too.
    let off = "{proxy: {networkPolicy: {egress: {backends: {allPods: false}}}}}";
    let rendered = render(tools, "egress-any-values.yaml", off);
    let policy = rendered.one::<NetworkPolicy>("NetworkPolicy", &egress_name);
    let peers: Vec<NetworkPolicyPeer> = policy
        .spec
        .and_then(|s| s.egress)
        .into_iter()
        .flatten()
        .flat_map(|rule| rule.to.unwrap_or_default())
        .collect();
    let every_pod = Some(LabelSelector::default());
    assert!(
        peers.iter().all(|p| p.namespace_selector != every_pod),
        "{peers:?}"
    );
    assert!(peers
        .iter()
        .any(|p| p.ip_block.as_ref().is_some_and(|b| b.cidr == "0.0.0.0/0")));
}

#[test]
fn the_pools_autoscaler_and_service_monitor_follow_the_values() {
    let Some(tools) = tools("the_pools_autoscaler_and_service_monitor_follow_the_values") else {
        return;
    };
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let service: Service = rendered.one("Service", &pool_name(RELEASE));
        let autoscaling = at(&values, "proxy.autoscaling");
        let hpa =
            rendered.get::<HorizontalPodAutoscaler>("HorizontalPodAutoscaler", &pool_name(RELEASE));
        assert_eq!(
            hpa.is_some(),
            autoscaling["enabled"].as_bool() == Some(true),
            "{file}"
        );
        let replicas = pool.spec.as_ref().and_then(|s| s.replicas);
        if let Some(hpa) = hpa {
            // Without a cluster to look up, the count is the autoscaler's alone.
            assert_eq!(replicas, None, "{file}");
            let spec = hpa.spec;
            assert_eq!(spec.scale_target_ref.name, pool_name(RELEASE));
            assert_eq!(spec.scale_target_ref.kind, "Deployment");
            assert_eq!(
                spec.min_replicas.map(|n| n.to_string()),
                Some(string(&values, "proxy.autoscaling.minReplicas"))
            );
            assert_eq!(
                spec.max_replicas.to_string(),
                string(&values, "proxy.autoscaling.maxReplicas")
            );
            // The same metric as a dedicated plane's autoscaler, at the values' target.
            let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
            let plane_hpa = plane(&options(&run))
                .autoscaler
                .expect("the fixture's plane autoscales");
            let metric = |spec: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerSpec| {
                let metrics = spec.metrics.clone().expect("metrics");
                assert_eq!(metrics.len(), 1);
                let pods = metrics[0].pods.clone().expect("a Pods metric");
                (
                    metrics[0].type_.clone(),
                    pods.metric.name,
                    pods.target.type_,
                    pods.target.average_value,
                )
            };
            let (kind, name, target, average) = metric(&spec);
            let (plane_kind, plane_name, plane_target, _) = metric(&plane_hpa.spec);
            assert_eq!((kind, name, target), (plane_kind, plane_name, plane_target));
            assert_eq!(
                average.map(|q| q.0),
                Some(string(&values, "proxy.autoscaling.targetInflightPerPod"))
            );
        } else {
            assert_eq!(
                replicas.map(|n| n.to_string()),
                Some(string(&values, "proxy.replicas")),
                "{file}"
            );
        }

        let monitor = rendered
            .docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("ServiceMonitor"));
        let wanted = at(&values, "proxy.serviceMonitor.enabled").as_bool() == Some(true);
        assert_eq!(monitor.is_some(), wanted, "{file}");
        if let Some(monitor) = monitor {
            // It selects the pool's Service, in the release namespace, on a port it has.
            let selects = label_map(&monitor["spec"]["selector"]["matchLabels"]);
            let labels = service.metadata.labels.clone().unwrap_or_default();
            assert!(!selects.is_empty(), "{file}");
            assert!(
                selects.iter().all(|(k, v)| labels.get(k) == Some(v)),
                "{file}: {selects:?} of {labels:?}"
            );
            assert_eq!(
                service.spec.as_ref().and_then(|s| s.selector.clone()),
                Some(selector_labels(&pool))
            );
            assert_eq!(
                monitor["spec"]["namespaceSelector"]["matchNames"],
                Value::Sequence(vec![NAMESPACE.into()])
            );
            let endpoint = &monitor["spec"]["endpoints"][0];
            let port = endpoint["port"].as_str().expect("a port name");
            assert!(
                service
                    .spec
                    .as_ref()
                    .and_then(|s| s.ports.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|p| p.name.as_deref() == Some(port)),
                "{file}: the Service has port {port}"
            );
            assert_eq!(
                endpoint["interval"],
                *at(&values, "proxy.serviceMonitor.interval")
            );
            // Relabelings as the values give them, none unless given.
            let relabel = at(&values, "proxy.serviceMonitor.metricRelabelings");
            match relabel.as_sequence().filter(|r| !r.is_empty()) {
                Some(_) => assert_eq!(endpoint["metricRelabelings"], *relabel, "{file}"),
                None => assert!(endpoint.get("metricRelabelings").is_none(), "{file}"),
            }
            let labels = label_map(&monitor["metadata"]["labels"]);
            for (k, v) in label_map(at(&values, "proxy.serviceMonitor.labels")) {
                assert_eq!(labels.get(&k), Some(&v), "{file}");
            }
        }
    }
}
