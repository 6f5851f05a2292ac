//! What of a live object its render decides: the values the live object holds at the paths the
//! rendered object sets.
//!
//! The runtime keeps these as the API server returned them after an apply, and compares them
//! with the watch cache's objects on every round: a difference is an edit that departs from the
//! render, which applying again restores. What others write (status, labels and annotations of
//! their own, fields the API server defaults) lies outside these paths and never counts, and
//! values the API server normalises (quantities) compare as it stored them, so an unchanged
//! object compares equal without a request.
//!
//! A field server-side apply treats as one value is taken whole, keys the render does not set
//! included: the label selectors (Kubernetes' `LabelSelector` is atomic) and a Service's
//! `spec.selector` (an atomic map). A key someone adds to one changes what it selects (the
//! NetworkPolicy then guards none of the plane's pods, the Service reaches none of them), and
//! the next apply, which replaces the selector whole, removes it.

use serde_json::Value;

/// The keys under which the rendered objects hold atomic selectors: a Deployment's
/// `spec.selector`, a Service's `spec.selector`, a NetworkPolicy's `podSelector` and
/// `namespaceSelector`, a topology spread constraint's `labelSelector`.
const ATOMIC_SELECTORS: [&str; 4] = [
    "selector",
    "podSelector",
    "namespaceSelector",
    "labelSelector",
];

/// The values of `live` at the paths `rendered` sets: for an object, its keys that `rendered`
/// has (`null` where `live` lacks one), a selector whole; for a list as long as the rendered
/// one, item by item; anything else, including a list of another length, as `live` has it
/// whole.
pub fn owned_fields(rendered: &Value, live: &Value) -> Value {
    match (rendered, live) {
        (Value::Object(rendered), Value::Object(live)) => Value::Object(
            rendered
                .iter()
                .map(|(key, r)| {
                    let l = live.get(key).unwrap_or(&Value::Null);
                    if ATOMIC_SELECTORS.contains(&key.as_str()) {
                        (key.clone(), l.clone())
                    } else {
                        (key.clone(), owned_fields(r, l))
                    }
                })
                .collect(),
        ),
        (Value::Array(rendered), Value::Array(live)) if rendered.len() == live.len() => {
            Value::Array(
                rendered
                    .iter()
                    .zip(live)
                    .map(|(r, l)| owned_fields(r, l))
                    .collect(),
            )
        }
        _ => live.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_others_set_are_left_out_and_ours_kept_as_live_holds_them() {
        let rendered = json!({
            "metadata": {"labels": {"app": "proxy"}},
            "spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]},
        });
        let live = json!({
            "metadata": {"labels": {"app": "proxy", "team": "a"}, "resourceVersion": "9"},
            "spec": {"containers": [{"name": "proxy", "image": "proxy:1", "imagePullPolicy": "IfNotPresent"}]},
            "status": {"readyReplicas": 2},
        });
        assert_eq!(owned_fields(&rendered, &live), rendered);
    }

    #[test]
    fn an_edit_of_a_rendered_field_shows() {
        let rendered = json!({"spec": {"ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "c"}}}]}]}});
        let opened = json!({"spec": {"ingress": [{"from": [{"namespaceSelector": {}}]}]}});
        assert_eq!(
            owned_fields(&rendered, &opened),
            json!({"spec": {"ingress": [{"from": [{"podSelector": null}]}]}})
        );
        let added = json!({"spec": {"ingress": [{"from": [
            {"podSelector": {"matchLabels": {"app": "c"}}},
            {"namespaceSelector": {}},
        ]}]}});
        assert_eq!(
            owned_fields(&rendered, &added)["spec"]["ingress"][0]["from"],
            added["spec"]["ingress"][0]["from"],
            "a list of another length is taken whole"
        );
        let removed = json!({"spec": {}});
        assert_eq!(
            owned_fields(&rendered, &removed),
            json!({"spec": {"ingress": null}})
        );
    }

    #[test]
    fn a_key_added_to_a_selector_shows() {
        let rendered = json!({"spec": {
            "podSelector": {"matchLabels": {"app": "proxy"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "c"}}}]}],
        }});
        assert_eq!(owned_fields(&rendered, &rendered), rendered);
        let narrowed = json!({"spec": {
            "podSelector": {"matchLabels": {"app": "proxy", "extra": "x"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "c"}}}]}],
        }});
        assert_eq!(owned_fields(&rendered, &narrowed), narrowed);
        let expressions = json!({"spec": {
            "podSelector": {"matchLabels": {"app": "proxy"},
                            "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "c"}}}]}],
        }});
        assert_eq!(owned_fields(&rendered, &expressions), expressions);
        let widened = json!({"spec": {
            "podSelector": {"matchLabels": {"app": "proxy"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "c", "x": "y"}}}]}],
        }});
        assert_ne!(owned_fields(&rendered, &widened), rendered);

        let service = json!({"spec": {"selector": {"app": "proxy"}, "ports": [{"port": 8081}]}});
        let mut added = service.clone();
        added["spec"]["selector"]["extra"] = json!("x");
        added["spec"]["clusterIP"] = json!("None");
        assert_eq!(
            owned_fields(&service, &added),
            json!({"spec": {"selector": {"app": "proxy", "extra": "x"}, "ports": [{"port": 8081}]}}),
            "the selector whole, the fields the render does not set left out"
        );
    }
}
