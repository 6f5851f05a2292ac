//! A controller whose first list of an optional kind (here AccessPolicy) keeps failing, other
//! than as absent, when it starts: it stays unready, pushes nothing and, with leader election,
//! would not start its elector, rather than reconciling as if none existed (every rule an
//! AccessPolicy protects answering 500). Once the list comes, its first pushed document has
//! the rule's requirement. Runs the controller against the stand-in API server, pushing to a
//! real proxy behind a tap.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cftunnel_controller::render::RenderSettings;
use cftunnel_controller::runtime::{self, health::Health, RuntimeOptions, REQUIRED_RBAC};
use cftunnel_controller::translate::Options;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::config_tap::ConfigTap;
use cftunnel_testkit::kube_api::ApiServer;
use cftunnel_tunnel::Token;
use serde_json::{json, Value};

const TUNNEL_ID: &str = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
const CONTROLLER: &str = "cf.k8s.lex.la/tunnel-controller";

/// Gateway `edge` of tenant-a on a dedicated plane (its one pod the real proxy behind `tap`),
/// route `guarded` whose rule `staff` requires AccessPolicy `staff`, and Service `web` in
/// front of `backend`.
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
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec:
  tunnelTokenSecretRef: {{name: edge-tunnel-token}}
  authTokenSecretRef: {{name: edge-api, key: bearer}}
  replicas: 1
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: tenant-a}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure: {{parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}}}
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
apiVersion: cf.k8s.lex.la/v1alpha1
kind: AccessPolicy
metadata: {{name: staff, namespace: tenant-a}}
spec: {{teamName: Acme, audiences: [aud-staff]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: guarded, namespace: tenant-a}}
spec:
  parentRefs: [{{name: edge}}]
  rules:
  - name: staff
    filters: [{{type: ExtensionRef, extensionRef: {{group: cf.k8s.lex.la, kind: AccessPolicy, name: staff}}}}]
    backendRefs: [{{name: web, port: 80}}]
---
{web}"#,
        tap_port = tap.port(),
        web = support::web_service("tenant-a", backend),
    )
}

/// The rule of route `guarded` in a pushed document.
fn guarded_rule(doc: &Value) -> Option<&Value> {
    doc["rules"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == "tenant-a/guarded/staff")
}

/// `/readyz`'s status; 0 when it cannot be reached.
async fn readyz(health: SocketAddr) -> u16 {
    support::request(health, "GET", "/readyz", "controller", None, "")
        .await
        .map_or(0, |a| a.status)
}

/// The AccessPolicy list fails (500) for 8 s, longer than the short wait for optional kinds
/// (1 s here) and than kube's backoff's first steps: the controller stays unready and pushes
/// nothing meanwhile; once the list is answered it becomes ready, and the first document it
/// pushes carries the rule's Access requirement.
#[tokio::test]
async fn a_late_access_policy_list_keeps_the_controller_unready_and_its_pushes_back() {
    tokio::time::timeout(Duration::from_secs(60), async {
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
        let failing = api.fail(500, |c| c.kind == "AccessPolicy" && c.method == "GET");

        let health = Arc::new(Health::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health_addr = listener.local_addr().expect("addr");
        let served = tokio::spawn(runtime::health::serve(listener, Arc::clone(&health)));
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
            crd_wait: Duration::from_secs(1),
            ..RuntimeOptions::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let controller = tokio::spawn(runtime::run(
            api.client(),
            options,
            Arc::clone(&health),
            async {
                let _ = stopped.await;
            },
        ));

        failing.refused(1).await;
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until {
            assert_eq!(
                readyz(health_addr).await,
                503,
                "ready while the AccessPolicies are not listed"
            );
            assert_eq!(
                tap.last(),
                None,
                "pushed while the AccessPolicies are not listed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        failing.lift();

        let by = Instant::now() + Duration::from_secs(30);
        let doc = loop {
            if let Some(doc) = tap.last() {
                break doc;
            }
            assert!(Instant::now() < by, "nothing pushed once listed");
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        assert_eq!(readyz(health_addr).await, 200);
        let rule = guarded_rule(&doc).unwrap_or_else(|| panic!("the guarded rule in {doc}"));
        assert_eq!(
            rule["access"],
            json!({"teamName": "Acme", "audiences": ["aud-staff"]}),
            "the first document pushed requires the policy: {rule}"
        );

        let _ = stop.send(());
        controller
            .await
            .expect("task")
            .expect("the controller stops cleanly");
        served.abort();
    })
    .await
    .expect("in time");
}
