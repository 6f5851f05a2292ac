//! The watch caches behind every round, read through the stand-in API server: they hold
//! objects without the managed fields the API server keeps of each writer (often most of an
//! object), but for the controller's own Deployments, whose `spec.replicas` owner is read from
//! them, and no Helm release records; and a round's snapshot shares the cached objects rather
//! than copying them. Of Pods, only the rendered planes' are kept, without their specs, and a
//! refused Pod list holds up nothing.

use std::sync::Arc;
use std::time::Duration;

use cftunnel_controller::runtime::health::Health;
use cftunnel_controller::runtime::optional_apis::ApiDiscovery;
use cftunnel_controller::runtime::stores::Stores;
use cftunnel_controller::runtime::REQUIRED_RBAC;
use cftunnel_testkit::kube_api::{crd, ApiServer};
use kube::Resource;
use serde_json::Value;
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
        &Health::default(),
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

/// Starts the caches on `api` with discovery asked again after `recheck_after`, their watch
/// failures counted in `health`.
fn start(
    api: &ApiServer,
    recheck_after: Duration,
    health: &Health,
    tasks: &mut JoinSet<()>,
) -> Stores {
    Stores::start(
        &api.client(),
        ApiDiscovery {
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_millis(200),
            recheck_after,
        },
        None,
        Arc::new(Notify::new()),
        health,
        tasks,
    )
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).expect("YAML")
}

const LISTENER_SET: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {name: team, namespace: tenant-a}\nspec:\n  parentRef: {name: edge, namespace: tenant-a}\n  listeners: [{name: web, port: 80, protocol: HTTP, hostname: team.example.com}]\n";

fn listener_sets_crd() -> Value {
    crd("gateway.networking.k8s.io", "ListenerSet", &["v1"])
}

/// A kind whose watch is refused (403: the controller's RBAC lacks it) is shown absent: the
/// caches are ready once the short wait for it is over, not after the long cap for a list that
/// is merely late.
#[tokio::test]
async fn an_optional_kind_refused_403_is_waited_for_only_briefly() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(SEED)
        .start()
        .await;
    let refused = api.forbid(|c| c.kind == "AccessPolicy");
    let mut tasks = JoinSet::new();
    let stores = start(
        &api,
        Duration::from_secs(30),
        &Health::default(),
        &mut tasks,
    );
    let started = std::time::Instant::now();
    let ready = tokio::time::timeout(
        Duration::from_secs(20),
        stores.wait_until_ready(Duration::from_secs(1)),
    )
    .await
    .expect("ready without the refused kind");
    assert!(ready);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?}",
        started.elapsed()
    );
    refused.refused(1).await;
    assert!(stores.access_policies.state().is_empty());
}

/// A failing watch counts in `cftunnel_controller_watch_failures_total`, by kind, on
/// `/metrics`.
#[tokio::test]
async fn a_failing_watch_counts_on_metrics() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        let failing = api.fail(500, |c| c.kind == "ExternalBackend" && c.method == "GET");
        let health = Arc::new(Health::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = tokio::spawn(cftunnel_controller::runtime::health::serve(
            listener,
            Arc::clone(&health),
        ));
        let mut tasks = JoinSet::new();
        let _stores = start(&api, Duration::from_secs(30), &health, &mut tasks);
        failing.refused(2).await;
        let metric = |text: &str, kind: &str| -> Option<u64> {
            let prefix = format!("cftunnel_controller_watch_failures_total{{kind=\"{kind}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
        };
        let by = std::time::Instant::now() + Duration::from_secs(10);
        let text = loop {
            let (mut sender, _conn) = cftunnel_testkit::client::connect_http1(addr)
                .await
                .expect("connect");
            let req = http::Request::builder()
                .uri("/metrics")
                .header("host", "controller")
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request");
            let res = sender.send_request(req).await.expect("an answer");
            assert_eq!(res.status(), 200);
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await
                .expect("body")
                .to_bytes();
            let text = String::from_utf8(body.to_vec()).expect("text");
            if metric(&text, "ExternalBackend").is_some_and(|n| n >= 2) {
                break text;
            }
            assert!(std::time::Instant::now() < by, "not counted: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            text.contains("# TYPE cftunnel_controller_watch_failures counter"),
            "{text}"
        );
        assert_eq!(
            metric(&text, "Service"),
            Some(0),
            "a watch that never failed"
        );
        served.abort();
    })
    .await
    .expect("in time");
}

/// Discovery answers 404 once while ListenerSets are served and watched (a CRD event asks it
/// again): the cache keeps them; asked again after `recheck_after`, discovery finds them
/// served and the watch stays.
#[tokio::test]
async fn one_404_from_discovery_does_not_empty_the_listener_sets() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        api.install_crd(listener_sets_crd());
        api.put(yaml(LISTENER_SET));
        let mut tasks = JoinSet::new();
        let stores = start(&api, Duration::from_secs(1), &Health::default(), &mut tasks);
        assert!(stores.wait_until_ready(Duration::from_secs(1)).await);
        assert_eq!(stores.listener_sets.state().len(), 1);

        let not_found = api.fail(404, |c| c.kind == "APIResourceList");
        // The CRD changes: discovery is asked again, and answers 404.
        api.install_crd(listener_sets_crd());
        not_found.refused(1).await;
        not_found.lift();
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            assert_eq!(
                stores.listener_sets.state().len(),
                1,
                "the ListenerSets were dropped on one answer of discovery"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(stores
            .listener_set_resource
            .borrow()
            .as_ref()
            .is_some_and(|r| r.kind == "ListenerSet"));
    })
    .await
    .expect("in time");
}

/// The ListenerSet CRD exists, but discovery answers 404 for it when the controller starts
/// (and when the CRD watch lists it): nothing is watched. Once discovery serves it, the
/// controller looks again within `recheck_after`, with no CRD event, and lists the ListenerSets.
#[tokio::test]
async fn a_crd_discovery_missed_is_picked_up_on_a_recheck() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        api.install_crd(listener_sets_crd());
        api.put(yaml(LISTENER_SET));
        let not_found = api.fail(404, |c| c.kind == "APIResourceList");
        let mut tasks = JoinSet::new();
        let stores = start(&api, Duration::from_secs(1), &Health::default(), &mut tasks);
        assert!(stores.wait_until_ready(Duration::from_secs(5)).await);
        // Start-up and the CRD list's end ask discovery for ListenerSet (two candidates),
        // ReferenceGrant (two) and ServiceImport (one).
        not_found.refused(10).await;
        assert!(stores.listener_sets.state().is_empty());
        assert!(stores.listener_set_resource.borrow().is_none());
        not_found.lift();
        let by = std::time::Instant::now() + Duration::from_secs(5);
        while stores.listener_sets.state().is_empty() {
            assert!(
                std::time::Instant::now() < by,
                "the ListenerSets are not listed after discovery served them"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("in time");
}

/// A Pod of `labels` named `name` in tenant-a, with a spec and a status.
fn pod(name: &str, labels: &str) -> Value {
    yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: tenant-a, labels: {labels}}}\nspec:\n  containers: [{{name: proxy, image: proxy:1, env: [{{name: TUNNEL_TOKEN, value: secret}}]}}]\nstatus: {{phase: Pending, podIP: 10.0.0.5}}\n"
    ))
}

/// The Pod cache holds the proxy pods only, a rendered plane's and the chart's shared pool's
/// (by the label both carry), and of each its state, not its spec.
#[tokio::test]
async fn the_pod_cache_holds_the_proxy_pods_without_their_specs() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        api.put(pod(
            "cf-proxy-edge-abc",
            "{app.kubernetes.io/name: cftunnel-proxy, app.kubernetes.io/managed-by: cftunnel-controller}",
        ));
        api.put(pod(
            "cftunnel-proxy-6b7f9c4d8-x2x9k",
            "{app.kubernetes.io/name: cftunnel-proxy, app.kubernetes.io/managed-by: Helm}",
        ));
        api.put(pod("web-abc", "{app: web, app.kubernetes.io/managed-by: cftunnel-controller}"));
        let mut tasks = JoinSet::new();
        let stores = start(
            &api,
            Duration::from_secs(30),
            &Health::default(),
            &mut tasks,
        );
        assert!(stores.wait_until_ready(Duration::from_secs(1)).await);
        let by = std::time::Instant::now() + Duration::from_secs(10);
        let pods = loop {
            let pods = stores.pods.state();
            if pods.len() >= 2 {
                break pods;
            }
            assert!(
                std::time::Instant::now() < by,
                "the proxy pods are not listed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut names: Vec<_> = pods.iter().map(|p| p.meta().name.clone()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                Some("cf-proxy-edge-abc".to_owned()),
                Some("cftunnel-proxy-6b7f9c4d8-x2x9k".to_owned())
            ]
        );
        assert_eq!(pods[0].spec, None, "the spec is not kept");
        assert_eq!(
            pods[0].status.as_ref().and_then(|s| s.pod_ip.as_deref()),
            Some("10.0.0.5")
        );
    })
    .await
    .expect("in time");
}

/// A controller refused the Pod list (an older chart's ClusterRole) is ready all the same, at
/// once: nothing waits for the pods.
#[tokio::test]
async fn a_refused_pod_list_holds_up_nothing() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        let refused = api.forbid(|c| c.kind == "Pod");
        let mut tasks = JoinSet::new();
        let stores = start(
            &api,
            Duration::from_secs(30),
            &Health::default(),
            &mut tasks,
        );
        let started = std::time::Instant::now();
        assert!(stores.wait_until_ready(Duration::from_secs(5)).await);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "waited {:?}",
            started.elapsed()
        );
        refused.refused(1).await;
        assert!(stores.pods.state().is_empty());
    })
    .await
    .expect("in time");
}

/// A plane pod's changes (each step of its start, each retry the kubelet reports) start no
/// round: the Pod cache notifies nothing, while the other caches' changes do.
#[tokio::test]
async fn a_pods_changes_start_no_round() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(SEED)
            .start()
            .await;
        let plane = "{app.kubernetes.io/name: cftunnel-proxy, app.kubernetes.io/managed-by: cftunnel-controller}";
        api.put(pod("cf-proxy-edge-abc", plane));
        let changed = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let stores = Stores::start(
            &api.client(),
            ApiDiscovery::default(),
            None,
            Arc::clone(&changed),
            &Health::default(),
            &mut tasks,
        );
        assert!(stores.wait_until_ready(Duration::from_secs(1)).await);
        let phase = |stores: &Stores| {
            let pods = stores.pods.state();
            pods.first()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.clone())
        };
        let by = std::time::Instant::now() + Duration::from_secs(10);
        while phase(&stores).is_none() {
            assert!(std::time::Instant::now() < by, "the pod is not listed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The first lists' notifications, taken until none comes for a while.
        while tokio::time::timeout(Duration::from_millis(500), changed.notified())
            .await
            .is_ok()
        {}

        let mut running = pod("cf-proxy-edge-abc", plane);
        running["status"]["phase"] = "Running".into();
        api.put(running);
        let by = std::time::Instant::now() + Duration::from_secs(10);
        while phase(&stores).as_deref() != Some("Running") {
            assert!(std::time::Instant::now() < by, "the change is not seen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let notified = tokio::time::timeout(Duration::from_millis(500), changed.notified()).await;
        assert!(notified.is_err(), "the pod's change started a round");

        // Another cache's change does.
        api.put(yaml(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: tenant-a, labels: {changed: \"yes\"}}\nspec:\n  ports: [{port: 80}]\n",
        ));
        tokio::time::timeout(Duration::from_secs(5), changed.notified())
            .await
            .expect("a Service's change starts a round");
    })
    .await
    .expect("in time");
}
