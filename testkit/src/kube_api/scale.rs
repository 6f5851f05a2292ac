//! The `scale` subresource of a Deployment, as the HorizontalPodAutoscaler controller uses it:
//! `GET` reads an `autoscaling/v1` Scale, `PATCH` (merge) and `PUT` set `spec.replicas`, the
//! writer's field manager taking the field (recorded with `subresource: scale`).

use hyper::{Method, StatusCode};
use serde_json::{json, Value};

use super::apply;
use super::cluster::Cluster;
use super::request::{json_body, Req};
use super::response::{method_not_allowed, respond, status, Reply};
use super::store::Event;

/// A Deployment as its `Scale`.
fn as_scale(deployment: &Value) -> Value {
    let d = deployment;
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": d.pointer("/metadata/name"),
            "namespace": d.pointer("/metadata/namespace"),
            "uid": d.pointer("/metadata/uid"),
            "resourceVersion": d.pointer("/metadata/resourceVersion"),
        },
        "spec": {"replicas": d.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {"replicas": d.pointer("/status/replicas").cloned().unwrap_or(json!(0))},
    })
}

pub(super) fn scale(cluster: &Cluster, req: &Req<'_>, method: &Method, body: &[u8]) -> Reply {
    let name = req.name();
    let key = req.key(&name);
    if req.kind != "Deployment" {
        return req.not_found(&name);
    }
    let mut store = cluster.lock();
    let Some(existing) = store.get(&key).cloned() else {
        return req.not_found(&name);
    };
    if *method == Method::GET {
        return respond(StatusCode::OK, &as_scale(&existing));
    }
    if !matches!(*method, Method::PATCH | Method::PUT) {
        return method_not_allowed();
    }
    let Some(replicas) = json_body(body).and_then(|b| b.pointer("/spec/replicas").cloned()) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.replicas: Required value",
        );
    };
    let mut updated = existing.clone();
    updated["spec"]["replicas"] = replicas;
    if updated == existing {
        return respond(StatusCode::OK, &as_scale(&existing));
    }
    apply::update_subresource(Some(&existing), &mut updated, req.manager(), Some("scale"));
    let generation = existing
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    updated["metadata"]["generation"] = (generation + 1).into();
    let stored = cluster.write(&mut store, key, updated, Event::Modified);
    respond(StatusCode::OK, &as_scale(&stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_reads_as_an_autoscaling_v1_scale() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": "4"},
            "spec": {"replicas": 3}, "status": {"replicas": 2}});
        assert_eq!(
            as_scale(&deployment),
            json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                   "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": "4"},
                   "spec": {"replicas": 3}, "status": {"replicas": 2}})
        );
        let unscaled = json!({"metadata": {"name": "web"}});
        assert_eq!(as_scale(&unscaled)["spec"], json!({"replicas": 0}));
        assert_eq!(as_scale(&unscaled)["status"], json!({"replicas": 0}));
    }
}
