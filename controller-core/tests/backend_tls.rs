//! TLS to backends end to end: BackendTLSPolicies, a ConfigMap CA and a Gateway's client
//! certificate Secret are translated, the document is applied to an in-process proxy, and
//! requests go through it over real sockets to an echo backend that serves TLS with its own CA
//! and requires a client certificate. Checks SNI, the CA and subject alternative names
//! (hostname and URI), failing closed on a policy without a usable CA, the statuses, and that a
//! rotated client certificate Secret is presented on the next connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{
    self, ConditionType, ObjectKey, Options, Output, PlaneKey, Reason, Snapshot,
};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};
use cftunnel_testkit::pki::TestPki;

const TIMEOUT: Duration = Duration::from_secs(20);
const BACKEND_NAME: &str = "api.shop.internal";
const BACKEND_URI: &str = "spiffe://cluster.local/ns/shop/sa/api";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The Gateway, its client certificate Secret, the backend CA's ConfigMap, one Service per
/// way of checking the backend (all on the one echo backend), their policies and a route.
fn manifests(backend: SocketAddr, server_ca: &str, client: &TestPki) -> String {
    let service = |name: &str| {
        format!(
            r#"
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: shop}}
spec: {{ports: [{{name: https, port: 8443, targetPort: 8443}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-a, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: https, port: {port}}}]
endpoints: [{{addresses: ["{ip}"]}}]"#,
            ip = backend.ip(),
            port = backend.port()
        )
    };
    let policy = |name: &str, service: &str, validation: &str| {
        format!(
            r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: shop, generation: 3}}
spec:
  targetRefs: [{{group: "", kind: Service, name: {service}}}]
  validation: {validation}"#
        )
    };
    let rule = |path: &str, service: &str| {
        format!(
            "\n  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]\n    backendRefs: [{{name: {service}, port: 8443}}]"
        )
    };
    let ca = r#"[{group: "", kind: ConfigMap, name: backend-ca}]"#;
    let mut out = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cf}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: shop, generation: 2}}
spec:
  gatewayClassName: cf
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
  tls: {{backend: {{clientCertificateRef: {{name: gateway-client}}}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: gateway-client, namespace: shop}}
type: kubernetes.io/tls
data: {{tls.crt: {crt}, tls.key: {key}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: backend-ca, namespace: shop}}
data:
  ca.crt: |
{ca}"#,
        crt = b64(&client.leaf_pem()),
        key = b64(&client.key_pem()),
        ca = server_ca
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>(),
    );
    for name in ["api", "api-uri", "api-uri-mismatch", "api-no-ca"] {
        out.push_str(&service(name));
    }
    out.push_str(&policy(
        "api",
        "api",
        &format!("{{caCertificateRefs: {ca}, hostname: {BACKEND_NAME}}}"),
    ));
    // The hostname is the SNI only: the URI is what the certificate is checked for.
    out.push_str(&policy(
        "api-uri",
        "api-uri",
        &format!(
            "{{caCertificateRefs: {ca}, hostname: sni.shop.internal, subjectAltNames: [{{type: URI, uri: \"{BACKEND_URI}\"}}]}}"
        ),
    ));
    out.push_str(&policy(
        "api-uri-mismatch",
        "api-uri-mismatch",
        &format!(
            "{{caCertificateRefs: {ca}, hostname: {BACKEND_NAME}, subjectAltNames: [{{type: URI, uri: \"spiffe://cluster.local/ns/shop/sa/other\"}}]}}"
        ),
    ));
    out.push_str(&policy(
        "api-no-ca",
        "api-no-ca",
        &format!(
            "{{caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: missing}}], hostname: {BACKEND_NAME}}}"
        ),
    ));
    out.push_str(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: shop}
spec:
  parentRefs: [{name: edge}]
  rules:"#,
    );
    for (path, service) in [
        ("/api", "api"),
        ("/uri", "api-uri"),
        ("/mismatch", "api-uri-mismatch"),
        ("/no-ca", "api-no-ca"),
    ] {
        out.push_str(&rule(path, service));
    }
    out.push('\n');
    out
}

fn translated(manifests: &str) -> (Output, cftunnel_config::Config) {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, manifests, "backend-tls.yaml").expect("manifests parse");
    let output = translate::translate(&snapshot, &Options::default());
    let config = output.configs[&PlaneKey::Shared].clone();
    (output, config)
}

/// Status and JSON body (`Null` when not JSON) of `GET path` through the proxy.
async fn get(proxy: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    cftunnel_testkit::client::get_json(proxy, "shop.example.com", path).await
}

fn policy_conditions(output: &Output, name: &str) -> Vec<(ConditionType, bool, Reason)> {
    let ancestors = &output.statuses.backend_tls_policies[&ObjectKey::new("shop", name)];
    assert_eq!(ancestors.len(), 1, "{name}: one ancestor, the Gateway");
    assert_eq!(
        (
            ancestors[0].ancestor_ref.namespace.as_str(),
            ancestors[0].ancestor_ref.name.as_str()
        ),
        ("shop", "edge")
    );
    ancestors[0]
        .conditions
        .iter()
        .map(|c| {
            assert_eq!(c.observed_generation, Some(3));
            (c.kind, c.status, c.reason)
        })
        .collect()
}

#[tokio::test]
async fn backends_get_tls_as_their_policies_say_and_a_rotated_client_certificate() {
    tokio::time::timeout(TIMEOUT, scenario())
        .await
        .expect("the scenario finishes in time");
}

async fn scenario() {
    let server = TestPki::for_names(&[BACKEND_NAME, BACKEND_URI]).expect("server PKI");
    let clients = TestPki::for_names(&["gateway-client"]).expect("client CA");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = server
        .tcp_server_requiring_clients(provider, clients.ca_pem())
        .expect("server config");
    let echo = EchoServer::start_tls(
        EchoConfig {
            http_addr: "127.0.0.1:0".parse().expect("address"),
            h2c_addr: "127.0.0.1:0".parse().expect("address"),
            identity: EchoIdentity {
                namespace: "shop".to_owned(),
                pod: "api-1".to_owned(),
            },
            record_log: true,
            print_log: false,
        },
        Arc::new(tls),
    )
    .await
    .expect("echo starts");
    let backend = echo.tls_addr().expect("TLS port");

    let (output, config) = translated(&manifests(backend, server.ca_pem(), &clients));
    let gateway = &output.statuses.gateways[&ObjectKey::new("shop", "edge")];
    let resolved = gateway
        .conditions
        .iter()
        .find(|c| c.kind == ConditionType::ResolvedRefs)
        .expect("the Gateway says whether its client certificate resolves");
    assert_eq!(
        (resolved.status, resolved.reason),
        (true, Reason::ResolvedRefs)
    );
    for name in ["api", "api-uri", "api-uri-mismatch"] {
        assert_eq!(
            policy_conditions(&output, name),
            [
                (ConditionType::Accepted, true, Reason::Accepted),
                (ConditionType::ResolvedRefs, true, Reason::ResolvedRefs),
            ],
            "{name}"
        );
    }
    assert_eq!(
        policy_conditions(&output, "api-no-ca"),
        [
            (ConditionType::Accepted, false, Reason::NoValidCACertificate),
            (
                ConditionType::ResolvedRefs,
                false,
                Reason::InvalidCACertificateRef
            ),
        ]
    );

    let proxy = Server::start(ServerOptions::default(), Some(config))
        .await
        .expect("the proxy starts with the translated document");
    let addr = proxy.data_addr();

    let (status, body) = get(addr, "/api/orders").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["path"], "/api/orders");
    assert_eq!(
        body["tls"]["serverName"], BACKEND_NAME,
        "the hostname is the SNI"
    );
    assert_eq!(
        body["tls"]["peerCertificates"][0].as_str(),
        Some(clients.leaf_pem().as_str()),
        "the Gateway's client certificate is presented"
    );

    let (status, body) = get(addr, "/uri").await;
    assert_eq!(status, 200, "the URI SAN is accepted: {body}");
    assert_eq!(body["sni"], "sni.shop.internal");
    assert_eq!(get(addr, "/mismatch").await.0, 502, "no SAN matches");
    assert_eq!(
        get(addr, "/no-ca").await.0,
        500,
        "no usable CA: fails closed"
    );

    // The Secret is rotated: a new certificate from the same CA. The controller translates
    // and pushes again; connections opened from then on present the new one.
    let rotated = clients.issue(&["gateway-client-2"]).expect("rotated leaf");
    let (_, mut config) = translated(&manifests(backend, server.ca_pem(), &rotated));
    config.version = 2;
    proxy.apply(config).await.expect("the new document applies");
    let (status, body) = get(addr, "/api/orders").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["tls"]["peerCertificates"][0].as_str(),
        Some(rotated.leaf_pem().as_str()),
        "the rotated certificate is presented"
    );

    proxy.shutdown().await;
}

/// A policy that lost one of its targets to an older policy still gives its other target its
/// settings, and its status says so Gateway by Gateway: `Conflicted` towards the Gateway whose
/// route uses the target it lost, its own `Accepted` towards the one whose route uses the
/// target it kept.
#[test]
fn a_policy_that_lost_a_target_is_in_force_on_its_other_targets_and_says_where_it_is_not() {
    let mut manifests = String::from(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}"#,
    );
    for (gateway, host, service) in [("one", "a.example.com", "a"), ("two", "b.example.com", "b")] {
        manifests.push_str(&format!(
            r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {gateway}, namespace: shop}}
spec:
  gatewayClassName: cf
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: {host}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {gateway}, namespace: shop}}
spec:
  parentRefs: [{{name: {gateway}}}]
  rules: [{{backendRefs: [{{name: {service}, port: 8443}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: {service}, namespace: shop}}
spec: {{ports: [{{name: https, port: 8443}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {service}-1, namespace: shop, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: IPv4
ports: [{{name: https, port: 8443}}]
endpoints: [{{addresses: ["10.0.0.1"]}}]"#
        ));
    }
    for (name, created, targets) in [
        ("older", "2026-01-01T00:00:00Z", "[a]"),
        ("newer", "2026-02-01T00:00:00Z", "[a, b]"),
    ] {
        let targets: Vec<String> = targets
            .trim_matches(['[', ']'])
            .split(", ")
            .map(|t| format!("{{group: \"\", kind: Service, name: {t}}}"))
            .collect();
        manifests.push_str(&format!(
            r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: shop, generation: 1, creationTimestamp: "{created}"}}
spec:
  targetRefs: [{targets}]
  validation: {{wellKnownCACertificates: System, hostname: {name}.shop.internal}}"#,
            targets = targets.join(", "),
        ));
    }
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &manifests, "conflict.yaml").expect("manifests parse");
    let output = translate::translate(&snapshot, &Options::default());
    let config = &output.configs[&PlaneKey::Shared];
    let server_name = |host: &str| {
        let rule = config
            .rules
            .iter()
            .find(|r| r.hostnames == [host])
            .expect("the host's rule");
        rule.backends[0]
            .tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
    };
    assert_eq!(
        server_name("a.example.com").as_deref(),
        Some("older.shop.internal"),
        "the older policy takes the target both name"
    );
    assert_eq!(
        server_name("b.example.com").as_deref(),
        Some("newer.shop.internal"),
        "the newer policy keeps the target only it names"
    );
    let ancestors = &output.statuses.backend_tls_policies[&ObjectKey::new("shop", "newer")];
    let accepted: Vec<(&str, bool, Reason)> = ancestors
        .iter()
        .map(|a| {
            let c = a
                .conditions
                .iter()
                .find(|c| c.kind == ConditionType::Accepted)
                .expect("Accepted");
            (a.ancestor_ref.name.as_str(), c.status, c.reason)
        })
        .collect();
    assert_eq!(
        accepted,
        [
            ("one", false, Reason::Conflicted),
            ("two", true, Reason::Accepted)
        ]
    );
}
