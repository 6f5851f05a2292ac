//! The closed-loop load generator: N keep-alive HTTP/1.1 connections, each sending the next
//! request as soon as the previous response body has been read, for a fixed duration.
//! With a rate, each connection also waits for its turn in a fixed schedule, so scenarios
//! can be compared at the same offered load.
//!
//! The schedule is kept by a thread of its own, not by tokio's timers: those have millisecond
//! resolution, so connections paced by them leave together on millisecond ticks (two at a
//! time at 2,000 req/s over 32 connections), and requests that leave together queue behind
//! each other in the server and make a QUIC peer acknowledge them with a packet of its own.
//! A sleeping thread releases each send within tens of microseconds of its slot.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::stats::{latency_histogram, record_latency, LoadSummary};

/// A connect or a request taking longer than this counts as an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed connect, so a dead target does not spin the loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);
/// Shorter pacing intervals than this are treated as unpaced (timer resolution).
const MIN_PACING_INTERVAL: Duration = Duration::from_micros(10);
/// Hard cap on requests per connection, a second bound next to the deadline.
const MAX_REQUESTS_PER_CONNECTION: u64 = 100_000_000;

/// What to send, where, and for how long.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub target: SocketAddr,
    /// `Host` header of every request.
    pub host: String,
    /// Request target, e.g. `/loadtest`.
    pub path: String,
    /// Sent with every request after `Host` (see [`super::scenario::Scenario::edge_headers`]).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Concurrent keep-alive connections (one request in flight on each).
    pub connections: usize,
    /// Requests before the measurement window; not recorded.
    pub warmup: Duration,
    /// Length of the measurement window.
    pub duration: Duration,
    /// Total requests per second to offer, spread evenly over the connections; `None`:
    /// unpaced closed loop. A connection whose answers come slower than its share sends the
    /// next request at once and does not catch up later.
    pub rate: Option<f64>,
    /// Hand requests to this in-process mock edge instead of connecting to `target`.
    pub edge: Option<super::scenario::InProcessEdge>,
    /// Answers received so far, warm-up included, for the live rate on the progress line.
    pub answered: Arc<AtomicU64>,
}

/// Time between two requests on one connection when `rate` requests per second are spread
/// over `connections`; `None` for no pacing (no rate, or a rate that is zero, negative, not
/// finite, or too high to pace).
pub fn pacing_interval(rate: Option<f64>, connections: usize) -> Option<Duration> {
    let rate = rate.filter(|r| r.is_finite() && *r > 0.0)?;
    let secs = connections.max(1) as f64 / rate;
    let interval = Duration::try_from_secs_f64(secs).ok()?;
    (interval >= MIN_PACING_INTERVAL).then_some(interval)
}

/// When connection `index` of `connections` sends its first request, after the run starts:
/// the connections' schedules are staggered evenly over one interval.
pub fn first_send_offset(index: usize, connections: usize, interval: Duration) -> Duration {
    let n = u32::try_from(connections.max(1)).unwrap_or(u32::MAX);
    let i = u32::try_from(index).unwrap_or(u32::MAX).min(n - 1);
    interval / n * i
}

struct ConnectionResult {
    latencies: Histogram<u64>,
    errors: u64,
}

impl ConnectionResult {
    /// Counts one request inside the measurement window: a 2xx answer's latency, or an error
    /// (no answer, or another status).
    fn record(&mut self, measuring: bool, answer: Option<http::StatusCode>, latency: Duration) {
        if !measuring {
            return;
        }
        match answer {
            Some(status) if status.is_success() => record_latency(&mut self.latencies, latency),
            _ => self.errors += 1,
        }
    }
}

/// Runs the load and returns the merged result of all connections. Requests that start
/// inside the measurement window are counted; requests still in flight at its end finish
/// (bounded by the request timeout) but the rate is computed over the window length.
pub async fn run(spec: &LoadSpec) -> LoadSummary {
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let connections = spec.connections.max(1);
    let gates: Option<Vec<Arc<Notify>>> = pacing_interval(spec.rate, spec.connections).map(|iv| {
        let gates: Vec<_> = (0..connections).map(|_| Arc::new(Notify::new())).collect();
        start_pacer(start, end, iv, gates.clone());
        gates
    });
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..connections {
        let spec = spec.clone();
        let gate = gates.as_ref().and_then(|g| g.get(index).cloned());
        tasks.spawn(async move { drive_connection(&spec, gate, measure_from, end).await });
    }
    let mut latencies = latency_histogram();
    let mut errors = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(result) => {
                let _ = latencies.add(&result.latencies);
                errors += result.errors;
            }
            // A connection task that panicked is a generator bug; count it, keep the rest.
            Err(_) => errors += 1,
        }
    }
    LoadSummary::from_histogram(&latencies, errors, spec.duration)
}

/// One load request: `GET uri` with `Host` and the spec's headers. Every value is a
/// reference-counted clone.
fn request(
    uri: &http::Uri,
    host: &HeaderValue,
    headers: &[(HeaderName, HeaderValue)],
) -> Request<Empty<Bytes>> {
    let mut req = Request::new(Empty::<Bytes>::new());
    *req.uri_mut() = uri.clone();
    let map = req.headers_mut();
    map.reserve(1 + headers.len());
    map.insert(http::header::HOST, host.clone());
    for (name, value) in headers {
        map.append(name.clone(), value.clone());
    }
    req
}

/// Sends one request as the load does (through the in-process edge, or on a new
/// connection to the target) and returns the answer's status and body.
pub async fn send_one(spec: &LoadSpec) -> Result<(StatusCode, Bytes), String> {
    let uri = spec
        .path
        .parse::<http::Uri>()
        .map_err(|e| format!("path: {e}"))?;
    let host = HeaderValue::from_str(&spec.host).map_err(|e| format!("host: {e}"))?;
    let req = request(&uri, &host, &spec.headers);
    let exchange = async {
        if let Some(edge) = &spec.edge {
            return read_answer(edge.0.request(req).await).await;
        }
        let mut conn = connect(spec.target)
            .await
            .map_err(|e| format!("connecting to {}: {e}", spec.target))?;
        read_answer(conn.send_request(req).await.map_err(|e| e.to_string())?).await
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| "timed out".to_owned())?
}

/// An answer's status and whole body.
async fn read_answer<B>(resp: http::Response<B>) -> Result<(StatusCode, Bytes), String>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}

/// A new keep-alive HTTP/1.1 connection to `target`, or why there is none.
async fn connect(target: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Every send slot from `start` to `end`, in time order: `(instant, connection)`.
fn send_slots(
    start: std::time::Instant,
    end: std::time::Instant,
    interval: Duration,
    connections: usize,
) -> impl Iterator<Item = (std::time::Instant, usize)> {
    (0u32..)
        .map_while(move |round| start.checked_add(interval.checked_mul(round)?))
        .take_while(move |round_start| *round_start < end)
        .flat_map(move |round_start| {
            (0..connections).filter_map(move |i| {
                let offset = first_send_offset(i, connections, interval);
                Some((round_start.checked_add(offset)?, i))
            })
        })
        .filter(move |(at, _)| *at < end)
}

/// Starts the thread that opens connection `i`'s gate at `start + first_send_offset(i) + k *
/// interval` for every round `k` until `end`. A connection still busy at its slot finds its
/// gate open when it is done and sends at once; it does not catch up on slots it missed. If
/// no thread can be started, a tokio task opens the gates, at timer resolution.
fn start_pacer(start: Instant, end: Instant, interval: Duration, gates: Vec<Arc<Notify>>) {
    let (start, end) = (start.into_std(), end.into_std());
    let n = gates.len();
    let slots = move || send_slots(start, end, interval, n);
    let thread_gates = gates.clone();
    let spawned = std::thread::Builder::new()
        .name("load-pacer".to_owned())
        .spawn(move || {
            for (at, i) in slots() {
                let now = std::time::Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if let Some(gate) = thread_gates.get(i) {
                    gate.notify_one();
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("no pacing thread ({e}); pacing at timer resolution");
        tokio::spawn(async move {
            for (at, i) in slots() {
                tokio::time::sleep_until(Instant::from_std(at)).await;
                if let Some(gate) = gates.get(i) {
                    gate.notify_one();
                }
            }
        });
    }
}

async fn drive_connection(
    spec: &LoadSpec,
    gate: Option<Arc<Notify>>,
    measure_from: Instant,
    end: Instant,
) -> ConnectionResult {
    let mut result = ConnectionResult {
        latencies: latency_histogram(),
        errors: 0,
    };
    // Parsed once: the generator shares its CPU with the origin, so per-request work is kept
    // to cloning these (reference-counted) values.
    let (Ok(uri), Ok(host)) = (
        spec.path.parse::<http::Uri>(),
        http::HeaderValue::from_str(&spec.host),
    ) else {
        result.errors += 1;
        return result;
    };
    let mut sender: Option<SendRequest<Empty<Bytes>>> = None;
    for _ in 0..MAX_REQUESTS_PER_CONNECTION {
        if let Some(gate) = &gate {
            tokio::select! {
                () = gate.notified() => {}
                () = tokio::time::sleep_until(end) => break,
            }
        }
        let started = Instant::now();
        if started >= end {
            break;
        }
        let measuring = started >= measure_from;
        let req = request(&uri, &host, &spec.headers);
        if let Some(edge) = &spec.edge {
            let sent = Instant::now();
            let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let resp = edge.0.request(req).await;
                let status = resp.status();
                resp.into_body().collect().await.ok()?;
                Some(status)
            })
            .await;
            let outcome = outcome.ok().flatten();
            result.record(measuring, outcome, sent.elapsed());
            if outcome.is_some() {
                spec.answered.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let mut conn = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => match connect(spec.target).await {
                Ok(s) => s,
                Err(_) => {
                    result.record(measuring, None, Duration::ZERO);
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let sent = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            conn.ready().await.ok()?;
            let resp = conn.send_request(req).await.ok()?;
            let status = resp.status();
            resp.into_body().collect().await.ok()?;
            Some(status)
        })
        .await
        .ok()
        .flatten();
        result.record(measuring, outcome, sent.elapsed());
        if outcome.is_some() {
            spec.answered.fetch_add(1, Ordering::Relaxed);
            // A connection the server closed is noticed by `is_closed` on the next turn.
            sender = Some(conn);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_spreads_the_rate_over_the_connections() {
        assert_eq!(
            pacing_interval(Some(10_000.0), 32),
            Some(Duration::from_micros(3200))
        );
        assert_eq!(
            pacing_interval(Some(4.0), 1),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            pacing_interval(Some(100.0), 0),
            pacing_interval(Some(100.0), 1)
        );
    }

    #[test]
    fn no_or_unusable_rates_mean_no_pacing() {
        assert_eq!(pacing_interval(None, 32), None);
        assert_eq!(pacing_interval(Some(0.0), 32), None);
        assert_eq!(pacing_interval(Some(-5.0), 32), None);
        assert_eq!(pacing_interval(Some(f64::NAN), 32), None);
        assert_eq!(pacing_interval(Some(f64::INFINITY), 32), None);
        assert_eq!(pacing_interval(Some(1e9), 1), None, "faster than the timer");
        assert_eq!(
            pacing_interval(Some(1e-300), 1),
            None,
            "longer than a Duration"
        );
    }

    #[test]
    fn slots_interleave_the_connections_evenly_until_the_end() {
        let start = std::time::Instant::now();
        let ms = Duration::from_millis;
        let slots: Vec<(Duration, usize)> = send_slots(start, start + ms(10), ms(4), 4)
            .map(|(at, i)| (at - start, i))
            .collect();
        let expected: Vec<(Duration, usize)> =
            (0..10u64).map(|k| (ms(k), (k % 4) as usize)).collect();
        assert_eq!(
            slots, expected,
            "one slot per millisecond, round robin, none at or after the end"
        );
    }

    #[tokio::test]
    async fn the_pacer_opens_every_gate() {
        let gates: Vec<_> = (0..3).map(|_| Arc::new(Notify::new())).collect();
        let start = Instant::now();
        start_pacer(
            start,
            start + Duration::from_millis(30),
            Duration::from_millis(10),
            gates.clone(),
        );
        for gate in &gates {
            tokio::time::timeout(Duration::from_secs(5), gate.notified())
                .await
                .expect("the gate opens");
        }
    }

    #[test]
    fn first_sends_are_staggered_over_one_interval() {
        let iv = Duration::from_millis(4);
        let offsets: Vec<Duration> = (0..4).map(|i| first_send_offset(i, 4, iv)).collect();
        assert_eq!(
            offsets,
            [0, 1, 2, 3].map(Duration::from_millis),
            "even spacing"
        );
        assert!(
            first_send_offset(99, 4, iv) < iv,
            "clamped to the last slot"
        );
        assert_eq!(first_send_offset(0, 0, iv), Duration::ZERO);
    }
}
