//! RBAC, enforced as for one service account bound to the rules a test gives the server: a
//! request whose API group, resource (with its subresource, as `gateways/status`) and verb no
//! rule grants gets 403 Forbidden, as the API server's authorizer words it. The verb is the API
//! server's: `get` (a `GET` naming an object), `list`, `watch` (a `GET` of a collection with
//! `watch=true`), `create` (`POST`), `patch`, `update` (`PUT`), `delete` and
//! `deletecollection` (a `DELETE` of a collection). Discovery is every client's
//! (`system:discovery`).
//!
//! A client bearing [`USER_TOKEN`] is a cluster admin instead, as a test acting as a user or as
//! another controller (scaling a Deployment, deleting an object by hand).
//!
//! Simplification: namespaces are not told apart (a Role in one namespace is a ClusterRole
//! here), and rules name no objects (`resourceNames`).

use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};
use serde_json::json;

use super::response::{respond, Reply};
use super::target::{is_watch, Params, Target};

/// One RBAC rule: (API group, resource, verbs); the resource may name a subresource, as
/// `gateways/status`. The core group is `""`.
pub type Rule = (&'static str, &'static str, &'static [&'static str]);

/// The bearer token of the cluster admin; any other client (none, or another token) is the
/// service account, held to the server's rules.
pub(super) const USER_TOKEN: &str = "cluster-admin";

/// The user the service account's refusals name.
const SERVICE_ACCOUNT: &str = "system:serviceaccount:cftunnel-system:cftunnel-controller";

/// Whether a request's headers are the cluster admin's.
pub(super) fn is_user(headers: &HeaderMap) -> bool {
    headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        == Some(USER_TOKEN)
}

/// The RBAC verb of a request, as the API server tells it.
pub(super) fn verb_of(target: &Target, params: &Params, method: &Method) -> String {
    match (method.as_str(), target.name.is_some()) {
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) if is_watch(params) => "watch",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (other, _) => return other.to_lowercase(),
    }
    .to_owned()
}

/// The RBAC resource a path names: the plural, with its subresource (`gateways/status`).
pub(super) fn resource_of(target: &Target) -> String {
    if target.status {
        format!("{}/status", target.plural)
    } else if target.scale {
        format!("{}/scale", target.plural)
    } else {
        target.plural.clone()
    }
}

/// Whether `rules` grant the service account the request.
pub(super) fn granted(rules: &[Rule], target: &Target, params: &Params, method: &Method) -> bool {
    let (resource, verb) = (resource_of(target), verb_of(target, params, method));
    rules.iter().any(|(group, r, verbs)| {
        *group == target.group && *r == resource && verbs.contains(&verb.as_str())
    })
}

/// The API server's answer to a request RBAC does not allow, as its authorizer words it.
pub(super) fn forbidden(target: &Target, params: &Params, method: &Method) -> Reply {
    let verb = verb_of(target, params, method);
    let resource = if target.group.is_empty() {
        target.plural.clone()
    } else {
        format!("{}.{}", target.plural, target.group)
    };
    let object = target
        .name
        .as_ref()
        .map(|n| format!(" {n:?}"))
        .unwrap_or_default();
    let scope = target.namespace.as_ref().map_or_else(
        || "at the cluster scope".to_owned(),
        |ns| format!("in the namespace {ns:?}"),
    );
    let message = format!(
        "{resource}{object} is forbidden: User \"{SERVICE_ACCOUNT}\" cannot {verb} resource {:?} in API group {:?} {scope}",
        resource_of(target), target.group
    );
    let mut details = json!({"group": target.group, "kind": target.plural});
    if let Some(name) = &target.name {
        details["name"] = name.as_str().into();
    }
    respond(
        StatusCode::FORBIDDEN,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": "Forbidden", "details": details, "code": 403}),
    )
}

/// The API server's answer to a request for a path that names no resource (discovery's) that
/// it does not allow.
pub(super) fn forbidden_path(path: &str, method: &Method) -> Reply {
    let verb = method.as_str().to_lowercase();
    respond(
        StatusCode::FORBIDDEN,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("forbidden: User \"{SERVICE_ACCOUNT}\" cannot {verb} path {path:?}"),
                "reason": "Forbidden", "details": {}, "code": 403}),
    )
}

#[cfg(test)]
mod tests;
