//! Label and field selectors, as a list or watch's `labelSelector` and `fieldSelector` name
//! them.
//!
//! Simplifications: equality-based label terms only (`a=b`, `a==b`, `a!=b`, `a`, `!a`), not
//! the set-based ones (`a in (b, c)`, `a notin (b)`); fields `metadata.name` and
//! `metadata.namespace`, the two every resource supports, and a Secret's `type`.

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
        let text = |pointer| object.pointer(pointer).and_then(Value::as_str);
        let secret = text("/kind") == Some("Secret");
        let actual = match field.trim() {
            "metadata.name" => text("/metadata/name").unwrap_or_default(),
            "metadata.namespace" => text("/metadata/namespace").unwrap_or_default(),
            // The API server defaults a Secret's type to `Opaque`.
            "type" if secret => text("/type").unwrap_or("Opaque"),
            _ => return false,
        };
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
            ("type=Opaque", false),
        ];
        for (selector, selected) in cases {
            assert_eq!(fields_select(selector, &object), selected, "{selector:?}");
        }
        let helm = json!({"kind": "Secret", "metadata": {"name": "sh.helm.release.v1.app.v1"}, "type": "helm.sh/release.v1"});
        let plain = json!({"kind": "Secret", "metadata": {"name": "token"}});
        assert!(!fields_select("type!=helm.sh/release.v1", &helm));
        assert!(fields_select("type!=helm.sh/release.v1", &plain));
        assert!(fields_select("type=Opaque", &plain));
    }
}
