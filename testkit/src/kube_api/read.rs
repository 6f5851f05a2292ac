//! Reads: `get` of one object and `list` of a collection (the whole cluster's or a namespace's),
//! with label selectors and metadata-only answers. A list's items carry no `apiVersion` and
//! `kind` (the list does), and its `resourceVersion` is the last write's, to watch from.
//!
//! Simplification: no pagination (`limit` and `continue` are ignored; a list is whole).

use hyper::StatusCode;
use serde_json::{json, Value};

use super::cluster::Cluster;
use super::partial_metadata::{as_partial_metadata, wants_metadata, META_API_VERSION};
use super::request::Req;
use super::response::{respond, Reply};
use super::selector::Selection;

pub(super) fn list(cluster: &Cluster, req: &Req<'_>) -> Reply {
    let selection = Selection::of(req.params);
    let metadata_only = wants_metadata(req.accept, true);
    let store = cluster.lock();
    let items: Vec<Value> = store
        .objects()
        .filter(|((g, p, ns, _), v)| {
            *g == req.target.group
                && *p == req.target.plural
                && req.target.namespace.as_ref().is_none_or(|t| t == ns)
                && selection.selects(v)
        })
        .map(|(_, v)| {
            if metadata_only {
                return as_partial_metadata(v);
            }
            // List items carry no apiVersion and kind; the list does.
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("apiVersion");
                o.remove("kind");
            }
            v
        })
        .collect();
    let (api_version, kind) = if metadata_only {
        (META_API_VERSION, "PartialObjectMetadataList".to_owned())
    } else {
        (req.api_version, format!("{}List", req.kind))
    };
    respond(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"resourceVersion": store.resource_version().to_string()}, "items": items}),
    )
}

pub(super) fn get(cluster: &Cluster, req: &Req<'_>) -> Reply {
    let name = req.name();
    let store = cluster.lock();
    match store.get(&req.key(&name)) {
        Some(v) if wants_metadata(req.accept, false) => {
            respond(StatusCode::OK, &as_partial_metadata(v))
        }
        Some(v) => respond(StatusCode::OK, &req.typed(v.clone())),
        None => req.not_found(&name),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kube_api::fixtures::{cluster_with, decoded, request};

    fn secret(namespace: &str, name: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}}})
    }

    fn names(list: &Value) -> Vec<&str> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect()
    }

    #[tokio::test]
    async fn a_list_is_typed_as_a_whole_at_the_last_resource_version() {
        let cluster = cluster_with(&[
            secret("a", "one", "web"),
            secret("a", "two", "api"),
            secret("b", "three", "web"),
        ]);
        let (code, listed) = decoded(request("/api/v1/namespaces/a/secrets", "", |r| {
            list(&cluster, r)
        }))
        .await;
        assert_eq!(code, 200);
        assert_eq!(
            (&listed["apiVersion"], &listed["kind"]),
            (&json!("v1"), &json!("SecretList"))
        );
        assert_eq!(listed["metadata"]["resourceVersion"], "3");
        assert_eq!(names(&listed), ["one", "two"]);
        let item = &listed["items"][0];
        assert_eq!((item.get("apiVersion"), item.get("kind")), (None, None));
    }

    #[tokio::test]
    async fn a_list_takes_every_namespace_or_one_and_a_label_selector() {
        let cluster = cluster_with(&[
            secret("a", "one", "web"),
            secret("a", "two", "api"),
            secret("b", "three", "web"),
        ]);
        let listed = |path: &'static str| {
            let cluster = Arc::clone(&cluster);
            async move { decoded(request(path, "", |r| list(&cluster, r))).await.1 }
        };
        assert_eq!(
            names(&listed("/api/v1/secrets").await),
            ["one", "two", "three"]
        );
        assert_eq!(
            names(&listed("/api/v1/secrets?labelSelector=app%3Dweb").await),
            ["one", "three"]
        );
        assert_eq!(
            names(&listed("/api/v1/namespaces/b/secrets?labelSelector=app%3Dapi").await),
            Vec::<&str>::new()
        );
    }

    #[tokio::test]
    async fn a_metadata_only_list_and_get_answer_partial_object_metadata() {
        let cluster = cluster_with(&[secret("a", "one", "web")]);
        let accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let (_, listed) = decoded(request("/api/v1/secrets", accept, |r| list(&cluster, r))).await;
        assert_eq!(
            (&listed["apiVersion"], &listed["kind"]),
            (
                &json!("meta.k8s.io/v1"),
                &json!("PartialObjectMetadataList")
            )
        );
        assert_eq!(listed["items"][0]["kind"], "PartialObjectMetadata");

        let accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
        let (_, got) = decoded(request("/api/v1/namespaces/a/secrets/one", accept, |r| {
            get(&cluster, r)
        }))
        .await;
        assert_eq!(got["kind"], "PartialObjectMetadata");
        assert_eq!(got["metadata"]["name"], "one");
    }

    #[tokio::test]
    async fn a_get_answers_the_object_typed_or_404() {
        let cluster = cluster_with(&[secret("a", "one", "web")]);
        let (code, got) = decoded(request("/api/v1/namespaces/a/secrets/one", "", |r| {
            get(&cluster, r)
        }))
        .await;
        assert_eq!(code, 200);
        assert_eq!(
            (&got["apiVersion"], &got["kind"]),
            (&json!("v1"), &json!("Secret"))
        );
        let (code, missing) = decoded(request("/api/v1/namespaces/b/secrets/one", "", |r| {
            get(&cluster, r)
        }))
        .await;
        assert_eq!(code, 404);
        assert_eq!(missing["reason"], "NotFound");
    }
}
