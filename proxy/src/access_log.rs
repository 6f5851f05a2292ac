//! The opt-in JSON access log: one line per request on stdout, written by its own thread so a
//! slow terminal never blocks a request. Lines are dropped when the queue is full, of lines
//! ([`QUEUE`]) or of bytes ([`QUEUE_BYTES`]): counted in
//! `cftunnel_proxy_access_log_lines_dropped_total`, and the first drop is logged. The bytes
//! queued are shown in `cftunnel_proxy_access_log_queued_bytes`.
//!
//! The request's own text (method, host, path, query, user agent) is written up to
//! [`FIELD_MAX`] bytes each; a line that cut any says which in `truncated`. A client can send
//! tens of KiB of each, which would make a line (and the queue) that much larger.
//!
//! The lines still queued when the proxy goes away are written before it does, within
//! [`FLUSH_WAIT`]: those of the last requests of a drain, and those of requests cut off at its
//! end, whose lines are queued as the runtime drops them.
//!
//! With sampling (`1 in N`), one request in N is written whatever its outcome, and every
//! failure is written too: a 5xx, an answer the proxy gave itself because it could not serve
//! the request (no route, a backend that failed, a request it refused), and a response cut off
//! before its last byte. Fields are gathered for every request while the log is on, since a
//! failure is known only at the end; only the line's encoding and writing are sampled.

use opentelemetry::trace::{SpanId, TraceId};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::io::Write;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Lines queued at most.
const QUEUE: usize = 8192;

/// Bytes the queued lines may hold at most: 8192 lines of 512 bytes. Lines are a few hundred
/// bytes, so this binds only when many are long.
const QUEUE_BYTES: i64 = 4 << 20;

/// The most of a request's method, host, path, query or user agent a line (or a span) carries.
pub(crate) const FIELD_MAX: usize = 4096;

/// `text` cut to at most [`FIELD_MAX`] bytes, at a char boundary, and whether it was cut.
pub(crate) fn clip(text: &str) -> (&str, bool) {
    match text.get(..text.floor_char_boundary(FIELD_MAX)) {
        Some(kept) if kept.len() < text.len() => (kept, true),
        _ => (text, false),
    }
}

/// How long the lines still queued when the access log goes away get to be written.
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// What a request's line says beyond its status, size and duration; filled in as the
/// handler learns it.
#[derive(Debug)]
pub(crate) struct Fields {
    pub method: http::Method,
    pub host: String,
    /// The target as the client sent it.
    pub uri: http::Uri,
    pub route: Option<String>,
    pub user_agent: Option<http::HeaderValue>,
    /// The edge's request id (tunnel mode only).
    pub cf_ray: Option<http::HeaderValue>,
    /// The client's address: the edge's `Cf-Connecting-Ip` in tunnel mode, else the peer.
    pub client_ip: Option<IpAddr>,
    /// The backend of the last try, as its URL was written.
    pub backend: Option<Arc<str>>,
    pub tries: u32,
    /// From the first try sent to the answering response head (or the last failure).
    pub upstream: Option<Duration>,
    /// Why the proxy answered itself, when it did.
    pub error: Option<&'static str>,
    /// Written whatever the outcome (every request, or one in N).
    pub sampled: bool,
}

/// How a request ended, as its line reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    pub status: u16,
    pub bytes: u64,
    pub elapsed: Duration,
    pub aborted: bool,
    /// The request's trace and server span, when its trace is sampled.
    pub trace: Option<(TraceId, SpanId)>,
}

/// What the access log writes, beyond the fields every line has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLogOptions {
    /// Write the query string (it may carry tokens or personal data).
    pub query: bool,
    /// Write one line in this many (1: every request); failures always.
    pub sample_every: u32,
}

impl Default for AccessLogOptions {
    fn default() -> Self {
        Self {
            query: false,
            sample_every: 1,
        }
    }
}

#[derive(Debug)]
pub(crate) struct AccessLog {
    /// `None` only while the log is being dropped.
    tx: Option<mpsc::SyncSender<String>>,
    /// Disconnected once the writer has written everything queued and ended. In a mutex
    /// only to be shared: it is used once, by `drop`, which needs no lock.
    writer_done: std::sync::Mutex<mpsc::Receiver<()>>,
    /// Lines dropped because the queue was full.
    dropped: Counter,
    /// Bytes held by the lines queued (their strings' capacity), shared with the writer.
    queued: Gauge,
    options: AccessLogOptions,
    /// Requests seen, for one-in-N sampling; untouched when every request is written.
    seen: AtomicU64,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    /// When the request ended, RFC 3339 in UTC.
    time: &'a str,
    method: &'a str,
    host: &'a str,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<&'a str>,
    status: u16,
    bytes: u64,
    duration_ms: f64,
    route: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ip: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cf_ray: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<&'a str>,
    #[serde(skip_serializing_if = "is_zero")]
    tries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    span_id: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    aborted: bool,
    /// The fields cut to [`FIELD_MAX`] bytes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    truncated: Vec<&'static str>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn header(value: Option<&http::HeaderValue>) -> Option<&str> {
    value.and_then(|v| v.to_str().ok())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl AccessLog {
    /// Starts the thread that writes lines to stdout; lines that find its queue full are
    /// counted in `dropped`, and `queued` shows the bytes queued.
    pub(crate) fn spawn(options: AccessLogOptions, dropped: Counter, queued: Gauge) -> Self {
        Self::spawn_to(std::io::stdout(), options, dropped, queued)
    }

    /// As [`AccessLog::spawn`], writing to `out`. A thread, not a task: the lines queued as
    /// the runtime shuts down (by the requests it cuts off) are written after it is gone. If
    /// the thread cannot start, lines are counted as dropped.
    fn spawn_to(
        out: impl Write + Send + 'static,
        options: AccessLogOptions,
        dropped: Counter,
        queued: Gauge,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUE);
        let (done, writer_done) = mpsc::sync_channel::<()>(0);
        let written = queued.clone();
        let started = std::thread::Builder::new()
            .name("access-log".to_owned())
            .spawn(move || {
                let _done = done;
                write_lines(&rx, out, &written);
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "the access log's writer could not start: no lines are written");
        }
        Self {
            tx: Some(tx),
            writer_done: std::sync::Mutex::new(writer_done),
            dropped,
            queued,
            options,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the request now starting is one whose line is written whatever its outcome.
    pub(crate) fn sample(&self) -> bool {
        let every = u64::from(self.options.sample_every);
        every <= 1
            || self
                .seen
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every)
    }

    /// Writes the line of a request that ended as `outcome`, if it was sampled or failed.
    pub(crate) fn write(&self, f: &Fields, outcome: Outcome) {
        let failed = outcome.status >= 500 || f.error.is_some() || outcome.aborted;
        if !(f.sampled || failed) {
            return;
        }
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut truncated = Vec::new();
        let mut clipped = |name, text| {
            let (kept, cut) = clip(text);
            if cut {
                truncated.push(name);
            }
            kept
        };
        let method = clipped("method", f.method.as_str());
        let host = clipped("host", &f.host);
        let path = clipped("path", f.uri.path());
        let query = f
            .uri
            .query()
            .filter(|_| self.options.query)
            .map(|q| clipped("query", q));
        let user_agent = header(f.user_agent.as_ref()).map(|ua| clipped("user_agent", ua));
        let line = Line {
            time: &now,
            method,
            host,
            path,
            query,
            status: outcome.status,
            bytes: outcome.bytes,
            duration_ms: millis(outcome.elapsed),
            route: f.route.as_deref(),
            client_ip: f.client_ip,
            user_agent,
            cf_ray: header(f.cf_ray.as_ref()),
            backend: f.backend.as_deref(),
            tries: f.tries,
            upstream_ms: f.upstream.map(millis),
            error: f.error,
            trace_id: outcome.trace.map(|(t, _)| t.to_string()),
            span_id: outcome.trace.map(|(_, s)| s.to_string()),
            aborted: outcome.aborted,
            truncated,
        };
        let Ok(mut text) = serde_json::to_string(&line) else {
            return;
        };
        text.push('\n');
        if !self.enqueue(text) && self.dropped.inc() == 0 {
            tracing::warn!(
                queue = QUEUE,
                queue_bytes = QUEUE_BYTES,
                "access log lines are being dropped: its output is slower than requests \
                 (counted in cftunnel_proxy_access_log_lines_dropped_total)"
            );
        }
    }

    /// Queues `line` if the queue has room for it, in lines and in bytes.
    fn enqueue(&self, line: String) -> bool {
        let Some(tx) = &self.tx else {
            return false;
        };
        let size = i64::try_from(line.capacity()).unwrap_or(i64::MAX);
        // Counted before it is sent, so the writer never discounts a line not yet counted.
        let before = self.queued.inc_by(size);
        if before.saturating_add(size) <= QUEUE_BYTES && tx.try_send(line).is_ok() {
            return true;
        }
        self.queued.dec_by(size);
        false
    }
}

/// Writes the queued lines to `out` until every sender is gone, flushing whenever the queue
/// runs empty, and takes each line off `queued` once written; ends early if `out` fails.
fn write_lines(rx: &mpsc::Receiver<String>, out: impl Write, queued: &Gauge) {
    let taken = |line: &String| {
        queued.dec_by(i64::try_from(line.capacity()).unwrap_or(i64::MAX));
    };
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    while let Ok(first) = rx.recv() {
        for line in std::iter::once(first).chain(rx.try_iter()) {
            let written = out.write_all(line.as_bytes());
            taken(&line);
            if written.is_err() {
                // What is still queued goes with the queue: off the count too.
                rx.try_iter().for_each(|line| taken(&line));
                return;
            }
        }
        if out.flush().is_err() {
            rx.try_iter().for_each(|line| taken(&line));
            return;
        }
    }
}

/// The last handle going away (the proxy's end) closes the queue and waits, up to
/// [`FLUSH_WAIT`], for the writer to write what is in it. This blocks: it happens once, as
/// the proxy or its runtime shuts down.
impl Drop for AccessLog {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Ok(writer_done) = self.writer_done.get_mut() {
            let _ = writer_done.recv_timeout(FLUSH_WAIT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// An output that holds its first write until told to go on, and keeps what it is given.
    struct Gated {
        started: Option<mpsc::Sender<()>>,
        go: mpsc::Receiver<()>,
        kept: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(started) = self.started.take() {
                let _ = started.send(());
                let _ = self.go.recv();
            }
            self.kept.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn fields() -> Fields {
        Fields {
            method: http::Method::GET,
            host: "h".to_owned(),
            uri: http::Uri::from_static("/"),
            route: None,
            user_agent: None,
            cf_ray: None,
            client_ip: None,
            backend: None,
            tries: 1,
            upstream: None,
            error: None,
            sampled: true,
        }
    }

    const OUTCOME: Outcome = Outcome {
        status: 200,
        bytes: 0,
        elapsed: Duration::ZERO,
        aborted: false,
        trace: None,
    };

    /// Lines that find the queue full are counted, not waited for; the lines queued when the
    /// log goes away are all written before it is gone.
    #[test]
    fn lines_that_find_the_queue_full_are_counted_and_queued_ones_written_at_the_end() {
        let dropped = Counter::default();
        let (started, started_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let kept = Arc::new(Mutex::new(Vec::new()));
        let out = Gated {
            started: Some(started),
            go: go_rx,
            kept: kept.clone(),
        };
        let log = AccessLog::spawn_to(
            out,
            AccessLogOptions::default(),
            dropped.clone(),
            Gauge::default(),
        );
        // The writer takes the first line and is held writing it: the queue then takes
        // `QUEUE` lines and drops the rest.
        log.write(&fields(), OUTCOME);
        started_rx.recv().expect("the writer writes the first line");
        for _ in 0..QUEUE + 7 {
            log.write(&fields(), OUTCOME);
        }
        assert_eq!(dropped.get(), 7);
        go.send(()).expect("the writer waits");
        drop(log);
        let kept = kept.lock().expect("lock");
        assert_eq!(kept.iter().filter(|&&b| b == b'\n').count(), QUEUE + 1);
    }

    /// Long lines fill the queue's bytes before its line count: those beyond are counted as
    /// dropped, the bytes queued never pass the budget, and every line queued is written.
    #[test]
    fn lines_beyond_the_queues_bytes_are_counted_and_long_fields_cut() {
        let dropped = Counter::default();
        let queued = Gauge::default();
        let (started, started_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let kept = Arc::new(Mutex::new(Vec::new()));
        let out = Gated {
            started: Some(started),
            go: go_rx,
            kept: kept.clone(),
        };
        let log = AccessLog::spawn_to(
            out,
            AccessLogOptions {
                query: true,
                sample_every: 1,
            },
            dropped.clone(),
            queued.clone(),
        );
        let long = Fields {
            host: "h".repeat(FIELD_MAX + 1),
            uri: format!("/{}?{}", "p".repeat(30_000), "q".repeat(30_000))
                .parse()
                .expect("uri"),
            user_agent: Some(http::HeaderValue::from_str(&"\"".repeat(30_000)).expect("ua")),
            ..fields()
        };
        log.write(&long, OUTCOME);
        started_rx.recv().expect("the writer writes the first line");
        let sent = 2000;
        for _ in 0..sent {
            log.write(&long, OUTCOME);
            assert!(queued.get() <= QUEUE_BYTES, "{}", queued.get());
        }
        assert!(dropped.get() > 0, "some lines find the bytes full");
        go.send(()).expect("the writer waits");
        drop(log);
        assert_eq!(queued.get(), 0, "every line queued was written");
        let kept = kept.lock().expect("lock");
        let text = String::from_utf8_lossy(&kept);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64 + dropped.get(), sent + 1);
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("JSON");
        assert_eq!(line["host"].as_str().map(str::len), Some(FIELD_MAX));
        assert_eq!(line["path"].as_str().map(str::len), Some(FIELD_MAX));
        assert_eq!(line["query"].as_str().map(str::len), Some(FIELD_MAX));
        assert_eq!(line["user_agent"].as_str().map(str::len), Some(FIELD_MAX));
        assert_eq!(
            line["truncated"],
            serde_json::json!(["host", "path", "query", "user_agent"])
        );
    }

    #[test]
    fn text_is_cut_at_a_char_boundary() {
        assert_eq!(clip("short"), ("short", false));
        let exact = "a".repeat(FIELD_MAX);
        assert_eq!(clip(&exact), (exact.as_str(), false));
        // A two-byte char straddling the bound is left out whole.
        let straddling = format!("{}é", "a".repeat(FIELD_MAX - 1));
        assert_eq!(clip(&straddling), (&straddling[..FIELD_MAX - 1], true));
    }
}
