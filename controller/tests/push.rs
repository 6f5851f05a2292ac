//! Whatever the manifests say, the translated config is one the proxy accepts: a value it
//! cannot compile would make it refuse the whole push and leave every route of the plane stale.

use cftunnel_controller::manifest;
use cftunnel_controller::translate::{self, Options, PlaneKey, Snapshot};
use cftunnel_proxy::{Server, ServerOptions};

const HOSTILE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: cf}
spec: {controllerName: cf.k8s.lex.la/tunnel-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: ns}
spec:
  gatewayClassName: cf
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: bad, port: 80, protocol: HTTP, hostname: "bad host"}
  - {name: tcp, port: 81, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: ns}
spec: {ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: hostile, namespace: ns}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/(["}}]
    backendRefs: [{name: svc, port: 80}]
  - matches: [{headers: [{name: "bad name", value: x}]}]
    backendRefs: [{name: svc, port: 80}]
  - matches: [{path: {value: /modifier}}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: "x\ny"}]}}]
    backendRefs: [{name: svc, port: 80}]
  - matches: [{path: {value: /redirect}}]
    filters: [{type: RequestRedirect, requestRedirect: {hostname: "a b", statusCode: 301}}]
  - matches: [{path: {value: /twice}}]
    filters: [{type: RequestRedirect, requestRedirect: {}}, {type: RequestRedirect, requestRedirect: {}}]
  - matches: [{path: {value: /cors}}]
    filters: [{type: CORS, cors: {allowOrigins: ["https://a\u0001"]}}]
    backendRefs: [{name: svc, port: 80}]
  - matches: [{path: {value: /missing}}]
    backendRefs: [{name: missing, port: 80}, {group: example.com, kind: Thing, name: "x y", port: 1}]
  - matches: [{path: {value: /ok}}]
    backendRefs: [{name: svc, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bad-hostname, namespace: ns}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["exa mple.com"]
  rules: [{backendRefs: [{name: svc, port: 80}]}]
"#;

#[tokio::test]
async fn the_proxy_accepts_the_config_of_hostile_manifests() {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, HOSTILE, "hostile.yaml").expect("manifests parse");
    let output = translate::translate(&snapshot, &Options::default());
    let config = output.configs[&PlaneKey::Shared].clone();
    let names: Vec<_> = config
        .rules
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(names, vec!["ns/hostile/6", "ns/hostile/7"]);

    let server = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        Server::start(ServerOptions::default(), None),
    )
    .await
    .expect("the proxy starts in time")
    .expect("the proxy starts");
    let applied = server.apply(config).await;
    assert!(applied.is_ok(), "the proxy refused the push: {applied:?}");
    server.shutdown().await;
}
