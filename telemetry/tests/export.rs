//! The exporter against collectors on 127.0.0.1: which headers an export carries, and that a
//! collector that never answers the connection does not hold the exporter.
//!
//! The header tests need `OTEL_EXPORTER_OTLP_*HEADERS` in the environment of the exporting
//! process: each runs an ignored test of this binary in a child process with them set.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_telemetry::{TraceArgs, Traces};
use clap::Parser;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry::trace::Tracer as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    traces: TraceArgs,
}

/// The variables the header flags replace; the exporter must not bring them back.
const ENVIRONMENT: [(&str, &str); 2] = [
    (
        "OTEL_EXPORTER_OTLP_HEADERS",
        "api-key=from-env,x-env-only=1",
    ),
    (
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "api-key=from-traces-env,x-env-only=2",
    ),
];

/// Runs the ignored test `name` of this binary in a child process with [`ENVIRONMENT`] set.
fn run_with_the_variables(name: &str) {
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--ignored", "--nocapture"])
        .envs(ENVIRONMENT)
        .output()
        .expect("the test binary runs");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name}:\n{output}");
    assert!(output.contains("1 passed"), "{name} did not run:\n{output}");
}

/// An OTLP receiver (HTTP/1.1 and h2c gRPC on one port) that keeps each export's headers and
/// answers it with an empty `ExportTraceServiceResponse`.
struct Receiver {
    addr: SocketAddr,
    requests: mpsc::UnboundedReceiver<(String, HeaderMap)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn answer(path: &str) -> Response<Body> {
    if path.ends_with("/Export") {
        // One empty message, then grpc-status 0 in the trailers.
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]))
            .with_trailers(async move { Some(Ok(trailers)) })
            .boxed();
        let mut res = Response::new(body);
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        res
    } else {
        let mut res = Response::new(Full::new(Bytes::new()).boxed());
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        res
    }
}

impl Receiver {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (seen, requests) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let (parts, body) = req.into_parts();
                            let _ = body.collect().await;
                            let _ = seen.send((path.clone(), parts.headers));
                            Ok::<_, Infallible>(answer(&path))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }

    /// The exports received so far: their paths and headers.
    fn requests(&mut self) -> Vec<(String, HeaderMap)> {
        let mut requests = Vec::new();
        while let Ok(request) = self.requests.try_recv() {
            requests.push(request);
        }
        requests
    }
}

/// Exports one span over `protocol` with the header flags set, and returns the headers of the
/// export the receiver got.
async fn exported_headers(protocol: &str) -> HeaderMap {
    let mut receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let settings = Cli::try_parse_from([
        "prog",
        "--otel-endpoint",
        &endpoint,
        "--otel-protocol",
        protocol,
        // `%2525` is `%25` once decoded, as it must be sent.
        "--otel-headers",
        "api-key=from-flag,x-pct=100%2525",
        "--otel-traces-headers",
        "tenant=t1",
    ])
    .expect("flags parse")
    .traces
    .settings("cftunnel-test")
    .expect("valid settings")
    .expect("tracing on");
    let traces = Traces::start(&settings).expect("exporter starts");
    drop(traces.tracer("test").start("op"));
    assert!(traces.shutdown(Duration::from_secs(5)).await, "exported");
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.into_iter().next().expect("one export").1
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("text"))
        .collect()
}

fn assert_the_settings_headers(headers: &HeaderMap) {
    assert_eq!(values(headers, "api-key"), ["from-flag"], "{headers:?}");
    assert_eq!(values(headers, "x-pct"), ["100%25"], "{headers:?}");
    assert_eq!(values(headers, "tenant"), ["t1"], "{headers:?}");
    assert!(values(headers, "x-env-only").is_empty(), "{headers:?}");
}

#[test]
fn an_http_export_carries_the_flags_headers_not_the_variables() {
    run_with_the_variables("http_export_with_the_header_variables_set");
}

#[test]
fn a_grpc_export_carries_the_flags_headers_not_the_variables() {
    run_with_the_variables("grpc_export_with_the_header_variables_set");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run with the header variables set, by an_http_export_carries_the_flags_headers_not_the_variables"]
async fn http_export_with_the_header_variables_set() {
    assert_eq!(
        std::env::var(ENVIRONMENT[0].0).as_deref(),
        Ok(ENVIRONMENT[0].1)
    );
    let headers = exported_headers("http/protobuf").await;
    assert_the_settings_headers(&headers);
    assert_eq!(values(&headers, "content-type"), ["application/x-protobuf"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run with the header variables set, by a_grpc_export_carries_the_flags_headers_not_the_variables"]
async fn grpc_export_with_the_header_variables_set() {
    assert_eq!(
        std::env::var(ENVIRONMENT[0].0).as_deref(),
        Ok(ENVIRONMENT[0].1)
    );
    let headers = exported_headers("grpc").await;
    assert_the_settings_headers(&headers);
    assert_eq!(values(&headers, "content-type"), ["application/grpc"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_the_handshake_does_not_hold_the_exporter() {
    // Accepts connections and keeps them open without a byte: a TLS handshake never ends.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (accepted, mut connections) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
            let _ = accepted.send(Instant::now());
        }
    });
    let endpoint = format!("https://{addr}");
    let settings = Cli::try_parse_from([
        "prog",
        "--otel-traces-endpoint",
        &endpoint,
        "--otel-protocol",
        "grpc",
        "--otel-timeout",
        "200",
        "--otel-bsp-schedule-delay",
        "50",
    ])
    .expect("flags parse")
    .traces
    .settings("cftunnel-test")
    .expect("valid settings")
    .expect("tracing on");
    let traces = Traces::start(&settings).expect("exporter starts");
    let tracer = traces.tracer("test");
    // A span now and then, so each batch has one to export.
    let spans = tokio::spawn(async move {
        loop {
            drop(tracer.start("op"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(5), connections.recv())
        .await
        .expect("the exporter connects")
        .expect("listening");
    // The first export gives up on its handshake after the timeout, the next connects anew.
    let second = tokio::time::timeout(Duration::from_secs(3), connections.recv())
        .await
        .expect("the exporter gave up the silent connection and connected again")
        .expect("listening");
    assert!(
        second - first < Duration::from_secs(2),
        "{:?} between connections",
        second - first
    );
    spans.abort();
    task.abort();
    let _ = traces.shutdown(Duration::from_secs(1)).await;
}
