//! The GatewayConfig CustomResourceDefinition as the API server takes it: a structural schema,
//! its validation (the OpenAPI bounds and the CEL rules, evaluated here as the API server
//! would) accepting every valid object, the Go controller's examples included, and refusing
//! the invalid ones with the rule that says why; its status subresource, printer columns and
//! short name.

use cftunnel_controller_core::gateway_config::GatewayConfig;
use kube::core::cel::Validator;
use kube::CustomResourceExt;
use serde_json::{json, Value};

/// The CRD's one version's `openAPIV3Schema`.
fn schema() -> Value {
    let crd = GatewayConfig::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the CRD has a schema");
    serde_json::to_value(schema).expect("the schema encodes")
}

fn object(spec: Value) -> Value {
    json!({
        "apiVersion": "cf.k8s.lex.la/v1alpha1",
        "kind": "GatewayConfig",
        "metadata": {"name": "edge-config", "namespace": "tenant-a"},
        "spec": spec,
    })
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).expect("YAML")
}

/// Why the API server would refuse `object`: its OpenAPI validation and its CEL rules, each
/// failure as `path: message`; empty when it takes it. Fields the schema does not know are
/// reported too (as `path: pruned`): the API server would drop them silently.
fn refusals(object: &Value) -> Vec<String> {
    let schema = schema();
    let mut out = Vec::new();
    openapi(&schema, object, "", &mut out);
    if let Err(errors) = Validator::new().validate(&schema, object, None) {
        out.extend(
            errors
                .iter()
                .map(|e| format!("{}: {}", e.field_path, e.message)),
        );
    }
    out
}

/// The OpenAPI part of the API server's validation, for the keywords this schema uses.
fn openapi(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    if value.is_null() && schema["nullable"] == json!(true) {
        return;
    }
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        if !(value.is_i64() || value.is_string()) {
            out.push(format!("{path}: not an integer or string"));
        }
        return;
    }
    let typed = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    if !typed {
        out.push(format!("{path}: not of type {}", schema["type"]));
        return;
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64().filter(|min| n < *min) {
            out.push(format!("{path}: below the minimum {min}"));
        }
        if let Some(max) = schema["maximum"].as_f64().filter(|max| n > *max) {
            out.push(format!("{path}: above the maximum {max}"));
        }
    }
    if let Some(s) = value.as_str() {
        if schema["minLength"]
            .as_u64()
            .is_some_and(|min| (s.chars().count() as u64) < min)
        {
            out.push(format!("{path}: shorter than {}", schema["minLength"]));
        }
        if let Some(pattern) = schema["pattern"].as_str() {
            let re = regex::Regex::new(pattern).expect("the pattern compiles");
            if !re.is_match(s) {
                out.push(format!("{path}: does not match {pattern}"));
            }
        }
    }
    if let Some(items) = value.as_array() {
        for (i, item) in items.iter().enumerate() {
            openapi(&schema["items"], item, &format!("{path}[{i}]"), out);
        }
    }
    let Some(fields) = value.as_object() else {
        return;
    };
    for required in schema["required"].as_array().into_iter().flatten() {
        let required = required.as_str().unwrap_or_default();
        if !fields.contains_key(required) {
            out.push(format!("{path}.{required}: required"));
        }
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == json!(true) {
        return;
    }
    for (name, field) in fields {
        // Every object has these; the API server validates the metadata itself.
        if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
            continue;
        }
        let at = format!("{path}.{name}");
        match (
            schema["properties"].get(name),
            schema.get("additionalProperties"),
        ) {
            (Some(property), _) => openapi(property, field, &at, out),
            (None, Some(additional)) if additional.is_object() => {
                openapi(additional, field, &at, out)
            }
            _ => out.push(format!("{at}: pruned")),
        }
    }
}

#[test]
fn the_crd_schema_is_structural() {
    // Each node: typed (or an x-kubernetes escape), no `additionalProperties` beside
    // `properties`, array items given, no types or defaults under a logical junctor, no `$ref`,
    // and list-map keys that every item must carry.
    fn check(node: &Value, path: &str, problems: &mut Vec<String>) {
        let Some(fields) = node.as_object() else {
            problems.push(format!("{path}: not a schema"));
            return;
        };
        let escaped = node["x-kubernetes-int-or-string"] == json!(true)
            || node["x-kubernetes-preserve-unknown-fields"] == json!(true);
        if node.get("type").and_then(Value::as_str).is_none() && !escaped {
            problems.push(format!("{path}: no type"));
        }
        if fields.contains_key("properties") && fields.contains_key("additionalProperties") {
            problems.push(format!("{path}: additionalProperties beside properties"));
        }
        if fields
            .keys()
            .any(|k| k == "$ref" || k == "definitions" || k == "$defs")
        {
            problems.push(format!("{path}: a reference"));
        }
        if node["type"] == "array" && !fields.contains_key("items") {
            problems.push(format!("{path}: an array without items"));
        }
        for junctor in ["allOf", "anyOf", "oneOf", "not"] {
            let branches: Vec<&Value> = match fields.get(junctor) {
                Some(Value::Array(b)) => b.iter().collect(),
                Some(one) => vec![one],
                None => continue,
            };
            for branch in branches {
                for banned in ["description", "default", "additionalProperties", "nullable"] {
                    if branch.get(banned).is_some() {
                        problems.push(format!("{path}.{junctor}: {banned} under a junctor"));
                    }
                }
                // Only int-or-string may type its branches.
                if branch.get("type").is_some() && node["x-kubernetes-int-or-string"] != json!(true)
                {
                    problems.push(format!("{path}.{junctor}: a type under a junctor"));
                }
            }
        }
        if node["x-kubernetes-list-type"] == "map" {
            let required = node["items"]["required"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for key in node["x-kubernetes-list-map-keys"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if !required.contains(key) {
                    problems.push(format!("{path}: list-map key {key} is not required"));
                }
            }
        }
        for (name, property) in fields
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(property, &format!("{path}.{name}"), problems);
        }
        if let Some(items) = fields.get("items") {
            check(items, &format!("{path}[]"), problems);
        }
        if let Some(additional) = fields.get("additionalProperties").filter(|a| a.is_object()) {
            check(additional, &format!("{path}{{}}"), problems);
        }
    }
    let schema = schema();
    let mut problems = Vec::new();
    check(&schema, "", &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    // The metadata is left to the API server, which restricts nothing else of it.
    assert!(schema["properties"]["metadata"]
        .as_object()
        .is_none_or(|m| m.keys().all(|k| k == "type")));
}

/// Every example of the Go controller's documentation and CRD reference, and ours, is taken
/// whole: no rule refuses it and no field of it is dropped.
#[test]
fn the_go_controllers_examples_and_ours_are_valid() {
    let examples = [
        // The Go controller's per-Gateway isolation guide.
        "spec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 2}",
        "spec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {minReplicas: 2, maxReplicas: 10, targetInflightPerPod: 50}}",
        // Its CRD reference: no minReplicas, so 2.
        "spec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {maxReplicas: 10, targetInflightPerPod: 50}}",
        // Every field its CRD has.
        r#"spec:
  tunnelTokenSecretRef: {name: edge-tunnel-token, key: tunnel-token}
  cloudflareCredentialsSecretRef: {name: cf-api, key: api-token}
  authTokenSecretRef: {name: proxy-auth, key: auth-token}
  autoscaling: {minReplicas: 1, maxReplicas: 100, targetInflightPerPod: 1, metricName: inflight}
  resources: {limits: {cpu: 500m, memory: 512Mi}, requests: {cpu: 100m, memory: 128Mi}}
  image: ghcr.io/lexfrei/cloudflare-tunnel-gateway-controller-proxy:v1.2.3@sha256:0123abcd
status:
  conditions: []
"#,
        // Ours: the documented example, and the fields only we have.
        "spec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 2}",
        r#"spec:
  tunnelTokenSecretRef: {name: edge-tunnel-token}
  replicas: 0
  image: registry.example:5000/cftunnel-proxy:1.0
  imagePullSecrets: [{name: pull}]
  nodeSelector: {pool: edge}
  tolerations: [{key: edge, operator: Exists, effect: NoSchedule}]
  priorityClassName: edge-critical
"#,
        // A ceiling of one without a floor: the floor defaults to one with it.
        "spec: {tunnelTokenSecretRef: {name: t}, autoscaling: {maxReplicas: 1}}",
        // The guide's fixed count with its autoscaling block added: the autoscaler owns the
        // count, and the replicas come back when the block is removed.
        "spec: {tunnelTokenSecretRef: {name: t}, replicas: 2, autoscaling: {minReplicas: 2, maxReplicas: 10, targetInflightPerPod: 50}}",
    ];
    for example in examples {
        let mut value = yaml(example);
        value["apiVersion"] = json!("cf.k8s.lex.la/v1alpha1");
        value["kind"] = json!("GatewayConfig");
        value["metadata"] = json!({"name": "edge-config", "namespace": "tenant-a"});
        assert_eq!(refusals(&value), Vec::<String>::new(), "{example}");
        let parsed: GatewayConfig = serde_json::from_value(value).expect("the type reads it");
        assert_eq!(parsed.metadata.name.as_deref(), Some("edge-config"));
    }
    let go: GatewayConfig = serde_json::from_value(object(json!({
        "tunnelTokenSecretRef": {"name": "t"},
        "autoscaling": {"maxReplicas": 3, "targetInflightPerPod": 9, "metricName": "m"},
    })))
    .expect("parses");
    let autoscaling = go.spec.autoscaling.expect("autoscaling");
    assert_eq!(autoscaling.metric_name.as_deref(), Some("m"));
    assert_eq!(autoscaling.target_inflight_per_pod, Some(9));
}

#[test]
fn invalid_objects_are_refused_with_the_rule_that_says_why() {
    let refused = |spec: Value| refusals(&object(spec));
    let token = json!({"name": "t"});
    let cases = [
        (
            json!({"tunnelTokenSecretRef": token, "autoscaling": {"minReplicas": 5, "maxReplicas": 4}}),
            "spec.autoscaling: minReplicas must not be above maxReplicas",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "replicas": 101}),
            ".spec.replicas: above the maximum 100",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "replicas": -1}),
            ".spec.replicas: below the minimum 0",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "autoscaling": {"maxReplicas": 0}}),
            ".spec.autoscaling.maxReplicas: below the minimum 1",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "autoscaling": {"maxReplicas": 101}}),
            ".spec.autoscaling.maxReplicas: above the maximum 100",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "autoscaling": {"minReplicas": 0, "maxReplicas": 3}}),
            ".spec.autoscaling.minReplicas: below the minimum 1",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "autoscaling": {"maxReplicas": 3, "targetInflightPerPod": 0}}),
            ".spec.autoscaling.targetInflightPerPod: below the minimum 1",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "image": " proxy:1"}),
            ".spec.image: does not match ^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$",
        ),
        (
            json!({"tunnelTokenSecretRef": token, "image": "proxy:1 --privileged"}),
            ".spec.image: does not match ^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$",
        ),
        (
            json!({"tunnelTokenSecretRef": {"name": ""}}),
            ".spec.tunnelTokenSecretRef.name: shorter than 1",
        ),
        (
            json!({"replicas": 2}),
            ".spec.tunnelTokenSecretRef: required",
        ),
    ];
    for (spec, why) in cases {
        assert_eq!(refused(spec.clone()), vec![why.to_owned()], "{spec}");
    }
}

#[test]
fn the_crd_has_a_status_subresource_printer_columns_and_a_short_name() {
    let crd = serde_json::to_value(GatewayConfig::crd()).expect("encodes");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["gwconfig"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"], json!({"status": {}}));
    let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default(),
                c["jsonPath"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Tunnel Token Secret", ".spec.tunnelTokenSecretRef.name"),
            ("Replicas", ".spec.replicas"),
            ("Min", ".spec.autoscaling.minReplicas"),
            ("Max", ".spec.autoscaling.maxReplicas"),
            ("In Use", ".status.conditions[?(@.type==\"InUse\")].status"),
            (
                "Rendered",
                ".status.conditions[?(@.type==\"Rendered\")].status"
            ),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
    let status = &schema()["properties"]["status"]["properties"];
    assert_eq!(status["observedGeneration"]["type"], "integer");
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        json!(["type"])
    );

    // A status the controller writes passes the schema.
    let mut written = object(json!({"tunnelTokenSecretRef": {"name": "t"}}));
    written["status"] = json!({
        "observedGeneration": 3,
        "conditions": [{
            "type": "InUse", "status": "True", "reason": "Referenced",
            "message": "used by Gateway edge", "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
    });
    assert_eq!(refusals(&written), Vec::<String>::new());
}
