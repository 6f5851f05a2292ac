//! The controller against an API server: it renders and applies a Gateway's dedicated plane,
//! leaves alone an object it does not own, pushes the translated config to the plane's pod (a
//! real proxy on loopback) once the pod is listed, gates `Programmed` on ready replicas,
//! reports a sustained push failure on the route, and removes the plane when the Gateway goes
//! back to the shared one.

use crate::support;

mod plane_upkeep;
mod reporting;

use crate::support::{condition, eventually, yaml};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cftunnel_controller::render::RenderSettings;
use cftunnel_controller::runtime::optional_apis::ApiDiscovery;
use cftunnel_controller::runtime::{
    self, RuntimeOptions, SharedPlane, PROXY_CONFIG_PUSHED, REQUIRED_RBAC,
};
use cftunnel_controller::translate::{ObjectKey, Options};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::cloudflare_api::CloudflareApi;
use cftunnel_testkit::echo::EchoServer;
use cftunnel_testkit::kube_api::{ApiServer, Forbid, GatewayApiCrds};
use cftunnel_testkit::older_proxy::OlderProxy;
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

const TUNNEL_ID: &str = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
const THIRD_TUNNEL_ID: &str = "9d7e0c41-2b6f-4a83-b5e2-0f1c3a6d8e74";
const OTHER_TUNNEL_ID: &str = "52c8e1f0-6a3d-4b97-8e14-d0a7f9b3c265";
const SHARED_TUNNEL_ID: &str = "c4a1e7d2-9b36-4f08-a5c3-6e2b8d0f1a97";

/// The shared pool's side: its token Secrets in the controller's namespace, the EndpointSlice
/// of its Service (listing `pool`), and a Gateway of the class without a GatewayConfig with a
/// route to the echo backend.
fn shared_seed(pool: SocketAddr, backend: SocketAddr) -> String {
    let token = Token::new(
        "acct-s",
        b"class secret".to_vec(),
        uuid_of(SHARED_TUNNEL_ID),
    )
    .encode();
    format!(
        r#"
---
apiVersion: v1
kind: Secret
metadata: {{name: shared-auth, namespace: cftunnel-system}}
stringData: {{token: pool-secret}}
---
apiVersion: v1
kind: Secret
metadata: {{name: shared-tunnel, namespace: cftunnel-system}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cftunnel-proxy-p1
  namespace: cftunnel-system
  labels: {{kubernetes.io/service-name: cftunnel-proxy, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}
addressType: IPv4
ports: [{{name: config, port: {pool_port}}}]
endpoints: [{{addresses: ["127.0.0.1"], conditions: {{ready: true}}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: public, namespace: tenant-s}}
spec:
  gatewayClassName: cloudflare-tunnel
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: www.example.com}}]
---
{web_s}apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: www, namespace: tenant-s}}
spec:
  parentRefs: [{{name: public}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
        pool_port = pool.port(),
        web_s = support::web_service("tenant-s", backend),
    )
}

/// The connector token of the seed's Gateway edge (tunnel `TUNNEL_ID`): the class tunnel's
/// too where the shared pool runs beside it ([`beside_the_pool`]).
fn edge_token() -> String {
    Token::new("acct", b"tunnel secret".to_vec(), uuid_of(TUNNEL_ID)).encode()
}

fn uuid_of(id: &str) -> uuid::Uuid {
    id.parse().expect("uuid")
}
const CONTROLLER: &str = "cf.k8s.lex.la/tunnel-controller";

fn seed(token: &str, third_token: &str, backend: SocketAddr) -> String {
    let other_token =
        Token::new("acct-b", b"other secret".to_vec(), uuid_of(OTHER_TUNNEL_ID)).encode();
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
kind: Namespace
metadata: {{name: tenant-b, labels: {{kubernetes.io/metadata.name: tenant-b}}}}
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
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec:
  tunnelTokenSecretRef: {{name: edge-tunnel-token}}
  authTokenSecretRef: {{name: edge-api, key: bearer}}
  cloudflareCredentialsSecretRef: {{name: edge-cf}}
  replicas: 1
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-cf, namespace: tenant-a}}
stringData: {{api-token: cf-token-a}}
---
{gateway}
---
{web_a}apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: tenant-a}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
---
{other_gateway}# Someone else's Deployment where the controller would put Gateway other's.
apiVersion: apps/v1
kind: Deployment
metadata: {{name: cf-proxy-other, namespace: tenant-b}}
spec:
  selector: {{matchLabels: {{app: mine}}}}
  template:
    metadata: {{labels: {{app: mine}}}}
    spec: {{containers: [{{name: mine, image: mine:1}}]}}
---
# A third tenant, on its own tunnel of another account, written with the controller's API token.
{third_gateway}{web_c}apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: blog, namespace: tenant-c}}
spec:
  parentRefs: [{{name: third}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
        gateway = gateway(true),
        other_gateway = dedicated_gateway("tenant-b", "other", &other_token, None),
        third_gateway =
            dedicated_gateway("tenant-c", "third", third_token, Some("blog.example.com")),
        web_a = support::web_service("tenant-a", backend),
        web_c = support::web_service("tenant-c", backend),
    )
}

/// A Gateway `name` of the class in `namespace` with its own GatewayConfig (`NAME-config`) on
/// the connector token `token` (in Secret `NAME-tunnel-token`); documents end with `---`.
fn dedicated_gateway(namespace: &str, name: &str, token: &str, hostname: Option<&str>) -> String {
    let hostname = hostname
        .map(|h| format!(", hostname: {h}"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-tunnel-token, namespace: {namespace}}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: {name}-config, namespace: {namespace}}}
spec: {{tunnelTokenSecretRef: {{name: {name}-tunnel-token}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: {name}-config}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP{hostname}}}]
---
"#
    )
}

fn gateway(dedicated: bool) -> String {
    let infrastructure = if dedicated {
        "  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: tenant-a}}\nspec:\n  gatewayClassName: cloudflare-tunnel\n{infrastructure}  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}]\n"
    )
}

/// Our parent's entry in the status of HTTPRoute `namespace/name`.
fn route_parent(api: &ApiServer, namespace: &str, name: &str) -> Option<Value> {
    api.get("gateway.networking.k8s.io/v1", "HTTPRoute", namespace, name)
        .and_then(|r| our_parent(&r).cloned())
}

/// Condition `kind` of our parent's entry in the status of HTTPRoute `namespace/name`.
fn route_condition(api: &ApiServer, namespace: &str, name: &str, kind: &str) -> Option<Value> {
    route_parent(api, namespace, name).and_then(|p| condition(&p["conditions"], kind).cloned())
}

fn our_parent(route: &Value) -> Option<&Value> {
    route
        .pointer("/status/parents")?
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == CONTROLLER)
}

/// The status of `GET /cart` with `host`, 0 when the proxy is not reachable.
async fn get_via(data: SocketAddr, host: &str) -> u16 {
    support::request(data, "GET", "/cart", host, None, "")
        .await
        .map_or(0, |a| a.status)
}

#[tokio::test]
async fn the_controller_runs_a_dedicated_plane_from_render_to_removal() {
    tokio::time::timeout(Duration::from_secs(90), scenario())
        .await
        .expect("the scenario finishes in time");
}

async fn scenario() {
    let echo = support::echo("tenant-a", "web-1").await;
    let token = Token::new(
        "acct",
        b"tunnel secret".to_vec(),
        TUNNEL_ID.parse().expect("uuid"),
    )
    .encode();
    let third_token = Token::new(
        "acct-c",
        b"third secret".to_vec(),
        THIRD_TUNNEL_ID.parse().expect("uuid"),
    )
    .encode();
    // The shared pool: one real proxy with the pool's token.
    let pool = proxy_pod("pool-secret").await;
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(
            seed(&token, &third_token, echo.http_addr())
                + &shared_seed(pool.admin_addr(), echo.http_addr()),
        )
        .start()
        .await;
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct-s", "cf-token-c");
    cloudflare.allow("acct", "cf-token-a");
    cloudflare.allow("acct-c", "cf-token-c");
    cloudflare.add_tunnel("acct", TUNNEL_ID, &token);
    cloudflare.add_tunnel("acct-c", THIRD_TUNNEL_ID, &third_token);
    // The plane's pod: a real proxy with the token the Deployment will hand it.
    let pod = proxy_pod("s3cr3t").await;

    let image = "cftunnel-proxy:test".to_owned();
    let options = RuntimeOptions {
        translate: Options {
            proxy_image: Some(image.clone()),
            ..Options::default()
        },
        render: RenderSettings {
            proxy_image: Some(image),
            ..RenderSettings::default()
        },
        resync: Duration::from_millis(150),
        shared: Some(SharedPlane {
            deployment: None,
            service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
            auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
            auth_key: "token".to_owned(),
            tunnel_secret: Some((
                ObjectKey::new("cftunnel-system", "shared-tunnel"),
                "tunnel-token".to_owned(),
            )),
        }),
        cloudflare_api_base: cloudflare.base(),
        cloudflare_api_token: Some("cf-token-c".to_owned()),
        push_timeout: Duration::from_secs(2),
        sustained_after: 3,
        sustained_for: Duration::ZERO,
        ..RuntimeOptions::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let health = std::sync::Arc::new(runtime::health::Health::default());
    let health_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let health_addr = health_listener.local_addr().expect("addr");
    let _health = tokio::spawn(runtime::health::serve(
        health_listener,
        std::sync::Arc::clone(&health),
    ));
    let controller = tokio::spawn(runtime::run(api.client(), options, health, async {
        let _ = stopped.await;
    }));

    // Rendered and applied, owned by the Gateway.
    let gw_uid = api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )
        .and_then(|g| g.pointer("/metadata/uid").cloned())
        .expect("Gateway uid");
    let deployment = eventually("the Deployment", || {
        api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
    })
    .await;
    assert_eq!(
        deployment.pointer("/metadata/ownerReferences/0/uid"),
        Some(&gw_uid)
    );
    assert_eq!(
        deployment.pointer("/metadata/ownerReferences/0/controller"),
        Some(&json!(true))
    );
    assert_eq!(deployment.pointer("/spec/replicas"), Some(&json!(1)));
    let env = deployment
        .pointer("/spec/template/spec/containers/0/env")
        .expect("env")
        .clone();
    assert!(
        env.as_array()
            .expect("list")
            .iter()
            .any(|e| e["name"] == "PROXY_AUTH_TOKEN"
                && e.pointer("/valueFrom/secretKeyRef")
                    == Some(&json!({"name": "edge-api", "key": "bearer"}))),
        "{env}"
    );
    assert!(api
        .get("v1", "Service", "tenant-a", "cf-proxy-edge-config")
        .is_some());
    assert!(api
        .get(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "tenant-a",
            "cf-proxy-edge"
        )
        .is_some());
    assert!(
        api.get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth")
            .is_none(),
        "a bring-your-own token: nothing generated"
    );

    // Accepted, with the tunnel's address, but not Programmed before a replica is ready.
    let status = eventually("the Gateway's status", || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )
        .and_then(|g| g.get("status").cloned())
        .filter(|s| condition(&s["conditions"], "Programmed").is_some())
    })
    .await;
    assert_eq!(
        condition(&status["conditions"], "Accepted").map(|c| &c["status"]),
        Some(&json!("True"))
    );
    let programmed = condition(&status["conditions"], "Programmed").expect("Programmed");
    assert_eq!(
        (&programmed["status"], &programmed["reason"]),
        (&json!("False"), &json!("Pending"))
    );
    let listener = condition(&status["listeners"][0]["conditions"], "Programmed");
    assert_eq!(
        listener.map(|c| (&c["status"], &c["reason"])),
        Some((&json!("False"), &json!("Pending"))),
        "a listener is programmed no sooner than its Gateway"
    );
    assert_eq!(
        status["addresses"],
        json!([{"type": "Hostname", "value": format!("{TUNNEL_ID}.cfargotunnel.com")}])
    );
    let provisioned = eventually("a ProxyProvisioned Event", || {
        api.list("Event")
            .into_iter()
            .find(|e| e["reason"] == "ProxyProvisioned")
    })
    .await;
    assert_eq!(provisioned.pointer("/regarding/name"), Some(&json!("edge")));
    assert_eq!(provisioned["type"], "Normal");

    // The controller's own endpoint: ready, leading, counting rounds and the failing render.
    let health_body = |path: &'static str| async move {
        support::request(health_addr, "GET", path, "controller", None, "")
            .await
            .map(|a| (a.status, String::from_utf8_lossy(&a.body).into_owned()))
    };
    assert_eq!(health_body("/readyz").await.map(|a| a.0), Some(200));
    assert_eq!(health_body("/healthz").await.map(|a| a.0), Some(200));
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = health_body("/metrics")
            .await
            .map(|a| a.1)
            .unwrap_or_default();
        let rounds = metrics
            .lines()
            .find_map(|l| l.strip_prefix("cftunnel_controller_rounds_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if metrics.contains("cftunnel_controller_render_failing_gateways 1")
            && metrics.contains("cftunnel_controller_leading 1")
            && rounds >= 1
        {
            break;
        }
        assert!(Instant::now() < by, "metrics report the round: {metrics}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The shared pool serves the class's Gateway without a GatewayConfig, on the class tunnel.
    let by = Instant::now() + Duration::from_secs(20);
    while get_via(pool.data_addr(), "www.example.com").await != 200 {
        assert!(
            Instant::now() < by,
            "the shared pool serves the shared Gateway's route"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        get_via(pool.data_addr(), "shop.example.com").await,
        404,
        "not tenant a's route"
    );
    let public = eventually("the shared Gateway's address", || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-s",
            "public",
        )
        .and_then(|g| g.pointer("/status/addresses").cloned())
        .filter(|a| a.is_array())
    })
    .await;
    assert_eq!(
        public,
        json!([{"type": "Hostname", "value": format!("{SHARED_TUNNEL_ID}.cfargotunnel.com")}])
    );
    let (_, document) = eventually("the class tunnel's document", || {
        cloudflare.config("acct-s", SHARED_TUNNEL_ID)
    })
    .await;
    assert_eq!(document["ingress"][0]["hostname"], "www.example.com");

    // Someone else's object is not taken over.
    let refused = eventually("a RenderFailed Event", || {
        api.list("Event")
            .into_iter()
            .find(|e| e["reason"] == "RenderFailed")
    })
    .await;
    assert_eq!(refused.pointer("/regarding/name"), Some(&json!("other")));
    assert_eq!(refused["type"], "Warning");
    let note = refused["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("Deployment tenant-b/cf-proxy-other exists and is not owned"),
        "{note}"
    );
    let message = eventually("the reason on Programmed", || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-b",
            "other",
        )
        .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
        .and_then(|c| c["message"].as_str().map(str::to_owned))
        .filter(|m| m.contains("is not owned"))
    })
    .await;
    assert!(
        message.starts_with("the data plane could not be applied: "),
        "{message}"
    );
    let theirs = api
        .get("apps/v1", "Deployment", "tenant-b", "cf-proxy-other")
        .expect("still there");
    assert_eq!(
        theirs.pointer("/spec/template/spec/containers/0/image"),
        Some(&json!("mine:1"))
    );
    assert!(theirs.pointer("/metadata/ownerReferences").is_none());

    // The endpoint controller lists the pod (not ready yet: it has no config): it gets pushed to.
    assert_eq!(get_via(pod.data_addr(), "shop.example.com").await, 502);
    api.put(config_slice(
        "tenant-a",
        "cf-proxy-edge-config",
        pod.admin_addr().port(),
        false,
    ));
    let by = Instant::now() + Duration::from_secs(20);
    while get_via(pod.data_addr(), "shop.example.com").await != 200 {
        assert!(
            Instant::now() < by,
            "the route is served once the pod has its config"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The Deployment controller reports a ready replica: Programmed.
    api.set_status(
        "apps/v1",
        "Deployment",
        "tenant-a",
        "cf-proxy-edge",
        json!({"replicas": 1, "readyReplicas": 1}),
    );
    eventually("Programmed=True", || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )
        .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
        .filter(|c| c["status"] == "True")
    })
    .await;
    let parent = eventually("the route's status", || {
        route_parent(&api, "tenant-a", "shop")
    })
    .await;
    assert_eq!(
        condition(&parent["conditions"], "Accepted").map(|c| &c["status"]),
        Some(&json!("True"))
    );
    assert_eq!(
        condition(&parent["conditions"], "ResolvedRefs").map(|c| &c["status"]),
        Some(&json!("True"))
    );
    assert!(condition(&parent["conditions"], PROXY_CONFIG_PUSHED).is_none());

    // The token is rotated but the pod keeps the old one (it has not rolled yet). The pod
    // template changes, so a real Deployment rolls; meanwhile the pod takes pushes with the
    // token before, and the rounds do not count as failures.
    let hash = |d: &Value| {
        d.pointer("/spec/template/metadata/annotations/cf.k8s.lex.la~1credentials-hash")
            .cloned()
    };
    let before = hash(&deployment);
    api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: edge-api, namespace: tenant-a}\nstringData: {bearer: rotated}\n"));
    eventually("the pods rolled", || {
        api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .filter(|d| hash(d) != before)
    })
    .await;
    // A route change during the rotation reaches the pod on the token before: `/cart` is
    // no longer the route's, then is again.
    let shop = |rule: &str| {
        yaml(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: shop, namespace: tenant-a}}\nspec:\n  parentRefs: [{{name: edge}}]\n  rules: [{{{rule}backendRefs: [{{name: web, port: 80}}]}}]\n"
        ))
    };
    for (rule, status) in [("matches: [{path: {value: /basket}}], ", 404), ("", 200)] {
        api.put(shop(rule));
        let by = Instant::now() + Duration::from_secs(20);
        while get_via(pod.data_addr(), "shop.example.com").await != status {
            assert!(
                Instant::now() < by,
                "the pod serves the changed route ({status})"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    assert!(
        route_condition(&api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).is_none(),
        "a pod on the token before the rotation is no push failure"
    );
    api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: edge-api, namespace: tenant-a}\nstringData: {bearer: s3cr3t}\n"));
    let push_failed = || {
        api.list("Event")
            .into_iter()
            .find(|e| e["reason"] == "ProxyConfigPushFailed")
    };
    assert_eq!(push_failed(), None, "no push has failed yet");

    // The pod's config port goes out of reach: after repeated rounds the route says so.
    let (closed, _held) = closed_port();
    let slice = |port: u16| config_slice("tenant-a", "cf-proxy-edge-config", port, true);
    api.put(slice(closed));
    let failed = eventually("ProxyConfigPushed=False", || {
        route_condition(&api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
    })
    .await;
    assert_eq!(failed["status"], "False");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(message.contains("connecting to 127.0.0.1"), "{message}");
    // And a Warning Event on the route tells it.
    let event = eventually("a ProxyConfigPushFailed Event", push_failed).await;
    // `/metrics` counts the failed pushes against the plane, and says it is failing.
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = health_body("/metrics")
            .await
            .map(|a| a.1)
            .unwrap_or_default();
        let failures = metrics.lines().find_map(|l| {
            l.strip_prefix("cftunnel_controller_push_failures_total{plane=\"tenant-a/edge\"} ")?
                .parse::<u64>()
                .ok()
        });
        if failures.is_some_and(|n| n >= 3)
            && metrics.contains("cftunnel_controller_push_failing_planes 1\n")
        {
            break;
        }
        assert!(Instant::now() < by, "failed pushes counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(event["apiVersion"], "events.k8s.io/v1");
    assert_eq!(event["type"], "Warning");
    let regarding = &event["regarding"];
    assert_eq!(
        (
            &regarding["kind"],
            &regarding["namespace"],
            &regarding["name"]
        ),
        (&json!("HTTPRoute"), &json!("tenant-a"), &json!("shop")),
        "{event}"
    );
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("the proxy pods have not taken the config: ")
            && note.contains("connecting to 127.0.0.1"),
        "{note}"
    );
    // Back in reach: the condition clears.
    api.put(slice(pod.admin_addr().port()));
    eventually("ProxyConfigPushed cleared", || {
        route_parent(&api, "tenant-a", "shop")
            .filter(|p| condition(&p["conditions"], PROXY_CONFIG_PUSHED).is_none())
    })
    .await;

    // A second pod that is down (nothing listens on its config port: its image not pulled,
    // crash-looping) and not ready serves nothing: the plane's pushes to it fail and are
    // counted, but its routes are served by the other pod and say nothing of it.
    // As the plane's Service (publishing not-ready addresses) lists it: `ready`, not serving.
    let down = {
        let mut slice = config_slice("tenant-a", "cf-proxy-edge-config", closed, true);
        slice["metadata"]["name"] = json!("cf-proxy-edge-config-down");
        slice["endpoints"][0]["conditions"]["serving"] = json!(false);
        slice
    };
    let failures = || async {
        health_body("/metrics")
            .await
            .map(|a| a.1)
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("cftunnel_controller_push_failures_total{plane=\"tenant-a/edge\"} ")?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let before = failures().await;
    api.put(down.clone());
    let by = Instant::now() + Duration::from_secs(30);
    while failures().await < before + 4 {
        assert!(
            Instant::now() < by,
            "pushes to the down pod fail and are counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        route_condition(&api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).is_none(),
        "a pod that is down and not ready is no failure of the route"
    );
    // Ready, the same pod may serve an older config: the route says its config is not taken.
    let mut ready = down;
    ready["endpoints"][0]["conditions"]["serving"] = json!(true);
    api.put(ready);
    let failed = eventually("ProxyConfigPushed=False for a ready pod", || {
        route_condition(&api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
    })
    .await;
    assert_eq!(failed["status"], "False");
    api.delete(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "tenant-a",
        "cf-proxy-edge-config-down",
    );
    eventually("ProxyConfigPushed cleared once the pod is gone", || {
        route_parent(&api, "tenant-a", "shop")
            .filter(|p| condition(&p["conditions"], PROXY_CONFIG_PUSHED).is_none())
    })
    .await;

    // Each tunnel has its ingress document, written with its own credentials.
    let (_, document) = eventually("tenant a's tunnel document", || {
        cloudflare.config("acct", TUNNEL_ID)
    })
    .await;
    assert_eq!(
        document,
        json!({"ingress": [
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]})
    );
    let (_, document) = eventually("tenant c's tunnel document", || {
        cloudflare.config("acct-c", THIRD_TUNNEL_ID)
    })
    .await;
    assert_eq!(document["ingress"][0]["hostname"], "blog.example.com");
    let blog_accepted = || route_condition(&api, "tenant-c", "blog", "Accepted");
    eventually("blog accepted", || {
        blog_accepted().filter(|c| c["status"] == "True")
    })
    .await;
    // Tenant c brought no config-API token: one is generated, owned by its Gateway.
    let generated = api
        .get("v1", "Secret", "tenant-c", "cf-proxy-third-auth")
        .expect("a generated token Secret");
    let third_uid = api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-c",
            "third",
        )
        .and_then(|g| g.pointer("/metadata/uid").cloned())
        .expect("uid");
    assert_eq!(
        generated.pointer("/metadata/ownerReferences/0/uid"),
        Some(&third_uid)
    );
    let generated_token = generated.pointer("/data/token").cloned().expect("a token");
    assert_eq!(
        generated_token.as_str().map(str::len),
        Some(88),
        "base64 of 64 hex characters"
    );

    // Tenant a's API token is revoked: only tenant a's route is pending. It stays accepted,
    // served from the tunnel's last document, which DNS records following `Accepted` keep.
    let writes = cloudflare.writes();
    api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: edge-cf, namespace: tenant-a}\nstringData: {api-token: revoked}\n"));
    const WRITTEN: &str = "cf.k8s.lex.la/TunnelDocumentWritten";
    let pending = eventually("shop pending", || {
        route_condition(&api, "tenant-a", "shop", WRITTEN).filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(pending["reason"], "Pending");
    let message = pending["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Authentication error (10000)")
            && message.ends_with("the route is served as the tunnel's last document has it"),
        "{message}"
    );
    assert_eq!(
        route_condition(&api, "tenant-a", "shop", "Accepted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    assert_eq!(
        blog_accepted().map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    assert_eq!(route_condition(&api, "tenant-c", "blog", WRITTEN), None);
    // A working token again: written at once (a new token is proven), the condition gone.
    cloudflare.allow("acct", "cf-token-a2");
    api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: edge-cf, namespace: tenant-a}\nstringData: {api-token: cf-token-a2}\n"));
    eventually("shop written again", || {
        route_parent(&api, "tenant-a", "shop")
            .filter(|p| condition(&p["conditions"], WRITTEN).is_none())
    })
    .await;
    assert_eq!(
        route_condition(&api, "tenant-a", "shop", "Accepted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    assert!(cloudflare.writes() > writes);

    // Tenant c's token is replaced by tenant a's: the two dedicated planes of
    // different namespaces now share a tunnel. Both serve the union (the edge may hand any of
    // the tunnel's requests to either), one document is written, and both routes say so.
    let moved = token.clone();
    api.put(yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: third-tunnel-token, namespace: tenant-c}}\nstringData: {{tunnel-token: \"{moved}\"}}\n"
    )));
    let shared_condition = |ns: &str, name: &str| {
        api.get("gateway.networking.k8s.io/v1", "HTTPRoute", ns, name)
            .and_then(|r| {
                our_parent(&r).and_then(|p| {
                    condition(&p["conditions"], "cf.k8s.lex.la/TunnelShared").cloned()
                })
            })
    };
    let flagged = eventually("blog flagged", || shared_condition("tenant-c", "blog")).await;
    assert_eq!(
        (&flagged["status"], &flagged["reason"]),
        (&json!("True"), &json!("TunnelShared"))
    );
    assert!(
        flagged["message"]
            .as_str()
            .unwrap_or_default()
            .contains("tenant-a/edge"),
        "{flagged}"
    );
    let flagged = eventually("shop flagged", || shared_condition("tenant-a", "shop")).await;
    assert!(
        flagged["message"]
            .as_str()
            .unwrap_or_default()
            .contains("tenant-c/third"),
        "{flagged}"
    );
    let event = eventually("a TunnelShared Event", || {
        api.list("Event").into_iter().find(|e| {
            e["reason"] == "TunnelShared" && e.pointer("/regarding/name") == Some(&json!("blog"))
        })
    })
    .await;
    assert_eq!(event["type"], "Warning");
    let by = Instant::now() + Duration::from_secs(20);
    while get_via(pod.data_addr(), "blog.example.com").await != 200 {
        assert!(
            Instant::now() < by,
            "tenant a's pod serves tenant c's route on the shared tunnel"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    eventually("one document for both", || {
        cloudflare.config("acct", TUNNEL_ID).filter(|(_, d)| {
            d.to_string().contains("blog.example.com") && d.to_string().contains("shop.example.com")
        })
    })
    .await;
    // Back on its own tunnel: no longer flagged.
    api.put(yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: third-tunnel-token, namespace: tenant-c}}\nstringData: {{tunnel-token: \"{third_token}\"}}\n"
    )));
    eventually("shop no longer flagged", || {
        route_parent(&api, "tenant-a", "shop")
            .filter(|p| condition(&p["conditions"], "cf.k8s.lex.la/TunnelShared").is_none())
    })
    .await;

    // Many rounds later the generated token is the same: it is never rotated.
    assert_eq!(
        api.get("v1", "Secret", "tenant-c", "cf-proxy-third-auth")
            .and_then(|s| s.pointer("/data/token").cloned()),
        Some(generated_token)
    );

    // Without its parametersRef the Gateway goes back to the shared plane; its plane goes.
    api.put(yaml(&gateway(false)));
    eventually("the plane removed", || {
        (api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .is_none()
            && api
                .get("v1", "Service", "tenant-a", "cf-proxy-edge-config")
                .is_none()
            && api
                .get(
                    "networking.k8s.io/v1",
                    "NetworkPolicy",
                    "tenant-a",
                    "cf-proxy-edge",
                )
                .is_none())
        .then_some(())
    })
    .await;
    assert!(
        api.get("apps/v1", "Deployment", "tenant-b", "cf-proxy-other")
            .is_some(),
        "not ours, not removed"
    );

    // A Gateway moved to another controller's class loses the plane this controller made.
    assert!(api
        .get("apps/v1", "Deployment", "tenant-c", "cf-proxy-third")
        .is_some());
    let mut third_gateway = api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-c",
            "third",
        )
        .expect("Gateway third");
    third_gateway["spec"]["gatewayClassName"] = json!("someone-else");
    api.put(third_gateway);
    eventually("the plane of a Gateway that left the class removed", || {
        api.get("apps/v1", "Deployment", "tenant-c", "cf-proxy-third")
            .is_none()
            .then_some(())
    })
    .await;

    let _ = stop.send(());
    controller
        .await
        .expect("the controller task")
        .expect("the controller stops cleanly");
    pod.shutdown().await;
    pool.shutdown().await;
}

/// With the controller's own API token, a tunnel's document is written only for a connector
/// token that holds the tunnel's secret: naming another tenant's tunnel id is not enough.
#[tokio::test]
async fn the_controllers_token_writes_only_for_tunnels_the_tenant_can_open() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let real = Token::new("acct", b"the real secret".to_vec(), uuid_of(TUNNEL_ID));
    cloudflare.add_tunnel("acct", TUNNEL_ID, &real.encode());
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
    let target = |secret: &[u8]| TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: Some(secret.to_vec()),
    };
    let document = json!({"ingress": [{"hostname": "victim.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    let mut sync = TunnelSync::default();
    let err = sync
        .sync(&api, &target(b"a guess"), &document)
        .await
        .expect_err("a token without the tunnel's secret is refused");
    assert!(err.contains("does not hold tunnel"), "{err}");
    assert!(
        cloudflare.config("acct", TUNNEL_ID).is_none(),
        "nothing written"
    );
    assert_eq!(
        sync.sync(&api, &target(b"the real secret"), &document)
            .await,
        Ok(true)
    );
    assert_eq!(
        cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
        Some(document.clone())
    );
    assert_eq!(
        sync.sync(&api, &target(b"the real secret"), &document)
            .await,
        Ok(false),
        "unchanged: not written again"
    );
}

/// The account is placed in the API's paths: one that leaves its path segment (a fragment
/// cutting off the rest, here) would send the controller's write for the tenant's tunnel to
/// another tunnel, the secret verified before under the honest account letting the write skip
/// its check. No call is made with such an account, however the target was built.
#[tokio::test]
async fn an_account_that_leaves_its_path_segment_writes_no_other_tunnel() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let tenant = Token::new("acct", b"the tenant's secret".to_vec(), uuid_of(TUNNEL_ID));
    cloudflare.add_tunnel("acct", TUNNEL_ID, &tenant.encode());
    let victim = Token::new(
        "acct",
        b"the victim's secret".to_vec(),
        uuid_of(OTHER_TUNNEL_ID),
    );
    cloudflare.add_tunnel("acct", OTHER_TUNNEL_ID, &victim.encode());
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
    let target = |account: &str, tunnel: &str, secret: &[u8]| TunnelTarget {
        account: account.to_owned(),
        tunnel: uuid_of(tunnel),
        api_token: "controller-token".to_owned(),
        verify_secret: Some(secret.to_vec()),
    };
    let document = |host: &str| json!({"ingress": [{"hostname": host, "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    let mut sync = TunnelSync::default();
    assert_eq!(
        sync.sync(
            &api,
            &target("acct", OTHER_TUNNEL_ID, b"the victim's secret"),
            &document("victim.example.com")
        )
        .await,
        Ok(true)
    );
    assert_eq!(
        sync.sync(
            &api,
            &target("acct", TUNNEL_ID, b"the tenant's secret"),
            &document("tenant.example.com")
        )
        .await,
        Ok(true)
    );
    let victims = cloudflare.config("acct", OTHER_TUNNEL_ID);
    let sent = cloudflare.requests();

    let forged = format!("acct/cfd_tunnel/{OTHER_TUNNEL_ID}/configurations#");
    let err = sync
        .sync(
            &api,
            &target(&forged, TUNNEL_ID, b"the tenant's secret"),
            &document("attacker.example.com"),
        )
        .await
        .expect_err("an account that is no account tag is refused");
    assert!(
        err.contains(&format!("the account {forged:?}")) && err.contains("is not an account tag"),
        "{err}"
    );
    assert_eq!(cloudflare.requests(), sent, "no call is made with it");
    assert_eq!(
        cloudflare.config("acct", OTHER_TUNNEL_ID),
        victims,
        "the other tunnel's document is untouched"
    );
    assert_eq!(
        cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
        Some(document("tenant.example.com"))
    );
}

/// A tunnel's secret checked with one account holds for that account alone: the same tunnel id
/// and secret under another account (the same API token reaching both) is checked again there
/// before anything is written to it.
#[tokio::test]
async fn a_secret_checked_under_one_account_is_checked_again_under_another() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct-a", "controller-token");
    cloudflare.allow("acct-b", "controller-token");
    let real = Token::new("acct-a", b"the real secret".to_vec(), uuid_of(TUNNEL_ID));
    cloudflare.add_tunnel("acct-a", TUNNEL_ID, &real.encode());
    // Account b's tunnel of the same id holds another secret.
    let other = Token::new("acct-b", b"another secret".to_vec(), uuid_of(TUNNEL_ID));
    cloudflare.add_tunnel("acct-b", TUNNEL_ID, &other.encode());
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
    let target = |account: &str| TunnelTarget {
        account: account.to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: Some(b"the real secret".to_vec()),
    };
    let document = json!({"ingress": [{"hostname": "a.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    let mut sync = TunnelSync::default();
    assert_eq!(
        sync.sync(&api, &target("acct-a"), &document).await,
        Ok(true)
    );
    let err = sync
        .sync(&api, &target("acct-b"), &document)
        .await
        .expect_err("account b's tunnel does not hold the secret");
    assert!(err.contains("does not hold tunnel"), "{err}");
    assert!(
        cloudflare.config("acct-b", TUNNEL_ID).is_none(),
        "nothing written under account b"
    );
    assert_eq!(
        cloudflare.config("acct-a", TUNNEL_ID).map(|(_, d)| d),
        Some(document)
    );
}

/// A tunnel write that fails is not sent again at every round (rounds follow every change in
/// the cluster, and each call spends the API token's rate limit, shared with its other
/// tunnels): until its wait is over it fails with the same error and no call; a changed
/// document is tried at once; the wait doubles with each failure in a row.
#[tokio::test]
async fn a_failing_tunnel_write_waits_before_it_is_sent_again() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
    // The tunnel is not there (deleted in the dashboard): its token cannot be read.
    let target = TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: Some(b"the real secret".to_vec()),
    };
    let document = json!({"ingress": [{"service": "http_status:404"}]});
    let mut sync = TunnelSync::with_retry(Duration::from_millis(400), Duration::from_secs(60));
    let first = sync
        .sync(&api, &target, &document)
        .await
        .expect_err("no such tunnel");
    let sent = cloudflare.requests();
    for _ in 0..20 {
        assert_eq!(
            sync.sync(&api, &target, &document).await,
            Err(first.clone())
        );
    }
    assert_eq!(cloudflare.requests(), sent, "no call while the wait lasts");

    let changed = json!({"ingress": [{"hostname": "a.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    assert!(sync.sync(&api, &target, &changed).await.is_err());
    assert_eq!(
        cloudflare.requests(),
        sent + 1,
        "a changed document is tried at once"
    );

    let real = Token::new("acct", b"the real secret".to_vec(), uuid_of(TUNNEL_ID));
    cloudflare.add_tunnel("acct", TUNNEL_ID, &real.encode());
    assert!(
        sync.sync(&api, &target, &changed).await.is_err(),
        "the second failure waits twice as long"
    );
    assert_eq!(cloudflare.requests(), sent + 1);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(sync.sync(&api, &target, &changed).await, Ok(true));
    assert_eq!(
        cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
        Some(changed)
    );
}

/// A tunnel write slower than the wait goes on by itself: the call answers with the tunnel's
/// last failure meanwhile (what Cloudflare holds is still what the last write left), starts no
/// second write of the same document, and the first call after the write ends, told by the
/// wake, reports it written.
#[tokio::test]
async fn a_tunnel_write_slower_than_the_wait_is_reported_once_it_ends() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(30)).expect("client");
    let target = TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: None,
    };
    let wake = Arc::new(tokio::sync::Notify::new());
    // The first failure's wait outlasts the test: the writes below are of another document,
    // which no wait holds back.
    let mut sync = TunnelSync::with_retry(Duration::from_secs(60), Duration::from_secs(60))
        .waiting_at_most(Duration::from_millis(300), Arc::clone(&wake));
    // The first write fails: the catch-all is missing.
    let refused = sync
        .sync(&api, &target, &json!({"ingress": []}))
        .await
        .expect_err("refused");
    tokio::time::timeout(Duration::from_secs(1), wake.notified())
        .await
        .expect("a write's end wakes the loop");
    let document = json!({"ingress": [{"hostname": "a.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    let hold = cloudflare.hold();
    let started = Instant::now();
    assert_eq!(
        sync.sync(&api, &target, &document).await,
        Err(refused.clone()),
        "the last failure while the write runs"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the wait is bounded"
    );
    let sent = cloudflare.requests();
    assert_eq!(sync.sync(&api, &target, &document).await, Err(refused));
    drop(hold);
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("the write's end wakes the loop");
    assert_eq!(
        cloudflare.requests(),
        sent + 1,
        "one write of the document, not one per call"
    );
    assert_eq!(sync.sync(&api, &target, &document).await, Ok(true));
    assert_eq!(
        cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
        Some(document.clone())
    );
    assert_eq!(sync.sync(&api, &target, &document).await, Ok(false));
}

/// A tunnel write under credentials no longer asked for (a rotated API token) is not dropped
/// for the new credentials' write, which goes out once it ends: dropped, a request it had sent
/// could still land after the new one's and leave the tunnel with its older document.
#[tokio::test]
async fn a_tunnel_write_under_credentials_since_rotated_ends_before_the_new_one_goes_out() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    use tokio::io::AsyncReadExt as _;
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let stuck = TunnelApi::new(
        &format!("http://{}/client/v4", hanging.local_addr().expect("addr")),
        Duration::from_secs(1),
    )
    .expect("client");
    // Tells when the write's connection is closed.
    let (closed, mut was_closed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let Ok((mut conn, _)) = hanging.accept().await else {
            return;
        };
        let mut buf = [0; 4096];
        while let Ok(1..) = conn.read(&mut buf).await {}
        let _ = closed.send(());
    });
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "token-b");
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
    let target = |token: &str| TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: token.to_owned(),
        verify_secret: None,
    };
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut sync =
        TunnelSync::default().waiting_at_most(Duration::from_millis(200), Arc::clone(&wake));
    let old = json!({"ingress": [{"service": "http_status:404"}]});
    assert_eq!(sync.sync(&stuck, &target("token-a"), &old).await, Ok(false));
    let new = json!({"ingress": [{"hostname": "a.example.com", "service": "http://localhost:8080"}, {"service": "http_status:404"}]});
    let started = Instant::now();
    assert_eq!(
        sync.sync(&api, &target("token-b"), &new).await,
        Ok(false),
        "behind the write still running"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no round held up"
    );
    assert_eq!(cloudflare.requests(), 0, "nothing sent meanwhile");
    assert!(
        was_closed.try_recv().is_err(),
        "the old credentials' write runs on"
    );
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("the old write's end (its timeout) wakes the loop");
    assert_eq!(sync.sync(&api, &target("token-b"), &new).await, Ok(true));
    assert_eq!(
        cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
        Some(new)
    );
}

/// Writes to one tunnel go out one at a time: a document that changes while the write of
/// the one before is on its way (the API slow to apply it) waits for that write to end, then
/// goes out, and the tunnel ends with the newest. Sent at once, it could be applied before
/// the older one, leaving the tunnel with the older document though the newer was reported
/// written. No call waits for the slow write longer than its bound.
#[tokio::test]
async fn a_changed_document_goes_out_after_the_write_running_for_its_tunnel() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    use cftunnel_testkit::cloudflare_api::PutEvent;
    tokio::time::timeout(Duration::from_secs(30), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "controller-token");
        let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let target = TunnelTarget {
            account: "acct".to_owned(),
            tunnel: uuid_of(TUNNEL_ID),
            api_token: "controller-token".to_owned(),
            verify_secret: None,
        };
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut sync = TunnelSync::default()
            .waiting_at_most(Duration::from_millis(300), Arc::clone(&wake));
        let document = |host: &str| {
            json!({"ingress": [{"hostname": host, "service": "http://localhost:8080"}, {"service": "http_status:404"}]})
        };
        let (older, newer) = (document("old.example.com"), document("new.example.com"));
        cloudflare.slow_next_put(Duration::from_millis(1500));
        let started = Instant::now();
        assert_eq!(sync.sync(&api, &target, &older).await, Ok(false), "running");
        assert!(started.elapsed() < Duration::from_secs(1), "the wait is bounded");
        // Rounds ask for the newer document until it is written; each ends within its bound.
        let mut written = false;
        for _ in 0..5 {
            let started = Instant::now();
            let result = sync.sync(&api, &target, &newer).await;
            assert!(started.elapsed() < Duration::from_secs(1), "the wait is bounded");
            if result == Ok(true) {
                written = true;
                break;
            }
            assert_eq!(result, Ok(false));
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("a write's end wakes the loop");
        }
        assert!(written, "the newer document written");
        // Every write sent has landed.
        eventually("every write answered", || {
            let events = cloudflare.put_events();
            let arrived = events
                .iter()
                .filter(|e| matches!(e, PutEvent::Arrived(_)))
                .count();
            (events.len() == 2 * arrived).then_some(())
        })
        .await;
        assert_eq!(
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
            Some(newer.clone()),
            "the tunnel holds the newest document"
        );
        assert_eq!(
            cloudflare.put_events(),
            [
                PutEvent::Arrived(1),
                PutEvent::Answered(1),
                PutEvent::Arrived(2),
                PutEvent::Answered(2)
            ],
            "the second write sent once the first was answered"
        );
        assert_eq!(sync.sync(&api, &target, &newer).await, Ok(false));
    })
    .await
    .expect("in time");
}

/// Account `acct`'s writer of the tunnel `TUNNEL_ID` with the API token `token`.
fn writer_of_the_tunnel(token: &str) -> cftunnel_controller::cloudflare::TunnelTarget {
    cftunnel_controller::cloudflare::TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: token.to_owned(),
        verify_secret: None,
    }
}

/// Whether what `sync` last saw land on the tunnel `TUNNEL_ID` carries `host`.
fn carries(sync: &cftunnel_controller::cloudflare::TunnelSync, host: &str) -> bool {
    sync.landed(&uuid_of(TUNNEL_ID))
        .is_some_and(|c| c.carries(&[host.to_owned()]))
}

/// What a tunnel serves while its newer documents fail is what was last written to it,
/// whoever wrote it and whichever call the write finished in: a write still running when its
/// call stopped waiting counts once it lands, and a second writer's document replaces the
/// first's. Back to the first writer, its document is written again though its own record
/// says it is unchanged.
#[tokio::test]
async fn the_document_a_tunnel_serves_is_the_last_written_by_any_writer() {
    use cftunnel_controller::cloudflare::{Synced, TunnelApi, TunnelSync};
    tokio::time::timeout(Duration::from_secs(30), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "class-token");
        let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let target = writer_of_the_tunnel;
        let (class, tenant) = (target("class-token"), target("tenant-token"));
        let document = |host: &str| {
            json!({"ingress": [{"hostname": host, "service": "http://localhost:8080"}, {"service": "http_status:404"}]})
        };
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut sync = TunnelSync::default()
            .waiting_at_most(Duration::from_millis(300), Arc::clone(&wake));
        let tunnel = uuid_of(TUNNEL_ID);
        assert!(sync.landed(&tunnel).is_none(), "nothing written yet");
        // A write that outlives its call counts once it has landed.
        cloudflare.slow_next_put(Duration::from_millis(800));
        let first = sync.sync_all(&api, vec![(class.clone(), document("a.example.com"))]).await;
        assert_eq!(first, vec![Ok(Synced::Behind)]);
        assert!(!carries(&sync, "a.example.com"), "still on its way");
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the write's end wakes the loop");
        // The first call after it ends reports it.
        let again = sync.sync_all(&api, vec![(class.clone(), document("a.example.com"))]).await;
        assert_eq!(again, vec![Ok(Synced::Wrote)]);
        assert!(carries(&sync, "a.example.com"));
        // Another writer's document replaces it at Cloudflare, and here.
        cloudflare.allow("acct", "tenant-token");
        let other = sync.sync_all(&api, vec![(tenant, document("b.example.com"))]).await;
        assert_eq!(other, vec![Ok(Synced::Wrote)]);
        assert!(carries(&sync, "b.example.com") && !carries(&sync, "a.example.com"));
        // Back to the first writer, whose own record says its document is written: the tunnel
        // holds the other's, so it is written again.
        cloudflare.allow("acct", "class-token");
        let back = sync.sync_all(&api, vec![(class.clone(), document("a.example.com"))]).await;
        assert_eq!(back, vec![Ok(Synced::Wrote)]);
        assert_eq!(
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
            Some(document("a.example.com"))
        );
        assert!(carries(&sync, "a.example.com") && !carries(&sync, "b.example.com"));
        // And not again while nothing changes.
        let writes = cloudflare.writes();
        let same = sync
            .sync_all(&api, vec![(class.clone(), document("a.example.com"))])
            .await;
        assert_eq!(same, vec![Ok(Synced::Held)]);
        assert_eq!(cloudflare.writes(), writes);
        // A round in which nothing writes the tunnel (its API token gone) while a plane still
        // serves it: what landed is kept, the writers' records are not, so a writer that comes
        // back writes again whatever was done to the tunnel meanwhile (the dashboard).
        sync.retain(std::iter::empty(), |t| *t == tunnel);
        assert!(carries(&sync, "a.example.com"));
        let back = sync.sync_all(&api, vec![(class.clone(), document("a.example.com"))]).await;
        assert_eq!(back, vec![Ok(Synced::Wrote)]);
        // The records kept are the writers asked for, not every writer the tunnel ever had: a
        // rotated token's record goes, though its tunnel is still written (by the new token).
        cloudflare.allow("acct", "rotated-token");
        let rotated = target("rotated-token");
        let wrote = sync.sync_all(&api, vec![(rotated.clone(), document("a.example.com"))]).await;
        assert_eq!(wrote, vec![Ok(Synced::Wrote)]);
        sync.retain([&rotated], |t| *t == tunnel);
        cloudflare.allow("acct", "class-token");
        let old = sync.sync_all(&api, vec![(class, document("a.example.com"))]).await;
        assert_eq!(old, vec![Ok(Synced::Wrote)], "the old token's record was forgotten");
    })
    .await
    .expect("in time");
}

/// A write that gets no answer in time may have landed all the same: until one is answered,
/// the tunnel is taken to serve only what both its last document and the unanswered one carry,
/// so a route the new document dropped is not reported served.
#[tokio::test]
async fn a_write_with_no_answer_leaves_only_what_both_documents_carry_served() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    tokio::time::timeout(Duration::from_secs(30), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "class-token");
        let api = TunnelApi::new(&cloudflare.base(), Duration::from_millis(300)).expect("client");
        let target = writer_of_the_tunnel("class-token");
        let document = |hosts: &[&str]| {
            let mut ingress: Vec<_> = hosts
                .iter()
                .map(|h| json!({"hostname": h, "service": "http://localhost:8080"}))
                .collect();
            ingress.push(json!({"service": "http_status:404"}));
            json!({ "ingress": ingress })
        };
        let mut sync = TunnelSync::with_retry(Duration::from_millis(100), Duration::from_secs(60));
        let first = document(&["a.example.com", "b.example.com"]);
        assert_eq!(sync.sync(&api, &target, &first).await, Ok(true));
        assert!(carries(&sync, "a.example.com") && carries(&sync, "b.example.com"));

        // The next write lands after its client has stopped waiting.
        cloudflare.slow_next_put(Duration::from_millis(800));
        let second = document(&["b.example.com", "c.example.com"]);
        let err = sync
            .sync(&api, &target, &second)
            .await
            .expect_err("no answer in time");
        assert!(err.contains("no answer"), "{err}");
        assert!(
            !carries(&sync, "a.example.com"),
            "the new document dropped it, and may hold"
        );
        assert!(carries(&sync, "b.example.com"), "both documents carry it");
        assert!(
            !carries(&sync, "c.example.com"),
            "the old document lacks it, and may hold"
        );

        // Once a write is answered, the tunnel holds what it wrote.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(sync.sync(&api, &target, &second).await, Ok(true));
        assert!(carries(&sync, "c.example.com") && !carries(&sync, "a.example.com"));

        // A write the API refuses leaves the last document as it was.
        cloudflare.allow("acct", "other-token");
        let refused = TunnelTarget {
            api_token: "stolen".to_owned(),
            ..target.clone()
        };
        assert!(sync.sync(&api, &refused, &first).await.is_err());
        assert!(carries(&sync, "c.example.com") && !carries(&sync, "a.example.com"));
    })
    .await
    .expect("in time");
}

/// Calls with one API token go out in a burst, then spaced: a new leader writing every
/// tunnel stays under the API's limit, which the user's dashboard and other tools share.
#[tokio::test]
async fn tunnel_writes_with_one_token_are_paced() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelSync, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5))
        .expect("client")
        .paced(Duration::from_millis(100), 3);
    let work = (1..=7)
        .map(|i| {
            let target = TunnelTarget {
                account: "acct".to_owned(),
                tunnel: uuid_of(&format!("00000000-0000-4000-8000-{i:012}")),
                api_token: "controller-token".to_owned(),
                verify_secret: None,
            };
            (target, json!({"ingress": [{"service": "http_status:404"}]}))
        })
        .collect();
    let mut sync = TunnelSync::default();
    let started = Instant::now();
    let written = sync.sync_all(&api, work).await;
    assert_eq!(
        written,
        vec![Ok(cftunnel_controller::cloudflare::Synced::Wrote); 7]
    );
    assert_eq!(cloudflare.writes(), 7);
    // Three at once, then four 100 ms apart.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

/// Replicas: a Lease left by a dead holder is taken once it has gone unrenewed for its
/// duration; only the holder writes; a holder that stops gives it up to another at once.
#[tokio::test]
async fn only_the_leader_writes_and_another_replica_takes_over() {
    use cftunnel_controller::runtime::lease::LeaseOptions;
    tokio::time::timeout(Duration::from_secs(60), async {
        let echo = support::echo("tenant-a", "web-1").await;
        let token = edge_token();
        let third = Token::new("acct-c", b"third".to_vec(), uuid_of(THIRD_TUNNEL_ID)).encode();
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(seed(&token, &third, echo.http_addr()))
            .start()
            .await;
        // The replicas differ in their default image, so the Deployment shows who wrote it.
        let replica = |image: &str, identity: &str| {
            let options = RuntimeOptions {
                translate: Options {
                    proxy_image: Some(image.to_owned()),
                    ..Options::default()
                },
                render: RenderSettings {
                    proxy_image: Some(image.to_owned()),
                    ..RenderSettings::default()
                },
                resync: Duration::from_millis(200),
                lease: Some(LeaseOptions {
                    namespace: "cftunnel-system".to_owned(),
                    name: "cftunnel-controller".to_owned(),
                    identity: identity.to_owned(),
                    duration: Duration::from_secs(2),
                    renew: Duration::from_millis(200),
                }),
                ..RuntimeOptions::default()
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let health = std::sync::Arc::new(runtime::health::Health::default());
            let task = tokio::spawn(runtime::run(api.client(), options, health, async {
                let _ = stopped.await;
            }));
            (stop, task)
        };
        let image = || {
            api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| d.pointer("/spec/template/spec/containers/0/image").cloned())
        };
        let holder = || {
            api.get(
                "coordination.k8s.io/v1",
                "Lease",
                "cftunnel-system",
                "cftunnel-controller",
            )
            .and_then(|l| l.pointer("/spec/holderIdentity").cloned())
        };

        // A replica that died holding the Lease: nobody renews it, nobody gives it up.
        api.put(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "cftunnel-controller", "namespace": "cftunnel-system"},
            "spec": {
                "holderIdentity": "ghost",
                "leaseDurationSeconds": 2,
                "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                "leaseTransitions": 0,
            },
        }));
        let (stop_a, a) = replica("proxy:a", "replica-a");
        // a waits until it has seen the Lease unrenewed for its whole duration.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(holder(), Some(json!("ghost")));
        assert_eq!(image(), None, "nothing written before a leads");
        eventually("replica a renders", || image().filter(|i| *i == "proxy:a")).await;
        assert_eq!(holder(), Some(json!("replica-a")));
        let transitions = || {
            api.get("coordination.k8s.io/v1", "Lease", "cftunnel-system", "cftunnel-controller")
                .and_then(|l| l.pointer("/spec/leaseTransitions").cloned())
        };
        assert_eq!(transitions(), Some(json!(1)));

        let (stop_b, b) = replica("proxy:b", "replica-b");
        // Several of b's ticks: it neither takes the Lease nor writes.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(holder(), Some(json!("replica-a")));
        assert_eq!(image(), Some(json!("proxy:a")));

        // a stops and gives the Lease up: b leads at once and reconciles.
        let _ = stop_a.send(());
        a.await.expect("task").expect("a stops cleanly");
        eventually("replica b renders", || image().filter(|i| *i == "proxy:b")).await;
        assert_eq!(holder(), Some(json!("replica-b")));
        assert_eq!(transitions(), Some(json!(2)));
        let _ = stop_b.send(());
        b.await.expect("task").expect("b stops cleanly");
    })
    .await
    .expect("in time");
}

/// The leader's Lease renewals go unanswered: it reports it no longer leads (its `leading`
/// gauge) and drops what only the leader reports (plane pushes, watched objects), writes
/// nothing at all while it does not lead (not even putting back a Deployment of its plane
/// deleted meanwhile), and once the API server answers again it leads and reconciles again.
#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_writing_until_they_are_answered() {
    use cftunnel_controller::runtime::lease::LeaseOptions;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Api, DeleteParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let echo = support::echo("tenant-a", "web-1").await;
        let token = edge_token();
        let third = Token::new("acct-c", b"third".to_vec(), uuid_of(THIRD_TUNNEL_ID)).encode();
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(seed(&token, &third, echo.http_addr()))
            .start()
            .await;
        let options = RuntimeOptions {
            translate: Options {
                proxy_image: Some("proxy:a".to_owned()),
                ..Options::default()
            },
            render: RenderSettings {
                proxy_image: Some("proxy:a".to_owned()),
                ..RenderSettings::default()
            },
            resync: Duration::from_millis(200),
            lease: Some(LeaseOptions {
                namespace: "cftunnel-system".to_owned(),
                name: "cftunnel-controller".to_owned(),
                identity: "replica-a".to_owned(),
                duration: Duration::from_secs(2),
                renew: Duration::from_millis(200),
            }),
            ..RuntimeOptions::default()
        };
        let health = std::sync::Arc::new(runtime::health::Health::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health_addr = listener.local_addr().expect("addr");
        let serving = tokio::spawn(runtime::health::serve(
            listener,
            std::sync::Arc::clone(&health),
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let controller = tokio::spawn(runtime::run(api.client(), options, health, async {
            let _ = stopped.await;
        }));
        let leading = || async {
            let answer = support::request(health_addr, "GET", "/metrics", "controller", None, "")
                .await
                .expect("/metrics answers");
            let text = String::from_utf8_lossy(&answer.body).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("cftunnel_controller_leading "))
                .map(|v| v.trim() == "1")
                .expect("the leading gauge")
        };
        let deployment = || api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge");
        eventually("the leader renders", deployment).await;
        assert!(leading().await);
        // A pod of the plane that does not answer: the leader counts its failed pushes, by plane.
        let (closed, _held) = closed_port();
        api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            closed,
            false,
        ));
        let metrics = || async {
            let answer = support::request(health_addr, "GET", "/metrics", "controller", None, "")
                .await
                .expect("/metrics answers");
            String::from_utf8_lossy(&answer.body).into_owned()
        };
        let per_plane = || async { metrics().await.contains("{plane=\"tenant-a/edge\"}") };
        let watched = || async {
            metrics()
                .await
                .contains("cftunnel_controller_watched_objects{kind=\"Gateway\"} ")
        };
        let by = Instant::now() + Duration::from_secs(10);
        while !per_plane().await {
            assert!(Instant::now() < by, "the leader reports the plane's pushes");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(watched().await, "the leader reports what it watches");

        let hold = api.hold(|c| {
            c.method == "PUT"
                && c.kind == "Lease"
                && c.body.pointer("/spec/holderIdentity") == Some(&json!("replica-a"))
        });
        hold.arrived(1).await;
        let by = Instant::now() + Duration::from_secs(5);
        while leading().await {
            assert!(
                Instant::now() < by,
                "timed out waiting for the leader to step down"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // Something a leader would put back at once.
        let deployments: Api<Deployment> = Api::namespaced(api.user_client(), "tenant-a");
        deployments
            .delete("cf-proxy-edge", &DeleteParams::default())
            .await
            .expect("the Deployment deleted");
        let rv = api.resource_version();
        // Several rounds' worth of resync periods.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(api.writes_since(rv), Vec::<String>::new(), "no writes");
        assert!(!leading().await);
        assert!(!per_plane().await, "a standby reports no plane's pushes");
        assert!(!watched().await, "a standby reports no watched objects");

        hold.release();
        eventually("the Deployment put back", deployment).await;
        assert!(leading().await);
        assert!(watched().await, "the leader reports what it watches again");
        stop_controller(stop, controller).await;
        serving.abort();
    })
    .await
    .expect("in time");
}

/// A leader whose Lease renewals go unanswered for a moment steps down; taking the Lease back
/// with no other replica having led meanwhile, it goes on from what it knew: it re-applies no
/// plane and re-pushes no pod, where a new term would re-apply, re-push and re-write all.
#[tokio::test]
async fn a_leader_that_takes_its_lease_back_unchallenged_goes_on_where_it_was() {
    use cftunnel_controller::runtime::lease::LeaseOptions;
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
            },
            ApiServer::client,
            |options| {
                options.lease = Some(LeaseOptions {
                    namespace: "cftunnel-system".to_owned(),
                    name: "cftunnel-controller".to_owned(),
                    identity: "replica-a".to_owned(),
                    duration: Duration::from_secs(2),
                    renew: Duration::from_millis(200),
                });
                // Rounds only on changes: a resync round under way as the Lease lapses is cut
                // off and rightly not resumed (the next test), which is not what this one is
                // about.
                options.resync = Duration::from_secs(3600);
            },
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let serving = tokio::spawn(runtime::health::serve(listener, t.health.clone()));
        shop_serves(&edge, 200).await;
        // Settled: no write but the Lease's renewals for half a second.
        loop {
            let rv = t.api.resource_version();
            tokio::time::sleep(Duration::from_millis(500)).await;
            if t.api.writes_since(rv).iter().all(|w| w.contains("leases")) {
                break;
            }
        }
        let held = || async {
            let answer = support::request(
                edge.admin_addr(),
                "GET",
                "/config",
                "proxy",
                Some("s3cr3t"),
                "",
            )
            .await
            .expect("the pod answers");
            let state: Value = serde_json::from_slice(&answer.body).expect("JSON");
            state["version"].as_i64().expect("a version")
        };
        let version = held().await;
        let kinds = ["Deployment", "Service", "Secret", "NetworkPolicy"];
        let calls = || kinds.map(|k| t.api.accepts(k).len());
        let before = calls();

        let hold = t.api.hold(|c| {
            c.method == "PUT"
                && c.kind == "Lease"
                && c.body.pointer("/spec/holderIdentity") == Some(&json!("replica-a"))
        });
        hold.arrived(1).await;
        metric_becomes(health, "cftunnel_controller_leading", 0).await;
        hold.release();
        metric_becomes(health, "cftunnel_controller_leading", 1).await;
        // Rounds run meanwhile.
        t.rounds(5, Duration::from_millis(200)).await;
        assert_eq!(calls(), before, "no call about {kinds:?}");
        assert_eq!(held().await, version, "the pod was not pushed to again");
        serving.abort();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A round cut off midway by a lapsed Lease leaves what it wrote unrecorded, so the replica
/// that takes the Lease back, even in the same term, starts afresh rather than going on from
/// it: it applies every plane again, where one going on applies none that is unchanged (the
/// test before). The round is held about 2 s, a second at a push to a pod that stopped
/// answering and a second at a route status write, and the Lease lapses within 0.8 s of the
/// push's start.
#[tokio::test]
async fn a_leader_whose_round_was_cut_off_starts_afresh_on_taking_the_lease_back() {
    use cftunnel_controller::runtime::lease::LeaseOptions;
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let mut port = GatedPort::before(edge.admin_addr()).await;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    port.addr.port(),
                    true,
                ));
            },
            ApiServer::client,
            |options| {
                options.lease = Some(LeaseOptions {
                    namespace: "cftunnel-system".to_owned(),
                    name: "cftunnel-controller".to_owned(),
                    identity: "replica-a".to_owned(),
                    // Leading ends 0.8 s after the last renewal that went through.
                    duration: Duration::from_secs(1),
                    renew: Duration::from_millis(100),
                });
                // Rounds only on changes: the one cut off is the one the test starts.
                options.resync = Duration::from_secs(3600);
            },
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let serving = tokio::spawn(runtime::health::serve(listener, t.health.clone()));
        shop_serves(&edge, 200).await;
        // Settled: no write but the Lease's renewals for half a second.
        loop {
            let rv = t.api.resource_version();
            tokio::time::sleep(Duration::from_millis(500)).await;
            if t.api.writes_since(rv).iter().all(|w| w.contains("leases")) {
                break;
            }
        }
        let rounds = metric(health, "cftunnel_controller_rounds_total")
            .await
            .expect("rounds counted");
        // The namespace of every apply of a plane's objects from now on.
        let kinds = ["Deployment", "Service", "Secret", "NetworkPolicy"];
        let applies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = Arc::clone(&applies);
        let _recording = t.api.forbid(move |c| {
            if c.method == "PATCH" && kinds.contains(&c.kind) {
                let namespace = c.body.pointer("/metadata/namespace").and_then(Value::as_str);
                recorded
                    .lock()
                    .expect("the applies recorded")
                    .push(namespace.unwrap_or_default().to_owned());
            }
            false
        });

        // A route change: the round pushes the plane's new config to a pod that no longer
        // answers (waited for 1 s), then writes the route's status, held (1 s more).
        port.shut();
        let statuses = t.api.hold(|c| {
            c.method == "PATCH" && c.kind == "HTTPRoute" && c.body.pointer("/status").is_some()
        });
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {value: /shop}}], backendRefs: [{name: web, port: 80}]}]\n",
        ));
        port.held.recv().await.expect("the round pushes");
        // The round is under way, and lasts about 2 s more; the Lease lapses 0.8 s at most
        // after the last renewal, so within 0.8 s from now.
        let renewals = t.api.hold(|c| {
            c.method == "PUT"
                && c.kind == "Lease"
                && c.body.pointer("/spec/holderIdentity") == Some(&json!("replica-a"))
        });
        metric_becomes(health, "cftunnel_controller_leading", 0).await;
        assert_eq!(
            metric(health, "cftunnel_controller_rounds_total").await,
            Some(rounds),
            "the round was cut off, not finished"
        );
        applies.lock().expect("the applies recorded").clear();
        port.open();
        statuses.release();
        renewals.release();
        metric_becomes(health, "cftunnel_controller_leading", 1).await;
        // Afresh: every plane applied before is applied again, unchanged as it is (tenant-b's
        // fails on someone else's Deployment and is tried again on its own schedule).
        eventually("tenant-a's and tenant-c's planes applied again", || {
            let applies = applies.lock().expect("the applies recorded");
            ["tenant-a", "tenant-c"]
                .iter()
                .all(|n| applies.iter().any(|a| a == n))
                .then_some(())
        })
        .await;
        serving.abort();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A loopback port in front of a pod's config port: connections pass through while open;
/// once shut, new ones are taken and never answered, as a pod whose proxy hangs, and `held` is
/// told of each.
struct GatedPort {
    addr: SocketAddr,
    shut: Arc<std::sync::atomic::AtomicBool>,
    held: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl GatedPort {
    /// Open, in front of `pod`.
    async fn before(pod: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = Arc::clone(&shut);
        let (tell, held) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((mut conn, _)) = listener.accept().await {
                if gate.load(Ordering::SeqCst) {
                    kept.push(conn);
                    let _ = tell.send(());
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(pod).await {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    }
                });
            }
        });
        Self { addr, shut, held }
    }

    fn shut(&self) {
        self.shut.store(true, Ordering::SeqCst);
    }

    fn open(&self) {
        self.shut.store(false, Ordering::SeqCst);
    }
}

/// The shipped binary: `cftunnel-controller run` with a kubeconfig pointing at the API server
/// serves its probes, renders a Gateway's plane, and on SIGTERM gives its Lease up and exits 0.
#[tokio::test]
async fn the_binary_runs_against_a_kubeconfig_and_stops_on_sigterm() {
    let echo = support::echo("tenant-a", "web-1").await;
    let token = edge_token();
    let third = Token::new("acct-c", b"third".to_vec(), uuid_of(THIRD_TUNNEL_ID)).encode();
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(seed(&token, &third, echo.http_addr()))
        .start()
        .await;
    let dir = std::env::temp_dir().join(format!("cftunnel-controller-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\"}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u, namespace: cftunnel-system}}}}]\ncurrent-context: x\nusers: [{{name: u, user: {{token: t}}}}]\n",
            api.base_url()
        ),
    )
    .expect("kubeconfig");
    let health = cftunnel_testkit::ports::free_port().expect("a free port");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .args(["run", "--proxy-image", "proxy:bin", "--health-addr"])
        .arg(health.to_string())
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", "cftunnel-system")
        .env("POD_NAME", "controller-0")
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env_remove("RUST_LOG")
        .env("LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).expect("log file"))
        .spawn()
        .expect("the controller starts");
    let by = Instant::now() + Duration::from_secs(30);
    while support::request(health, "GET", "/readyz", "controller", None, "")
        .await
        .map(|a| a.status)
        != Some(200)
    {
        assert!(Instant::now() < by, "the controller becomes ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually("the binary renders the plane", || {
        api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .and_then(|d| d.pointer("/spec/template/spec/containers/0/image").cloned())
            .filter(|i| *i == "proxy:bin")
    })
    .await;
    let holder = || {
        api.get(
            "coordination.k8s.io/v1",
            "Lease",
            "cftunnel-system",
            "cftunnel-controller",
        )
        .and_then(|l| l.pointer("/spec/holderIdentity").cloned())
    };
    // Logged before the Event is published: once it is there, so is the log line.
    eventually("the ProxyProvisioned Event", || {
        api.list("Event")
            .into_iter()
            .find(|e| e["reason"] == "ProxyProvisioned")
    })
    .await;
    let held = holder().expect("a holder");
    assert!(
        held.as_str()
            .is_some_and(|h| h.starts_with("controller-0_")),
        "{held}"
    );

    let killed = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let by = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < by, "the controller exits after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(holder(), None, "the Lease was given up");
    // Its log: one JSON object per line, the plane or Gateway a line is about as a field.
    let logs = std::fs::read_to_string(dir.join("stderr")).expect("the log");
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    let line = |message: &str| {
        lines
            .iter()
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line in {logs}"))
    };
    // Planes are applied in no set order: the seed's other ones log theirs too.
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "applied the data plane" && l["gateway"] == "tenant-a/edge"),
        "no \"applied the data plane\" line for tenant-a/edge in {logs}"
    );
    assert_eq!(line("leading: reconciling")["level"], "INFO");
    assert!(!logs.contains('\u{1b}'), "no colour codes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 429 from the Cloudflare API stops calls with that token for its `Retry-After`.
#[tokio::test]
async fn the_api_token_waits_out_a_rate_limit() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelTarget};
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "controller-token");
    let calls = cftunnel_controller::cloudflare::ApiCalls::default();
    let mut registry = prometheus_client::registry::Registry::with_prefix("cftunnel_controller");
    calls.register(&mut registry);
    let api = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5))
        .expect("client")
        .counted(calls.clone());
    let target = TunnelTarget {
        account: "acct".to_owned(),
        tunnel: uuid_of(TUNNEL_ID),
        api_token: "controller-token".to_owned(),
        verify_secret: None,
    };
    let document = json!({"ingress": [{"service": "http_status:404"}]});
    cloudflare.rate_limit_next(1);
    let err = api
        .put_configuration(&target, &document)
        .await
        .expect_err("rate-limited");
    assert!(err.contains("429"), "{err}");
    let sent = cloudflare.requests();
    let err = api
        .put_configuration(&target, &document)
        .await
        .expect_err("still waiting");
    assert!(err.contains("rate limit"), "{err}");
    assert_eq!(cloudflare.requests(), sent, "no request while waiting");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(api.put_configuration(&target, &document).await, Ok(1));

    // A wait longer than any the API sets is cut to ten minutes.
    cloudflare.rate_limit_next(u64::MAX);
    let err = api
        .put_configuration(&target, &document)
        .await
        .expect_err("rate-limited");
    assert!(err.contains("429"), "{err}");
    let err = api
        .put_configuration(&target, &document)
        .await
        .expect_err("still waiting");
    let waiting: u64 = err
        .split_once(" for ")
        .and_then(|(_, rest)| rest.strip_suffix('s'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a wait in seconds: {err}"));
    assert_eq!(waiting, 600, "{err}");
    // The text stays the same while the wait lasts: route conditions carry it, and a text that
    // changed would rewrite them every round.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = api
        .put_configuration(&target, &document)
        .await
        .expect_err("still waiting");
    assert_eq!(again, err);

    // A token the API refuses, and an API nobody answers for.
    let refused = TunnelTarget {
        api_token: "stolen".to_owned(),
        ..target.clone()
    };
    assert!(api.put_configuration(&refused, &document).await.is_err());
    let (gone, _held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    let unreachable = TunnelApi::new(&format!("http://{gone}"), Duration::from_secs(5))
        .expect("client")
        .counted(calls);
    assert!(unreachable.tunnel_token(&target).await.is_err());

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    for (series, n) in [
        (
            "requests_total{call=\"put_configuration\",status=\"429\"}",
            2,
        ),
        (
            "requests_total{call=\"put_configuration\",status=\"200\"}",
            1,
        ),
        (
            "requests_total{call=\"put_configuration\",status=\"403\"}",
            1,
        ),
        (
            "requests_total{call=\"tunnel_token\",status=\"unreachable\"}",
            1,
        ),
        ("errors_total{call=\"put_configuration\",status=\"429\"}", 2),
        (
            "errors_total{call=\"put_configuration\",status=\"rate_limited\"}",
            3,
        ),
        ("errors_total{call=\"put_configuration\",status=\"403\"}", 1),
        (
            "errors_total{call=\"tunnel_token\",status=\"unreachable\"}",
            1,
        ),
    ] {
        let line = format!("cftunnel_controller_cloudflare_api_{series} {n}\n");
        assert!(text.contains(&line), "{line} in:\n{text}");
    }
    assert!(
        !text.contains("errors_total{call=\"put_configuration\",status=\"200\"}"),
        "a success is no error:\n{text}"
    );
}

/// A real proxy standing for a pod of a plane, its config API behind `token`.
async fn proxy_pod(token: &str) -> Server {
    Server::start(
        ServerOptions {
            auth_token: Some(token.to_owned()),
            ..ServerOptions::default()
        },
        None,
    )
    .await
    .expect("a proxy starts")
}

/// Waits until `pod` answers `shop.example.com` with `status`.
async fn shop_serves(pod: &Server, status: u16) {
    host_serves(pod, "shop.example.com", status).await;
}

/// Waits until `pod` answers `host` with `status`.
async fn host_serves(pod: &Server, host: &str, status: u16) {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let got = get_via(pod.data_addr(), host).await;
        if got == status {
            return;
        }
        assert!(Instant::now() < by, "{host}: {got}, not {status}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The EndpointSlice of Service `namespace/service` as the endpoint slice controller writes
/// it: one pod on 127.0.0.1 with its config port `port`, `ready` or not.
/// A port on 127.0.0.1 nothing listens on while the socket returned is held: a pod whose
/// config port it is refuses every push.
fn closed_port() -> (u16, tokio::net::TcpSocket) {
    let (addr, held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    (addr.port(), held)
}

/// Waits for `route` to report `ProxyConfigPushed=False` naming the pods of `gateway`, another
/// Gateway on its tunnel, that refused their push.
async fn push_failure_names(api: &ApiServer, (namespace, route): (&str, &str), gateway: &str) {
    // A failure seen on the way (a pod read back before it took its first config) may be
    // reported first: the refused push is what is waited for.
    let names = |c: &serde_json::Value| {
        let message = c["message"].as_str().unwrap_or_default();
        c["status"] == "False"
            && message.contains(&format!(
                "the pods of gateway {gateway}, on the same tunnel: "
            ))
            && message.contains("connecting to 127.0.0.1")
    };
    eventually(
        &format!("ProxyConfigPushed=False on {namespace}/{route} naming {gateway}'s pods"),
        || route_condition(api, namespace, route, PROXY_CONFIG_PUSHED).filter(|c| names(c)),
    )
    .await;
}

fn config_slice(namespace: &str, service: &str, port: u16, ready: bool) -> Value {
    yaml(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {service}-x1, namespace: {namespace}, labels: {{kubernetes.io/service-name: {service}, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}}}\naddressType: IPv4\nports: [{{name: config, port: {port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"], conditions: {{ready: {ready}}}}}]\n"
    ))
}

/// The shared pool's config EndpointSlice as [`shared_seed`] writes it (`cftunnel-proxy-p1`),
/// listing one pod with config port `port`, `ready` or not: put, it takes the seed's place.
fn pool_slice(port: u16, ready: bool) -> Value {
    let mut slice = config_slice("cftunnel-system", "cftunnel-proxy", port, ready);
    slice["metadata"]["name"] = json!("cftunnel-proxy-p1");
    slice
}

/// The seed's tenant-a Gateway, its GatewayConfig's spec set by [`Tenant::configure`], on an
/// API server of its own, and a controller without a shared pool, Lease or Cloudflare API
/// rendering and applying its plane.
struct Tenant {
    api: ApiServer,
    _echo: cftunnel_testkit::echo::EchoServer,
    health: std::sync::Arc<runtime::health::Health>,
    stop: tokio::sync::oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Tenant {
    async fn start(spec: &str) -> Self {
        Self::start_with(spec, |_| {}).await
    }

    /// [`Tenant::start`] with `before` run on the API server before the controller starts.
    async fn start_with(spec: &str, before: impl FnOnce(&ApiServer)) -> Self {
        Self::start_on(spec, before, ApiServer::client).await
    }

    /// [`Tenant::start_with`], the controller using the client `client` makes.
    async fn start_on(
        spec: &str,
        before: impl FnOnce(&ApiServer),
        client: impl FnOnce(&ApiServer) -> kube::Client,
    ) -> Self {
        Self::start_tuned(spec, before, client, |_| {}).await
    }

    /// [`Tenant::start_on`], `tune` changing the controller's options.
    async fn start_tuned(
        spec: &str,
        before: impl FnOnce(&ApiServer),
        client: impl FnOnce(&ApiServer) -> kube::Client,
        tune: impl FnOnce(&mut RuntimeOptions),
    ) -> Self {
        Self::start_granted(spec, REQUIRED_RBAC, before, client, tune).await
    }

    /// [`Tenant::start_tuned`], the controller's client granted `rbac`.
    async fn start_granted(
        spec: &str,
        rbac: &'static [cftunnel_testkit::kube_api::Rule],
        before: impl FnOnce(&ApiServer),
        client: impl FnOnce(&ApiServer) -> kube::Client,
        tune: impl FnOnce(&mut RuntimeOptions),
    ) -> Self {
        let echo = support::echo("tenant-a", "web-1").await;
        let token = edge_token();
        let third = Token::new("acct-c", b"third".to_vec(), uuid_of(THIRD_TUNNEL_ID)).encode();
        let api = ApiServer::builder()
            .rbac(rbac)
            .seed(seed(&token, &third, echo.http_addr()))
            .start()
            .await;
        put_gateway_config(&api, spec);
        before(&api);
        let mut options = Self::options();
        tune(&mut options);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = std::sync::Arc::new(runtime::health::Health::default());
        let controller = tokio::spawn(runtime::run(client(&api), options, health.clone(), async {
            let _ = stopped.await;
        }));
        Self {
            api,
            _echo: echo,
            health,
            stop,
            controller,
        }
    }

    /// The controller's options before a test tunes them.
    fn options() -> RuntimeOptions {
        RuntimeOptions {
            translate: Options {
                proxy_image: Some("proxy:1".to_owned()),
                ..Options::default()
            },
            render: RenderSettings {
                proxy_image: Some("proxy:1".to_owned()),
                ..RenderSettings::default()
            },
            resync: Duration::from_millis(100),
            sustained_for: Duration::ZERO,
            ..RuntimeOptions::default()
        }
    }

    /// Stops the controller and starts another on the same API server, as a changed flag
    /// restarts its pod, `tune` changing its options.
    async fn restart(&mut self, tune: impl FnOnce(&mut RuntimeOptions)) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let _ = std::mem::replace(&mut self.stop, stop).send(());
        let old = std::mem::replace(&mut self.controller, tokio::spawn(async { Ok(()) }));
        old.await
            .expect("task")
            .expect("the controller stops cleanly");
        let mut options = Self::options();
        tune(&mut options);
        self.controller = tokio::spawn(runtime::run(
            self.api.client(),
            options,
            self.health.clone(),
            async {
                let _ = stopped.await;
            },
        ));
    }

    /// Changes an object no translation reads `n` times, `gap` apart: each change starts a
    /// round.
    async fn rounds(&self, n: usize, gap: Duration) {
        for i in 0..n {
            self.api.put(yaml(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: unrelated, namespace: tenant-a}}\ndata: {{round: \"{i}\"}}\n"
            )));
            tokio::time::sleep(gap).await;
        }
    }

    /// Replaces the GatewayConfig's spec (besides its token Secrets) with `spec`.
    fn configure(&self, spec: &str) {
        put_gateway_config(&self.api, spec);
    }

    /// The Deployment's `spec.replicas` and the managers that own it.
    fn replicas(&self) -> (Option<Value>, Vec<String>) {
        let d = self
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .unwrap_or_default();
        let owners = d
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|m| m.pointer("/fieldsV1/f:spec/f:replicas").is_some())
            .filter_map(|m| m["manager"].as_str().map(str::to_owned))
            .collect();
        (d.pointer("/spec/replicas").cloned(), owners)
    }

    /// Waits until the Deployment's `spec.replicas` is `n`.
    async fn replicas_become(&self, n: i32) {
        eventually(&format!("{n} replicas"), || {
            self.replicas().0.filter(|r| *r == json!(n))
        })
        .await;
    }

    /// Waits until the Deployment's pod template asks for `memory`: the controller has
    /// applied a new rendering.
    async fn applied_with_memory(&self, memory: &str) {
        eventually("the new rendering applied", || {
            self.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| {
                    d.pointer("/spec/template/spec/containers/0/resources/limits/memory")
                        .cloned()
                })
                .filter(|m| *m == json!(memory))
        })
        .await;
    }

    /// [`Tenant::start`], with one proxy pod of its plane listed in the plane's config
    /// EndpointSlice.
    async fn with_pod(spec: &str) -> (Self, Server) {
        let edge = proxy_pod("s3cr3t").await;
        let t = Self::start_with(spec, |api| {
            api.put(config_slice(
                "tenant-a",
                "cf-proxy-edge-config",
                edge.admin_addr().port(),
                true,
            ));
        })
        .await;
        (t, edge)
    }

    /// Waits until the Gateway's `Programmed` says its plane could not be applied.
    async fn apply_failure_reported(&self) {
        eventually("the failed apply reported", || {
            self.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
                .filter(|c| {
                    c["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("the data plane could not be applied"))
                })
        })
        .await;
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.controller
            .await
            .expect("task")
            .expect("the controller stops cleanly");
    }
}

/// Each plane is rendered once a round, and that one render both decides the Gateway's
/// acceptance and is what gets applied: the settings the runtime renders with decide both,
/// whatever the translation's own options say. A second render for the translation, with
/// other inputs, would accept what is not applied or apply what is not accepted.
#[tokio::test]
async fn a_gateway_is_accepted_by_the_render_that_is_applied() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let accepted = |api: &ApiServer| {
            api.get(
                "gateway.networking.k8s.io/v1",
                "Gateway",
                "tenant-a",
                "edge",
            )
            .and_then(|g| condition(g.pointer("/status/conditions")?, "Accepted").cloned())
        };
        let image = |api: &ApiServer| {
            api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| d.pointer("/spec/template/spec/containers/0/image").cloned())
        };

        // Only the render settings name an image: accepted, and applied with it.
        let t = Tenant::start_tuned(
            "replicas: 1",
            |_| {},
            ApiServer::client,
            |options| {
                options.translate.proxy_image = None;
                options.render.proxy_image = Some("proxy:rendered".to_owned());
            },
        )
        .await;
        let applied = eventually("the Deployment", || image(&t.api)).await;
        assert_eq!(applied, json!("proxy:rendered"));
        let status = eventually("Accepted", || accepted(&t.api)).await;
        assert_eq!(status["status"], "True", "{status}");
        t.stop().await;

        // Only the translation's options name one: nothing to apply, so not accepted, with the
        // render's reason.
        let t = Tenant::start_tuned(
            "replicas: 1",
            |_| {},
            ApiServer::client,
            |options| {
                options.translate.proxy_image = Some("proxy:1".to_owned());
                options.render.proxy_image = None;
            },
        )
        .await;
        let status = eventually("Accepted", || accepted(&t.api)).await;
        assert_eq!(
            (&status["status"], &status["reason"]),
            (&json!("False"), &json!("InvalidParameters")),
            "{status}"
        );
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains("--proxy-image"), "{message}");
        assert_eq!(image(&t.api), None, "nothing is applied");
        t.stop().await;
    })
    .await
    .expect("in time");
}

fn edge_gateway(api: &ApiServer) -> Option<Value> {
    api.get(
        "gateway.networking.k8s.io/v1",
        "Gateway",
        "tenant-a",
        "edge",
    )
}

/// Counts the status writes to Gateways from now on.
fn count_gateway_status_writes(api: &ApiServer) -> (Arc<AtomicUsize>, impl Drop) {
    let writes = Arc::new(AtomicUsize::new(0));
    let counted = writes.clone();
    let watch = api.forbid(move |call| {
        if call.method == "PATCH" && call.kind == "Gateway" && call.body.get("status").is_some() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        false
    });
    (writes, watch)
}

/// Conditions another controller keeps on our Gateway and its listeners (a policy
/// controller's, as Gateway API's policy attachment asks) stay through our status writes.
#[tokio::test]
async fn another_controllers_conditions_on_a_gateway_stay() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let status = eventually("the Gateway's status", || {
            let g = edge_gateway(&t.api)?;
            condition(g.pointer("/status/conditions")?, "Accepted")?;
            g.pointer("/status/listeners/0/conditions")?;
            g.get("status").cloned()
        })
        .await;
        let theirs = json!({"type": "example.com/PolicyAffected", "status": "True", "reason": "Applied", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        conditions.insert(0, theirs.clone());
        let mut listeners = status["listeners"].clone();
        if let Some(l) = listeners[0]["conditions"].as_array_mut() {
            l.push(theirs.clone());
        }
        // One of ours we no longer set goes.
        conditions.push(json!({"type": "Conflicted", "status": "True", "reason": "Stale", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}));
        t.api.set_status(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
            json!({"conditions": conditions, "listeners": listeners}),
        );
        eventually("our stale condition gone", || {
            let g = edge_gateway(&t.api)?;
            condition(g.pointer("/status/conditions")?, "Conflicted")
                .is_none()
                .then_some(())
        })
        .await;
        // Rounds run every 100 ms: several pass.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let g = edge_gateway(&t.api).expect("the Gateway");
        assert_eq!(
            g["status"]["conditions"][0], theirs,
            "kept, in its place: {g}"
        );
        assert!(condition(&g["status"]["conditions"], "Accepted").is_some());
        assert_eq!(
            condition(&g["status"]["listeners"][0]["conditions"], "example.com/PolicyAffected"),
            Some(&theirs),
            "{g}"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// CRDs older than v1.5 have no `status.attachedListenerSets` on Gateways, and the API server
/// prunes it from every write: the controller stops sending it instead of writing every
/// Gateway again at every round.
#[tokio::test]
async fn a_status_field_the_crds_lack_is_not_written_at_every_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
        })
        .await;
        eventually("Accepted", || {
            let g = edge_gateway(&t.api)?;
            condition(g.pointer("/status/conditions")?, "Accepted").cloned()
        })
        .await;
        // Once its status settles, rounds every 100 ms leave the Gateway alone.
        let (writes, _counting) = count_gateway_status_writes(&t.api);
        let settled = Instant::now() + Duration::from_secs(20);
        loop {
            let before = writes.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(800)).await;
            if writes.load(Ordering::SeqCst) == before {
                break;
            }
            assert!(
                Instant::now() < settled,
                "the Gateway's status is written at every round ({} writes)",
                writes.load(Ordering::SeqCst)
            );
        }
        let g = edge_gateway(&t.api).expect("the Gateway");
        assert!(g.pointer("/status/attachedListenerSets").is_none(), "{g}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A status write the API server never answers fails once it has waited the client's bound
/// (`runtime::api_client`), as any failed API call: the round goes on, later rounds apply
/// later changes, and once the API server answers the status is written.
#[tokio::test]
async fn a_status_write_that_is_never_answered_does_not_stall_reconciling() {
    use cftunnel_controller::runtime::api_client;
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut held = None;
        let t = Tenant::start_on(
            "replicas: 2",
            |api| held = Some(api.hold(|c| c.method == "PATCH" && c.kind == "Gateway")),
            |api| {
                let config = kube::Config::new(api.base_url().parse().expect("url"));
                api_client::from_config(config, Duration::from_millis(500)).expect("client")
            },
        )
        .await;
        let hold = held.expect("the Gateway's status writes are held");
        t.replicas_become(2).await;
        // The first round reached its status writes.
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("the Gateway's status write");

        t.configure("replicas: 2, resources: {limits: {memory: 128Mi}}");
        // Applied by a later round: the one held in its status writes went on.
        t.applied_with_memory("128Mi").await;
        let gateway_status = || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| g.pointer("/status/conditions").cloned())
        };
        assert_eq!(gateway_status(), None, "nothing written while held");

        hold.release();
        eventually("the Gateway's status written", gateway_status).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A round's status writes go out side by side: one the API server is slow to answer (here,
/// never) holds up no other object's status.
#[tokio::test]
async fn a_status_write_that_hangs_holds_up_no_other_objects_status() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut held = None;
        let t = Tenant::start_with("replicas: 1", |api| {
            held = Some(api.hold(|c| c.method == "PATCH" && c.kind == "Gateway"));
        })
        .await;
        let hold = held.expect("the Gateway's status writes are held");
        tokio::time::timeout(Duration::from_secs(20), hold.arrived(1))
            .await
            .expect("the Gateway's status write");
        // Routes are written after Gateways in a round: pending while the new plane is
        // applied, then accepted, by later rounds.
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let accepted = route_condition(&t.api, "tenant-a", "shop", "Accepted")
                    .is_some_and(|c| c["status"] == "True");
                if accepted {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
        .await
        .expect("the route's status is written while the Gateway's hangs");
        hold.release();
        t.stop().await;
    })
    .await
    .expect("in time");
}

fn put_gateway_config(api: &ApiServer, spec: &str) {
    api.put(yaml(&format!(
        "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: edge-config, namespace: tenant-a}}\nspec: {{tunnelTokenSecretRef: {{name: edge-tunnel-token}}, authTokenSecretRef: {{name: edge-api, key: bearer}}, {spec}}}\n"
    )));
}

/// A plane whose apply fails (an admission webhook refusing it, the API server failing) is not
/// applied again at every round: applies run ahead of every push and status of the round, and
/// one failing at each would hold up every tenant. It is applied again after a wait, or at once
/// when its render changes, and the plane comes up once the cause is gone.
#[tokio::test]
async fn a_failing_apply_waits_before_it_is_sent_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let deployment = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        };
        eventually("the plane's Deployment", deployment).await;

        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&attempts);
        let failing = t.api.fail(500, move |c| {
            let ours = c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"));
            if ours {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            ours
        });
        t.configure("replicas: 2");
        eventually("an apply of the new render", || {
            (attempts.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        // Rounds every 100 ms (and at each change) meanwhile: none applies it again.
        t.rounds(3, Duration::from_millis(500)).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "applied once");

        // A changed render is applied at once; the cause gone, the plane comes up.
        t.configure("replicas: 3");
        eventually("an apply of the changed render", || {
            (attempts.load(Ordering::SeqCst) > 1).then_some(())
        })
        .await;
        drop(failing);
        t.replicas_become(3).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// While an apply of a plane fails, the plane as last applied keeps getting its routes: its
/// pods run as they were, and a failing webhook or API server is no reason for a tenant's route
/// changes to stop reaching them. The Gateway says the plane could not be applied.
#[tokio::test]
async fn a_plane_whose_apply_fails_still_gets_its_routes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;

        let failing = t.api.fail(500, |c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
        });
        t.configure("replicas: 2");
        t.apply_failure_reported().await;
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
        );
        shop_serves(&edge, 404).await;
        drop(failing);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// An apply that hangs (an admission webhook that never answers, up to the API timeout) holds
/// up nothing else: the plane as last applied still gets its routes, another tenant's plane is
/// applied meanwhile, and a changed render is applied without waiting for the hung one.
#[tokio::test]
async fn an_apply_that_hangs_holds_up_no_push_and_no_other_plane() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;
        let replicas = |namespace: &str, name: &str| {
            t.api
                .get("apps/v1", "Deployment", namespace, name)
                .and_then(|d| d.pointer("/spec/replicas").cloned())
        };
        eventually("the third tenant's plane", || replicas("tenant-c", "cf-proxy-third")).await;

        // The test's API client waits far longer than the test: only the apply of tenant-a's
        // render with two replicas hangs.
        let hung = t.api.hold(|c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
                && c.body.pointer("/spec/replicas") == Some(&json!(2))
        });
        t.configure("replicas: 2");
        tokio::time::timeout(Duration::from_secs(20), hung.arrived(1))
            .await
            .expect("the apply reached the API server");

        // Its own route change reaches its pods.
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-a",
            "shop",
        );
        shop_serves(&edge, 404).await;
        // Another tenant's plane is applied.
        t.api.put(yaml(
            "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: third-config, namespace: tenant-c}\nspec: {tunnelTokenSecretRef: {name: third-tunnel-token}, replicas: 3}\n",
        ));
        eventually("the third tenant's new render applied", || {
            replicas("tenant-c", "cf-proxy-third").filter(|r| *r == json!(3))
        })
        .await;
        // A changed render supersedes the hung apply.
        t.configure("replicas: 4");
        t.replicas_become(4).await;
        hung.release();
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A route told its plane's pushes fail, then served again, then told the same failure again:
/// the second Event says what the first said, so it is counted in the first's series rather
/// than made an object more; one that says something else is an object of its own.
#[tokio::test]
async fn a_push_failure_told_again_as_it_was_is_counted_in_one_event() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        shop_serves(&edge, 200).await;
        let (closed, _held) = closed_port();
        let slice = |port: u16| config_slice("tenant-a", "cf-proxy-edge-config", port, true);
        let push_failed = || -> Vec<Value> {
            t.api
                .list("Event")
                .into_iter()
                .filter(|e| e["reason"] == "ProxyConfigPushFailed")
                .collect()
        };
        let condition = || route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED);
        for round in 1..=2u64 {
            t.api.put(slice(closed));
            eventually("a push failure told", || {
                let told: u64 = push_failed()
                    .iter()
                    .map(|e| {
                        e.pointer("/series/count")
                            .and_then(Value::as_u64)
                            .unwrap_or(1)
                    })
                    .sum();
                (told == round).then_some(())
            })
            .await;
            t.api.put(slice(edge.admin_addr().port()));
            eventually("the push failure gone", || {
                condition().is_none().then_some(())
            })
            .await;
        }
        let events = push_failed();
        assert_eq!(events.len(), 1, "one object: {events:?}");
        assert_eq!(events[0].pointer("/series/count"), Some(&json!(2)));

        // The Event deleted (by hand, or expired): the same failure told again is a new one.
        let name = events[0]["metadata"]["name"].as_str().unwrap_or_default();
        assert!(t.api.delete("events.k8s.io/v1", "Event", "tenant-a", name));
        t.api.put(slice(closed));
        let again = eventually("the failure told in a new Event", || {
            push_failed().into_iter().next()
        })
        .await;
        assert_ne!(again["metadata"]["name"].as_str(), Some(name));
        // And told again as it was: counted in the new one.
        t.api.put(slice(edge.admin_addr().port()));
        eventually("the push failure gone", || {
            condition().is_none().then_some(())
        })
        .await;
        t.api.put(slice(closed));
        eventually("the failure counted in the new Event", || {
            let events = push_failed();
            (events.len() == 1 && events[0].pointer("/series/count") == Some(&json!(2)))
                .then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A pod that accepts connections and never answers, in another tenant's plane, holds up no
/// tenant's route changes: a round waits for the pushes it starts only briefly, and the stuck
/// one runs on by itself (here for far longer than the test).
#[tokio::test]
async fn a_pod_that_never_answers_holds_up_no_other_tenants_route_changes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (hanging, _) = never_answers().await;
        let hanging_port = hanging.port();
        let edge = proxy_pod("s3cr3t").await;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                api.put(config_slice(
                    "tenant-c",
                    "cf-proxy-third-config",
                    hanging_port,
                    false,
                ));
            },
            ApiServer::client,
            |options| options.push_timeout = Duration::from_secs(120),
        )
        .await;
        shop_serves(&edge, 200).await;
        shop_goes_away(&t, &edge).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A loopback address that takes connections, holds them and never answers, and a channel
/// told of each connection.
async fn never_answers() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (calls, called) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            open.push(conn);
            let _ = calls.send(());
        }
    });
    (addr, called)
}

/// Deletes tenant-a's route `shop` and waits until `edge` no longer serves it.
async fn shop_goes_away(t: &Tenant, edge: &Server) {
    t.api.delete(
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "tenant-a",
        "shop",
    );
    shop_serves(edge, 404).await;
}

/// A Cloudflare API that takes connections and never answers (egress to it blackholed)
/// holds up no route change: a round waits for the ingress-document writes it starts only
/// briefly, and the hung one runs on by itself (here for far longer than the test).
#[tokio::test]
async fn a_cloudflare_api_that_never_answers_holds_up_no_route_change() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (hanging, mut called) = never_answers().await;
        let base = format!("http://{hanging}/client/v4");
        let edge = proxy_pod("s3cr3t").await;
        let t = Tenant::start_tuned(
            "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
            },
            ApiServer::client,
            |options| {
                // Each API call may take 120 s.
                options.push_timeout = Duration::from_secs(60);
                options.cloudflare_api_base = base;
            },
        )
        .await;
        shop_serves(&edge, 200).await;
        called.recv().await.expect("the document's write began");
        shop_goes_away(&t, &edge).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Two Gateways of one tenant on one tunnel, one of them still on the secret from before the
/// tunnel's token was rotated (its connectors stay registered until restarted), written with
/// the same API token: the tunnel gets one document listing both Gateways' hostnames, written
/// once, not two that replace each other at every round.
#[tokio::test]
async fn two_secrets_of_one_tunnel_written_by_one_token_share_one_document() {
    let rotated = Token::new("acct", b"rotated secret".to_vec(), uuid_of(TUNNEL_ID)).encode();
    second_gateway_on_the_tunnel(&rotated, "edge-cf").await;
}

/// A Gateway on a tunnel whose API credentials cannot be read (its Secret missing) keeps its
/// hostnames in the tunnel's document, which another Gateway on the tunnel writes.
#[tokio::test]
async fn a_gateway_whose_credentials_are_missing_keeps_its_hostnames_in_its_tunnels_document() {
    let same = edge_token();
    second_gateway_on_the_tunnel(&same, "missing-cf").await;
}

/// Two Gateways on one tunnel whose API credentials differ, those of the first (`edge`, first
/// in key order) refused by the API: the other's write the tunnel's one document, listing both
/// Gateways' hostnames, and no route of either says its tunnel's document failed.
#[tokio::test]
async fn one_gateways_refused_api_token_keeps_its_tunnels_document_from_no_other() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        // `edge`'s token, `cf-token-a`, is refused; `internal`'s is not.
        cloudflare.allow("acct", "cf-token-b");
        let edge = proxy_pod("s3cr3t").await;
        let t = internal_joins_edge(&edge, &edge_token(), "internal-cf", &cloudflare.base()).await;
        t.api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: internal-cf, namespace: tenant-a}\nstringData: {api-token: cf-token-b}\n"));
        let want = json!({"ingress": [
            {"hostname": "internal.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("one document with both Gateways' hostnames", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        t.rounds(3, Duration::from_millis(300)).await;
        none_told_unwritten(&t.api, &["shop", "intranet"]);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Three Gateways on one tunnel, one of them (`third`) on the secret from before the tunnel's
/// token was rotated and naming `edge`'s API token, which is refused; `internal` names another,
/// accepted. The token the two secrets share is tried first and fails; `edge` and `internal`'s
/// document is then written with `internal`'s token, once, while `third`, with no other token,
/// waits to be accepted, saying why; and the refused token is not asked again in its wait.
#[tokio::test]
async fn a_refused_api_token_a_rotated_secret_shares_fails_only_the_gateway_with_no_other() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-b");
        let edge = proxy_pod("s3cr3t").await;
        let t = rotated_tunnel_of_three(&edge, &cloudflare, "edge-cf").await;
        let want = json!({"ingress": [
            {"hostname": "internal.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("edge and internal's document", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        told_authentication_failed(&t.api, "thirdroute").await;
        stays_written(&t, &cloudflare).await;
        none_told_unwritten(&t.api, &["shop", "intranet"]);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// As [`a_refused_api_token_a_rotated_secret_shares_fails_only_the_gateway_with_no_other`],
/// with a fourth Gateway on a third secret of the tunnel naming `internal`'s token only: the
/// refused token, tried first for `edge`, `internal` and `third`, is asked on its own while it
/// waits, and `internal`'s token writes one document for `edge`, `internal` and `fourth`, once,
/// rather than a smaller one and then the whole at every round.
#[tokio::test]
async fn a_refused_token_in_its_wait_does_not_split_another_tokens_document() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-b");
        let edge = proxy_pod("s3cr3t").await;
        let t = rotated_tunnel_of_three(&edge, &cloudflare, "edge-cf").await;
        let other = Token::new("acct", b"another secret".to_vec(), uuid_of(TUNNEL_ID)).encode();
        for doc in peer_gateway("fourth", &other, "internal-cf", "fourthroute").split("---") {
            t.api.put(yaml(doc));
        }
        let want = json!({"ingress": [
            {"hostname": "fourth.example.com", "service": "http://localhost:8080"},
            {"hostname": "internal.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("edge, internal and fourth's document", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        told_authentication_failed(&t.api, "thirdroute").await;
        stays_written(&t, &cloudflare).await;
        assert_eq!(
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
            Some(want)
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Asserts that none of tenant-a's routes `routes` says its tunnel's document was not written.
fn none_told_unwritten(api: &ApiServer, routes: &[&str]) {
    const WRITTEN: &str = "cf.k8s.lex.la/TunnelDocumentWritten";
    for route in routes {
        assert_eq!(
            route_condition(api, "tenant-a", route, WRITTEN),
            None,
            "{route}"
        );
    }
}

/// Over rounds after the document settled, within the first wait of any token that failed:
/// nothing written again, and the API not asked at all.
async fn stays_written(t: &Tenant, cloudflare: &CloudflareApi) {
    t.rounds(2, Duration::from_millis(300)).await;
    let (writes, asked) = (cloudflare.writes(), cloudflare.requests());
    t.rounds(3, Duration::from_millis(300)).await;
    assert_eq!(cloudflare.writes(), writes, "written once");
    assert_eq!(
        cloudflare.requests(),
        asked,
        "nothing asked within the wait"
    );
}

/// Waits until tenant-a's route `route`, whose hostname no document written carries, waits to
/// be accepted saying the API refused the credentials.
async fn told_authentication_failed(api: &ApiServer, route: &str) {
    eventually("the route told its tunnel's document failed", || {
        route_condition(api, "tenant-a", route, "Accepted").filter(|c| {
            c["status"] == "Unknown"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Authentication error"))
        })
    })
    .await;
}

/// Three Gateways on one tunnel, one of them (`third`) on the secret from before the tunnel's
/// token was rotated: `edge` names API token `cf-token-a`, `internal` and `third` `cf-token-b`,
/// both accepted (or only `cf-token-b`). `internal` and `third`, on the two secrets, share the
/// token they both name, so the tunnel gets one document listing the three Gateways'
/// hostnames, written once, not one from each token replacing the other's.
#[tokio::test]
async fn a_rotated_tunnel_whose_gateways_name_two_tokens_gets_one_document() {
    three_gateways_on_a_rotated_tunnel(&["cf-token-a", "cf-token-b"]).await;
    three_gateways_on_a_rotated_tunnel(&["cf-token-b"]).await;
}

/// [`a_rotated_tunnel_whose_gateways_name_two_tokens_gets_one_document`], the API accepting
/// `accepted`.
async fn three_gateways_on_a_rotated_tunnel(accepted: &[&str]) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        for token in accepted {
            cloudflare.also_allow("acct", token);
        }
        let edge = proxy_pod("s3cr3t").await;
        let t = rotated_tunnel_of_three(&edge, &cloudflare, "internal-cf").await;
        let want = json!({"ingress": [
            {"hostname": "internal.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"hostname": "third.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("one document with the three Gateways' hostnames", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        stays_written(&t, &cloudflare).await;
        assert_eq!(
            cloudflare.config("acct", TUNNEL_ID).map(|(_, d)| d),
            Some(want)
        );
        none_told_unwritten(&t.api, &["shop", "intranet", "thirdroute"]);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Every API token of a rotated tunnel refused: each route waits to be accepted, saying its
/// tunnel's document could not be written, and while the failed writes wait to be tried again
/// no round calls the API (a token refused is not asked again with another document).
#[tokio::test]
async fn a_rotated_tunnel_whose_every_token_is_refused_waits_to_ask_again() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        let edge = proxy_pod("s3cr3t").await;
        let t = rotated_tunnel_of_three(&edge, &cloudflare, "internal-cf").await;
        // No document was ever written: the routes wait to be accepted, saying why.
        for route in ["shop", "intranet", "thirdroute"] {
            told_authentication_failed(&t.api, route).await;
        }
        t.rounds(1, Duration::from_millis(300)).await;
        let asked = cloudflare.requests();
        t.rounds(4, Duration::from_millis(300)).await;
        assert_eq!(cloudflare.requests(), asked, "asked within the first wait");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// [`internal_joins_edge`] with `internal`'s API token `cf-token-b`, and `third` joining on the
/// secret from before the tunnel's token was rotated, naming API credentials `credentials`.
async fn rotated_tunnel_of_three(
    edge: &Server,
    cloudflare: &CloudflareApi,
    credentials: &str,
) -> Tenant {
    let t = internal_joins_edge(edge, &edge_token(), "internal-cf", &cloudflare.base()).await;
    let rotated = Token::new("acct", b"rotated secret".to_vec(), uuid_of(TUNNEL_ID)).encode();
    t.api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: internal-cf, namespace: tenant-a}\nstringData: {api-token: cf-token-b}\n"));
    for doc in peer_gateway("third", &rotated, credentials, "thirdroute").split("---") {
        t.api.put(yaml(doc));
    }
    t
}

/// Tenant-a's Gateway `name` (hostname `<name>.example.com`) on a plane of its own, with
/// connector token `token`, API credentials Secret `credentials`, the config-API token of
/// Secret `internal-api`, and route `route` on it: the objects, `---` between them.
fn peer_gateway(name: &str, token: &str, credentials: &str, route: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-tunnel-token, namespace: tenant-a}}
stringData: {{tunnel-token: "{token}"}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: {name}-config, namespace: tenant-a}}
spec:
  tunnelTokenSecretRef: {{name: {name}-tunnel-token}}
  authTokenSecretRef: {{name: internal-api, key: token}}
  cloudflareCredentialsSecretRef: {{name: {credentials}}}
  replicas: 1
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: tenant-a}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: {name}-config}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: {name}.example.com}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {route}, namespace: tenant-a}}
spec:
  parentRefs: [{{name: {name}}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#
    )
}

/// Gateway `internal` (hostname `internal.example.com`) joins tenant-a's Gateway `edge` on
/// its tunnel with connector token `token` and API credentials Secret `credentials`: the
/// tunnel's one document lists both Gateways' hostnames, and is not written again.
async fn second_gateway_on_the_tunnel(token: &str, credentials: &str) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-a");
        let edge = proxy_pod("s3cr3t").await;
        let t = internal_joins_edge(&edge, token, credentials, &cloudflare.base()).await;
        let want = json!({"ingress": [
            {"hostname": "internal.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("one document with both Gateways' hostnames", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;
        let writes = cloudflare.writes();
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(cloudflare.writes(), writes, "written once");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The Gateways on a tunnel serve the union of its routes and the edge spreads its requests
/// over all their pods: when one Gateway's pods keep failing to take the config, the routes
/// of the other Gateway on the tunnel say so too, naming the one that failed.
#[tokio::test]
async fn a_push_failure_on_a_shared_tunnel_is_reported_on_every_gateways_routes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, _edge, _held) = internal_failing_beside_edge().await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// [`internal_joins_edge`] on tenant-a's tunnel, `internal`'s only pod ready but refusing
/// every push (its config port closed while the socket returned is held), until `shop`, on
/// `edge`, says so: the controller, `edge`'s pod, and the socket.
async fn internal_failing_beside_edge() -> (Tenant, Server, (CloudflareApi, tokio::net::TcpSocket))
{
    let edge = proxy_pod("s3cr3t").await;
    let same = edge_token();
    let (closed, held) = closed_port();
    let cloudflare = CloudflareApi::start().await;
    let t = internal_joins_edge(&edge, &same, "edge-cf", &cloudflare.base()).await;
    shop_serves(&edge, 200).await;
    assert!(route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED).is_none());
    t.api.put(config_slice(
        "tenant-a",
        "cf-proxy-internal-config",
        closed,
        true,
    ));
    push_failure_names(&t.api, ("tenant-a", "shop"), "tenant-a/internal").await;
    (t, edge, (cloudflare, held))
}

/// The plane of a Gateway reported failing on the routes of the other Gateway on its tunnel,
/// whose pods then all go (none listed: scaled to zero, or replaced before a successor is
/// listed), runs no connector: the edge hands it none of the tunnel's requests, so the other
/// Gateway's routes are told its failure no more.
#[tokio::test]
async fn a_plane_with_no_pod_listed_fails_no_other_gateways_routes_on_its_tunnel() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, _edge, _held) = internal_failing_beside_edge().await;
        t.api.put(yaml(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: cf-proxy-internal-config-x1, namespace: tenant-a, labels: {kubernetes.io/service-name: cf-proxy-internal-config, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}\naddressType: IPv4\nports: [{name: config, port: 8081}]\nendpoints: []\n",
        ));
        eventually("shop told internal's failure no more", || {
            route_condition(&t.api, "tenant-a", "shop", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A broken Gateway's own routes join the other planes of its tunnel once: a route that a
/// healthy Gateway on the tunnel has too is served on that Gateway's hostname as it is now and
/// on the broken one's as it last was, and what the planes are given stays the same from round
/// to round (the broken plane's last config being the tunnel's config of the round before).
#[tokio::test]
async fn a_broken_gateways_routes_join_its_tunnels_planes_once() {
    use cftunnel_controller::push::served_document;
    tokio::time::timeout(Duration::from_secs(60), async {
        let edge = proxy_pod("s3cr3t").await;
        let internal = proxy_pod("i2cr3t").await;
        let same = edge_token();
        let cloudflare = CloudflareApi::start().await;
        let t = internal_joins_edge(&edge, &same, "edge-cf", &cloudflare.base()).await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-internal-config",
            internal.admin_addr().port(),
            true,
        ));
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: both, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}, {name: internal}]\n  rules: [{matches: [{path: {value: /both}}], backendRefs: [{name: web, port: 80}]}]\n",
        ));
        host_serves(&internal, "shop.example.com", 200).await;
        t.api.put(yaml(
            &gateway(true).replace("name: edge-config", "name: gone"),
        ));
        eventually("the Gateway refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        let rules = || async {
            served_document(internal.admin_addr(), "i2cr3t", Duration::from_secs(5))
                .await
                .expect("the document served")
                .rules
        };
        // The route both Gateways have: on the healthy one's hostname as it has it, and on
        // the broken one's as it last served it.
        let both = |rules: &[cftunnel_config::Rule]| {
            let mut both: Vec<Vec<String>> = rules
                .iter()
                .filter(|r| r.name.as_deref() == Some("tenant-a/both/0"))
                .map(|r| r.hostnames.clone())
                .collect();
            both.sort();
            both
        };
        let joined = [
            vec!["internal.example.com".to_owned()],
            vec!["shop.example.com".to_owned()],
        ];
        let mut before = rules().await;
        for _ in 0..50 {
            if both(&before) == joined {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            before = rules().await;
        }
        assert_eq!(both(&before), joined);
        t.rounds(4, Duration::from_millis(300)).await;
        assert_eq!(rules().await, before, "the same from round to round");
        host_serves(&internal, "shop.example.com", 200).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The tunnel's ingress document edited behind the controller's back (in the dashboard, with
/// the account's token: `shop.example.com` dropped, `other.example.com` added) is written back
/// within seconds by its read back (every 300 ms here), though nothing in the cluster changes
/// and no resync is due (it is ten minutes); and nothing in the cluster is written meanwhile.
#[tokio::test]
async fn a_tunnel_document_edited_in_the_dashboard_is_written_back() {
    use cftunnel_controller::cloudflare::{TunnelApi, TunnelTarget};
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-a");
        let edge = proxy_pod("s3cr3t").await;
        let base = cloudflare.base();
        let t = Tenant::start_tuned(
            "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
            },
            ApiServer::client,
            |options| {
                options.cloudflare_api_base = base;
                options.resync = Duration::from_secs(600);
                options.tunnel_read_back = Duration::from_millis(300);
            },
        )
        .await;
        let want = json!({"ingress": [
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        let holds = |document: &Value| {
            cloudflare
                .config("acct", TUNNEL_ID)
                .map(|(_, d)| d)
                .as_ref()
                == Some(document)
        };
        eventually("the controller's document written", || {
            holds(&want).then_some(())
        })
        .await;
        shop_serves(&edge, 200).await;
        settled(&t.api).await;
        let rv = t.api.resource_version();

        let dashboard = TunnelApi::new(&cloudflare.base(), Duration::from_secs(5)).expect("client");
        let edited = json!({"ingress": [
            {"hostname": "other.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        let tunnel = TunnelTarget {
            account: "acct".to_owned(),
            tunnel: uuid_of(TUNNEL_ID),
            api_token: "cf-token-a".to_owned(),
            verify_secret: None,
        };
        dashboard
            .put_configuration(&tunnel, &edited)
            .await
            .expect("edited in the dashboard");
        assert!(holds(&edited));
        within(10, "the controller's document written back", || {
            holds(&want).then_some(())
        })
        .await;
        // Several read-back periods: it stays, and is not written again.
        let writes = cloudflare.writes();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(holds(&want));
        assert_eq!(cloudflare.writes(), writes, "written back once");
        assert_eq!(
            t.api.writes_since(rv),
            Vec::<String>::new(),
            "nothing written in the cluster"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Starts tenant-a's Gateway `edge` (its pod `edge`) and Gateway `internal` on the tunnel of
/// connector token `token`, with API credentials Secret `credentials`, writing through the
/// Cloudflare API at `cloudflare`.
async fn internal_joins_edge(
    edge: &Server,
    token: &str,
    credentials: &str,
    cloudflare: &str,
) -> Tenant {
    let cloudflare = cloudflare.to_owned();
    Tenant::start_tuned(
            "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: internal-api, namespace: tenant-a}\nstringData: {token: i2cr3t}\n"));
                for doc in peer_gateway("internal", token, credentials, "intranet")
                .split("---")
                {
                    api.put(yaml(doc));
                }
            },
            ApiServer::client,
            |options| options.cloudflare_api_base = cloudflare,
        )
        .await
}

/// A plane whose new render fails to apply is reported as it runs, not as the render would
/// make it: with its connector token moved to another tunnel and the apply failing, its pods
/// are still on the old tunnel, and its Gateway's address stays there until the apply lands.
#[tokio::test]
async fn a_plane_whose_apply_fails_is_reported_on_the_tunnel_its_pods_are_on() {
    tunnel_moves_while("replicas: 1", "Deployment", TUNNEL_ID).await;
}

/// An apply that fails after it has written the Deployment (its autoscaler refused) has moved
/// the pods to the new tunnel already: the address follows them at once.
#[tokio::test]
async fn a_plane_whose_apply_fails_after_its_deployment_is_reported_on_the_new_tunnel() {
    tunnel_moves_while(
        "autoscaling: {minReplicas: 1, maxReplicas: 3}",
        "HorizontalPodAutoscaler",
        OTHER_TUNNEL_ID,
    )
    .await;
}

/// Moves tenant-a's connector token to another tunnel while PATCHes of `failing` kind fail:
/// its Gateway's address is on tunnel `meanwhile` then, and on the new tunnel once the failure
/// is gone.
async fn tunnel_moves_while(spec: &str, failing: &'static str, meanwhile: &str) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start(spec).await;
        let address = || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| g.pointer("/status/addresses/0/value").cloned())
        };
        let on = |id: &str| json!(format!("{id}.cfargotunnel.com"));
        eventually("the plane applied", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        eventually("the address", || address().filter(|a| *a == on(TUNNEL_ID))).await;

        let failing = t.api.fail(500, move |c| {
            c.method == "PATCH"
                && c.kind == failing
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
        });
        let moved = Token::new("acct", b"moved secret".to_vec(), uuid_of(OTHER_TUNNEL_ID)).encode();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: edge-tunnel-token, namespace: tenant-a}}\nstringData: {{tunnel-token: \"{moved}\"}}\n"
        )));
        t.apply_failure_reported().await;
        t.rounds(2, Duration::from_millis(300)).await;
        assert_eq!(address(), Some(on(meanwhile)), "where the pods are");

        drop(failing);
        eventually("the address once applied", || {
            address().filter(|a| *a == on(OTHER_TUNNEL_ID))
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The edge spreads a tunnel's requests over every connector on it, so the planes on one
/// tunnel serve the union of their routes. A plane whose connector token moves to another
/// tunnel, while the move fails to apply, still has its pods on the old tunnel: the planes of
/// the new one do not take its routes until the move lands, and then they do.
#[tokio::test]
async fn a_plane_joins_another_tunnels_routes_once_its_move_is_applied() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let third = proxy_pod("c3cr3t").await;
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(yaml(
                "apiVersion: v1\nkind: Secret\nmetadata: {name: third-api, namespace: tenant-c}\nstringData: {token: c3cr3t}\n",
            ));
            api.put(yaml(
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: third-config, namespace: tenant-c}\nspec: {tunnelTokenSecretRef: {name: third-tunnel-token}, authTokenSecretRef: {name: third-api}}\n",
            ));
            api.put(config_slice(
                "tenant-c",
                "cf-proxy-third-config",
                third.admin_addr().port(),
                true,
            ));
        })
        .await;
        host_serves(&third, "blog.example.com", 200).await;
        shop_serves(&third, 404).await;

        let failing = t.api.fail(500, |c| {
            c.method == "PATCH"
                && c.kind == "Deployment"
                && c.body.pointer("/metadata/namespace") == Some(&json!("tenant-a"))
        });
        // tenant-a's token now opens tenant-c's tunnel.
        let moved = Token::new("acct-c", b"third".to_vec(), uuid_of(THIRD_TUNNEL_ID)).encode();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: edge-tunnel-token, namespace: tenant-a}}\nstringData: {{tunnel-token: \"{moved}\"}}\n"
        )));
        t.apply_failure_reported().await;
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(
            get_via(third.data_addr(), "shop.example.com").await,
            404,
            "tenant-a's pods are not on tenant-c's tunnel yet"
        );

        drop(failing);
        shop_serves(&third, 200).await;
        host_serves(&third, "blog.example.com", 200).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A generated token Secret that cannot be created (a quota, an admission policy) fails the
/// apply, which waits before it is tried again like any failed apply: the token drawn for the
/// Secret is kept from round to round, so the render, and the wait held under it, stay the
/// same. The Gateway says why.
#[tokio::test]
async fn a_token_secret_that_cannot_be_created_waits_before_it_is_tried_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    tokio::time::timeout(Duration::from_secs(60), async {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&attempts);
        let mut refused = None;
        let t = Tenant::start_with("replicas: 1", |api| {
            // Without authTokenSecretRef: the controller generates the token Secret.
            api.put(yaml(
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}}\n",
            ));
            refused = Some(api.forbid(move |c| {
                let ours = c.method == "POST"
                    && c.kind == "Secret"
                    && c.body.pointer("/metadata/name") == Some(&json!("cf-proxy-edge-auth"));
                if ours {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                ours
            }));
        })
        .await;
        let refused = refused.expect("Secret creation refused");
        eventually("an apply", || {
            (attempts.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        // Rounds every 100 ms (and at each change) meanwhile: none creates it again.
        t.rounds(3, Duration::from_millis(500)).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "tried once");
        t.apply_failure_reported().await;

        // Once it can be, the Secret is created; deleted (to rotate the token), it is created
        // again with another token.
        drop(refused);
        let token = || {
            t.api
                .get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth")
                .and_then(|s| s.get("data").or_else(|| s.get("stringData")).cloned())
        };
        let first = eventually("the Secret created", token).await;
        t.rounds(2, Duration::from_millis(300)).await;
        assert!(t.api.delete("v1", "Secret", "tenant-a", "cf-proxy-edge-auth"));
        let second = eventually("the Secret created again", token).await;
        assert_ne!(first, second, "a new token");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Configs that another controller's GatewayClasses or Gateways name are that controller's to
/// judge: two installations writing their own `InUse` or `Valid` would overwrite each other at
/// every round. A GatewayConfig no Gateway names is still reported as not in use.
#[tokio::test]
async fn configs_named_by_another_controller_are_left_to_it() {
    tokio::time::timeout(Duration::from_secs(60), async {
        const CF: &str = "cf.k8s.lex.la/v1alpha1";
        let t = Tenant::start_with("replicas: 1", |api| {
            for object in [
                "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: elsewhere}\nspec:\n  controllerName: example.com/another-controller\n  parametersRef: {group: cf.k8s.lex.la, kind: GatewayClassConfig, name: their-params}\n",
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayClassConfig\nmetadata: {name: their-params}\nspec: {tunnelTokenSecretRef: {name: nowhere, namespace: their-system}}\n",
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: theirs, namespace: tenant-a}\nspec:\n  gatewayClassName: elsewhere\n  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: their-config}}\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n",
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: their-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}}\n",
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: spare-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}}\n",
            ] {
                api.put(yaml(object));
            }
        })
        .await;
        let in_use = |name: &str| {
            t.api
                .get(CF, "GatewayConfig", "tenant-a", name)
                .and_then(|c| condition(&c["status"]["conditions"], "InUse").cloned())
        };
        let spare = eventually("spare-config's InUse", || in_use("spare-config")).await;
        assert_eq!(spare["reason"], "NotReferenced");
        eventually("edge-config's InUse", || {
            in_use("edge-config").filter(|c| c["status"] == "True")
        })
        .await;
        // Rounds come with every change; none writes the other controller's configs.
        t.rounds(3, Duration::from_millis(300)).await;
        assert_eq!(in_use("their-config"), None);
        let params = t
            .api
            .get(CF, "GatewayClassConfig", "", "their-params")
            .expect("their-params");
        assert_eq!(params.pointer("/status/conditions"), None, "{params}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Autoscaling switched on for a running plane: the Deployment keeps its replicas until the
/// autoscaler writes the count (server-side apply would otherwise drop the field and the
/// Deployment would fall to the default of one replica), later applies leave the
/// autoscaler's count alone, and switching autoscaling off gives the count back to the
/// GatewayConfig.
#[tokio::test]
async fn switching_autoscaling_on_keeps_the_running_replicas() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Api, Patch, PatchParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 3").await;
        let autoscaler = || {
            t.api.get(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                "tenant-a",
                "cf-proxy-edge",
            )
        };
        let held_by = |manager: &str| (Some(json!(3)), vec![manager.to_owned()]);
        t.replicas_become(3).await;
        assert_eq!(t.replicas(), held_by(runtime::FIELD_MANAGER));

        t.configure("autoscaling: {minReplicas: 2, maxReplicas: 6}");
        // The autoscaler is applied after the Deployment.
        eventually("the autoscaler", autoscaler).await;
        assert_eq!(
            t.replicas(),
            held_by(runtime::REPLICAS_HANDOVER_MANAGER),
            "the running count stays, held by the hand-over manager"
        );
        // A new rendering applied again leaves the count.
        t.configure(
            "autoscaling: {minReplicas: 2, maxReplicas: 6}, resources: {limits: {memory: 128Mi}}",
        );
        t.applied_with_memory("128Mi").await;
        assert_eq!(t.replicas(), held_by(runtime::REPLICAS_HANDOVER_MANAGER));

        // The autoscaler scales up through the `scale` subresource, as the
        // HorizontalPodAutoscaler controller does, and takes the field; the next apply leaves
        // its count alone.
        let scaled = (Some(json!(5)), vec!["kube-controller-manager".to_owned()]);
        let deployments: Api<Deployment> = Api::namespaced(t.api.user_client(), "tenant-a");
        deployments
            .patch_scale(
                "cf-proxy-edge",
                &PatchParams {
                    field_manager: Some("kube-controller-manager".to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .expect("scaled");
        assert_eq!(t.replicas(), scaled);
        let scale_entry = t
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .and_then(|d| {
                d.pointer("/metadata/managedFields")?
                    .as_array()?
                    .iter()
                    .find(|m| m["manager"] == "kube-controller-manager")
                    .cloned()
            });
        assert_eq!(
            scale_entry.as_ref().map(|m| &m["subresource"]),
            Some(&json!("scale"))
        );
        t.configure(
            "autoscaling: {minReplicas: 2, maxReplicas: 6}, resources: {limits: {memory: 256Mi}}",
        );
        t.applied_with_memory("256Mi").await;
        assert_eq!(t.replicas(), scaled);

        // Off again: the GatewayConfig's count, and no autoscaler.
        t.configure("replicas: 4");
        t.replicas_become(4).await;
        eventually("the autoscaler removed", || {
            autoscaler().is_none().then_some(())
        })
        .await;
        assert_eq!(t.replicas().1, [runtime::FIELD_MANAGER]);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A new plane with autoscaling starts at the autoscaler's floor rather than at one replica,
/// and hands that count over once rendered again; a plane scaled to zero is not held at zero
/// (an autoscaler leaves a Deployment at zero alone) but falls to the default of one.
#[tokio::test]
async fn an_autoscaled_plane_starts_at_its_floor() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("autoscaling: {minReplicas: 3, maxReplicas: 6}").await;
        t.replicas_become(3).await;
        assert_eq!(t.replicas().1, [runtime::FIELD_MANAGER]);
        t.configure(
            "autoscaling: {minReplicas: 3, maxReplicas: 6}, resources: {limits: {memory: 128Mi}}",
        );
        t.applied_with_memory("128Mi").await;
        assert_eq!(
            t.replicas(),
            (
                Some(json!(3)),
                vec![runtime::REPLICAS_HANDOVER_MANAGER.to_owned()]
            )
        );

        t.configure("replicas: 0");
        t.replicas_become(0).await;
        t.configure("autoscaling: {minReplicas: 2, maxReplicas: 6}");
        // One replica, for the autoscaler to raise.
        t.replicas_become(1).await;
        assert_eq!(t.replicas().1, Vec::<String>::new());
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Someone strips the controller's label from a plane's Deployment and NetworkPolicy: they
/// leave the controller's label-selected watches (the API server reports them deleted), so
/// the next round applies them again, label included, rather than five minutes later.
#[tokio::test]
async fn a_plane_object_that_loses_its_label_is_applied_again() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Api, Patch, PatchParams};
    const LABEL: &str = "app.kubernetes.io/managed-by";
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 2").await;
        let label = |api_version: &str, kind: &str| {
            t.api
                .get(api_version, kind, "tenant-a", "cf-proxy-edge")
                .and_then(|o| {
                    o.pointer(&format!("/metadata/labels/{}", LABEL.replace('/', "~1")))
                        .cloned()
                })
        };
        eventually("the Deployment", || label("apps/v1", "Deployment")).await;
        eventually("the NetworkPolicy", || {
            label("networking.k8s.io/v1", "NetworkPolicy")
        })
        .await;
        let strip = json!({"metadata": {"labels": {LABEL: null}}});
        let params = PatchParams {
            field_manager: Some("kubectl-edit".to_owned()),
            ..PatchParams::default()
        };
        let deployments: Api<Deployment> = Api::namespaced(t.api.user_client(), "tenant-a");
        let stripped = deployments
            .patch("cf-proxy-edge", &params, &Patch::Merge(&strip))
            .await
            .expect("label removed");
        assert!(!stripped
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(LABEL));
        eventually("the Deployment's label back", || {
            label("apps/v1", "Deployment")
        })
        .await;
        let policies: Api<NetworkPolicy> = Api::namespaced(t.api.user_client(), "tenant-a");
        policies
            .patch("cf-proxy-edge", &params, &Patch::Merge(&strip))
            .await
            .expect("label removed");
        eventually("the NetworkPolicy's label back", || {
            label("networking.k8s.io/v1", "NetworkPolicy")
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The planes' NetworkPolicy switched off (`--plane-network-policy=false`, a restart): the
/// controller removes the one it rendered, writes no NetworkPolicy at all (the API server
/// refuses it any, as the chart's role then does) while the rest of the plane is still applied,
/// and leaves alone a policy of that name someone else wrote. Switched on again, it renders
/// the policy anew.
#[tokio::test]
async fn the_planes_network_policy_goes_when_switched_off_and_comes_back_when_on() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut t = Tenant::start("replicas: 1").await;
        let policy = |api: &ApiServer| {
            api.get("networking.k8s.io/v1", "NetworkPolicy", "tenant-a", "cf-proxy-edge")
        };
        let owner = |p: &Value| p.pointer("/metadata/ownerReferences/0/kind").cloned();
        let rendered = eventually("the NetworkPolicy", || policy(&t.api)).await;
        assert_eq!(owner(&rendered), Some(json!("Gateway")));

        let no_writes = t.api.forbid(|call| {
            call.kind == "NetworkPolicy" && matches!(call.method, "POST" | "PUT" | "PATCH")
        });
        t.restart(|options| options.render.network_policy = false)
            .await;
        eventually("the NetworkPolicy removed", || {
            policy(&t.api).is_none().then_some(())
        })
        .await;
        // The rest of the plane is still applied: a new spec reaches the Deployment.
        t.configure("replicas: 2");
        t.replicas_become(2).await;
        assert!(policy(&t.api).is_none(), "not rendered again");

        // A policy of the operator's own under that name is not the controller's to remove.
        let own = yaml(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: cf-proxy-edge, namespace: tenant-a}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n",
        );
        t.api.put(own);
        t.configure("replicas: 3");
        t.replicas_become(3).await;
        let kept = policy(&t.api).expect("the operator's policy stays");
        assert_eq!(owner(&kept), None);

        t.api
            .delete("networking.k8s.io/v1", "NetworkPolicy", "tenant-a", "cf-proxy-edge");
        drop(no_writes);
        t.restart(|_| {}).await;
        let again = eventually("the NetworkPolicy rendered again", || {
            policy(&t.api).filter(|p| owner(p).is_some())
        })
        .await;
        assert_eq!(again.get("spec"), rendered.get("spec"));
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Deployment of someone else's holds the plane's name, so the plane stops short of it with
/// its Service and NetworkPolicy applied. Removing the Gateway's parametersRef removes those
/// two as well, though no Deployment of the plane ever existed, and leaves the other
/// Deployment alone.
#[tokio::test]
async fn objects_applied_before_a_failed_deployment_go_when_the_ref_is_removed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let foreign = yaml(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: cf-proxy-edge, namespace: tenant-a}\nspec:\n  selector: {matchLabels: {app: other}}\n  template:\n    metadata: {labels: {app: other}}\n    spec: {containers: [{name: other, image: other:1}]}\n",
        );
        let t = Tenant::start_with("replicas: 2", |api| {
            api.put(foreign);
        })
        .await;
        let service = || t.api.get("v1", "Service", "tenant-a", "cf-proxy-edge-config");
        let policy = || {
            t.api
                .get("networking.k8s.io/v1", "NetworkPolicy", "tenant-a", "cf-proxy-edge")
        };
        eventually("the Service", service).await;
        eventually("the NetworkPolicy", policy).await;
        let deployment = || t.api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge");
        assert_eq!(
            deployment().and_then(|d| d.pointer("/spec/template/spec/containers/0/image").cloned()),
            Some(json!("other:1")),
            "not taken over"
        );

        t.api.put(yaml(&gateway(false)));
        eventually("the Service and NetworkPolicy removed", || {
            (service().is_none() && policy().is_none()).then_some(())
        })
        .await;
        assert!(deployment().is_some(), "the other Deployment stays");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The generated config-API token Secret follows the Gateway's infrastructure labels and
/// annotations as the other plane objects do, and keeps its token: one the Gateway drops goes
/// from the Secret, while one someone else set on the Secret stays.
#[tokio::test]
async fn the_generated_token_secret_follows_the_infrastructure_labels() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let labelled = |labels: &str, annotations: &str| {
            yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: tenant-a}}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}, labels: {{{labels}}}, annotations: {{{annotations}}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}]\n"
            ))
        };
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(yaml("apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 1}\n"));
            api.put(labelled("team: a, tier: edge", "owner: a"));
        })
        .await;
        let live = || t.api.get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth");
        let secret = |team: &'static str| {
            move || {
                live()
                    .filter(|s| {
                        s.pointer("/metadata/labels/team") == Some(&json!(team))
                            && s.pointer("/metadata/labels/tier") == Some(&json!("edge"))
                            && s.pointer("/metadata/annotations/owner") == Some(&json!(team))
                    })
                    .and_then(|s| s.pointer("/data").cloned())
            }
        };
        let token = eventually("the Secret labelled a", secret("a")).await;
        t.api.put(labelled("team: b, tier: edge", "owner: b"));
        let relabelled = eventually("the Secret labelled b", secret("b")).await;
        assert_eq!(relabelled, token, "the token is never rewritten");

        // Someone else labels the Secret.
        let mut audited = live().expect("the Secret");
        audited["metadata"]["labels"]["audit"] = json!("kept");
        t.api.put(audited);
        // The Gateway drops a label it had from the start and its annotation, and changes
        // nothing else.
        t.api.put(labelled("team: b", ""));
        let dropped = eventually("the dropped label gone from the Secret", || {
            live().filter(|s| {
                s.pointer("/metadata/labels/tier").is_none()
                    && s.pointer("/metadata/annotations/owner").is_none()
            })
        })
        .await;
        assert_eq!(dropped.pointer("/metadata/labels/team"), Some(&json!("b")));
        assert_eq!(
            dropped.pointer("/metadata/labels/audit"),
            Some(&json!("kept")),
            "someone else's label stays"
        );
        assert_eq!(dropped.pointer("/data"), Some(&token), "the token stays");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// tenant-a's Gateway labelled `labels` and annotated `annotations` through its
/// infrastructure, its plane's config-API token generated.
fn labelled_gateway(labels: &str, annotations: &str) -> Value {
    yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: tenant-a}}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}, labels: {{{labels}}}, annotations: {{{annotations}}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}]\n"
    ))
}

/// tenant-a's Gateway labelled `team: a, tier: edge` and annotated `owner: a`, and its token
/// Secret created with those in it by a plain create, as earlier versions and the Go
/// controller create it; returned once the controller has applied the Secret's metadata, with
/// the Secret's data.
async fn secret_created_with_labels() -> (Tenant, Value) {
    let t = Tenant::start_with("replicas: 1", |api| {
        api.put(yaml("apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 1}\n"));
        let gateway = api.put(labelled_gateway("team: a, tier: edge", "owner: a"));
        let uid = gateway["metadata"]["uid"].as_str().expect("a uid").to_owned();
        api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cf-proxy-edge-auth\n  namespace: tenant-a\n  labels: {{team: a, tier: edge}}\n  annotations: {{owner: a}}\n  ownerReferences: [{{apiVersion: gateway.networking.k8s.io/v1, kind: Gateway, name: edge, uid: {uid}, controller: true, blockOwnerDeletion: true}}]\nstringData: {{token: old-token}}\n"
        )));
    })
    .await;
    let applied = eventually("the Secret's metadata applied", || {
        token_secret(&t.api).filter(|s| {
            s.pointer("/metadata/managedFields")
                .and_then(Value::as_array)
                .is_some_and(|entries| {
                    entries.iter().any(|e| {
                        e["manager"] == runtime::FIELD_MANAGER && e["operation"] == "Apply"
                    })
                })
        })
    })
    .await;
    let data = applied["data"].clone();
    assert_eq!(data, json!({"token": "b2xkLXRva2Vu"}), "its token kept");
    (t, data)
}

/// tenant-a's generated token Secret.
fn token_secret(api: &ApiServer) -> Option<Value> {
    api.get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth")
}

/// Merge-patches tenant-a's token Secret as another writer, `auditor`.
async fn audit_token_secret(api: &ApiServer, patch: Value) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    let secrets: Api<Secret> = Api::namespaced(api.user_client(), "tenant-a");
    let auditor = PatchParams {
        field_manager: Some("auditor".to_owned()),
        ..PatchParams::default()
    };
    secrets
        .patch("cf-proxy-edge-auth", &auditor, &Patch::Merge(&patch))
        .await
        .expect("the auditor's write");
}

/// A token Secret created with the Gateway's labels and annotations in it, not applied: a
/// label the Gateway drops goes from it all the same, while a label someone else added stays,
/// and so does an annotation the Gateway drops that someone else set too.
#[tokio::test]
async fn a_label_dropped_by_the_gateway_leaves_a_token_secret_created_with_it() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, token) = secret_created_with_labels().await;
        // Another writer labels the Secret, and applies the Gateway's annotation too.
        audit_token_secret(&t.api, json!({"metadata": {"labels": {"audit": "kept"}}})).await;
        let secrets: Api<Secret> = Api::namespaced(t.api.user_client(), "tenant-a");
        let annotated = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "cf-proxy-edge-auth", "annotations": {"owner": "a"}},
        });
        secrets
            .patch(
                "cf-proxy-edge-auth",
                &PatchParams::apply("auditor"),
                &Patch::Apply(&annotated),
            )
            .await
            .expect("the auditor's apply");

        // The Gateway drops a label and its annotation, and changes nothing else.
        t.api.put(labelled_gateway("team: a", ""));
        let dropped = within(20, "the dropped label gone from the Secret", || {
            token_secret(&t.api).filter(|s| s.pointer("/metadata/labels/tier").is_none())
        })
        .await;
        assert_eq!(dropped.pointer("/metadata/labels/team"), Some(&json!("a")));
        assert_eq!(
            dropped.pointer("/metadata/labels/audit"),
            Some(&json!("kept")),
            "someone else's label stays"
        );
        assert_eq!(
            dropped.pointer("/metadata/annotations/owner"),
            Some(&json!("a")),
            "an annotation someone else set too stays"
        );
        assert_eq!(dropped["data"], token, "the token stays");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Someone writes the token Secret while the controller removes a label the Gateway dropped
/// from it: the removal, made for the Secret as read before, is refused, and the next round
/// removes the label from the Secret as it is now.
#[tokio::test]
async fn a_label_removal_another_write_overtook_is_made_at_the_next_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, _) = secret_created_with_labels().await;
        let removal = t.api.hold(|c| {
            c.method == "PATCH"
                && c.kind == "Secret"
                && c.body.pointer("/metadata/labels/tier") == Some(&Value::Null)
        });
        t.api.put(labelled_gateway("team: a", "owner: a"));
        removal.arrived(1).await;
        audit_token_secret(&t.api, json!({"metadata": {"labels": {"audit": "kept"}}})).await;
        removal.release();
        assert_eq!(removal.answered(1).await, vec![409]);
        let dropped = within(4, "the dropped label gone from the Secret", || {
            token_secret(&t.api).filter(|s| s.pointer("/metadata/labels/tier").is_none())
        })
        .await;
        assert_eq!(dropped.pointer("/metadata/labels/team"), Some(&json!("a")));
        assert_eq!(
            dropped.pointer("/metadata/labels/audit"),
            Some(&json!("kept"))
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The Gateway's parametersRef stops resolving after a healthy render: the plane stays, and a
/// pod that starts meanwhile (a reschedule, an eviction) still gets the config the plane
/// last served, rather than waiting unready for a configuration that cannot come.
#[tokio::test]
async fn a_plane_whose_config_stops_resolving_keeps_serving_its_last_config() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let pod = || proxy_pod("s3cr3t");
        let slice = |port: u16| config_slice("tenant-a", "cf-proxy-edge-config", port, false);
        let served = |data: SocketAddr| async move {
            let by = Instant::now() + Duration::from_secs(20);
            while get_via(data, "shop.example.com").await != 200 {
                assert!(Instant::now() < by, "the pod serves the route");
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        let first = pod().await;
        t.api.put(slice(first.admin_addr().port()));
        served(first.data_addr()).await;

        // The ref now names a GatewayConfig that does not exist.
        t.api.put(yaml(
            &gateway(true).replace("name: edge-config", "name: gone"),
        ));
        eventually("the Gateway refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        assert!(
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_some(),
            "the plane stays"
        );
        first.shutdown().await;
        let second = pod().await;
        t.api.put(slice(second.admin_addr().port()));
        served(second.data_addr()).await;
        second.shutdown().await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Gateway alone on its tunnel breaks, and a route of it is deleted afterwards: its pods
/// stop serving that route (it is served nowhere), and serve the rest of their last config,
/// listener isolation included: the hostname of the listener the route was on is not taken
/// by a route of a listener for any host.
#[tokio::test]
async fn a_route_deleted_after_its_gateway_broke_is_no_longer_served_by_its_plane() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (t, edge) = Tenant::with_pod("replicas: 1").await;
        let listeners = |config: &str| {
            yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: tenant-a}}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: {config}}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}, {{name: any, port: 80, protocol: HTTP}}]\n"
            ))
        };
        t.api.put(listeners("edge-config"));
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: checkout, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge, sectionName: http}]\n  rules: [{matches: [{path: {value: /checkout}}], backendRefs: [{name: web, port: 80}]}]\n",
        ));
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: fallback, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge, sectionName: any}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
        ));
        let status = |host: &'static str, path: &'static str| {
            let data = edge.data_addr();
            async move {
                support::request(data, "GET", path, host, None, "")
                    .await
                    .map_or(0, |a| a.status)
            }
        };
        let by = Instant::now() + Duration::from_secs(20);
        while status("shop.example.com", "/checkout").await != 200
            || status("other.example.com", "/cart").await != 200
        {
            assert!(Instant::now() < by, "the routes checkout and fallback are served");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        shop_serves(&edge, 200).await;

        // The ref now names a GatewayConfig that does not exist.
        t.api.put(listeners("gone"));
        eventually("the Gateway refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        t.rounds(3, Duration::from_millis(200)).await;
        shop_serves(&edge, 200).await;

        shop_goes_away(&t, &edge).await;
        t.rounds(3, Duration::from_millis(200)).await;
        shop_serves(&edge, 404).await;
        assert_eq!(status("shop.example.com", "/checkout").await, 200);
        assert_eq!(status("other.example.com", "/cart").await, 200);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A dedicated Gateway whose listeners all turn invalid stops serving: its pods are pushed a
/// config without routes (every request 404) instead of keeping the routes of listeners that
/// are gone, the Gateway says why, and a valid listener brings the routes back.
#[tokio::test]
async fn a_plane_whose_listeners_all_turn_invalid_stops_serving_its_routes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let pod = proxy_pod("s3cr3t").await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            pod.admin_addr().port(),
            false,
        ));
        let answers = |status: u16| {
            let data = pod.data_addr();
            async move {
                let by = Instant::now() + Duration::from_secs(20);
                while get_via(data, "shop.example.com").await != status {
                    assert!(Instant::now() < by, "the pod answers {status}");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        };
        answers(200).await;

        t.api.put(yaml(
            &gateway(true).replace("protocol: HTTP", "protocol: TCP"),
        ));
        answers(404).await;
        let conditions = eventually("the Gateway not accepted", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .map(|g| g["status"]["conditions"].clone())
                .filter(|c| {
                    condition(c, "Accepted").is_some_and(|a| a["reason"] == "ListenersNotValid")
                })
        })
        .await;
        let programmed = condition(&conditions, "Programmed").expect("Programmed");
        assert_eq!(programmed["status"], "False");
        assert!(
            programmed["message"]
                .as_str()
                .is_some_and(|m| m.contains("serves no routes")),
            "{programmed}"
        );
        assert!(
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_some(),
            "the plane stays"
        );

        t.api.put(yaml(&gateway(true)));
        answers(200).await;
        pod.shutdown().await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane no push reaches (no pod listed in its Service's EndpointSlices, or, for the shared
/// pool, no config-API token) fails no push, so its Gateways' `Programmed=False` says why,
/// the log warns and `cftunnel_controller_unreached_planes` counts it, until a push can reach
/// it.
#[tokio::test]
async fn a_plane_no_push_reaches_leaves_its_gateways_unprogrammed_saying_why() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let shared = "apiVersion: v1\nkind: Secret\nmetadata: {name: shared-auth, namespace: cftunnel-system}\nstringData: {token: pool-secret}\n";
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(yaml(shared));
                api.put(class_tunnel_secret(&class_token(b"class secret"), ""));
                api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: public, namespace: tenant-s}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  listeners: [{name: http, port: 80, protocol: HTTP, hostname: www.example.com}]\n"));
            },
            ApiServer::client,
            |options| {
                options.shared = Some(SharedPlane {
                    deployment: None,
                    ..chart_shared_plane(true)
                });
            },
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health_addr = listener.local_addr().expect("address");
        let _health = tokio::spawn(runtime::health::serve(listener, t.health.clone()));
        let unreached = |n: usize| async move {
            let by = Instant::now() + Duration::from_secs(20);
            loop {
                let metrics =
                    support::request(health_addr, "GET", "/metrics", "controller", None, "")
                        .await
                        .map(|a| String::from_utf8_lossy(&a.body).into_owned())
                        .unwrap_or_default();
                if metrics.contains(&format!("cftunnel_controller_unreached_planes {n}\n")) {
                    return;
                }
                assert!(Instant::now() < by, "{n} unreached planes: {metrics}");
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        let programmed = |namespace: &'static str, name: &'static str, says: &'static str| {
            let api = &t.api;
            async move {
                eventually(&format!("{namespace}/{name}: Programmed {says:?}"), || {
                    api.get("gateway.networking.k8s.io/v1", "Gateway", namespace, name)
                        .and_then(|g| {
                            condition(&g["status"]["conditions"], "Programmed").cloned()
                        })
                        .filter(|c| {
                            if says.is_empty() {
                                c["status"] == "True"
                            } else {
                                c["status"] == "False"
                                    && c["reason"] == "Pending"
                                    && c["message"].as_str().is_some_and(|m| m.contains(says))
                            }
                        })
                })
                .await
            }
        };
        programmed(
            "tenant-a",
            "edge",
            "no proxy pod is listed to receive the config: the EndpointSlices of Service \
             tenant-a/cf-proxy-edge-config list none",
        )
        .await;
        programmed(
            "tenant-s",
            "public",
            "the EndpointSlices of Service cftunnel-system/cftunnel-proxy list none",
        )
        .await;
        // Gateway third's plane too (tenant-c): none of its pods is ever listed here.
        unreached(3).await;

        // A pod of each plane is listed: pushes reach them.
        let (edge, pool) = (proxy_pod("s3cr3t").await, proxy_pod("pool-secret").await);
        let slice = |namespace: &str, service: &str, port: u16| {
            config_slice(namespace, service, port, false)
        };
        t.api.put(slice(
            "tenant-a",
            "cf-proxy-edge-config",
            edge.admin_addr().port(),
        ));
        t.api.put(slice(
            "cftunnel-system",
            "cftunnel-proxy",
            pool.admin_addr().port(),
        ));
        // The dedicated plane now waits for a ready replica only; the pool is programmed.
        programmed("tenant-a", "edge", "waiting for a ready proxy replica").await;
        programmed("tenant-s", "public", "").await;
        unreached(1).await;

        // The pool's config-API token turns into one no proxy takes: nothing is pushed to it.
        let mut secret = t
            .api
            .get("v1", "Secret", "cftunnel-system", "shared-auth")
            .expect("the pool's token Secret");
        if let Some(o) = secret.as_object_mut() {
            o.remove("data");
        }
        secret["stringData"] = json!({"token": "p\u{e4}ssword"});
        t.api.put(secret);
        programmed(
            "tenant-s",
            "public",
            "the shared proxy pool's config-API token (key \"token\" of Secret \
             cftunnel-system/shared-auth) is not one a proxy takes",
        )
        .await;
        unreached(2).await;
        // The pool's config-API token goes: nothing can be pushed to it.
        assert!(t.api.delete("v1", "Secret", "cftunnel-system", "shared-auth"));
        programmed(
            "tenant-s",
            "public",
            "the shared proxy pool's config-API token (key \"token\" of Secret \
             cftunnel-system/shared-auth) is missing",
        )
        .await;
        unreached(2).await;
        // The pool's connectors still serve the class tunnel: the shared Gateway keeps its
        // address, which DNS records follow.
        let address = json!([{"type": "Hostname", "value": format!("{SHARED_TUNNEL_ID}.cfargotunnel.com")}]);
        let gateway = t
            .api
            .get("gateway.networking.k8s.io/v1", "Gateway", "tenant-s", "public")
            .expect("the shared Gateway");
        assert_eq!(gateway.pointer("/status/addresses"), Some(&address));

        edge.shutdown().await;
        pool.shutdown().await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The value of metric `name` on the `/metrics` of the health server at `health`.
async fn metric(health: SocketAddr, name: &str) -> Option<i64> {
    let answer = support::request(health, "GET", "/metrics", "controller", None, "").await?;
    String::from_utf8_lossy(&answer.body)
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until metric `name` is `n`.
async fn metric_becomes(health: SocketAddr, name: &str, n: i64) {
    let by = Instant::now() + Duration::from_secs(20);
    while metric(health, name).await != Some(n) {
        assert!(Instant::now() < by, "timed out waiting for {name} {n}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `cftunnel_controller_unreached_planes` counts only planes a Gateway depends on: a shared
/// pool no push reaches is idle, not unreached, while no Gateway is served by it and no plane
/// shares its tunnel; it counts once a dedicated plane is on the class tunnel (the edge hands
/// the pool that plane's requests) or a Gateway is served by it.
#[tokio::test]
async fn an_idle_shared_pool_is_not_counted_as_unreached() {
    const UNREACHED: &str = "cftunnel_controller_unreached_planes";
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_tuned(
            "replicas: 1",
            |_| {},
            ApiServer::client,
            |options| {
                // Neither Secret exists yet: no config-API token, no class tunnel.
                options.shared = Some(SharedPlane {
                    deployment: None,
                    service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
                    auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
                    auth_key: "token".to_owned(),
                    tunnel_secret: Some((
                        ObjectKey::new("cftunnel-system", "class-tunnel"),
                        "tunnel-token".to_owned(),
                    )),
                });
            },
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("address");
        let _health = tokio::spawn(runtime::health::serve(listener, t.health.clone()));
        // A round has had both dedicated planes, no pod of either listed.
        for (namespace, name) in [("tenant-a", "edge"), ("tenant-c", "third")] {
            eventually(&format!("{namespace}/{name} unreached"), || {
                t.api
                    .get("gateway.networking.k8s.io/v1", "Gateway", namespace, name)
                    .and_then(|g| condition(&g["status"]["conditions"], "Programmed").cloned())
                    .filter(|c| {
                        c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("no proxy pod is listed"))
                    })
            })
            .await;
        }
        // Two more rounds: the gauge is one such round's.
        let rounds = metric(health, "cftunnel_controller_rounds_total")
            .await
            .expect("rounds counted");
        metric_becomes(health, "cftunnel_controller_rounds_total", rounds + 2).await;
        assert_eq!(metric(health, UNREACHED).await, Some(2), "the idle pool is not counted");

        // The class tunnel is tenant a's.
        let token = edge_token();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: class-tunnel, namespace: cftunnel-system}}\nstringData: {{tunnel-token: \"{token}\"}}\n"
        )));
        metric_becomes(health, UNREACHED, 3).await;
        // The class tunnel another one: no Gateway is on it. (A Secret merely gone would leave
        // the pool on the tunnel it started with.)
        let token = Token::new(
            "acct",
            b"pool only".to_vec(),
            uuid_of("7c0d2e4f-3a1b-4c5d-9e8f-a0b1c2d3e4f5"),
        )
        .encode();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: class-tunnel, namespace: cftunnel-system}}\nstringData: {{tunnel-token: \"{token}\"}}\n"
        )));
        metric_becomes(health, UNREACHED, 2).await;

        // A Gateway served by the pool.
        t.api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: public, namespace: tenant-s}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  listeners: [{name: http, port: 80, protocol: HTTP, hostname: www.example.com}]\n"));
        metric_becomes(health, UNREACHED, 3).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane's autoscaler deleted by hand is put back by the next round, as its Deployment and
/// NetworkPolicy are, not five minutes later.
#[tokio::test]
async fn a_deleted_autoscaler_is_put_back() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    use kube::api::{Api, DeleteParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("autoscaling: {minReplicas: 2, maxReplicas: 4}").await;
        let autoscaler = || {
            t.api
                .get(
                    "autoscaling/v2",
                    "HorizontalPodAutoscaler",
                    "tenant-a",
                    "cf-proxy-edge",
                )
                .and_then(|a| a.pointer("/metadata/uid").cloned())
        };
        let first = eventually("the autoscaler", autoscaler).await;
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(t.api.user_client(), "tenant-a");
        api.delete("cf-proxy-edge", &DeleteParams::default())
            .await
            .expect("deleted");
        let again = eventually("the autoscaler back", || {
            autoscaler().filter(|uid| *uid != first)
        })
        .await;
        assert_ne!(again, first);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A CustomResourceDefinition of Gateway API's group for `plural`/`kind`, annotated with
/// `bundle_version` (none when `None`).
fn gateway_api_crd(plural: &str, kind: &str, bundle_version: Option<&str>) -> Value {
    let annotations = bundle_version.map_or_else(
        || json!({}),
        |v| json!({"gateway.networking.k8s.io/bundle-version": v, "gateway.networking.k8s.io/channel": "standard"}),
    );
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.gateway.networking.k8s.io"), "annotations": annotations},
        "spec": {
            "group": "gateway.networking.k8s.io",
            "names": {"kind": kind, "plural": plural},
            "scope": if kind == "GatewayClass" { "Cluster" } else { "Namespaced" },
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}],
        },
    })
}

/// The GatewayClass publishes the features we support, sorted by name, and whether the
/// Gateway API CRDs in the cluster are a release we support. The CRDs are watched: one
/// changed to another release turns `SupportedVersion` False with no restart, while the class
/// stays accepted (best effort), and True again once it is back.
#[tokio::test]
async fn the_gateway_class_reports_its_features_and_whether_the_crds_are_supported() {
    use cftunnel_controller::translate::SUPPORTED_FEATURES;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::PartialObjectMeta;
    tokio::time::timeout(Duration::from_secs(60), async {
        let api = ApiServer::builder()
            .rbac(REQUIRED_RBAC)
            .seed(format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: cloudflare-tunnel}}\nspec: {{controllerName: {CONTROLLER}}}\n"
            ))
            .start()
            .await;
        let kinds = [
            ("gatewayclasses", "GatewayClass"),
            ("gateways", "Gateway"),
            ("httproutes", "HTTPRoute"),
            ("grpcroutes", "GRPCRoute"),
            ("referencegrants", "ReferenceGrant"),
        ];
        for (plural, kind) in kinds {
            api.put(gateway_api_crd(plural, kind, Some("v1.6.1")));
        }
        // Another group's CRD, without the annotation: not Gateway API's, so not read.
        api.put(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "gatewayconfigs.cf.k8s.lex.la"},
            "spec": {"group": "cf.k8s.lex.la", "names": {"kind": "GatewayConfig", "plural": "gatewayconfigs"}, "scope": "Namespaced"},
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = std::sync::Arc::new(runtime::health::Health::default());
        let options = RuntimeOptions {
            resync: Duration::from_millis(100),
            ..RuntimeOptions::default()
        };
        let controller = tokio::spawn(runtime::run(api.client(), options, health, async {
            let _ = stopped.await;
        }));
        let class_status = || {
            api.get(
                "gateway.networking.k8s.io/v1",
                "GatewayClass",
                "",
                "cloudflare-tunnel",
            )
            .and_then(|c| c.get("status").cloned())
        };
        let supported_version = |status: &Value| {
            condition(&status["conditions"], "SupportedVersion")
                .map(|c| (c["status"].clone(), c["reason"].clone(), c["message"].clone()))
        };

        let status = eventually("the GatewayClass's status", || {
            class_status().filter(|s| supported_version(s).is_some())
        })
        .await;
        let features: Vec<&str> = status["supportedFeatures"]
            .as_array()
            .expect("supportedFeatures is a list")
            .iter()
            .map(|f| f["name"].as_str().expect("a feature has a name"))
            .collect();
        assert_eq!(features, SUPPORTED_FEATURES);
        let mut sorted = features.clone();
        sorted.sort_unstable();
        assert_eq!(features, sorted, "sorted by name, as the spec requires");
        assert!(features.contains(&"HTTPRoute") && features.contains(&"GRPCRoute"));
        // CRDs are read by metadata only: a list, then a watch.
        let accepts = eventually("the CRDs' list and watch", || {
            Some(api.accepts("CustomResourceDefinition")).filter(|a| a.len() >= 2)
        })
        .await;
        assert_eq!(
            accepts[0],
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        );
        assert!(
            accepts[1..]
                .iter()
                .all(|a| a == "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            "{accepts:?}"
        );
        assert_eq!(
            condition(&status["conditions"], "Accepted").map(|c| &c["status"]),
            Some(&json!("True"))
        );
        let (truth, reason, message) = supported_version(&status).expect("SupportedVersion");
        assert_eq!((truth, reason), (json!("True"), json!("SupportedVersion")));
        assert!(
            message.as_str().is_some_and(|m| m.contains("v1.6.1")),
            "{message}"
        );

        // Which the API server answers with PartialObjectMetadata, as its protocol has it.
        let listed = kube::Api::<PartialObjectMeta<CustomResourceDefinition>>::all(api.user_client())
            .list(&kube::api::ListParams::default())
            .await
            .expect("CRDs list");
        assert_eq!(listed.items.len(), 6);
        assert!(listed.items.iter().all(|i| i
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "PartialObjectMetadata" && t.api_version == "meta.k8s.io/v1")));

        // An upgrade to a release the controller does not know: seen through the watch.
        api.put(gateway_api_crd("httproutes", "HTTPRoute", Some("v1.7.0")));
        let status = eventually("SupportedVersion=False", || {
            class_status().filter(|s| {
                supported_version(s).is_some_and(|(truth, _, _)| truth == json!("False"))
            })
        })
        .await;
        let (_, reason, message) = supported_version(&status).expect("SupportedVersion");
        assert_eq!(reason, json!("UnsupportedVersion"));
        assert!(
            message
                .as_str()
                .is_some_and(|m| m.contains("httproutes.gateway.networking.k8s.io has bundle version v1.7.0")),
            "{message}"
        );
        assert_eq!(
            condition(&status["conditions"], "Accepted").map(|c| &c["status"]),
            Some(&json!("True")),
            "served on a best-effort basis: still accepted"
        );
        assert_eq!(status["supportedFeatures"].as_array().map(Vec::len), Some(SUPPORTED_FEATURES.len()));

        // Back to a supported release.
        api.put(gateway_api_crd("httproutes", "HTTPRoute", Some("v1.6.1")));
        eventually("SupportedVersion=True again", || {
            class_status().filter(|s| {
                supported_version(s).is_some_and(|(truth, _, _)| truth == json!("True"))
            })
        })
        .await;

        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// Gateway API's CRDs of the kinds the controller reads, at `bundle_version`.
fn put_gateway_api_crds(api: &ApiServer, bundle_version: &str) {
    for (plural, kind) in [
        ("gatewayclasses", "GatewayClass"),
        ("gateways", "Gateway"),
        ("httproutes", "HTTPRoute"),
        ("grpcroutes", "GRPCRoute"),
        ("referencegrants", "ReferenceGrant"),
    ] {
        api.put(gateway_api_crd(plural, kind, Some(bundle_version)));
    }
}

/// The seed's GatewayClass's `SupportedVersion` condition: status, reason, message.
fn class_supported_version(api: &ApiServer) -> Option<(String, String, String)> {
    let class = api.get(
        "gateway.networking.k8s.io/v1",
        "GatewayClass",
        "",
        "cloudflare-tunnel",
    )?;
    let c = condition(class.pointer("/status/conditions")?, "SupportedVersion")?;
    let text = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// An older ClusterRole, without list/watch on CustomResourceDefinitions: the CRD watch is
/// refused (403), and the controller still becomes ready and reconciles once it has waited
/// `crd_wait` for it. The class says the CRD versions cannot be read and what reading them
/// takes. Once the rule is granted, the CRD watch's next try lists them and the class says
/// they are supported, with no restart.
#[tokio::test]
async fn crds_the_controller_may_not_read_hold_up_no_reconciling() {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut refusal = None;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                put_gateway_api_crds(api, "v1.6.1");
                refusal = Some(api.forbid(|c| c.kind == "CustomResourceDefinition"));
            },
            ApiServer::client,
            |options| options.crd_wait = Duration::from_millis(200),
        )
        .await;
        let refusal = refusal.expect("CRD requests are refused");
        refusal.refused(1).await;
        // A round ran: the Gateway's plane is rendered.
        t.replicas_become(1).await;
        let (_, reason, message) = eventually("SupportedVersion=False", || {
            class_supported_version(&t.api).filter(|(status, _, _)| status == "False")
        })
        .await;
        assert_eq!(reason, "UnsupportedVersion");
        assert!(
            message.contains("the Gateway API CRD versions cannot be read")
                && message
                    .contains("list and watch on customresourcedefinitions.apiextensions.k8s.io"),
            "{message}"
        );

        refusal.lift();
        let (_, reason, message) = eventually("SupportedVersion=True once CRDs are read", || {
            class_supported_version(&t.api).filter(|(status, _, _)| status == "True")
        })
        .await;
        assert_eq!(reason, "SupportedVersion");
        assert!(message.contains("v1.6.1"), "{message}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A CRD list that comes a moment after the other caches' (within `crd_wait`) is waited for:
/// the first status the class gets already says the CRDs are supported, rather than False
/// until the next round.
#[tokio::test]
async fn a_crd_list_that_comes_a_little_late_is_waited_for() {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut held = None;
        let t = Tenant::start_with("replicas: 1", |api| {
            put_gateway_api_crds(api, "v1.6.1");
            held = Some(api.hold(|c| c.kind == "CustomResourceDefinition"));
        })
        .await;
        let hold = held.expect("CRD requests are held");
        hold.arrived(1).await;
        // Every other cache is filled: a watcher lists, then watches, so each kind has had
        // its second request.
        let others = [
            "GatewayClass",
            "Gateway",
            "HTTPRoute",
            "GRPCRoute",
            "ReferenceGrant",
            "Namespace",
            "Service",
            "EndpointSlice",
            "GatewayConfig",
            "Secret",
            "Deployment",
            "NetworkPolicy",
            "HorizontalPodAutoscaler",
        ];
        eventually("the other caches filled", || {
            others
                .iter()
                .all(|kind| t.api.accepts(kind).len() >= 2)
                .then_some(())
        })
        .await;
        // The CRDs' list comes that much after the others': late, but within the wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
        hold.release();
        let (status, reason, _) = eventually("the class's SupportedVersion", || {
            class_supported_version(&t.api)
        })
        .await;
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "SupportedVersion")
        );
        let class_writes: Vec<String> = t
            .api
            .writes_since(0)
            .into_iter()
            .filter(|w| w.starts_with("MODIFIED gatewayclasses "))
            .collect();
        assert_eq!(class_writes.len(), 1, "no False first: {class_writes:?}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// HTTPRoute `cross` of tenant-a, on the Gateway, to the Service of tenant-c.
fn cross_namespace_route() -> Value {
    yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: cross, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: web, namespace: tenant-c, port: 80}]}]\n",
    )
}

/// A grant's `from` entry for tenant-a's HTTPRoutes.
const GRANT_FROM_A: &str =
    "{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: tenant-a}";

/// A ReferenceGrant at `version` letting tenant-a's HTTPRoutes refer to tenant-c's Services;
/// `from` as given.
fn reference_grant(version: &str, from: &str) -> Value {
    yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/{version}\nkind: ReferenceGrant\nmetadata: {{name: routes-of-a, namespace: tenant-c}}\nspec:\n  from: [{from}]\n  to: [{{group: \"\", kind: Service}}]\n"
    ))
}

/// The status and reason of route `cross`'s `ResolvedRefs`, once they are `status`.
async fn cross_route_resolved(api: &ApiServer, status: &str) -> String {
    let c = eventually(&format!("ResolvedRefs={status}"), || {
        route_condition(api, "tenant-a", "cross", "ResolvedRefs").filter(|c| c["status"] == status)
    })
    .await;
    c["reason"].as_str().unwrap_or_default().to_owned()
}

/// Gateway API CRDs before v1.5 serve ReferenceGrant at `v1beta1` only: the controller finds
/// that out through discovery, becomes ready, and reads the grants there. A grant lets a
/// route refer to another namespace's Service; one that cannot be read, or is deleted, lets
/// it no more.
#[tokio::test]
async fn reference_grants_are_read_at_v1beta1_where_the_crds_serve_no_v1() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
            api.put(reference_grant("v1beta1", GRANT_FROM_A));
            api.put(cross_namespace_route());
        })
        .await;
        assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");
        assert!(
            !t.api.accepts("APIResourceList").is_empty(),
            "the versions served are discovered"
        );

        // Without `from[].namespace`, not a grant the controller can read: it grants nothing.
        t.api.put(reference_grant(
            "v1beta1",
            "{group: gateway.networking.k8s.io, kind: HTTPRoute}",
        ));
        assert_eq!(
            cross_route_resolved(&t.api, "False").await,
            "RefNotPermitted"
        );
        t.api.put(reference_grant("v1beta1", GRANT_FROM_A));
        assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");

        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1beta1",
            "ReferenceGrant",
            "tenant-c",
            "routes-of-a"
        ));
        assert_eq!(
            cross_route_resolved(&t.api, "False").await,
            "RefNotPermitted"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A route this build cannot read (a filter type from a newer Gateway API bundle) is left
/// out on its own: another tenant's routes, listed with it and written after it, are served
/// and reported as before.
#[tokio::test]
async fn a_route_the_controller_cannot_read_stops_no_other_route() {
    tokio::time::timeout(Duration::from_secs(40), async {
        let route = |namespace: &str, name: &str, parent: &str, filters: &str| {
            yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  parentRefs: [{{name: {parent}}}]\n  rules: [{{filters: [{filters}], backendRefs: [{{name: web, port: 80}}]}}]\n"
            ))
        };
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(route("tenant-c", "from-the-future", "third", "{type: TimeTravel}"));
        })
        .await;
        let accepted = |api: &ApiServer, namespace: &str, name: &str| {
            route_condition(api, namespace, name, "Accepted").filter(|c| c["status"] == "True")
        };
        eventually("the listed routes accepted", || accepted(&t.api, "tenant-a", "shop")).await;
        eventually("the third tenant's own route accepted", || {
            accepted(&t.api, "tenant-c", "blog")
        })
        .await;

        // Written after it, while it stands: seen, served and reported.
        t.api.put(route("tenant-c", "also-from-the-future", "third", "{type: Teleport}"));
        t.api.put(route("tenant-a", "late", "edge", ""));
        eventually("a route written later accepted", || accepted(&t.api, "tenant-a", "late")).await;
        for name in ["from-the-future", "also-from-the-future"] {
            assert_eq!(route_parent(&t.api, "tenant-c", name), None, "{name} is left out");
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A GatewayConfig the controller cannot read (a number past its field's 32 bits, which an
/// API server that does not check `format: int32` stores) is left out on its own: the
/// controller still starts, serves every other tenant and reports the Gateway that names it,
/// and reads it again once it is fixed.
#[tokio::test]
async fn a_gateway_config_the_controller_cannot_read_stops_no_other_tenant() {
    tokio::time::timeout(Duration::from_secs(40), async {
        let third_config = |autoscaling: &str| {
            yaml(&format!(
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: third-config, namespace: tenant-c}}\nspec: {{tunnelTokenSecretRef: {{name: third-tunnel-token}}, autoscaling: {{maxReplicas: 2, {autoscaling}}}}}\n"
            ))
        };
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(third_config("targetInflightPerPod: 2147483648"));
        })
        .await;
        let accepted = |api: &ApiServer, namespace: &str, name: &str| {
            api.get("gateway.networking.k8s.io/v1", "Gateway", namespace, name)
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
        };
        eventually("another tenant's route accepted", || {
            route_condition(&t.api, "tenant-a", "shop", "Accepted").filter(|c| c["status"] == "True")
        })
        .await;
        let refused = eventually("the Gateway naming it refused", || {
            accepted(&t.api, "tenant-c", "third").filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("tenant-c/third-config")
                && message.contains("cannot be read by this controller"),
            "{message}"
        );

        t.api.put(third_config("targetInflightPerPod: 50"));
        eventually("the Gateway accepted once it is fixed", || {
            accepted(&t.api, "tenant-c", "third").filter(|c| c["status"] == "True")
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// ReferenceGrant's version is asked again, quickly, for the tests: discovery retried after
/// 50 ms (up to 200 ms), a watch failing as not served re-checked after 1 s: longer than the
/// watch's first retry (800 ms), so the re-check spans failed attempts, as it does in production.
fn quick_discovery(options: &mut RuntimeOptions) {
    options.api_discovery = ApiDiscovery {
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        recheck_after: Duration::from_secs(1),
    };
}

/// On CRDs before v1.5, discovery answering `code` three times and then as usual: the grant
/// at `v1beta1` lets route `cross` refer to another namespace's Service.
async fn grants_read_once_discovery_answers(code: u16) {
    let mut failing = None;
    let t = Tenant::start_tuned(
        "replicas: 1",
        |api| {
            api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
            failing = Some(api.fail(code, |c| c.kind == "APIResourceList"));
            api.put(reference_grant("v1beta1", GRANT_FROM_A));
            api.put(cross_namespace_route());
        },
        ApiServer::client,
        quick_discovery,
    )
    .await;
    let failing = failing.expect("discovery fails");
    failing.refused(3).await;
    failing.lift();
    assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");
    t.stop().await;
}

/// Discovery that fails (the API server in trouble, or restarting as the controller starts)
/// is asked again until it answers: on CRDs before v1.5 the controller then watches
/// ReferenceGrant at `v1beta1`, not at `v1`, which those do not serve.
#[tokio::test]
async fn discovery_that_fails_is_asked_again_until_it_answers() {
    tokio::time::timeout(
        Duration::from_secs(20),
        grants_read_once_discovery_answers(500),
    )
    .await
    .expect("in time");
}

/// Likewise discovery the API server refuses (403 Forbidden, as to a client whose
/// `system:discovery` binding was removed): asked again until it is allowed.
#[tokio::test]
async fn discovery_that_is_refused_is_asked_again_until_it_is_allowed() {
    tokio::time::timeout(
        Duration::from_secs(20),
        grants_read_once_discovery_answers(403),
    )
    .await
    .expect("in time");
}

/// Started before ReferenceGrant's CRD is installed, the controller watches it at `v1` and is
/// not ready; once CRDs before v1.5 are installed, serving it at `v1beta1` only, it finds that
/// out (its watch at `v1` failing as not served) and reads the grants there, with no restart.
#[tokio::test]
async fn reference_grants_are_read_at_the_version_their_crd_serves_once_installed() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.serve_gateway_api_crds(GatewayApiCrds::WithoutReferenceGrant);
                api.put(reference_grant("v1beta1", GRANT_FROM_A));
                api.put(cross_namespace_route());
            },
            ApiServer::client,
            quick_discovery,
        )
        .await;
        // Both versions asked (and answered as not served) before the CRDs change.
        eventually("discovery", || {
            (t.api.accepts("APIResourceList").len() >= 2).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            route_condition(&t.api, "tenant-a", "cross", "ResolvedRefs").is_none(),
            "not ready without ReferenceGrant"
        );
        t.api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
        assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// CRDs upgraded to a release that no longer serves ReferenceGrant at the version watched
/// (`v1beta1` here): the watch ends and fails as not served, and the controller reads the
/// grants at the version served now, so a grant deleted since grants nothing any more.
#[tokio::test]
async fn reference_grants_follow_an_upgrade_that_stops_serving_their_version() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
                api.put(reference_grant("v1beta1", GRANT_FROM_A));
                api.put(cross_namespace_route());
            },
            ApiServer::client,
            quick_discovery,
        )
        .await;
        assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");

        t.api.serve_gateway_api_crds(GatewayApiCrds::V1Only);
        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1",
            "ReferenceGrant",
            "tenant-c",
            "routes-of-a"
        ));
        assert_eq!(
            cross_route_resolved(&t.api, "False").await,
            "RefNotPermitted"
        );
        t.api.put(reference_grant("v1", GRANT_FROM_A));
        assert_eq!(cross_route_resolved(&t.api, "True").await, "ResolvedRefs");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The API server holds the controller's client to `runtime::REQUIRED_RBAC`, as the chart's
/// roles do: a verb they do not grant is refused with 403, discovery never is, and a user is
/// not held to it.
#[tokio::test]
async fn the_controllers_client_gets_only_what_its_rbac_grants() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: tenant-a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: tenant-a}\nspec: {replicas: 1, selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}, spec: {containers: [{name: web, image: web:1}]}}}\n",
        )
        .start()
        .await;
    let refused = |result: Result<(), kube::Error>, verb: &str, resource: &str| match result {
        Err(kube::Error::Api(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"), "{e:?}");
            assert!(
                e.message
                    .contains(&format!("cannot {verb} resource \"{resource}\"")),
                "{}",
                e.message
            );
        }
        other => panic!("expected {verb} on {resource} refused, got {other:?}"),
    };
    let controller = api.client();
    let namespaces: Api<Namespace> = Api::all(controller.clone());
    namespaces
        .list(&ListParams::default())
        .await
        .expect("list is granted");
    refused(
        namespaces.get("tenant-a").await.map(|_| ()),
        "get",
        "namespaces",
    );
    let secrets: Api<Secret> = Api::namespaced(controller.clone(), "tenant-a");
    refused(
        secrets
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map(|_| ()),
        "deletecollection",
        "secrets",
    );
    let scale = Patch::Merge(json!({"spec": {"replicas": 3}}));
    let deployments: Api<Deployment> = Api::namespaced(controller.clone(), "tenant-a");
    deployments.get("web").await.expect("get is granted");
    refused(
        deployments
            .patch_scale("web", &PatchParams::default(), &scale)
            .await
            .map(|_| ()),
        "patch",
        "deployments/scale",
    );
    controller
        .list_api_groups()
        .await
        .expect("discovery is everyone's");

    let user: Api<Deployment> = Api::namespaced(api.user_client(), "tenant-a");
    user.patch_scale("web", &PatchParams::default(), &scale)
        .await
        .expect("a user is not held to the controller's RBAC");
    assert_eq!(
        api.get("apps/v1", "Deployment", "tenant-a", "web")
            .and_then(|d| d.pointer("/spec/replicas").cloned()),
        Some(json!(3))
    );
}

/// Without its parametersRef a Gateway's dedicated plane goes whole: its generated token
/// Secret and its autoscaler as well as its Deployment, Service and NetworkPolicy.
#[tokio::test]
async fn removing_the_ref_removes_the_generated_secret_and_the_autoscaler_too() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            // No config-API token of its own: one is generated.
            api.put(yaml("apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, autoscaling: {minReplicas: 2, maxReplicas: 4}}\n"));
        })
        .await;
        let plane = [
            ("apps/v1", "Deployment", "cf-proxy-edge"),
            ("v1", "Service", "cf-proxy-edge-config"),
            ("networking.k8s.io/v1", "NetworkPolicy", "cf-proxy-edge"),
            ("autoscaling/v2", "HorizontalPodAutoscaler", "cf-proxy-edge"),
            ("v1", "Secret", "cf-proxy-edge-auth"),
        ];
        let present = || {
            plane
                .iter()
                .filter(|(api_version, kind, name)| {
                    t.api.get(api_version, kind, "tenant-a", name).is_some()
                })
                .map(|(_, kind, _)| *kind)
                .collect::<Vec<_>>()
        };
        eventually("the whole plane", || {
            (present().len() == plane.len()).then_some(())
        })
        .await;

        t.api.put(yaml(&gateway(false)));
        let by = Instant::now() + Duration::from_secs(20);
        while !present().is_empty() {
            assert!(Instant::now() < by, "still there: {:?}", present());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A plane switched from the generated config-API token to one of the operator's
/// (`authTokenSecretRef`) keeps the generated Secret while its Deployment rolls out (pods not
/// yet replaced run on that token), and loses it once the rollout is complete. Dropping
/// `authTokenSecretRef` afterwards generates a new token, not the one before.
#[tokio::test]
async fn the_generated_token_secret_goes_once_the_plane_rolled_out_onto_its_own_token() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let generated_spec = "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, replicas: 1}\n";
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(yaml(generated_spec));
        })
        .await;
        let generated_token = || {
            t.api
                .get("v1", "Secret", "tenant-a", "cf-proxy-edge-auth")
                .and_then(|s| s.pointer("/data/token").cloned())
        };
        let token_from = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| {
                    d.pointer("/spec/template/spec/containers/0/env")?
                        .as_array()?
                        .iter()
                        .find(|e| e["name"] == "PROXY_AUTH_TOKEN")?
                        .pointer("/valueFrom/secretKeyRef/name")
                        .cloned()
                })
        };
        let first = eventually("the generated token", generated_token).await;
        eventually("the plane on the generated token", || {
            token_from().filter(|n| *n == json!("cf-proxy-edge-auth"))
        })
        .await;

        // Switched to the operator's token: the Deployment is applied with it and starts
        // rolling out.
        t.configure("replicas: 1");
        eventually("the plane on the operator's token", || {
            token_from().filter(|n| *n == json!("edge-api"))
        })
        .await;
        let generation = t
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .and_then(|d| d.pointer("/metadata/generation").cloned())
            .expect("a generation");
        let status = |observed: &Value, replicas: i32, updated: i32| {
            t.api.set_status(
                "apps/v1",
                "Deployment",
                "tenant-a",
                "cf-proxy-edge",
                json!({"observedGeneration": observed, "replicas": replicas,
                       "updatedReplicas": updated, "readyReplicas": replicas,
                       "availableReplicas": replicas}),
            );
        };
        // The Deployment controller has not seen the new spec yet, then an old pod is left.
        status(&json!(generation.as_i64().unwrap_or(1) - 1), 1, 0);
        t.rounds(3, Duration::from_millis(200)).await;
        assert_eq!(generated_token(), Some(first.clone()), "kept before the rollout");
        status(&generation, 2, 1);
        t.rounds(3, Duration::from_millis(200)).await;
        assert_eq!(generated_token(), Some(first.clone()), "kept while an old pod runs");

        // Rolled out: no pod runs on the generated token any more.
        status(&generation, 1, 1);
        eventually("the generated Secret gone", || {
            generated_token().is_none().then_some(())
        })
        .await;
        assert_eq!(token_from(), Some(json!("edge-api")));

        // Back to a generated token: a new one.
        t.api.put(yaml(generated_spec));
        let second = eventually("a generated token again", generated_token).await;
        assert_ne!(second, first, "a new token, not the one before");
        eventually("the plane on the generated token again", || {
            token_from().filter(|n| *n == json!("cf-proxy-edge-auth"))
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A dedicated Gateway whose token opens the class tunnel, with no Gateway on the shared pool
/// (the migration path, once the last shared Gateway has moved): the edge spreads the
/// tunnel's requests over the pool's connectors too, so the pool serves the Gateway's routes
/// as its own plane does, and the tunnel's one document lists them. Moved to a tunnel of its
/// own, or deleted, the Gateway's routes leave the pool and the class tunnel's document.
#[tokio::test]
async fn the_shared_pool_serves_a_dedicated_gateway_on_the_class_tunnel_with_no_shared_gateway() {
    const OWN_TUNNEL_ID: &str = "e8b2d4f6-1a3c-4e5d-8f7a-9b0c1d2e3f40";
    tokio::time::timeout(Duration::from_secs(90), async {
        let class_token =
            edge_token();
        let own_token =
            Token::new("acct", b"own secret".to_vec(), uuid_of(OWN_TUNNEL_ID)).encode();
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-a");
        let pool = proxy_pod("pool-secret").await;
        let edge = proxy_pod("s3cr3t").await;
        // The class tunnel is the one Gateway edge's token opens; no Gateway is on the pool.
        let t = Tenant::start_tuned(
            "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
            |api| pool_beside(api, pool.admin_addr(), edge.admin_addr(), &[]),
            ApiServer::client,
            |options| {
                beside_the_pool(true)(options);
                options.cloudflare_api_base = cloudflare.base();
                options.cloudflare_api_token = Some("cf-token-a".to_owned());
            },
        )
        .await;
        let serves = |data: SocketAddr, status: u16, what: &'static str| async move {
            let by = Instant::now() + Duration::from_secs(20);
            loop {
                let got = get_via(data, "shop.example.com").await;
                if got == status {
                    return;
                }
                assert!(Instant::now() < by, "{what}: {got}, not {status}");
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        let document = |tunnel: &'static str, hostnames: &'static [&'static str]| {
            let mut ingress: Vec<Value> = hostnames
                .iter()
                .map(|h| json!({"hostname": h, "service": "http://localhost:8080"}))
                .collect();
            ingress.push(json!({"service": "http_status:404"}));
            let want = json!({ "ingress": ingress });
            let cloudflare = &cloudflare;
            async move {
                eventually(&format!("tunnel {tunnel}'s document: {want}"), || {
                    cloudflare
                        .config("acct", tunnel)
                        .filter(|(_, d)| *d == want)
                })
                .await;
            }
        };
        let move_to = |token: &str| {
            t.api.put(yaml(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: edge-tunnel-token, namespace: tenant-a}}\nstringData: {{tunnel-token: \"{token}\"}}\n"
            )));
        };

        serves(edge.data_addr(), 200, "the plane serves its route").await;
        serves(pool.data_addr(), 200, "the pool on its tunnel serves it too").await;
        document(TUNNEL_ID, &["shop.example.com"]).await;
        // `/metrics` names each plane pushed to, the API calls made, and what is watched.
        let metrics = t.health.metrics_text().expect("encodes");
        for series in [
            "cftunnel_controller_push_duration_seconds_count{plane=\"shared\"} ",
            "cftunnel_controller_push_duration_seconds_count{plane=\"tenant-a/edge\"} ",
            "cftunnel_controller_cloudflare_api_requests_total{call=\"put_configuration\",status=\"200\"} ",
            "cftunnel_controller_watched_objects{kind=\"Gateway\"} ",
        ] {
            let count = metrics
                .lines()
                .find_map(|l| l.strip_prefix(series)?.parse::<f64>().ok());
            assert!(count.is_some_and(|n| n >= 1.0), "{series} in:\n{metrics}");
        }
        assert!(
            !metrics.contains("cftunnel_controller_push_failures_total{"),
            "no push failed:\n{metrics}"
        );

        // The class tunnel's token unreadable for a while (its Secret gone): the pool's pods
        // run on the token they started with, on the class tunnel, and keep the route.
        let class_secret = t
            .api
            .get("v1", "Secret", "cftunnel-system", "class-tunnel")
            .expect("the class tunnel's Secret");
        assert!(t.api.delete("v1", "Secret", "cftunnel-system", "class-tunnel"));
        t.rounds(3, Duration::from_millis(300)).await;
        serves(pool.data_addr(), 200, "the pool while the class token is unreadable").await;
        t.api.put(class_secret);

        // A tunnel of its own: the pool no longer gets the route, the documents follow.
        move_to(&own_token);
        serves(pool.data_addr(), 404, "the pool on another tunnel").await;
        document(OWN_TUNNEL_ID, &["shop.example.com"]).await;
        document(TUNNEL_ID, &[]).await;
        serves(edge.data_addr(), 200, "the plane keeps its route").await;

        // Back on the class tunnel, then deleted.
        move_to(&class_token);
        serves(pool.data_addr(), 200, "the pool on its tunnel again").await;
        document(TUNNEL_ID, &["shop.example.com"]).await;
        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge"
        ));
        serves(pool.data_addr(), 404, "the pool after the Gateway went").await;
        document(TUNNEL_ID, &[]).await;
        // The plane went, and its series with it.
        eventually("the plane's series gone", || {
            let metrics = t.health.metrics_text().ok()?;
            (!metrics.contains("plane=\"tenant-a/edge\"")).then_some(())
        })
        .await;

        t.stop().await;
        edge.shutdown().await;
        pool.shutdown().await;
    })
    .await
    .expect("in time");
}

/// A route on the pool's Gateway whose rule a pod of an earlier release refuses: its filter
/// is a CORS one, which that release cannot read.
const CORS_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: cors, namespace: tenant-s}\nspec:\n  parentRefs: [{name: public}]\n  rules:\n  - matches: [{path: {value: /cors}}]\n    filters: [{type: CORS, cors: {allowOrigins: ['https://app.example.com']}}]\n    backendRefs: [{name: web, port: 80}]\n";

/// `ProxyRuleRefused` Events told so far, each counted with its series.
fn rule_refusals_told(api: &ApiServer) -> u64 {
    api.list("Event")
        .into_iter()
        .filter(|e| e["reason"] == "ProxyRuleRefused")
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum()
}

/// During an upgrade the shared pool's pod runs an earlier release that cannot read a CORS
/// filter. The route whose rule it refuses says so (condition and Warning Event, naming the
/// rule and the field); every other route keeps updating and is served, including one added
/// while the refusal lasts.
#[tokio::test]
async fn a_rule_an_older_pod_refuses_is_reported_on_its_route_and_the_rest_is_served() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, pool, older) = older_pool().await;
        let (api, stop, controller) =
            on_the_pool(older.addr(), echo.http_addr(), &format!("---\n{CORS_ROUTE}")).await;

        let refused = eventually("ProxyConfigPushed=False on the CORS route", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!((&refused["status"], &refused["reason"]), (&json!("False"), &json!("RuleRefused")));
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("rule tenant-s/cors/0")
                && message.contains("filters[0].type: unknown variant `CORS`"),
            "{message}"
        );
        let accepted = route_condition(&api, "tenant-s", "cors", "Accepted").expect("Accepted");
        assert_eq!(accepted["status"], "True", "the route itself is valid");
        let event = eventually("a ProxyRuleRefused Event", || {
            api.list("Event")
                .into_iter()
                .find(|e| e["reason"] == "ProxyRuleRefused")
        })
        .await;
        assert_eq!((&event["type"], &event["regarding"]["name"]), (&json!("Warning"), &json!("cors")));

        // The other route is served, and says nothing of it.
        let data = pool.data_addr();
        let by = Instant::now() + Duration::from_secs(20);
        while get_via(data, "www.example.com").await != 200 {
            assert!(Instant::now() < by, "the www route is served");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(route_condition(&api, "tenant-s", "www", PROXY_CONFIG_PUSHED).is_none());

        // A route added meanwhile reaches the pod in the next round (its redirect answers).
        api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: later, namespace: tenant-s}\nspec:\n  parentRefs: [{name: public}]\n  rules:\n  - matches: [{path: {type: Exact, value: /cart}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: shop.example.com}}]\n"));
        let by = Instant::now() + Duration::from_secs(20);
        while get_via(data, "www.example.com").await != 302 {
            assert!(Instant::now() < by, "the added route is served");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over (a restart here) from one that told a route a rule of it was
/// refused keeps the refusal its status carries until its own push to the pod says (here
/// rounds later: the pod answers slowly), and sends no second `ProxyRuleRefused`.
#[tokio::test]
async fn a_new_leader_does_not_tell_again_a_refusal_the_routes_status_carries() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, _pool, older) = older_pool().await;
        // Each call to the pod answered past a round's wait for its pushes: the new
        // controller's first rounds have no outcome of the pool's.
        let slow = support::slow_port(older.addr(), Duration::from_millis(1200)).await;
        let (api, stop, controller) =
            on_the_pool(slow, echo.http_addr(), &format!("---\n{CORS_ROUTE}")).await;
        let refused = cors_refused_and_told(&api).await;
        stop_controller(stop, controller).await;

        let (dropped, _watching) = written_without(&api, "cors", "RuleRefused");
        let (stop, controller, health) = pool_controller(&api);
        // The new controller's rounds: a route added is accepted.
        api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: later, namespace: tenant-s}\nspec:\n  parentRefs: [{name: public}]\n  rules:\n  - matches: [{path: {type: Exact, value: /cart}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: shop.example.com}}]\n"));
        eventually("the added route accepted", || {
            route_condition(&api, "tenant-s", "later", "Accepted").filter(|c| c["status"] == "True")
        })
        .await;
        // Past the new controller's first push outcome (each call to the pod 1.2 s late).
        eventually("the new controller's push to the pool", || {
            let metrics = health.metrics_text().ok()?;
            metrics
                .lines()
                .any(|l| {
                    l.starts_with("cftunnel_controller_push_duration_seconds_count{plane=\"shared\"}")
                })
                .then_some(())
        })
        .await;
        rounds_later(&health, 5).await;
        assert_eq!(
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED).map(|c| c["message"].clone()),
            Some(refused["message"].clone())
        );
        assert_eq!(rule_refusals_told(&api), 1, "told once, by the first controller");
        assert!(
            !dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the route's status was written without the refusal"
        );
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over while the pod that refused a rule does not answer (its config
/// port gone for a while) keeps the refusal the route's status carries through its failed
/// pushes, and once the pod answers, refusing the rule again, sends no second
/// `ProxyRuleRefused`: a push that reached no pod says nothing of what the pods refuse.
#[tokio::test]
async fn a_new_leader_keeps_a_refusal_through_pushes_no_pod_answers() {
    refusal_through_pushes_no_pod_answers(Meanwhile::PortGone).await;
}

/// The refusing pod down and not serving as the lead changes hands (its config port refusing
/// connections, not ready): it holds no config, but it is the only one, so nothing is heard of
/// what the pods refuse, and the refusal stands until the failed pushes are reported in its
/// place. Once the pod is back, refusing the rule again, no second `ProxyRuleRefused` goes
/// out: the earlier leader told it.
#[tokio::test]
async fn a_new_leader_keeps_a_refusal_through_pushes_while_every_pod_is_down() {
    refusal_through_pushes_no_pod_answers(Meanwhile::AllDown).await;
}

/// What happens as the lead changes hands, in [`refusal_through_pushes_no_pod_answers`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Meanwhile {
    /// The refusing pod's config port closes every connection, then serves again.
    PortGone,
    /// The pool's only pod is down and not serving long enough for its failure to be
    /// reported (the new controller reports at once), then back.
    AllDown,
    /// As `PortGone`, and the route's owner drops the refused filter.
    RouteEdited,
}

/// As [`a_new_leader_keeps_a_refusal_through_pushes_no_pod_answers`], but the route's owner
/// drops the refused filter while no pod answers: the refusal, said of the route as it was,
/// is kept no longer. Once the pod is back and the filter put back, the refusal found again
/// is told: the earlier leader told it of the route as it was.
#[tokio::test]
async fn a_refusal_a_new_leader_kept_goes_once_the_route_changes() {
    refusal_through_pushes_no_pod_answers(Meanwhile::RouteEdited).await;
}

/// A refusal told by one controller, then the lead changing hands while no pod of the pool
/// answers, as `meanwhile` says.
async fn refusal_through_pushes_no_pod_answers(meanwhile: Meanwhile) {
    use std::sync::atomic::{AtomicBool, Ordering};
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, _pool, older) = older_pool().await;
        let open = Arc::new(AtomicBool::new(true));
        let gate = support::gated_port(older.addr(), Arc::clone(&open)).await;
        let (api, stop, controller) =
            on_the_pool(gate, echo.http_addr(), &format!("---\n{CORS_ROUTE}")).await;
        let refused = cors_refused_and_told(&api).await;
        stop_controller(stop, controller).await;

        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&dropped);
        let _watching = api.forbid(move |c| {
            let cors = c.method == "PATCH" && c.kind == "HTTPRoute" && c.name == Some("cors");
            // A refusal, or (with every pod down) the failed pushes reported in its place.
            let body = c.body.to_string();
            let reported = meanwhile == Meanwhile::AllDown && body.contains("PushFailed");
            if cors && !body.contains("RuleRefused") && !reported {
                flag.store(true, Ordering::SeqCst);
            }
            false
        });
        open.store(false, Ordering::SeqCst);
        let (down, _held) = closed_port();
        if meanwhile == Meanwhile::AllDown {
            api.put(pool_slice(down, false));
        }
        let (stop, controller, health) = pool_controller_tuned(&api, |options| {
            if meanwhile == Meanwhile::AllDown {
                options.sustained_for = Duration::ZERO;
            }
        });
        eventually("the new controller's failed pushes", || {
            (push_failures(&health, "shared") >= 3).then_some(())
        })
        .await;
        if meanwhile == Meanwhile::AllDown {
            eventually("the failed pushes reported on the route", || {
                route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                    .filter(|c| c["reason"] == "PushFailed")
            })
            .await;
            // The pod back, ready.
            api.put(pool_slice(gate.port(), true));
        }
        if meanwhile == Meanwhile::RouteEdited {
            assert!(route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED).is_some());
            assert!(
                !dropped.load(Ordering::SeqCst),
                "the route's status was written without the refusal"
            );
            drop(_watching);
            api.put(yaml(&CORS_ROUTE.replace(
                "    filters: [{type: CORS, cors: {allowOrigins: ['https://app.example.com']}}]\n",
                "",
            )));
            eventually("the refusal gone from the changed route", || {
                route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                    .is_none()
                    .then_some(())
            })
            .await;
            // The filter put back, then the pod back: refused again, of the route as it is now
            // (its third generation), which nobody has told. No push answers before it, so
            // only the generation tells the refusal from the one told.
            api.put(yaml(CORS_ROUTE));
            eventually("the filter put back seen", || {
                route_condition(&api, "tenant-s", "cors", "Accepted")
                    .filter(|c| c["observedGeneration"] == 3)
            })
            .await;
            open.store(true, Ordering::SeqCst);
            eventually("the refusal told again", || {
                (rule_refusals_told(&api) == 2).then_some(())
            })
            .await;
            stop_controller(stop, controller).await;
            return;
        }
        open.store(true, Ordering::SeqCst);
        eventually("the new controller's push to the pool", || {
            let metrics = health.metrics_text().ok()?;
            metrics
                .lines()
                .find_map(|l| {
                    l.strip_prefix(
                        "cftunnel_controller_push_duration_seconds_count{plane=\"shared\"} ",
                    )
                })
                .and_then(|n| n.trim().parse::<u64>().ok())
                .filter(|n| *n > push_failures(&health, "shared"))
        })
        .await;
        rounds_later(&health, 5).await;
        assert_eq!(
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(refused["message"].clone())
        );
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the route's status was written without the refusal"
        );
        assert_eq!(
            rule_refusals_told(&api),
            1,
            "told once, by the first controller"
        );
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told a route a rule of it was refused, and finds
/// the pool's pod replaced by another of the same release (a rollout of the same image), and a
/// route added ahead of the refused rule in the document: the refusal is the same though
/// another pod makes it, at another place in the document, and is not told again.
#[tokio::test]
async fn a_refusal_another_pod_of_the_release_makes_is_not_told_again_by_a_new_leader() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, pool, older) = older_pool().await;
        let (api, stop, controller) = on_the_pool(
            older.addr(),
            echo.http_addr(),
            &format!("---\n{CORS_ROUTE}"),
        )
        .await;
        eventually("a ProxyRuleRefused Event", || {
            (rule_refusals_told(&api) == 1).then_some(())
        })
        .await;
        stop_controller(stop, controller).await;

        let replaced = OlderProxy::start(pool.admin_addr())
            .await
            .expect("the replacing pod starts");
        api.put(pool_slice(replaced.addr().port(), true));
        api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: ahead, namespace: tenant-s}\nspec:\n  parentRefs: [{name: public}]\n  rules:\n  - matches: [{path: {type: Exact, value: /a-path-long-enough-to-move-the-rules-after-it}}]\n    filters: [{type: RequestRedirect, requestRedirect: {hostname: shop.example.com}}]\n"));
        let (stop, controller, health) = pool_controller(&api);
        eventually("the refusal of the replacing pod", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED).filter(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&replaced.addr().to_string()))
            })
        })
        .await;
        rounds_later(&health, 5).await;
        assert_eq!(
            rule_refusals_told(&api),
            1,
            "told once, by the first controller"
        );
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told ten routes a rule of each was refused: a
/// round pushes only so many times (eight), each pass leaving out what the pod refused, and
/// the rest are found in the next. Meanwhile those routes keep the refusal their status
/// carries, and no route is told again.
#[tokio::test]
async fn a_new_leader_finding_more_refusals_than_a_round_leaves_out_tells_none_again() {
    more_refusals_than_a_round_leaves_out(10, 1).await;
}

/// As [`a_new_leader_finding_more_refusals_than_a_round_leaves_out_tells_none_again`], with
/// fifteen refused rules one route's, found over three rounds: the route's condition says
/// what each round found (not, the plane cut off again, what the controller wrote itself the
/// round before), the rounds cut off tell nothing, and the route is told once, of all fifteen.
#[tokio::test]
async fn a_route_with_more_refused_rules_than_a_round_leaves_out_is_told_once() {
    more_refusals_than_a_round_leaves_out(1, 15).await;
}

/// `routes` routes on the pool, each with `rules` rules the pod refuses: told by one
/// controller, then the lead changing hands.
async fn more_refusals_than_a_round_leaves_out(routes: usize, rules: usize) {
    use std::sync::atomic::AtomicBool;
    // The refusals a round finds: the pod refuses one rule a push, and a round pushes eight
    // times, the last with nothing more left out.
    const FOUND: usize = 7;
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, _pool, older) = older_pool().await;
        let (head, rule) = CORS_ROUTE
            .split_once("  rules:\n")
            .expect("a route with rules");
        let all: String = (0..routes)
            .map(|i| {
                let rules: String = (0..rules)
                    .map(|j| rule.replace("/cors", &format!("/cors-{i}-{j}")))
                    .collect();
                let head = head.replace("name: cors,", &format!("name: cors-{i},"));
                format!("---\n{head}  rules:\n{rules}")
            })
            .collect();
        let api = pool_api(older.addr(), echo.http_addr(), &all).await;
        // Per route, how many refusals each write of its status said.
        let written = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
            String,
            Vec<usize>,
        >::new()));
        let record = Arc::clone(&written);
        let recording = api.forbid(move |c| {
            let body = c.body.to_string();
            if let (true, Some(name)) =
                (c.method == "PATCH" && body.contains("RuleRefused"), c.name)
            {
                let mut written = record.lock().expect("the record");
                let said = written.entry(name.to_owned()).or_default();
                said.push(body.matches("refused rule").count());
            }
            false
        });
        let (stop, controller, _) = pool_controller(&api);
        // Each route's refusals, all of them found.
        let refused = |i: usize| {
            route_condition(&api, "tenant-s", &format!("cors-{i}"), PROXY_CONFIG_PUSHED)
                .filter(|c| c["reason"] == "RuleRefused")
                .and_then(|c| {
                    c["message"]
                        .as_str()
                        .map(|m| m.matches("refused rule").count())
                })
        };
        for i in 0..routes {
            eventually("every refusal on the route's condition", || {
                (refused(i) == Some(rules)).then_some(())
            })
            .await;
        }
        eventually("a ProxyRuleRefused Event for each route", || {
            (rule_refusals_told(&api) >= routes as u64).then_some(())
        })
        .await;
        stop_controller(stop, controller).await;
        drop(recording);
        assert_eq!(
            rule_refusals_told(&api),
            routes as u64,
            "each route told once, of every refusal"
        );
        // The refusals the rounds found so far, of the route's rules (in document order, the
        // routes' rules one after the other), as the rounds go.
        let rounds = (routes * rules).div_ceil(FOUND);
        let written = written.lock().expect("the record").clone();
        for i in 0..routes {
            let mut found: Vec<usize> = (1..=rounds)
                .map(|round| (round * FOUND).saturating_sub(i * rules).min(rules))
                .filter(|&found| found > 0)
                .collect();
            found.dedup();
            assert_eq!(written.get(&format!("cors-{i}")), Some(&found), "cors-{i}");
        }

        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&dropped);
        let _watching = api.forbid(move |c| {
            let cors = c.method == "PATCH"
                && c.kind == "HTTPRoute"
                && c.name.is_some_and(|n| n.starts_with("cors-"));
            if cors && !c.body.to_string().contains("RuleRefused") {
                flag.store(true, Ordering::SeqCst);
            }
            false
        });
        let (stop, controller, health) = pool_controller(&api);
        // Rounds that pushed: those cut off, and the last leaving out the rest.
        eventually("the new controller's last push", || {
            let metrics = health.metrics_text().ok()?;
            metrics
                .lines()
                .find_map(|l| {
                    l.strip_prefix(
                        "cftunnel_controller_push_duration_seconds_count{plane=\"shared\"} ",
                    )
                })
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|n| *n >= rounds)
        })
        .await;
        rounds_later(&health, 5).await;
        for i in 0..routes {
            assert_eq!(refused(i), Some(rules), "cors-{i}");
        }
        assert!(
            !dropped.load(Ordering::SeqCst),
            "a route's status was written without the refusal"
        );
        assert_eq!(
            rule_refusals_told(&api),
            routes as u64,
            "told once, by the first controller"
        );
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// A pool of two pods, one of an earlier release refusing the CORS rule and one whose config
/// port closes every connection (up and serving all the same): what the one that answers
/// refuses is told, once, through rounds the other fails; the other answering again tells
/// nothing more; the refusing pod upgraded, the refusal goes.
#[tokio::test]
async fn a_refusal_some_pods_of_the_plane_make_is_told_while_another_fails() {
    use std::sync::atomic::AtomicBool;
    tokio::time::timeout(Duration::from_secs(90), async {
        let (echo, pool, older) = older_pool().await;
        let open = Arc::new(AtomicBool::new(false));
        let gate = support::gated_port(pool.admin_addr(), Arc::clone(&open)).await;
        let api = pool_api(
            older.addr(),
            echo.http_addr(),
            &format!("---\n{CORS_ROUTE}"),
        )
        .await;
        let mut other = config_slice("cftunnel-system", "cftunnel-proxy", gate.port(), true);
        other["metadata"]["name"] = json!("cftunnel-proxy-p2");
        api.put(other);
        let (stop, controller, health) = pool_controller(&api);
        let refused = cors_refused_and_told(&api).await;
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains(&older.addr().to_string())),
            "{refused}"
        );
        eventually("pushes to the other pod failing", || {
            (push_failures(&health, "shared") >= 3).then_some(())
        })
        .await;
        rounds_later(&health, 5).await;
        assert_eq!(
            rule_refusals_told(&api),
            1,
            "told once while the other pod fails"
        );

        // The other pod answers: the plane's pods, all heard, refuse what was told.
        open.store(true, Ordering::SeqCst);
        // A push the gate took before it opened may still be counted as it ends.
        rounds_later(&health, 2).await;
        let failures = push_failures(&health, "shared");
        rounds_later(&health, 5).await;
        assert_eq!(
            push_failures(&health, "shared"),
            failures,
            "the other pod answers"
        );
        let said = |c: Value| (c["reason"].clone(), c["message"].clone());
        assert_eq!(
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED).map(said),
            Some(said(refused)),
            "the refusal stands"
        );
        assert_eq!(rule_refusals_told(&api), 1, "nothing told again");

        // The refusing pod upgraded: the refusal goes.
        api.put(pool_slice(pool.admin_addr().port(), true));
        eventually("the refusal gone", || {
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        assert_eq!(rule_refusals_told(&api), 1);
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// The pod that refused a rule replaced by one whose config port does not answer yet: the
/// round that pushes to it hears nothing of what the pods refuse, so the refusal stands (the
/// route's status keeps it); once the new pod answers, refusing the rule too, it is the same
/// refusal, and no second `ProxyRuleRefused` goes out.
#[tokio::test]
async fn a_refusal_stands_while_the_pod_replacing_its_pod_does_not_answer() {
    use std::sync::atomic::AtomicBool;
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, pool, older) = older_pool().await;
        let api = pool_api(
            older.addr(),
            echo.http_addr(),
            &format!("---\n{CORS_ROUTE}"),
        )
        .await;
        let (stop, controller, health) = pool_controller(&api);
        let refused = cors_refused_and_told(&api).await;

        let (dropped, _watching) = written_without(&api, "cors", "RuleRefused");
        let replacing = OlderProxy::start(pool.admin_addr())
            .await
            .expect("the replacing pod starts");
        let open = Arc::new(AtomicBool::new(false));
        let gate = support::gated_port(replacing.addr(), Arc::clone(&open)).await;
        api.put(pool_slice(gate.port(), true));
        eventually("pushes to the replacing pod failing", || {
            (push_failures(&health, "shared") >= 3).then_some(())
        })
        .await;
        assert_eq!(
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(refused["message"].clone()),
            "the refusal as it was found"
        );
        open.store(true, Ordering::SeqCst);
        refused_again_by(&api, &health, gate, &dropped).await;
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// The pool's only pod gone for a few rounds before its successor (of the same release) is
/// listed: the refusal stands through the rounds with no pod listed, and the successor
/// refusing the rule again is not told again.
#[tokio::test]
async fn a_refusal_stands_through_rounds_with_no_pod_listed() {
    refusal_through_rounds_with_no_pod_listed(false).await;
}

/// As [`a_refusal_stands_through_rounds_with_no_pod_listed`], the lead changing hands as the
/// pod goes: the new leader keeps what the route's status says through its rounds with no pod
/// listed, and tells nothing again once the successor refuses the rule.
#[tokio::test]
async fn a_new_leader_keeps_a_refusal_through_rounds_with_no_pod_listed() {
    refusal_through_rounds_with_no_pod_listed(true).await;
}

/// A refusal told, then the pool's slice listing no pod for a few rounds (with the lead
/// changing hands meanwhile if `new_leader`), then a successor pod of the same release.
async fn refusal_through_rounds_with_no_pod_listed(new_leader: bool) {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (echo, pool, older) = older_pool().await;
        let api = pool_api(
            older.addr(),
            echo.http_addr(),
            &format!("---\n{CORS_ROUTE}"),
        )
        .await;
        let (stop, controller, health) = pool_controller(&api);
        let refused = cors_refused_and_told(&api).await;

        let (dropped, _watching) = written_without(&api, "cors", "RuleRefused");
        let mut slice = pool_slice(older.addr().port(), true);
        slice["endpoints"] = json!([]);
        let (stop, controller, health) = if new_leader {
            stop_controller(stop, controller).await;
            api.put(slice);
            pool_controller(&api)
        } else {
            api.put(slice);
            (stop, controller, health)
        };
        // Rounds with no pod listed.
        rounds_later(&health, 5).await;
        assert_eq!(
            route_condition(&api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
                .map(|c| c["message"].clone()),
            Some(refused["message"].clone()),
            "the refusal as it was found"
        );
        let successor = OlderProxy::start(pool.admin_addr())
            .await
            .expect("the successor starts");
        api.put(pool_slice(successor.addr().port(), true));
        refused_again_by(&api, &health, successor.addr(), &dropped).await;
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// The route `cors` of `tenant-a` with the refused CORS rule, on Gateways `parents`.
fn cors_route_on(parents: &[&str]) -> String {
    let parents: Vec<String> = parents.iter().map(|p| format!("{{name: {p}}}")).collect();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: cors, namespace: tenant-a}}\nspec:\n  parentRefs: [{}]\n  rules:\n  - matches: [{{path: {{value: /cors}}}}]\n    filters: [{{type: CORS, cors: {{allowOrigins: ['https://app.example.com']}}}}]\n    backendRefs: [{{name: web, port: 80}}]\n",
        parents.join(", ")
    )
}

/// Condition `kind` of the parent `gateway` (in the route's namespace) in the status of
/// HTTPRoute `namespace/name`.
fn parent_condition(
    api: &ApiServer,
    (namespace, name): (&str, &str),
    gateway: &str,
    kind: &str,
) -> Option<Value> {
    let route = api.get("gateway.networking.k8s.io/v1", "HTTPRoute", namespace, name)?;
    let parent = route
        .pointer("/status/parents")?
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == CONTROLLER && p["parentRef"]["name"] == gateway)?;
    condition(&parent["conditions"], kind).cloned()
}

/// The controller's options beside the shared pool: on `class_tunnel`, the pool runs on the
/// tunnel Gateway edge's token opens, and so serves edge's routes beside edge's own plane.
fn beside_the_pool(class_tunnel: bool) -> impl Fn(&mut RuntimeOptions) {
    move |options| {
        options.shared = Some(SharedPlane {
            deployment: None,
            service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
            auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
            auth_key: "token".to_owned(),
            tunnel_secret: class_tunnel.then(|| {
                (
                    ObjectKey::new("cftunnel-system", "class-tunnel"),
                    "tunnel-token".to_owned(),
                )
            }),
        });
    }
}

/// Puts the shared pool's side beside the seed's: the pool's token Secret, the class tunnel's
/// (the one Gateway edge's token opens, used by [`beside_the_pool`] with `class_tunnel`), the
/// config EndpointSlices of the pool (listing `pool`) and of edge's plane (`edge`), and `more`.
fn pool_beside(api: &ApiServer, pool: SocketAddr, edge: SocketAddr, more: &[String]) {
    api.put(yaml("apiVersion: v1\nkind: Secret\nmetadata: {name: shared-auth, namespace: cftunnel-system}\nstringData: {token: pool-secret}\n"));
    api.put(class_tunnel_secret(&edge_token(), ""));
    api.put(config_slice(
        "cftunnel-system",
        "cftunnel-proxy",
        pool.port(),
        true,
    ));
    api.put(config_slice(
        "tenant-a",
        "cf-proxy-edge-config",
        edge.port(),
        true,
    ));
    for object in more {
        api.put(yaml(object));
    }
}

/// A route with one parent on the shared pool and one on a Gateway's own plane, each plane's
/// pod of an earlier release that refuses its CORS rule: each parent says what its plane
/// refuses, one `ProxyRuleRefused` goes out per plane, and once one plane's pod is upgraded
/// only its parent stops saying so, with no Event more.
#[tokio::test]
async fn a_route_whose_two_planes_both_refuse_a_rule_is_told_of_each() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let pool = proxy_pod("pool-secret").await;
        let edge = proxy_pod("s3cr3t").await;
        let older_pool = OlderProxy::start(pool.admin_addr()).await.expect("starts");
        let older_edge = OlderProxy::start(edge.admin_addr()).await.expect("starts");
        let public = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: public, namespace: tenant-a}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  listeners: [{name: http, port: 80, protocol: HTTP, hostname: www.example.com}]\n";
        let more = [public.to_owned(), cors_route_on(&["edge", "public"])];
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| pool_beside(api, older_pool.addr(), older_edge.addr(), &more),
            ApiServer::client,
            beside_the_pool(false),
        )
        .await;
        let cors = ("tenant-a", "cors");
        let refused_by = |gateway: &str, pod: SocketAddr| {
            let api = &t.api;
            let gateway = gateway.to_owned();
            async move {
                eventually(&format!("{gateway}'s parent naming {pod}"), || {
                    parent_condition(api, cors, &gateway, PROXY_CONFIG_PUSHED).filter(|c| {
                        let message = c["message"].as_str().unwrap_or_default();
                        c["reason"] == "RuleRefused"
                            && message.contains(&pod.to_string())
                            && message.contains("unknown variant `CORS`")
                    })
                })
                .await
            }
        };
        let on_edge = refused_by("edge", older_edge.addr()).await;
        let on_public = refused_by("public", older_pool.addr()).await;
        // Each parent names its own plane's pod only.
        let names = |c: &Value, pod: SocketAddr| {
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains(&pod.to_string()))
        };
        assert!(!names(&on_edge, older_pool.addr()), "{on_edge}");
        assert!(!names(&on_public, older_edge.addr()), "{on_public}");
        eventually("one ProxyRuleRefused per plane", || {
            (rule_refusals_told(&t.api) == 2).then_some(())
        })
        .await;
        rounds_later(&t.health, 5).await;
        assert_eq!(rule_refusals_told(&t.api), 2, "each told once");
        let notes: Vec<String> = t
            .api
            .list("Event")
            .into_iter()
            .filter(|e| e["reason"] == "ProxyRuleRefused")
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
            .collect();
        for pod in [older_edge.addr(), older_pool.addr()] {
            let naming = notes.iter().filter(|n| n.contains(&pod.to_string())).count();
            assert_eq!(naming, 1, "one Event names {pod}: {notes:?}");
        }

        // The pool's pod upgraded: its parent clears, the other still says what edge's pod
        // refuses, and nothing more is told.
        t.api.put(config_slice(
            "cftunnel-system",
            "cftunnel-proxy",
            pool.admin_addr().port(),
            true,
        ));
        eventually("the public parent cleared", || {
            parent_condition(&t.api, cors, "public", PROXY_CONFIG_PUSHED)
                .is_none()
                .then_some(())
        })
        .await;
        rounds_later(&t.health, 5).await;
        let said = |c: Value| (c["reason"].clone(), c["message"].clone());
        assert_eq!(
            parent_condition(&t.api, cors, "edge", PROXY_CONFIG_PUSHED).map(said),
            Some(said(on_edge)),
            "edge's plane still refuses"
        );
        assert_eq!(rule_refusals_told(&t.api), 2, "nothing more told");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A controller that takes over from one that told a route its Gateway's tunnel peer (the
/// shared pool, on the same tunnel) refuses a rule keeps that refusal while the peer's pod
/// has not answered (each call to it answered late), though the Gateway's own plane, which
/// takes the rule, has: the peer is handed a share of the route's requests all the same.
/// Once the peer refuses the rule again, nothing is told again.
#[tokio::test]
async fn a_new_leader_keeps_a_tunnel_peers_refusal_until_the_peer_answers() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let pool = proxy_pod("pool-secret").await;
        let edge = proxy_pod("s3cr3t").await;
        let older_pool = OlderProxy::start(pool.admin_addr()).await.expect("starts");
        // Past a round's wait for its pushes: a new controller's first rounds hear nothing
        // from the pool, and a late answer is no failure while it is not sustained.
        let slow = support::slow_port(older_pool.addr(), Duration::from_millis(1200)).await;
        let tune = |options: &mut RuntimeOptions| {
            beside_the_pool(true)(options);
            options.sustained_for = RuntimeOptions::default().sustained_for;
        };
        let mut t = Tenant::start_tuned(
            "replicas: 1",
            |api| pool_beside(api, slow, edge.admin_addr(), &[cors_route_on(&["edge"])]),
            ApiServer::client,
            tune,
        )
        .await;
        let cors = ("tenant-a", "cors");
        let refused = eventually("edge's parent naming the pool's pod", || {
            parent_condition(&t.api, cors, "edge", PROXY_CONFIG_PUSHED).filter(|c| {
                c["reason"] == "RuleRefused"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&slow.to_string()))
            })
        })
        .await;
        eventually("a ProxyRuleRefused Event", || {
            (rule_refusals_told(&t.api) == 1).then_some(())
        })
        .await;

        let said = |c: Value| (c["reason"].clone(), c["message"].clone());
        let (dropped, _watching) = written_without(&t.api, "cors", "RuleRefused");
        t.restart(tune).await;
        let pool_pushes = || {
            counted(
                &t.health,
                "cftunnel_controller_push_duration_seconds_count{plane=\"shared\"}",
            )
        };
        let from = pool_pushes();
        let stands = || {
            assert_eq!(
                parent_condition(&t.api, cors, "edge", PROXY_CONFIG_PUSHED).map(said),
                Some(said(refused.clone())),
                "the peer's refusal stands"
            );
        };
        // Rounds in which edge's plane answers and the pool not yet, then rounds past the
        // pool's answer.
        rounds_later(&t.health, 3).await;
        stands();
        eventually("the pool's answer to the new controller", || {
            (pool_pushes() > from).then_some(())
        })
        .await;
        rounds_later(&t.health, 5).await;
        stands();
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the route's status was written without the refusal"
        );
        assert_eq!(
            rule_refusals_told(&t.api),
            1,
            "told once, by the first controller"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The shared pool's document past the regex budget a proxy holds, after the oldest route is
/// edited to a costly regex: that rule is left out before the pod sees it, its route says so,
/// and every other tenant's rule stays served. A pod counting in document order would have
/// refused the last rule, which is another route's.
#[tokio::test]
async fn a_route_that_takes_the_plane_past_the_regex_budget_loses_its_rule_and_no_other() {
    use cftunnel_config::valid::{Pattern, PATTERN_BUDGET};
    tokio::time::timeout(Duration::from_secs(90), async {
        let echo = support::echo("tenant-s", "web-s").await;
        let pool = proxy_pod("pool-secret").await;
        // About half a megabyte compiled each; `big` about four times that.
        let costly = |i: usize| format!("/a{i:03}/\\w{{3,32}}");
        let big = "/big/\\w{3,32}/\\w{3,32}/\\w{3,32}/\\w{3,32}";
        let mut spent = 0;
        let fit = (0..)
            .take_while(|&i| {
                spent += Pattern::new(&costly(i)).map_or(0, |p| p.cost());
                spent <= PATTERN_BUDGET
            })
            .count();
        // Escaped for a YAML double-quoted string.
        let route = |i: usize, path: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{i}, namespace: tenant-s, creationTimestamp: \"2024-01-01T00:{:02}:{:02}Z\"}}\nspec:\n  parentRefs: [{{name: public}}]\n  rules:\n  - matches: [{{path: {{type: RegularExpression, value: \"{}\"}}}}]\n    backendRefs: [{{name: web, port: 80}}]\n",
                i / 60,
                i % 60,
                path.replace('\\', "\\\\")
            )
        };
        let routes: String = (0..fit).map(|i| format!("---\n{}", route(i, &costly(i)))).collect();
        let (api, stop, controller) =
            on_the_pool(pool.admin_addr(), echo.http_addr(), &routes).await;
        let served = || async {
            cftunnel_controller::push::served_document(
                pool.admin_addr(),
                "pool-secret",
                Duration::from_secs(5),
            )
            .await
            .map(|doc| {
                doc.rules
                    .into_iter()
                    .filter_map(|r| r.name)
                    .collect::<Vec<String>>()
            })
            .unwrap_or_default()
        };
        let last = format!("tenant-s/r{}/0", fit - 1);
        let by = Instant::now() + Duration::from_secs(30);
        while !served().await.contains(&last) {
            assert!(Instant::now() < by, "every route is served");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        api.put(yaml(&route(0, big)));
        let refused = eventually("ProxyConfigPushed=False on the edited route", || {
            route_condition(&api, "tenant-s", "r0", PROXY_CONFIG_PUSHED)
        })
        .await;
        assert_eq!(
            (&refused["status"], &refused["reason"]),
            (&json!("False"), &json!("RuleRefused"))
        );
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("has no room for the regexes of rule tenant-s/r0/0")
                && message.contains("matches[0].path: the document's regexes take"),
            "{message}"
        );
        let now = served().await;
        assert!(
            !now.iter().any(|n| n == "tenant-s/r0/0") && now.contains(&last),
            "{now:?}"
        );
        for i in 1..fit {
            assert!(
                route_condition(&api, "tenant-s", &format!("r{i}"), PROXY_CONFIG_PUSHED).is_none(),
                "r{i} is served"
            );
        }
        stop_controller(stop, controller).await;
    })
    .await
    .expect("in time");
}

/// An API server holding our GatewayClass, [`shared_seed`] for the pool at `pool` and
/// `backend`, and `more`; and the controller against it, serving that pool (no Deployment of
/// its own to stamp), with rounds every 100 ms, stopped through the sender.
async fn on_the_pool(
    pool: SocketAddr,
    backend: SocketAddr,
    more: &str,
) -> (
    ApiServer,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let api = pool_api(pool, backend, more).await;
    let (stop, controller, _) = pool_controller(&api);
    (api, stop, controller)
}

/// The API server of [`on_the_pool`], without the controller.
async fn pool_api(pool: SocketAddr, backend: SocketAddr, more: &str) -> ApiServer {
    ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: cloudflare-tunnel}}\nspec: {{controllerName: {CONTROLLER}}}\n{}{more}",
            shared_seed(pool, backend)
        ))
        .start()
        .await
}

/// Waits for the CORS route's refusal to name `pod` (found again by another pod), then five
/// more of the controller's rounds, and checks no second `ProxyRuleRefused` went out and the
/// route's status was never written without the refusal meanwhile (`dropped`, from
/// [`written_without`]).
async fn refused_again_by(
    api: &ApiServer,
    health: &runtime::health::Health,
    pod: SocketAddr,
    dropped: &std::sync::atomic::AtomicBool,
) {
    eventually("the refusal of the pod named", || {
        route_condition(api, "tenant-s", "cors", PROXY_CONFIG_PUSHED).filter(|c| {
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains(&pod.to_string()))
        })
    })
    .await;
    rounds_later(health, 5).await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the route's status was written without the refusal"
    );
    assert_eq!(rule_refusals_told(api), 1, "told once");
}

/// Waits for the CORS route to be told, once, that a rule of it was refused (its condition,
/// and one `ProxyRuleRefused`), and returns the condition.
async fn cors_refused_and_told(api: &ApiServer) -> Value {
    let refused = eventually("ProxyConfigPushed=False on the CORS route", || {
        route_condition(api, "tenant-s", "cors", PROXY_CONFIG_PUSHED)
    })
    .await;
    eventually("a ProxyRuleRefused Event", || {
        (rule_refusals_told(api) == 1).then_some(())
    })
    .await;
    refused
}

/// A counter's value on the controller's `/metrics`, 0 before it is first counted: `name` with
/// its labels (`cftunnel_controller_rounds_total`).
fn counted(health: &runtime::health::Health, name: &str) -> u64 {
    let text = health.metrics_text().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Failed pushes to `plane`'s pods so far (`shared`, `tenant-a/edge`).
fn push_failures(health: &runtime::health::Health, plane: &str) -> u64 {
    let name = format!("cftunnel_controller_push_failures_total{{plane=\"{plane}\"}}");
    counted(health, &name)
}

/// Waits for `n` more of the controller's rounds: a window in which nothing more may happen.
async fn rounds_later(health: &runtime::health::Health, n: u64) {
    let rounds = || counted(health, "cftunnel_controller_rounds_total");
    let from = rounds();
    eventually("the controller's rounds", || {
        (rounds() >= from + n).then_some(())
    })
    .await;
}

/// Watches, for as long as the returned guard lives, for a write of route `route`'s status
/// without `word` in it: the flag is set once one is made (the write itself goes ahead).
fn written_without(
    api: &ApiServer,
    route: &'static str,
    word: &'static str,
) -> (Arc<std::sync::atomic::AtomicBool>, Forbid) {
    let written = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&written);
    let watching = api.forbid(move |c| {
        let ours = c.method == "PATCH" && c.kind == "HTTPRoute" && c.name == Some(route);
        if ours && !c.body.to_string().contains(word) {
            flag.store(true, Ordering::SeqCst);
        }
        false
    });
    (written, watching)
}

/// The pool's pod, the current release, behind an older release (one that refuses CORS
/// filters) at the address the pool's slice lists, and `tenant-s`'s echo backend.
async fn older_pool() -> (EchoServer, Server, OlderProxy) {
    let echo = support::echo("tenant-s", "web-s").await;
    let pool = proxy_pod("pool-secret").await;
    let older = OlderProxy::start(pool.admin_addr())
        .await
        .expect("the older pod starts");
    (echo, pool, older)
}

/// Stops a controller (`stop` its stop signal, `controller` its task), and waits for it to end
/// cleanly.
async fn stop_controller(
    stop: tokio::sync::oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let _ = stop.send(());
    controller
        .await
        .expect("task")
        .expect("the controller stops cleanly");
}

/// A controller against `api` serving the pool of [`on_the_pool`], stopped through the sender,
/// and its health (its metrics).
fn pool_controller(
    api: &ApiServer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
    std::sync::Arc<runtime::health::Health>,
) {
    pool_controller_tuned(api, |_| {})
}

/// [`pool_controller`], `tune` changing its options.
fn pool_controller_tuned(
    api: &ApiServer,
    tune: impl FnOnce(&mut RuntimeOptions),
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
    std::sync::Arc<runtime::health::Health>,
) {
    let options = RuntimeOptions {
        resync: Duration::from_millis(100),
        shared: Some(SharedPlane {
            service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
            auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
            auth_key: "token".to_owned(),
            tunnel_secret: None,
            deployment: None,
        }),
        ..RuntimeOptions::default()
    };
    let mut options = options;
    tune(&mut options);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let health = std::sync::Arc::new(runtime::health::Health::default());
    let controller = tokio::spawn(runtime::run(
        api.client(),
        options,
        std::sync::Arc::clone(&health),
        async {
            let _ = stopped.await;
        },
    ));
    (stop, controller, health)
}

/// Condition `kind` of GatewayConfig `edge-config`'s status, and its `observedGeneration`.
fn config_condition(api: &ApiServer, kind: &str) -> Option<(Value, Value)> {
    let config = api.get(
        "cf.k8s.lex.la/v1alpha1",
        "GatewayConfig",
        "tenant-a",
        "edge-config",
    )?;
    let condition = condition(config.pointer("/status/conditions")?, kind)?.clone();
    Some((
        condition,
        config.pointer("/status/observedGeneration")?.clone(),
    ))
}

/// A GatewayConfig says, through its status subresource, which Gateways use it and whether
/// their planes render from it: when one does not, with the very message the Gateway's
/// `Accepted=False` (`InvalidParameters`) carries. The status is written when that changes,
/// not every round.
#[tokio::test]
async fn a_gateway_config_reports_the_gateways_using_it_and_whether_it_renders() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let status_is = |kind: &'static str, status: &'static str| {
            let api = &t.api;
            move || config_condition(api, kind).filter(|(c, _)| c["status"] == status)
        };
        let (in_use, observed) = eventually("InUse=True", status_is("InUse", "True")).await;
        assert_eq!(
            (&in_use["reason"], &in_use["message"]),
            (&json!("Referenced"), &json!("used by Gateway edge"))
        );
        let generation = t
            .api
            .get("cf.k8s.lex.la/v1alpha1", "GatewayConfig", "tenant-a", "edge-config")
            .and_then(|c| c.pointer("/metadata/generation").cloned());
        assert_eq!(Some(&observed), generation.as_ref());
        let (rendered, _) = eventually("Rendered=True", status_is("Rendered", "True")).await;
        assert_eq!(
            rendered["message"],
            json!("the data plane of Gateway edge renders")
        );
        // Rounds go on (every 100 ms here); no GatewayConfig's status is written again. The
        // other tenants' are written after this one's in the same round: counted from there.
        eventually("every GatewayConfig's Rendered", || {
            [
                ("tenant-a", "edge-config"),
                ("tenant-b", "other-config"),
                ("tenant-c", "third-config"),
            ]
            .iter()
            .map(|(namespace, name)| {
                let config = t.api.get("cf.k8s.lex.la/v1alpha1", "GatewayConfig", namespace, name)?;
                condition(config.pointer("/status/conditions")?, "Rendered").map(|_| ())
            })
            .collect::<Option<Vec<()>>>()
        })
        .await;
        let rv = t.api.resource_version();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let rewritten: Vec<String> = t
            .api
            .writes_since(rv)
            .into_iter()
            .filter(|w| w.contains("gatewayconfigs"))
            .collect();
        assert_eq!(rewritten, Vec::<String>::new());

        // Its config-API token Secret is missing: not rendered, saying what the Gateway says.
        t.api.put(yaml("apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec: {tunnelTokenSecretRef: {name: edge-tunnel-token}, authTokenSecretRef: {name: missing}}\n"));
        let (broken, observed) =
            eventually("Rendered=False", status_is("Rendered", "False")).await;
        let generation = t
            .api
            .get("cf.k8s.lex.la/v1alpha1", "GatewayConfig", "tenant-a", "edge-config")
            .and_then(|c| c.pointer("/metadata/generation").cloned());
        assert_eq!(broken["reason"], "InvalidParameters");
        let accepted = eventually("the Gateway's InvalidParameters", || {
            t.api
                .get("gateway.networking.k8s.io/v1", "Gateway", "tenant-a", "edge")
                .and_then(|g| condition(g.pointer("/status/conditions")?, "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        assert_eq!(broken["message"], accepted["message"]);
        assert!(
            broken["message"]
                .as_str()
                .is_some_and(|m| m.contains("Secret tenant-a/missing")),
            "{broken}"
        );
        assert_eq!(Some(observed), generation, "the generation edited");

        // Back on the shared plane: no Gateway uses it.
        t.api.put(yaml(&gateway(false)));
        let (unused, _) = eventually("InUse=False", status_is("InUse", "False")).await;
        assert_eq!(unused["reason"], "NotReferenced");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The objects the Go controller of the same API group rendered for a Gateway, shaped as its
/// renderer makes them: its selector and labels, its port names, its NetworkPolicy under
/// `-netpol`, its autoscaler on the metric its GatewayConfig names, its generated Secret with
/// the token under `auth-token`; each controlled by the Gateway `uid`.
fn go_controller_plane(uid: &str) -> Vec<Value> {
    let owner = format!(
        "[{{apiVersion: gateway.networking.k8s.io/v1, kind: Gateway, name: edge, uid: {uid}, controller: true, blockOwnerDeletion: true}}]"
    );
    let labels = "{app.kubernetes.io/name: cloudflare-tunnel-gateway-proxy, cf.k8s.lex.la/gateway: edge, app.kubernetes.io/component: proxy, app.kubernetes.io/managed-by: cloudflare-tunnel-gateway-controller, gateway.networking.k8s.io/gateway-name: edge, gateway.networking.k8s.io/gateway-class-name: cloudflare-tunnel}";
    let selector =
        "{app.kubernetes.io/name: cloudflare-tunnel-gateway-proxy, cf.k8s.lex.la/gateway: edge}";
    let meta = |name: &str| {
        format!("{{name: {name}, namespace: tenant-a, labels: {labels}, ownerReferences: {owner}}}")
    };
    [
        format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {meta}
spec:
  replicas: 3
  selector: {{matchLabels: {selector}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 25%, maxSurge: 25%}}}}
  revisionHistoryLimit: 10
  progressDeadlineSeconds: 600
  template:
    metadata:
      labels: {labels}
      annotations: {{cf.k8s.lex.la/tunnel-token-hash: aa, cf.k8s.lex.la/auth-token-hash: bb}}
    spec:
      terminationGracePeriodSeconds: 45
      automountServiceAccountToken: false
      securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}
      containers:
      - name: proxy
        image: ghcr.io/lexfrei/cloudflare-tunnel-gateway-controller-proxy:v1
        imagePullPolicy: IfNotPresent
        env:
        - {{name: TUNNEL_TOKEN, valueFrom: {{secretKeyRef: {{name: edge-tunnel-token, key: tunnel-token}}}}}}
        - {{name: PROXY_AUTH_TOKEN, valueFrom: {{secretKeyRef: {{name: cf-proxy-edge-auth, key: auth-token}}}}}}
        ports:
        - {{name: config-api, containerPort: 8081, protocol: TCP}}
        - {{name: proxy, containerPort: 8080, protocol: TCP}}
        startupProbe: {{httpGet: {{path: /healthz, port: config-api, scheme: HTTP}}, periodSeconds: 5, timeoutSeconds: 3, failureThreshold: 30, successThreshold: 1}}
"#,
            meta = meta("cf-proxy-edge")
        ),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {meta}\nspec:\n  type: ClusterIP\n  clusterIP: None\n  publishNotReadyAddresses: true\n  selector: {selector}\n  ports: [{{name: config-api, port: 8081, targetPort: config-api, protocol: TCP}}]\n",
            meta = meta("cf-proxy-edge-config")
        ),
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {meta}\nspec:\n  podSelector: {{matchLabels: {selector}}}\n  policyTypes: [Ingress]\n  ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: cftunnel-system}}}}}}], ports: [{{protocol: TCP, port: 8081}}]}}]\n",
            meta = meta("cf-proxy-edge-netpol")
        ),
        format!(
            "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {meta}\nspec:\n  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: cf-proxy-edge}}\n  minReplicas: 2\n  maxReplicas: 4\n  metrics: [{{type: Pods, pods: {{metric: {{name: go_inflight}}, target: {{type: AverageValue, averageValue: '20'}}}}}}]\n",
            meta = meta("cf-proxy-edge")
        ),
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: cf-proxy-edge-auth, namespace: tenant-a, ownerReferences: {owner}}}\nstringData: {{auth-token: go-token}}\n"
        ),
    ]
    .iter()
    .map(|text| yaml(text))
    .collect()
}

/// Moving from the Go controller, with its GatewayConfig and the plane it rendered left as
/// they are: its Service, autoscaler and token Secret are taken over in place (the token kept,
/// under its `auth-token` key, which the pods now read), its Deployment, whose selector cannot
/// change into ours, is replaced at the count its autoscaler had reached, and its NetworkPolicy,
/// under a name ours does not share and admitting every pod of the controller's namespace,
/// goes once ours is in place. The autoscaler keeps the metric the GatewayConfig names. No
/// step fails the render.
#[tokio::test]
async fn a_plane_the_go_controller_rendered_is_taken_over_as_it_is() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut go_uids = Vec::new();
        let t = Tenant::start_with("replicas: 1", |api| {
            api.put(yaml("apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: edge-config, namespace: tenant-a}\nspec:\n  tunnelTokenSecretRef: {name: edge-tunnel-token}\n  autoscaling: {maxReplicas: 4, targetInflightPerPod: 20, metricName: go_inflight}\n"));
            let gateway = api
                .get("gateway.networking.k8s.io/v1", "Gateway", "tenant-a", "edge")
                .expect("the Gateway");
            let uid = gateway["metadata"]["uid"].as_str().expect("a uid").to_owned();
            for object in go_controller_plane(&uid) {
                let stored = api.put(object);
                go_uids.push((
                    stored["kind"].as_str().unwrap_or_default().to_owned(),
                    stored["metadata"]["uid"].clone(),
                ));
            }
        })
        .await;
        let go_uid = |kind: &str| {
            go_uids
                .iter()
                .find(|(k, _)| k == kind)
                .map(|(_, uid)| uid.clone())
                .expect("seeded")
        };
        let get = |api_version: &str, kind: &str, name: &str| {
            t.api.get(api_version, kind, "tenant-a", name)
        };

        let deployment = eventually("the Deployment replaced", || {
            get("apps/v1", "Deployment", "cf-proxy-edge")
                .filter(|d| d["metadata"]["uid"] != go_uid("Deployment"))
        })
        .await;
        assert_eq!(
            deployment.pointer("/spec/selector/matchLabels/app.kubernetes.io~1name"),
            Some(&json!("cftunnel-proxy"))
        );
        assert_eq!(
            deployment.pointer("/spec/replicas"),
            Some(&json!(3)),
            "the count the autoscaler had reached"
        );
        let auth = deployment
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Value::as_array)
            .and_then(|env| env.iter().find(|e| e["name"] == "PROXY_AUTH_TOKEN"))
            .map(|e| e["valueFrom"]["secretKeyRef"].clone());
        assert_eq!(
            auth,
            Some(json!({"name": "cf-proxy-edge-auth", "key": "auth-token"}))
        );
        let ports = deployment.pointer("/spec/template/spec/containers/0/ports");
        assert_eq!(
            ports,
            Some(&json!([{"name": "config", "containerPort": 8081, "protocol": "TCP"}]))
        );

        eventually("the Go controller's NetworkPolicy gone", || {
            get("networking.k8s.io/v1", "NetworkPolicy", "cf-proxy-edge-netpol")
                .is_none()
                .then_some(())
        })
        .await;
        assert!(get("networking.k8s.io/v1", "NetworkPolicy", "cf-proxy-edge").is_some());

        let service = get("v1", "Service", "cf-proxy-edge-config").expect("the Service");
        assert_eq!(service["metadata"]["uid"], go_uid("Service"), "taken over");
        assert_eq!(service.pointer("/spec/ports/0/name"), Some(&json!("config")));
        assert_eq!(
            service.pointer("/spec/selector/app.kubernetes.io~1name"),
            Some(&json!("cftunnel-proxy"))
        );
        let autoscaler = get("autoscaling/v2", "HorizontalPodAutoscaler", "cf-proxy-edge")
            .expect("the autoscaler");
        assert_eq!(autoscaler["metadata"]["uid"], go_uid("HorizontalPodAutoscaler"));
        assert_eq!(
            autoscaler.pointer("/spec/metrics/0/pods/metric/name"),
            Some(&json!("go_inflight"))
        );
        let secret = get("v1", "Secret", "cf-proxy-edge-auth").expect("the Secret");
        assert_eq!(secret["metadata"]["uid"], go_uid("Secret"));
        assert_eq!(secret["data"], json!({"auth-token": "Z28tdG9rZW4="}), "its token kept");

        let accepted = eventually("Accepted", || {
            get("gateway.networking.k8s.io/v1", "Gateway", "edge")
                .and_then(|g| condition(g.pointer("/status/conditions")?, "Accepted").cloned())
        })
        .await;
        assert_eq!(accepted["status"], "True", "{accepted}");
        assert!(
            !t.api
                .list("Event")
                .iter()
                .any(|e| e["reason"] == "RenderFailed" && e["regarding"]["name"] == "edge"),
            "no render failed"
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Waits at most `seconds` for `check` to give a value.
async fn within<T>(seconds: u64, what: &str, check: impl FnMut() -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(seconds), eventually(what, check))
        .await
        .unwrap_or_else(|_| panic!("{what} within {seconds} s"))
}

/// A user opens the rendered NetworkPolicy to every namespace on the config port, and changes
/// the Deployment's image: each edit is restored within seconds by the round its watch event
/// starts, with no resync due (it is a minute here) and no periodic re-apply.
#[tokio::test]
async fn edits_that_depart_from_the_render_are_restored_within_seconds() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_tuned(
            "replicas: 2",
            |_| {},
            ApiServer::client,
            |options| options.resync = Duration::from_secs(60),
        )
        .await;
        let policy_spec = || {
            t.api
                .get(
                    "networking.k8s.io/v1",
                    "NetworkPolicy",
                    "tenant-a",
                    "cf-proxy-edge",
                )
                .and_then(|p| p.get("spec").cloned())
        };
        let image = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| d.pointer("/spec/template/spec/containers/0/image").cloned())
        };
        let rendered = eventually("the NetworkPolicy", policy_spec).await;
        eventually("the Deployment", image).await;

        let as_user = PatchParams {
            field_manager: Some("kubectl-edit".to_owned()),
            ..PatchParams::default()
        };
        let policies: Api<NetworkPolicy> = Api::namespaced(t.api.user_client(), "tenant-a");
        let opened = json!({"spec": {"ingress": [{
            "from": [{"namespaceSelector": {}}],
            "ports": [{"port": 8081, "protocol": "TCP"}],
        }]}});
        policies
            .patch("cf-proxy-edge", &as_user, &Patch::Merge(&opened))
            .await
            .expect("opened");
        within(5, "the NetworkPolicy restored", || {
            policy_spec().filter(|spec| *spec == rendered)
        })
        .await;

        let deployments: Api<Deployment> = Api::namespaced(t.api.user_client(), "tenant-a");
        let mut edited = deployments.get("cf-proxy-edge").await.expect("read");
        if let Some(container) = edited
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|p| p.containers.first_mut())
        {
            container.image = Some("someone-else:1".to_owned());
        }
        deployments
            .replace("cf-proxy-edge", &PostParams::default(), &edited)
            .await
            .expect("edited");
        within(5, "the image restored", || {
            image().filter(|i| *i == json!("proxy:1"))
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Once a plane is applied and nothing changes, a round costs no API call for it: the watch
/// caches hold what was applied, so nothing is read and nothing written, round after round.
#[tokio::test]
async fn an_unchanged_plane_costs_no_api_calls_per_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        // Without the Deployment of someone else's that fails the seed's other plane every
        // round: that plane is applied as well.
        let t = Tenant::start_with("autoscaling: {minReplicas: 2, maxReplicas: 4}", |api| {
            api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
        })
        .await;
        eventually("the autoscaler", || {
            t.api.get(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                "tenant-a",
                "cf-proxy-edge",
            )
        })
        .await;
        // Settled: no write for half a second (rounds run every 100 ms).
        loop {
            let rv = t.api.resource_version();
            tokio::time::sleep(Duration::from_millis(500)).await;
            if t.api.writes_since(rv).is_empty() {
                break;
            }
        }
        let kinds = [
            "Deployment",
            "Service",
            "NetworkPolicy",
            "HorizontalPodAutoscaler",
            "Secret",
        ];
        let reads = || kinds.map(|k| t.api.accepts(k).len());
        let (before, rv) = (reads(), t.api.resource_version());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(reads(), before, "no reads of {kinds:?}");
        assert_eq!(t.api.writes_since(rv), Vec::<String>::new(), "no writes");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Waits until the API server has taken no write for half a second: the controller's rounds
/// have settled.
async fn settled(api: &ApiServer) {
    loop {
        let rv = api.resource_version();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if api.writes_since(rv).is_empty() {
            return;
        }
    }
}

/// A loopback address that answers every request 503, as a pod's config port does while its
/// container starts behind a port already open (a sidecar's, a node's), and a channel told of
/// each request. Aborting the task frees the port.
async fn unavailable() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (calls, called) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = conn
                .write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            let _ = calls.send(());
        }
    });
    (addr, called, task)
}

/// A pod listed before its config API is up (a new or restarted pod: its EndpointSlice entry
/// appears, not ready, as its container starts) fails its pushes; once it is up it gets its
/// config within seconds, with nothing in the cluster changing meanwhile and no resync due (a
/// minute here). Its EndpointSlice entry would change only once it is ready, which it becomes
/// only with a config: a rollout's new pods would serve nothing until the resync.
#[tokio::test]
async fn a_pod_whose_pushes_failed_gets_its_config_within_seconds_of_coming_up() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (addr, mut asked, standing_in) = unavailable().await;
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                // Its plane applies, so its statuses settle.
                api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    addr.port(),
                    false,
                ));
            },
            ApiServer::client,
            |options| {
                options.resync = Duration::from_secs(60);
                // No condition written for the failures: no write starts another round.
                options.sustained_after = u32::MAX;
            },
        )
        .await;
        asked.recv().await.expect("a push reaches the pod");
        settled(&t.api).await;
        standing_in.abort();
        let _ = standing_in.await;
        let up = Instant::now();
        let pod = Server::start(
            ServerOptions {
                auth_token: Some("s3cr3t".to_owned()),
                admin_addr: addr,
                ..ServerOptions::default()
            },
            None,
        )
        .await
        .expect("the pod's proxy starts on its port");
        tokio::time::timeout(Duration::from_secs(10), shop_serves(&pod, 200))
            .await
            .expect("the pod serves its routes within seconds of coming up");
        eprintln!("the pod got its config {:?} after coming up", up.elapsed());
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Deployment carrying the labels of a Gateway's plane in its namespace that the Gateway does
/// not control (left by a Gateway deleted with `--cascade=orphan`, or a copy) is no plane of
/// the Gateway's left to remove: a Gateway on the shared plane costs no reads for it round
/// after round, and it is left alone.
#[tokio::test]
async fn a_labelled_deployment_the_gateway_does_not_control_costs_no_reads_per_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_with("replicas: 1", |api| {
            api.delete("apps/v1", "Deployment", "tenant-b", "cf-proxy-other");
            api.put(yaml(&gateway(false)));
            api.put(yaml(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: cf-proxy-edge, namespace: tenant-a, labels: {app.kubernetes.io/managed-by: cftunnel-controller, cf.k8s.lex.la/gateway: edge}}\nspec:\n  selector: {matchLabels: {app: leftover}}\n  template:\n    metadata: {labels: {app: leftover}}\n    spec: {containers: [{name: proxy, image: proxy:0}]}\n",
            ));
        })
        .await;
        let leftover = || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .map(|d| d["metadata"]["resourceVersion"].clone())
        };
        let version = leftover().expect("the leftover Deployment");
        eventually("the Gateway's status", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
        })
        .await;
        settled(&t.api).await;
        let kinds = [
            "Deployment",
            "Service",
            "NetworkPolicy",
            "HorizontalPodAutoscaler",
            "Secret",
        ];
        let reads = || kinds.map(|k| t.api.accepts(k).len());
        let before = reads();
        // Rounds run every 100 ms.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(reads(), before, "no reads of {kinds:?}");
        assert_eq!(leftover(), Some(version), "the leftover is left alone");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Our entry for Gateway tenant-a/edge in the ancestors of BackendTLSPolicy `name`.
fn policy_ancestor(api: &ApiServer, name: &str) -> Option<Value> {
    let policy = api.get(
        "gateway.networking.k8s.io/v1",
        "BackendTLSPolicy",
        "tenant-a",
        name,
    )?;
    policy
        .pointer("/status/ancestors")?
        .as_array()?
        .iter()
        .find(|a| a["controllerName"] == CONTROLLER)
        .cloned()
}

fn backend_tls_policy(name: &str, service: &str) -> Value {
    yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: tenant-a}}\nspec:\n  targetRefs: [{{group: \"\", kind: Service, name: {service}}}]\n  validation: {{caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: web-ca}}], hostname: web.tenant-a.internal}}\n"
    ))
}

/// A BackendTLSPolicy on the Service the tenant's route uses gets the Gateway as its ancestor,
/// with conditions that follow its CA ConfigMap; a second policy on the same Service is
/// `Conflicted`; another controller's ancestor entry stays; and when the route no longer uses
/// the Service, our entry goes.
#[tokio::test]
async fn a_backend_tls_policy_gets_its_gateway_as_ancestor() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let ca = cftunnel_testkit::pki::TestPki::for_names(&["web"]).expect("pki");
        let t = Tenant::start_with("replicas: 1", |api| {
            let mut first = backend_tls_policy("a-first", "web");
            first["status"] = json!({"ancestors": [{
                "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "tenant-a", "name": "edge"},
                "controllerName": "example.com/other",
                "conditions": [],
            }]});
            api.put(first);
        })
        .await;
        let state = |name: &str| {
            let ancestor = policy_ancestor(&t.api, name)?;
            let accepted = condition(&ancestor["conditions"], "Accepted")?;
            let resolved = condition(&ancestor["conditions"], "ResolvedRefs")?;
            Some((
                ancestor["ancestorRef"]["name"].as_str()?.to_owned(),
                accepted["reason"].as_str()?.to_owned(),
                resolved["reason"].as_str()?.to_owned(),
            ))
        };
        let triple = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());

        // The CA ConfigMap is missing: the policy cannot be used.
        let got = eventually("the policy's ancestor", || {
            state("a-first").filter(|s| s.1 == "NoValidCACertificate")
        })
        .await;
        assert_eq!(
            got,
            triple("edge", "NoValidCACertificate", "InvalidCACertificateRef")
        );
        let message = policy_ancestor(&t.api, "a-first")
            .and_then(|a| condition(&a["conditions"], "ResolvedRefs").cloned())
            .map(|c| c["message"].clone());
        assert_eq!(
            message,
            Some(json!(
                "spec.validation.caCertificateRefs[0]: ConfigMap tenant-a/web-ca not found"
            ))
        );

        let ca_pem: String = ca.ca_pem().lines().map(|l| format!("    {l}\n")).collect();
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: web-ca, namespace: tenant-a}}\ndata:\n  ca.crt: |\n{ca_pem}"
        )));
        t.api.put(backend_tls_policy("b-second", "web"));
        eventually("accepted once the ConfigMap exists", || {
            state("a-first").filter(|s| *s == triple("edge", "Accepted", "ResolvedRefs"))
        })
        .await;
        eventually("the second policy conflicted", || {
            state("b-second").filter(|s| s.1 == "Conflicted")
        })
        .await;
        let policy = t
            .api
            .get(
                "gateway.networking.k8s.io/v1",
                "BackendTLSPolicy",
                "tenant-a",
                "a-first",
            )
            .expect("policy");
        let controllers: Vec<&str> = policy
            .pointer("/status/ancestors")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a["controllerName"].as_str())
            .collect();
        assert_eq!(controllers, ["example.com/other", CONTROLLER]);

        // The route moves to another Service: the policies apply to no Gateway of ours.
        t.api.put(yaml(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: elsewhere, port: 80}]}]\n",
        ));
        eventually("our ancestor entries removed", || {
            (policy_ancestor(&t.api, "a-first").is_none()
                && policy_ancestor(&t.api, "b-second").is_none())
            .then_some(())
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A route that repeats an older route's match on the same host is accepted but never serves
/// it: it says so (`cf.k8s.lex.la/RouteShadowed`) and a Warning Event tells its owner, once.
#[tokio::test]
async fn a_route_an_older_route_shadows_is_told_so() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        t.api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop-copy, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n"));
        let shadowed = eventually("shop-copy: RouteShadowed", || {
            route_condition(&t.api, "tenant-a", "shop-copy", "cf.k8s.lex.la/RouteShadowed")
        })
        .await;
        assert_eq!(
            (&shadowed["status"], &shadowed["reason"]),
            (&json!("True"), &json!("OlderRouteMatches"))
        );
        let message = shadowed["message"].as_str().unwrap_or_default();
        assert!(message.contains("HTTPRoute tenant-a/shop serves"), "{message}");
        assert!(
            route_condition(&t.api, "tenant-a", "shop", "cf.k8s.lex.la/RouteShadowed").is_none(),
            "the older route is not shadowed"
        );
        let events = || {
            t.api
                .list("Event")
                .into_iter()
                .filter(|e| {
                    e["reason"] == "RouteShadowed"
                        && e.pointer("/regarding/name") == Some(&json!("shop-copy"))
                })
                // A repeated Event is one object with a series count.
                .map(|e| e.pointer("/series/count").and_then(Value::as_u64).unwrap_or(1))
                .sum::<u64>()
        };
        eventually("a RouteShadowed Event", || (events() > 0).then_some(())).await;
        // Rounds go on (every 100 ms here); the Event is not repeated.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(events(), 1);
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Gateway edge of tenant-a (on its dedicated plane) admitting ListenerSets of its namespace,
/// the ListenerSet `team` there with listener `team.example.com`, and the ListenerSet
/// `outsider` of tenant-b on the same Gateway with `outsider.example.com`, each with a route.
fn listener_sets(set_kind: &str) -> Vec<Value> {
    let (api_version, kind) = match set_kind {
        "XListenerSet" => ("gateway.networking.x-k8s.io/v1alpha1", "XListenerSet"),
        _ => ("gateway.networking.k8s.io/v1", "ListenerSet"),
    };
    let set = |namespace: &str, name: &str, hostname: &str| {
        yaml(&format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  parentRef: {{name: edge, namespace: tenant-a}}\n  listeners: [{{name: web, port: 80, protocol: HTTP, hostname: {hostname}}}]\n"
        ))
    };
    let route = |namespace: &str, name: &str, set: &str| {
        yaml(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: {set}, sectionName: web}}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
        ))
    };
    vec![
        yaml(&gateway(true).replace(
            "  listeners:",
            "  allowedListeners: {namespaces: {from: Same}}\n  listeners:",
        )),
        set("tenant-a", "team", "team.example.com"),
        route("tenant-a", "team-app", "team"),
        set("tenant-b", "outsider", "outsider.example.com"),
        route("tenant-b", "outsider-app", "outsider"),
    ]
}

/// The ListenerSet's condition `kind`, once its status has one.
fn listener_set_condition(
    api: &ApiServer,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    condition_kind: &str,
) -> Option<Value> {
    let set = api.get(api_version, kind, namespace, name)?;
    condition(&set["status"]["conditions"], condition_kind).cloned()
}

/// A route attached to a ListenerSet the Gateway admits is served by the Gateway's plane (a
/// real proxy) on the ListenerSet listener's hostname, which the tunnel's ingress document
/// publishes beside the Gateway's own; a ListenerSet the Gateway does not admit (another
/// namespace, `from: Same`) serves and publishes nothing, and both say so in their status.
#[tokio::test]
async fn a_route_on_an_admitted_listener_set_is_served_and_published() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let cloudflare = CloudflareApi::start().await;
        cloudflare.allow("acct", "cf-token-a");
        let edge = proxy_pod("s3cr3t").await;
        let outsider_echo = support::echo("tenant-b", "web-b").await;
        let t = Tenant::start_tuned(
            "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
            |api| {
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
                for doc in support::web_service("tenant-b", outsider_echo.http_addr()).split("---")
                {
                    if !doc.trim().is_empty() {
                        api.put(yaml(doc));
                    }
                }
                for object in listener_sets("ListenerSet") {
                    api.put(object);
                }
            },
            ApiServer::client,
            |options| {
                options.cloudflare_api_base = cloudflare.base();
                options.cloudflare_api_token = Some("cf-token-a".to_owned());
            },
        )
        .await;
        let serves = |host: &'static str, status: u16| {
            let data = edge.data_addr();
            async move {
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
        };
        serves("team.example.com", 200).await;
        serves("shop.example.com", 200).await;
        let want = json!({"ingress": [
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"hostname": "team.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually(
            "the tunnel's document lists the ListenerSet's hostname",
            || {
                cloudflare
                    .config("acct", TUNNEL_ID)
                    .filter(|(_, d)| *d == want)
            },
        )
        .await;
        // Not admitted: nothing served on its hostname.
        assert_eq!(get_via(edge.data_addr(), "outsider.example.com").await, 404);

        const V1: &str = "gateway.networking.k8s.io/v1";
        let accepted = eventually("team Accepted", || {
            listener_set_condition(&t.api, V1, "ListenerSet", "tenant-a", "team", "Accepted")
                .filter(|c| c["status"] == "True")
        })
        .await;
        assert_eq!(accepted["reason"], "Accepted");
        let refused = eventually("outsider refused", || {
            listener_set_condition(
                &t.api,
                V1,
                "ListenerSet",
                "tenant-b",
                "outsider",
                "Accepted",
            )
        })
        .await;
        assert_eq!(
            (refused["status"].as_str(), refused["reason"].as_str()),
            (Some("False"), Some("NotAllowed"))
        );
        let team = t
            .api
            .get(V1, "ListenerSet", "tenant-a", "team")
            .expect("team");
        assert_eq!(
            team.pointer("/status/listeners/0/attachedRoutes"),
            Some(&json!(1))
        );
        let edge_gateway = eventually("attachedListenerSets", || {
            t.api
                .get(V1, "Gateway", "tenant-a", "edge")
                .filter(|g| g.pointer("/status/attachedListenerSets").is_some())
        })
        .await;
        assert_eq!(edge_gateway["status"]["attachedListenerSets"], 1);
        let parent = eventually("team-app's parent", || {
            route_parent(&t.api, "tenant-a", "team-app")
        })
        .await;
        assert_eq!(parent["parentRef"]["kind"], "ListenerSet");
        assert_eq!(
            condition(&parent["conditions"], "Accepted").map(|c| c["status"].clone()),
            Some(json!("True"))
        );
        let parent = eventually("outsider-app's parent", || {
            route_parent(&t.api, "tenant-b", "outsider-app")
        })
        .await;
        assert_eq!(
            condition(&parent["conditions"], "Accepted").map(|c| c["reason"].clone()),
            Some(json!("NoMatchingParent"))
        );

        // The Gateway admits every namespace: the outsider is served and published too.
        t.api.put(yaml(&gateway(true).replace(
            "  listeners:",
            "  allowedListeners: {namespaces: {from: All}}\n  listeners:",
        )));
        serves("outsider.example.com", 200).await;
        let want = json!({"ingress": [
            {"hostname": "outsider.example.com", "service": "http://localhost:8080"},
            {"hostname": "shop.example.com", "service": "http://localhost:8080"},
            {"hostname": "team.example.com", "service": "http://localhost:8080"},
            {"service": "http_status:404"},
        ]});
        eventually("the document lists the admitted outsider", || {
            cloudflare
                .config("acct", TUNNEL_ID)
                .filter(|(_, d)| *d == want)
        })
        .await;

        // The Gateway goes: its ListenerSets no longer say they are accepted.
        assert!(t.api.delete(V1, "Gateway", "tenant-a", "edge"));
        for (namespace, name) in [("tenant-a", "team"), ("tenant-b", "outsider")] {
            let gone = eventually("ListenerSet no longer accepted", || {
                listener_set_condition(&t.api, V1, "ListenerSet", namespace, name, "Accepted")
                    .filter(|c| c["status"] == "False")
            })
            .await;
            assert_eq!(gone["reason"], "ParentNotAccepted", "{namespace}/{name}");
            let set = t.api.get(V1, "ListenerSet", namespace, name).expect("set");
            assert_eq!(
                set.pointer("/status/listeners"),
                Some(&json!([])),
                "{namespace}/{name}: {set}"
            );
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Where the Gateway API CRDs predate v1.5, ListenerSets are the experimental `XListenerSet`:
/// discovery finds it, its listeners serve, and its status is written there, with each
/// listener's port as that version requires.
#[tokio::test]
async fn an_experimental_xlistenerset_is_read_and_reported_where_no_listener_set_is_served() {
    tokio::time::timeout(Duration::from_secs(60), async {
        const X: &str = "gateway.networking.x-k8s.io/v1alpha1";
        let t = Tenant::start_with("replicas: 1", |api| {
            api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
            for object in listener_sets("XListenerSet") {
                api.put(object);
            }
        })
        .await;
        let accepted = eventually("team Accepted", || {
            listener_set_condition(&t.api, X, "XListenerSet", "tenant-a", "team", "Accepted")
                .filter(|c| c["status"] == "True")
        })
        .await;
        assert_eq!(accepted["reason"], "Accepted");
        let team = t
            .api
            .get(X, "XListenerSet", "tenant-a", "team")
            .expect("team");
        assert_eq!(team.pointer("/status/listeners/0/port"), Some(&json!(80)));
        assert_eq!(
            team.pointer("/status/listeners/0/attachedRoutes"),
            Some(&json!(1))
        );
        // Written once the plane is applied: later rounds find it as they would write it.
        eventually("the plane applied", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        t.rounds(2, Duration::from_millis(300)).await;
        let rv = t.api.resource_version();
        t.rounds(3, Duration::from_millis(300)).await;
        let rewrites: Vec<String> = t
            .api
            .writes_since(rv)
            .into_iter()
            .filter(|w| w.contains("xlistenersets"))
            .collect();
        assert_eq!(rewrites, Vec::<String>::new(), "no status rewritten");
        let route = eventually("team-app's parent", || {
            route_parent(&t.api, "tenant-a", "team-app")
        })
        .await;
        assert_eq!(
            condition(&route["conditions"], "Accepted").map(|c| c["status"].clone()),
            Some(json!("True"))
        );
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The shared pool as the chart points the controller at it: its Service, config-API token,
/// Deployment and, with `class_tunnel`, the class tunnel's token Secret
/// ([`class_tunnel_secret`]).
fn chart_shared_plane(class_tunnel: bool) -> SharedPlane {
    SharedPlane {
        service: ObjectKey::new("cftunnel-system", "cftunnel-proxy"),
        auth_secret: ObjectKey::new("cftunnel-system", "shared-auth"),
        auth_key: "token".to_owned(),
        tunnel_secret: class_tunnel.then(|| {
            (
                ObjectKey::new("cftunnel-system", "class-tunnel"),
                "tunnel-token".to_owned(),
            )
        }),
        deployment: Some(ObjectKey::new("cftunnel-system", "cftunnel-proxy")),
    }
}

/// The shared pool of [`shared_seed`]: its Service, config-API token and tunnel token
/// Secrets, and no Deployment of the controller's to stamp.
fn seeded_shared_plane() -> SharedPlane {
    SharedPlane {
        tunnel_secret: Some((
            ObjectKey::new("cftunnel-system", "shared-tunnel"),
            "tunnel-token".to_owned(),
        )),
        deployment: None,
        ..chart_shared_plane(false)
    }
}

/// A connector token of the class tunnel, made from `secret`.
fn class_token(secret: &[u8]) -> String {
    Token::new("acct-s", secret.to_vec(), uuid_of(SHARED_TUNNEL_ID)).encode()
}

/// The class tunnel's token Secret holding `token`, then `after` (YAML escapes).
fn class_tunnel_secret(token: &str, after: &str) -> Value {
    yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: class-tunnel, namespace: cftunnel-system}}\nstringData: {{tunnel-token: \"{token}{after}\"}}\n"
    ))
}

/// The shared pool's Deployment as the chart renders it, without the controller's stamps
/// (`helm template` has no lookup).
fn chart_pool() -> Value {
    yaml(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: cftunnel-proxy, namespace: cftunnel-system, labels: {app.kubernetes.io/managed-by: Helm}}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app.kubernetes.io/name: cftunnel-proxy}}\n  template:\n    metadata:\n      labels: {app.kubernetes.io/name: cftunnel-proxy}\n      annotations: {checksum/config-api-token: abc}\n    spec: {containers: [{name: proxy, image: cftunnel-proxy:1}]}\n",
    )
}

/// The shared pool's tunnel token is rotated in its Secret (by hand or by a secrets operator):
/// the controller stamps the SHA-256 of the new token on the pool Deployment's pod template,
/// which rolls the pool onto it, and touches nothing else of the chart's Deployment. The
/// annotation never holds the token. A token that does not parse is not rolled to.
#[tokio::test]
async fn a_new_token_in_the_shared_pools_secret_rolls_the_pool() {
    tokio::time::timeout(Duration::from_secs(60), async {
        const ANNOTATION: &str = "cf.k8s.lex.la/tunnel-token-hash";
        let token = class_token;
        // With the line break `kubectl create secret --from-file` keeps.
        let tunnel_secret = |token: &str| class_tunnel_secret(token, "\\n");
        let pool = chart_pool();
        let first = token(b"first secret");
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(pool);
                api.put(tunnel_secret(&first));
            },
            ApiServer::client,
            |options| {
                options.shared = Some(chart_shared_plane(true));
            },
        )
        .await;
        let sha256 = |token: &str| {
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes())
                .as_ref()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let template = || {
            t.api
                .get("apps/v1", "Deployment", "cftunnel-system", "cftunnel-proxy")
                .and_then(|d| d.pointer("/spec/template").cloned())
                .expect("the pool's Deployment")
        };
        let stamped = |digest: String| {
            move || {
                let template = template();
                (template["metadata"]["annotations"][ANNOTATION] == json!(digest))
                    .then_some(template)
            }
        };
        let before = template();
        let after = eventually("the first token's digest", stamped(sha256(&first))).await;
        let annotation = after["metadata"]["annotations"][ANNOTATION].to_string();
        assert!(!annotation.contains(&first) && !annotation.contains("first secret"));
        // Nothing else of the chart's Deployment is changed.
        let mut unstamped = after.clone();
        if let Some(a) = unstamped["metadata"]["annotations"].as_object_mut() {
            a.remove(ANNOTATION);
        }
        assert_eq!(unstamped, before);
        let replicas = || {
            t.api
                .get("apps/v1", "Deployment", "cftunnel-system", "cftunnel-proxy")
                .and_then(|d| d.pointer("/spec/replicas").cloned())
        };
        assert_eq!(replicas(), Some(json!(2)));

        // Rotated: the new token's digest, so new pods.
        let second = token(b"second secret");
        t.api.put(tunnel_secret(&second));
        eventually("the second token's digest", stamped(sha256(&second))).await;

        // Not a token: the pool keeps its pods. (Rounds after it: the Gateway's plane takes
        // two new specs, one after the other.)
        t.api.put(tunnel_secret("not-a-token"));
        t.configure("replicas: 2");
        t.replicas_become(2).await;
        t.configure("replicas: 3");
        t.replicas_become(3).await;
        let held = template()["metadata"]["annotations"][ANNOTATION].clone();
        assert_eq!(held, json!(sha256(&second)), "not rolled to a bad token");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The shared pool's config-API token was changed in its Secret outside Helm, and the
/// controller that knew the token before is gone: the pool's pods, which read the token once
/// at start, refuse every push. The controller rolls the pool onto the current token by
/// stamping its digest on the pod template, and touches nothing else of the chart's Deployment.
#[tokio::test]
async fn a_pool_that_refuses_the_config_api_token_is_rolled_onto_it() {
    tokio::time::timeout(Duration::from_secs(60), async {
        const ANNOTATION: &str = "cf.k8s.lex.la/config-api-token-hash";
        // Started with the token before the Secret's `pool-secret`.
        let pool_pod = proxy_pod("old-pool-secret").await;
        let echo = support::echo("tenant-s", "web-1").await;
        let deployment = chart_pool();
        let t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                api.put(deployment);
                for doc in shared_seed(pool_pod.admin_addr(), echo.http_addr()).split("\n---\n") {
                    if !doc.trim().is_empty() {
                        api.put(yaml(doc));
                    }
                }
            },
            ApiServer::client,
            |options| {
                options.shared = Some(chart_shared_plane(false));
            },
        )
        .await;
        let template = || {
            t.api
                .get("apps/v1", "Deployment", "cftunnel-system", "cftunnel-proxy")
                .and_then(|d| d.pointer("/spec/template").cloned())
                .expect("the pool's Deployment")
        };
        let before = template();
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b"pool-secret")
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        let after = eventually("the pool rolled onto the token", || {
            let template = template();
            (template["metadata"]["annotations"][ANNOTATION] == json!(digest)).then_some(template)
        })
        .await;
        let mut unstamped = after.clone();
        if let Some(a) = unstamped["metadata"]["annotations"].as_object_mut() {
            a.remove(ANNOTATION);
        }
        assert_eq!(unstamped, before, "nothing else of the Deployment changes");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// tenant-c's Gateway `third` on tenant-a's tunnel, each plane with a pod (`edge`, `third`)
/// serving both tenants' routes; then tenant-a's ref names a GatewayConfig that does not
/// exist, and a few rounds run with tenant-a's Gateway refused.
async fn broken_beside_third() -> (Tenant, Server, Server) {
    broken_beside_third_with(|_| {}).await
}

/// [`broken_beside_third`] with `extra` run on the API server before the controller starts.
async fn broken_beside_third_with(extra: impl FnOnce(&ApiServer)) -> (Tenant, Server, Server) {
    broken_edge_beside_third(gateway(true), extra).await
}

/// [`broken_beside_third_with`], Gateway tenant-a/edge written as `edge_gateway` (a
/// [`gateway`], perhaps with other listeners).
async fn broken_edge_beside_third(
    edge_gateway: String,
    extra: impl FnOnce(&ApiServer),
) -> (Tenant, Server, Server) {
    let edge = proxy_pod("s3cr3t").await;
    let third = proxy_pod("c3cr3t").await;
    let t = Tenant::start_with("replicas: 1", |api| {
        api.put(yaml(&edge_gateway));
        extra(api);
        // tenant-c's Gateway on tenant-a's tunnel.
        let token = edge_token();
        api.put(yaml(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: third-tunnel-token, namespace: tenant-c}}\nstringData: {{tunnel-token: \"{token}\"}}\n"
        )));
        api.put(yaml(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: third-api, namespace: tenant-c}\nstringData: {token: c3cr3t}\n",
        ));
        api.put(yaml(
            "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: third-config, namespace: tenant-c}\nspec: {tunnelTokenSecretRef: {name: third-tunnel-token}, authTokenSecretRef: {name: third-api}}\n",
        ));
        api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            edge.admin_addr().port(),
            true,
        ));
        api.put(config_slice(
            "tenant-c",
            "cf-proxy-third-config",
            third.admin_addr().port(),
            true,
        ));
    })
    .await;
    for pod in [&edge, &third] {
        shop_serves(pod, 200).await;
        host_serves(pod, "blog.example.com", 200).await;
    }
    eventually("tenant-c's route flagged as sharing its tunnel", || {
        route_condition(&t.api, "tenant-c", "blog", "cf.k8s.lex.la/TunnelShared")
    })
    .await;

    // tenant-a's ref now names a GatewayConfig that does not exist.
    t.api.put(yaml(
        &edge_gateway.replace("name: edge-config", "name: gone"),
    ));
    eventually("the Gateway refused", || {
        t.api
            .get(
                "gateway.networking.k8s.io/v1",
                "Gateway",
                "tenant-a",
                "edge",
            )
            .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
            .filter(|c| c["reason"] == "InvalidParameters")
    })
    .await;
    t.rounds(3, Duration::from_millis(200)).await;
    (t, edge, third)
}

/// A route on a broken Gateway and on a live one on its tunnel is detached from the live one:
/// it is no longer served on the live Gateway's hostname, and still on the broken one's.
#[tokio::test]
async fn a_route_detached_from_a_live_gateway_beside_a_broken_one_leaves_its_hostname() {
    route_detached_beside_a_broken_gateway(gateway(true)).await;
}

/// [`a_route_detached_from_a_live_gateway_beside_a_broken_one_leaves_its_hostname`], the
/// broken Gateway's listener without a hostname: it serves every host, the live Gateway's
/// too, yet the route's rule for the live Gateway's hostname was made for that Gateway.
#[tokio::test]
async fn a_route_detached_from_a_live_gateway_beside_a_broken_one_for_any_host_leaves_its_hostname()
{
    route_detached_beside_a_broken_gateway(
        gateway(true).replace(", hostname: shop.example.com", ""),
    )
    .await;
}

/// [`a_route_detached_from_a_live_gateway_beside_a_broken_one_leaves_its_hostname`], the
/// broken Gateway's listener a wildcard over the live Gateway's hostname.
#[tokio::test]
async fn a_route_detached_from_a_live_gateway_beside_a_broken_wildcard_one_leaves_its_hostname() {
    route_detached_beside_a_broken_gateway(
        gateway(true).replace("hostname: shop.example.com", "hostname: \"*.example.com\""),
    )
    .await;
}

/// Route tenant-a/both on Gateway tenant-a/edge, written as `edge_gateway` and then broken,
/// and on the live Gateway tenant-c/third (`blog.example.com`) on its tunnel, is detached from
/// the live one: `blog.example.com/both` gets the live Gateway's 404 on both planes' pods, and
/// `shop.example.com/both` is still served.
async fn route_detached_beside_a_broken_gateway(edge_gateway: String) {
    tokio::time::timeout(Duration::from_secs(90), async {
        let both = |parents: &str| {
            yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: both, namespace: tenant-a}}\nspec:\n  parentRefs: [{parents}]\n  rules: [{{matches: [{{path: {{value: /both}}}}], backendRefs: [{{name: web, port: 80}}]}}]\n"
            ))
        };
        let (t, edge, third) = broken_edge_beside_third(edge_gateway, |api| {
            api.put(yaml(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: third, namespace: tenant-c}\nspec:\n  gatewayClassName: cloudflare-tunnel\n  infrastructure: {parametersRef: {group: cf.k8s.lex.la, kind: GatewayConfig, name: third-config}}\n  listeners: [{name: http, port: 80, protocol: HTTP, hostname: blog.example.com, allowedRoutes: {namespaces: {from: All}}}]\n",
            ));
            api.put(both("{name: edge}, {name: third, namespace: tenant-c}"));
        })
        .await;
        let becomes = |pod: &'static str, s: &Server, host: &'static str, want: u16| {
            let s = s.data_addr();
            async move {
                let by = Instant::now() + Duration::from_secs(20);
                loop {
                    let got = support::request(s, "GET", "/both", host, None, "")
                        .await
                        .map_or(0, |a| a.status);
                    if got == want {
                        return;
                    }
                    assert!(Instant::now() < by, "{pod} {host}/both: {got}, not {want}");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        };
        // tenant-c's own route on blog.example.com goes: /both there is the route's alone.
        t.api.delete("gateway.networking.k8s.io/v1", "HTTPRoute", "tenant-c", "blog");
        for (name, pod) in [("edge", &edge), ("third", &third)] {
            host_serves(pod, "blog.example.com", 404).await;
            becomes(name, pod, "blog.example.com", 200).await;
            becomes(name, pod, "shop.example.com", 200).await;
        }

        t.api.put(both("{name: edge}"));
        t.rounds(3, Duration::from_millis(200)).await;
        for (name, pod) in [("edge", &edge), ("third", &third)] {
            becomes(name, pod, "blog.example.com", 404).await;
            becomes(name, pod, "shop.example.com", 200).await;
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A broken plane whose tunnel other planes serve keeps serving its own routes as it last
/// served them, and so do the other planes on the tunnel (the edge spreads the tunnel's
/// requests over every pod on it); a route another tenant deletes stops being served through
/// the broken plane's pods, and a route of its own deleted stops being served anywhere.
#[tokio::test]
async fn a_broken_plane_on_a_tunnel_other_planes_serve_follows_their_routes() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (t, edge, third) = broken_beside_third().await;
        for pod in [&edge, &third] {
            shop_serves(pod, 200).await;
            host_serves(pod, "blog.example.com", 200).await;
        }

        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-c",
            "blog"
        ));
        host_serves(&third, "blog.example.com", 404).await;
        host_serves(&edge, "blog.example.com", 404).await;
        shop_serves(&edge, 200).await;
        shop_goes_away(&t, &edge).await;
        shop_serves(&third, 404).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The pods of a broken plane still take the requests of the other tenant on its tunnel, so
/// that tenant's route stays flagged `TunnelShared`, naming the broken Gateway, as it was
/// while both Gateways were accepted.
#[tokio::test]
async fn a_broken_plane_keeps_the_other_tenants_routes_on_its_tunnel_flagged_shared() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (t, edge, _third) = broken_beside_third().await;
        host_serves(&edge, "blog.example.com", 200).await;
        let shared = route_condition(&t.api, "tenant-c", "blog", "cf.k8s.lex.la/TunnelShared")
            .expect("still flagged: tenant-a's pods get tenant-c's requests");
        assert_eq!(shared["status"], "True");
        let message = shared["message"].as_str().unwrap_or_default();
        assert!(message.contains("tenant-a/edge"), "{message}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The pods of a broken plane that stop taking the config fail the routes of the other
/// tenant on its tunnel, whose requests the edge still hands them: those routes say so,
/// naming the broken Gateway.
#[tokio::test]
async fn a_push_failure_on_a_broken_planes_pods_is_reported_on_its_tunnels_routes() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let (t, _edge, _third) = broken_beside_third().await;
        assert!(route_condition(&t.api, "tenant-c", "blog", PROXY_CONFIG_PUSHED).is_none());
        let (closed, _held) = closed_port();
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            closed,
            true,
        ));
        push_failure_names(&t.api, ("tenant-c", "blog"), "tenant-a/edge").await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The last config of a broken plane is read back from its running pods by a controller that
/// started after the breakage, so a pod that starts later still gets it.
#[tokio::test]
async fn a_broken_planes_last_config_outlives_a_controller_restart() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut t = Tenant::start("replicas: 1").await;
        let first = proxy_pod("s3cr3t").await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            first.admin_addr().port(),
            true,
        ));
        shop_serves(&first, 200).await;

        // The ref now names a GatewayConfig that does not exist.
        t.api.put(yaml(
            &gateway(true).replace("name: edge-config", "name: gone"),
        ));
        eventually("the Gateway refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        t.restart(|_| {}).await;
        t.rounds(2, Duration::from_millis(200)).await;

        let second = proxy_pod("s3cr3t").await;
        let mut slice = config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            second.admin_addr().port(),
            false,
        );
        slice["metadata"]["name"] = json!("cf-proxy-edge-config-x2");
        t.api.put(slice);
        shop_serves(&second, 200).await;
        shop_serves(&first, 200).await;
        second.shutdown().await;
        first.shutdown().await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A dedicated Gateway on the class tunnel (the migration path) breaks by its connector
/// token's Secret being deleted, and a controller starts during the breakage: it cannot read
/// the token, and tells the plane's tunnel from its Deployment's annotations instead. So the
/// shared pool, on that tunnel, is still pushed the broken Gateway's route, and the broken
/// plane's pods get the tunnel's current routes (a route the pool's Gateway drops stops being
/// served through them).
#[tokio::test]
async fn a_broken_plane_whose_token_secret_is_gone_shares_its_tunnel_after_a_restart() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let pool = proxy_pod("pool-secret").await;
        let edge = proxy_pod("s3cr3t").await;
        let echo = support::echo("tenant-s", "web-1").await;
        // The class tunnel is the one Gateway edge's token opens.
        let class_token = edge_token();
        let mut t = Tenant::start_tuned(
            "replicas: 1",
            |api| {
                for doc in shared_seed(pool.admin_addr(), echo.http_addr()).split("\n---\n") {
                    if !doc.trim().is_empty() {
                        api.put(yaml(doc));
                    }
                }
                api.put(class_tunnel_secret(&class_token, ""));
                api.put(config_slice(
                    "tenant-a",
                    "cf-proxy-edge-config",
                    edge.admin_addr().port(),
                    true,
                ));
            },
            ApiServer::client,
            |options| {
                options.shared = Some(SharedPlane {
                    deployment: None,
                    ..chart_shared_plane(true)
                });
            },
        )
        .await;
        for pod in [&pool, &edge] {
            shop_serves(pod, 200).await;
            host_serves(pod, "www.example.com", 200).await;
        }
        let deployment = t
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .expect("the plane's Deployment");
        assert_eq!(
            deployment.pointer("/metadata/annotations/cf.k8s.lex.la~1tunnel"),
            Some(&json!(format!("acct/{TUNNEL_ID}"))),
            "the tunnel, never its secret"
        );

        // The breakage: the connector token's Secret is deleted.
        assert!(t
            .api
            .delete("v1", "Secret", "tenant-a", "edge-tunnel-token"));
        eventually("the Gateway refused", || {
            t.api
                .get(
                    "gateway.networking.k8s.io/v1",
                    "Gateway",
                    "tenant-a",
                    "edge",
                )
                .and_then(|g| condition(&g["status"]["conditions"], "Accepted").cloned())
                .filter(|c| c["reason"] == "InvalidParameters")
        })
        .await;
        // A controller that starts now knows nothing of the plane but what it reads back.
        t.restart(|options| {
            options.shared = Some(SharedPlane {
                deployment: None,
                ..chart_shared_plane(true)
            });
        })
        .await;
        t.rounds(3, Duration::from_millis(200)).await;

        // The pool's Gateway drops its route: once the pool has taken that, it still serves
        // the broken Gateway's route, and the broken plane's pods follow the tunnel.
        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-s",
            "www"
        ));
        host_serves(&pool, "www.example.com", 404).await;
        shop_serves(&pool, 200).await;
        host_serves(&edge, "www.example.com", 404).await;
        shop_serves(&edge, 200).await;
        t.stop().await;
        edge.shutdown().await;
        pool.shutdown().await;
    })
    .await
    .expect("in time");
}

/// Reading a broken plane's last config back from pods that take connections and never answer
/// holds up no other tenant's route changes: the read runs by itself.
#[tokio::test]
async fn reading_back_from_pods_that_never_answer_holds_up_no_other_tenant() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let third = proxy_pod("c3cr3t").await;
        let mut t = Tenant::start_with("replicas: 1", |api| {
            api.put(yaml(
                "apiVersion: v1\nkind: Secret\nmetadata: {name: third-api, namespace: tenant-c}\nstringData: {token: c3cr3t}\n",
            ));
            api.put(yaml(
                "apiVersion: cf.k8s.lex.la/v1alpha1\nkind: GatewayConfig\nmetadata: {name: third-config, namespace: tenant-c}\nspec: {tunnelTokenSecretRef: {name: third-tunnel-token}, authTokenSecretRef: {name: third-api}}\n",
            ));
            api.put(config_slice(
                "tenant-c",
                "cf-proxy-third-config",
                third.admin_addr().port(),
                true,
            ));
        })
        .await;
        host_serves(&third, "blog.example.com", 200).await;
        eventually("tenant-a's plane", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        // tenant-a's plane breaks, and its pods stop answering.
        let (hanging, mut called) = never_answers().await;
        t.api.put(config_slice(
            "tenant-a",
            "cf-proxy-edge-config",
            hanging.port(),
            true,
        ));
        t.api.put(yaml(
            &gateway(true).replace("name: edge-config", "name: gone"),
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        while called.try_recv().is_ok() {}
        // A controller that starts now reads tenant-a's last config back from its pods.
        t.restart(|options| options.push_timeout = Duration::from_secs(60))
            .await;
        called.recv().await.expect("the read back began");
        t.api.delete(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "tenant-c",
            "blog",
        );
        host_serves(&third, "blog.example.com", 404).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Puts class `class` of another installation (`example.com/another-installation`), its
/// Gateway `other` on it naming our GatewayConfig, and that installation's plane for it: a copy
/// of ours labelled for class `labelled`. Then lets a few rounds run and checks the plane
/// stays.
async fn another_installations_plane(t: &Tenant, class: &str, labelled: &str) {
    let ours = eventually("our plane's Deployment", || {
        t.api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
    })
    .await;
    t.api.put(yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {class}}}\nspec: {{controllerName: example.com/another-installation}}\n",
    )));
    let other = t.api.put(yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: other, namespace: tenant-a}}\nspec:\n  gatewayClassName: {class}\n  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP}}]\n",
    )));
    let mut theirs = ours.clone();
    let text = serde_json::to_string(&theirs["metadata"]["labels"]).expect("labels");
    theirs["metadata"] = json!({
        "name": "cf-proxy-other",
        "namespace": "tenant-a",
        "labels": serde_json::from_str::<Value>(
            &text.replace("\"edge\"", "\"other\"").replace("cloudflare-tunnel", labelled),
        ).expect("labels"),
        "ownerReferences": [{
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": "other",
            "uid": other["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
        }],
    });
    assert_eq!(
        theirs.pointer("/metadata/labels/gateway.networking.k8s.io~1gateway-class-name"),
        Some(&json!(labelled))
    );
    t.api.put(theirs);
    // Rounds run on every change; a few of them.
    for i in 0..5 {
        t.api.put(yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: nudge, namespace: tenant-a}}\ndata: {{n: '{i}'}}\n"
        )));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        t.api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-other")
            .is_some(),
        "the other installation's plane stays"
    );
}

/// Another installation of the controller, for classes of its own, renders planes of the same
/// names, labels and owner as ours: those are not removed as planes of Gateways that left
/// this controller. A plane this controller rendered, for a class of its own, still goes when
/// its Gateway moves to the other installation's class.
#[tokio::test]
async fn another_installations_planes_are_left_alone() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        // The other installation's plane: ours, as it would render it.
        another_installations_plane(&t, "theirs", "theirs").await;

        // Ours, once its Gateway moves to their class, goes.
        t.api.put(yaml(&gateway(true).replace(
            "gatewayClassName: cloudflare-tunnel",
            "gatewayClassName: theirs",
        )));
        eventually("our plane removed", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_none()
                .then_some(())
        })
        .await;
        assert!(t
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-other")
            .is_some());
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Gateway moved to a class of ours that is created in the same apply may be seen before
/// the class is: its plane stays (same Deployment, same token) and serves on under the new
/// class once it is listed.
#[tokio::test]
async fn a_gateway_moved_to_a_class_not_yet_listed_keeps_its_plane() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let deployment = || t.api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge");
        let before = eventually("the plane", deployment).await;
        let secret = |d: &Value| d["metadata"]["uid"].clone();
        t.api.put(yaml(&gateway(true).replace(
            "gatewayClassName: cloudflare-tunnel",
            "gatewayClassName: cloudflare-tunnel-b",
        )));
        // Rounds run on every change; a few of them.
        for i in 0..5 {
            t.api.put(yaml(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: nudge, namespace: tenant-a}}\ndata: {{n: '{i}'}}\n"
            )));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let during = deployment().expect("the plane stays while its class is not listed");
        assert_eq!(secret(&during), secret(&before));
        t.api.put(yaml(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: cloudflare-tunnel-b}}\nspec: {{controllerName: {CONTROLLER}}}\n"
        )));
        eventually("the plane relabelled for the new class", || {
            deployment().filter(|d| {
                d.pointer("/metadata/labels/gateway.networking.k8s.io~1gateway-class-name")
                    == Some(&json!("cloudflare-tunnel-b"))
            })
        })
        .await;
        let after = deployment().expect("the plane");
        assert_eq!(secret(&after), secret(&before), "the same Deployment");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A GatewayClass name may be longer than a label value (253 characters against 63). Another
/// installation's plane for a Gateway of such a class, labelled with the class name shortened
/// as the renderer shortens it, or with no class label at all as earlier versions rendered it,
/// is not removed as a plane this controller rendered: a plane says which class it is for, or
/// is not taken for ours. Ours still goes when its Gateway moves to that class.
#[tokio::test]
async fn another_installations_planes_for_a_long_class_name_are_left_alone() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let ours = eventually("our plane's Deployment", || {
            t.api.get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
        })
        .await;
        let long = format!("{}.example.com", "another-installation".repeat(4));
        assert!(long.len() > 63);
        t.api.put(yaml(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: {long}}}\nspec: {{controllerName: example.com/another-installation}}\n"
        )));
        let label = cftunnel_controller::render::class_label(&long);
        // Theirs, for a Gateway of the long class: `labelled` as this version renders it,
        // `unlabelled` as a version that left long class names out did.
        for (name, class_label) in [("labelled", Some(&label)), ("unlabelled", None)] {
            let gateway = t.api.put(yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: tenant-a}}\nspec:\n  gatewayClassName: {long}\n  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP}}]\n"
            )));
            let text = serde_json::to_string(&ours["metadata"]["labels"]).expect("labels");
            let mut labels: Value =
                serde_json::from_str(&text.replace("\"edge\"", &format!("\"{name}\"")))
                    .expect("labels");
            let classes = labels.as_object_mut().expect("a map");
            match class_label {
                Some(label) => classes.insert(
                    "gateway.networking.k8s.io/gateway-class-name".to_owned(),
                    json!(label),
                ),
                None => classes.remove("gateway.networking.k8s.io/gateway-class-name"),
            };
            let mut theirs = ours.clone();
            theirs["metadata"] = json!({
                "name": format!("cf-proxy-{name}"),
                "namespace": "tenant-a",
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": name,
                    "uid": gateway["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
                }],
            });
            t.api.put(theirs);
        }
        // Rounds run on every change; a few of them.
        for i in 0..5 {
            t.api.put(yaml(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: nudge, namespace: tenant-a}}\ndata: {{n: '{i}'}}\n"
            )));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        for name in ["cf-proxy-labelled", "cf-proxy-unlabelled"] {
            assert!(
                t.api.get("apps/v1", "Deployment", "tenant-a", name).is_some(),
                "the other installation's {name} stays"
            );
        }

        // Ours, once its Gateway moves to their class, goes.
        t.api.put(yaml(&gateway(true).replace(
            "gatewayClassName: cloudflare-tunnel",
            &format!("gatewayClassName: {long}"),
        )));
        eventually("our plane removed", || {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .is_none()
                .then_some(())
        })
        .await;
        for name in ["cf-proxy-labelled", "cf-proxy-unlabelled"] {
            assert!(t.api.get("apps/v1", "Deployment", "tenant-a", name).is_some());
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Someone turns the plane's `TUNNEL_TOKEN` into a literal `value` (`kubectl set env`), and
/// later its liveness probe into a `tcpSocket` one: the editor now owns that branch, which a
/// forced apply of the render leaves beside the rendered `valueFrom` (`httpGet`), and the API
/// server refuses the result as invalid. The controller takes the Deployment back (the render's
/// fields written over it) within seconds, and renders after it are applied as before.
#[tokio::test]
async fn an_edit_that_switches_a_rendered_union_field_is_taken_back() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Api, PostParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 2").await;
        let container = |field: &str| {
            t.api
                .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
                .and_then(|d| {
                    d.pointer(&format!("/spec/template/spec/containers/0/{field}"))
                        .cloned()
                })
        };
        let token = || {
            container("env")?
                .as_array()?
                .iter()
                .find(|v| v["name"] == "TUNNEL_TOKEN")
                .cloned()
        };
        let rendered = eventually("the Deployment", token).await;
        assert!(rendered.get("valueFrom").is_some(), "{rendered}");
        let probe = eventually("the liveness probe", || container("livenessProbe")).await;
        assert!(probe.get("httpGet").is_some(), "{probe}");

        let deployments: Api<Deployment> = Api::namespaced(t.api.user_client(), "tenant-a");
        let as_kubectl = PostParams {
            field_manager: Some("kubectl-set".to_owned()),
            ..PostParams::default()
        };
        let edit = |change: fn(&mut k8s_openapi::api::core::v1::Container)| {
            let deployments = deployments.clone();
            let as_kubectl = as_kubectl.clone();
            async move {
                let mut edited = deployments.get("cf-proxy-edge").await.expect("read");
                edited
                    .spec
                    .as_mut()
                    .and_then(|s| s.template.spec.as_mut())
                    .into_iter()
                    .flat_map(|p| p.containers.iter_mut())
                    .for_each(change);
                deployments
                    .replace("cf-proxy-edge", &as_kubectl, &edited)
                    .await
                    .expect("edited");
            }
        };
        edit(|c| {
            for var in c.env.iter_mut().flatten() {
                if var.name == "TUNNEL_TOKEN" {
                    var.value = Some("literal".to_owned());
                    var.value_from = None;
                }
            }
        })
        .await;
        within(5, "the token read from its Secret again", || {
            token().filter(|v| *v == rendered)
        })
        .await;

        edit(|c| {
            if let Some(probe) = c.liveness_probe.as_mut() {
                probe.http_get = None;
                probe.tcp_socket = Some(k8s_openapi::api::core::v1::TCPSocketAction {
                    port: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8081),
                    host: None,
                });
            }
        })
        .await;
        within(5, "the rendered probe again", || {
            container("livenessProbe").filter(|p| *p == probe)
        })
        .await;

        t.configure("replicas: 2, resources: {limits: {memory: 96Mi}}");
        t.applied_with_memory("96Mi").await;
        assert_eq!(token(), Some(rendered));
        assert_eq!(container("livenessProbe"), Some(probe));
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Someone adds a label to the plane NetworkPolicy's pod selector (it then guards none of the
/// plane's pods, and their config port is open to the cluster), and a key to its Service's
/// selector (no push reaches the pods): selectors are taken whole, so each edit departs from
/// the render and is undone within seconds, not at the next periodic apply.
#[tokio::test]
async fn keys_added_to_the_planes_selectors_are_removed_within_seconds() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Api, Patch, PatchParams};
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start_tuned(
            "replicas: 2",
            |_| {},
            ApiServer::client,
            |options| options.resync = Duration::from_secs(60),
        )
        .await;
        let selector = |api_version: &str, kind: &str, name: &str, pointer: &str| {
            t.api
                .get(api_version, kind, "tenant-a", name)
                .and_then(|o| o.pointer(pointer).cloned())
        };
        let pod_selector = || {
            selector(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "cf-proxy-edge",
                "/spec/podSelector",
            )
        };
        let service_selector =
            || selector("v1", "Service", "cf-proxy-edge-config", "/spec/selector");
        let rendered_policy = eventually("the NetworkPolicy", pod_selector).await;
        let rendered_service = eventually("the Service", service_selector).await;

        let as_user = PatchParams {
            field_manager: Some("kubectl-edit".to_owned()),
            ..PatchParams::default()
        };
        let policies: Api<NetworkPolicy> = Api::namespaced(t.api.user_client(), "tenant-a");
        let narrowed = json!({"spec": {"podSelector": {"matchLabels": {"tier": "none"}}}});
        let edited = policies
            .patch("cf-proxy-edge", &as_user, &Patch::Merge(&narrowed))
            .await
            .expect("narrowed");
        let labels = edited
            .spec
            .and_then(|s| s.pod_selector)
            .and_then(|s| s.match_labels)
            .unwrap_or_default();
        assert_eq!(labels.get("tier").map(String::as_str), Some("none"));
        within(5, "the NetworkPolicy's pod selector restored", || {
            pod_selector().filter(|s| *s == rendered_policy)
        })
        .await;

        let services: Api<Service> = Api::namespaced(t.api.user_client(), "tenant-a");
        let moved = json!({"spec": {"selector": {"tier": "none"}}});
        services
            .patch("cf-proxy-edge-config", &as_user, &Patch::Merge(&moved))
            .await
            .expect("moved");
        within(5, "the Service's selector restored", || {
            service_selector().filter(|s| *s == rendered_service)
        })
        .await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A Gateway deleted and re-created under its name (a GitOps replace) takes over the plane
/// objects its predecessor left, rather than failing on them until the garbage collector
/// (which the stand-in API server does not run) has removed them.
#[tokio::test]
async fn a_gateway_re_created_under_its_name_takes_over_what_its_predecessor_left() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let owner = |kind: &str, api_version: &str, name: &str| {
            t.api
                .get(api_version, kind, "tenant-a", name)
                .and_then(|o| o.pointer("/metadata/ownerReferences/0/uid").cloned())
        };
        let before = eventually("the plane", || {
            owner("Deployment", "apps/v1", "cf-proxy-edge")
        })
        .await;
        let live_gateway = || {
            t.api.get(
                "gateway.networking.k8s.io/v1",
                "Gateway",
                "tenant-a",
                "edge",
            )
        };
        let old_uid = live_gateway().expect("the Gateway")["metadata"]["uid"].clone();
        assert_eq!(before, old_uid);
        assert!(t.api.delete(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge"
        ));
        t.api.put(yaml(&gateway(true)));
        let new_uid = live_gateway().expect("the new Gateway")["metadata"]["uid"].clone();
        assert_ne!(new_uid, old_uid);
        for (kind, api_version, name) in [
            ("Deployment", "apps/v1", "cf-proxy-edge"),
            ("Service", "v1", "cf-proxy-edge-config"),
        ] {
            eventually(&format!("{kind} {name} owned by the new Gateway"), || {
                (owner(kind, api_version, name).as_ref() == Some(&new_uid)).then_some(())
            })
            .await;
        }
        let refused = t
            .api
            .list("Event")
            .into_iter()
            .filter(|e| e["reason"] == "RenderFailed" && e["regarding"]["name"] == "edge")
            .filter(|e| e["note"].as_str().is_some_and(|n| n.contains("not owned")))
            .count();
        let notes: Vec<String> = t
            .api
            .list("Event")
            .into_iter()
            .filter(|e| e["reason"] == "RenderFailed" && e["regarding"]["name"] == "edge")
            .map(|e| e["note"].to_string())
            .collect();
        assert_eq!(refused, 0, "nothing is reported in the way: {notes:?}");
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// The stand-in Cloudflare API, and a tenant whose GatewayConfig writes its tunnel's document
/// with its own API token (`cloudflareCredentialsSecretRef`), once its route `shop` is accepted
/// and that document written.
async fn writing_its_tunnel_with_its_own_token() -> (CloudflareApi, Tenant) {
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "cf-token-a");
    let base = cloudflare.base();
    let t = Tenant::start_tuned(
        "replicas: 1, cloudflareCredentialsSecretRef: {name: edge-cf}",
        |_| {},
        ApiServer::client,
        |options| options.cloudflare_api_base = base,
    )
    .await;
    eventually("shop accepted", || {
        route_condition(&t.api, "tenant-a", "shop", "Accepted").filter(|c| c["status"] == "True")
    })
    .await;
    eventually("the tunnel's document", || {
        cloudflare.config("acct", TUNNEL_ID)
    })
    .await;
    (cloudflare, t)
}

/// A GatewayConfig's `cloudflareCredentialsSecretRef` that gives no API token: the route's
/// message says which of the Secret, its key or the key's value is missing.
#[tokio::test]
async fn a_missing_api_token_is_reported_saying_what_is_missing() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (_cloudflare, t) = writing_its_tunnel_with_its_own_token().await;
        // Shop is on the tunnel's last document: it stays accepted, pending on its own
        // condition.
        let told = |why: &'static str| {
            let api = &t.api;
            let message = format!(
                "the tunnel's ingress document could not be written: {why}; the route is \
                 served as the tunnel's last document has it"
            );
            move || {
                let parent = route_parent(api, "tenant-a", "shop")?;
                let accepted = condition(&parent["conditions"], "Accepted")?;
                let written =
                    condition(&parent["conditions"], "cf.k8s.lex.la/TunnelDocumentWritten")?;
                (accepted["status"] == "True"
                    && written["status"] == "False"
                    && written["message"].as_str() == Some(message.as_str()))
                .then_some(())
            }
        };
        let credentials = |data: &str| {
            yaml(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: edge-cf, namespace: tenant-a}}\nstringData: {data}\n"
            ))
        };
        assert!(t.api.delete("v1", "Secret", "tenant-a", "edge-cf"));
        eventually(
            "the Secret said not found",
            told("Secret tenant-a/edge-cf not found (spec.cloudflareCredentialsSecretRef of GatewayConfig tenant-a/edge-config)"),
        )
        .await;
        t.api.put(credentials("{token: cf-token-a}"));
        eventually(
            "the key said missing",
            told("Secret tenant-a/edge-cf has no key \"api-token\" (spec.cloudflareCredentialsSecretRef of GatewayConfig tenant-a/edge-config)"),
        )
        .await;
        t.api.put(credentials("{api-token: \"  \\n\"}"));
        eventually(
            "the value said empty",
            told("key \"api-token\" of Secret tenant-a/edge-cf is empty (spec.cloudflareCredentialsSecretRef of GatewayConfig tenant-a/edge-config)"),
        )
        .await;
        // A route new since, on a hostname the last document carries, is served too.
        t.api.put(yaml("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: late, namespace: tenant-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n"));
        let written = |route: &'static str| {
            let api = &t.api;
            move || {
                let parent = route_parent(api, "tenant-a", route)?;
                let accepted = condition(&parent["conditions"], "Accepted")?;
                let written =
                    condition(&parent["conditions"], "cf.k8s.lex.la/TunnelDocumentWritten")?;
                (accepted["status"] == "True" && written["status"] == "False").then_some(())
            }
        };
        eventually("late served from the last document", written("late")).await;
        // The listener's hostname changes: no route of it is on the last document, which
        // has only the old one. Their routes wait for the document.
        t.api.put(yaml(&gateway(true).replace("shop.example.com", "store.example.com")));
        for route in ["shop", "late"] {
            let pending = eventually(&format!("{route} pending"), || {
                route_condition(&t.api, "tenant-a", route, "Accepted")
                    .filter(|c| c["status"] == "Unknown")
            })
            .await;
            assert_eq!(pending["reason"], "Pending");
            assert!(pending["message"].as_str().is_some_and(|m| m
                .starts_with("the tunnel's ingress document could not be written: key")));
        }
        t.api.put(credentials("{api-token: cf-token-a}"));
        for route in ["shop", "late"] {
            eventually(&format!("{route} accepted and written"), || {
                route_parent(&t.api, "tenant-a", route).filter(|p| {
                    condition(&p["conditions"], "Accepted").is_some_and(|c| c["status"] == "True")
                        && condition(&p["conditions"], "cf.k8s.lex.la/TunnelDocumentWritten")
                            .is_none()
                })
            })
            .await;
        }
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A tunnel write that outlives its round does not have a route on a hostname the tunnel's
/// last document lacks taken for served: it waits, `Accepted=Unknown` (`Pending`), until the
/// document is written (DNS records follow `Accepted`, and the write may yet fail).
#[tokio::test]
async fn a_route_waits_for_a_tunnel_write_that_outlives_its_round() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (cloudflare, t) = writing_its_tunnel_with_its_own_token().await;
        let carries = |host: &str| {
            cloudflare
                .config("acct", TUNNEL_ID)
                .is_some_and(|(_, d)| d.to_string().contains(host))
        };
        // The listener's hostname changes, and the write of the document naming it takes
        // longer than a round waits.
        cloudflare.slow_next_put(Duration::from_secs(4));
        t.api.put(yaml(
            &gateway(true).replace("shop.example.com", "store.example.com"),
        ));
        let pending = eventually("shop pending", || {
            route_condition(&t.api, "tenant-a", "shop", "Accepted")
                .filter(|c| c["status"] == "Unknown")
        })
        .await;
        assert_eq!(pending["reason"], "Pending");
        assert_eq!(
            pending["message"],
            "the tunnel's ingress document is being written"
        );
        assert!(
            !carries("store.example.com"),
            "reported before the write landed"
        );
        eventually("shop accepted once written", || {
            route_condition(&t.api, "tenant-a", "shop", "Accepted")
                .filter(|c| c["status"] == "True")
        })
        .await;
        assert!(carries("store.example.com"));
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// A route edited into a form this build cannot read (a port past its field's range) is left
/// out of every plane: our parent in its status says so, not the `Accepted=True` it had, and
/// another controller's parent stays as it was. Readable again, it is accepted again.
#[tokio::test]
async fn a_route_this_build_cannot_read_is_no_longer_accepted_saying_why() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        let accepted = |status: &'static str| {
            let api = &t.api;
            move || {
                route_condition(api, "tenant-a", "shop", "Accepted")
                    .filter(|c| c["status"] == status)
            }
        };
        eventually("shop accepted", accepted("True")).await;
        let theirs = json!({"parentRef": {"name": "other"}, "controllerName": "example.com/other", "conditions": []});
        let mut route = t
            .api
            .get("gateway.networking.k8s.io/v1", "HTTPRoute", "tenant-a", "shop")
            .expect("the route");
        if let Some(parents) = route["status"]["parents"].as_array_mut() {
            parents.insert(0, theirs.clone());
        }
        t.api.put(route);
        let shop = |port: &str| {
            yaml(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: shop, namespace: tenant-a}}\nspec:\n  parentRefs: [{{name: edge}}]\n  rules: [{{backendRefs: [{{name: web, port: {port}}}]}}]\n"
            ))
        };
        t.api.put(shop("99999999999"));
        let refused = eventually("shop refused", accepted("False")).await;
        assert_eq!(refused["reason"], "UnsupportedValue");
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("this controller cannot read the route")),
            "{refused}"
        );
        let route = t
            .api
            .get("gateway.networking.k8s.io/v1", "HTTPRoute", "tenant-a", "shop")
            .expect("the route");
        assert_eq!(refused["observedGeneration"], route["metadata"]["generation"]);
        assert_eq!(route["status"]["parents"][0], theirs);
        let resolved = route_condition(&t.api, "tenant-a", "shop", "ResolvedRefs");
        assert_eq!(resolved.map(|c| c["status"].clone()), Some(json!("True")));

        t.api.put(shop("80"));
        eventually("shop accepted again", accepted("True")).await;
        t.stop().await;
    })
    .await
    .expect("in time");
}

/// Another installation's Gateway moved from its class `theirs-old` to its class `theirs-new`,
/// `theirs-old` deleted before that installation relabels the plane (it was not leading): the
/// plane's label names a class that is gone, but the Gateway is on a listed class of another
/// controller, and this controller leaves its plane alone.
#[tokio::test]
async fn another_installations_plane_for_a_deleted_class_of_its_own_is_left_alone() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let t = Tenant::start("replicas: 1").await;
        // The other installation's plane for it, rendered while it was on `theirs-old`.
        another_installations_plane(&t, "theirs-new", "theirs-old").await;
        assert!(t
            .api
            .get("apps/v1", "Deployment", "tenant-a", "cf-proxy-edge")
            .is_some());
        t.stop().await;
    })
    .await
    .expect("in time");
}
