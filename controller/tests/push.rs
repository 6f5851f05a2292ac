//! Whatever the manifests say, the translated config is one the proxy accepts: a value it
//! cannot compile would make it refuse the whole push and leave every route of the plane stale.

use crate::support;

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

/// ExternalName backends as the default `--external-name-backends=external` leaves them: an
/// in-cluster name answers 500 through the real proxy while the route's other rule serves, and
/// a public name is pushed as an absolute name the proxy takes.
#[tokio::test]
async fn the_proxy_serves_around_a_refused_external_name_and_takes_an_absolute_one() {
    let echo = support::echo("a", "web-1").await;
    let manifests = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cf}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: a}}
spec:
  gatewayClassName: cf
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
{web}apiVersion: v1
kind: Service
metadata: {{name: inside, namespace: a}}
spec: {{type: ExternalName, externalName: web.b.svc.cluster.local, ports: [{{port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: outside, namespace: a}}
spec: {{type: ExternalName, externalName: api.example.com, ports: [{{port: 80}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r, namespace: a}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - matches: [{{path: {{value: /ok}}}}]
    backendRefs: [{{name: web, port: 80}}]
  - matches: [{{path: {{value: /inside}}}}]
    backendRefs: [{{name: inside, port: 80}}]
  - matches: [{{path: {{value: /outside}}}}]
    backendRefs: [{{name: outside, port: 80}}]
"#,
        web = support::web_service("a", echo.http_addr()),
    );
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &manifests, "external.yaml").expect("manifests parse");
    let output = translate::translate(&snapshot, &Options::default());
    let config = output.configs[&PlaneKey::Shared].clone();
    let url_of = |name: &str| {
        config
            .rules
            .iter()
            .find(|r| r.name.as_deref() == Some(name))
            .map(|r| r.backends[0].url.clone())
    };
    assert_eq!(
        url_of("a/r/2").as_deref(),
        Some("http://api.example.com.:80")
    );

    let server = Server::start(ServerOptions::default(), None)
        .await
        .expect("the proxy starts");
    let applied = server.apply(config).await;
    assert!(applied.is_ok(), "the proxy refused the push: {applied:?}");
    let status = |path: &'static str| {
        let addr = server.data_addr();
        async move {
            support::request(addr, "GET", path, "app.example.com", None, "")
                .await
                .map(|a| a.status)
        }
    };
    assert_eq!(status("/inside").await, Some(500));
    assert_eq!(status("/ok").await, Some(200));
    server.shutdown().await;
}
