//! ExternalBackends over TLS and gRPC end to end: ExternalBackends pointing at echo backends on
//! loopback (`--external-name-backends=any`, as loopback is not public) are translated, the
//! document applied to an in-process proxy, and requests go through it over real sockets.
//! An `https` one whose certificate comes from a private CA is reached with `spec.tls` naming
//! that CA (from a ConfigMap or a Secret) and the certificate's name; without the CA, or with
//! another name, the proxy refuses the backend's certificate; a CA reference that cannot be
//! used fails closed (500) without touching the other routes. A GRPCRoute's ExternalBackend is
//! dialled over HTTP/2: h2c for `http`, ALPN `h2` for `https`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{
    self, ConditionType, ExternalNameBackends, ObjectKey, Options, Output, PlaneKey, Reason,
    RouteKey, RouteKind, Snapshot,
};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};
use cftunnel_testkit::grpc_echo::client::{call_once, Call};
use cftunnel_testkit::grpc_echo::{proto, GrpcEchoServer};
use cftunnel_testkit::pki::TestPki;

const TIMEOUT: Duration = Duration::from_secs(20);
const ORIGIN_NAME: &str = "origin.shop.internal";

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: cf
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;

fn external_backend(name: &str, scheme: &str, backend: SocketAddr, tls: &str) -> String {
    format!(
        "---\napiVersion: cf.k8s.lex.la/v1alpha1\nkind: ExternalBackend\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{scheme: {scheme}, host: \"{}\", port: {}{tls}}}\n",
        backend.ip(),
        backend.port()
    )
}

/// The CA's ConfigMap and Secret; one ExternalBackend per way of verifying the TLS echo, each
/// behind a path of the route `shop`; and the route `broken`, whose ExternalBackend names a
/// CA that does not exist.
fn https_manifests(backend: SocketAddr, ca: &str) -> String {
    let mut out = format!(
        "{GATEWAY}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: origin-ca, namespace: shop}}\ndata:\n  ca.crt: |\n{pem}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: origin-ca, namespace: shop}}\nstringData:\n  ca.crt: |\n{pem}",
        pem = indent(ca)
    );
    let with_ca = |kind: &str, hostname: &str| {
        format!(", tls: {{caCertificateRefs: [{{kind: {kind}, name: origin-ca}}], hostname: {hostname}}}")
    };
    for (name, tls) in [
        ("trusted", with_ca("ConfigMap", ORIGIN_NAME)),
        ("trusted-secret", with_ca("Secret", ORIGIN_NAME)),
        ("web-roots", format!(", tls: {{hostname: {ORIGIN_NAME}}}")),
        ("wrong-name", with_ca("ConfigMap", "other.shop.internal")),
        (
            "missing-ca",
            format!(", tls: {{caCertificateRefs: [{{kind: ConfigMap, name: absent}}], hostname: {ORIGIN_NAME}}}"),
        ),
    ] {
        out.push_str(&external_backend(name, "https", backend, &tls));
    }
    out.push_str(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shop, namespace: shop}\nspec:\n  parentRefs: [{name: edge}]\n  hostnames: [shop.example.com]\n  rules:\n",
    );
    for name in ["trusted", "trusted-secret", "web-roots", "wrong-name"] {
        out.push_str(&format!(
            "  - matches: [{{path: {{type: PathPrefix, value: /{name}}}}}]\n    backendRefs: [{{group: cf.k8s.lex.la, kind: ExternalBackend, name: {name}}}]\n"
        ));
    }
    out.push_str(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: broken, namespace: shop}\nspec:\n  parentRefs: [{name: edge}]\n  hostnames: [broken.example.com]\n  rules: [{backendRefs: [{group: cf.k8s.lex.la, kind: ExternalBackend, name: missing-ca}]}]\n",
    );
    out
}

fn translated(manifests: &str) -> (Output, cftunnel_config::Config) {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, manifests, "external-backend-tls.yaml").expect("parses");
    let output = translate::translate(
        &snapshot,
        &Options {
            external_name_backends: ExternalNameBackends::Any,
            ..Options::default()
        },
    );
    let config = output.configs[&PlaneKey::Shared].clone();
    (output, config)
}

fn resolved_refs(output: &Output, kind: RouteKind, name: &str) -> (bool, Reason, String) {
    let parents = &output.statuses.routes[&RouteKey {
        kind,
        key: ObjectKey::new("shop", name),
    }];
    let c = parents[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    (c.status, c.reason, c.message.clone())
}

async fn get(proxy: SocketAddr, host: &str, path: &str) -> (u16, serde_json::Value) {
    cftunnel_testkit::client::get_json(proxy, host, path).await
}

fn identity(pod: &str) -> EchoIdentity {
    EchoIdentity {
        namespace: "origin".to_owned(),
        pod: pod.to_owned(),
    }
}

#[tokio::test]
async fn an_https_external_backend_is_verified_with_its_own_ca_and_hostname() {
    tokio::time::timeout(TIMEOUT, async {
        let pki = TestPki::for_names(&[ORIGIN_NAME]).expect("PKI");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let echo = EchoServer::start_tls(
            EchoConfig {
                http_addr: "127.0.0.1:0".parse().expect("address"),
                h2c_addr: "127.0.0.1:0".parse().expect("address"),
                identity: identity("origin-1"),
                record_log: true,
                print_log: false,
            },
            Arc::new(pki.tcp_server(provider).expect("server config")),
        )
        .await
        .expect("echo starts");
        let backend = echo.tls_addr().expect("TLS port");
        let (output, config) = translated(&https_manifests(backend, pki.ca_pem()));
        assert_eq!(
            resolved_refs(&output, RouteKind::Http, "shop"),
            (true, Reason::ResolvedRefs, String::new())
        );
        let (status, reason, message) = resolved_refs(&output, RouteKind::Http, "broken");
        assert_eq!((status, reason), (false, Reason::InvalidCACertificateRef));
        assert!(
            message.contains("spec.tls.caCertificateRefs[0]: ConfigMap shop/absent not found"),
            "{message}"
        );

        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts with the translated document");
        let addr = proxy.data_addr();
        for path in ["/trusted/orders", "/trusted-secret/orders"] {
            let (status, body) = get(addr, "shop.example.com", path).await;
            assert_eq!(status, 200, "{path}: {body}");
            assert_eq!(body["path"], path);
            assert_eq!(
                body["tls"]["serverName"], ORIGIN_NAME,
                "the hostname is the SNI"
            );
        }
        let seen = echo.log_lines().len();
        // The platform's web roots do not know the private CA; the certificate is not for
        // the other name: the proxy refuses the certificate and sends nothing.
        assert_eq!(get(addr, "shop.example.com", "/web-roots").await.0, 502);
        assert_eq!(get(addr, "shop.example.com", "/wrong-name").await.0, 502);
        assert_eq!(
            echo.log_lines().len(),
            seen,
            "no request reached the backend"
        );
        // A CA that cannot be used fails closed, and only that route.
        assert_eq!(get(addr, "broken.example.com", "/").await.0, 500);
        assert_eq!(echo.log_lines().len(), seen);
        assert_eq!(get(addr, "shop.example.com", "/trusted").await.0, 200);

        proxy.shutdown().await;
    })
    .await
    .expect("in time");
}

fn grpc_manifests(plain: SocketAddr, tls: SocketAddr, ca: &str) -> String {
    let mut out = format!(
        "{GATEWAY}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: origin-ca, namespace: shop}}\ndata:\n  ca.crt: |\n{}",
        indent(ca)
    );
    out.push_str(&external_backend("grpc-plain", "http", plain, ""));
    out.push_str(&external_backend(
        "grpc-tls",
        "https",
        tls,
        &format!(", tls: {{caCertificateRefs: [{{kind: ConfigMap, name: origin-ca}}], hostname: {ORIGIN_NAME}}}"),
    ));
    for name in ["grpc-plain", "grpc-tls"] {
        out.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  parentRefs: [{{name: edge}}]\n  hostnames: [{name}.example.com]\n  rules: [{{backendRefs: [{{group: cf.k8s.lex.la, kind: ExternalBackend, name: {name}}}]}}]\n"
        ));
    }
    out
}

#[tokio::test]
async fn a_grpc_call_reaches_an_external_backend_over_h2c_and_over_tls() {
    tokio::time::timeout(TIMEOUT, async {
        let pki = TestPki::for_names(&[ORIGIN_NAME]).expect("PKI");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let loopback = "127.0.0.1:0".parse().expect("address");
        let plain = GrpcEchoServer::bind(loopback, identity("grpc-plain-1"))
            .await
            .expect("gRPC echo starts");
        let tls = GrpcEchoServer::bind_tls(
            loopback,
            identity("grpc-tls-1"),
            Arc::new(pki.tcp_server(provider).expect("server config")),
        )
        .await
        .expect("gRPC echo over TLS starts");
        let (output, config) = translated(&grpc_manifests(plain.addr(), tls.addr(), pki.ca_pem()));
        for name in ["grpc-plain", "grpc-tls"] {
            assert_eq!(
                resolved_refs(&output, RouteKind::Grpc, name),
                (true, Reason::ResolvedRefs, String::new())
            );
        }
        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts with the translated document");
        for (name, pod) in [("grpc-plain", "grpc-plain-1"), ("grpc-tls", "grpc-tls-1")] {
            let outcome = call_once(
                proxy.data_addr(),
                &Call {
                    authority: format!("{name}.example.com"),
                    path: proto::ECHO.to_owned(),
                    metadata: Vec::new(),
                    timeout: Duration::from_secs(5),
                },
            )
            .await;
            assert_eq!(outcome.code, tonic::Code::Ok, "{name}: {}", outcome.message);
            let assertions = outcome
                .response
                .and_then(|r| r.assertions)
                .expect("the echo's assertions");
            assert_eq!(assertions.fully_qualified_method, proto::ECHO);
            assert_eq!(
                assertions.context.map(|c| c.pod).as_deref(),
                Some(pod),
                "{name}: answered by its own backend"
            );
        }
        proxy.shutdown().await;
    })
    .await
    .expect("in time");
}
