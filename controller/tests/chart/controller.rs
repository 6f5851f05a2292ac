//! The controller as the chart deploys it: its roles, the arguments it takes, and the peers the
//! NetworkPolicies it and the chart render admit.

use super::*;
use cftunnel_controller::runtime::{ownership_parents, required_rbac};
use cftunnel_controller::translate::ExternalNameBackends;
use gateway_api::experimental::gatewayclasses::GatewayClass;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

#[test]
fn the_roles_grant_exactly_the_calls_the_runtime_makes_to_the_controllers_account() {
    let Some(tools) =
        tools("the_roles_grant_exactly_the_calls_the_runtime_makes_to_the_controllers_account")
    else {
        return;
    };
    for file in values_files() {
        let rendered = render(tools, &file, "");
        // What the controller the chart runs calls, with the switches the chart gives it.
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        let run_options = options(&controller_run(&controller));
        let network_policy = run_options.render.network_policy;
        // Listing its parents for the admission policy, it writes that ConfigMap too.
        let parents = run_options.ownership_parents.clone();
        let required: BTreeSet<(String, String, String)> = required_rbac(network_policy)
            .into_iter()
            .chain(parents.as_ref().map(|_| ownership_parents::RBAC))
            .collect::<Vec<_>>()
            .iter()
            .flat_map(|(g, r, verbs)| {
                verbs
                    .iter()
                    .map(|v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
            })
            .collect();
        let mut granted = BTreeSet::new();
        // What is granted on named objects only, with their names.
        let mut named = BTreeSet::new();
        let rules = rendered
            .all::<ClusterRole>("ClusterRole")
            .into_iter()
            .flat_map(|r| r.rules.unwrap_or_default())
            .chain(
                rendered
                    .all::<Role>("Role")
                    .into_iter()
                    .flat_map(|r| r.rules.unwrap_or_default()),
            );
        for rule in rules {
            let names = rule.resource_names.clone().unwrap_or_default();
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        granted.insert((group.clone(), resource.clone(), verb.clone()));
                        if !names.is_empty() {
                            named.insert((
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                names.clone(),
                            ));
                        }
                    }
                }
            }
        }
        // The Lease calls name the controller's own Lease (its `--leader-election-id`), and the
        // roles hold them to it; a create names no object yet, so it cannot be held to a name.
        let lease = controller_run(&controller).leader_election_id;
        let lease_calls = ["get", "update"].map(|verb| {
            (
                "coordination.k8s.io".to_owned(),
                "leases".to_owned(),
                verb.to_owned(),
                vec![lease.clone()],
            )
        });
        // The ConfigMap calls name the one the chart renders, in the controller's namespace.
        let mut held = BTreeSet::from(lease_calls);
        if let Some(configmap) = &parents {
            assert_eq!(configmap.namespace, NAMESPACE, "{file}");
            rendered.one::<k8s_openapi::api::core::v1::ConfigMap>("ConfigMap", &configmap.name);
            let (group, resource, verbs) = ownership_parents::RBAC;
            for verb in verbs {
                held.insert((
                    group.to_owned(),
                    resource.to_owned(),
                    (*verb).to_owned(),
                    vec![configmap.name.clone()],
                ));
            }
        }
        assert_eq!(named, held, "{file}: calls held to names");
        let missing: Vec<_> = required.difference(&granted).collect();
        let extra: Vec<_> = granted.difference(&required).collect();
        assert!(
            missing.is_empty(),
            "{file}: the chart does not grant {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "{file}: the chart grants more than the controller calls: {extra:?}"
        );

        // Granted to the account the controller runs as, created when the values ask.
        let account = pod_spec(&controller)
            .service_account_name
            .clone()
            .expect("a service account");
        let bindings: Vec<(String, String, Vec<_>)> = rendered
            .all::<ClusterRoleBinding>("ClusterRoleBinding")
            .into_iter()
            .map(|b| {
                (
                    b.role_ref.kind,
                    b.role_ref.name,
                    b.subjects.unwrap_or_default(),
                )
            })
            .chain(
                rendered
                    .all::<RoleBinding>("RoleBinding")
                    .into_iter()
                    .map(|b| {
                        (
                            b.role_ref.kind,
                            b.role_ref.name,
                            b.subjects.unwrap_or_default(),
                        )
                    }),
            )
            .collect();
        let roles = rendered
            .all::<ClusterRole>("ClusterRole")
            .into_iter()
            .map(|r| ("ClusterRole", r.metadata.name))
            .chain(
                rendered
                    .all::<Role>("Role")
                    .into_iter()
                    .map(|r| ("Role", r.metadata.name)),
            );
        for (kind, name) in roles {
            let name = name.expect("a name");
            let bound: Vec<_> = bindings
                .iter()
                .filter(|(k, n, _)| k == kind && *n == name)
                .flat_map(|(_, _, subjects)| subjects)
                .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
                .collect();
            assert_eq!(
                bound,
                [("ServiceAccount", account.as_str(), Some(NAMESPACE))],
                "{file}: {kind} {name}"
            );
        }
        let values = values(&file, "");
        let create = at(&values, "controller.serviceAccount.create").as_bool() == Some(true);
        let created = rendered.get::<ServiceAccount>("ServiceAccount", &account);
        assert_eq!(
            created.is_some(),
            create,
            "{file}: ServiceAccount {account}"
        );
        let named = string(&values, "controller.serviceAccount.name");
        if !named.is_empty() {
            assert_eq!(account, named, "{file}");
        }
        if let Some(created) = created {
            assert_eq!(
                created.metadata.annotations.unwrap_or_default(),
                label_map(at(&values, "controller.serviceAccount.annotations")),
                "{file}"
            );
        }
    }
}

#[test]
fn the_controller_takes_the_arguments_the_chart_passes_as_the_values_mean_them() {
    let Some(tools) =
        tools("the_controller_takes_the_arguments_the_chart_passes_as_the_values_mean_them")
    else {
        return;
    };
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        let run = controller_run(&controller);
        let options = options(&run);
        let main = container(&controller);
        assert_eq!(
            format!("{:?}", run.log_format).to_lowercase(),
            string(&values, "controller.logFormat"),
            "{file}"
        );

        // The probes reach the port the controller serves them on.
        let health = main
            .ports
            .iter()
            .flatten()
            .find(|p| p.container_port == i32::from(run.health_addr.port()))
            .unwrap_or_else(|| panic!("{file}: no containerPort {}", run.health_addr));
        for probe in [&main.readiness_probe, &main.liveness_probe] {
            let port = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .map(|h| h.port.clone());
            assert_eq!(port, health.name.clone().map(IntOrString::String), "{file}");
        }

        // The shared pool it pushes to is the chart's, with the pool's own Secrets.
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let service: Service = rendered.one("Service", &pool_name(RELEASE));
        let shared = options
            .shared
            .as_ref()
            .expect("the shared pool gets configs");
        assert_eq!(
            (
                shared.service.namespace.as_str(),
                shared.service.name.as_str()
            ),
            (NAMESPACE, service.metadata.name.as_deref().expect("a name")),
            "{file}"
        );
        assert_eq!(
            service.spec.as_ref().and_then(|s| s.selector.clone()),
            Some(selector_labels(&pool)),
            "{file}: the Service selects the pool"
        );
        let proxy = container(&pool);
        assert_eq!(
            (shared.auth_secret.name.clone(), shared.auth_key.clone()),
            secret_key(proxy, "PROXY_AUTH_TOKEN"),
            "{file}"
        );
        let (tunnel, tunnel_key) = shared.tunnel_secret.clone().expect("the tunnel Secret");
        assert_eq!(
            (tunnel.name.clone(), tunnel_key),
            secret_key(proxy, "TUNNEL_TOKEN"),
            "{file}"
        );
        for secret in [&shared.auth_secret, &tunnel] {
            assert_eq!(secret.namespace, NAMESPACE, "{file}");
        }
        // The pool a new token in that Secret rolls is the chart's.
        assert_eq!(
            shared
                .deployment
                .as_ref()
                .map(|d| (d.namespace.as_str(), d.name.as_str())),
            Some((NAMESPACE, pool.metadata.name.as_deref().expect("a name"))),
            "{file}"
        );
        // Dedicated planes run the pool's image, pulled as the pool's is, and drain as long.
        assert_eq!(options.render.proxy_image, proxy.image, "{file}");
        assert_eq!(
            options.render.proxy_image_pull_policy, proxy.image_pull_policy,
            "{file}"
        );
        let grace = env(proxy, "PROXY_GRACE_PERIOD").and_then(|e| e.value.clone());
        assert_eq!(
            grace,
            Some(format!("{}s", options.render.grace_period_seconds)),
            "{file}"
        );

        // And with the pool's proxy settings: every plain setting of the pool's proxy but its
        // metrics (a plane's autoscaler reads them), its own extra environment and what the
        // render sets itself.
        let plane_proxy = plane(&options).deployment;
        let plane_proxy = container(&plane_proxy);
        let extra: Vec<String> = at(&values, "proxy.extraEnv")
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|e| e.get("name").and_then(|n| n.as_str()).map(str::to_owned))
            .collect();
        let settings: Vec<_> = proxy
            .env
            .iter()
            .flatten()
            .filter(|e| {
                e.value_from.is_none()
                    && !e.name.starts_with("OTEL_")
                    && !extra.contains(&e.name)
                    && e.name != "PROXY_METRICS_ENABLED"
                    && !render::RENDERED_ENV.contains(&e.name.as_str())
            })
            .collect();
        assert!(
            settings
                .iter()
                .any(|e| e.name == "PROXY_TUNNEL_POST_QUANTUM"),
            "{file}: {settings:?}"
        );
        for setting in settings {
            assert_eq!(
                env(plane_proxy, &setting.name).and_then(|e| e.value.as_deref()),
                setting.value.as_deref(),
                "{file}: {} in a dedicated plane",
                setting.name
            );
        }

        // The values, as the controller reads them.
        assert_eq!(
            options.translate.controller_name,
            string(&values, "gatewayClass.controllerName"),
            "{file}"
        );
        if let Some(class) = rendered.all::<GatewayClass>("GatewayClass").first() {
            assert_eq!(
                class.spec.controller_name,
                options.translate.controller_name
            );
            assert_eq!(
                class.metadata.name.clone().unwrap_or_default(),
                string(&values, "gatewayClass.name")
            );
            // Helm leaves it in place when the release stops rendering it.
            assert_eq!(
                class
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("helm.sh/resource-policy"))
                    .map(String::as_str),
                Some("keep"),
                "{file}"
            );
        }
        assert_eq!(
            options.translate.cluster_domain,
            string(&values, "clusterDomain"),
            "{file}"
        );
        assert_eq!(
            Some(options.translate.external_name_backends),
            string(&values, "controller.externalNameBackends")
                .parse::<ExternalNameBackends>()
                .ok(),
            "{file}"
        );
        assert_eq!(
            options.lease.is_some(),
            at(&values, "controller.leaderElection").as_bool() == Some(true),
            "{file}"
        );
        assert_eq!(
            Some(options.render.network_policy),
            at(&values, "controller.planeNetworkPolicy.enabled").as_bool(),
            "{file}"
        );
        // The planes it renders get a NetworkPolicy exactly when the value says so.
        assert_eq!(
            plane(&options).network_policy.is_some(),
            options.render.network_policy,
            "{file}"
        );
        assert_eq!(
            options.resync.as_secs().to_string(),
            string(&values, "controller.resyncSeconds"),
            "{file}"
        );
        assert_eq!(
            run.api_request_timeout_seconds.to_string(),
            string(&values, "controller.apiRequestTimeoutSeconds"),
            "{file}"
        );
        assert_eq!(
            main.env
                .iter()
                .flatten()
                .any(|e| e.name == "CLOUDFLARE_API_TOKEN"),
            !string(&values, "controller.cloudflareApiToken.existingSecret").is_empty(),
            "{file}"
        );
    }
}

#[test]
fn a_value_the_controller_does_not_know_stops_it_naming_the_flag() {
    let Some(tools) = tools("a_value_the_controller_does_not_know_stops_it_naming_the_flag") else {
        return;
    };
    // The schema lists the values the controller takes; Helm without it would pass this on.
    let err = render_as(
        tools,
        RELEASE,
        NAMESPACE,
        "default-values.yaml",
        "controller: {externalNameBackends: allow}",
    )
    .err()
    .expect("the schema refuses it");
    assert!(err.contains("externalNameBackends"), "{err}");
    for value in &ExternalNameBackends::ALL {
        let name = value.as_str();
        let rendered = render(
            tools,
            "default-values.yaml",
            &format!("controller: {{externalNameBackends: {name}}}"),
        );
        let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
        assert_eq!(options(&run).translate.external_name_backends, *value);
    }
}

#[test]
fn the_shared_pools_config_port_admits_the_controllers_pods_not_its_namespace() {
    let Some(tools) =
        tools("the_shared_pools_config_port_admits_the_controllers_pods_not_its_namespace")
    else {
        return;
    };
    let rendered = render(tools, "default-values.yaml", "");
    let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
    let options = options(&controller_run(&controller));
    let controller_selector = selector_labels(&controller);
    // The controller's pods carry the labels the controller is told are its own.
    let pod_labels = controller
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod labels");
    assert!(
        controller_selector
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{pod_labels:?}"
    );
    assert_eq!(options.render.controller_pod_labels, controller_selector);

    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    let policy: NetworkPolicy = rendered.one("NetworkPolicy", &pool_name(RELEASE));
    assert_eq!(
        policy.spec.as_ref().and_then(|s| s.pod_selector.clone()),
        pool.spec.map(|s| s.selector),
        "the policy covers the pool's pods"
    );
    // One peer with both selectors: the controller's pods, in the release namespace; not the
    // release namespace (the pool's own pods), nor those labels in any namespace.
    let controller_peer = NetworkPolicyPeer {
        namespace_selector: selector(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            NAMESPACE.to_owned(),
        )])),
        pod_selector: selector(controller_selector),
        ip_block: None,
    };
    assert_eq!(
        ingress_peers(&policy, config_port(&rendered)),
        std::slice::from_ref(&controller_peer)
    );
    // The same peers as every dedicated plane's.
    assert_eq!(
        ingress_peers(
            plane(&options).network_policy.as_ref().expect("a policy"),
            config_port(&rendered)
        ),
        [controller_peer]
    );
}

#[test]
fn the_monitoring_is_admitted_to_the_pools_and_planes_config_port_and_the_controllers_metrics() {
    let Some(tools) = tools(
        "the_monitoring_is_admitted_to_the_pools_and_planes_config_port_and_the_controllers_metrics",
    ) else {
        return;
    };
    let file = "protection-values.yaml";
    let values = values(file, "");
    let rendered = render(tools, file, "");
    let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
    let with = options(&controller_run(&controller));
    let pods = label_map(at(
        &values,
        "proxy.networkPolicy.monitoringPodSelector.matchLabels",
    ));
    let namespaces = label_map(at(
        &values,
        "proxy.networkPolicy.monitoringNamespaceSelector.matchLabels",
    ));
    assert!(
        !pods.is_empty() && !namespaces.is_empty(),
        "{file} sets both"
    );
    // The values become the controller's flags...
    assert_eq!(with.render.monitoring_pod_selector, selector(pods.clone()));
    assert_eq!(
        with.render.monitoring_namespace_selector,
        selector(namespaces.clone())
    );
    // ...and, in the pool's policy and every plane's, a peer of those pods in the release
    // namespace and one of those namespaces, besides the controller's pods.
    let release_namespace = selector(BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        NAMESPACE.to_owned(),
    )]));
    let monitoring = [
        NetworkPolicyPeer {
            namespace_selector: release_namespace.clone(),
            pod_selector: selector(pods),
            ip_block: None,
        },
        NetworkPolicyPeer {
            namespace_selector: selector(namespaces),
            pod_selector: None,
            ip_block: None,
        },
    ];
    let controller_peer = NetworkPolicyPeer {
        namespace_selector: release_namespace,
        pod_selector: selector(selector_labels(&controller)),
        ip_block: None,
    };
    let expected: Vec<NetworkPolicyPeer> = std::iter::once(controller_peer)
        .chain(monitoring.iter().cloned())
        .collect();
    let pool_policy: NetworkPolicy = rendered.one("NetworkPolicy", &pool_name(RELEASE));
    assert_eq!(
        ingress_peers(&pool_policy, config_port(&rendered)),
        expected
    );
    assert_eq!(
        ingress_peers(
            plane(&with).network_policy.as_ref().expect("a policy"),
            config_port(&rendered)
        ),
        expected
    );

    // The controller's own policy admits the monitoring, only, to its health port.
    let policy: NetworkPolicy = rendered.one("NetworkPolicy", &controller_name(RELEASE));
    let spec = policy.spec.as_ref().expect("spec");
    assert_eq!(
        spec.pod_selector,
        Some(LabelSelector {
            match_labels: Some(selector_labels(&controller)),
            match_expressions: None,
        })
    );
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    let run = controller_run(&controller);
    assert_eq!(
        ingress_peers(&policy, i32::from(run.health_addr.port())),
        monitoring
    );

    // Without monitoring selectors: no peer, no flag, and the controller admits nobody.
    let rendered = render(
        tools,
        "default-values.yaml",
        "controller: {networkPolicy: {enabled: true}}",
    );
    let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
    let without = options(&controller_run(&controller));
    assert_eq!(without.render.monitoring_pod_selector, None);
    assert_eq!(without.render.monitoring_namespace_selector, None);
    let pool_policy: NetworkPolicy = rendered.one("NetworkPolicy", &pool_name(RELEASE));
    assert_eq!(
        ingress_peers(&pool_policy, config_port(&rendered)),
        expected[..1]
    );
    let policy: NetworkPolicy = rendered.one("NetworkPolicy", &controller_name(RELEASE));
    assert_eq!(policy.spec.and_then(|s| s.ingress), Some(Vec::new()));
}

#[test]
fn without_leader_election_a_rollout_stops_the_old_controller_before_starting_the_new() {
    let Some(tools) =
        tools("without_leader_election_a_rollout_stops_the_old_controller_before_starting_the_new")
    else {
        return;
    };
    let strategy = |overrides: &str| {
        let rendered = render(tools, "default-values.yaml", overrides);
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        assert_eq!(
            options(&controller_run(&controller)).lease.is_some(),
            overrides.is_empty(),
            "{overrides:?}: the controller's election"
        );
        controller
            .spec
            .and_then(|s| s.strategy)
            .and_then(|s| s.type_)
    };
    // A rolling update runs the new pod beside the old: two writers with nothing electing one.
    let without = "controller: {leaderElection: false, replicas: 1}";
    assert_eq!(strategy(without).as_deref(), Some("Recreate"));
    // The rolling update's parameters are cleared, not left out: the API server defaults them
    // on a Deployment installed with an election and refuses them beside Recreate, and
    // server-side apply (Helm 4) leaves alone what the applied object does not name.
    let rendered = render(tools, "default-values.yaml", without);
    let strategy_doc = &rendered.raw("Deployment", &controller_name(RELEASE))["spec"]["strategy"];
    assert_eq!(
        strategy_doc
            .as_mapping()
            .and_then(|m| m.get("rollingUpdate")),
        Some(&Value::Null),
        "{strategy_doc:?}"
    );
    // With an election the new pod waits for the Lease: a rolling update keeps one ready.
    assert_eq!(strategy(""), None);
}
