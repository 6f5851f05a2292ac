//! The admin port while the runtime's blocking pool is taken whole by calls that do not
//! return, as backend name lookups are while DNS does not answer: the push that fixes the
//! incident, the reads around it and the metrics that show it are still served.

use crate::support::*;
use http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::{OwnedRwLockWriteGuard, RwLock};

/// Blocking threads of the proxy's runtime here: few, so the test can take them all (the
/// product's 512 are taken the same way, one stuck lookup each).
const BLOCKING_THREADS: usize = 4;

/// How long each admin call may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// A runtime for the proxy with [`BLOCKING_THREADS`] blocking threads.
fn proxy_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .expect("proxy runtime")
}

/// Takes every blocking thread of `runtime` until the returned guard is dropped, and queues
/// one more call behind them.
fn take_every_blocking_thread(runtime: &Runtime) -> OwnedRwLockWriteGuard<()> {
    let gate = Arc::new(RwLock::new(()));
    let closed = Arc::clone(&gate).try_write_owned().expect("gate");
    let (started, running) = std::sync::mpsc::channel();
    for _ in 0..=BLOCKING_THREADS {
        let (gate, started) = (gate.clone(), started.clone());
        runtime.spawn_blocking(move || {
            let _ = started.send(());
            let _open = gate.blocking_read();
        });
    }
    for _ in 0..BLOCKING_THREADS {
        running
            .recv_timeout(Duration::from_secs(10))
            .expect("a blocking thread is taken");
    }
    closed
}

#[test]
fn config_api_answers_while_every_blocking_thread_is_stuck() {
    let proxy_runtime = proxy_runtime();
    let server = proxy_runtime.block_on(proxy());
    let admin = server.admin_addr();
    let closed = take_every_blocking_thread(&proxy_runtime);

    let client_runtime = current_thread_runtime();
    client_runtime.block_on(async {
        tokio::time::timeout(TEST_TIMEOUT, async {
            let http = client();
            let doc = serde_json::json!({"version": 7, "rules": [{
                "backends": [{"url": "http://svc.ns.svc.cluster.local:8080", "weight": 1}]
            }]});
            let read = || async {
                let auth = format!("Bearer {TOKEN}");
                tokio::time::timeout(
                    ANSWER_WITHIN,
                    get(
                        &http,
                        admin,
                        "admin",
                        "/config",
                        &[("authorization", &auth)],
                    ),
                )
                .await
                .expect("GET /config answers within a second")
            };
            // The read is sent while the push is in progress.
            let (pushed, during) = tokio::join!(
                tokio::time::timeout(ANSWER_WITHIN, push(&http, admin, &doc)),
                read(),
            );
            let pushed = pushed.expect("PUT /config answers within a second");
            assert_eq!(
                (pushed.status, pushed.json()),
                (StatusCode::OK, serde_json::json!({"version": 7}))
            );
            assert_eq!(during.status, StatusCode::OK);
            let after = read().await;
            assert_eq!(
                (after.status, &after.json()["version"]),
                (StatusCode::OK, &serde_json::json!(7))
            );
        })
        .await
        .expect("test finished in time");
    });

    drop(closed);
    drop(server);
    proxy_runtime.shutdown_timeout(Duration::from_secs(5));
}

/// `/metrics` is encoded off the runtime's workers, but not on its blocking pool: a scrape
/// during a DNS outage shows it.
#[test]
fn metrics_answer_while_every_blocking_thread_is_stuck() {
    let proxy_runtime = proxy_runtime();
    let server = proxy_runtime.block_on(proxy());
    let admin = server.admin_addr();
    let closed = take_every_blocking_thread(&proxy_runtime);

    let client_runtime = current_thread_runtime();
    client_runtime.block_on(async {
        let http = client();
        let scrape =
            tokio::time::timeout(ANSWER_WITHIN, get(&http, admin, "admin", "/metrics", &[]))
                .await
                .expect("GET /metrics answers within a second");
        assert_eq!(scrape.status, StatusCode::OK);
        let text = String::from_utf8_lossy(&scrape.body);
        assert!(
            text.contains("\ncftunnel_proxy_config_version 0\n"),
            "{text}"
        );
    });

    drop(closed);
    drop(server);
    proxy_runtime.shutdown_timeout(Duration::from_secs(5));
}
