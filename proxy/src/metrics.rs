//! The proxy's Prometheus metrics (names fixed by the proxy contract).
//!
//! A hostname's children are fetched from the families by the first request to that hostname
//! on a compiled table and kept in the table's slot for it, so every later request touches
//! atomics only, never the families' label maps nor any lock: the duration histogram is
//! [`histogram::AtomicHistogram`], not prometheus-client's locked one. Fetching on first use
//! rather than at compile time keeps series to the hostnames that are served: a table of
//! 10,000 mostly idle hostnames would otherwise expose some 300,000 zero-valued series.
//!
//! A hostname's series are dropped once no table in service has it any more. Fetching them
//! for a table's slot and dropping them take turns (`ProxyMetrics::host_series`): a table
//! that serves the hostname again and fetched its children just before they were dropped
//! would otherwise count into children `/metrics` no longer lists. Turns are short (one
//! hostname's fetch or drop) and taken in the order asked for, so a request fetching its
//! hostname's children waits for at most the turns queued before it, not for a whole pass
//! over the hostnames a replaced table served.

pub mod histogram;

use histogram::{AtomicHistogram, Shards};

use parking_lot::{FairMutex, FairMutexGuard};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::access::AccessMetrics;

/// Latency buckets in seconds: 1 ms, for in-cluster hops, to 100 s, Cloudflare's own limit on
/// an answer through the tunnel, past the proxy's default timeouts (60 s): a backend timing
/// out shows in the quantiles as the timeout it is, not as the largest bucket below it.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 100.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    pub hostname: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum StatusClass {
    S1xx,
    S2xx,
    S3xx,
    S4xx,
    S5xx,
    Aborted,
}

impl StatusClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::S1xx => "1xx",
            Self::S2xx => "2xx",
            Self::S3xx => "3xx",
            Self::S4xx => "4xx",
            Self::S5xx => "5xx",
            Self::Aborted => "aborted",
        }
    }
}

impl EncodeLabelValue for StatusClass {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

const STATUS_CLASSES: [StatusClass; 6] = [
    StatusClass::S1xx,
    StatusClass::S2xx,
    StatusClass::S3xx,
    StatusClass::S4xx,
    StatusClass::S5xx,
    StatusClass::Aborted,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub hostname: String,
    pub status_class: StatusClass,
}

/// Backend error reasons, as the contract names them.
pub const BACKEND_ERROR_REASONS: [&str; 5] = ["dial", "timeout", "tls", "canceled", "other"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub hostname: String,
    pub reason: String,
}

/// The `result` values of `cftunnel_proxy_config_reloads_total`.
pub const RELOAD_RESULTS: [&str; 3] = ["success", "rejected", "stale"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// Makes each hostname's duration histogram, with a copy of its counters per worker thread.
#[derive(Clone, Copy, Debug)]
struct DurationHistogram(Shards);

impl MetricConstructor<AtomicHistogram> for DurationHistogram {
    fn new_metric(&self) -> AtomicHistogram {
        AtomicHistogram::new(DURATION_BUCKETS, self.0)
    }
}

#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    pub in_flight: Gauge,
    pub websocket_sessions: Gauge,
    duration: Family<HostLabels, AtomicHistogram, DurationHistogram>,
    requests: Family<StatusLabels, Counter>,
    backend_errors: Family<ReasonLabels, Counter>,
    request_bytes: Family<HostLabels, Counter>,
    response_bytes: Family<HostLabels, Counter>,
    pub config_version: Gauge,
    /// 1 once the proxy drains: its tunnel connections go on purpose, which alerts leave out.
    pub draining: Gauge,
    reloads: Family<ResultLabels, Counter>,
    pub mirrors_dropped: Counter,
    /// Access-log lines not written: the log's queue was full.
    pub access_log_dropped: Counter,
    /// Bytes held by the access-log lines waiting to be written.
    pub access_log_queued: Gauge,
    /// One for the whole process: per hostname it would add a series of zeros for every
    /// hostname without a retry policy.
    retries_over_budget: Counter,
    pub access: AccessMetrics,
    /// Taken while a hostname's children are fetched for a table's slot and while a
    /// hostname's series are dropped; never by a request whose table's slot is filled.
    host_series: Arc<FairMutex<()>>,
}

/// The children of one hostname label, fetched by the first request to that hostname on a
/// compiled table and kept in the table for the rest.
#[derive(Clone, Debug)]
pub struct HostMetrics {
    pub duration: AtomicHistogram,
    requests: [Counter; 6],
    backend_errors: [Counter; 5],
    pub request_bytes: Counter,
    pub response_bytes: Counter,
    /// The process's count of retries the backends' budgets refused.
    pub retries_over_budget: Counter,
}

impl HostMetrics {
    pub fn request(&self, class: StatusClass) -> &Counter {
        let i = STATUS_CLASSES.iter().position(|c| *c == class).unwrap_or(5);
        &self.requests[i]
    }

    pub fn backend_error(&self, reason: &str) -> &Counter {
        let i = BACKEND_ERROR_REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(BACKEND_ERROR_REASONS.len() - 1);
        &self.backend_errors[i]
    }
}

impl ProxyMetrics {
    /// Registers the proxy's metrics under `cftunnel_proxy_`, for requests served by one
    /// thread (tests, tools); a server uses [`Self::register_for_workers`].
    pub fn register(registry: &mut Registry) -> Self {
        Self::register_for_workers(registry, 1)
    }

    /// Registers the proxy's metrics under `cftunnel_proxy_`.
    ///
    /// `worker_threads` is the number of runtime threads that serve requests: each hostname's
    /// duration histogram keeps a copy of its counters per worker, up to
    /// [`histogram::MAX_SHARDS`] (see [`Shards`] for the memory this takes).
    pub fn register_for_workers(registry: &mut Registry, worker_threads: usize) -> Self {
        let m = Self {
            in_flight: Gauge::default(),
            websocket_sessions: Gauge::default(),
            duration: Family::new_with_constructor(DurationHistogram(Shards::for_workers(
                worker_threads,
            ))),
            requests: Family::default(),
            backend_errors: Family::default(),
            request_bytes: Family::default(),
            response_bytes: Family::default(),
            config_version: Gauge::default(),
            draining: Gauge::default(),
            reloads: Family::default(),
            mirrors_dropped: Counter::default(),
            access_log_dropped: Counter::default(),
            access_log_queued: Gauge::default(),
            retries_over_budget: Counter::default(),
            access: AccessMetrics::default(),
            host_series: Arc::default(),
        };
        let r = registry.sub_registry_with_prefix("cftunnel_proxy");
        r.register(
            "requests_in_flight",
            "Requests being served now (the autoscaling signal)",
            m.in_flight.clone(),
        );
        r.register(
            "draining",
            "1 while the proxy drains (after SIGTERM): it takes no new requests and lets its tunnel connections go",
            m.draining.clone(),
        );
        r.register(
            "websocket_active_sessions",
            "Upgraded WebSocket sessions open now",
            m.websocket_sessions.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from request arrival to the end of the response body",
            m.duration.clone(),
        );
        r.register(
            "requests",
            "Requests served, by status class",
            m.requests.clone(),
        );
        r.register(
            "backend_errors",
            "Failed tries against backends, by reason",
            m.backend_errors.clone(),
        );
        r.register(
            "request_bytes",
            "Request body bytes received",
            m.request_bytes.clone(),
        );
        r.register(
            "response_bytes",
            "Response body bytes sent",
            m.response_bytes.clone(),
        );
        r.register(
            "config_version",
            "Version of the config document being served",
            m.config_version.clone(),
        );
        r.register(
            "config_reloads",
            "Config pushes, by result",
            m.reloads.clone(),
        );
        // Listed from the start, so the first refusal is an increase an alert sees.
        for result in RELOAD_RESULTS {
            let _ = m.reloads.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
        r.register(
            "mirror_requests_dropped",
            "Mirror copies not sent because the mirror queue was full or the body was streamed",
            m.mirrors_dropped.clone(),
        );
        r.register(
            "access_log_lines_dropped",
            "Access-log lines not written because the log's queue was full, of lines or of bytes (its output slower than requests)",
            m.access_log_dropped.clone(),
        );
        r.register(
            "access_log_queued_bytes",
            "Bytes held by access-log lines waiting to be written",
            m.access_log_queued.clone(),
        );
        r.register(
            "retries_over_budget",
            "Retries a rule's policy asked for that the backend's retry budget did not cover (the failed try was the answer)",
            m.retries_over_budget.clone(),
        );
        m.access.register(r);
        m
    }

    /// Fetches (creating if needed) the children for one hostname pattern.
    pub fn host(&self, hostname: &str) -> HostMetrics {
        self.host_series().fetch(hostname)
    }

    /// A turn at fetching and dropping hostnames' series, for a caller that must decide what
    /// to drop within the same turn: a fetch waits for it to end (see the module docs). Hold
    /// it for one hostname: requests whose first fetch queues behind it wait meanwhile.
    pub(crate) fn host_series(&self) -> HostSeries<'_> {
        HostSeries {
            metrics: self,
            _turn: self.host_series.lock(),
        }
    }

    /// Counts a config load or push; `result` is one of [`RELOAD_RESULTS`].
    pub fn reload(&self, result: &str) {
        self.reloads
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }
}

/// Fetching and dropping hostnames' series, one caller at a time: see
/// [`ProxyMetrics::host_series`].
pub(crate) struct HostSeries<'a> {
    metrics: &'a ProxyMetrics,
    /// Fair: a thread that drops hostname after hostname hands each turn to a waiter before
    /// it takes the next, so a request waits for one hostname's drop, not the whole pass.
    _turn: FairMutexGuard<'a, ()>,
}

impl HostSeries<'_> {
    /// Fetches (creating if needed) the children for one hostname pattern.
    pub(crate) fn fetch(&self, hostname: &str) -> HostMetrics {
        let m = self.metrics;
        let h = HostLabels {
            hostname: hostname.to_owned(),
        };
        HostMetrics {
            duration: m.duration.get_or_create(&h).clone(),
            requests: STATUS_CLASSES.map(|status_class| {
                m.requests
                    .get_or_create(&StatusLabels {
                        hostname: hostname.to_owned(),
                        status_class,
                    })
                    .clone()
            }),
            backend_errors: BACKEND_ERROR_REASONS.map(|reason| {
                m.backend_errors
                    .get_or_create(&ReasonLabels {
                        hostname: hostname.to_owned(),
                        reason: reason.to_owned(),
                    })
                    .clone()
            }),
            request_bytes: m.request_bytes.get_or_create(&h).clone(),
            response_bytes: m.response_bytes.get_or_create(&h).clone(),
            retries_over_budget: m.retries_over_budget.clone(),
        }
    }

    /// Drops every series of a hostname pattern, so `/metrics` does not grow with every
    /// hostname ever served.
    pub(crate) fn forget(&self, hostname: &str) {
        let m = self.metrics;
        let h = HostLabels {
            hostname: hostname.to_owned(),
        };
        m.duration.remove(&h);
        m.request_bytes.remove(&h);
        m.response_bytes.remove(&h);
        for status_class in STATUS_CLASSES {
            m.requests.remove(&StatusLabels {
                hostname: hostname.to_owned(),
                status_class,
            });
        }
        for reason in BACKEND_ERROR_REASONS {
            m.backend_errors.remove(&ReasonLabels {
                hostname: hostname.to_owned(),
                reason: reason.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod duration_tests {
    use super::DURATION_BUCKETS;

    /// A request cut at one of the proxy's default timeouts lands in a bucket of its own, below
    /// the largest, so quantiles read the timeout rather than the bound under it.
    #[test]
    fn the_duration_buckets_reach_past_the_default_timeouts() {
        let defaults = crate::ServerOptions::default();
        let below_largest = &DURATION_BUCKETS[..DURATION_BUCKETS.len() - 1];
        for timeout in [
            defaults.backend_header_timeout,
            defaults.request_body_timeout,
        ] {
            let secs = timeout.as_secs_f64();
            assert!(
                below_largest.iter().any(|&bound| bound >= secs),
                "{secs} s has a finite bucket below the largest"
            );
        }
    }
}
