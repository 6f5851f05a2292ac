//! What Helm makes of the chart: lint, the objects valid for the Kubernetes releases supported,
//! the same objects from the oldest and the newest Helm, the schema's refusals, the notes.

use super::*;
use cftunnel_controller::gateway_config::GatewayConfig;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::CustomResourceExt;

#[test]
fn every_values_file_lints_strictly_with_the_oldest_and_newest_helm() {
    let Some(tools) = tools("every_values_file_lints_strictly_with_the_oldest_and_newest_helm")
    else {
        return;
    };
    let (oldest, newest) = kube_versions();
    for file in values_files() {
        let path = chart().join("ci").join(&file);
        for kube in [&oldest, &newest] {
            tools
                .helm
                .lint(&chart(), &path, Some(kube))
                .unwrap_or_else(|e| panic!("{file}, Kubernetes {kube}: {e}"));
        }
        // Helm 3.9 lints for one Kubernetes release of its own.
        tools
            .helm_oldest
            .lint(&chart(), &path, None)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn the_oldest_helm_is_the_minimum_chart_yaml_states() {
    let Some(tools) = tools("the_oldest_helm_is_the_minimum_chart_yaml_states") else {
        return;
    };
    let meta = yaml(&chart().join("Chart.yaml"));
    assert_eq!(
        meta["annotations"]["cf.k8s.lex.la/minimum-helm-version"].as_str(),
        Some(tools.helm_oldest.minor().as_str()),
        "the chart is tested with Helm {}",
        tools.helm_oldest.version
    );
}

#[test]
fn every_values_file_renders_objects_valid_for_the_oldest_and_newest_kubernetes() {
    let Some(tools) =
        tools("every_values_file_renders_objects_valid_for_the_oldest_and_newest_kubernetes")
    else {
        return;
    };
    let (oldest, newest) = kube_versions();
    for file in values_files() {
        for kube in [&oldest, &newest] {
            let text = tools
                .helm
                .template(
                    &chart(),
                    &Release {
                        name: RELEASE,
                        namespace: NAMESPACE,
                        values_files: vec![chart().join("ci").join(&file)],
                        values: "",
                        kube_version: kube,
                    },
                )
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let unknown = tools
                .validate(&text, kube)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            for kind in unknown {
                let api_version = kind.split_once(' ').map(|(_, v)| v).unwrap_or_default();
                assert!(
                    CRD_GROUPS.iter().any(|g| api_version.starts_with(g)),
                    "{file}: no Kubernetes {kube} schema for {kind}"
                );
            }
            // Every object is namespaced in the release namespace, or cluster-wide.
            for doc in Rendered::parse(&text).docs {
                let namespace = doc["metadata"]["namespace"].as_str();
                let kind = doc["kind"].as_str().unwrap_or_default();
                let cluster_wide = matches!(
                    kind,
                    "ClusterRole"
                        | "ClusterRoleBinding"
                        | "CustomResourceDefinition"
                        | "GatewayClass"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                );
                assert_eq!(
                    namespace,
                    (!cluster_wide).then_some(NAMESPACE),
                    "{file}: {kind}"
                );
            }
        }
    }
}

/// Two releases of one name in two namespaces share no cluster-wide object: Helm would refuse
/// to install the second over the first's. Each binds its own: the ClusterRoleBinding its
/// ClusterRole to its own account, the admission policy's binding its policy. (The CRDs are
/// shared by design; the GatewayClass is named by `gatewayClass.name`, one per release.)
#[test]
fn releases_of_one_name_in_two_namespaces_share_no_cluster_wide_object() {
    let Some(tools) = tools("releases_of_one_name_in_two_namespaces_share_no_cluster_wide_object")
    else {
        return;
    };
    let file = "hostname-ownership-values.yaml";
    let cluster_wide = |namespace: &str| {
        let rendered = render_as(tools, RELEASE, namespace, file, "")
            .unwrap_or_else(|e| panic!("{namespace}: {e}"));
        let names: BTreeSet<String> = rendered
            .docs
            .iter()
            .filter(|d| d["metadata"]["namespace"].is_null())
            .map(|d| {
                let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (field(&d["kind"]), field(&d["metadata"]["name"]))
            })
            .filter(|(kind, _)| {
                !matches!(kind.as_str(), "CustomResourceDefinition" | "GatewayClass")
            })
            .map(|(kind, name)| format!("{kind} {name}"))
            .collect();
        (rendered, names)
    };
    let (first, first_names) = cluster_wide("team-a");
    let (second, second_names) = cluster_wide("team-b");
    assert_eq!(first_names.len(), 4, "{first_names:?}");
    assert!(
        first_names.is_disjoint(&second_names),
        "{first_names:?} and {second_names:?}"
    );
    for (rendered, namespace) in [(first, "team-a"), (second, "team-b")] {
        let binding: ClusterRoleBinding = rendered.one(
            "ClusterRoleBinding",
            &cluster_name(RELEASE, namespace, "controller"),
        );
        rendered.one::<ClusterRole>("ClusterRole", &binding.role_ref.name);
        let subjects = binding.subjects.unwrap_or_default();
        assert_eq!(
            subjects
                .iter()
                .map(|s| s.namespace.as_deref())
                .collect::<Vec<_>>(),
            [Some(namespace)]
        );
        let policy = cluster_name(RELEASE, namespace, "hostname-ownership");
        rendered.raw("ValidatingAdmissionPolicy", &policy);
        assert_eq!(
            rendered.raw("ValidatingAdmissionPolicyBinding", &policy)["spec"]["policyName"]
                .as_str(),
            Some(policy.as_str())
        );
    }
}

/// The rendered objects with what differs between two renders dropped: a generated token and
/// its digest.
fn deterministic(mut rendered: Rendered) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for doc in &mut rendered.docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some(m) = doc.as_mapping_mut() {
            if kind == "Secret" {
                m.remove("data");
            }
        }
        if let Some(annotations) = doc
            .get_mut("spec")
            .and_then(|s| s.get_mut("template"))
            .and_then(|t| t.get_mut("metadata"))
            .and_then(|m| m.get_mut("annotations"))
            .and_then(Value::as_mapping_mut)
        {
            annotations.remove("checksum/config-api-token");
        }
        out.insert(format!("{kind} {name}"), doc.clone());
    }
    out
}

#[test]
fn the_oldest_helm_renders_what_the_newest_does() {
    let Some(tools) = tools("the_oldest_helm_renders_what_the_newest_does") else {
        return;
    };
    let (oldest, _) = kube_versions();
    for file in values_files() {
        let release = Release {
            name: RELEASE,
            namespace: NAMESPACE,
            values_files: vec![chart().join("ci").join(&file)],
            values: "",
            kube_version: &oldest,
        };
        let [old, new] = [&tools.helm_oldest, &tools.helm].map(|helm| {
            let text = helm
                .template(&chart(), &release)
                .unwrap_or_else(|e| panic!("{file}, Helm {}: {e}", helm.version));
            deterministic(Rendered::parse(&text))
        });
        assert_eq!(old, new, "{file}");
    }
}

#[test]
fn the_install_notes_name_the_class_and_the_tunnel_secret() {
    let Some(tools) = tools("the_install_notes_name_the_class_and_the_tunnel_secret") else {
        return;
    };
    let (_, newest) = kube_versions();
    for file in values_files() {
        let notes = tools
            .helm
            .notes(
                &chart(),
                &Release {
                    name: RELEASE,
                    namespace: NAMESPACE,
                    values_files: vec![chart().join("ci").join(&file)],
                    values: "",
                    kube_version: &newest,
                },
            )
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let rendered = render(tools, &file, "");
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let (tunnel_secret, _) = secret_key(container(&pool), "TUNNEL_TOKEN");
        let class = string(&values(&file, ""), "gatewayClass.name");
        for expected in [&tunnel_secret, &class, &pool_name(RELEASE)] {
            assert!(
                notes.contains(expected.as_str()),
                "{file}: {expected} in\n{notes}"
            );
        }
    }
}

#[test]
fn the_rendered_crd_is_the_one_the_controller_defines() {
    let Some(tools) = tools("the_rendered_crd_is_the_one_the_controller_defines") else {
        return;
    };
    let generated: Value = serde_yaml_ng::to_value(GatewayConfig::crd()).expect("the CRD encodes");
    let name = generated["metadata"]["name"].as_str().expect("a name");
    for file in values_files() {
        let rendered = render(tools, &file, "");
        assert_eq!(
            rendered.raw("CustomResourceDefinition", name),
            &generated,
            "{file}"
        );
    }
}

#[test]
fn the_schema_refuses_unknown_and_mistyped_values_with_either_helm() {
    let Some(tools) = tools("the_schema_refuses_unknown_and_mistyped_values_with_either_helm")
    else {
        return;
    };
    let (oldest, _) = kube_versions();
    for (overrides, named) in [
        ("proxy: {replcas: 3}", "replcas"),
        ("controller: {replicas: two}", "replicas"),
        // Without leader election every replica would write.
        ("controller: {leaderElection: false, replicas: 2}", "replicas"),
        ("proxy: {tunnel: {protocol: h3}}", "protocol"),
        ("proxy: {tunnel: {quicMaxStreams: 0}}", "quicMaxStreams"),
        ("proxy: {backend: {headerTimeout: 60}}", "headerTimeout"),
        // The proxy refuses a zero at start: every pod would crash-loop.
        ("proxy: {backend: {headerTimeout: 0s}}", "headerTimeout"),
        ("proxy: {requestBodyTimeout: 0m0s}", "requestBodyTimeout"),
        ("proxy: {requestBodyTimeout: 1x}", "requestBodyTimeout"),
        ("proxy: {websocketIdleTimeout: 1x}", "websocketIdleTimeout"),
        ("proxy: {gracePeriodSeconds: 600}", "gracePeriodSeconds"),
        (
            "proxy: {networkPolicy: {monitoringPodSelector: {matchExpressions: [{key: app, operator: Exists}]}}}",
            "matchExpressions",
        ),
        (
            "proxy: {networkPolicy: {monitoringNamespaceSelector: {matchExpressions: [{key: app, operator: Exists}]}}}",
            "matchExpressions",
        ),
    ] {
        for helm in [&tools.helm, &tools.helm_oldest] {
            let err = helm
                .template(
                    &chart(),
                    &Release {
                        name: RELEASE,
                        namespace: NAMESPACE,
                        values_files: vec![chart().join("ci/default-values.yaml")],
                        values: overrides,
                        kube_version: &oldest,
                    },
                )
                .err()
                .unwrap_or_else(|| panic!("Helm {} takes {overrides}", helm.version));
            assert!(err.contains(named), "Helm {}, {overrides}: {err}", helm.version);
        }
    }
}

/// Secret keys and names given with `--set-string` that YAML would read as a number or a
/// boolean (`1234`, `true`) reach the objects as the strings they are: read back as numbers,
/// the API server would refuse the Deployments and the Secrets.
#[test]
fn strings_that_read_as_numbers_or_booleans_reach_the_objects_as_strings() {
    let Some(tools) =
        tools("strings_that_read_as_numbers_or_booleans_reach_the_objects_as_strings")
    else {
        return;
    };
    let (oldest, newest) = kube_versions();
    let set = [
        "--set-string=proxy.tunnelToken.key=1234",
        "--set-string=proxy.authToken.key=true",
        "--set=controller.cloudflareApiToken.existingSecret=cloudflare",
        "--set-string=controller.cloudflareApiToken.key=1234",
        "--set-string=controller.serviceAccount.name=123",
        "--set-string=proxy.serviceAccount.name=456",
    ];
    // The operator's tunnel Secret, and the chart's (the token given as a value).
    for overrides in [
        "",
        "proxy: {tunnelToken: {existingSecret: '', value: a-token}}",
    ] {
        let text = |kube: &str| {
            render_set(tools, "default-values.yaml", overrides, &set, kube)
                .unwrap_or_else(|e| panic!("{overrides:?}: {e}"))
        };
        for kube in [&oldest, &newest] {
            valid_for(tools, &text(kube), kube).unwrap_or_else(|e| panic!("{overrides:?}: {e}"));
        }
        let rendered = Rendered::parse(&text(&newest));
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        let (tunnel_secret, tunnel_key) = secret_key(container(&pool), "TUNNEL_TOKEN");
        assert_eq!(tunnel_key, "1234", "{overrides:?}");
        let (auth_secret, auth_key) = secret_key(container(&pool), "PROXY_AUTH_TOKEN");
        assert_eq!(auth_key, "true", "{overrides:?}");
        assert_eq!(
            secret_key(container(&controller), "CLOUDFLARE_API_TOKEN"),
            ("cloudflare".to_owned(), "1234".to_owned())
        );
        // The controller reads the pool's Secrets under the same keys.
        let shared = options(&controller_run(&controller))
            .shared
            .expect("the shared pool");
        assert_eq!(shared.auth_key, "true");
        assert_eq!(
            shared.tunnel_secret.map(|(_, key)| key).as_deref(),
            Some("1234")
        );
        assert_eq!(
            pod_spec(&controller).service_account_name.as_deref(),
            Some("123")
        );
        assert_eq!(pod_spec(&pool).service_account_name.as_deref(), Some("456"));
        // The chart's Secrets hold their tokens under those keys.
        let keys = |name: &str| {
            rendered
                .one::<Secret>("Secret", name)
                .data
                .unwrap_or_default()
                .into_keys()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&auth_secret), ["true"]);
        if !overrides.is_empty() {
            assert_eq!(keys(&tunnel_secret), ["1234"]);
        }
    }
}

/// `--set` passes a decimal as a string (`--set tracing.ratio=0.1` gives `"0.1"`), and digits as
/// a number (`--set proxy.tunnel.edgeIpVersion=6` gives `6`): the schema takes either, in the
/// same bounds, and the objects are those a values file giving the numbers renders, with
/// either Helm.
#[test]
fn decimals_given_with_set_render_what_the_same_numbers_in_a_values_file_do() {
    let Some(tools) =
        tools("decimals_given_with_set_render_what_the_same_numbers_in_a_values_file_do")
    else {
        return;
    };
    let (oldest, _) = kube_versions();
    let on = "{prometheusRule: {enabled: true}, tracing: {endpoint: 'http://collector:4318'}}";
    let release = |values| Release {
        name: RELEASE,
        namespace: NAMESPACE,
        values_files: vec![chart().join("ci/default-values.yaml")],
        values,
        kube_version: &oldest,
    };
    let numbers = "{prometheusRule: {enabled: true, errorRatio: 0.1, minRequestRate: 0.5, \
                   inflightTargetFraction: 0.9}, tracing: {endpoint: 'http://collector:4318', \
                   ratio: 0.25}, proxy: {tunnel: {edgeIpVersion: '6'}}}";
    let set = [
        "--set=prometheusRule.errorRatio=0.1",
        "--set=prometheusRule.minRequestRate=0.5",
        "--set=prometheusRule.inflightTargetFraction=0.9",
        "--set=tracing.ratio=0.25",
        "--set=proxy.tunnel.edgeIpVersion=6",
    ];
    for helm in [&tools.helm, &tools.helm_oldest] {
        let from_set = helm
            .template_with(&chart(), &release(on), &set)
            .unwrap_or_else(|e| panic!("Helm {}: {e}", helm.version));
        let from_file = helm
            .template(&chart(), &release(numbers))
            .unwrap_or_else(|e| panic!("Helm {}: {e}", helm.version));
        let rendered = Rendered::parse(&from_set);
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        assert_eq!(
            env(container(&pool), "OTEL_TRACES_SAMPLER_ARG").and_then(|e| e.value.as_deref()),
            Some("0.25")
        );
        assert_eq!(
            deterministic(rendered),
            deterministic(Rendered::parse(&from_file)),
            "Helm {}",
            helm.version
        );
        // Out of bounds, or no decimal, is refused as the number would be, naming the value.
        for (refused, named) in [
            ("--set=tracing.ratio=1.5", "ratio"),
            ("--set=tracing.ratio=1e-1", "ratio"),
            ("--set=prometheusRule.errorRatio=0.0", "errorRatio"),
            ("--set=prometheusRule.errorRatio=five", "errorRatio"),
            ("--set=proxy.tunnel.edgeIpVersion=5", "edgeIpVersion"),
            ("--set=prometheusRule.minRequestRate=-0.5", "minRequestRate"),
            (
                "--set=prometheusRule.inflightTargetFraction=1.01",
                "inflightTargetFraction",
            ),
        ] {
            let err = helm
                .template_with(&chart(), &release(on), &[refused])
                .err()
                .unwrap_or_else(|| panic!("Helm {} takes {refused}", helm.version));
            assert!(
                err.contains(named),
                "Helm {}, {refused}: {err}",
                helm.version
            );
        }
    }
}

/// Whether `name` is a DNS-1035 label, as a Service's name must be.
fn is_dns1035_label(name: &str) -> bool {
    let re = regex::Regex::new("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$").expect("regex");
    re.is_match(name)
}

#[test]
fn a_release_name_no_service_may_carry_fails_the_render_naming_the_fix() {
    let Some(tools) = tools("a_release_name_no_service_may_carry_fails_the_render_naming_the_fix")
    else {
        return;
    };
    // Helm takes these names (DNS-1123 subdomains), the API server refuses `<name>-proxy` as a
    // Service name: the install would stop halfway.
    let (oldest, _) = kube_versions();
    for (release, overrides, named) in [
        ("123", "", r#"release name "123""#),
        ("2edge", "", r#"release name "2edge""#),
        ("edge.prod", "", r#"release name "edge.prod""#),
        // An override that cannot name a Service either is refused the same way.
        (
            "edge",
            "fullnameOverride: 2edge",
            r#"fullnameOverride "2edge""#,
        ),
        (
            "edge",
            "fullnameOverride: Edge",
            r#"fullnameOverride "Edge""#,
        ),
    ] {
        for helm in [&tools.helm, &tools.helm_oldest] {
            let err = helm
                .template(
                    &chart(),
                    &Release {
                        name: release,
                        namespace: NAMESPACE,
                        values_files: vec![chart().join("ci/default-values.yaml")],
                        values: overrides,
                        kube_version: &oldest,
                    },
                )
                .err()
                .unwrap_or_else(|| panic!("Helm {} renders {release} {overrides:?}", helm.version));
            for expected in [named, "DNS-1035 label", "a lowercase letter first"] {
                assert!(
                    err.contains(expected),
                    "Helm {}, {release} {overrides:?}: {expected} in {err}",
                    helm.version
                );
            }
            assert_eq!(
                overrides.is_empty(),
                err.contains("set fullnameOverride"),
                "Helm {}, {release}: the fix named in {err}",
                helm.version
            );
        }
    }
}

#[test]
fn under_a_valid_fullname_override_any_release_name_renders_and_stays_a_string_in_labels() {
    let Some(tools) = tools(
        "under_a_valid_fullname_override_any_release_name_renders_and_stays_a_string_in_labels",
    ) else {
        return;
    };
    // In every label and selector the templates write (`labels`, `matchLabels`, a Service's
    // `selector`, a ServiceMonitor's `matchNames`) the release's name and namespace are
    // strings: YAML would read `123` as a number, which no label or selector takes.
    fn check(value: &Value, release: &str, found: &mut usize) {
        let expected = |key: &str| match key {
            "app.kubernetes.io/instance" => Some(release),
            "kubernetes.io/metadata.name" | "matchNames" => Some("456"),
            _ => None,
        };
        match value {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let key = k.as_str().unwrap_or_default();
                    if let Some(want) = expected(key) {
                        let got = v.as_sequence().map_or(v, |s| &s[0]);
                        assert!(got.is_string(), "{key} in {m:?}");
                        if got.as_str() == Some(want) {
                            *found += 1;
                        }
                    }
                    check(v, release, found);
                }
            }
            Value::Sequence(s) => s.iter().for_each(|v| check(v, release, found)),
            _ => {}
        }
    }
    for release in ["123", "edge.prod"] {
        let mut found = 0;
        for file in values_files() {
            let rendered = render_as(tools, release, "456", &file, "fullnameOverride: edge")
                .unwrap_or_else(|e| panic!("{release}, {file}: {e}"));
            for doc in &rendered.docs {
                check(doc, release, &mut found);
            }
            for service in rendered.all::<Service>("Service") {
                let name = service.metadata.name.expect("a name");
                assert!(is_dns1035_label(&name), "{release}, {file}: Service {name}");
            }
            // The objects are named after the override; the controller's flag carries the
            // release name as it is: the pods it admits are its selector's.
            let deployment: Deployment = rendered.one("Deployment", &controller_name("edge"));
            let run = controller_run(&deployment);
            assert_eq!(
                options(&run).render.controller_pod_labels,
                selector_labels(&deployment)
            );
            rendered.one::<Deployment>("Deployment", &pool_name("edge"));
        }
        assert!(
            found >= 20,
            "{release}: {found} label and selector values checked"
        );
    }
}

#[test]
fn an_autoscaler_floor_above_its_ceiling_fails_the_render_naming_both_values() {
    let Some(tools) =
        tools("an_autoscaler_floor_above_its_ceiling_fails_the_render_naming_both_values")
    else {
        return;
    };
    let (oldest, _) = kube_versions();
    let release = |values| Release {
        name: RELEASE,
        namespace: NAMESPACE,
        values_files: vec![chart().join("ci/default-values.yaml")],
        values,
        kube_version: &oldest,
    };
    // The API server would refuse the autoscaler halfway through the install.
    let refused = "proxy: {autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 3}}";
    for helm in [&tools.helm, &tools.helm_oldest] {
        let err = helm
            .template(&chart(), &release(refused))
            .err()
            .unwrap_or_else(|| panic!("Helm {} takes {refused}", helm.version));
        for named in [
            "proxy.autoscaling.minReplicas (5)",
            "proxy.autoscaling.maxReplicas (3)",
        ] {
            assert!(
                err.contains(named),
                "Helm {}: {named} in {err}",
                helm.version
            );
        }
        // A floor equal to the ceiling is a fixed size, and off, the values are not read.
        for taken in [
            "proxy: {autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 3}}",
            "proxy: {autoscaling: {enabled: false, minReplicas: 5, maxReplicas: 3}}",
        ] {
            helm.template(&chart(), &release(taken))
                .unwrap_or_else(|e| panic!("Helm {}, {taken}: {e}", helm.version));
        }
    }
}

#[test]
fn the_notes_warn_of_each_closed_metrics_port_by_the_switch_that_closes_it() {
    let Some(tools) =
        tools("the_notes_warn_of_each_closed_metrics_port_by_the_switch_that_closes_it")
    else {
        return;
    };
    let (_, newest) = kube_versions();
    let pool = "of the shared pool admits only the controller";
    let planes = "of every dedicated plane admits only the controller";
    let controller = "of the controller admits no one";
    for pool_policy in [false, true] {
        for plane_policy in [false, true] {
            for controller_policy in [false, true] {
                let overrides = format!(
                    "{{proxy: {{networkPolicy: {{enabled: {pool_policy}}}}}, controller: \
                     {{planeNetworkPolicy: {{enabled: {plane_policy}}}, \
                     networkPolicy: {{enabled: {controller_policy}}}}}}}"
                );
                let notes_with = |values: &str| {
                    tools
                        .helm
                        .notes(
                            &chart(),
                            &Release {
                                name: RELEASE,
                                namespace: NAMESPACE,
                                values_files: vec![chart().join("ci/default-values.yaml")],
                                values,
                                kube_version: &newest,
                            },
                        )
                        .unwrap_or_else(|e| panic!("{values}: {e}"))
                };
                let notes = notes_with(&overrides);
                for (warning, on) in [
                    (pool, pool_policy),
                    (planes, plane_policy),
                    (controller, controller_policy),
                ] {
                    assert_eq!(
                        notes.contains(warning),
                        on,
                        "{overrides}: {warning:?} in\n{notes}"
                    );
                }
                // With a monitoring selector, every policy admits Prometheus: no warning.
                let mut monitored: Value = serde_yaml_ng::from_str(&overrides).expect("YAML");
                merge(
                    &mut monitored,
                    serde_yaml_ng::from_str(
                        "proxy: {networkPolicy: {monitoringNamespaceSelector: {matchLabels: {team: monitoring}}}}",
                    )
                    .expect("YAML"),
                );
                let monitored = serde_yaml_ng::to_string(&monitored).expect("YAML");
                let notes = notes_with(&monitored);
                for warning in [pool, planes, controller] {
                    assert!(
                        !notes.contains(warning),
                        "{monitored}: {warning:?} in\n{notes}"
                    );
                }
            }
        }
    }
}
