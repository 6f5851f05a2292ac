//! A Kubernetes API server in memory, speaking the real REST protocol over HTTP on loopback:
//! list (with label selectors) and watch streams from a resourceVersion, get, create, delete,
//! server-side apply (`application/apply-patch+yaml`), JSON merge patches, and the `status`
//! and (Deployments) `scale` subresources. A list, watch or get whose `Accept` asks for
//! `as=PartialObjectMetadata` (`…List` for a list; `meta.k8s.io/v1`) gets the objects'
//! metadata only, as `PartialObjectMetadata(List)`, as kube's metadata-only `Api` asks. Errors
//! are `Status` objects with the real codes (404 NotFound, 409 AlreadyExists, 409 Conflict for
//! a write naming a resourceVersion that is no longer current, 422 Invalid for a Lease the API
//! server's validation refuses, 403 Forbidden for a request a test refuses). It runs no
//! controllers: a test plays the Deployment and EndpointSlice controllers itself.
//!
//! Server-side apply keeps field ownership in `managedFields`: an applier's fields it no longer
//! sends go unless another manager owns them too, another manager's fields with a different
//! value conflict (409) unless forced, and other writes take the fields they change. A
//! Deployment without `spec.replicas` gets 1, as the schema defaults it.
//!
//! Discovery is served as by a real API server: `/api`, `/api/v1`, `/apis` (`APIGroupList`),
//! `/apis/GROUP` (`APIGroup`) and `/apis/GROUP/VERSION` (`APIResourceList`). A resource is
//! served at the versions discovery lists (404 at any other); those are the real ones, with
//! Gateway API's as its CRDs serve them ([`GatewayApiCrds`]: from v1.5 by default, or, set with
//! [`ApiServer::serve_gateway_api_crds`], up to v1.4, whose ReferenceGrant is `v1beta1` only,
//! and others). As on a real API server, a watch of a version no longer served ends once the
//! CRDs change, and watching it again is 404.
//!
//! Simplifications, none of which the controller relies on: one stored version per resource
//! (served as is under each version it is served at), lists owned whole (no merge keys), no
//! pagination, no garbage collection, watches never expire (no 410). A label-selected watch
//! sees an object that stops (starts) matching as DELETED (ADDED), as from the API server's
//! watch cache.
//!
//! A test can hold requests ([`ApiServer::hold`]): the server reads them and does not answer,
//! as an API server that is overloaded or cut off from its client, until the test releases them;
//! they are then served as if they had just come, against the objects as they are by then.
//!
//! RBAC is enforced as for the controller's service account: a request whose API group,
//! resource (with its subresource, as `gateways/status`) and verb no rule of
//! [`REQUIRED_RBAC`] grants gets 403 Forbidden. The verb is the API server's: `get` (a `GET`
//! naming an object), `list`, `watch` (a `GET` of a collection with `watch=true`), `create`
//! (`POST`), `patch`, `update` (`PUT`), `delete` and `deletecollection` (a `DELETE` of a
//! collection). Discovery is every client's (`system:discovery`). Namespaces are not told
//! apart (the chart grants Leases in its own namespace only). A client of
//! [`ApiServer::user_client`] is a cluster admin instead, as a test acting as a user or as
//! another controller (scaling a Deployment, deleting an object by hand).
//!
//! A test can refuse requests ([`ApiServer::forbid`]): they get 403 Forbidden, the `Status`
//! the API server sends a client whose RBAC lacks the verb, until the test lifts the refusal
//! (as if the missing rule had been granted). Or fail them ([`ApiServer::fail`]) with another
//! code, as an API server in trouble (500 InternalError), until the test lifts the failure.
//!
//! Several test binaries include this file, each using part of it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use cftunnel_controller::runtime::REQUIRED_RBAC;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::watch;

/// A resource the server serves, as its discovery documents describe it.
struct Served {
    kind: &'static str,
    group: &'static str,
    /// The versions it is served at, the preferred one first.
    versions: &'static [&'static str],
    plural: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
}

/// Every resource the tests use. ReferenceGrant's versions depend on [`GatewayApiCrds`].
#[rustfmt::skip]
const SERVED: &[Served] = &[
    Served { kind: "GatewayClass", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "gatewayclasses", namespaced: false, subresources: &["status"] },
    Served { kind: "Gateway", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "gateways", namespaced: true, subresources: &["status"] },
    Served { kind: "HTTPRoute", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "httproutes", namespaced: true, subresources: &["status"] },
    Served { kind: "GRPCRoute", group: "gateway.networking.k8s.io", versions: &["v1"], plural: "grpcroutes", namespaced: true, subresources: &["status"] },
    Served { kind: "ReferenceGrant", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "referencegrants", namespaced: true, subresources: &[] },
    Served { kind: "Namespace", group: "", versions: &["v1"], plural: "namespaces", namespaced: false, subresources: &["finalize", "status"] },
    Served { kind: "Service", group: "", versions: &["v1"], plural: "services", namespaced: true, subresources: &["status"] },
    Served { kind: "EndpointSlice", group: "discovery.k8s.io", versions: &["v1"], plural: "endpointslices", namespaced: true, subresources: &[] },
    Served { kind: "GatewayConfig", group: "cf.k8s.lex.la", versions: &["v1alpha1"], plural: "gatewayconfigs", namespaced: true, subresources: &[] },
    Served { kind: "Secret", group: "", versions: &["v1"], plural: "secrets", namespaced: true, subresources: &[] },
    Served { kind: "Deployment", group: "apps", versions: &["v1"], plural: "deployments", namespaced: true, subresources: &["scale", "status"] },
    Served { kind: "NetworkPolicy", group: "networking.k8s.io", versions: &["v1"], plural: "networkpolicies", namespaced: true, subresources: &[] },
    Served { kind: "HorizontalPodAutoscaler", group: "autoscaling", versions: &["v2", "v1"], plural: "horizontalpodautoscalers", namespaced: true, subresources: &["status"] },
    Served { kind: "Event", group: "", versions: &["v1"], plural: "events", namespaced: true, subresources: &[] },
    Served { kind: "Event", group: "events.k8s.io", versions: &["v1"], plural: "events", namespaced: true, subresources: &[] },
    Served { kind: "Lease", group: "coordination.k8s.io", versions: &["v1"], plural: "leases", namespaced: true, subresources: &[] },
    Served { kind: "CustomResourceDefinition", group: "apiextensions.k8s.io", versions: &["v1"], plural: "customresourcedefinitions", namespaced: false, subresources: &["status"] },
];

/// Which Gateway API CRD release the server has installed, as far as the versions it serves
/// ReferenceGrant at go (every other kind is served as in both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GatewayApiCrds {
    /// v1.5 on: ReferenceGrant at `v1` and `v1beta1`.
    #[default]
    V1_5,
    /// v1.1 to v1.4: ReferenceGrant at `v1beta1` only.
    V1_4,
    /// Every kind but ReferenceGrant, whose CRD is not installed.
    WithoutReferenceGrant,
    /// ReferenceGrant at `v1` only, as from a release that no longer serves `v1beta1`.
    V1Only,
}

impl Served {
    fn versions(&self, crds: GatewayApiCrds) -> &'static [&'static str] {
        match (self.kind, crds) {
            ("ReferenceGrant", GatewayApiCrds::V1_4) => &["v1beta1"],
            ("ReferenceGrant", GatewayApiCrds::WithoutReferenceGrant) => &[],
            ("ReferenceGrant", GatewayApiCrds::V1Only) => &["v1"],
            _ => self.versions,
        }
    }
}

/// The group and version of `PartialObjectMetadata` and `PartialObjectMetadataList`.
const META_API_VERSION: &str = "meta.k8s.io/v1";

/// Whether an `Accept` header asks for `PartialObjectMetadata` (`list`: `…List`) in
/// `meta.k8s.io/v1`, as `application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`.
fn wants_metadata(accept: &str, list: bool) -> bool {
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
fn as_partial_metadata(object: &Value) -> Value {
    json!({
        "apiVersion": META_API_VERSION,
        "kind": "PartialObjectMetadata",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The field manager of the objects a test writes itself ([`ApiServer::put`]).
const TEST_MANAGER: &str = "test";

/// The bearer token of [`ApiServer::user_client`]'s cluster admin; any other client (none, or
/// another token) is the controller's service account, held to [`REQUIRED_RBAC`].
const USER_TOKEN: &str = "cluster-admin";

/// `(group, plural, namespace, name)`; cluster-scoped objects have an empty namespace.
type Key = (String, String, String, String);

/// The key of an object a test names; `None` for a kind the server does not serve.
fn key_for(api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Key> {
    Some((
        group_of(api_version).to_owned(),
        plural_of(kind)?.to_owned(),
        namespace.to_owned(),
        name.to_owned(),
    ))
}

struct Entry {
    rv: u64,
    group: String,
    plural: String,
    namespace: String,
    event: &'static str,
    object: Value,
    /// The object before a `MODIFIED`: a label-selected watch sees it leave (DELETED) or
    /// enter (ADDED) its selection.
    previous: Option<Value>,
}

#[derive(Default)]
struct State {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Entry>,
}

struct Shared {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// Requests to hold, in the order the holds were made; the first that matches holds.
    gates: Mutex<Vec<Arc<Gate>>>,
    /// Requests to refuse (403 Forbidden) or fail; checked before the holds.
    refusals: Mutex<Vec<Arc<Refusal>>>,
    /// The `Accept` header of every `GET` (get, list, watch), by kind, in arrival order; a
    /// discovery document's kind is its own (`APIGroupList`, `APIGroup`, `APIResourceList`,
    /// `APIVersions`).
    accepts: Mutex<Vec<(&'static str, String)>>,
    crds: Mutex<GatewayApiCrds>,
}

/// A request as an [`ApiServer::hold`] predicate sees it.
pub struct Call<'a> {
    pub method: &'a str,
    /// The kind of the resource, or of the discovery document (`APIGroupList`, …).
    pub kind: &'static str,
    /// The request's body as JSON; `Null` when it has none (or it is not JSON).
    pub body: &'a Value,
}

type Matches = Box<dyn Fn(&Call<'_>) -> bool + Send + Sync>;

struct Gate {
    matches: Matches,
    open: watch::Sender<bool>,
    /// Requests held so far.
    arrived: watch::Sender<usize>,
    /// The statuses held requests were answered with, in the order they were answered. A
    /// request whose client gave up before the release may never be.
    answered: watch::Sender<Vec<u16>>,
}

/// Requests held by [`ApiServer::hold`]. Releasing it, or dropping it, serves them.
pub struct Hold {
    gate: Arc<Gate>,
    shared: Arc<Shared>,
}

impl Hold {
    /// Waits until `n` requests have been held.
    pub async fn arrived(&self, n: usize) {
        let mut arrived = self.gate.arrived.subscribe();
        let _ = arrived.wait_for(|a| *a >= n).await;
    }

    /// Serves the requests held so far, and holds no more.
    pub fn release(&self) {
        self.shared
            .gates
            .lock()
            .expect("gates")
            .retain(|g| !Arc::ptr_eq(g, &self.gate));
        self.gate.open.send_replace(true);
    }

    /// Waits until `n` held requests have been answered; their statuses, in answer order.
    pub async fn answered(&self, n: usize) -> Vec<u16> {
        let mut answered = self.gate.answered.subscribe();
        let statuses = answered
            .wait_for(|a| a.len() >= n)
            .await
            .map(|a| a.clone())
            .unwrap_or_default();
        statuses
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

struct Refusal {
    matches: Matches,
    /// The status answered: `None` for 403 Forbidden, as the authorizer words it.
    code: Option<StatusCode>,
    /// Requests refused so far.
    refused: watch::Sender<usize>,
}

/// Requests refused by [`ApiServer::forbid`] (or failed by [`ApiServer::fail`]). Lifting it,
/// or dropping it, serves them again.
pub struct Forbid {
    refusal: Arc<Refusal>,
    shared: Arc<Shared>,
}

impl Forbid {
    /// Waits until `n` requests have been refused.
    pub async fn refused(&self, n: usize) {
        let mut refused = self.refusal.refused.subscribe();
        let _ = refused.wait_for(|r| *r >= n).await;
    }

    /// Refuses no more: requests from now on are served.
    pub fn lift(&self) {
        self.shared
            .refusals
            .lock()
            .expect("refusals")
            .retain(|r| !Arc::ptr_eq(r, &self.refusal));
    }
}

impl Drop for Forbid {
    fn drop(&mut self) {
        self.lift();
    }
}

/// The running server. Dropping it stops serving.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn kind_of(plural: &str) -> Option<&'static str> {
    SERVED.iter().find(|s| s.plural == plural).map(|s| s.kind)
}

fn plural_of(kind: &str) -> Option<&'static str> {
    SERVED.iter().find(|s| s.kind == kind).map(|s| s.plural)
}

/// Whether `group/version` serves `plural`.
fn serves(crds: GatewayApiCrds, group: &str, version: &str, plural: &str) -> bool {
    SERVED
        .iter()
        .any(|s| s.group == group && s.plural == plural && s.versions(crds).contains(&version))
}

/// The versions of `group` any resource is served at, the preferred one first ([`SERVED`]
/// lists each group's resources' versions in the API server's order of preference).
fn group_versions(crds: GatewayApiCrds, group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for s in SERVED.iter().filter(|s| s.group == group) {
        for v in s.versions(crds) {
            if !versions.contains(v) {
                versions.push(v);
            }
        }
    }
    versions
}

/// The groups served (the core group is not one), in order of first appearance.
fn groups(crds: GatewayApiCrds) -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for s in SERVED {
        if !s.group.is_empty() && !groups.contains(&s.group) && !s.versions(crds).is_empty() {
            groups.push(s.group);
        }
    }
    groups
}

/// A `GroupVersionForDiscovery`.
fn group_version(group: &str, version: &str) -> Value {
    json!({"groupVersion": format!("{group}/{version}"), "version": version})
}

/// An `APIGroup`, as in an `APIGroupList` (without `kind` and `apiVersion`) or alone.
fn api_group(crds: GatewayApiCrds, group: &str) -> Value {
    let versions = group_versions(crds, group);
    json!({
        "name": group,
        "versions": versions.iter().map(|v| group_version(group, v)).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(|v| group_version(group, v)),
    })
}

/// The `APIResourceList` of `group/version` (`version` alone for the core group); `None` when
/// nothing is served there.
fn api_resource_list(crds: GatewayApiCrds, group: &str, version: &str) -> Option<Value> {
    const VERBS: [&str; 8] = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let mut resources = Vec::new();
    for s in SERVED
        .iter()
        .filter(|s| s.group == group && s.versions(crds).contains(&version))
    {
        resources.push(json!({
            "name": s.plural,
            "singularName": s.kind.to_lowercase(),
            "namespaced": s.namespaced,
            "kind": s.kind,
            "verbs": VERBS,
        }));
        for sub in s.subresources {
            let mut resource = json!({
                "name": format!("{}/{sub}", s.plural),
                "singularName": "",
                "namespaced": s.namespaced,
                "kind": s.kind,
                "verbs": ["get", "patch", "update"],
            });
            match *sub {
                "scale" => {
                    resource["group"] = "autoscaling".into();
                    resource["version"] = "v1".into();
                    resource["kind"] = "Scale".into();
                }
                "finalize" => resource["verbs"] = json!(["update"]),
                _ => {}
            }
            resources.push(resource);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": resources}))
}

/// The discovery document a path names, by kind: `Some((kind, None))` for a path of that
/// shape naming nothing served (404); `None` for a path that is not discovery's.
fn discovery(crds: GatewayApiCrds, path: &str) -> Option<(&'static str, Option<Value>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    Some(match segments.as_slice() {
        ["api"] => (
            "APIVersions",
            Some(json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]})),
        ),
        ["api", version] => ("APIResourceList", api_resource_list(crds, "", version)),
        ["apis"] => (
            "APIGroupList",
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1",
                        "groups": groups(crds).iter().map(|g| api_group(crds, g)).collect::<Vec<_>>()})),
        ),
        ["apis", group] => (
            "APIGroup",
            groups(crds).contains(group).then(|| {
                let mut document = api_group(crds, group);
                document["kind"] = "APIGroup".into();
                document["apiVersion"] = "v1".into();
                document
            }),
        ),
        ["apis", group, version] => ("APIResourceList", api_resource_list(crds, group, version)),
        _ => return None,
    })
}

/// The 404 the API server answers a path it serves nothing at.
fn not_served() -> Response<BoxBody<Bytes, Infallible>> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<BoxBody<Bytes, Infallible>> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

fn respond(code: StatusCode, body: &Value) -> Response<BoxBody<Bytes, Infallible>> {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *res.status_mut() = code;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    if let Value::Object(p) = patch {
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        if let Value::Object(t) = target {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
    } else {
        *target = patch.clone();
    }
}

/// Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated.
fn selects(selector: &str, object: &Value) -> bool {
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

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// What a request path names.
struct Target {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// The `scale` subresource (Deployments).
    scale: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (String::new(), (*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => ((*group).to_owned(), (*version).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            (Some((*ns).to_owned()), [&[*plural][..], tail].concat())
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => ((*plural).to_owned(), None, None),
        [plural, name] => ((*plural).to_owned(), Some((*name).to_owned()), None),
        [plural, name, sub @ ("status" | "scale")] => {
            ((*plural).to_owned(), Some((*name).to_owned()), Some(*sub))
        }
        _ => return None,
    };
    Some(Target {
        group,
        version,
        plural,
        namespace,
        name,
        status: sub == Some("status"),
        scale: sub == Some("scale"),
    })
}

impl Shared {
    /// Stores `object` under a new resourceVersion (or removes it, for `DELETED`) and logs
    /// the event for watches; returns the object as stored.
    fn store(&self, state: &mut State, key: Key, mut object: Value, event: &'static str) -> Value {
        state.rv += 1;
        let rv = state.rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        let previous = if event == "DELETED" {
            state.objects.remove(&key);
            None
        } else {
            state.objects.insert(key.clone(), object.clone())
        };
        let (group, plural, namespace, _) = key;
        state.log.push(Entry {
            rv,
            group,
            plural,
            namespace,
            event,
            object: object.clone(),
            previous,
        });
        self.changed.send_replace(rv);
        object
    }

    /// Fills in what the API server sets on create.
    fn created(state: &mut State, mut object: Value, namespace: &str) -> Value {
        state.uid += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", state.uid);
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), uid.into());
            meta.insert("creationTimestamp".into(), "2026-12-01T00:00:00Z".into());
            meta.insert("generation".into(), 1.into());
            if !namespace.is_empty() {
                meta.insert("namespace".into(), namespace.into());
            }
        }
        object
    }
}

/// The API server stores Secrets' `stringData` as base64 `data` and never returns it.
fn normalize_secret(object: &mut Value) {
    if object.get("kind").and_then(Value::as_str) != Some("Secret") {
        return;
    }
    let Some(string_data) = object.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let data = object
        .as_object_mut()
        .map(|o| o.entry("data").or_insert_with(|| json!({})));
    if let (Some(Value::Object(data)), Value::Object(strings)) = (data, string_data) {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                base64::engine::general_purpose::STANDARD
                    .encode(text)
                    .into(),
            );
        }
    }
}

impl ApiServer {
    /// Starts serving, holding the objects of the multi-document YAML `seed`.
    pub async fn start(seed: &str) -> Self {
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed,
            gates: Mutex::new(Vec::new()),
            refusals: Mutex::new(Vec::new()),
            accepts: Mutex::new(Vec::new()),
            crds: Mutex::new(GatewayApiCrds::default()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serving = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = Arc::clone(&serving);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let server = Self { addr, shared, task };
        for doc in serde_yaml_ng::Deserializer::from_str(seed) {
            let value: Value = serde::Deserialize::deserialize(doc).expect("seed YAML");
            if !value.is_null() {
                server.put(value);
            }
        }
        server
    }

    /// The URL a kubeconfig names for this server.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client for this server, as the controller's service account: held to
    /// [`REQUIRED_RBAC`].
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        let config = kube::Config::new(url);
        kube::Client::try_from(config).expect("client")
    }

    /// A client for this server as a cluster admin, for a test acting as a user or as another
    /// controller; never the controller's.
    pub fn user_client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        let mut config = kube::Config::new(url);
        config.auth_info =
            serde_json::from_value(json!({ "token": USER_TOKEN })).expect("a user's credentials");
        kube::Client::try_from(config).expect("client")
    }

    fn key_of(object: &Value) -> Key {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let plural = plural_of(kind).unwrap_or_else(|| panic!("unknown kind {kind}"));
        let field = |f: &str| {
            object
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        (
            group_of(api_version).to_owned(),
            plural.to_owned(),
            field("namespace"),
            field("name"),
        )
    }

    /// Creates or replaces an object, as a user or another controller would.
    pub fn put(&self, mut object: Value) -> Value {
        normalize_secret(&mut object);
        let key = Self::key_of(&object);
        let mut state = self.shared.state.lock().expect("state");
        let object = match state.objects.get(&key) {
            Some(existing) => {
                let mut replaced = object;
                if let (Some(meta), Some(old)) = (
                    replaced.get_mut("metadata").and_then(Value::as_object_mut),
                    existing.get("metadata"),
                ) {
                    for f in ["uid", "creationTimestamp"] {
                        if let Some(v) = old.get(f) {
                            meta.insert(f.into(), v.clone());
                        }
                    }
                    let generation = old.get("generation").and_then(Value::as_i64).unwrap_or(1);
                    meta.insert("generation".into(), (generation + 1).into());
                }
                if replaced.get("status").is_none() {
                    if let Some(s) = existing.get("status") {
                        replaced["status"] = s.clone();
                    }
                }
                ownership::update(Some(existing), &mut replaced, TEST_MANAGER);
                ownership::default_fields(&mut replaced);
                self.shared.store(&mut state, key, replaced, "MODIFIED")
            }
            None => {
                let mut object = object;
                ownership::update(None, &mut object, TEST_MANAGER);
                ownership::default_fields(&mut object);
                let created = Shared::created(&mut state, object, &key.2);
                self.shared.store(&mut state, key, created, "ADDED")
            }
        };
        object
    }

    /// Serves Gateway API's kinds at the versions the CRDs of `crds` do, from now on; the
    /// watches of a version no longer served end.
    pub fn serve_gateway_api_crds(&self, crds: GatewayApiCrds) {
        *self.shared.crds.lock().expect("crds") = crds;
        self.shared.changed.send_modify(|_| {});
    }

    /// Deletes an object, as a user or another controller would; whether it was there.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(key) = key_for(api_version, kind, namespace, name) else {
            return false;
        };
        let mut state = self.shared.state.lock().expect("state");
        let Some(existing) = state.objects.get(&key).cloned() else {
            return false;
        };
        self.shared.store(&mut state, key, existing, "DELETED");
        true
    }

    /// The stored object, if any.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = key_for(api_version, kind, namespace, name)?;
        let state = self.shared.state.lock().expect("state");
        state.objects.get(&key).cloned()
    }

    /// Every stored object of a kind.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        let Some(plural) = plural_of(kind) else {
            return Vec::new();
        };
        let state = self.shared.state.lock().expect("state");
        state
            .objects
            .iter()
            .filter(|(k, _)| k.1 == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Holds every request `matches` picks, from now until the returned [`Hold`] is released
    /// or dropped: the server reads it and does not answer.
    pub fn hold(&self, matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Hold {
        let gate = Arc::new(Gate {
            matches: Box::new(matches),
            open: watch::channel(false).0,
            arrived: watch::channel(0).0,
            answered: watch::channel(Vec::new()).0,
        });
        self.shared
            .gates
            .lock()
            .expect("gates")
            .push(Arc::clone(&gate));
        Hold {
            gate,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Refuses every request `matches` picks with 403 Forbidden, as the API server refuses a
    /// client whose RBAC does not grant it, from now until the returned [`Forbid`] is lifted
    /// or dropped.
    pub fn forbid(&self, matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Forbid {
        self.refuse(None, matches)
    }

    /// Answers every request `matches` picks with `code` (a `Status` of that code, as
    /// `500 InternalError`), from now until the returned [`Forbid`] is lifted or dropped. kube's
    /// client retries 429, 503 and 504 itself (some fifteen times): those reach the controller
    /// only when they last.
    pub fn fail(
        &self,
        code: u16,
        matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static,
    ) -> Forbid {
        let code = StatusCode::from_u16(code).expect("an HTTP status code");
        self.refuse(Some(code), matches)
    }

    fn refuse(
        &self,
        code: Option<StatusCode>,
        matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static,
    ) -> Forbid {
        let refusal = Arc::new(Refusal {
            matches: Box::new(matches),
            code,
            refused: watch::channel(0).0,
        });
        self.shared
            .refusals
            .lock()
            .expect("refusals")
            .push(Arc::clone(&refusal));
        Forbid {
            refusal,
            shared: Arc::clone(&self.shared),
        }
    }

    /// The `Accept` header of every `GET` (get, list, watch) of `kind` so far.
    pub fn accepts(&self, kind: &str) -> Vec<String> {
        self.shared
            .accepts
            .lock()
            .expect("accepts")
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// The resourceVersion of the last write.
    pub fn resource_version(&self) -> u64 {
        self.shared.state.lock().expect("state").rv
    }

    /// Every write after resourceVersion `rv`, as `EVENT plural namespace/name`.
    pub fn writes_since(&self, rv: u64) -> Vec<String> {
        let state = self.shared.state.lock().expect("state");
        state
            .log
            .iter()
            .filter(|e| e.rv > rv)
            .map(|e| {
                let name = e
                    .object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                format!("{} {} {}/{name}", e.event, e.plural, e.namespace)
            })
            .collect()
    }

    /// Merges `status` into an object's status, as the owning controller would.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        status: Value,
    ) {
        let key = key_for(api_version, kind, namespace, name).expect("kind");
        let mut state = self.shared.state.lock().expect("state");
        let mut object = state.objects.get(&key).cloned().expect("object exists");
        merge_patch(&mut object, &json!({ "status": status }));
        self.shared.store(&mut state, key, object, "MODIFIED");
    }
}

async fn handle(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Response<BoxBody<Bytes, Infallible>> {
    let crds = *shared.crds.lock().expect("crds");
    if let Some((kind, document)) = discovery(crds, req.uri().path()) {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        if method == Method::GET {
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            shared.accepts.lock().expect("accepts").push((kind, accept));
        }
        let call = Call {
            method: method.as_str(),
            kind,
            body: &Value::Null,
        };
        return admitted(
            shared,
            &call,
            || forbidden_path(&path, &method),
            || match (&method, document) {
                (&Method::GET, Some(document)) => respond(StatusCode::OK, &document),
                (&Method::GET, None) => not_served(),
                _ => status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "method not allowed",
                ),
            },
        )
        .await;
    }
    let Some(target) = parse_path(req.uri().path()) else {
        return not_served();
    };
    let params = query(&req);
    let method = req.method().clone();
    // Authorized before it is routed, as by the API server.
    if !is_user(&req) && !granted(&target, &params, &method) {
        return forbidden(&target, &params, &method);
    }
    let Some(kind) = kind_of(&target.plural) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("resource {} is not served", target.plural),
        );
    };
    if !serves(crds, &target.group, &target.version, &target.plural) {
        return not_served();
    }
    let api_version = if target.group.is_empty() {
        target.version.clone()
    } else {
        format!("{}/{}", target.group, target.version)
    };
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let request = Req {
        target: &target,
        kind,
        api_version: &api_version,
        params: &params,
        accept: &accept,
    };
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if method == Method::GET {
        shared
            .accepts
            .lock()
            .expect("accepts")
            .push((kind, accept.clone()));
    }
    let call = Call {
        method: method.as_str(),
        kind,
        body: &json,
    };
    admitted(
        shared,
        &call,
        || forbidden(&target, &params, &method),
        || serve(shared, &request, method.clone(), &content_type, &body),
    )
    .await
}

/// `serve`'s answer to `call`, unless a test refuses it (`forbidden`'s answer) or holds it
/// (answered once released).
async fn admitted(
    shared: &Arc<Shared>,
    call: &Call<'_>,
    forbidden: impl FnOnce() -> Response<BoxBody<Bytes, Infallible>>,
    serve: impl FnOnce() -> Response<BoxBody<Bytes, Infallible>>,
) -> Response<BoxBody<Bytes, Infallible>> {
    let refusal = shared
        .refusals
        .lock()
        .expect("refusals")
        .iter()
        .find(|r| (r.matches)(call))
        .cloned();
    if let Some(refusal) = refusal {
        refusal.refused.send_modify(|n| *n += 1);
        return match refusal.code {
            None => forbidden(),
            Some(code) => {
                let reason = match code.as_u16() {
                    500 => "InternalError",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    _ => "Unknown",
                };
                status(code, reason, "the server cannot answer the request now")
            }
        };
    }
    let gate = shared
        .gates
        .lock()
        .expect("gates")
        .iter()
        .find(|g| (g.matches)(call))
        .cloned();
    let Some(gate) = gate else {
        return serve();
    };
    gate.arrived.send_modify(|n| *n += 1);
    let _ = gate.open.subscribe().wait_for(|open| *open).await;
    let res = serve();
    gate.answered.send_modify(|a| a.push(res.status().as_u16()));
    res
}

/// The API server's answer to a request for a path that names no resource (discovery's) that
/// RBAC does not allow.
fn forbidden_path(path: &str, method: &Method) -> Response<BoxBody<Bytes, Infallible>> {
    let verb = method.as_str().to_lowercase();
    respond(
        StatusCode::FORBIDDEN,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("forbidden: User \"system:serviceaccount:cftunnel-system:cftunnel-controller\" cannot {verb} path {path:?}"),
                "reason": "Forbidden", "details": {}, "code": 403}),
    )
}

/// Whether a request comes from [`ApiServer::user_client`]'s cluster admin.
fn is_user(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        == Some(USER_TOKEN)
}

/// The RBAC verb of a request, as the API server tells it.
fn verb_of(target: &Target, params: &BTreeMap<String, String>, method: &Method) -> String {
    let watching = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method.as_str(), target.name.is_some()) {
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) if watching => "watch",
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
fn rbac_resource(target: &Target) -> String {
    if target.status {
        format!("{}/status", target.plural)
    } else if target.scale {
        format!("{}/scale", target.plural)
    } else {
        target.plural.clone()
    }
}

/// Whether [`REQUIRED_RBAC`] grants the controller's service account the request.
fn granted(target: &Target, params: &BTreeMap<String, String>, method: &Method) -> bool {
    let (resource, verb) = (rbac_resource(target), verb_of(target, params, method));
    REQUIRED_RBAC.iter().any(|(group, r, verbs)| {
        *group == target.group && *r == resource && verbs.contains(&verb.as_str())
    })
}

/// The API server's answer to a request RBAC does not allow, as its authorizer words it.
fn forbidden(
    target: &Target,
    params: &BTreeMap<String, String>,
    method: &Method,
) -> Response<BoxBody<Bytes, Infallible>> {
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
        "{resource}{object} is forbidden: User \"system:serviceaccount:cftunnel-system:cftunnel-controller\" cannot {verb} resource {:?} in API group {:?} {scope}",
        target.plural, target.group
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

/// Answers a request (read and parsed).
fn serve(
    shared: &Arc<Shared>,
    request: &Req<'_>,
    method: Method,
    content_type: &str,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
    let (target, params) = (request.target, request.params);
    if target.scale {
        return scale(shared, request, &method, body);
    }
    match (method, target.name.is_some()) {
        (Method::GET, false) if params.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch_response(shared, request)
        }
        (Method::GET, false) => list(shared, request),
        (Method::GET, true) => get(shared, request),
        (Method::POST, false) => create(shared, request, body),
        (Method::PATCH, true) => patch(shared, request, content_type, body),
        (Method::PUT, true) => replace(shared, request, body),
        (Method::DELETE, true) => delete(shared, request, body),
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        ),
    }
}

/// A request, parsed.
struct Req<'a> {
    target: &'a Target,
    kind: &'static str,
    api_version: &'a str,
    params: &'a BTreeMap<String, String>,
    /// The `Accept` header.
    accept: &'a str,
}

impl Req<'_> {
    fn key(&self, name: &str) -> Key {
        (
            self.target.group.clone(),
            self.target.plural.clone(),
            self.target.namespace.clone().unwrap_or_default(),
            name.to_owned(),
        )
    }

    /// The writer's field manager, as the request names it.
    fn manager(&self) -> &str {
        self.params
            .get("fieldManager")
            .map_or("unknown", String::as_str)
    }

    fn typed(&self, mut object: Value) -> Value {
        if let Some(o) = object.as_object_mut() {
            o.insert("apiVersion".into(), self.api_version.into());
            o.insert("kind".into(), self.kind.into());
        }
        object
    }

    /// 409 for a write naming a resourceVersion that is no longer current.
    fn stale(&self, name: &str) -> Response<BoxBody<Bytes, Infallible>> {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            &format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", self.target.plural),
        )
    }

    /// The 422 the API server's validation answers an object it refuses; of the kinds here
    /// only a Lease's spec is checked (`ValidateLeaseSpec`: a duration above 0, no negative
    /// transition count).
    fn invalid(&self, name: &str, object: &Value) -> Option<Response<BoxBody<Bytes, Infallible>>> {
        if self.kind != "Lease" {
            return None;
        }
        let field = |f: &str| {
            object
                .pointer(&format!("/spec/{f}"))
                .and_then(Value::as_i64)
        };
        let (field, value, must) = match (field("leaseDurationSeconds"), field("leaseTransitions"))
        {
            (Some(d), _) if d <= 0 => ("leaseDurationSeconds", d, "must be greater than 0"),
            (_, Some(t)) if t < 0 => ("leaseTransitions", t, "must be greater than or equal to 0"),
            _ => return None,
        };
        Some(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!(
                "{}.{} \"{name}\" is invalid: spec.{field}: Invalid value: {value}: {must}",
                self.kind, self.target.group
            ),
        ))
    }

    fn not_found(&self, name: &str) -> Response<BoxBody<Bytes, Infallible>> {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!(
                "{}.{} \"{name}\" not found",
                self.target.plural, self.target.group
            ),
        )
    }
}

fn list(shared: &Arc<Shared>, req: &Req<'_>) -> Response<BoxBody<Bytes, Infallible>> {
    let selector = req.params.get("labelSelector").cloned().unwrap_or_default();
    let metadata_only = wants_metadata(req.accept, true);
    let state = shared.state.lock().expect("state");
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|((g, p, ns, _), v)| {
            *g == req.target.group
                && *p == req.target.plural
                && req.target.namespace.as_ref().is_none_or(|t| t == ns)
                && selects(&selector, v)
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
                "metadata": {"resourceVersion": state.rv.to_string()}, "items": items}),
    )
}

fn get(shared: &Arc<Shared>, req: &Req<'_>) -> Response<BoxBody<Bytes, Infallible>> {
    let name = req.target.name.clone().unwrap_or_default();
    let state = shared.state.lock().expect("state");
    match state.objects.get(&req.key(&name)) {
        Some(v) if wants_metadata(req.accept, false) => {
            respond(StatusCode::OK, &as_partial_metadata(v))
        }
        Some(v) => respond(StatusCode::OK, &req.typed(v.clone())),
        None => req.not_found(&name),
    }
}

/// A request body as the object it carries (a Secret's `stringData` folded into `data`).
fn json_body(body: &[u8]) -> Option<Value> {
    let mut object = serde_json::from_slice::<Value>(body).ok()?;
    normalize_secret(&mut object);
    Some(object)
}

/// The 400 the API server answers a body that is not JSON.
fn not_json() -> Response<BoxBody<Bytes, Infallible>> {
    status(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        "the body is not JSON",
    )
}

fn create(
    shared: &Arc<Shared>,
    req: &Req<'_>,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
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
    if let Some(invalid) = req.invalid(&name, &object) {
        return invalid;
    }
    let key = req.key(&name);
    let mut state = shared.state.lock().expect("state");
    if state.objects.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", req.target.plural),
        );
    }
    let mut object = req.typed(object);
    ownership::update(None, &mut object, req.manager());
    ownership::default_fields(&mut object);
    let created = Shared::created(&mut state, object, &key.2);
    let stored = shared.store(&mut state, key, created, "ADDED");
    respond(StatusCode::CREATED, &req.typed(stored))
}

/// `PUT`: the whole object, applied only to the resourceVersion it names (if it names one).
fn replace(
    shared: &Arc<Shared>,
    req: &Req<'_>,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
    let Some(mut object) = json_body(body) else {
        return not_json();
    };
    let name = req.target.name.clone().unwrap_or_default();
    let key = req.key(&name);
    let mut state = shared.state.lock().expect("state");
    let Some(existing) = state.objects.get(&key).cloned() else {
        return req.not_found(&name);
    };
    let current = existing.pointer("/metadata/resourceVersion").cloned();
    if let Some(wanted) = object.pointer("/metadata/resourceVersion") {
        if Some(wanted) != current.as_ref() {
            return req.stale(&name);
        }
    }
    if let Some(invalid) = req.invalid(&name, &object) {
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
    ownership::update(Some(&existing), &mut object, req.manager());
    ownership::default_fields(&mut object);
    let stored = shared.store(&mut state, key, object, "MODIFIED");
    respond(StatusCode::OK, &req.typed(stored))
}

fn delete(
    shared: &Arc<Shared>,
    req: &Req<'_>,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
    let name = req.target.name.clone().unwrap_or_default();
    let key = req.key(&name);
    let mut state = shared.state.lock().expect("state");
    let Some(existing) = state.objects.get(&key).cloned() else {
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
    let gone = shared.store(&mut state, key, existing, "DELETED");
    respond(StatusCode::OK, &req.typed(gone))
}

/// Server-side apply ([`ownership::apply`]) or a JSON merge patch; on the `status` subresource
/// only `status` changes. A write that changes nothing keeps the resourceVersion, as on a
/// real server.
fn patch(
    shared: &Arc<Shared>,
    req: &Req<'_>,
    content_type: &str,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not JSON",
        );
    };
    let name = req.target.name.clone().unwrap_or_default();
    let key = req.key(&name);
    let mut state = shared.state.lock().expect("state");
    let existing = state.objects.get(&key).cloned();
    let apply = content_type.starts_with("application/apply-patch");
    // Optimistic concurrency: a patch naming a resourceVersion applies only to that version.
    if let (Some(wanted), Some(current)) = (
        patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
        existing
            .as_ref()
            .and_then(|e| e.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str),
    ) {
        if !apply && wanted != current {
            return req.stale(&name);
        }
    }
    if apply && req.params.get("fieldManager").is_none_or(String::is_empty) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "PATCH with apply requires fieldManager",
        );
    }
    let manager = req.manager();
    let force = req.params.get("force").is_some_and(|f| f == "true");
    let mut updated = match (existing.clone(), apply) {
        (None, true) if !req.target.status => {
            let mut applied = patch;
            normalize_secret(&mut applied);
            let mut object = applied.clone();
            if let Err(conflict) = ownership::apply(&mut object, &applied, manager, force) {
                return status(StatusCode::CONFLICT, "Conflict", &conflict);
            }
            Shared::created(&mut state, req.typed(object), &key.2)
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
            if let Err(conflict) = ownership::apply(&mut object, &applied, manager, force) {
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
            ownership::update(existing.as_ref(), &mut object, manager);
            object
        }
    };
    ownership::default_fields(&mut updated);
    if let Some(invalid) = req.invalid(&name, &updated) {
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
        "MODIFIED"
    } else {
        "ADDED"
    };
    let stored = shared.store(&mut state, key, updated, event);
    respond(
        if event == "ADDED" {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &req.typed(stored),
    )
}

/// The `scale` subresource of a Deployment, as the HorizontalPodAutoscaler controller uses it:
/// `GET` reads an `autoscaling/v1` Scale, `PATCH` (merge) and `PUT` set `spec.replicas`, the
/// writer's field manager taking the field (recorded with `subresource: scale`).
fn scale(
    shared: &Arc<Shared>,
    req: &Req<'_>,
    method: &Method,
    body: &[u8],
) -> Response<BoxBody<Bytes, Infallible>> {
    let name = req.target.name.clone().unwrap_or_default();
    let key = req.key(&name);
    if req.kind != "Deployment" {
        return req.not_found(&name);
    }
    let mut state = shared.state.lock().expect("state");
    let Some(existing) = state.objects.get(&key).cloned() else {
        return req.not_found(&name);
    };
    let as_scale = |d: &Value| {
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
    };
    if *method == Method::GET {
        return respond(StatusCode::OK, &as_scale(&existing));
    }
    if !matches!(*method, Method::PATCH | Method::PUT) {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "method not allowed",
        );
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
    ownership::update_subresource(Some(&existing), &mut updated, req.manager(), Some("scale"));
    let generation = existing
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    updated["metadata"]["generation"] = (generation + 1).into();
    let stored = shared.store(&mut state, key, updated, "MODIFIED");
    respond(StatusCode::OK, &as_scale(&stored))
}

/// Watch events after `resourceVersion`, then live ones, as newline-delimited JSON, until
/// `timeoutSeconds`.
fn watch_response(shared: &Arc<Shared>, req: &Req<'_>) -> Response<BoxBody<Bytes, Infallible>> {
    let since: u64 = req
        .params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = req
        .params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(60u64);
    let selector = req.params.get("labelSelector").cloned().unwrap_or_default();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let shared = Arc::clone(shared);
    let group = req.target.group.clone();
    let plural = req.target.plural.clone();
    let namespace = req.target.namespace.clone();
    let api_version = req.api_version.to_owned();
    let version = req.target.version.clone();
    let kind = req.kind;
    let metadata_only = wants_metadata(req.accept, false);
    tokio::spawn(async move {
        let mut changed = shared.changed.subscribe();
        let mut sent = since;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
        loop {
            // Marked seen before the log is read: a write after the read wakes the loop again.
            changed.borrow_and_update();
            // The version is no longer served (the CRDs changed): the watch ends.
            let crds = *shared.crds.lock().expect("crds");
            if !serves(crds, &group, &version, &plural) {
                return;
            }
            let (events, latest): (Vec<String>, u64) = {
                let state = shared.state.lock().expect("state");
                let events = state
                    .log
                    .iter()
                    .filter(|e| {
                        e.rv > sent
                            && e.group == group
                            && e.plural == plural
                            && namespace.as_ref().is_none_or(|n| *n == e.namespace)
                    })
                    .filter_map(|e| {
                        // As the API server's watch cache: a modification that moves an
                        // object out of (into) the selection is its deletion (addition).
                        let now = selects(&selector, &e.object);
                        let before = e.previous.as_ref().map(|p| selects(&selector, p));
                        let event = match (e.event, before, now) {
                            (_, _, true) if e.event != "MODIFIED" => e.event,
                            ("MODIFIED", Some(false), true) => "ADDED",
                            ("MODIFIED", _, true) => "MODIFIED",
                            ("MODIFIED", Some(true), false) => "DELETED",
                            _ => return None,
                        };
                        // An object leaving the selection is sent as it was in it.
                        let mut object = match (event, &e.previous) {
                            ("DELETED", Some(previous)) if e.event == "MODIFIED" => {
                                previous.clone()
                            }
                            _ => e.object.clone(),
                        };
                        if let Some(meta) =
                            object.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            meta.insert("resourceVersion".into(), e.rv.to_string().into());
                        }
                        if metadata_only {
                            object = as_partial_metadata(&object);
                        } else if let Some(o) = object.as_object_mut() {
                            o.insert("apiVersion".into(), api_version.clone().into());
                            o.insert("kind".into(), kind.into());
                        }
                        Some(format!("{}\n", json!({"type": event, "object": object})))
                    })
                    .collect();
                (events, state.rv)
            };
            for line in events {
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
            }
            sent = latest;
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut res = Response::new(BodyExt::boxed(body));
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

/// Server-side apply's field ownership, at the granularity the controller's objects need:
/// every map is a set of fields, every list and scalar one field (a real server merges lists
/// with merge keys item by item; the controller applies whole objects, so its lists are only
/// ever replaced whole). Ownership lives in `metadata.managedFields` in the `FieldsV1` format,
/// so clients read it as they would from a real server.
mod ownership {
    use std::collections::BTreeSet;

    use serde_json::{json, Map, Value};

    type Path = Vec<String>;

    struct Manager {
        name: String,
        operation: String,
        /// `scale` for a write through that subresource.
        subresource: Option<String>,
        fields: BTreeSet<Path>,
    }

    /// The fields an object sets: everything but `apiVersion`, `kind`, `status` and the
    /// server's metadata; of the metadata, labels, annotations and owner references.
    fn fields(object: &Value) -> BTreeSet<Path> {
        let mut out = BTreeSet::new();
        for (k, v) in object.as_object().into_iter().flatten() {
            match k.as_str() {
                "apiVersion" | "kind" | "status" => {}
                "metadata" => {
                    for f in ["labels", "annotations"] {
                        for key in v.get(f).and_then(Value::as_object).into_iter().flatten() {
                            out.insert(vec!["metadata".into(), f.into(), key.0.clone()]);
                        }
                    }
                    if v.get("ownerReferences").is_some() {
                        out.insert(vec!["metadata".into(), "ownerReferences".into()]);
                    }
                }
                _ => leaves(v, vec![k.clone()], &mut out),
            }
        }
        out
    }

    fn leaves(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    let mut p = path.clone();
                    p.push(k.clone());
                    leaves(child, p, out);
                }
            }
            _ => {
                out.insert(path);
            }
        }
    }

    fn get<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
        path.iter().try_fold(object, |v, k| v.get(k))
    }

    fn set(object: &mut Value, path: &[String], value: Value) {
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut at = object;
        for k in parents {
            if !at.is_object() {
                *at = Value::Object(Map::new());
            }
            let Some(map) = at.as_object_mut() else {
                return;
            };
            at = map.entry(k.clone()).or_insert(Value::Object(Map::new()));
        }
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        if let Some(map) = at.as_object_mut() {
            map.insert(last.clone(), value);
        }
    }

    /// Removes a field and the maps that held only it.
    fn remove(object: &mut Value, path: &[String]) {
        fn go(at: &mut Value, path: &[String]) -> bool {
            let Some(map) = at.as_object_mut() else {
                return false;
            };
            match path {
                [] => return false,
                [last] => {
                    map.remove(last);
                }
                [first, rest @ ..] => {
                    if map.get_mut(first).is_some_and(|child| go(child, rest)) {
                        map.remove(first);
                    }
                }
            }
            map.is_empty()
        }
        go(object, path);
    }

    fn read(object: &Value) -> Vec<Manager> {
        fn decode(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
            match v.as_object() {
                Some(m) if !m.is_empty() => {
                    for (k, child) in m {
                        if let Some(k) = k.strip_prefix("f:") {
                            let mut p = path.clone();
                            p.push(k.to_owned());
                            decode(child, p, out);
                        }
                    }
                }
                _ if !path.is_empty() => {
                    out.insert(path);
                }
                _ => {}
            }
        }
        let entries = object
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array);
        entries
            .into_iter()
            .flatten()
            .map(|e| {
                let mut fields = BTreeSet::new();
                decode(&e["fieldsV1"], Vec::new(), &mut fields);
                Manager {
                    name: e["manager"].as_str().unwrap_or_default().to_owned(),
                    operation: e["operation"].as_str().unwrap_or_default().to_owned(),
                    subresource: e["subresource"].as_str().map(str::to_owned),
                    fields,
                }
            })
            .collect()
    }

    fn write(object: &mut Value, managers: &[Manager]) {
        let api_version = object.get("apiVersion").cloned().unwrap_or(Value::Null);
        let entries: Vec<Value> = managers
            .iter()
            .filter(|m| !m.fields.is_empty())
            .map(|m| {
                let mut tree = json!({});
                for p in &m.fields {
                    let keys: Vec<String> = p.iter().map(|k| format!("f:{k}")).collect();
                    set(&mut tree, &keys, json!({}));
                }
                let mut entry = json!({
                    "manager": m.name,
                    "operation": m.operation,
                    "apiVersion": api_version,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": tree,
                });
                if let Some(sub) = &m.subresource {
                    entry["subresource"] = sub.as_str().into();
                }
                entry
            })
            .collect();
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            if entries.is_empty() {
                meta.remove("managedFields");
            } else {
                meta.insert("managedFields".into(), entries.into());
            }
        }
    }

    /// Server-side apply of `applied` by `manager` onto `object`: fields another manager owns
    /// with a different value are a conflict (an error naming them) unless `force` takes them
    /// over; fields `manager` applied before and no longer does are removed unless another
    /// manager owns them too.
    pub fn apply(
        object: &mut Value,
        applied: &Value,
        manager: &str,
        force: bool,
    ) -> Result<(), String> {
        let mut managers = read(object);
        let mine = fields(applied);
        let differs = |p: &Path| get(object, p) != get(applied, p);
        // Managers are told apart by name and operation: the applier's own earlier updates
        // are another manager's fields here, as on a real server.
        let other =
            |m: &Manager| m.name != manager || m.operation != "Apply" || m.subresource.is_some();
        let conflicts: Vec<String> = managers
            .iter()
            .filter(|m| other(m))
            .flat_map(|m| {
                m.fields
                    .intersection(&mine)
                    .filter(|p| differs(p))
                    .map(|p| format!("conflict with \"{}\": .{}", m.name, p.join(".")))
            })
            .collect();
        if !conflicts.is_empty() {
            if !force {
                return Err(format!(
                    "Apply failed with {} conflict(s): {}",
                    conflicts.len(),
                    conflicts.join(", ")
                ));
            }
            let taken: BTreeSet<Path> = mine.iter().filter(|p| differs(p)).cloned().collect();
            for m in managers.iter_mut().filter(|m| other(m)) {
                m.fields.retain(|p| !taken.contains(p));
            }
        }
        let before = managers
            .iter()
            .find(|m| !other(m))
            .map(|m| m.fields.clone())
            .unwrap_or_default();
        for p in before.difference(&mine) {
            if !managers.iter().any(|m| other(m) && m.fields.contains(p)) {
                remove(object, p);
            }
        }
        for p in &mine {
            if let Some(v) = get(applied, p) {
                set(object, p, v.clone());
            }
        }
        managers.retain(other);
        managers.push(Manager {
            name: manager.to_owned(),
            operation: "Apply".to_owned(),
            subresource: None,
            fields: mine,
        });
        write(object, &managers);
        Ok(())
    }

    /// Any other write by `manager` (create, replace, merge patch): the fields it changed
    /// become its own and no one else's; fields that are gone are no one's.
    pub fn update(before: Option<&Value>, after: &mut Value, manager: &str) {
        update_subresource(before, after, manager, None);
    }

    /// [`update`] through a subresource (`scale`), recorded on the manager's entry.
    pub fn update_subresource(
        before: Option<&Value>,
        after: &mut Value,
        manager: &str,
        subresource: Option<&str>,
    ) {
        let mut managers = before.map(read).unwrap_or_default();
        let changed: BTreeSet<Path> = fields(after)
            .into_iter()
            .filter(|p| before.and_then(|b| get(b, p)) != get(after, p))
            .collect();
        for m in &mut managers {
            m.fields
                .retain(|p| !changed.contains(p) && get(after, p).is_some());
        }
        if !changed.is_empty() {
            match managers.iter_mut().find(|m| {
                m.name == manager
                    && m.operation == "Update"
                    && m.subresource.as_deref() == subresource
            }) {
                Some(m) => m.fields.extend(changed),
                None => managers.push(Manager {
                    name: manager.to_owned(),
                    operation: "Update".to_owned(),
                    subresource: subresource.map(str::to_owned),
                    fields: changed,
                }),
            }
        }
        write(after, &managers);
    }

    /// What the API server fills in that the objects' schemas default.
    pub fn default_fields(object: &mut Value) {
        if object.get("kind").and_then(Value::as_str) == Some("Deployment")
            && object.pointer("/spec/replicas").is_none()
        {
            set(object, &["spec".into(), "replicas".into()], json!(1));
        }
    }
}
