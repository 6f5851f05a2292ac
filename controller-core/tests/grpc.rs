//! GRPCRoute end to end: a real gRPC client (tonic) talks through an in-process proxy, configured
//! by the translator, to a real gRPC server. Checks method matching, response header filters,
//! that the `grpc-status` trailer arrives, and the proxy's answer to an unmatched gRPC method.

use std::net::SocketAddr;
use std::time::Duration;

use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{self, ObjectKey, Options, Snapshot};
use cftunnel_proxy::{Server, ServerOptions};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TIMEOUT: Duration = Duration::from_secs(10);

fn manifests(backend: SocketAddr) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cf}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: grpc}}
spec:
  gatewayClassName: cf
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: health, namespace: grpc}}
spec: {{ports: [{{name: grpc, port: 50051, targetPort: 50051}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: health-a, namespace: grpc, labels: {{kubernetes.io/service-name: health}}}}
addressType: IPv4
ports: [{{name: grpc, port: {port}}}]
endpoints: [{{addresses: ["{ip}"]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: health, namespace: grpc}}
spec:
  parentRefs: [{{name: edge}}]
  rules:
  - matches: [{{method: {{service: grpc.health.v1.Health, method: Check}}}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served-by, value: grpcroute}}]}}
    backendRefs: [{{name: health, port: 50051}}]
"#,
        ip = backend.ip(),
        port = backend.port(),
    )
}

#[tokio::test]
async fn grpc_route_serves_matched_methods_and_answers_unmatched_ones_with_unimplemented() {
    tokio::time::timeout(TIMEOUT, scenario())
        .await
        .expect("the scenario finishes in time");
}

async fn scenario() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("shop.Cart", tonic_health::ServingStatus::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gRPC server");
    let backend = listener.local_addr().expect("server address");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &manifests(backend), "grpc.yaml").expect("manifests parse");
    let output = translate::translate(&snapshot, &Options::default());
    let plane = &output.planes[&ObjectKey::new("grpc", "edge")];
    let config = output.configs[plane].clone();
    assert!(config.has_grpc_route);

    let proxy = Server::start(ServerOptions::default(), Some(config))
        .await
        .expect("the proxy starts");
    let channel = Channel::from_shared(format!("http://{}", proxy.data_addr()))
        .expect("valid endpoint")
        .connect()
        .await
        .expect("connect to the proxy");
    let mut client = HealthClient::new(channel);

    let response = client
        .check(HealthCheckRequest {
            service: "shop.Cart".to_owned(),
        })
        .await
        .expect("Check is routed to the backend");
    assert_eq!(
        response
            .metadata()
            .get("x-served-by")
            .and_then(|v| v.to_str().ok()),
        Some("grpcroute")
    );
    // tonic merges the trailers into the response metadata.
    assert_eq!(
        response
            .metadata()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()),
        Some("0"),
        "the grpc-status trailer crossed the proxy"
    );
    assert_eq!(response.into_inner().status, ServingStatus::Serving as i32);

    let unknown = client
        .check(HealthCheckRequest {
            service: "shop.Unknown".to_owned(),
        })
        .await
        .expect_err("the backend's own error status crosses the proxy in the trailers");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let unmatched = client
        .watch(HealthCheckRequest {
            service: "shop.Cart".to_owned(),
        })
        .await
        .expect_err("Watch matches no rule");
    assert_eq!(unmatched.code(), tonic::Code::Unimplemented);

    proxy.shutdown().await;
    server.abort();
}
