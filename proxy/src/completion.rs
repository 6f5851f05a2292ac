//! Completion accounting: what a request records once, when its response ends or is dropped.
//!
//! The in-flight gauge, the hostname's duration, status-class and response-byte series, the
//! access-log line and the request's spans are all written here, so a request is counted
//! exactly once however it ends: body read through, cut off by a deadline, or dropped by a
//! client that went away. The handler starts a [`Completion`] when a request arrives and fills
//! in what it learns; the response body carries it to the end.
//!
//! The access log and tracing are each decided once, in [`Completion::start`]: off, the
//! completion holds `None` for them and every later step is a branch on that `None`.

use crate::access_log::{AccessLog, Fields, Outcome};
use crate::conn::ConnInfo;
use crate::forward::retry::Tries;
use crate::metrics::{HostMetrics, StatusClass};
use crate::trace::{RequestTrace, RequestTracer};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use tokio::time::Instant;

/// Parsed once: a `&str` key is re-validated as a header name on every lookup.
static CF_RAY: http::HeaderName = http::HeaderName::from_static("cf-ray");

/// What every request's completion is recorded into; one per proxy, shared by its requests.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Requests being served now: raised when a completion starts, lowered when it is recorded.
    in_flight: Gauge,
    access_log: Option<AccessLog>,
    /// Present exactly when tracing is on.
    tracer: Option<RequestTracer>,
}

impl Recorder {
    pub(crate) fn new(
        in_flight: Gauge,
        access_log: Option<AccessLog>,
        tracer: Option<RequestTracer>,
    ) -> Self {
        Self {
            in_flight,
            access_log,
            tracer,
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
    /// The status the client got, as the log line and the span report it.
    status: u16,
    /// The status the request counts as in the metrics: the one its failure has over HTTP
    /// for a gRPC answer the proxy gave itself (sent as 200 with a `grpc-status`).
    counted: u16,
    bytes: u64,
    start: Instant,
    log: Option<Box<Fields>>,
    trace: Option<Box<RequestTrace>>,
    done: bool,
}

impl Completion {
    /// Starts the accounting of a request that arrived at `start` over `conn`: counts it in
    /// flight, notes what its log line needs when the access log is on, and starts its server
    /// span when tracing is.
    pub(crate) fn start(
        recorder: &Arc<Recorder>,
        parts: &http::request::Parts,
        conn: &ConnInfo,
        start: Instant,
    ) -> Self {
        recorder.in_flight.inc();
        Self {
            recorder: recorder.clone(),
            bucket: None,
            host: None,
            status: 0,
            counted: 0,
            bytes: 0,
            start,
            log: recorder.access_log.as_ref().map(|log| {
                Box::new(Fields {
                    method: parts.method.clone(),
                    host: String::new(),
                    uri: parts.uri.clone(),
                    route: None,
                    user_agent: parts.headers.get(http::header::USER_AGENT).cloned(),
                    // The edge's id; on the proxy's own listener a client could send anything.
                    cf_ray: conn
                        .trusted_forwarding
                        .then(|| parts.headers.get(&CF_RAY).cloned())
                        .flatten(),
                    client_ip: conn.peer.map(|p| p.ip()),
                    backend: None,
                    tries: 0,
                    upstream: None,
                    error: None,
                    sampled: log.sample(),
                })
            }),
            trace: recorder.tracer.as_ref().map(|t| t.start(parts, conn)),
            done: false,
        }
    }

    /// The request's host, for the log line and the span.
    pub(crate) fn log_host(&mut self, host: &str) {
        if let Some(log) = self.log.as_mut() {
            log.host = host.to_string();
        }
        if let Some(trace) = self.trace.as_mut() {
            trace.host(host);
        }
    }

    /// The matched rule's name and hostname pattern, for the log line and the span.
    pub(crate) fn log_route(&mut self, route: Option<&str>, hostname: &str) {
        if let Some(log) = self.log.as_mut() {
            log.route = route.map(str::to_owned);
        }
        if let Some(trace) = self.trace.as_mut() {
            trace.matched(route, hostname);
        }
    }

    /// When the request arrived, which its rule's request timeout counts from.
    pub(crate) fn started(&self) -> Instant {
        self.start
    }

    /// Whether the access log is on (and the exchange's timing is wanted).
    pub(crate) fn logging(&self) -> bool {
        self.log.is_some()
    }

    /// The tries sent to backends, and when the first left, for the log line.
    pub(crate) fn log_tries(&mut self, tries: &Tries<'_>, sent: Option<Instant>) {
        if let Some(log) = self.log.as_mut() {
            log.tries = tries.count;
            log.backend = tries.last.map(|u| u.name().url.clone());
            log.upstream = sent.map(|at| at.elapsed());
        }
    }

    /// The proxy answers the request itself because it could not serve it, for `reason`.
    pub(crate) fn failed(&mut self, reason: &'static str) {
        if let Some(log) = self.log.as_mut() {
            log.error = Some(reason);
        }
        if let Some(trace) = self.trace.as_mut() {
            trace.failed(reason);
        }
    }

    /// The request's spans, when it is traced.
    pub(crate) fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_deref()
    }

    pub(crate) fn trace_mut(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_deref_mut()
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
    pub(crate) fn answered(
        &mut self,
        status: u16,
        counted: u16,
        unmatched: impl FnOnce() -> Arc<HostMetrics>,
    ) {
        self.status = status;
        self.counted = counted;
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
            let class = match (aborted, self.counted / 100) {
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
        let trace = self.trace.take();
        if let (Some(log), Some(sink)) = (self.log.take(), &self.recorder.access_log) {
            sink.write(
                &log,
                Outcome {
                    status: self.status,
                    bytes: self.bytes,
                    elapsed,
                    aborted,
                    trace: trace.as_ref().and_then(|t| t.ids()),
                },
            );
        }
        if let Some(trace) = trace {
            trace.end(self.status, self.counted, aborted);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.record(true);
    }
}
