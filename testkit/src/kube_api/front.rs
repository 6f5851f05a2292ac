//! The HTTP front: serves HTTP/1.1 connections on the server's listener, reads each request,
//! tells discovery's paths from resources', authorizes it ([`rbac`](super::rbac)) before it is
//! routed, as the API server does, lets the test's refusals and holds have it first, and routes
//! it to the handler of its verb. It records the `Accept` header of every `GET`.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::Value;

use super::call::Call;
use super::cluster::Cluster;
use super::discovery::discovery;
use super::hold::Holds;
use super::patch::patch;
use super::rbac::{forbidden, forbidden_path, granted, is_user, Rule};
use super::read::{get, list};
use super::refusal::{failure, Refusals, Refused};
use super::request::Req;
use super::response::{method_not_allowed, not_served, respond, status, Reply};
use super::scale::scale;
use super::served::{api_version, kind_of, serves};
use super::store::key_for;
use super::target::{is_watch, parse_path, parse_query};
use super::watch::watch;
use super::write::{create, delete, replace};

/// What the front needs to answer requests.
pub(super) struct Front {
    pub(super) cluster: Arc<Cluster>,
    /// What the service account is granted.
    rbac: &'static [Rule],
    pub(super) holds: Arc<Holds>,
    pub(super) refusals: Arc<Refusals>,
    /// The `Accept` header of every `GET` (get, list, watch), by kind, in arrival order; a
    /// discovery document's kind is its own (`APIGroupList`, `APIGroup`, `APIResourceList`,
    /// `APIVersions`).
    accepts: Mutex<Vec<(&'static str, String)>>,
}

impl Front {
    pub(super) fn new(cluster: Arc<Cluster>, rbac: &'static [Rule]) -> Self {
        Self {
            cluster,
            rbac,
            holds: Arc::default(),
            refusals: Arc::default(),
            accepts: Mutex::new(Vec::new()),
        }
    }

    /// Serves every connection `listener` accepts, each on a task of its own, until dropped.
    pub(super) async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let front = Arc::clone(&self);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let front = Arc::clone(&front);
                    async move { Ok::<_, Infallible>(front.handle(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    /// The `Accept` header of every `GET` of `kind` so far.
    pub(super) fn accepts(&self, kind: &str) -> Vec<String> {
        self.accepts
            .lock()
            .expect("the accepts' lock")
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, a)| a.clone())
            .collect()
    }

    fn accepted(&self, kind: &'static str, accept: String) {
        self.accepts
            .lock()
            .expect("the accepts' lock")
            .push((kind, accept));
    }

    async fn handle(&self, req: Request<Incoming>) -> Reply {
        let crds = self.cluster.crds();
        let header = |name| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let accept = header(hyper::header::ACCEPT);
        let method = req.method().clone();
        if let Some((kind, document)) = discovery(&crds, req.uri().path()) {
            let path = req.uri().path().to_owned();
            if method == Method::GET {
                self.accepted(kind, accept);
            }
            let call = Call {
                method: method.as_str(),
                kind,
                name: None,
                body: &Value::Null,
            };
            return self
                .admitted(
                    &call,
                    || forbidden_path(&path, &method),
                    || match (&method, document) {
                        (&Method::GET, Some(document)) => respond(StatusCode::OK, &document),
                        (&Method::GET, None) => not_served(),
                        _ => method_not_allowed(),
                    },
                )
                .await;
        }
        let Some(target) = parse_path(req.uri().path()) else {
            return not_served();
        };
        let params = parse_query(req.uri().query());
        // Authorized before it is routed, as by the API server.
        let user = is_user(req.headers());
        if !user && !granted(self.rbac, &target, &params, &method) {
            return forbidden(&target, &params, &method);
        }
        let Some(kind) = kind_of(&target.plural) else {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("resource {} is not served", target.plural),
            );
        };
        if !serves(&crds, &target.group, &target.version, &target.plural) {
            return not_served();
        }
        let api_version = api_version(&target.group, &target.version);
        let content_type = header(hyper::header::CONTENT_TYPE);
        // A server-side apply that would create its object is a create too, as the API server
        // authorizes it.
        if !user && method == Method::PATCH && content_type.starts_with("application/apply-patch") {
            let exists = target
                .name
                .as_deref()
                .and_then(|name| {
                    key_for(
                        &api_version,
                        kind,
                        target.namespace.as_deref().unwrap_or(""),
                        name,
                    )
                })
                .is_some_and(|key| self.cluster.lock().get(&key).is_some());
            if !exists && !granted(self.rbac, &target, &params, &Method::POST) {
                return forbidden(&target, &params, &Method::POST);
            }
        }
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        };
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if method == Method::GET {
            self.accepted(kind, accept.clone());
        }
        let request = Req {
            target: &target,
            kind,
            api_version: &api_version,
            params: &params,
            accept: &accept,
        };
        let call = Call {
            method: method.as_str(),
            kind,
            name: target.name.as_deref(),
            body: &json,
        };
        self.admitted(
            &call,
            || forbidden(&target, &params, &method),
            || route(&self.cluster, &request, &method, &content_type, &body),
        )
        .await
    }

    /// `serve`'s answer to `call`, unless a test refuses it (`forbidden`'s answer, or a
    /// failure) or holds it (answered once released).
    async fn admitted(
        &self,
        call: &Call<'_>,
        forbidden: impl FnOnce() -> Reply,
        serve: impl FnOnce() -> Reply,
    ) -> Reply {
        match self.refusals.refused(call) {
            Some(Refused::Forbidden) => forbidden(),
            Some(Refused::Failed(code)) => failure(code),
            None => self.holds.admit(call, serve).await,
        }
    }
}

/// Answers a request (read and parsed) with the handler of its verb.
fn route(
    cluster: &Arc<Cluster>,
    request: &Req<'_>,
    method: &Method,
    content_type: &str,
    body: &[u8],
) -> Reply {
    if request.target.scale {
        return scale(cluster, request, method, body);
    }
    match (method, request.target.name.is_some()) {
        (&Method::GET, false) if is_watch(request.params) => watch(cluster, request),
        (&Method::GET, false) => list(cluster, request),
        (&Method::GET, true) => get(cluster, request),
        (&Method::POST, false) => create(cluster, request, body),
        (&Method::PATCH, true) => patch(cluster, request, content_type, body),
        (&Method::PUT, true) => replace(cluster, request, body),
        (&Method::DELETE, true) => delete(cluster, request, body),
        _ => method_not_allowed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::fixtures::{cluster_with, decoded, request};

    #[tokio::test]
    async fn a_method_a_path_does_not_take_is_405() {
        let cluster = cluster_with(&[]);
        let routed = |method: Method, path: &str| {
            request(path, "", |r| route(&cluster, r, &method, "", b"{}"))
        };
        let (code, refused) =
            decoded(routed(Method::POST, "/api/v1/namespaces/a/secrets/one")).await;
        assert_eq!(
            (code, &refused["reason"]),
            (405, &serde_json::json!("MethodNotAllowed"))
        );
        assert_eq!(
            decoded(routed(Method::PUT, "/api/v1/namespaces/a/secrets"))
                .await
                .0,
            405
        );
        assert_eq!(
            decoded(routed(Method::DELETE, "/api/v1/namespaces/a/secrets"))
                .await
                .0,
            405
        );
    }

    #[tokio::test]
    async fn only_a_deployment_has_a_scale_subresource() {
        let cluster = cluster_with(&[serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "a"}, "spec": {"replicas": 2}})]);
        let scale = |path: &str| request(path, "", |r| route(&cluster, r, &Method::GET, "", b""));
        let (code, read) = decoded(scale("/apis/apps/v1/namespaces/a/deployments/web/scale")).await;
        assert_eq!(
            (code, &read["spec"]["replicas"]),
            (200, &serde_json::json!(2))
        );
        assert_eq!(
            decoded(scale("/api/v1/namespaces/a/services/web/scale"))
                .await
                .0,
            404
        );
    }
}
