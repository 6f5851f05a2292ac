//! The controller binary's traces, configured by the standard `OTEL_*` variables alone: each
//! round's config sync is a span, with a client span under it for every Cloudflare API call
//! and, per plane, a push span holding the calls to each pod's config API; failures are
//! error spans.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cftunnel_controller::runtime::REQUIRED_RBAC;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::cloudflare_api::CloudflareApi;
use cftunnel_testkit::kube_api::ApiServer;
use cftunnel_testkit::otlp::{OtlpReceiver, RecordedSpan, SpanKind, SpanStatus};
use cftunnel_tunnel::Token;

const TUNNEL_ID: &str = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
const PUT_CONFIGURATION: &str = "PUT /accounts/{account_id}/cfd_tunnel/{tunnel_id}/configurations";

/// A Gateway with its own plane on tunnel `TUNNEL_ID`, whose document is written with its
/// GatewayConfig's Cloudflare token, a route to `backend`, and the plane's pod listed at
/// `pod` (its config port).
fn seed(token: &str, backend: SocketAddr, pod: SocketAddr) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cloudflare-tunnel}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
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
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shop.example.com}}]
---
{web}apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: tenant-a}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: cf-proxy-edge-config-x1, namespace: tenant-a, labels: {{kubernetes.io/service-name: cf-proxy-edge-config, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}}}
addressType: IPv4
ports: [{{name: config, port: {port}}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: false}}}}]
"#,
        web = support::web_service("tenant-a", backend),
        port = pod.port(),
        ip = pod.ip(),
    )
}

fn parent_of<'a>(spans: &'a [RecordedSpan], child: &RecordedSpan) -> Option<&'a RecordedSpan> {
    spans
        .iter()
        .find(|s| s.trace_id == child.trace_id && s.span_id == child.parent_span_id)
}

#[tokio::test]
async fn the_controller_traces_its_cloudflare_calls_and_config_pushes() {
    let receiver = OtlpReceiver::start().await.expect("receiver starts");
    let echo = support::echo("tenant-a", "web-1").await;
    let cloudflare = CloudflareApi::start().await;
    cloudflare.allow("acct", "cf-token-a");
    // The first write is refused (429), the one after its Retry-After goes through.
    cloudflare.rate_limit_next(1);
    let pod = Server::start(
        ServerOptions {
            auth_token: Some("s3cr3t".to_owned()),
            ..ServerOptions::default()
        },
        None,
    )
    .await
    .expect("proxy starts");
    let tunnel: uuid::Uuid = TUNNEL_ID.parse().expect("uuid");
    let token = Token::new("acct", b"tunnel secret".to_vec(), tunnel).encode();
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(seed(&token, echo.http_addr(), pod.admin_addr()))
        .start()
        .await;
    let dir =
        std::env::temp_dir().join(format!("cftunnel-controller-trace-{}", std::process::id()));
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
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-controller"))
        .args([
            "run",
            "--proxy-image",
            "proxy:traced",
            "--leader-election=false",
            "--resync-seconds=1",
            "--health-addr=127.0.0.1:0",
            "--cloudflare-api",
        ])
        .arg(cloudflare.base())
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", "cftunnel-system")
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=test")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the controller starts");

    // Until the document is written and the pod pushed to, and both are exported with the
    // spans they ran under: a parent ends after its children, so it may come in a later batch.
    let by = Instant::now() + Duration::from_secs(45);
    let spans = loop {
        let spans = receiver.spans();
        let written = spans.iter().any(|s| {
            s.name == PUT_CONFIGURATION && s.int("http.response.status_code") == Some(200)
        });
        let pushed = spans
            .iter()
            .any(|s| s.name == "PUT /config" && s.int("http.response.status_code") == Some(200));
        let parents_in = spans
            .iter()
            .filter(|s| {
                [PUT_CONFIGURATION, "PUT /config", "config.push"].contains(&s.name.as_str())
            })
            .all(|s| parent_of(&spans, s).is_some());
        if written && pushed && parents_in {
            break spans;
        }
        assert!(
            Instant::now() < by,
            "a written document and a push, traced: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = child.kill().await;

    for span in &spans {
        assert_eq!(
            span.resource_str("service.name"),
            Some("cftunnel-controller")
        );
        assert_eq!(span.resource_str("k8s.cluster.name"), Some("test"));
        assert_eq!(span.scope, "cftunnel-controller");
    }
    let calls: Vec<&RecordedSpan> = spans
        .iter()
        .filter(|s| s.name == PUT_CONFIGURATION)
        .collect();
    let refused = calls
        .iter()
        .find(|s| s.int("http.response.status_code") == Some(429))
        .expect("the refused write, traced");
    assert_eq!(refused.kind, SpanKind::Client);
    assert_eq!(refused.status, SpanStatus::Error);
    assert!(refused.status_message.contains("429"), "{refused:#?}");
    let written = calls
        .iter()
        .find(|s| s.int("http.response.status_code") == Some(200))
        .expect("the write");
    assert_eq!(written.status, SpanStatus::Unset);
    assert_eq!(written.str("http.request.method"), Some("PUT"));
    assert_eq!(written.str("cloudflare.tunnel_id"), Some(TUNNEL_ID));
    assert_eq!(
        written.str("url.full"),
        Some(
            format!(
                "{}/accounts/acct/cfd_tunnel/{TUNNEL_ID}/configurations",
                cloudflare.base()
            )
            .as_str()
        )
    );
    for call in [*refused, *written] {
        let sync = parent_of(&spans, call).expect("a Cloudflare call's parent is exported");
        assert_eq!(sync.name, "config.sync");
        assert_eq!(sync.parent_span_id, "", "a round is a trace of its own");
    }

    let put = spans
        .iter()
        .find(|s| s.name == "PUT /config" && s.int("http.response.status_code") == Some(200))
        .expect("the push");
    assert_eq!(put.kind, SpanKind::Client);
    assert_eq!(put.str("server.address"), Some("127.0.0.1"));
    assert_eq!(
        put.int("server.port"),
        Some(i64::from(pod.admin_addr().port()))
    );
    let push = parent_of(&spans, put).expect("the push's plane span");
    assert_eq!(push.name, "config.push");
    assert_eq!(push.str("cftunnel.plane"), Some("gateway tenant-a/edge"));
    assert_eq!(push.int("cftunnel.pods"), Some(1));
    assert_eq!(push.int("cftunnel.pods_pushed"), Some(1));
    assert_eq!(push.status, SpanStatus::Unset);
    // The pod's version is asked first, in the same plane span.
    assert!(
        spans
            .iter()
            .any(|s| s.name == "GET /config" && s.parent_span_id == push.span_id),
        "{spans:#?}"
    );
    assert_eq!(
        parent_of(&spans, push).map(|s| s.name.as_str()),
        Some("config.sync")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
