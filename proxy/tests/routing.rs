//! End to end: a proxy and echo backends on 127.0.0.1, configs pushed over the config API,
//! requests sent with a real HTTP client, and what the backend saw asserted.

use crate::support::*;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::json;

#[tokio::test]
async fn routes_by_host_path_header_and_method_to_the_right_backend() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b, c) = (echo("svc-a-1").await, echo("svc-b-1").await, echo("svc-c-1").await);
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"version": 1, "rules": [
            {"hostnames": ["api.example.com"], "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"hostnames": ["*.example.com"], "backends": [{"url": url(b.http_addr()), "weight": 1}]},
            {"matches": [{"headers": [{"name": "x-canary", "value": "yes"}]}, {"method": "DELETE"}],
             "backends": [{"url": url(c.http_addr()), "weight": 1}]}
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let r = get(&http, d, "API.example.com:8080", "/v1/users?id=7", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.pod(), "svc-a-1");
        assert_eq!(r.json()["path"], "/v1/users?id=7", "path and raw query reach the backend unchanged");
        assert_eq!(r.json()["host"], "API.example.com:8080", "Host reaches the backend as sent");
        assert_eq!(r.seen_header("X-Forwarded-Proto").as_deref(), Some("http"));
        assert_eq!(r.seen_header("X-Forwarded-For").as_deref(), Some("127.0.0.1"));

        assert_eq!(get(&http, d, "api.example.com", "/v2", &[]).await.pod(), "svc-b-1", "falls through to the wildcard");
        assert_eq!(get(&http, d, "www.example.com", "/", &[]).await.pod(), "svc-b-1");
        assert_eq!(get(&http, d, "other.org", "/", &[("x-canary", "yes")]).await.pod(), "svc-c-1");
        let del = Request::delete(format!("http://{d}/x")).header("host", "other.org").body(Full::new(Bytes::new())).expect("req");
        assert_eq!(send(&http, del).await.pod(), "svc-c-1");
        let r = get(&http, d, "other.org", "/", &[]).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "no rule matches");
        assert!(metric(&http, proxy.admin_addr(), "cftunnel_proxy_requests_total{hostname=\"api.example.com\",status_class=\"2xx\"}").await >= Some(1.0));
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn filters_edit_what_the_backend_and_the_client_see() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let (down, _held) = dead_addr();
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/headers"}}],
             "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Set", "value": "set"}], "add": [{"name": "X-Add", "value": "added"}], "remove": ["X-Remove"]}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "X-Resp", "value": "r"}], "remove": ["X-Content-Type-Options"]}}
             ],
             "backends": [{"url": url(a.http_addr()), "weight": 1,
                "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Backend", "value": "a"}]}}]}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/prefix/one"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "rewritten.example", "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/one"}}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "hostname": "new.example", "path": {"type": "ReplacePrefixMatch", "value": "/new"}, "statusCode": 308}}],
             "backends": []},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/cors-down"}}],
             "backends": [{"url": url(down), "weight": 1,
                "filters": [{"type": "CORS", "cors": {"allowOrigins": ["https://app.example"]}}]}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/cors-closed"}}],
             "unavailableStatus": 500,
             "filters": [{"type": "CORS", "cors": {"allowOrigins": ["https://app.example"]}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/cors"}}],
             "filters": [{"type": "CORS", "cors": {"allowOrigins": ["https://app.example"], "allowMethods": ["GET", "PUT"], "allowCredentials": true}}],
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/cors-moved"}}],
             "filters": [
                {"type": "CORS", "cors": {"allowOrigins": ["https://app.example"], "allowMethods": ["PUT"]}},
                {"type": "RequestRedirect", "requestRedirect": {"hostname": "new.example", "statusCode": 307}}
             ],
             "backends": []}
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let r = get(&http, d, "h", "/headers", &[("x-set", "old"), ("x-add", "first"), ("x-remove", "x")]).await;
        assert_eq!(r.seen_header("X-Set").as_deref(), Some("set"));
        assert_eq!(r.seen_header("X-Add").as_deref(), Some("first,added"));
        assert_eq!(r.seen_header("X-Remove"), None);
        assert_eq!(r.seen_header("X-Backend").as_deref(), Some("a"), "backend-level filter applied");
        assert_eq!(r.header("x-resp"), Some("r"));
        assert_eq!(r.header("x-content-type-options"), None);
        // The client's `Connection` header cannot take away what a filter set.
        let r = get(&http, d, "h", "/headers", &[("connection", "x-set, x-backend, x-other"), ("x-other", "o")]).await;
        assert_eq!(r.seen_header("X-Set").as_deref(), Some("set"));
        assert_eq!(r.seen_header("X-Backend").as_deref(), Some("a"));
        assert_eq!(r.seen_header("X-Other"), None, "what the client named is still dropped");

        let r = get(&http, d, "h", "/prefix/one/two?q=1", &[]).await;
        assert_eq!(r.json()["path"], "/one/two?q=1");
        assert_eq!(r.json()["host"], "rewritten.example");

        let r = get(&http, d, "h", "/old/page?x=1", &[]).await;
        assert_eq!(r.status, StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.header("location"), Some("https://new.example/new/page?x=1"));
        assert_eq!(a.count_echoed("/old/page?x=1"), 0, "redirects never reach a backend");

        let pre = Request::options(format!("http://{d}/cors"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "PUT")
            .body(Full::new(Bytes::new()))
            .expect("req");
        let r = send(&http, pre).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
        assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
        assert_eq!(a.count_echoed("/cors"), 0, "preflights are answered by the proxy");
        let r = get(&http, d, "h", "/cors", &[("origin", "https://app.example")]).await;
        assert_eq!(r.pod(), "svc-a-1");
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        let r = get(&http, d, "h", "/cors", &[("origin", "https://evil.example")]).await;
        assert_eq!(r.header("access-control-allow-origin"), None);
        // What the proxy answers itself carries them too, or a browser hides its status.
        let r = get(&http, d, "h", "/cors-down", &[("origin", "https://app.example")]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        let grpc_web = [("origin", "https://app.example"), ("content-type", "application/grpc-web+proto")];
        let r = get(&http, d, "h", "/cors-down", &grpc_web).await;
        assert_eq!((r.status, r.header("grpc-status")), (StatusCode::OK, Some("14")));
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        let r = get(&http, d, "h", "/cors-closed", &[("origin", "https://app.example")]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        let r = get(&http, d, "h", "/cors-down", &[("origin", "https://evil.example")]).await;
        assert_eq!(r.header("access-control-allow-origin"), None);
        // GET, HEAD and POST are always allowed, listed or not.
        let preflight = |path: &str, method: &str| {
            Request::options(format!("http://{d}{path}"))
                .header("origin", "https://app.example")
                .header("access-control-request-method", method)
                .body(Full::new(Bytes::new()))
                .expect("req")
        };
        let r = send(&http, preflight("/cors", "POST")).await;
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
        assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
        let r = send(&http, preflight("/cors", "DELETE")).await;
        assert_eq!(r.header("access-control-allow-origin"), None, "not listed");
        // A redirecting rule answers the preflight, and its redirect carries the CORS headers,
        // or a browser follows neither.
        let r = send(&http, preflight("/cors-moved/x", "PUT")).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        assert_eq!(r.header("access-control-allow-methods"), Some("PUT"));
        let r = get(&http, d, "h", "/cors-moved/x", &[("origin", "https://app.example")]).await;
        assert_eq!(r.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(r.header("location"), Some("http://new.example/cors-moved/x"));
        assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn bad_pushes_are_refused_with_the_reason_and_the_old_table_keeps_serving() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let admin = proxy.admin_addr();
        let d = proxy.data_addr();
        let r = get(&http, admin, "admin", "/readyz", &[]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "not ready before the first config");
        // Every result is listed from the start, so an alert sees the first refusal as an increase.
        for result in ["success", "rejected", "stale"] {
            let series = format!("cftunnel_proxy_config_reloads_total{{result=\"{result}\"}}");
            assert_eq!(metric(&http, admin, &series).await, Some(0.0), "{series}");
        }
        let good = json!({"version": 5, "rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        assert_eq!(push(&http, admin, &good).await.status, StatusCode::OK);
        assert_eq!(get(&http, admin, "admin", "/readyz", &[]).await.status, StatusCode::OK);

        let body: Bytes = good.to_string().into();
        assert_eq!(push_raw(&http, admin, None, "application/json", body.clone()).await.status, StatusCode::UNAUTHORIZED);
        assert_eq!(push_raw(&http, admin, Some("wrong"), "application/json", body.clone()).await.status, StatusCode::UNAUTHORIZED);
        let lower = Request::put(format!("http://{admin}/config"))
            .header("content-type", "application/json")
            .header("authorization", format!("bearer {TOKEN}"))
            .body(Full::new(body.clone()))
            .expect("req");
        assert_eq!(send(&http, lower).await.status, StatusCode::OK, "the scheme is case-insensitive");
        assert_eq!(push_raw(&http, admin, Some(TOKEN), "text/plain", body).await.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(push_raw(&http, admin, Some(TOKEN), "application/json", "{not json".into()).await.status, StatusCode::BAD_REQUEST);
        let trailing = json!({"version": 5, "rules": []}).to_string() + " {}";
        let r = push_raw(&http, admin, Some(TOKEN), "application/json", trailing.into()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "a document with something after it is refused: {:?}", r.body);
        let huge = Bytes::from(vec![b' '; cftunnel_proxy::admin::DEFAULT_MAX_CONFIG_BYTES + 1]);
        assert_eq!(push_raw(&http, admin, Some(TOKEN), "application/json", huge).await.status, StatusCode::PAYLOAD_TOO_LARGE);
        let bad_regex = json!({"version": 6, "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}], "backends": []}]});
        let r = push(&http, admin, &bad_regex).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.json()["error"].as_str().unwrap_or_default().contains("rules[0].matches[0].path"), "{:?}", r.body);
        // The refused rule is named, so a pusher can leave it out and push the rest.
        let oversized = json!({"version": 6, "rules": [
            {"backends": []},
            {"name": "team/shop/0", "matches": [{"path": {"type": "RegularExpression", "value": "/\\w{500}"}}], "backends": []}
        ]});
        let r = push(&http, admin, &oversized).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let body = r.json();
        assert_eq!((&body["rule"], &body["name"], &body["field"]), (&json!(1), &json!("team/shop/0"), &json!("rules[1].matches[0].path")), "{body}");
        assert!(body["error"].as_str().unwrap_or_default().starts_with("rules[1].matches[0].path: regex does not compile"), "{body}");
        let stale = json!({"version": 4, "rules": []});
        assert_eq!(push(&http, admin, &stale).await.status, StatusCode::CONFLICT);

        let r = get(&http, d, "h", "/still", &[]).await;
        assert_eq!(r.pod(), "svc-a-1", "the last good table is still served");
        let r = send(&http, Request::get(format!("http://{admin}/config")).header("authorization", format!("Bearer {TOKEN}")).body(Full::new(Bytes::new())).expect("req")).await;
        assert_eq!(r.json(), json!({"version": 5, "ready": true, "enforces": ["access"]}));
        assert_eq!(get(&http, admin, "admin", "/config", &[]).await.status, StatusCode::UNAUTHORIZED);
        assert_eq!(push(&http, admin, &json!({"version": 0, "rules": []})).await.status, StatusCode::OK, "version 0 is always accepted");
        assert_eq!(get(&http, d, "h", "/still", &[]).await.status, StatusCode::NOT_FOUND);
        // Stale is measured against the version served, which `GET /config` reports: after the
        // unversioned push any versioned one applies again.
        assert_eq!(push(&http, admin, &json!({"version": 4, "rules": []})).await.status, StatusCode::OK);
        assert_eq!(push(&http, admin, &json!({"version": 3, "rules": []})).await.status, StatusCode::CONFLICT);
        assert!(metric(&http, admin, "cftunnel_proxy_config_reloads_total{result=\"rejected\"}").await >= Some(2.0));
        assert!(metric(&http, admin, "cftunnel_proxy_config_reloads_total{result=\"stale\"}").await >= Some(1.0));

        // `null` is absent, for every optional field, as Go reads it.
        let nulls = json!({"version": null, "hasGrpcRoute": null, "rules": [{"hostnames": null, "backends": [
            {"url": url(a.http_addr()), "weight": 1, "protocol": null, "websocket": null, "publicOnly": null, "filters": null}
        ]}]});
        let r = push(&http, admin, &nulls).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(get(&http, d, "h", "/nulls", &[]).await.pod(), "svc-a-1");
    })
    .await
    .expect("test finished in time");
}

/// Without a data listener requests arrive only through the tunnel: a loaded table alone is
/// not ready, until the connector is tracked and has a registered connection.
#[tokio::test]
async fn without_a_data_listener_readiness_waits_for_a_tunnel_connection() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            data_addr: None,
            auth_token: Some(TOKEN.into()),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let (http, admin) = (client(), proxy.admin_addr());
        assert_eq!(
            push(&http, admin, &json!({"version": 1, "rules": []}))
                .await
                .status,
            StatusCode::OK
        );
        let r = get(&http, admin, "a", "/readyz", &[]).await;
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "no connector yet: {:?}",
            r.body
        );
        let registered = Arc::new(AtomicUsize::new(0));
        let count = registered.clone();
        proxy
            .health()
            .track_tunnel(move || count.load(Ordering::Relaxed));
        assert_eq!(
            get(&http, admin, "a", "/readyz", &[]).await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        registered.store(2, Ordering::Relaxed);
        assert_eq!(
            get(&http, admin, "a", "/readyz", &[]).await.status,
            StatusCode::OK
        );
    })
    .await
    .expect("test finished in time");
}

/// A hostname pattern the served table no longer has leaves `/metrics`; the ones it still
/// has keep counting.
#[tokio::test]
async fn metrics_of_hostnames_no_longer_served_are_dropped() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let (http, admin, d) = (client(), proxy.admin_addr(), proxy.data_addr());
        let doc = |hosts: &[&str]| {
            json!({"rules": [
                {"hostnames": hosts, "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            ]})
        };
        assert_eq!(
            push(&http, admin, &doc(&["old.example", "kept.example"]))
                .await
                .status,
            StatusCode::OK
        );
        get(&http, d, "old.example", "/", &[]).await;
        get(&http, d, "kept.example", "/", &[]).await;
        let series = |host: &str| {
            format!("cftunnel_proxy_requests_total{{hostname=\"{host}\",status_class=\"2xx\"}}")
        };
        assert_eq!(
            metric(&http, admin, &series("old.example")).await,
            Some(1.0)
        );
        assert_eq!(
            push(&http, admin, &doc(&["kept.example"])).await.status,
            StatusCode::OK
        );
        // Once the replaced table is let go of.
        let by = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while metric(&http, admin, &series("old.example")).await.is_some() {
            assert!(
                tokio::time::Instant::now() < by,
                "the old hostname's series stay"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            metric(&http, admin, &series("kept.example")).await,
            Some(1.0)
        );
        get(&http, d, "kept.example", "/", &[]).await;
        assert_eq!(
            metric(&http, admin, &series("kept.example")).await,
            Some(2.0)
        );
    })
    .await
    .expect("test finished in time");
}

/// The proxy's own answers count by the status the failure has over HTTP: a gRPC call to a
/// backend that is down (answered 200 with `grpc-status: 14`) counts as a 5xx, and a HEAD
/// request with no route as the 4xx it is, not as cut off.
#[tokio::test]
async fn the_proxys_own_grpc_and_head_answers_count_by_their_http_status() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let (http, admin, d) = (client(), proxy.admin_addr(), proxy.data_addr());
        let down = format!("http://127.0.0.1:{}", free_port());
        let doc = json!({"rules": [
            {"hostnames": ["grpc.example"], "backends": [{"url": down, "weight": 1}]},
        ]});
        assert_eq!(push(&http, admin, &doc).await.status, StatusCode::OK);
        let r = get(
            &http,
            d,
            "grpc.example",
            "/pkg.Svc/Call",
            &[("content-type", "application/grpc")],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.headers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"14"[..])
        );
        let series = |host: &str, class: &str| {
            format!("cftunnel_proxy_requests_total{{hostname=\"{host}\",status_class=\"{class}\"}}")
        };
        assert_eq!(
            metric(&http, admin, &series("grpc.example", "5xx")).await,
            Some(1.0)
        );
        let count = |v: Option<f64>| v.unwrap_or(0.0);
        assert_eq!(
            count(metric(&http, admin, &series("grpc.example", "2xx")).await),
            0.0
        );

        let req = http::Request::head(format!("http://{d}/"))
            .header("host", "nowhere.example")
            .body(http_body_util::Full::new(Bytes::new()))
            .expect("request");
        assert_eq!(send(&http, req).await.status, StatusCode::NOT_FOUND);
        // The response is counted when its body is done with, just after the answer.
        let by = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while metric(&http, admin, &series("", "4xx")).await.is_none() {
            assert!(
                tokio::time::Instant::now() < by,
                "the HEAD request is counted as a 4xx"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            count(metric(&http, admin, &series("", "aborted")).await),
            0.0
        );
    })
    .await
    .expect("test finished in time");
}

/// A proxy that has not yet been given a config cannot know any route: it answers 502 (gRPC:
/// UNAVAILABLE), not the 404 of a table where nothing matches, which it answers once a config
/// is loaded, even an empty one.
#[tokio::test]
async fn before_its_first_config_the_proxy_answers_502_and_after_it_404() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let d = proxy.data_addr();
        let r = get(&http, d, "shop.example.com", "/", &[]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            &r.body[..],
            &b"the proxy has not been given its routes yet\n"[..]
        );
        let grpc = get(
            &http,
            d,
            "shop.example.com",
            "/pkg.Svc/Call",
            &[("content-type", "application/grpc")],
        )
        .await;
        assert_eq!(grpc.header("grpc-status"), Some("14"), "{:?}", grpc.headers);
        assert_eq!(
            push(
                &http,
                proxy.admin_addr(),
                &json!({"version": 1, "rules": []})
            )
            .await
            .status,
            StatusCode::OK
        );
        assert_eq!(
            get(&http, d, "shop.example.com", "/", &[]).await.status,
            StatusCode::NOT_FOUND
        );
    })
    .await
    .expect("test finished in time");
}

/// `GET /config/document` answers the document being served as it was pushed, so a
/// controller that lost it (a restart) can read it back; a refused push leaves it as it was.
#[tokio::test]
async fn the_document_served_is_read_back_as_pushed() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let admin = proxy.admin_addr();
        let read = |token: &str| {
            Request::get(format!("http://{admin}/config/document"))
                .header("authorization", format!("Bearer {token}"))
                .body(Full::new(Bytes::new()))
                .expect("req")
        };
        assert_eq!(
            send(&http, read(TOKEN)).await.status,
            StatusCode::NOT_FOUND,
            "none before the first push"
        );
        let good = json!({"version": 5, "rules": [{"name": "team/shop/0", "backends": []}]});
        assert_eq!(push(&http, admin, &good).await.status, StatusCode::OK);
        let r = send(&http, read(TOKEN)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json(), good);
        assert_eq!(
            send(&http, read("wrong")).await.status,
            StatusCode::UNAUTHORIZED
        );
        let stale = json!({"version": 4, "rules": []});
        assert_eq!(
            push(&http, admin, &stale).await.status,
            StatusCode::CONFLICT
        );
        assert_eq!(
            send(&http, read(TOKEN)).await.json(),
            good,
            "a refused push changes nothing"
        );
    })
    .await
    .expect("test finished in time");
}
