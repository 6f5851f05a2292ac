//! Listener isolation end to end: a Gateway with a listener for any host and listeners with
//! hostnames, translated and served by an in-process proxy, and real HTTP/1.1 requests to it.
//! A hostname belongs to its most specific listener: routes attached only to a less specific
//! one do not serve it, and a route attached to that listener (among others) does.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{self, ObjectKey, Options, Snapshot};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use http_body_util::{BodyExt, Empty};

/// The class, and Service `web/web` whose one endpoint is `backend`; ends with `---`.
fn class_and_backend(backend: SocketAddr) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cf}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: web}}
spec: {{ports: [{{name: http, port: 80, targetPort: {port}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-a, namespace: web, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints: [{{addresses: ["{ip}"]}}]
---
"#,
        ip = backend.ip(),
        port = backend.port(),
    )
}

async fn web_backend() -> EchoServer {
    EchoServer::spawn(
        std::net::Ipv4Addr::LOCALHOST.into(),
        EchoIdentity {
            namespace: "web".to_owned(),
            pod: "web-a".to_owned(),
        },
    )
    .await
    .expect("the echo backend starts")
}

fn manifests(backend: SocketAddr) -> String {
    format!(
        r#"{}
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web}}
spec:
  gatewayClassName: cf
  listeners:
  - {{name: any, port: 80, protocol: HTTP}}
  - {{name: app, port: 80, protocol: HTTP, hostname: app.example.com}}
  - {{name: wild, port: 80, protocol: HTTP, hostname: "*.example.org"}}
---
# Attached to every listener of the Gateway: it serves every host.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: everywhere, namespace: web}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{matches: [{{path: {{type: PathPrefix, value: /everywhere}}}}], backendRefs: [{{name: web, port: 80}}]}}]
---
# Attached to the listener for any host alone: the hosts of the others are not its.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: any-only, namespace: web}}
spec:
  parentRefs: [{{name: edge, sectionName: any}}]
  rules: [{{matches: [{{path: {{type: PathPrefix, value: /any-only}}}}], backendRefs: [{{name: web, port: 80}}]}}]
"#,
        class_and_backend(backend)
    )
}

async fn status(proxy: SocketAddr, host: &str, path: &str) -> u16 {
    status_with(proxy, host, path, &[]).await
}

/// The status of a GET of `path` on `host` with `headers`, over a connection of its own.
async fn status_with(proxy: SocketAddr, host: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let (mut sender, _conn) = cftunnel_testkit::client::connect_http1(proxy)
        .await
        .expect("connect to the proxy");
    let mut req = http::Request::builder().uri(path).header("host", host);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Empty::<Bytes>::new()).expect("request");
    let res = sender.send_request(req).await.expect("an answer");
    let status = res.status().as_u16();
    let _ = res.into_body().collect().await;
    status
}

#[tokio::test]
async fn a_route_on_every_listener_serves_the_hosts_of_the_specific_ones_too() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let backend = web_backend().await;
        let mut snapshot = Snapshot::default();
        manifest::load_into(&mut snapshot, &manifests(backend.http_addr()), "web.yaml")
            .expect("manifests parse");
        let output = translate::translate(&snapshot, &Options::default());
        let gateway = ObjectKey::new("web", "edge");
        let plane = &output.planes[&gateway];
        let config = output.configs[plane].clone();
        let attached: Vec<_> = output.statuses.gateways[&gateway]
            .listeners
            .iter()
            .map(|l| l.attached_routes)
            .collect();
        assert_eq!(attached, vec![2, 1, 1], "any, app, wild");

        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts");
        let at = proxy.data_addr();
        for host in ["app.example.com", "a.example.org", "other.test"] {
            assert_eq!(status(at, host, "/everywhere").await, 200, "{host}");
        }
        assert_eq!(status(at, "other.test", "/any-only").await, 200);
        for host in ["app.example.com", "a.example.org"] {
            assert_eq!(status(at, host, "/any-only").await, 404, "{host}");
        }
    })
    .await
    .expect("in time");
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// The config the plane of Gateway `web/edge` gets from `manifests`.
fn edge_config(manifests: &str) -> cftunnel_config::Config {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, manifests, "web.yaml").expect("manifests parse");
    let mut output = translate::translate(&snapshot, &Options::default());
    let plane = output.planes[&ObjectKey::new("web", "edge")].clone();
    output.configs.remove(&plane).expect("the plane's config")
}

/// The class and backend, and Gateway `web/edge` with listener `plain` (HTTP, any host) and
/// `secure` (HTTPS, `foo.example.com`, its certificate in Secret `foo-cert`); ends with `---`.
fn plain_and_secure_gateway(backend: SocketAddr) -> String {
    let pki = cftunnel_testkit::pki::TestPki::for_names(&["foo.example.com"]).expect("pki");
    format!(
        r#"{}
apiVersion: v1
kind: Secret
metadata: {{name: foo-cert, namespace: web}}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{crt}  tls.key: |
{key}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web}}
spec:
  gatewayClassName: cf
  listeners:
  - {{name: plain, port: 80, protocol: HTTP}}
  - {{name: secure, port: 443, protocol: HTTPS, hostname: foo.example.com, tls: {{certificateRefs: [{{name: foo-cert}}]}}}}
---
"#,
        class_and_backend(backend),
        crt = indent(&pki.leaf_pem()),
        key = indent(&pki.key_pem()),
    )
}

/// The copies of a route's rules under a specific listener's hostname serve that listener's
/// scheme alone: over the other scheme the hostname is the listener for any host's, where a
/// more specific route attached only there (a redirect of logins to https) comes first. (The
/// proxy's own listener is plain HTTP; over the tunnel the edge says the scheme.)
#[tokio::test]
async fn the_copies_under_a_listeners_hostname_keep_to_its_scheme() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let backend = web_backend().await;
        let manifests = format!(
            r#"{}
# On the plain listener alone: plain HTTP logins go to https.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: upgrade, namespace: web}}
spec:
  parentRefs: [{{name: edge, sectionName: plain}}]
  rules: [{{matches: [{{path: {{type: PathPrefix, value: /login}}}}], filters: [{{type: RequestRedirect, requestRedirect: {{scheme: https, statusCode: 301}}}}]}}]
---
# On both listeners, for every path.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: web}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
            plain_and_secure_gateway(backend.http_addr()),
        );
        let config = edge_config(&manifests);
        // The copy under the secure listener's hostname asks for its scheme alone.
        let copy = config
            .rules
            .iter()
            .find(|r| r.name.as_deref() == Some("web/app/0") && !r.hostnames.is_empty())
            .expect("the copy under foo.example.com");
        let header = copy.matches[0].headers.first().expect("the scheme's header");
        assert_eq!(
            (header.name.as_str(), header.value.as_str()),
            ("X-Forwarded-Proto", "https")
        );
        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts");
        let at = proxy.data_addr();
        // A plain listener's request: the proxy sets its scheme, whatever the client says.
        let https = [("x-forwarded-proto", "https")];
        assert_eq!(
            status_with(at, "foo.example.com", "/login", &https).await,
            301,
            "the plain listener's route"
        );
    })
    .await
    .expect("in time");
}

/// A route on a listener for any host and on an HTTPS listener with a hostname ranks among
/// the listener for any host's routes as Gateway API says: its rules for any host ask for no
/// scheme the HTTPS listener has, so they carry no more header matches than an older route's
/// attached there alone, and the older route's redirect of every path keeps taking plain
/// requests for any host.
#[tokio::test]
async fn a_route_also_on_a_named_listener_does_not_outrank_older_routes_for_any_host() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let backend = web_backend().await;
        let manifests = format!(
            r#"{}
# The older: on the plain listener alone, every plain request goes to https.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: upgrade, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}}
spec:
  parentRefs: [{{name: edge, sectionName: plain}}]
  rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{scheme: https, statusCode: 301}}}}]}}]
---
# The newer, on both listeners, for every path.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: web, creationTimestamp: "2026-02-01T00:00:00Z"}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
            plain_and_secure_gateway(backend.http_addr()),
        );
        let config = &edge_config(&manifests);
        let for_any_host = |name: &str| {
            config
                .rules
                .iter()
                .find(|r| r.name.as_deref() == Some(name) && r.hostnames.is_empty())
                .unwrap_or_else(|| panic!("{name}'s rule for any host"))
        };
        let headers = |name: &str| {
            let rule = for_any_host(name);
            rule.matches.iter().map(|m| m.headers.len()).sum::<usize>()
        };
        assert_eq!(headers("web/app/0"), headers("web/upgrade/0"));
        let proxy = Server::start(ServerOptions::default(), Some(config.clone()))
            .await
            .expect("the proxy starts");
        let at = proxy.data_addr();
        assert_eq!(status(at, "other.test", "/").await, 301, "the older route");
        assert_eq!(status(at, "other.test", "/any").await, 301, "the older route");
    })
    .await
    .expect("in time");
}

/// A hostname a route is attached through only on the HTTPS listener is not served over plain
/// HTTP, even when another of its hostnames is attached through an HTTP listener: plain
/// requests for it take the HTTP listener's redirect to https. (The proxy's own listener is
/// plain HTTP, and it sets the scheme of an untrusted client's request to http.)
#[tokio::test]
async fn a_hostname_published_over_https_alone_is_not_served_over_plain_http() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let backend = web_backend().await;
        let pki =
            cftunnel_testkit::pki::TestPki::for_names(&["*.example.com"]).expect("pki");
        let manifests = format!(
            r#"{}
apiVersion: v1
kind: Secret
metadata: {{name: cert, namespace: web}}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{crt}  tls.key: |
{key}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web}}
spec:
  gatewayClassName: cf
  listeners:
  - {{name: https, port: 443, protocol: HTTPS, tls: {{certificateRefs: [{{name: cert}}]}}}}
  - {{name: http, port: 80, protocol: HTTP}}
  - {{name: http-legacy, port: 80, protocol: HTTP, hostname: legacy.example.com}}
---
# Every plain request for any host goes to https.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: redirect, namespace: web}}
spec:
  parentRefs: [{{name: edge, sectionName: http}}]
  rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{scheme: https, statusCode: 301}}}}]}}]
---
# app2.example.com over https alone; legacy.example.com over http too.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app2, namespace: web}}
spec:
  parentRefs: [{{name: edge, sectionName: https}}, {{name: edge, sectionName: http-legacy}}]
  hostnames: [app2.example.com, legacy.example.com]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#,
            class_and_backend(backend.http_addr()),
            crt = indent(&pki.leaf_pem()),
            key = indent(&pki.key_pem()),
        );
        let config = edge_config(&manifests);
        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts");
        let at = proxy.data_addr();
        let https = [("x-forwarded-proto", "https")];
        assert_eq!(
            status_with(at, "app2.example.com", "/", &https).await,
            301,
            "published over https alone: a plain request is redirected, whatever it claims"
        );
        assert_eq!(status(at, "legacy.example.com", "/").await, 200);
        assert_eq!(status(at, "other.example.com", "/").await, 301);
    })
    .await
    .expect("in time");
}
