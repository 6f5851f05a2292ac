//! What of a live object its render decides: the values the live object holds at the paths the
//! rendered object sets.
//!
//! The runtime keeps these as the API server returned them after an apply, and compares them
//! with the watch cache's objects on every round: a difference is an edit that departs from the
//! render, which applying again restores. What others write (status, labels and annotations of
//! their own, fields the API server defaults) lies outside these paths and never counts, and
//! values the API server normalises (quantities) compare as it stored them, so an unchanged
//! object compares equal without a request.

use serde_json::Value;

/// The values of `live` at the paths `rendered` sets: for an object, its keys that `rendered`
/// has (`null` where `live` lacks one); for a list as long as the rendered one, item by item;
/// anything else, including a list of another length, as `live` has it whole.
pub fn owned_fields(rendered: &Value, live: &Value) -> Value {
    match (rendered, live) {
        (Value::Object(rendered), Value::Object(live)) => Value::Object(
            rendered
                .iter()
                .map(|(key, r)| {
                    let l = live.get(key).unwrap_or(&Value::Null);
                    (key.clone(), owned_fields(r, l))
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
}
