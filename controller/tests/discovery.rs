//! The APIs the controller reads only where they are served (ServiceImport, ListenerSet), found
//! while it runs: CRDs installed, changed or removed after it started take effect with no
//! restart. Each test pushes to a real proxy (behind a tap that keeps the documents pushed) and
//! sends requests through it.

use crate::support;

use crate::support::{condition, eventually, yaml};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cftunnel_controller::render::RenderSettings;
use cftunnel_controller::runtime::optional_apis::ApiDiscovery;
use cftunnel_controller::runtime::{self, RuntimeOptions, REQUIRED_RBAC};
use cftunnel_controller::translate::Options;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::cloudflare_api::CloudflareApi;
use cftunnel_testkit::config_tap::ConfigTap;
use cftunnel_testkit::echo::EchoServer;
use cftunnel_testkit::kube_api::{crd, ApiServer};
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

const TUNNEL_ID: &str = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
const CONTROLLER: &str = "cf.k8s.lex.la/tunnel-controller";
const SERVICE_IMPORTS_CRD: &str = "serviceimports.multicluster.x-k8s.io";
const LISTENER_SETS_CRD: &str = "listenersets.gateway.networking.k8s.io";
const V1: &str = "gateway.networking.k8s.io/v1";

/// Condition `kind` of our parent's entry in the status of HTTPRoute `tenant-a/name`.
fn route_condition(api: &ApiServer, name: &str, kind: &str) -> Option<Value> {
    let route = api.get(V1, "HTTPRoute", "tenant-a", name)?;
    let parent = route
        .pointer("/status/parents")?
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == CONTROLLER)?;
    condition(&parent["conditions"], kind).cloned()
}

/// The status of `GET /` with `host` through the plane's proxy; 0 when it cannot be reached.
async fn get_via(data: SocketAddr, host: &str) -> u16 {
    support::request(data, "GET", "/", host, None, "")
        .await
        .map_or(0, |a| a.status)
}

/// Waits until the proxy answers `status` for `host`.
async fn serves(data: SocketAddr, host: &str, status: u16) {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let got = get_via(data, host).await;
        if got == status {
            return;
        }
        assert!(Instant::now() < by, "{host}: {got}, not {status}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The backend URLs of every rule of a pushed document.
fn backend_urls(doc: &Value) -> Vec<String> {
    doc["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["backends"].as_array().into_iter().flatten())
        .filter_map(|b| b["url"].as_str().map(str::to_owned))
        .collect()
}

/// Gateway `edge` of tenant-a on a dedicated plane (its one pod the real proxy behind `tap`),
/// admitting ListenerSets of its namespace, with a listener for `shop.example.com`, a Service
/// `web` in front of `backend`, and Cloudflare credentials for the tunnel's document.
fn seed(tap: SocketAddr, backend: SocketAddr) -> String {
    let token = Token::new(
        "acct",
        b"tunnel secret".to_vec(),
        TUNNEL_ID.parse().expect("uuid"),
    )
    .encode();
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cloudflare-tunnel}}
spec: {{controllerName: {CONTROLLER}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: tenant-a, labels: {{kubernetes.io/metadata.name: tenant-a}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-tunnel-token, namespace: tenant-a}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-api, namespace: tenant-a}}
stringData: {{bearer: s3cr3t}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-cf, namespace: tenant-a}}
stringData: {{api-token: cf-token-a}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec:
  tunnelTokenSecretRef: {{name: edge-tunnel-token}}
  authTokenSecretRef: {{name: edge-api, key: bearer}}
  cloudflareCredentialsSecretRef: {{name: edge-cf}}
  replicas: 1
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: tenant-a}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}}}
  allowedListeners: {{namespaces: {{from: Same}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-x1
  namespace: tenant-a
  labels: {{kubernetes.io/service-name: cf-proxy-edge-config, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}
addressType: IPv4
ports: [{{name: config, port: {tap_port}}}]
endpoints: [{{addresses: ["127.0.0.1"], conditions: {{ready: true}}}}]
---
{web}"#,
        tap_port = tap.port(),
        web = support::web_service("tenant-a", backend),
    )
}

/// A controller against an API server seeded with [`seed`], pushing to a real proxy.
struct Cluster {
    api: ApiServer,
    proxy: Server,
    tap: ConfigTap,
    cloudflare: CloudflareApi,
    _echo: EchoServer,
    stop: tokio::sync::oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Cluster {
    /// Starts the controller once `before` has run on the API server.
    async fn start(before: impl FnOnce(&ApiServer)) -> Self {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-a");
        let proxy = Server::start(
            ServerOptions {
                auth_token: Some("s3cr3t".to_owned()),
                ..ServerOptions::default()
            },
            None,
        )
        .await
        .expect("the plane's proxy starts");
        let tap = ConfigTap::start(proxy.admin_addr())
            .await
            .expect("the tap starts");
        let echo = support::echo("tenant-a", "web-1").await;
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(seed(tap.addr(), echo.http_addr()))
            .start()
            .await;
        before(&api);
        let options = RuntimeOptions {
            translate: Options {
                proxy_image: Some("proxy:1".to_owned()),
                ..Options::default()
            },
            render: RenderSettings {
                proxy_image: Some("proxy:1".to_owned()),
                ..RenderSettings::default()
            },
            resync: Duration::from_millis(100),
            cloudflare_api_base: cloudflare.base(),
            cloudflare_api_token: Some("cf-token-a".to_owned()),
            // Asked again after 1 s while a watch fails as not served; CRD changes are told at
            // once.
            api_discovery: ApiDiscovery {
                retry_min: Duration::from_millis(50),
                retry_max: Duration::from_millis(200),
                recheck_after: Duration::from_secs(1),
            },
            ..RuntimeOptions::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = std::sync::Arc::new(runtime::health::Health::default());
        let controller = tokio::spawn(runtime::run(api.client(), options, health, async {
            let _ = stopped.await;
        }));
        Self {
            api,
            proxy,
            tap,
            cloudflare,
            _echo: echo,
            stop,
            controller,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.controller
            .await
            .expect("task")
            .expect("the controller stops cleanly");
    }
}

/// Route `imported` on the Gateway's listener, to ServiceImport `web-set` port 80.
fn imported_route() -> Value {
    yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: imported, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{group: multicluster.x-k8s.io, kind: ServiceImport, name: web-set, port: 80}]}]\n",
    )
}

/// Started where the Multi-Cluster Services API is not served, the controller refuses a
/// ServiceImport backend (`InvalidKind`, the rule answering 500). Once the CRD is installed it
/// watches ServiceImports with no restart: the route resolves, and the plane is pushed the
/// import's cluster-set DNS name as the backend (the proxy dials it; it does not resolve here,
/// so the answer turns to 502). Removing the CRD again refuses the backend again.
#[tokio::test]
async fn service_imports_are_watched_once_their_crd_is_installed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Cluster::start(|api| {
            api.remove_crd(SERVICE_IMPORTS_CRD);
            api.put(imported_route());
        })
        .await;
        let resolved = |status: &'static str| {
            let api = &t.api;
            move || {
                route_condition(api, "imported", "ResolvedRefs").filter(|c| c["status"] == status)
            }
        };
        let refused = eventually("ResolvedRefs=False", resolved("False")).await;
        assert_eq!(refused["reason"], "InvalidKind");
        serves(t.proxy.data_addr(), "shop.example.com", 500).await;

        t.api.install_crd(crd(
            "multicluster.x-k8s.io",
            "ServiceImport",
            &["v1alpha1"],
        ));
        t.api.put(yaml(
            "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: web-set, namespace: tenant-a}\nspec: {type: ClusterSetIP, ports: [{port: 80, protocol: TCP}]}\n",
        ));
        let ok = eventually("ResolvedRefs=True", resolved("True")).await;
        assert_eq!(ok["reason"], "ResolvedRefs");
        const URL: &str = "http://web-set.tenant-a.svc.clusterset.local:80";
        eventually("the import's backend pushed", || {
            t.tap
                .last()
                .filter(|doc| backend_urls(doc).iter().any(|u| u == URL))
        })
        .await;
        serves(t.proxy.data_addr(), "shop.example.com", 502).await;

        t.api.remove_crd(SERVICE_IMPORTS_CRD);
        let refused = eventually("ResolvedRefs=False again", resolved("False")).await;
        assert_eq!(refused["reason"], "InvalidKind");
        serves(t.proxy.data_addr(), "shop.example.com", 500).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Started before any ListenerSet CRD is installed, the controller attaches none; once the
/// `ListenerSet` CRD is installed and a ListenerSet made, the Gateway takes it with no
/// restart: its route is served by the plane's proxy, its hostname is published in the
/// tunnel's document, and its status is written.
#[tokio::test]
async fn listener_sets_attach_once_their_crd_is_installed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Cluster::start(|api| {
            api.remove_crd(LISTENER_SETS_CRD);
            api.put(yaml(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: team-app, namespace: tenant-a}\nspec:\n  parentRefs: [{group: gateway.networking.k8s.io, kind: ListenerSet, name: team, sectionName: web}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
            ));
            api.put(yaml(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
            ));
        })
        .await;
        serves(t.proxy.data_addr(), "shop.example.com", 200).await;
        assert_eq!(get_via(t.proxy.data_addr(), "team.example.com").await, 404);

        t.api.install_crd(crd(
            "gateway.networking.k8s.io",
            "ListenerSet",
            &["v1"],
        ));
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {name: team, namespace: tenant-a}\nspec:\n  parentRef: {name: edge, namespace: tenant-a}\n  listeners: [{name: web, port: 80, protocol: HTTP, hostname: team.example.com}]\n",
        ));
        serves(t.proxy.data_addr(), "team.example.com", 200).await;
        let want = json!({"ingress": [
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"hostname": "team.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("the tunnel's document lists the ListenerSet's hostname", || {
            t.cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        let accepted = eventually("the ListenerSet's status", || {
            let set = t.api.get(V1, "ListenerSet", "tenant-a", "team")?;
            condition(&set["status"]["conditions"], "Accepted").cloned()
        })
        .await;
        assert_eq!(accepted["status"], "True");
        let attached = eventually("the route attached", || {
            route_condition(&t.api, "team-app", "Accepted").filter(|c| c["status"] == "True")
        })
        .await;
        assert_eq!(attached["reason"], "Accepted");
        t.stop().await;
    })
    .await
    .expect("in time");
}
