//! The controller's own HTTP endpoint: `/healthz` (the process runs), `/readyz` (its watch
//! caches are filled; a standby replica is ready too) and `/metrics` (OpenMetrics text).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::cloudflare::ApiCalls;

/// A data plane, as `/metrics` names it: `shared`, or the Gateway's `namespace/name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PlaneLabel {
    pub(super) plane: String,
}

/// A kind of object the controller watches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: &'static str,
}

/// A kind of object the controller watches, named at run time (as its watch names it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WatchLabel {
    pub(super) kind: String,
}

fn push_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// What the runtime reports about itself.
pub struct Health {
    ready: AtomicBool,
    registry: Registry,
    pub(super) rounds: Counter,
    pub(super) round_seconds: Histogram,
    pub(super) leading: Gauge,
    /// Planes whose pushes have failed for a sustained run.
    pub(super) push_failing_planes: Gauge,
    /// Gateways whose plane could not be rendered or applied.
    pub(super) render_failing_gateways: Gauge,
    /// Planes whose tunnel document could not be written.
    pub(super) tunnel_failing_planes: Gauge,
    /// Planes some Gateway depends on that no config push reaches: no proxy pod listed, or no
    /// config-API token.
    pub(super) unreached_planes: Gauge,
    /// Calls to the Cloudflare API.
    pub(super) api_calls: ApiCalls,
    /// Per plane: how long a round's pushes to its pods took, when some pod was pushed to.
    pub(super) push_seconds: Family<PlaneLabel, Histogram, fn() -> Histogram>,
    /// Per plane: pushes to a pod that failed.
    pub(super) push_failures: Family<PlaneLabel, Counter>,
    /// Objects in the watch caches, by kind.
    pub(super) watched_objects: Family<KindLabel, Gauge>,
    /// Failed attempts of a watch (its list or its watch request), by kind.
    pub(super) watch_failures: Family<WatchLabel, Counter>,
}

impl Default for Health {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cftunnel_controller");
        let rounds = Counter::default();
        registry.register("rounds", "Reconciliation rounds run", rounds.clone());
        let round_seconds = Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0]);
        registry.register(
            "round_duration_seconds",
            "Time a reconciliation round took",
            round_seconds.clone(),
        );
        let leading = Gauge::default();
        registry.register(
            "leading",
            "1 while this replica holds the leader Lease",
            leading.clone(),
        );
        let push_failing_planes = Gauge::default();
        registry.register(
            "push_failing_planes",
            "Data planes whose config pushes have failed for a sustained run",
            push_failing_planes.clone(),
        );
        let render_failing_gateways = Gauge::default();
        registry.register(
            "render_failing_gateways",
            "Gateways whose data plane could not be rendered or applied",
            render_failing_gateways.clone(),
        );
        let tunnel_failing_planes = Gauge::default();
        registry.register(
            "tunnel_failing_planes",
            "Data planes whose tunnel ingress document could not be written",
            tunnel_failing_planes.clone(),
        );
        let unreached_planes = Gauge::default();
        registry.register(
            "unreached_planes",
            "Data planes some Gateway depends on that no config push reaches: no proxy pod \
             listed, or no config-API token",
            unreached_planes.clone(),
        );
        let api_calls = ApiCalls::default();
        api_calls.register(&mut registry);
        let push_seconds: Family<PlaneLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(push_histogram);
        registry.register(
            "push_duration_seconds",
            "Time a round's config pushes to a plane's pods took, by plane (shared, or the \
             Gateway's namespace/name); rounds with nothing to push are not observed",
            push_seconds.clone(),
        );
        let push_failures = Family::<PlaneLabel, Counter>::default();
        registry.register(
            "push_failures",
            "Config pushes to a proxy pod that failed, by plane",
            push_failures.clone(),
        );
        let watched_objects = Family::<KindLabel, Gauge>::default();
        registry.register(
            "watched_objects",
            "Objects in the controller's watch caches, by kind",
            watched_objects.clone(),
        );
        let watch_failures = Family::<WatchLabel, Counter>::default();
        registry.register(
            "watch_failures",
            "Failed attempts of a watch of the API server (its list or its watch request), by \
             kind; each is retried with backoff",
            watch_failures.clone(),
        );
        Self {
            ready: AtomicBool::new(false),
            watch_failures,
            registry,
            api_calls,
            push_seconds,
            push_failures,
            watched_objects,
            rounds,
            round_seconds,
            leading,
            push_failing_planes,
            render_failing_gateways,
            tunnel_failing_planes,
            unreached_planes,
        }
    }
}

impl Health {
    /// `/metrics`' body: every metric, as OpenMetrics text.
    ///
    /// # Errors
    /// A metric could not be encoded.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }

    pub(super) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    fn answer(&self, path: &str) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match path {
            "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            "/readyz" if self.ready.load(Ordering::Acquire) => {
                (StatusCode::OK, "text/plain", "ready\n".to_owned())
            }
            "/readyz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "watch caches are not filled yet\n".to_owned(),
            ),
            "/metrics" => match self.metrics_text() {
                Ok(text) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encoding metrics: {e}\n"),
                ),
            },
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_owned(),
            ),
        };
        let mut res = Response::new(Full::new(Bytes::from(body)));
        *res.status_mut() = status;
        res.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        res
    }
}

/// Serves `health` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let res = health.answer(req.uri().path());
                async move { Ok::<_, Infallible>(res) }
            });
            // A client that never sends its request does not hold the connection forever.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
