//! Completion accounting: what a request records once, when its response ends or is dropped.
//!
//! The in-flight gauge, the hostname's duration, status-class and response-byte series, and
//! the access-log line are all written here, so a request is counted exactly once however it
//! ends: body read through, cut off by a deadline, or dropped by a client that went away. The
//! handler starts a [`Completion`] when a request arrives and fills in what it learns; the
//! response body carries it to the end.

use crate::access_log::{AccessLog, Fields};
use crate::metrics::{HostMetrics, StatusClass};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use tokio::time::Instant;

/// What every request's completion is recorded into; one per proxy, shared by its requests.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Requests being served now: raised when a completion starts, lowered when it is recorded.
    in_flight: Gauge,
    access_log: Option<AccessLog>,
}

impl Recorder {
    pub(crate) fn new(in_flight: Gauge, access_log: Option<AccessLog>) -> Self {
        Self {
            in_flight,
            access_log,
        }
    }
}

/// Records a request's metrics and access-log line once, when its response ends or is dropped.
#[derive(Debug)]
pub(crate) struct Completion {
    recorder: Arc<Recorder>,
    bucket: Option<usize>,
    /// The matched hostname's metrics (the unmatched ones for a request no rule took).
    host: Option<Arc<HostMetrics>>,
    status: u16,
    bytes: u64,
    start: Instant,
    log: Option<Box<Fields>>,
    done: bool,
}

impl Completion {
    /// Starts the accounting of a request that arrived at `start`: counts it in flight and,
    /// with the access log on, notes its method and path for the log line.
    pub(crate) fn start(
        recorder: &Arc<Recorder>,
        parts: &http::request::Parts,
        start: Instant,
    ) -> Self {
        recorder.in_flight.inc();
        Self {
            recorder: recorder.clone(),
            bucket: None,
            host: None,
            status: 0,
            bytes: 0,
            start,
            log: recorder.access_log.as_ref().map(|_| {
                Box::new(Fields {
                    method: parts.method.to_string(),
                    host: String::new(),
                    path: parts.uri.path().to_owned(),
                    route: None,
                })
            }),
            done: false,
        }
    }

    /// The request's host, for the log line.
    pub(crate) fn log_host(&mut self, host: &str) {
        if let Some(log) = self.log.as_mut() {
            log.host = host.to_string();
        }
    }

    /// The matched rule's name, for the log line.
    pub(crate) fn log_route(&mut self, route: Option<&str>) {
        if let Some(log) = self.log.as_mut() {
            log.route = route.map(str::to_owned);
        }
    }

    /// A rule matched: the request counts under its hostname bucket's metrics.
    pub(crate) fn matched(&mut self, bucket: usize, host: Arc<HostMetrics>) {
        self.bucket = Some(bucket);
        self.host = Some(host);
    }

    /// The matched hostname bucket; `None` while no rule has matched.
    pub(crate) fn bucket(&self) -> Option<usize> {
        self.bucket
    }

    /// The response head is known; a request no rule took counts under `unmatched`.
    pub(crate) fn answered(&mut self, status: u16, unmatched: impl FnOnce() -> Arc<HostMetrics>) {
        self.status = status;
        if self.host.is_none() {
            self.host = Some(unmatched());
        }
    }

    /// A response body cut off at its deadline: the backend ran out its time, counted as the
    /// backend timeout it is, as when the time runs out before the head.
    pub(crate) fn backend_timed_out(&self) {
        if let Some(host) = &self.host {
            host.backend_error("timeout").inc();
        }
    }

    pub(crate) fn add_bytes(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    pub(crate) fn finish(mut self) {
        self.record(false);
    }

    pub(crate) fn abort(mut self) {
        self.record(true);
    }

    fn record(&mut self, aborted: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let elapsed = self.start.elapsed();
        self.recorder.in_flight.dec();
        if let Some(host) = self.host.take() {
            let class = match (aborted, self.status / 100) {
                (true, _) => StatusClass::Aborted,
                (_, 1) => StatusClass::S1xx,
                (_, 2) => StatusClass::S2xx,
                (_, 3) => StatusClass::S3xx,
                (_, 4) => StatusClass::S4xx,
                _ => StatusClass::S5xx,
            };
            host.duration.observe(elapsed.as_secs_f64());
            host.request(class).inc();
            host.response_bytes.inc_by(self.bytes);
        }
        if let (Some(log), Some(sink)) = (self.log.take(), &self.recorder.access_log) {
            sink.write(&log, self.status, self.bytes, elapsed, aborted);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.record(true);
    }
}
