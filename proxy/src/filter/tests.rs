//! Filter tests over compiled filters: header modifiers, redirects, rewrites, CORS, weights.

use crate::config::{compile, Cache};
use crate::metrics::ProxyMetrics;
use crate::route::RequestView;
use crate::routes::Routes;
use http::{header, HeaderMap, HeaderValue, Method};
use serde_json::json;
use std::sync::Arc;

fn routes(rules: serde_json::Value) -> Routes {
    let doc: cftunnel_config::Config =
        serde_json::from_value(json!({ "rules": rules })).expect("parses");
    let metrics = ProxyMetrics::register(&mut Default::default());
    compile(&doc, &metrics, &mut Cache::default()).expect("compiles")
}

/// The first rule of a one-rule table plus the prefix its match exposes.
fn only_rule(routes: &Routes, path: &str) -> (Arc<crate::rule::Rule>, Option<String>) {
    let headers = HeaderMap::new();
    let view = RequestView {
        method: &Method::GET,
        path,
        query: None,
        headers: &headers,
    };
    let hit = routes.table.find("h", &view).expect("rule matches");
    (
        hit.rule.clone(),
        hit.matched.path.prefix().map(str::to_owned),
    )
}

fn parts(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = http::Request::builder().uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).expect("request").into_parts().0
}

#[test]
fn request_header_modifier_sets_adds_and_removes() {
    let r = routes(
        json!([{ "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": "X-Set", "value": "new"}],
        "add": [{"name": "X-Add", "value": "two"}],
        "remove": ["X-Remove"]}}], "backends": [] }]),
    );
    let (rule, prefix) = only_rule(&r, "/");
    let mut p = parts(
        "/",
        &[("x-set", "old"), ("x-add", "one"), ("x-remove", "gone")],
    );
    rule.filters.apply_request(&mut p, prefix.as_deref());
    assert_eq!(
        p.headers.get_all("x-set").iter().collect::<Vec<_>>(),
        ["new"]
    );
    assert_eq!(
        p.headers.get_all("x-add").iter().collect::<Vec<_>>(),
        ["one", "two"]
    );
    assert!(!p.headers.contains_key("x-remove"));
}

#[test]
fn response_header_modifier_edits_response_headers() {
    let r = routes(
        json!([{ "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
        "set": [{"name": "X-Set", "value": "v"}], "add": [{"name": "X-Add", "value": "b"}], "remove": ["Server"]}}], "backends": [] }]),
    );
    let (rule, _) = only_rule(&r, "/");
    let mut h = HeaderMap::new();
    h.insert("x-add", HeaderValue::from_static("a"));
    h.insert("server", HeaderValue::from_static("x"));
    rule.filters.apply_response(&mut h);
    assert_eq!(h.get("x-set").map(|v| v.as_bytes()), Some(&b"v"[..]));
    assert_eq!(h.get_all("x-add").iter().count(), 2);
    assert!(!h.contains_key("server"));
}

fn location(
    redirect: serde_json::Value,
    match_prefix: &str,
    path: &str,
    query: Option<&str>,
) -> (u16, String) {
    let r = routes(
        json!([{ "matches": [{"path": {"type": "PathPrefix", "value": match_prefix}}],
        "filters": [{"type": "RequestRedirect", "requestRedirect": redirect}], "backends": [] }]),
    );
    let (rule, prefix) = only_rule(&r, path);
    let redirect = rule.filters.redirect.as_ref().expect("redirect compiled");
    let loc = redirect
        .location("http", "gw.example", path, query, prefix.as_deref())
        .expect("valid location");
    (
        redirect.status.as_u16(),
        loc.to_str().expect("ascii").to_owned(),
    )
}

#[test]
fn redirects_build_location_from_scheme_host_port_and_path() {
    assert_eq!(
        location(json!({}), "/", "/a", None),
        (302, "http://gw.example/a".into())
    );
    assert_eq!(
        location(json!({"scheme": "https"}), "/", "/a", Some("q=1")),
        (302, "https://gw.example/a?q=1".into())
    );
    assert_eq!(
        location(
            json!({"hostname": "example.org", "statusCode": 301}),
            "/",
            "/a",
            None
        ),
        (301, "http://example.org/a".into())
    );
    assert_eq!(
        location(json!({"port": 8443, "scheme": "https"}), "/", "/", None),
        (302, "https://gw.example:8443/".into())
    );
    assert_eq!(
        location(json!({"port": 443, "scheme": "https"}), "/", "/", None),
        (302, "https://gw.example/".into()),
        "default port omitted"
    );
    assert_eq!(
        location(json!({"port": 80}), "/", "/", None),
        (302, "http://gw.example/".into())
    );
    assert_eq!(
        location(
            json!({"path": {"type": "ReplacePrefixMatch", "value": "/replacement-prefix"}}),
            "/original-prefix",
            "/original-prefix/lemon",
            None
        ),
        (302, "http://gw.example/replacement-prefix/lemon".into())
    );
    assert_eq!(
        location(
            json!({"path": {"type": "ReplaceFullPath", "value": "/full"}, "statusCode": 308}),
            "/x",
            "/x/y",
            None
        ),
        (308, "http://gw.example/full".into())
    );
    for code in [301, 302, 303, 307, 308] {
        assert_eq!(
            location(json!({"statusCode": code}), "/", "/", None).0,
            code
        );
    }
}

#[test]
fn url_rewrite_replaces_host_and_path() {
    let r = routes(
        json!([{ "matches": [{"path": {"type": "PathPrefix", "value": "/prefix/one"}}],
        "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "internal.example",
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/one"}}}], "backends": [] }]),
    );
    let (rule, prefix) = only_rule(&r, "/prefix/one/two");
    let mut p = parts("/prefix/one/two?x=1", &[("host", "public.example")]);
    rule.filters.apply_request(&mut p, prefix.as_deref());
    assert_eq!(
        p.uri.path_and_query().map(|pq| pq.as_str()),
        Some("/one/two?x=1")
    );
    assert_eq!(
        p.headers.get(header::HOST).map(|v| v.as_bytes()),
        Some(&b"internal.example"[..])
    );

    let r = routes(
        json!([{ "matches": [{"path": {"type": "PathPrefix", "value": "/full"}}],
        "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/one"}}}], "backends": [] }]),
    );
    let (rule, prefix) = only_rule(&r, "/full/x");
    let mut p = parts("/full/x", &[]);
    rule.filters.apply_request(&mut p, prefix.as_deref());
    assert_eq!(p.uri.path(), "/one");
}

fn cors_rule() -> Arc<crate::rule::Rule> {
    let r = routes(json!([{ "filters": [{"type": "CORS", "cors": {
        "allowOrigins": ["https://www.foo.com", "https://*.bar.com"],
        "allowMethods": ["GET", "OPTIONS"], "allowHeaders": ["x-header-1", "x-header-2"],
        "exposeHeaders": ["x-header-3"], "allowCredentials": true, "maxAge": 3600}}], "backends": [] }]));
    only_rule(&r, "/").0
}

#[test]
fn cors_preflight_is_answered_for_allowed_origins_only() {
    let rule = cors_rule();
    let cors = rule.filters.cors.as_ref().expect("cors compiled");
    let preflight = |origin: &str, method: &str| {
        let p = parts(
            "/",
            &[
                ("origin", origin),
                ("access-control-request-method", method),
            ],
        );
        assert!(crate::filter::Cors::is_preflight(
            &Method::OPTIONS,
            &p.headers
        ));
        cors.preflight(&p.headers)
    };
    let h = preflight("https://xpto.www.bar.com", "GET");
    assert_eq!(
        h.get("access-control-allow-origin").map(|v| v.as_bytes()),
        Some(&b"https://xpto.www.bar.com"[..])
    );
    assert_eq!(
        h.get("access-control-allow-methods").map(|v| v.as_bytes()),
        Some(&b"GET, OPTIONS"[..])
    );
    assert_eq!(
        h.get("access-control-allow-headers").map(|v| v.as_bytes()),
        Some(&b"x-header-1, x-header-2"[..])
    );
    assert_eq!(
        h.get("access-control-max-age").map(|v| v.as_bytes()),
        Some(&b"3600"[..])
    );
    assert_eq!(
        h.get("access-control-allow-credentials")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert!(!preflight("https://foobar.com", "GET").contains_key("access-control-allow-origin"));
    assert!(
        !preflight("https://www.foo.com", "DELETE").contains_key("access-control-allow-origin"),
        "method not allowed"
    );
    let mut resp = HeaderMap::new();
    cors.decorate(&HeaderValue::from_static("https://www.foo.com"), &mut resp);
    assert_eq!(
        resp.get("access-control-allow-origin")
            .map(|v| v.as_bytes()),
        Some(&b"https://www.foo.com"[..])
    );
    assert_eq!(
        resp.get("access-control-expose-headers")
            .map(|v| v.as_bytes()),
        Some(&b"x-header-3"[..])
    );
}

#[test]
fn cors_wildcards_echo_what_the_preflight_asks_for() {
    let r = routes(json!([{ "filters": [{"type": "CORS", "cors": {
        "allowOrigins": ["*"], "allowMethods": ["*"], "allowHeaders": ["*"], "allowCredentials": true}}], "backends": [] }]));
    let (rule, _) = only_rule(&r, "/");
    let cors = rule.filters.cors.as_ref().expect("cors");
    let h = cors.preflight(
        &parts(
            "/",
            &[
                ("origin", "https://o.example"),
                ("access-control-request-method", "PUT"),
                ("access-control-request-headers", "x-a, x-b"),
            ],
        )
        .headers,
    );
    assert_eq!(
        h.get("access-control-allow-origin").map(|v| v.as_bytes()),
        Some(&b"https://o.example"[..])
    );
    assert_eq!(
        h.get("access-control-allow-methods").map(|v| v.as_bytes()),
        Some(&b"PUT"[..])
    );
    assert_eq!(
        h.get("access-control-allow-headers").map(|v| v.as_bytes()),
        Some(&b"x-a, x-b"[..])
    );
}

#[test]
fn weighted_choice_follows_weights_and_never_picks_zero() {
    let r = routes(json!([{ "backends": [
        {"url": "http://127.0.0.1:1", "weight": 0},
        {"url": "http://127.0.0.1:2", "weight": 1},
        {"url": "http://127.0.0.1:3", "weight": 3}
    ]}]));
    let (rule, _) = only_rule(&r, "/");
    let port = |draw: u64| {
        rule.backends
            .pick_with(|total| {
                assert_eq!(total, 4);
                draw
            })
            .and_then(|b| b.upstream.as_ref())
            .and_then(|u| u.authority().port_u16())
    };
    assert_eq!(port(0), Some(2));
    assert_eq!(port(1), Some(3));
    assert_eq!(port(3), Some(3));
    let r = routes(json!([{ "backends": [{"url": "http://127.0.0.1:1", "weight": 0}] }]));
    let (rule, _) = only_rule(&r, "/");
    assert!(
        rule.backends.pick().is_none(),
        "all-zero weights pick nothing (500)"
    );
}
