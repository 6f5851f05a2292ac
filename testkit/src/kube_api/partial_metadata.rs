//! Metadata-only responses: a list, watch or get whose `Accept` asks for
//! `as=PartialObjectMetadata` (`…List` for a list) in `meta.k8s.io/v1` gets the objects'
//! metadata only, as kube's metadata-only `Api` asks.

use serde_json::{json, Value};

/// The group and version of `PartialObjectMetadata` and `PartialObjectMetadataList`.
pub(super) const META_API_VERSION: &str = "meta.k8s.io/v1";

/// Whether an `Accept` header asks for `PartialObjectMetadata` (`list`: `…List`) in
/// `meta.k8s.io/v1`, as `application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`.
pub(super) fn wants_metadata(accept: &str, list: bool) -> bool {
    let wanted = if list {
        "PartialObjectMetadataList"
    } else {
        "PartialObjectMetadata"
    };
    accept.split(',').any(|media| {
        let params: Vec<(&str, &str)> = media
            .split(';')
            .skip(1)
            .filter_map(|p| p.trim().split_once('='))
            .collect();
        let param = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        media.trim_start().starts_with("application/json")
            && param("as") == Some(wanted)
            && param("g") == Some("meta.k8s.io")
            && param("v") == Some("v1")
    })
}

/// An object as `PartialObjectMetadata`: its metadata, under that kind.
pub(super) fn as_partial_metadata(object: &Value) -> Value {
    json!({
        "apiVersion": META_API_VERSION,
        "kind": "PartialObjectMetadata",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_accept_naming_the_kind_group_and_version_asks_for_metadata() {
        let list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let one = "application/json; as=PartialObjectMetadata; g=meta.k8s.io; v=v1";
        assert!(wants_metadata(list, true));
        assert!(!wants_metadata(list, false));
        assert!(wants_metadata(one, false));
        assert!(!wants_metadata(one, true));
        // As kube sends it: the metadata first, plain JSON as the fallback.
        assert!(wants_metadata(&format!("{list},application/json"), true));
        assert!(!wants_metadata("application/json", true));
        assert!(!wants_metadata("", false));
        assert!(!wants_metadata(
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
            false
        ));
        assert!(!wants_metadata(
            "application/yaml;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            false
        ));
    }

    #[test]
    fn partial_metadata_keeps_the_metadata_alone() {
        let object = json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": "a", "labels": {"x": "y"}}, "data": {"k": "dg=="}});
        assert_eq!(
            as_partial_metadata(&object),
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": {"name": "a", "labels": {"x": "y"}}})
        );
        assert_eq!(
            as_partial_metadata(&json!({}))["metadata"],
            json!({}),
            "an object without metadata has empty metadata"
        );
    }
}
