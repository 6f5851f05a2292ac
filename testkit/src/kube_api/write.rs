//! Whole-object writes: `create` (`POST`: 409 AlreadyExists for a name taken), `replace`
//! (`PUT`: applied only to the resourceVersion it names, if it names one) and `delete` (with
//! a uid precondition, if the `DeleteOptions` carry one). Each records the writer's fields in
//! `managedFields` and answers as the API server does.
//!
//! Simplification: a deletion is immediate (no finalizers, no graceful deletion).

use hyper::StatusCode;
use serde_json::Value;

use super::apply;
use super::cluster::Cluster;
use super::request::{json_body, Req};
use super::response::{not_json, respond, status, Reply};
use super::schema::default_fields;
use super::store::Event;

pub(super) fn create(cluster: &Cluster, req: &Req<'_>, body: &[u8]) -> Reply {
    let Some(object) = json_body(body) else {
        return not_json();
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required value",
        );
    }
    if let Some(invalid) = req.invalid(&name, &object, None) {
        return invalid;
    }
    let key = req.key(&name);
    let mut store = cluster.lock();
    if store.get(&key).is_some() {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", req.target.plural),
        );
    }
    let mut object = req.typed(object);
    apply::update(None, &mut object, req.manager());
    default_fields(&mut object);
    let created = store.created(object, &key.2);
    let stored = cluster.write(&mut store, key, created, Event::Added);
    respond(StatusCode::CREATED, &req.typed(stored))
}

/// `PUT`: the whole object, applied only to the resourceVersion it names (if it names one).
pub(super) fn replace(cluster: &Cluster, req: &Req<'_>, body: &[u8]) -> Reply {
    let Some(mut object) = json_body(body) else {
        return not_json();
    };
    let name = req.name();
    let key = req.key(&name);
    let mut store = cluster.lock();
    let Some(existing) = store.get(&key).cloned() else {
        return req.not_found(&name);
    };
    let current = existing.pointer("/metadata/resourceVersion").cloned();
    if let Some(wanted) = object.pointer("/metadata/resourceVersion") {
        if Some(wanted) != current.as_ref() {
            return req.stale(&name);
        }
    }
    if let Some(invalid) = req.invalid(&name, &object, Some(&existing)) {
        return invalid;
    }
    if let (Some(meta), Some(old)) = (
        object.get_mut("metadata").and_then(Value::as_object_mut),
        existing.get("metadata"),
    ) {
        for f in ["uid", "creationTimestamp", "generation"] {
            if let Some(v) = old.get(f) {
                meta.insert(f.into(), v.clone());
            }
        }
    }
    let mut object = req.typed(object);
    apply::update(Some(&existing), &mut object, req.manager());
    default_fields(&mut object);
    let stored = cluster.write(&mut store, key, object, Event::Modified);
    respond(StatusCode::OK, &req.typed(stored))
}

pub(super) fn delete(cluster: &Cluster, req: &Req<'_>, body: &[u8]) -> Reply {
    let name = req.name();
    let key = req.key(&name);
    let mut store = cluster.lock();
    let Some(existing) = store.get(&key).cloned() else {
        return req.not_found(&name);
    };
    // DeleteOptions preconditions.
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
    {
        if existing.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    existing
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                ),
            );
        }
    }
    let gone = cluster.write(&mut store, key, existing, Event::Deleted);
    respond(StatusCode::OK, &req.typed(gone))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube_api::fixtures::{cluster_with, decoded, request};

    const SECRETS: &str = "/api/v1/namespaces/a/secrets";
    const ONE: &str = "/api/v1/namespaces/a/secrets/one";

    fn secret(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": "a"}, "data": {"k": "dg=="}})
    }

    fn body(object: &Value) -> Vec<u8> {
        object.to_string().into_bytes()
    }

    #[tokio::test]
    async fn a_create_stores_the_object_under_the_writers_manager_once() {
        let cluster = cluster_with(&[]);
        let create_one = |manager: &str| {
            let path = format!("{SECRETS}?fieldManager={manager}");
            request(&path, "", |r| create(&cluster, r, &body(&secret("one"))))
        };
        let (code, created) = decoded(create_one("writer")).await;
        assert_eq!(code, 201);
        assert_eq!(created["metadata"]["resourceVersion"], "1");
        assert_eq!(created["metadata"]["managedFields"][0]["manager"], "writer");
        assert_eq!(
            created["metadata"]["uid"],
            "00000000-0000-4000-8000-000000000001"
        );

        let (code, again) = decoded(create_one("writer")).await;
        assert_eq!((code, &again["reason"]), (409, &json!("AlreadyExists")));
    }

    #[tokio::test]
    async fn a_create_without_a_name_or_failing_validation_is_invalid() {
        let cluster = cluster_with(&[]);
        let nameless = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
        let (code, refused) = decoded(request(SECRETS, "", |r| {
            create(&cluster, r, &body(&nameless))
        }))
        .await;
        assert_eq!((code, &refused["reason"]), (422, &json!("Invalid")));

        let lease = json!({"metadata": {"name": "leader"}, "spec": {"leaseDurationSeconds": 0}});
        let leases = "/apis/coordination.k8s.io/v1/namespaces/a/leases";
        let (code, _) = decoded(request(leases, "", |r| create(&cluster, r, &body(&lease)))).await;
        assert_eq!(code, 422);
        let (code, _) = decoded(request(SECRETS, "", |r| create(&cluster, r, b"{"))).await;
        assert_eq!(code, 400);
        assert_eq!(cluster.lock().resource_version(), 0, "nothing stored");
    }

    #[tokio::test]
    async fn a_replace_keeps_identity_and_applies_only_to_the_version_it_names() {
        let cluster = cluster_with(&[secret("one")]);
        let mut stale = secret("one");
        stale["metadata"]["resourceVersion"] = json!("7");
        let (code, refused) =
            decoded(request(ONE, "", |r| replace(&cluster, r, &body(&stale)))).await;
        assert_eq!((code, &refused["reason"]), (409, &json!("Conflict")));

        let mut current = secret("one");
        current["metadata"]["resourceVersion"] = json!("1");
        current["data"] = json!({"k": "dw=="});
        let (code, replaced) =
            decoded(request(ONE, "", |r| replace(&cluster, r, &body(&current)))).await;
        assert_eq!(code, 200);
        assert_eq!(replaced["metadata"]["resourceVersion"], "2");
        assert_eq!(
            replaced["metadata"]["uid"],
            "00000000-0000-4000-8000-000000000001"
        );
        assert_eq!(replaced["data"], json!({"k": "dw=="}));

        let other = "/api/v1/namespaces/a/secrets/other";
        let (code, _) = decoded(request(other, "", |r| {
            replace(&cluster, r, &body(&secret("other")))
        }))
        .await;
        assert_eq!(code, 404);
    }

    #[tokio::test]
    async fn a_delete_honours_a_uid_precondition() {
        let cluster = cluster_with(&[secret("one")]);
        let wrong = json!({"preconditions": {"uid": "another"}});
        let (code, refused) =
            decoded(request(ONE, "", |r| delete(&cluster, r, &body(&wrong)))).await;
        assert_eq!((code, &refused["reason"]), (409, &json!("Conflict")));

        let right = json!({"preconditions": {"uid": "00000000-0000-4000-8000-000000000001"}});
        let (code, gone) = decoded(request(ONE, "", |r| delete(&cluster, r, &body(&right)))).await;
        assert_eq!(code, 200);
        assert_eq!(gone["metadata"]["resourceVersion"], "2");
        let (code, _) = decoded(request(ONE, "", |r| delete(&cluster, r, b""))).await;
        assert_eq!(code, 404);
    }
}
