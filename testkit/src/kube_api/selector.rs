//! Label selectors, as a list or watch's `labelSelector` names them.
//!
//! Simplification: equality-based terms only (`a=b`, `a==b`, `a!=b`, `a`, `!a`), not the
//! set-based ones (`a in (b, c)`, `a notin (b)`).

use serde_json::Value;

/// Whether `object`'s labels satisfy every comma-separated term of `selector`; an empty
/// selector selects everything.
pub(super) fn selects(selector: &str, object: &Value) -> bool {
    let labels = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object);
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            label(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            label(k.trim()) == Some(v.trim_start_matches('=').trim())
        } else if let Some(k) = term.strip_prefix('!') {
            label(k.trim()).is_none()
        } else {
            label(term.trim()).is_some()
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_kind_of_term_selects_as_the_api_server_does() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "edge"}}});
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=api", false),
            ("app!=api", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=edge", true),
            ("app=web,tier=core", false),
            ("app = web , tier", true),
        ];
        for (selector, selected) in cases {
            assert_eq!(selects(selector, &object), selected, "{selector:?}");
        }
    }

    #[test]
    fn an_object_without_labels_matches_only_absence_and_inequality() {
        let object = json!({"metadata": {"name": "bare"}});
        assert!(selects("", &object));
        assert!(selects("!app", &object));
        assert!(selects("app!=web", &object));
        assert!(!selects("app", &object));
        assert!(!selects("app=web", &object));
    }
}
