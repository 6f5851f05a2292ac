//! The watch caches behind every round, read through the stand-in API server: they hold
//! objects without the managed fields the API server keeps of each writer (often most of an
//! object), but for the controller's own Deployments, whose `spec.replicas` owner is read from
//! them, and no Helm release records; and a round's snapshot shares the cached objects rather
//! than copying them.

use std::sync::Arc;
use std::time::Duration;

use cftunnel_controller::runtime::optional_apis::ApiDiscovery;
use cftunnel_controller::runtime::stores::Stores;
use cftunnel_controller::runtime::REQUIRED_RBAC;
use cftunnel_testkit::kube_api::ApiServer;
use kube::Resource;
use tokio::sync::Notify;
use tokio::task::JoinSet;

const SEED: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: tenant-a}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: tenant-a}
spec:
  ports: [{port: 80}]
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: tenant-a}
stringData: {token: abc}
---
apiVersion: v1
kind: Secret
metadata: {name: sh.helm.release.v1.web.v1, namespace: tenant-a}
type: helm.sh/release.v1
stringData: {release: H4sIAAAAAAAA}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: tenant-a}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: cf-proxy-edge
  namespace: tenant-a
  labels: {app.kubernetes.io/managed-by: cftunnel-controller}
spec:
  selector: {matchLabels: {app: edge}}
  template:
    metadata: {labels: {app: edge}}
    spec:
      containers: [{name: proxy, image: proxy}]
"#;

#[tokio::test]
async fn the_caches_keep_managed_fields_only_for_the_controllers_own_objects() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(SEED)
        .start()
        .await;
    // The stand-in records its writer in every object's managed fields, as the API server does.
    let served = api
        .get(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "web",
        )
        .expect("the route is served");
    assert!(served.pointer("/metadata/managedFields/0").is_some());

    let mut tasks = JoinSet::new();
    let stores = Stores::start(
        &api.client(),
        ApiDiscovery::default(),
        None,
        Arc::new(Notify::new()),
        &mut tasks,
    );
    let ready = tokio::time::timeout(
        Duration::from_secs(20),
        stores.wait_until_ready(Duration::from_secs(1)),
    )
    .await
    .expect("the caches fill");
    assert!(ready, "every cache lists");

    let snapshot = stores.snapshot();
    let managed = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.managed_fields.as_ref().is_some_and(|m| !m.is_empty())
    };
    assert_eq!(snapshot.http_routes.len(), 1);
    assert!(!managed(snapshot.http_routes[0].meta()));
    assert_eq!(snapshot.services.len(), 1);
    assert!(!managed(snapshot.services[0].meta()));
    // Helm's release records are not watched.
    assert_eq!(snapshot.secrets.len(), 1);
    assert_eq!(snapshot.secrets[0].meta().name.as_deref(), Some("token"));
    assert!(!managed(snapshot.secrets[0].meta()));
    assert_eq!(snapshot.namespaces.len(), 1);
    assert!(!managed(snapshot.namespaces[0].meta()));

    let deployments = stores.deployments.state();
    assert_eq!(deployments.len(), 1);
    assert!(managed(deployments[0].meta()), "the apply reads them");

    // The round's objects are the caches' own, not copies.
    let again = stores.snapshot();
    assert!(Arc::ptr_eq(&snapshot.http_routes[0], &again.http_routes[0]));
    assert!(Arc::ptr_eq(&snapshot.secrets[0], &again.secrets[0]));
}
