//! The chart's files as text and data, no tool needed: the CRD, the values the templates read,
//! the schema and the README.

use super::*;
use cftunnel_controller::cli::CrdKind;

/// Each CRD file of the chart and the kind whose definition it holds.
const CRD_FILES: &[(&str, CrdKind)] = &[
    ("gatewayconfigs.cf.k8s.lex.la.yaml", CrdKind::GatewayConfig),
    ("accesspolicies.cf.k8s.lex.la.yaml", CrdKind::AccessPolicy),
    (
        "externalbackends.cf.k8s.lex.la.yaml",
        CrdKind::ExternalBackend,
    ),
    (
        "gatewayclassconfigs.cf.k8s.lex.la.yaml",
        CrdKind::GatewayClassConfig,
    ),
];

#[test]
fn the_charts_crd_files_are_the_ones_the_controller_defines() {
    for (file, kind) in CRD_FILES {
        let generated = kind.yaml().expect("CRD encodes");
        let shipped = read(&chart().join("crds").join(file));
        assert_eq!(
            shipped, generated,
            "regenerate with: cftunnel-controller crd {kind:?} > charts/cftunnel/crds/{file}"
        );
    }
    let mut files: Vec<String> = std::fs::read_dir(chart().join("crds"))
        .expect("crds/ lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = CRD_FILES.iter().map(|(f, _)| (*f).to_owned()).collect();
    expected.sort();
    assert_eq!(files, expected, "every CRD file is generated");
}

#[test]
fn the_crd_schemas_are_structural() {
    for (file, _) in CRD_FILES {
        let crd = yaml(&chart().join("crds").join(file));
        let versions = crd["spec"]["versions"].as_sequence().expect("versions");
        assert!(!versions.is_empty());
        for version in versions {
            let faults = text::structural_faults(&version["schema"]["openAPIV3Schema"]);
            assert!(
                faults.is_empty(),
                "{file} {:?}: {faults:#?}",
                version["name"]
            );
        }
    }
}

#[test]
fn the_templates_do_not_rely_on_and_or_stopping_at_the_first_deciding_argument() {
    let mut faults = Vec::new();
    for (file, text) in templates() {
        faults.extend(
            text::short_circuit_reliance(&text)
                .into_iter()
                .map(|f| format!("{file}: {f}")),
        );
    }
    assert!(faults.is_empty(), "{faults:#?}");
}

#[test]
fn every_value_the_templates_read_is_in_values_yaml() {
    let values = yaml(&chart().join("values.yaml"));
    let mut read_any = false;
    for (file, text) in templates() {
        for path in text::values_read(&text) {
            read_any = true;
            assert!(
                path.split('.')
                    .try_fold(&values, |v, key| v.get(key))
                    .is_some(),
                "{file} reads .Values.{path} which values.yaml does not define"
            );
        }
    }
    assert!(read_any);
}

/// The leaves of `values` (dotted paths), not descending into what `schema` leaves free-form
/// (no `properties`): label maps, resources, affinity.
fn leaves(values: &Value, schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    match (values, schema.get("properties")) {
        // An empty selector: the value itself.
        (Value::Mapping(m), Some(properties)) if !m.is_empty() => {
            for (key, value) in m {
                let key = key.as_str().expect("string keys");
                let path = if path.is_empty() {
                    key.to_owned()
                } else {
                    format!("{path}.{key}")
                };
                let sub = properties
                    .get(key)
                    .unwrap_or_else(|| panic!("values.schema.json has no {path}"));
                leaves(value, sub, &path, out);
            }
            // And the other way: every value the schema knows is in values.yaml (`global`,
            // which Helm passes from a parent chart, aside).
            for key in properties.as_object().expect("properties").keys() {
                assert!(
                    key == "global" || m.contains_key(key.as_str()),
                    "values.yaml has no {path}.{key}, which values.schema.json describes"
                );
            }
        }
        _ => out.push(path.to_owned()),
    }
}

#[test]
fn every_value_is_in_the_schema_and_the_readme() {
    let values = yaml(&chart().join("values.yaml"));
    let schema: serde_json::Value =
        serde_json::from_str(&read(&chart().join("values.schema.json"))).expect("JSON");
    let mut paths = Vec::new();
    leaves(&values, &schema, "", &mut paths);
    let readme = read(&chart().join("../README.md"));
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !readme.contains(&format!("| `{p}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "charts/README.md's table lacks {missing:?}"
    );
    // Every schema node says what it is for.
    fn described(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        for (key, sub) in schema
            .get("properties")
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flatten()
        {
            let path = format!("{path}.{key}");
            if sub.get("description").is_none() {
                out.push(path.clone());
            }
            described(sub, &path, out);
        }
    }
    let mut undescribed = Vec::new();
    described(&schema, "", &mut undescribed);
    assert!(undescribed.is_empty(), "no description: {undescribed:?}");
}

#[test]
fn the_readme_states_the_kubernetes_and_helm_releases_chart_yaml_does() {
    let meta = yaml(&chart().join("Chart.yaml"));
    let readme = read(&chart().join("../README.md"));
    let (oldest, newest) = kube_versions();
    let minor = |v: &str| v.trim_end_matches(".0").to_owned();
    let stated = format!("Kubernetes {} to {}", minor(&oldest), minor(&newest));
    assert!(
        readme.contains(&stated),
        "the README does not say {stated:?}"
    );
    let helm = meta["annotations"]["cf.k8s.lex.la/minimum-helm-version"]
        .as_str()
        .expect("the minimum Helm version");
    let stated = format!("Helm {helm} or newer");
    assert!(
        readme.contains(&stated),
        "the README does not say {stated:?}"
    );
}
