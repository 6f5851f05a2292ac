//! The config API while the runtime's blocking pool is taken whole by calls that do not return,
//! as backend name lookups are while DNS does not answer: the push that fixes the incident,
//! and the reads around it, are still served.

use crate::support::*;
use http::StatusCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Blocking threads of the proxy's runtime here: few, so the test can take them all (the
/// product's 512 are taken the same way, one stuck lookup each).
const BLOCKING_THREADS: usize = 4;

/// How long each config API call may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

#[test]
fn config_api_answers_while_every_blocking_thread_is_stuck() {
    let proxy_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .expect("proxy runtime");
    let server = proxy_runtime.block_on(proxy());
    let admin = server.admin_addr();

    // Every blocking thread waits on `gate` until the test ends, and one more call waits in
    // the pool's queue behind them.
    let gate = Arc::new(RwLock::new(()));
    let closed = gate.write().expect("gate");
    let (started, running) = std::sync::mpsc::channel();
    for _ in 0..=BLOCKING_THREADS {
        let (gate, started) = (gate.clone(), started.clone());
        proxy_runtime.spawn_blocking(move || {
            let _ = started.send(());
            let _open = gate.read();
        });
    }
    for _ in 0..BLOCKING_THREADS {
        running
            .recv_timeout(Duration::from_secs(10))
            .expect("a blocking thread is taken");
    }

    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
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
