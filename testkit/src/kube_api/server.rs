//! The running server and what a test does with it: build and start it, make clients, read
//! and write objects as a user or another controller would, change the CRDs installed, and
//! hold, refuse or fail requests.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::StatusCode;
use serde_json::{json, Value};

use super::apply;
use super::call::Call;
use super::cluster::Cluster;
use super::front::Front;
use super::hold::Hold;
use super::merge::merge_patch;
use super::rbac::{Rule, USER_TOKEN};
use super::refusal::Forbid;
use super::schema::{default_fields, normalize_secret};
use super::served::{plural_of, served_by_crd, GatewayApiCrds};
use super::store::{key_for, key_of, Event, Key};

/// The field manager of the objects a test writes itself ([`ApiServer::put`]).
const TEST_MANAGER: &str = "test";

/// How a server starts: the RBAC rules its service account is held to, and the objects it
/// holds from the start.
#[derive(Default)]
pub struct ApiServerBuilder {
    rbac: &'static [Rule],
    seed: String,
}

impl ApiServerBuilder {
    /// Holds [`ApiServer::client`] to `rules`, as a service account bound to a role granting
    /// them. Without rules it is granted nothing (every request but discovery is 403).
    pub fn rbac(mut self, rules: &'static [Rule]) -> Self {
        self.rbac = rules;
        self
    }

    /// Starts with the objects of the multi-document YAML `seed`, as [`ApiServer::put`] writes
    /// them.
    pub fn seed(mut self, seed: impl Into<String>) -> Self {
        self.seed = seed.into();
        self
    }

    /// Starts serving on `127.0.0.1:0`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound, or the seed is not YAML or names a kind the server
    /// does not serve.
    pub async fn start(self) -> ApiServer {
        let cluster = Arc::new(Cluster::new());
        let front = Arc::new(Front::new(cluster, self.rbac));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(Arc::clone(&front).serve(listener));
        let server = ApiServer { addr, front, task };
        for doc in serde_yaml_ng::Deserializer::from_str(&self.seed) {
            let value: Value = serde::Deserialize::deserialize(doc).expect("seed YAML");
            if !value.is_null() {
                server.put(value);
            }
        }
        server
    }
}

/// The running server. Dropping it stops serving.
pub struct ApiServer {
    addr: SocketAddr,
    front: Arc<Front>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServer {
    /// A server to start, granting its service account nothing until
    /// [`rbac`](ApiServerBuilder::rbac) says otherwise, and holding no objects.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// The URL a kubeconfig names for this server.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client for this server, as the service account: held to the rules the server was
    /// built with.
    pub fn client(&self) -> kube::Client {
        let url = self.base_url().parse().expect("url");
        let config = kube::Config::new(url);
        kube::Client::try_from(config).expect("client")
    }

    /// A client for this server as a cluster admin, for a test acting as a user or as another
    /// controller; never the controller's.
    pub fn user_client(&self) -> kube::Client {
        let url = self.base_url().parse().expect("url");
        let mut config = kube::Config::new(url);
        config.auth_info =
            serde_json::from_value(json!({ "token": USER_TOKEN })).expect("a user's credentials");
        kube::Client::try_from(config).expect("client")
    }

    /// Creates or replaces an object, as a user or another controller would.
    ///
    /// # Panics
    ///
    /// When the server does not serve the object's kind.
    pub fn put(&self, mut object: Value) -> Value {
        normalize_secret(&mut object);
        let key = key_of(&object).unwrap_or_else(|| panic!("unknown kind {}", object["kind"]));
        let cluster = &self.front.cluster;
        let mut store = cluster.lock();
        match store.get(&key) {
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
                apply::update(Some(existing), &mut replaced, TEST_MANAGER);
                default_fields(&mut replaced);
                cluster.write(&mut store, key, replaced, Event::Modified)
            }
            None => {
                apply::update(None, &mut object, TEST_MANAGER);
                default_fields(&mut object);
                let created = store.created(object, &key.2);
                cluster.write(&mut store, key, created, Event::Added)
            }
        }
    }

    /// Serves Gateway API's kinds at the versions the CRDs of `crds` do, from now on; the
    /// watches of a version no longer served end.
    pub fn serve_gateway_api_crds(&self, crds: GatewayApiCrds) {
        self.front.cluster.set_crds(crds);
    }

    /// Installs (or replaces) a CustomResourceDefinition, as `kubectl apply` would: stores it
    /// and, from now on, serves its resource at the versions it marks `served` (those the
    /// server knows); the watches of a version no longer served end. [`crd`](super::crd)
    /// writes one.
    ///
    /// # Panics
    ///
    /// When it names a resource the server does not know.
    pub fn install_crd(&self, crd: Value) -> Value {
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        assert!(
            served_by_crd(&name).is_some(),
            "CRD {name} serves no resource the server knows"
        );
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect();
        let stored = self.put(crd);
        self.front.cluster.set_crd(&name, versions);
        stored
    }

    /// Removes CustomResourceDefinition `name` (`PLURAL.GROUP`, installed or not), as deleting
    /// it does: its resource is no longer served (its watches end) and its objects go.
    ///
    /// # Panics
    ///
    /// When it names a resource the server does not know.
    pub fn remove_crd(&self, name: &str) {
        let served = served_by_crd(name)
            .unwrap_or_else(|| panic!("CRD {name} serves no resource the server knows"));
        self.front.cluster.set_crd(name, Vec::new());
        self.delete(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            name,
        );
        let cluster = &self.front.cluster;
        let mut store = cluster.lock();
        let gone: Vec<(Key, Value)> = store
            .objects()
            .filter(|(k, _)| k.0 == served.group && k.1 == served.plural)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, object) in gone {
            cluster.write(&mut store, key, object, Event::Deleted);
        }
    }

    /// Deletes an object, as a user or another controller would; whether it was there.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(key) = key_for(api_version, kind, namespace, name) else {
            return false;
        };
        let cluster = &self.front.cluster;
        let mut store = cluster.lock();
        let Some(existing) = store.get(&key).cloned() else {
            return false;
        };
        cluster.write(&mut store, key, existing, Event::Deleted);
        true
    }

    /// The stored object, if any.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = key_for(api_version, kind, namespace, name)?;
        self.front.cluster.lock().get(&key).cloned()
    }

    /// Every stored object of a kind.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        let Some(plural) = plural_of(kind) else {
            return Vec::new();
        };
        self.front
            .cluster
            .lock()
            .objects()
            .filter(|(k, _)| k.1 == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Holds every request `matches` picks, from now until the returned [`Hold`] is released
    /// or dropped: the server reads it and does not answer.
    pub fn hold(&self, matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Hold {
        self.front.holds.hold(Box::new(matches))
    }

    /// Refuses every request `matches` picks with 403 Forbidden, as the API server refuses a
    /// client whose RBAC does not grant it, from now until the returned [`Forbid`] is lifted
    /// or dropped.
    pub fn forbid(&self, matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Forbid {
        self.front.refusals.refuse(None, Box::new(matches))
    }

    /// Answers every request `matches` picks with `code` (a `Status` of that code, as
    /// `500 InternalError`), from now until the returned [`Forbid`] is lifted or dropped. kube's
    /// client retries 429, 503 and 504 itself (some fifteen times): those reach the controller
    /// only when they last.
    ///
    /// # Panics
    ///
    /// When `code` is not an HTTP status code.
    pub fn fail(
        &self,
        code: u16,
        matches: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static,
    ) -> Forbid {
        let code = StatusCode::from_u16(code).expect("an HTTP status code");
        self.front.refusals.refuse(Some(code), Box::new(matches))
    }

    /// The `Accept` header of every `GET` (get, list, watch) of `kind` so far; a discovery
    /// document's kind is its own (`APIGroupList`, `APIGroup`, `APIResourceList`,
    /// `APIVersions`).
    pub fn accepts(&self, kind: &str) -> Vec<String> {
        self.front.accepts(kind)
    }

    /// The resourceVersion of the last write.
    pub fn resource_version(&self) -> u64 {
        self.front.cluster.lock().resource_version()
    }

    /// Every write after resourceVersion `rv`, as `EVENT plural namespace/name`.
    pub fn writes_since(&self, rv: u64) -> Vec<String> {
        let store = self.front.cluster.lock();
        store.writes_since(rv).map(|e| e.describe()).collect()
    }

    /// Merges `status` into an object's status, as the owning controller would.
    ///
    /// # Panics
    ///
    /// When the object does not exist.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        status: Value,
    ) {
        let key = key_for(api_version, kind, namespace, name).expect("kind");
        let cluster = &self.front.cluster;
        let mut store = cluster.lock();
        let mut object = store.get(&key).cloned().expect("object exists");
        merge_patch(&mut object, &json!({ "status": status }));
        cluster.write(&mut store, key, object, Event::Modified);
    }
}

#[cfg(test)]
mod tests;
