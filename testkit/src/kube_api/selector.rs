//! Label and field selectors, as a list or watch's `labelSelector` and `fieldSelector` name
//! them.
//!
//! Simplifications: equality-based label terms only (`a=b`, `a==b`, `a!=b`, `a`, `!a`), not
//! the set-based ones (`a in (b, c)`, `a notin (b)`); fields `metadata.name` and
//! `metadata.namespace` only, the two every resource supports.

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

/// Whether `object` satisfies every comma-separated term of the field selector `selector`
/// (`metadata.name=a`, `metadata.namespace!=b`); an empty selector selects everything, and a
/// term on another field selects nothing (the API server refuses it).
pub(super) fn fields_select(selector: &str, object: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (field, value, equal) = match term.split_once("!=") {
            Some((f, v)) => (f, v, false),
            None => match term.split_once('=') {
                Some((f, v)) => (f, v.trim_start_matches('='), true),
                None => return false,
            },
        };
        let actual = match field.trim() {
            "metadata.name" => object.pointer("/metadata/name"),
            "metadata.namespace" => object.pointer("/metadata/namespace"),
            _ => return false,
        }
        .and_then(Value::as_str)
        .unwrap_or_default();
        (actual == value.trim()) == equal
    })
}

/// What a list or watch selects: its label and field selectors together.
pub(super) struct Selection {
    labels: String,
    fields: String,
}

impl Selection {
    /// The selection `params` (a request's query) asks for.
    pub(super) fn of(params: &std::collections::BTreeMap<String, String>) -> Self {
        let param = |name| params.get(name).cloned().unwrap_or_default();
        Self {
            labels: param("labelSelector"),
            fields: param("fieldSelector"),
        }
    }

    pub(super) fn selects(&self, object: &Value) -> bool {
        selects(&self.labels, object) && fields_select(&self.fields, object)
    }
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

    #[test]
    fn field_selectors_take_name_and_namespace() {
        let object = json!({"metadata": {"name": "edge", "namespace": "a"}});
        let cases = [
            ("", true),
            ("metadata.name=edge", true),
            ("metadata.name==edge", true),
            ("metadata.name=other", false),
            ("metadata.name!=other", true),
            ("metadata.name=edge,metadata.namespace=a", true),
            ("metadata.name=edge,metadata.namespace=b", false),
            ("spec.nodeName=x", false),
        ];
        for (selector, selected) in cases {
            assert_eq!(fields_select(selector, &object), selected, "{selector:?}");
        }
    }
}
