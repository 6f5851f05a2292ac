//! `/metrics` on the admin port: a scrape, however long its encoding takes, does not hold up
//! the requests the proxy serves on the same runtime.

use crate::support::*;
use cftunnel_proxy::{Server, ServerOptions};
use http::StatusCode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long the held metric's encoding waits for the test before giving up: only a bound on
/// a scrape that stops the test from going on.
const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// A metric whose encoding waits until the test lets it go, as the encoding of a registry of
/// thousands of hostnames takes its time. It reads 1 if the test let it go, 0 if it gave up.
#[derive(Clone, Debug)]
struct HeldMetric(Arc<Hold>);

#[derive(Debug)]
struct Hold {
    started: tokio::sync::mpsc::UnboundedSender<()>,
    release: Mutex<mpsc::Receiver<()>>,
    released: AtomicBool,
}

impl EncodeMetric for HeldMetric {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let _ = self.0.started.send(());
        let released = self
            .0
            .release
            .lock()
            .expect("release channel")
            .recv_timeout(HOLD_AT_MOST)
            .is_ok();
        self.0.released.store(released, Ordering::Release);
        encoder.encode_gauge(&i64::from(released))
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// The proxy on one current-thread runtime, the default single worker: while a scrape's
/// encoding is under way, a request on the data port is still answered.
#[test]
fn requests_are_served_while_a_scrape_is_being_encoded() {
    let (started, mut encoding) = tokio::sync::mpsc::unbounded_channel();
    let (release, held) = mpsc::channel();
    let held = HeldMetric(Arc::new(Hold {
        started,
        release: Mutex::new(held),
        released: AtomicBool::new(false),
    }));
    let mut registry = Registry::default();
    registry.register("scrape_held", "Released by the test", held.clone());

    let (addrs, server_addrs) = mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::spawn(move || {
        let runtime = current_thread_runtime();
        runtime.block_on(async move {
            let options = ServerOptions {
                auth_token: Some(TOKEN.into()),
                ..ServerOptions::default()
            };
            let server = Server::start_with_registry(options, None, registry)
                .await
                .expect("proxy starts");
            addrs
                .send((server.data_addr(), server.admin_addr()))
                .expect("addresses sent");
            let _ = stopped.await;
            drop(server);
        });
    });
    let (data, admin) = server_addrs
        .recv_timeout(TEST_TIMEOUT)
        .expect("proxy started");

    let client_runtime = current_thread_runtime();
    client_runtime.block_on(async {
        tokio::time::timeout(TEST_TIMEOUT, async {
            let http = client();
            let scrape = tokio::spawn({
                let http = http.clone();
                async move { get(&http, admin, "admin", "/metrics", &[]).await }
            });
            encoding
                .recv()
                .await
                .expect("the scrape's encoding started");
            // Answered by the proxy itself (no table is loaded): what matters is that it is
            // answered while the encoding still waits for the test.
            let during = get(&http, data, "app.example", "/", &[]).await;
            let _ = release.send(());
            let scrape = scrape.await.expect("scrape task");

            assert!(
                held.0.released.load(Ordering::Acquire),
                "the request was answered only once the scrape's encoding gave up waiting"
            );
            assert!(
                during.status.is_client_error() || during.status.is_server_error(),
                "{during:?}"
            );
            assert_eq!(scrape.status, StatusCode::OK);
            assert_eq!(
                scrape.header("content-type"),
                Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
            );
            let text = String::from_utf8_lossy(&scrape.body);
            assert!(text.contains("\nscrape_held 1\n"), "{text}");
            assert!(
                text.contains("\ncftunnel_proxy_requests_in_flight "),
                "{text}"
            );
            assert!(text.ends_with("# EOF\n"), "{text}");
        })
        .await
        .expect("test finished in time");
    });

    let _ = stop.send(());
    server_thread.join().expect("proxy thread");
}
