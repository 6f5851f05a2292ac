//! Header filters and the headers the proxy owns: a push whose filter would set how a message
//! is framed (`Content-Length`, `Transfer-Encoding`) is refused whole.

use crate::support::*;
use http::StatusCode;
use serde_json::json;

/// A document with one rule to `backend`, `filter` at rule level or on the backend.
fn doc(
    version: i64,
    backend: &str,
    filter: serde_json::Value,
    on_backend: bool,
) -> serde_json::Value {
    if on_backend {
        json!({"version": version, "rules": [{"backends": [{"url": backend, "weight": 1, "filters": [filter]}]}]})
    } else {
        json!({"version": version, "rules": [{"filters": [filter], "backends": [{"url": backend, "weight": 1}]}]})
    }
}

/// A `ResponseHeaderModifier` setting `Content-Length: 0` on a backend's answer would make the
/// client read the body as the next response on its connection; a `RequestHeaderModifier`
/// doing so on a request would do the same to the backend. Such a push gets 400 naming the
/// entry and the header, and the table before it keeps serving; removing the same headers is
/// taken.
#[tokio::test]
async fn a_push_whose_filter_sets_a_framing_header_is_refused_and_the_old_table_keeps_serving() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b) = (echo("svc-a-1").await, echo("svc-b-1").await);
        let (ua, ub) = (url(a.http_addr()), url(b.http_addr()));
        let proxy = proxy().await;
        let http = client();
        let (admin, d) = (proxy.admin_addr(), proxy.data_addr());
        let good = json!({"version": 1, "rules": [{"backends": [{"url": ua, "weight": 1}]}]});
        assert_eq!(push(&http, admin, &good).await.status, StatusCode::OK);
        assert_eq!(get(&http, d, "h", "/", &[]).await.pod(), "svc-a-1");

        let cases = [
            (
                json!({"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "Content-Length", "value": "0"}]}}),
                false,
                "rules[0].filters[0].responseHeaderModifier.set[0].name",
                "content-length",
            ),
            (
                json!({"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-fine", "value": "1"}, {"name": "content-length", "value": "4"}]}}),
                false,
                "rules[0].filters[0].requestHeaderModifier.set[1].name",
                "content-length",
            ),
            (
                json!({"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "Transfer-Encoding", "value": "chunked"}]}}),
                true,
                "rules[0].backends[0].filters[0].requestHeaderModifier.add[0].name",
                "transfer-encoding",
            ),
        ];
        for (filter, on_backend, field, header) in cases {
            let r = push(&http, admin, &doc(2, &ub, filter.clone(), on_backend)).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{filter}: {:?}", r.body);
            let error = r.json()["error"].as_str().unwrap_or_default().to_owned();
            assert!(
                error.contains(&format!("{field}: {header} ")),
                "{filter}: {error}"
            );
            let answer = get(&http, d, "h", "/", &[]).await;
            assert_eq!(answer.status, StatusCode::OK, "{filter}");
            assert_eq!(answer.pod(), "svc-a-1", "the previous table serves: {filter}");
        }

        // Removing them is taken, and so is setting another hop-by-hop header.
        let removing = json!({"version": 3, "rules": [{
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": ["Content-Length", "Transfer-Encoding", "Connection"]}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"remove": ["Content-Length", "Keep-Alive"], "set": [{"name": "Connection", "value": "close"}]}}
            ],
            "backends": [{"url": ub, "weight": 1}]
        }]});
        let r = push(&http, admin, &removing).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(get(&http, d, "h", "/", &[]).await.pod(), "svc-b-1");
    })
    .await
    .expect("test finished in time");
}
