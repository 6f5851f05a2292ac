//! What the API server does to objects of some kinds beyond storing them, as their schemas and
//! registry strategies say: the fields it defaults, the objects its validation refuses (422
//! Invalid), and Secrets' `stringData`.
//!
//! Simplification: of all the defaults and validation a real server has, only those the
//! controller meets are here: a Deployment's `spec.replicas` defaults to 1, its `spec.selector`
//! cannot change once created (`ValidateDeploymentUpdate`), an env var of its pods holds either
//! a `value` or a `valueFrom` and a probe one handler (`ValidatePodSpec`), a Lease's spec is validated
//! (`ValidateLeaseSpec`), Gateway API's status lists hold no more items than their CRDs'
//! `maxItems`, and a Gateway's `status.attachedListenerSets` is pruned by CRDs older than
//! v1.5, whose schema lacks it.

use base64::Engine as _;
use serde_json::{json, Value};

use super::served::GatewayApiCrds;

/// Fills in what the objects' schemas default: a Deployment's `spec.replicas`, 1.
pub(super) fn default_fields(object: &mut Value) {
    if object.get("kind").and_then(Value::as_str) != Some("Deployment")
        || object.pointer("/spec/replicas").is_some()
    {
        return;
    }
    if !object.get("spec").is_some_and(Value::is_object) {
        object["spec"] = json!({});
    }
    object["spec"]["replicas"] = json!(1);
}

/// Drops what the schema of the installed CRDs lacks, as the API server prunes unknown fields
/// of a structural schema: Gateways' `status.attachedListenerSets` before v1.5.
pub(super) fn prune_unknown_fields(object: &mut Value, crds: GatewayApiCrds) {
    let gateway = object.get("kind").and_then(Value::as_str) == Some("Gateway")
        && object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("gateway.networking.k8s.io/"));
    if gateway && crds == GatewayApiCrds::V1_4 {
        if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
            status.remove("attachedListenerSets");
        }
    }
}

/// The `maxItems` of Gateway API's status lists: a policy's `ancestors`, a route's `parents`.
fn status_list_max(kind: &str) -> Option<(&'static str, usize)> {
    match kind {
        "BackendTLSPolicy" => Some(("ancestors", 16)),
        "HTTPRoute" | "GRPCRoute" | "TLSRoute" | "TCPRoute" | "UDPRoute" => Some(("parents", 32)),
        _ => None,
    }
}

/// Why validation refuses `object` of `kind` in `group` named `name`, replacing `existing` if
/// it is an update, as the API server words it; `None` when it accepts it. Of the kinds here a
/// Lease's spec is checked (a duration above 0, no negative transition count), a Deployment's
/// `spec.selector` may not change, and its pod template is checked ([`invalid_pod_spec`]).
pub(super) fn invalid(
    kind: &str,
    group: &str,
    name: &str,
    object: &Value,
    existing: Option<&Value>,
) -> Option<String> {
    match kind {
        "Lease" => invalid_lease(kind, group, name, object),
        "Deployment" => {
            let mut errors = Vec::new();
            let selector = |o: &Value| o.pointer("/spec/selector").cloned();
            if let Some(existing) = existing {
                let (was, now) = (selector(existing), selector(object));
                if was != now {
                    errors.push(format!(
                        "spec.selector: Invalid value: {}: field is immutable",
                        now.unwrap_or_default()
                    ));
                }
            }
            errors.extend(invalid_pod_spec(
                object.pointer("/spec/template/spec"),
                "spec.template.spec",
            ));
            match errors.as_slice() {
                [] => None,
                [one] => Some(format!("{kind}.{group} \"{name}\" is invalid: {one}")),
                all => Some(format!(
                    "{kind}.{group} \"{name}\" is invalid: [{}]",
                    all.join(", ")
                )),
            }
        }
        _ => {
            let (list, max) = status_list_max(kind)?;
            let items = object
                .pointer(&format!("/status/{list}"))?
                .as_array()?
                .len();
            (items > max).then(|| {
                format!(
                    "{kind}.{group} \"{name}\" is invalid: status.{list}: Too many: {items}: must have at most {max} items"
                )
            })
        }
    }
}

/// What `ValidatePodSpec` says of a pod spec at `at`, of what a Deployment's pods can meet
/// here: an env var with both a `value` and a `valueFrom`, and a probe with more than one
/// handler.
fn invalid_pod_spec(spec: Option<&Value>, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for list in ["initContainers", "containers"] {
        let containers = spec.and_then(|s| s.get(list)).and_then(Value::as_array);
        for (i, container) in containers.into_iter().flatten().enumerate() {
            let at = format!("{at}.{list}[{i}]");
            let env = container.get("env").and_then(Value::as_array);
            for (j, var) in env.into_iter().flatten().enumerate() {
                let value = var.get("value").and_then(Value::as_str).unwrap_or_default();
                if !value.is_empty() && var.get("valueFrom").is_some() {
                    errors.push(format!(
                        "{at}.env[{j}].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"
                    ));
                }
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                let Some(probe_value) = container.get(probe) else {
                    continue;
                };
                let handlers = ["exec", "httpGet", "tcpSocket", "grpc"]
                    .into_iter()
                    .filter(|h| probe_value.get(*h).is_some());
                for extra in handlers.skip(1) {
                    errors.push(format!(
                        "{at}.{probe}.{extra}: Forbidden: may not specify more than 1 handler type"
                    ));
                }
            }
        }
    }
    errors
}

fn invalid_lease(kind: &str, group: &str, name: &str, object: &Value) -> Option<String> {
    let field = |f: &str| {
        object
            .pointer(&format!("/spec/{f}"))
            .and_then(Value::as_i64)
    };
    let (field, value, must) = match (field("leaseDurationSeconds"), field("leaseTransitions")) {
        (Some(d), _) if d <= 0 => ("leaseDurationSeconds", d, "must be greater than 0"),
        (_, Some(t)) if t < 0 => ("leaseTransitions", t, "must be greater than or equal to 0"),
        _ => return None,
    };
    Some(format!(
        "{kind}.{group} \"{name}\" is invalid: spec.{field}: Invalid value: {value}: {must}"
    ))
}

/// The API server stores Secrets' `stringData` as base64 `data` and never returns it.
pub(super) fn normalize_secret(object: &mut Value) {
    if object.get("kind").and_then(Value::as_str) != Some("Secret") {
        return;
    }
    let Some(string_data) = object.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let data = object
        .as_object_mut()
        .map(|o| o.entry("data").or_insert_with(|| json!({})));
    if let (Some(Value::Object(data)), Value::Object(strings)) = (data, string_data) {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                base64::engine::general_purpose::STANDARD
                    .encode(text)
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_without_replicas_gets_one_and_keeps_any_it_sets() {
        let mut unset = json!({"kind": "Deployment", "spec": {"selector": {}}});
        default_fields(&mut unset);
        assert_eq!(unset["spec"], json!({"selector": {}, "replicas": 1}));

        let mut set = json!({"kind": "Deployment", "spec": {"replicas": 0}});
        default_fields(&mut set);
        assert_eq!(set["spec"]["replicas"], 0);

        let mut other = json!({"kind": "StatefulSet", "spec": {}});
        default_fields(&mut other);
        assert_eq!(other["spec"], json!({}));
    }

    #[test]
    fn a_lease_needs_a_positive_duration_and_no_negative_transitions() {
        let lease = |spec| json!({"kind": "Lease", "spec": spec});
        let group = "coordination.k8s.io";
        assert_eq!(
            invalid(
                "Lease",
                group,
                "leader",
                &lease(json!({"leaseDurationSeconds": 0})),
                None
            ),
            Some("Lease.coordination.k8s.io \"leader\" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0".to_owned())
        );
        assert_eq!(
            invalid(
                "Lease",
                group,
                "leader",
                &lease(json!({"leaseDurationSeconds": 15, "leaseTransitions": -1})),
                None
            ),
            Some("Lease.coordination.k8s.io \"leader\" is invalid: spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0".to_owned())
        );
        let valid = lease(json!({"leaseDurationSeconds": 15, "leaseTransitions": 0}));
        assert_eq!(invalid("Lease", group, "leader", &valid, None), None);
        let not_a_lease = json!({"spec": {"leaseDurationSeconds": 0}});
        assert_eq!(invalid("Secret", "", "s", &not_a_lease, None), None);
    }

    #[test]
    fn a_deployments_selector_cannot_change_once_created() {
        let deployment = |app: &str, image: &str| {
            json!({"kind": "Deployment", "spec": {
                "selector": {"matchLabels": {"app": app}},
                "template": {"spec": {"containers": [{"name": "c", "image": image}]}},
            }})
        };
        let created = deployment("web", "web:1");
        assert_eq!(invalid("Deployment", "apps", "web", &created, None), None);
        assert_eq!(
            invalid(
                "Deployment",
                "apps",
                "web",
                &deployment("web", "web:2"),
                Some(&created)
            ),
            None,
            "the rest of the spec may change"
        );
        assert_eq!(
            invalid("Deployment", "apps", "web", &deployment("other", "web:1"), Some(&created)),
            Some("Deployment.apps \"web\" is invalid: spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"other\"}}: field is immutable".to_owned())
        );
    }

    #[test]
    fn an_env_var_takes_a_value_or_a_value_from_and_a_probe_one_handler() {
        let deployment = |env: Value, probe: Value| {
            json!({"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
                {"name": "sidecar"},
                {"name": "proxy", "env": env, "livenessProbe": probe},
            ]}}}})
        };
        let from = json!({"secretKeyRef": {"name": "s", "key": "k"}});
        let http = json!({"httpGet": {"port": 8081}});
        let valid = deployment(
            json!([{"name": "A", "valueFrom": from}, {"name": "B", "value": "", "valueFrom": from}]),
            http.clone(),
        );
        assert_eq!(invalid("Deployment", "apps", "web", &valid, None), None);
        let both = deployment(
            json!([{"name": "A", "value": "x"}, {"name": "T", "value": "x", "valueFrom": from}]),
            http.clone(),
        );
        assert_eq!(
            invalid("Deployment", "apps", "web", &both, Some(&valid)),
            Some("Deployment.apps \"web\" is invalid: spec.template.spec.containers[1].env[1].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty".to_owned())
        );
        let two = deployment(
            json!([{"name": "T", "value": "x", "valueFrom": from}]),
            json!({"httpGet": {"port": 8081}, "tcpSocket": {"port": 8081}}),
        );
        assert_eq!(
            invalid("Deployment", "apps", "web", &two, None),
            Some("Deployment.apps \"web\" is invalid: [spec.template.spec.containers[1].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty, spec.template.spec.containers[1].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type]".to_owned())
        );
    }

    #[test]
    fn a_secrets_string_data_is_stored_as_base64_data() {
        let mut secret = json!({"kind": "Secret", "data": {"kept": "eA=="},
                                "stringData": {"token": "s3cr3t"}});
        normalize_secret(&mut secret);
        assert_eq!(
            secret,
            json!({"kind": "Secret", "data": {"kept": "eA==", "token": "czNjcjN0"}})
        );

        let mut other = json!({"kind": "ConfigMap", "stringData": {"a": "b"}});
        normalize_secret(&mut other);
        assert_eq!(other["stringData"], json!({"a": "b"}));
    }
}
