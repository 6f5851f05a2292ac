//! A dedicated plane in the release namespace stays out of the chart's selectors as the CI
//! values set them, whatever labels its Gateway asks for: a plane's pods behind the shared
//! pool's Service would be
//! pushed the pool's config with the pool's token; under its budget, policies, autoscaler or
//! monitor they would be counted, admitted or scraped as the pool's.

use super::*;
use std::sync::Arc;

/// Every label selector of `value`, a rendered object, that may pick pods or Services of the
/// release namespace, with where it sits: each `matchLabels` but a namespace selector's, and
/// but a pod selector's beside a namespace selector that picks other namespaces (the DNS
/// pods of the egress policy). Empty ones, which select every pod on purpose, are left out.
fn selectors_in(value: &Value, path: &str, out: &mut Vec<(String, BTreeMap<String, String>)>) {
    match value {
        Value::Mapping(map) => {
            let namespaces = label_map(&value["namespaceSelector"]["matchLabels"]);
            let elsewhere = namespaces.iter().any(|(k, v)| {
                (k.as_str(), v.as_str()) != ("kubernetes.io/metadata.name", NAMESPACE)
            });
            for (key, child) in map {
                let key = key.as_str().unwrap_or("?");
                if elsewhere && key == "podSelector" {
                    continue;
                }
                let here = format!("{path}.{key}");
                if key == "matchLabels" && !path.ends_with("namespaceSelector") {
                    let labels = label_map(child);
                    if !labels.is_empty() {
                        out.push((here.clone(), labels));
                    }
                }
                selectors_in(child, &here, out);
            }
        }
        Value::Sequence(items) => {
            for (i, child) in items.iter().enumerate() {
                selectors_in(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The chart's selectors, named by kind, object and place: `matchLabels` anywhere but in a
/// namespace selector, and each Service's `spec.selector`. Not in a CustomResourceDefinition,
/// whose `matchLabels` are schemas.
fn chart_selectors(rendered: &Rendered) -> Vec<(String, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    for doc in &rendered.docs {
        if doc["kind"].as_str() == Some("CustomResourceDefinition") {
            continue;
        }
        let name = format!(
            "{} {}",
            doc["kind"].as_str().unwrap_or("?"),
            doc["metadata"]["name"].as_str().unwrap_or("?")
        );
        selectors_in(doc, &name, &mut out);
        if doc["kind"].as_str() == Some("Service") {
            let labels = label_map(&doc["spec"]["selector"]);
            if !labels.is_empty() {
                out.push((format!("{name}.spec.selector"), labels));
            }
        }
    }
    out
}

/// The plane the controller, run with `options`, renders for Gateway `edge` of the tenant
/// fixture moved into the release namespace, its infrastructure labels `labels` beside the
/// fixture's own.
fn plane_labelled(
    options: &RuntimeOptions,
    labels: &BTreeMap<String, String>,
) -> render::DataPlane {
    let tenant = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tenant.yaml");
    let text = read(&tenant).replace("namespace: tenant-a", &format!("namespace: {NAMESPACE}"));
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &text, "tenant.yaml").expect("the fixture loads");
    let mut gateway = snapshot
        .gateways
        .iter()
        .find(|g| g.metadata.name.as_deref() == Some("edge"))
        .cloned()
        .expect("Gateway edge");
    Arc::make_mut(&mut gateway)
        .spec
        .infrastructure
        .as_mut()
        .and_then(|i| i.labels.as_mut())
        .expect("the fixture's Gateway has infrastructure labels")
        .extend(labels.clone());
    let config = &snapshot.gateway_configs[0];
    let credentials =
        render::resolve(&gateway, config, &snapshot.secrets, "fresh").expect("credentials");
    render::render(&gateway, config, &credentials, &options.render).expect("the plane renders")
}

/// Every label set of `plane`: its objects' and its pods'.
fn plane_label_sets(plane: &render::DataPlane) -> Vec<(&'static str, BTreeMap<String, String>)> {
    let template = plane
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone());
    [
        ("Deployment", plane.deployment.metadata.labels.clone()),
        ("pod template", template),
        ("Service", plane.service.metadata.labels.clone()),
        (
            "NetworkPolicy",
            plane
                .network_policy
                .as_ref()
                .and_then(|n| n.metadata.labels.clone()),
        ),
        (
            "HorizontalPodAutoscaler",
            plane
                .autoscaler
                .as_ref()
                .and_then(|a| a.metadata.labels.clone()),
        ),
        (
            "Secret",
            plane
                .auth_secret
                .as_ref()
                .and_then(|s| s.metadata.labels.clone()),
        ),
    ]
    .into_iter()
    .filter_map(|(what, labels)| Some((what, labels?)))
    .collect()
}

#[test]
fn a_gateway_given_the_charts_selector_labels_gets_a_plane_none_of_them_selects() {
    let Some(tools) =
        tools("a_gateway_given_the_charts_selector_labels_gets_a_plane_none_of_them_selects")
    else {
        return;
    };
    let mut kinds = BTreeSet::new();
    for file in values_files() {
        let rendered = render(tools, &file, "");
        let controller: Deployment = rendered.one("Deployment", &controller_name(RELEASE));
        let options = options(&controller_run(&controller));
        let pool: Service = rendered.one("Service", &pool_name(RELEASE));
        let pool_selector = pool
            .spec
            .and_then(|s| s.selector)
            .expect("the pool's selector");
        let plain = plane_label_sets(&plane_labelled(&options, &BTreeMap::new()));
        let mut tested = Vec::new();
        for (place, selector) in chart_selectors(&rendered) {
            let selects = |labels: &BTreeMap<String, String>| {
                selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            };
            // One the values chose that picks every plane whatever its Gateway says (a spread
            // over `app.kubernetes.io/name` alone) is no Gateway's doing.
            if plain.iter().any(|(_, labels)| selects(labels)) {
                continue;
            }
            let plane = plane_labelled(&options, &selector);
            assert_eq!(
                plane.deployment.metadata.namespace.as_deref(),
                Some(NAMESPACE)
            );
            let sets = plane_label_sets(&plane);
            assert!(sets.len() >= 4, "{file}: {sets:?}");
            for (what, labels) in sets {
                // The Gateway's labels do reach the plane.
                assert_eq!(
                    labels.get("team").map(String::as_str),
                    Some("a"),
                    "{file}: {what}"
                );
                assert!(
                    !selects(&labels),
                    "{file}: {place} {selector:?} selects the plane's {what} {labels:?}"
                );
            }
            kinds.insert(place.split(' ').next().unwrap_or_default().to_owned());
            tested.push(selector);
        }
        assert!(
            tested.contains(&pool_selector),
            "{file}: the pool's Service selector among {tested:?}"
        );
    }
    // The kinds that select the pool's pods or Service, each seen in some values file.
    for kind in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "PodMonitor",
    ] {
        assert!(kinds.contains(kind), "no {kind} selector in {kinds:?}");
    }
}
