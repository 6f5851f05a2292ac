//! A rendered data plane runs: the proxy binary, started with exactly the environment the
//! rendered pod spec gives it (each Secret key read byte for byte, as the kubelet does),
//! registers with the tunnel its token names, answers the rendered probes, takes the translated
//! config only with the token the controller resolved, and serves the Gateway's route through
//! the mock edge.

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::Answer;
use bytes::Bytes;
use cftunnel_controller::manifest;
use cftunnel_controller::render::{self, RenderSettings};
use cftunnel_controller::translate::{self, ObjectKey, Options, PlaneKey, Snapshot};
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::Token;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::Container;

const TUNNEL_ID: &str = "1f0e4a43-5a0b-4d3e-9c55-1f2d7c3b8e21";

/// The workspace's `cftunnel-proxy`, built beside this test (`cargo test --workspace` builds it
/// for the proxy's own tests).
fn proxy_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("cftunnel-proxy"));
    match bin {
        Some(bin) if bin.is_file() => bin,
        _ => panic!("cftunnel-proxy is not built: run cargo build -p cftunnel-proxy, or cargo test --workspace"),
    }
}

fn manifests(token: &str, backend: SocketAddr) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cloudflare-tunnel}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-tunnel-token, namespace: tenant-a}}
stringData: {{tunnel-token: "{token}\n"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: edge-api, namespace: tenant-a}}
stringData: {{bearer: "s3cr3t\n"}}
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: GatewayConfig
metadata: {{name: edge-config, namespace: tenant-a}}
spec:
  tunnelTokenSecretRef: {{name: edge-tunnel-token}}
  authTokenSecretRef: {{name: edge-api, key: bearer}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: tenant-a}}
spec:
  gatewayClassName: cloudflare-tunnel
  infrastructure:
    parametersRef: {{group: cf.k8s.lex.la, kind: GatewayConfig, name: edge-config}}
  listeners: [{{name: web, port: 80, protocol: HTTP, hostname: shop.example.com}}]
---
{web}apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: tenant-a}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
        web = support::web_service("tenant-a", backend),
    )
}

/// The container's environment as the kubelet builds it: literal values, and Secret keys
/// byte for byte (a trailing newline included).
fn kubelet_env(
    container: &Container,
    snapshot: &Snapshot,
    namespace: &str,
) -> Vec<(String, String)> {
    container
        .env
        .iter()
        .flatten()
        .map(|var| {
            if let Some(value) = &var.value {
                return (var.name.clone(), value.clone());
            }
            let selector = var
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .unwrap_or_else(|| panic!("{} has a value or a Secret key", var.name));
            let secret = snapshot
                .secrets
                .iter()
                .find(|s| {
                    s.metadata.namespace.as_deref() == Some(namespace)
                        && s.metadata.name.as_deref() == Some(selector.name.as_str())
                })
                .unwrap_or_else(|| panic!("{}: Secret {} exists", var.name, selector.name));
            let value = secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(&selector.key))
                .unwrap_or_else(|| panic!("{}: key {} exists", var.name, selector.key));
            (var.name.clone(), value.clone())
        })
        .collect()
}

async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> Answer {
    support::request(addr, method, path, "proxy", bearer, body)
        .await
        .expect("the proxy answers")
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let by = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < by, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the proxy when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_rendered_pod_spec_runs_the_proxy_behind_its_tunnel() {
    let echo = support::echo("tenant-a", "web-1").await;
    let edge = MockEdge::start().await.expect("mock edge starts");
    let tunnel_id: uuid::Uuid = TUNNEL_ID.parse().expect("uuid");
    let token = Token::new(
        "tenant-a-account",
        b"tenant a's tunnel secret".to_vec(),
        tunnel_id,
    )
    .encode();

    let mut snapshot = Snapshot::default();
    manifest::load_into(
        &mut snapshot,
        &manifests(&token, echo.http_addr()),
        "tenant-a.yaml",
    )
    .expect("manifests parse");
    let gateway = &snapshot.gateways[0];
    let config = &snapshot.gateway_configs[0];
    let credentials =
        render::resolve(gateway, config, &snapshot.secrets, "unused").expect("credentials resolve");
    let settings = RenderSettings {
        proxy_image: Some("cftunnel-proxy:test".to_owned()),
        ..RenderSettings::default()
    };
    let plane = render::render(gateway, config, &credentials, &settings).expect("renders");
    assert_eq!(plane.address, format!("{TUNNEL_ID}.cfargotunnel.com"));
    let options = Options {
        proxy_image: settings.proxy_image.clone(),
        ..Options::default()
    };
    let output = translate::translate(&snapshot, &options);
    let key = ObjectKey::new("tenant-a", "edge");
    assert_eq!(
        output.planes.get(&key),
        Some(&PlaneKey::Dedicated(key.clone()))
    );
    let mut doc = output.configs[&PlaneKey::Dedicated(key)].clone();
    doc.version = 1;
    let doc = serde_json::to_string(&doc).expect("config encodes");

    let pod = plane
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let container = &pod.containers[0];
    let env = kubelet_env(container, &snapshot, "tenant-a");
    let config_port = container.ports.as_ref().expect("ports")[0].container_port;
    assert!(
        env.contains(&("PROXY_CONFIG_ADDR".to_owned(), format!(":{config_port}"))),
        "the proxy listens where the probes and the Service look: {env:?}"
    );
    let probe_path = |probe: Option<&k8s_openapi::api::core::v1::Probe>| {
        probe
            .and_then(|p| p.http_get.as_ref())
            .and_then(|g| g.path.clone())
            .expect("an HTTP probe")
    };
    let readiness = probe_path(container.readiness_probe.as_ref());
    let liveness = probe_path(container.liveness_probe.as_ref());

    // What differs from a cluster: the edge is the mock on loopback, and the config API takes
    // a free loopback port instead of the pod's own 8081.
    let dir = std::env::temp_dir().join(format!("cftunnel-render-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let ca = dir.join("edge-ca.pem");
    edge.write_ca_pem(&ca).await.expect("CA written");
    let admin = cftunnel_testkit::ports::free_port().expect("a free port");
    let _proxy = Child(
        Command::new(proxy_bin())
            .env_remove("TUNNEL_TOKEN")
            .env_remove("PROXY_AUTH_TOKEN")
            .env_remove("PROXY_CONFIG_FILE")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("TUNNEL_EDGE", edge.edge_addr().to_string())
            .env("TUNNEL_CACERT", &ca)
            .env("PROXY_CONFIG_ADDR", admin.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the proxy starts"),
    );

    until("the liveness probe passes", async || {
        tokio::net::TcpStream::connect(admin).await.is_ok()
            && call(admin, "GET", &liveness, None, "").await.status == 200
    })
    .await;
    // Not ready without a config. (In auto mode the connector waits briefly for the first
    // push before it dials, to learn whether gRPC needs HTTP/2.)
    assert_eq!(call(admin, "GET", &readiness, None, "").await.status, 503);

    // Pushes need the token the controller resolved: the Secret's value without its newline.
    assert_eq!(call(admin, "PUT", "/config", None, &doc).await.status, 401);
    assert_eq!(
        call(admin, "PUT", "/config", Some("wrong"), &doc)
            .await
            .status,
        401
    );
    let pushed = call(admin, "PUT", "/config", Some(&credentials.auth_token), &doc).await;
    assert_eq!(pushed.status, 200, "{:?}", pushed.body);
    until("the readiness probe passes", async || {
        call(admin, "GET", &readiness, None, "").await.status == 200
    })
    .await;
    // The edge records a registration as it answers it, so the record may trail readiness.
    until("the edge records the registration", async || {
        !edge.registrations().is_empty()
    })
    .await;
    let registered = edge.registrations();
    for r in &registered {
        assert_eq!(
            r.tunnel_id,
            tunnel_id.as_bytes().to_vec(),
            "the token's tunnel"
        );
        assert_eq!(r.account_tag, "tenant-a-account");
    }

    // The Gateway's route, through the tunnel.
    let req = http::Request::builder()
        .uri("/cart")
        .header("host", "shop.example.com")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let res = edge.request(req).await;
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let echoed: serde_json::Value = serde_json::from_slice(&body).expect("echo JSON");
    assert_eq!(echoed["path"], "/cart");
    assert_eq!(echoed["pod"], "web-1");
    let _ = std::fs::remove_dir_all(&dir);
}
