//! What a document's regular expressions may take: a push past the budget is refused, naming
//! the field, while the table in service keeps serving; every matcher of a pushed table is
//! built before it serves.

use crate::support::*;
use cftunnel_config::valid::{Pattern, PATTERN_BUDGET};
use http::StatusCode;
use serde_json::json;

/// Patterns of the shape that took a proxy's memory from 41 to 316 MiB on first traffic:
/// about 2 MiB each compiled, the same for every `i` below 1,000.
fn costly(i: usize) -> String {
    format!("/api/v{i:03}/users/\\w{{1,64}}/[\\w.-]{{1,64}}")
}

/// How many of `costly(0)`, `costly(1)`, ... fit in the budget together.
fn fitting() -> usize {
    let cost = Pattern::new(&costly(0)).expect("compiles").cost();
    PATTERN_BUDGET / cost
}

fn regex_rule(name: &str, path: &str, backend: &str) -> serde_json::Value {
    json!({"name": name, "hostnames": ["rx.test"],
           "matches": [{"path": {"type": "RegularExpression", "value": path}}],
           "backends": [{"url": backend, "weight": 1}]})
}

fn served_rule(backend: &str) -> serde_json::Value {
    json!({"name": "ns/served/0", "hostnames": ["served.test"],
           "backends": [{"url": backend, "weight": 1}]})
}

#[tokio::test]
async fn a_push_past_the_regex_budget_is_refused_at_the_field_and_the_last_table_serves() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b) = (echo("svc-a").await, echo("svc-b").await);
        let (ua, ub) = (url(a.http_addr()), url(b.http_addr()));
        let proxy = proxy().await;
        let http = client();
        let v1 = json!({"version": 1, "rules": [served_rule(&ua)]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &v1).await.status,
            StatusCode::OK
        );

        let n = fitting();
        let mut rules: Vec<_> = (0..30)
            .map(|i| regex_rule(&format!("ns/r{i}/0"), &costly(i), &ub))
            .collect();
        rules.push(served_rule(&ub));
        let v2 = json!({"version": 2, "rules": rules});
        let r = push(&http, proxy.admin_addr(), &v2).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
        let body = r.json();
        let field = format!("rules[{n}].matches[0].path");
        assert_eq!(body["field"], json!(field), "{body}");
        assert_eq!(body["rule"], json!(n), "{body}");
        assert_eq!(body["name"], json!(format!("ns/r{n}/0")), "{body}");
        let error = body["error"].as_str().expect("an error message");
        assert!(
            error.starts_with(&format!("{field}: regex takes ")),
            "{error}"
        );

        let r = get(&http, proxy.data_addr(), "served.test", "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.pod(), "svc-a", "the last table keeps serving");
        assert_eq!(proxy.proxy().routes().version(), 1);
    })
    .await
    .expect("test timed out");
}

/// A rule pushed again unchanged is shared with the table in service without being checked
/// again; its patterns count all the same.
#[tokio::test]
async fn a_rule_pushed_again_counts_toward_the_budget() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc").await;
        let u = url(backend.http_addr());
        let proxy = proxy().await;
        let http = client();
        let n = fitting();
        let old: Vec<_> = (0..n)
            .map(|i| regex_rule(&format!("ns/old{i}/0"), &costly(i), &u))
            .collect();
        let v1 = json!({"version": 1, "rules": old});
        assert_eq!(
            push(&http, proxy.admin_addr(), &v1).await.status,
            StatusCode::OK
        );

        // One new pattern first: the rules of the last push then go past the budget.
        let mut rules = vec![regex_rule("ns/new/0", &costly(n), &u)];
        rules.extend(old);
        let v2 = json!({"version": 2, "rules": rules});
        let r = push(&http, proxy.admin_addr(), &v2).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
        let body = r.json();
        let last = n;
        assert_eq!(
            body["field"],
            json!(format!("rules[{last}].matches[0].path")),
            "{body}"
        );
        assert_eq!(
            body["name"],
            json!(format!("ns/old{}/0", last - 1)),
            "{body}"
        );
        assert_eq!(proxy.proxy().routes().version(), 1);
    })
    .await
    .expect("test timed out");
}

/// No request waits for a matcher: every pattern of a pushed table (path, header and query
/// values; costly and everyday ones; new and shared with the last table) has its matcher
/// built when the push is answered, before any request reaches it.
#[tokio::test]
async fn every_matcher_of_a_pushed_table_is_built_before_it_serves() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc").await;
        let u = url(backend.http_addr());
        let proxy = proxy().await;
        let http = client();
        let everyday = json!({"name": "ns/everyday/0", "matches": [{
            "path": {"type": "RegularExpression", "value": "/v[0-9]+/.*"},
            "headers": [{"name": "x-team", "type": "RegularExpression", "value": "\\w{3,32}"}],
            "queryParams": [{"name": "id", "type": "RegularExpression", "value": "[0-9]+"}]
        }], "backends": [{"url": u, "weight": 1}]});
        let mut rules = vec![everyday.clone(), regex_rule("ns/costly/0", &costly(0), &u)];
        let v1 = json!({"version": 1, "rules": rules});
        assert_eq!(
            push(&http, proxy.admin_addr(), &v1).await.status,
            StatusCode::OK
        );
        let built = |version: i64| {
            let routes = proxy.proxy().routes();
            assert_eq!(routes.version(), version);
            let patterns: Vec<_> = routes.table().patterns().cloned().collect();
            let unbuilt: Vec<_> = patterns.iter().filter(|p| !p.is_built()).collect();
            assert!(unbuilt.is_empty(), "not built: {unbuilt:?}");
            patterns.len()
        };
        assert_eq!(built(1), 4);

        rules.push(regex_rule("ns/costly/1", &costly(1), &u));
        let v2 = json!({"version": 2, "rules": rules});
        assert_eq!(
            push(&http, proxy.admin_addr(), &v2).await.status,
            StatusCode::OK
        );
        assert_eq!(built(2), 5);

        let r = get(
            &http,
            proxy.data_addr(),
            "rx.test",
            "/api/v001/users/bob/x.y",
            &[],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
    })
    .await
    .expect("test timed out");
}
