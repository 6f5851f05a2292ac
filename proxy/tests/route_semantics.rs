//! Gateway API route semantics end to end: a redirect without a scheme keeps the one the
//! client used (behind the tunnel, the one the edge states), path match values match however
//! either side percent-encodes the path, and of header modifier entries naming one header the
//! first counts.

use cftunnel_testkit::connector;
use cftunnel_testkit::edge::{MockEdge, VisitorScheme};
use http::StatusCode;
use serde_json::json;

use crate::support::*;

/// A redirect as the controller writes one from a listener on port 8080 when the filter names
/// neither scheme nor port: the listener's port, no scheme.
fn redirect_rules(hostnames: &[&str]) -> serde_json::Value {
    json!({"version": 1, "rules": [{
        "hostnames": hostnames,
        "matches": [{"path": {"type": "Exact", "value": "/old"}}],
        "filters": [{"type": "RequestRedirect", "requestRedirect": {
            "port": 8080, "path": {"type": "ReplaceFullPath", "value": "/new"}}}],
        "backends": []
    }]})
}

/// The proxy binary in tunnel mode behind `edge`, serving `doc`, once it is ready.
async fn tunnel_proxy(
    edge: &MockEdge,
    name: &str,
    doc: &serde_json::Value,
) -> (std::process::Child, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("cftunnel-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let token = connector::token().encode();
    let (child, admin) = spawn_tunnel_proxy(edge, &dir, &token, "http2", Some(doc), &[]).await;
    ready_once_registered(admin, "http2").await;
    (child, dir)
}

/// Behind the tunnel every request names `https` in its URI, whatever the client used; the
/// scheme the edge states (`X-Forwarded-Proto`) is the one a redirect keeps.
async fn redirect_keeps_the_scheme_the_edge_states(scheme: VisitorScheme, expected: &str) {
    let edge = MockEdge::builder()
        .visitor_scheme(scheme)
        .start()
        .await
        .expect("mock edge starts");
    let name = format!("redirect-{expected}");
    let (mut child, dir) = tunnel_proxy(&edge, &name, &redirect_rules(&["app.example.com"])).await;
    let r = get(
        &client(),
        edge.http_addr(),
        "app.example.com",
        "/old?x=1",
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::FOUND, "{:?}", r.body);
    assert_eq!(
        r.header("location"),
        Some(format!("{expected}://app.example.com:8080/new?x=1").as_str())
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_redirect_without_a_scheme_keeps_http_from_the_edge() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        redirect_keeps_the_scheme_the_edge_states(VisitorScheme::Http, "http"),
    )
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_redirect_without_a_scheme_keeps_https_from_the_edge() {
    tokio::time::timeout(
        TEST_TIMEOUT,
        redirect_keeps_the_scheme_the_edge_states(VisitorScheme::Https, "https"),
    )
    .await
    .expect("test finished in time");
}

/// On the proxy's own listener the connection is plain HTTP: an absolute-form request naming
/// `https`, or a client's own `X-Forwarded-Proto: https`, does not make it otherwise.
#[tokio::test]
async fn a_redirect_on_the_plain_listener_keeps_http_whatever_the_request_names() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let doc = redirect_rules(&[]);
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();
        for head in [
            "GET https://app.example.com/old HTTP/1.1\r\nhost: app.example.com\r\n",
            "GET /old HTTP/1.1\r\nhost: app.example.com\r\nx-forwarded-proto: https\r\n",
        ] {
            let r = raw(d, format!("{head}connection: close\r\n\r\n").as_bytes()).await;
            assert!(r.starts_with("HTTP/1.1 302"), "{head}: {r:?}");
            assert!(
                r.to_ascii_lowercase()
                    .contains("\r\nlocation: http://app.example.com:8080/new\r\n"),
                "{head}: {r:?}"
            );
        }
    })
    .await
    .expect("test finished in time");
}

/// Requests are routed on their canonical path (unreserved characters decoded, other escapes
/// in upper case); rule values are written the same way, so each matches either spelling.
#[tokio::test]
async fn percent_encoded_path_values_match_requests_written_either_way() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b, c) = (
            echo("svc-a-1").await,
            echo("svc-b-1").await,
            echo("svc-c-1").await,
        );
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "Exact", "value": "/%7Ebob"}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/files/%5Fdata/"}}],
             "backends": [{"url": url(b.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "Exact", "value": "/a%2fb"}}],
             "backends": [{"url": url(c.http_addr()), "weight": 1}]}
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();
        for (path, pod, seen) in [
            ("/%7Ebob", "svc-a-1", "/~bob"),
            ("/~bob", "svc-a-1", "/~bob"),
            ("/%7ebob", "svc-a-1", "/~bob"),
            ("/files/_data", "svc-b-1", "/files/_data"),
            ("/files/%5Fdata/x", "svc-b-1", "/files/_data/x"),
            ("/files/%5fdata/x", "svc-b-1", "/files/_data/x"),
            ("/a%2Fb", "svc-c-1", "/a%2Fb"),
            ("/a%2fb", "svc-c-1", "/a%2Fb"),
        ] {
            let r = get(&http, d, "h", path, &[]).await;
            assert_eq!(r.status, StatusCode::OK, "{path}: {:?}", r.body);
            assert_eq!(r.pod(), pod, "{path}");
            assert_eq!(r.json()["path"], seen, "{path}");
        }
        for path in ["/bob", "/files/_datax", "/a/b"] {
            let r = get(&http, d, "h", path, &[]).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        }

        // No request can have a `%` that starts no escape (it is refused with 400), so a
        // value with one could match nothing.
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/100%"}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let body = String::from_utf8_lossy(&r.body);
        assert!(body.contains("rules[0].matches[0].path"), "{body}");
    })
    .await
    .expect("test finished in time");
}

/// Gateway API `HTTPHeader`: of entries with equivalent names (any case), the first counts and
/// the others are ignored, in `set` and `add` alike, for requests and responses.
#[tokio::test]
async fn of_header_modifier_entries_naming_one_header_the_first_counts() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                    "set": [{"name": "X-Env", "value": "prod"}, {"name": "x-env", "value": "dev"}],
                    "add": [{"name": "X-Tag", "value": "one"}, {"name": "x-TAG", "value": "two"}]}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {
                    "set": [{"name": "X-Served", "value": "first"}, {"name": "x-served", "value": "second"}],
                    "add": [{"name": "X-Note", "value": "1"}, {"name": "X-NOTE", "value": "2"}]}}
            ],
            "backends": [{"url": url(a.http_addr()), "weight": 1}]
        }]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = get(&http, proxy.data_addr(), "h", "/", &[("x-env", "client")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.seen_header("x-env").as_deref(), Some("prod"));
        assert_eq!(r.seen_header("x-tag").as_deref(), Some("one"));
        let served: Vec<_> = r.headers.get_all("x-served").iter().collect();
        assert_eq!(served, ["first"]);
        let notes: Vec<_> = r.headers.get_all("x-note").iter().collect();
        assert_eq!(notes, ["1"]);
    })
    .await
    .expect("test finished in time");
}
