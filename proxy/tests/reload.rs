//! Config pushes under load: no request fails, and each one is served wholly by one table.

use crate::support::*;
use http::StatusCode;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Version N routes to backend A (odd N) or B (even N) and stamps `x-config-version: N`.
fn doc(version: i64, a: &str, b: &str) -> serde_json::Value {
    let backend = if version % 2 == 1 { a } else { b };
    json!({"version": version, "rules": [{
        "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-config-version", "value": version.to_string()}]}}],
        "backends": [{"url": backend, "weight": 1}]
    }]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pushes_under_load_fail_no_request_and_never_mix_tables() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b) = (echo("svc-a-1").await, echo("svc-b-1").await);
        let (ua, ub) = (url(a.http_addr()), url(b.http_addr()));
        let proxy = proxy().await;
        let http = client();
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc(1, &ua, &ub))
                .await
                .status,
            StatusCode::OK
        );
        let d = proxy.data_addr();

        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        const CONCURRENCY: usize = 300;
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                let (http, stop, served) = (client(), stop.clone(), served.clone());
                tokio::spawn(async move {
                    let mut failures = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let r = get(&http, d, "h", "/load?delay=5ms", &[]).await;
                        served.fetch_add(1, Ordering::Relaxed);
                        let version: i64 = r
                            .header("x-config-version")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(-1);
                        let expected_pod = if version % 2 == 1 {
                            "svc-a-1"
                        } else {
                            "svc-b-1"
                        };
                        if r.status != StatusCode::OK || r.pod() != expected_pod {
                            failures.push(format!(
                                "status {} version {version} pod {}",
                                r.status,
                                r.pod()
                            ));
                        }
                    }
                    failures
                })
            })
            .collect();
        for version in 2..=51 {
            let r = push(&http, proxy.admin_addr(), &doc(version, &ua, &ub)).await;
            assert_eq!(r.status, StatusCode::OK);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for w in workers {
            failures.extend(w.await.expect("worker"));
        }
        assert!(
            failures.is_empty(),
            "{} failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        assert!(
            served.load(Ordering::Relaxed) > CONCURRENCY,
            "load was applied"
        );
        let r = get(&http, d, "h", "/after", &[]).await;
        assert_eq!(r.header("x-config-version"), Some("51"));
        assert_eq!(r.pod(), "svc-a-1");
    })
    .await
    .expect("test finished in time");
}

/// The config API's body cap is a setting: a document over it is refused with 413 and the table
/// stays; by default a 50,000-rule document, what a large cluster pushes, fits and is applied.
#[tokio::test]
async fn the_body_cap_is_a_setting_and_the_default_takes_fifty_thousand_rules() {
    tokio::time::timeout(TEST_TIMEOUT * 4, async {
        let http = client();
        let small = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            max_config_bytes: 4096,
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let rules = |n: usize| -> Vec<serde_json::Value> {
            (0..n)
                .map(|i| serde_json::json!({
                    "name": format!("ns/route{i}/0"),
                    "hostnames": [format!("app{i}.example.com")],
                    "matches": [{"path": {"type": "PathPrefix", "value": format!("/svc{i}")}}],
                    // Loopback addresses where nothing listens: a request is refused at once.
                    "backends": [{"url": format!("http://127.{}.{}.{}:9", (i >> 16) & 255, (i >> 8) & 255, i & 255), "weight": 1}]
                }))
                .collect()
        };
        let over = serde_json::json!({"version": 2, "rules": rules(40)});
        assert!(over.to_string().len() > 4096);
        assert_eq!(push(&http, small.admin_addr(), &over).await.status, http::StatusCode::PAYLOAD_TOO_LARGE);
        let under = serde_json::json!({"version": 1, "rules": rules(2)});
        assert_eq!(push(&http, small.admin_addr(), &under).await.status, http::StatusCode::OK);

        let large = proxy().await;
        let doc = serde_json::json!({"version": 7, "rules": rules(50_000)});
        assert!(doc.to_string().len() > 8 * 1024 * 1024, "larger than the former cap");
        let r = push(&http, large.admin_addr(), &doc).await;
        assert_eq!(r.status, http::StatusCode::OK, "{:?}", r.body);
        assert_eq!(get(&http, large.data_addr(), "app49999.example.com", "/svc49999/x", &[]).await.status, http::StatusCode::BAD_GATEWAY, "routed to its backend, where nothing listens");
    })
    .await
    .expect("test finished in time");
}
