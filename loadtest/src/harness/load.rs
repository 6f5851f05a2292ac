//! The closed-loop load generator: N keep-alive HTTP/1.1 connections, each sending the next
//! request as soon as the previous response body has been read, for a fixed duration.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::stats::{latency_histogram, record_latency, LoadSummary};

/// A connect or a request taking longer than this counts as an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed connect, so a dead target does not spin the loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);
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
    /// Concurrent keep-alive connections (one request in flight on each).
    pub connections: usize,
    /// Requests before the measurement window; not recorded.
    pub warmup: Duration,
    /// Length of the measurement window.
    pub duration: Duration,
}

struct ConnectionResult {
    latencies: Histogram<u64>,
    errors: u64,
}

/// Runs the load and returns the merged result of all connections. Requests that start
/// inside the measurement window are counted; requests still in flight at its end finish
/// (bounded by the request timeout) but the rate is computed over the window length.
pub async fn run(spec: &LoadSpec) -> LoadSummary {
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..spec.connections.max(1) {
        let spec = spec.clone();
        tasks.spawn(async move { drive_connection(&spec, measure_from, end).await });
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

async fn connect(target: SocketAddr) -> Option<SendRequest<Empty<Bytes>>> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .ok()?
        .ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(sender)
}

async fn drive_connection(
    spec: &LoadSpec,
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
        let started = Instant::now();
        if started >= end {
            break;
        }
        let measuring = started >= measure_from;
        let mut conn = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => match connect(spec.target).await {
                Some(s) => s,
                None => {
                    if measuring {
                        result.errors += 1;
                    }
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let mut req = Request::new(Empty::new());
        *req.uri_mut() = uri.clone();
        req.headers_mut().insert(http::header::HOST, host.clone());
        let sent = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            conn.ready().await.ok()?;
            let resp = conn.send_request(req).await.ok()?;
            let status = resp.status();
            resp.into_body().collect().await.ok()?;
            Some(status)
        })
        .await;
        let latency = sent.elapsed();
        match outcome {
            Ok(Some(status)) => {
                if measuring {
                    if status.is_success() {
                        record_latency(&mut result.latencies, latency);
                    } else {
                        result.errors += 1;
                    }
                }
                // A connection the server closed is noticed by `is_closed` on the next turn.
                sender = Some(conn);
            }
            _ => {
                if measuring {
                    result.errors += 1;
                }
            }
        }
    }
    result
}
