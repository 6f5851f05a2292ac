//! What both Deployments take from the values: pod overrides, service accounts, budgets.

use super::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

#[test]
fn the_budgets_cover_their_deployments_pods() {
    let Some(tools) = tools("the_budgets_cover_their_deployments_pods") else {
        return;
    };
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        for (component, name) in [
            ("controller", controller_name(RELEASE)),
            ("proxy", pool_name(RELEASE)),
        ] {
            let deployment: Deployment = rendered.one("Deployment", &name);
            let budget = rendered.get::<PodDisruptionBudget>("PodDisruptionBudget", &name);
            let enabled = at(&values, &format!("{component}.podDisruptionBudget.enabled"));
            assert_eq!(
                budget.is_some(),
                enabled.as_bool() == Some(true),
                "{file}: {name}"
            );
            let Some(budget) = budget else { continue };
            let spec = budget.spec.expect("spec");
            assert_eq!(
                spec.selector.and_then(|s| s.match_labels),
                Some(selector_labels(&deployment)),
                "{file}: {name}"
            );
            assert_eq!(
                spec.max_unavailable.map(|m| match m {
                    IntOrString::Int(n) => n.to_string(),
                    IntOrString::String(s) => s,
                }),
                Some(string(
                    &values,
                    &format!("{component}.podDisruptionBudget.maxUnavailable")
                )),
                "{file}: {name}"
            );
        }
    }
}

#[test]
fn the_pod_overrides_reach_both_deployments() {
    let Some(tools) = tools("the_pod_overrides_reach_both_deployments") else {
        return;
    };
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        for (component, name) in [
            ("controller", controller_name(RELEASE)),
            ("proxy", pool_name(RELEASE)),
        ] {
            let value = |key: &str| at(&values, &format!("{component}.{key}")).clone();
            let deployment = rendered.raw("Deployment", &name);
            let pod = &deployment["spec"]["template"];
            let spec = &pod["spec"];
            let main = &spec["containers"][0];
            // The pod's labels: the values' and the chart's, which win a clash.
            let labels = label_map(&pod["metadata"]["labels"]);
            for (k, v) in label_map(&value("podLabels")) {
                assert!(labels.contains_key(&k), "{file}: {name} label {k}");
                if !selector_labels(&rendered.one("Deployment", &name)).contains_key(&k) {
                    assert_eq!(labels[&k], v, "{file}: {name} label {k}");
                }
            }
            let annotations = label_map(&pod["metadata"]["annotations"]);
            for (k, v) in label_map(&value("podAnnotations")) {
                assert_eq!(
                    annotations.get(&k),
                    Some(&v),
                    "{file}: {name} annotation {k}"
                );
            }
            let or_null = |v: Value| match v {
                Value::Mapping(m) if m.is_empty() => Value::Null,
                Value::Sequence(s) if s.is_empty() => Value::Null,
                Value::String(s) if s.is_empty() => Value::Null,
                v => v,
            };
            for (key, rendered_value) in [
                ("podSecurityContext", &spec["securityContext"]),
                ("securityContext", &main["securityContext"]),
                ("priorityClassName", &spec["priorityClassName"]),
                ("nodeSelector", &spec["nodeSelector"]),
                ("tolerations", &spec["tolerations"]),
                ("affinity", &spec["affinity"]),
            ] {
                assert_eq!(rendered_value, &or_null(value(key)), "{file}: {name} {key}");
            }
            assert_eq!(
                or_null(main["resources"].clone()),
                or_null(value("resources")),
                "{file}: {name} resources"
            );
            assert_eq!(
                spec["imagePullSecrets"],
                or_null(at(&values, "imagePullSecrets").clone()),
                "{file}: {name}"
            );
            for probe in ["readinessProbe", "livenessProbe"] {
                for (timing, v) in value(probe).as_mapping().expect("timings") {
                    assert_eq!(&main[probe][timing], v, "{file}: {name} {probe}.{timing:?}");
                }
            }
            // Spread: the values' constraints, else one per node and zone on the pods' own
            // labels, else none.
            let spread = &spec["topologySpreadConstraints"];
            let own = or_null(value("topologySpreadConstraints"));
            if !own.is_null() {
                assert_eq!(spread, &own, "{file}: {name}");
            } else if value("spreadAcrossNodes").as_bool() == Some(true) {
                let constraints = spread.as_sequence().expect("constraints");
                assert_eq!(constraints.len(), 2, "{file}: {name}");
                for c in constraints {
                    assert_eq!(
                        label_map(&c["labelSelector"]["matchLabels"]),
                        selector_labels(&rendered.one("Deployment", &name))
                    );
                }
            } else {
                assert!(spread.is_null(), "{file}: {name}");
            }
            // The service account: the chart's or the values'; the pool never mounts a token.
            let account = spec["serviceAccountName"].as_str().expect("an account");
            let create = value("serviceAccount")
                .get("create")
                .and_then(Value::as_bool)
                == Some(true);
            let named = string(&values, &format!("{component}.serviceAccount.name"));
            let expected = match (create, named.is_empty()) {
                (_, false) => named,
                (true, true) => name.clone(),
                (false, true) => "default".to_owned(),
            };
            assert_eq!(account, expected, "{file}: {name}");
            let created = rendered.get::<ServiceAccount>("ServiceAccount", account);
            assert_eq!(created.is_some(), create, "{file}: {name}");
            if let Some(created) = created {
                assert_eq!(
                    created.metadata.annotations.unwrap_or_default(),
                    label_map(at(
                        &values,
                        &format!("{component}.serviceAccount.annotations")
                    )),
                );
            }
            if component == "proxy" {
                assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
            }
        }
    }
}

/// By default both Deployments run as the images' own non-root user and name no UID or GID:
/// OpenShift's `restricted-v2` SCC refuses a pod asking for a UID outside the namespace's
/// range. `runAsNonRoot` holds because each image's `USER` is numeric and not root (the
/// kubelet cannot check a user name).
#[test]
fn by_default_both_deployments_run_as_the_images_non_root_user_and_name_no_uid() {
    let Some(tools) =
        tools("by_default_both_deployments_run_as_the_images_non_root_user_and_name_no_uid")
    else {
        return;
    };
    let rendered = render(tools, "default-values.yaml", "");
    for name in [controller_name(RELEASE), pool_name(RELEASE)] {
        let deployment: Deployment = rendered.one("Deployment", &name);
        let context = pod_spec(&deployment)
            .security_context
            .clone()
            .expect("a pod security context");
        assert_eq!(context.run_as_non_root, Some(true), "{name}");
        assert_eq!(
            (context.run_as_user, context.run_as_group, context.fs_group),
            (None, None, None),
            "{name}"
        );
        let container = container(&deployment)
            .security_context
            .clone()
            .expect("a container security context");
        assert_eq!(
            (container.run_as_user, container.run_as_group),
            (None, None),
            "{name}"
        );
    }
    let dockerfile = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"));
    let users: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .collect();
    assert_eq!(users.len(), 2, "a USER for each image: {users:?}");
    for user in users {
        let ids: Vec<u32> = user
            .trim()
            .split(':')
            .map(|id| id.parse().unwrap_or_else(|e| panic!("USER {user}: {e}")))
            .collect();
        assert!(ids.first().is_some_and(|&uid| uid != 0), "USER {user}");
    }
}

/// A dedicated plane the controller renders spreads its replicas as the chart's pool does by
/// default (`spreadAcrossNodes`), constraint for constraint, on the plane's own pods.
#[test]
fn a_dedicated_plane_spreads_its_replicas_as_the_pool_does_by_default() {
    let Some(tools) = tools("a_dedicated_plane_spreads_its_replicas_as_the_pool_does_by_default")
    else {
        return;
    };
    let values = values("default-values.yaml", "");
    assert_eq!(at(&values, "proxy.spreadAcrossNodes").as_bool(), Some(true));
    let rendered = render(tools, "default-values.yaml", "");
    let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
    let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
    let plane = plane(&options(&controller_run(&controller))).deployment;
    let mut expected = pod_spec(&pool)
        .topology_spread_constraints
        .clone()
        .expect("the pool's spread");
    for constraint in &mut expected {
        constraint.label_selector = selector(selector_labels(&plane));
    }
    assert_eq!(pod_spec(&plane).topology_spread_constraints, Some(expected));
}

/// The shared pool's pods carry the label the controller reads proxy pods' state by, whatever
/// labels the values add: the pool's failures name what its pods' state says, and a pool
/// whose pods are still being created is not reported, as a rendered plane's.
#[test]
fn the_pools_pods_carry_the_label_the_controller_reads_proxy_pods_by() {
    let Some(tools) = tools("the_pools_pods_carry_the_label_the_controller_reads_proxy_pods_by")
    else {
        return;
    };
    let (name, value) = cftunnel_controller::render::PROXY_POD_LABEL;
    let overridden = format!("proxy:\n  podLabels:\n    {name}: other\n");
    for file in values_files() {
        for set in ["", overridden.as_str()] {
            let rendered = render(tools, &file, set);
            let deployment: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
            let labels = deployment
                .spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.labels)
                .unwrap_or_default();
            assert_eq!(
                labels.get(name).map(String::as_str),
                Some(value),
                "{file} {set}: {labels:?}"
            );
        }
    }
}
