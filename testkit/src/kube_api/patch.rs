//! `PATCH`: server-side apply (`application/apply-patch+yaml`, [`apply::apply`]; creates the
//! object if it is not there) or a JSON merge patch ([`merge_patch`]); either applies only to
//! the resourceVersion it names, if it names one (optimistic concurrency). On the `status` subresource only `status` changes, and
//! elsewhere `status` is left alone. A change of `spec` takes the next generation. A write that
//! changes nothing keeps the resourceVersion, as on a real server.
//!
//! Simplification: strategic merge patches and JSON patches are taken as merge patches.

use hyper::StatusCode;
use serde_json::{json, Value};

use super::apply;
use super::cluster::Cluster;
use super::merge::merge_patch;
use super::request::Req;
use super::response::{not_json, respond, status, Reply};
use super::schema::{default_fields, normalize_secret, prune_unknown_fields};
use super::store::Event;

pub(super) fn patch(cluster: &Cluster, req: &Req<'_>, content_type: &str, body: &[u8]) -> Reply {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return not_json();
    };
    let name = req.name();
    let key = req.key(&name);
    let mut store = cluster.lock();
    let existing = store.get(&key).cloned();
    let is_apply = content_type.starts_with("application/apply-patch");
    // Optimistic concurrency: a patch or an apply naming a resourceVersion applies only to that
    // version of an object there.
    if let (Some(wanted), Some(current)) = (
        patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
        existing
            .as_ref()
            .and_then(|e| e.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str),
    ) {
        if wanted != current {
            return req.stale(&name);
        }
    }
    if is_apply && req.params.get("fieldManager").is_none_or(String::is_empty) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "PATCH with apply requires fieldManager",
        );
    }
    let manager = req.manager();
    let force = req.params.get("force").is_some_and(|f| f == "true");
    let mut updated = match (existing.clone(), is_apply) {
        (None, true) if !req.target.status => {
            let mut applied = patch;
            normalize_secret(&mut applied);
            let mut object = applied.clone();
            if let Err(conflict) = apply::apply(&mut object, &applied, manager, force) {
                return status(StatusCode::CONFLICT, "Conflict", &conflict);
            }
            store.created(req.typed(object), &key.2)
        }
        (None, _) => return req.not_found(&name),
        (Some(mut object), _) if req.target.status => {
            // The status subresource takes only `status`.
            if let Some(s) = patch.get("status") {
                merge_patch(&mut object, &json!({ "status": s }));
            }
            object
        }
        (Some(existing), true) => {
            let mut applied = patch;
            normalize_secret(&mut applied);
            let mut object = existing.clone();
            if let Err(conflict) = apply::apply(&mut object, &applied, manager, force) {
                return status(StatusCode::CONFLICT, "Conflict", &conflict);
            }
            object
        }
        (Some(mut object), false) => {
            let mut patch = patch;
            if let Some(p) = patch.as_object_mut() {
                p.remove("status");
                if let Some(meta) = p.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
            }
            merge_patch(&mut object, &patch);
            apply::update(existing.as_ref(), &mut object, manager);
            object
        }
    };
    default_fields(&mut updated);
    prune_unknown_fields(&mut updated, cluster.crds().gateway_api);
    if let Some(invalid) = req.invalid(&name, &updated, existing.as_ref()) {
        return invalid;
    }
    if let Some(existing) = &existing {
        if updated.get("spec") != existing.get("spec") && !req.target.status {
            let generation = existing
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            updated["metadata"]["generation"] = (generation + 1).into();
        }
    }
    let unchanged = existing.as_ref().is_some_and(|e| {
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("apiVersion");
                o.remove("kind");
            }
            v
        };
        strip(e) == strip(&updated)
    });
    if unchanged {
        return respond(StatusCode::OK, &req.typed(updated));
    }
    let event = if existing.is_some() {
        Event::Modified
    } else {
        Event::Added
    };
    let stored = cluster.write(&mut store, key, updated, event);
    respond(
        if event == Event::Added {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &req.typed(stored),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::fixtures::{cluster_with, decoded, request};

    const MERGE: &str = "application/merge-patch+json";
    const APPLY: &str = "application/apply-patch+yaml";
    const WEB: &str = "/apis/apps/v1/namespaces/a/deployments/web";

    fn deployment(replicas: u32) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "a"},
               "spec": {"replicas": replicas}, "status": {"readyReplicas": 0}})
    }

    async fn patched(
        cluster: &Cluster,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> (u16, Value) {
        let body = body.to_string().into_bytes();
        decoded(request(path, "", |r| {
            patch(cluster, r, content_type, &body)
        }))
        .await
    }

    #[tokio::test]
    async fn a_merge_patch_of_the_spec_takes_the_next_generation_and_leaves_status_alone() {
        let cluster = cluster_with(&[deployment(1)]);
        let change = json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 9}});
        let (code, object) = patched(&cluster, WEB, MERGE, &change).await;
        assert_eq!(code, 200);
        assert_eq!(object["spec"]["replicas"], 2);
        assert_eq!(object["status"], json!({"readyReplicas": 0}));
        assert_eq!(object["metadata"]["generation"], 2);
        assert_eq!(object["metadata"]["resourceVersion"], "2");
    }

    #[tokio::test]
    async fn a_merge_patch_naming_a_stale_resource_version_is_a_conflict() {
        let cluster = cluster_with(&[deployment(1)]);
        let stale = json!({"metadata": {"resourceVersion": "9"}, "spec": {"replicas": 2}});
        let (code, refused) = patched(&cluster, WEB, MERGE, &stale).await;
        assert_eq!((code, &refused["reason"]), (409, &json!("Conflict")));
        let current = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 2}});
        assert_eq!(patched(&cluster, WEB, MERGE, &current).await.0, 200);
    }

    #[tokio::test]
    async fn an_apply_naming_a_stale_resource_version_is_a_conflict() {
        let cluster = cluster_with(&[deployment(1)]);
        let apply = format!("{WEB}?fieldManager=ctl&force=true");
        let mut stale = deployment(2);
        stale["metadata"]["resourceVersion"] = json!("9");
        let (code, refused) = patched(&cluster, &apply, APPLY, &stale).await;
        assert_eq!((code, &refused["reason"]), (409, &json!("Conflict")));
        let mut current = deployment(2);
        current["metadata"]["resourceVersion"] = json!("1");
        let (code, applied) = patched(&cluster, &apply, APPLY, &current).await;
        assert_eq!((code, &applied["spec"]["replicas"]), (200, &json!(2)));
        assert_eq!(applied["metadata"]["resourceVersion"], "2");
    }

    #[tokio::test]
    async fn the_status_subresource_takes_only_status_and_keeps_the_generation() {
        let cluster = cluster_with(&[deployment(1)]);
        let status = format!("{WEB}/status");
        let change = json!({"spec": {"replicas": 5}, "status": {"readyReplicas": 1}});
        let (code, object) = patched(&cluster, &status, MERGE, &change).await;
        assert_eq!(code, 200);
        assert_eq!(object["spec"]["replicas"], 1);
        assert_eq!(object["status"], json!({"readyReplicas": 1}));
        assert_eq!(object["metadata"]["generation"], 1);
    }

    #[tokio::test]
    async fn an_apply_needs_a_field_manager_and_creates_what_is_missing() {
        let cluster = cluster_with(&[]);
        let applied = deployment(3);
        assert_eq!(patched(&cluster, WEB, APPLY, &applied).await.0, 400);
        let (code, object) = patched(
            &cluster,
            &format!("{WEB}?fieldManager=ctl"),
            APPLY,
            &applied,
        )
        .await;
        assert_eq!(code, 201);
        assert_eq!(object["metadata"]["managedFields"][0]["manager"], "ctl");
        let status = format!("{}/status?fieldManager=ctl", WEB.replace("web", "api"));
        assert_eq!(patched(&cluster, &status, APPLY, &applied).await.0, 404);
    }

    /// A Deployment's selector is immutable: a merge patch or an apply that changes it is
    /// refused with 422 Invalid and changes nothing; one that keeps it goes through.
    #[tokio::test]
    async fn a_change_of_a_deployments_selector_is_invalid() {
        let mut web = deployment(1);
        web["spec"]["selector"] = json!({"matchLabels": {"app": "web"}});
        let cluster = cluster_with(&[web]);
        let other = json!({"spec": {"selector": {"matchLabels": {"app": "other"}}}});
        let (code, refused) = patched(&cluster, WEB, MERGE, &other).await;
        assert_eq!((code, &refused["reason"]), (422, &json!("Invalid")));
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Deployment.apps \"web\" is invalid: spec.selector:")
                && message.ends_with("field is immutable"),
            "{message}"
        );
        let mut applied = deployment(1);
        applied["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
        let apply = format!("{WEB}?fieldManager=ctl&force=true");
        assert_eq!(patched(&cluster, &apply, APPLY, &applied).await.0, 422);
        assert_eq!(cluster.lock().resource_version(), 1, "nothing stored");

        let same = json!({"spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}}});
        assert_eq!(patched(&cluster, WEB, MERGE, &same).await.0, 200);
    }

    #[tokio::test]
    async fn a_patch_that_changes_nothing_keeps_the_resource_version() {
        let cluster = cluster_with(&[]);
        let path = format!("{WEB}?fieldManager=ctl");
        patched(&cluster, &path, APPLY, &deployment(3)).await;
        let (code, object) = patched(&cluster, &path, APPLY, &deployment(3)).await;
        assert_eq!(code, 200);
        assert_eq!(object["metadata"]["resourceVersion"], "1");
        assert_eq!(cluster.lock().resource_version(), 1);
    }
}
