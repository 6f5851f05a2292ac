//! What a request's server span says of how it ended: a gRPC call the proxy answered itself
//! with a failure is an error though sent as a 200, a request cut at the end of a drain is
//! exported as cut off, and a caller's `tracestate` is kept only as far as W3C Trace Context
//! asks.

use crate::support::*;
use bytes::Bytes;
use cftunnel_proxy::trace::RequestTracer;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_telemetry::{TraceArgs, Traces};
use cftunnel_testkit::otlp::{OtlpReceiver, RecordedSpan, SpanKind, SpanStatus};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use std::time::Duration;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// How long a test waits for spans to reach the receiver (they are exported every 50 ms).
const SPANS_WAIT: Duration = Duration::from_secs(10);

/// A proxy exporting its spans to `receiver` every 50 ms, with the exporter that serves it.
async fn traced_proxy(receiver: &OtlpReceiver) -> (Server, Traces) {
    let args = TraceArgs {
        endpoint: Some(receiver.endpoint()),
        schedule_delay: Some("50".into()),
        timeout: Some("2000".into()),
        ..TraceArgs::default()
    };
    let settings = args
        .settings("cftunnel-proxy")
        .expect("valid trace settings")
        .expect("tracing on");
    let traces = Traces::start(&settings).expect("the exporter starts");
    let proxy = proxy_with(ServerOptions {
        auth_token: Some(TOKEN.into()),
        tracer: Some(RequestTracer::new(traces.tracer("cftunnel-proxy"))),
        ..ServerOptions::default()
    })
    .await;
    (proxy, traces)
}

fn server_spans(spans: &[RecordedSpan]) -> Vec<&RecordedSpan> {
    spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server)
        .collect()
}

/// A gRPC call whose backend cannot be dialled is answered `UNAVAILABLE` in a 200, and
/// counted as the 502 it stands for: its server span is an error, with the 200 it was sent.
#[tokio::test]
async fn a_grpc_call_the_proxy_answers_with_a_failure_is_an_error_span() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let (proxy, traces) = traced_proxy(&receiver).await;
        let http = client();
        let (closed, _held) = dead_addr();
        let doc = json!({"rules": [{"backends": [{"url": url(closed), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let (mut sender, _conn) = cftunnel_testkit::client::connect_h2c(proxy.data_addr())
            .await
            .expect("connect");
        let req = Request::post("http://h/pkg.Svc/Call")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .expect("request");
        let resp = sender.send_request(req).await.expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"14"[..]),
            "UNAVAILABLE"
        );
        let _ = resp.into_body().collect().await;
        let spans = receiver.wait_for(1, SPANS_WAIT).await;
        let server = server_spans(&spans);
        assert_eq!(server.len(), 1, "{spans:#?}");
        assert_eq!(server[0].status, SpanStatus::Error, "{:#?}", server[0]);
        assert_eq!(server[0].int("http.response.status_code"), Some(200));
        assert_eq!(server[0].str("error.type"), Some("dial"));
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

/// A caller's `tracestate` of 32 entries of 500 characters would be held by every span of the
/// request while queued: it is cut to 512 characters by whole entries, those over 128
/// characters first, then from the end (W3C Trace Context §3.3.1.5), on the span and on what
/// the backend is sent alike.
#[tokio::test]
async fn a_long_tracestate_is_cut_by_whole_entries_to_512_characters() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let (proxy, traces) = traced_proxy(&receiver).await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
        )
        .await;
        let first = format!("a={}", "x".repeat(100));
        let long = format!("long={}", "y".repeat(200));
        let small: Vec<String> = (0..10)
            .map(|i| format!("k{i}={}", "z".repeat(40)))
            .collect();
        let mut sent = vec![first.clone(), long];
        sent.extend(small.iter().cloned());
        let sent = sent.join(",");
        // Without its entry over 128 characters it is still too long by its last entry.
        let mut kept = vec![first];
        kept.extend(small[..9].iter().cloned());
        let kept = kept.join(",");
        assert!(kept.len() <= 512 && kept.len() + 1 + small[9].len() > 512);

        let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
        let r = get(
            &http,
            proxy.data_addr(),
            "h",
            "/",
            &[
                ("traceparent", caller.as_str()),
                ("tracestate", sent.as_str()),
            ],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.seen_header("tracestate").as_deref(), Some(kept.as_str()));
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        assert_eq!(spans.len(), 2, "{spans:#?}");
        for span in &spans {
            assert_eq!(span.trace_id, CALLER_TRACE);
            assert_eq!(span.trace_state, kept, "{:?} span", span.kind);
        }

        // One within the bound is kept as it came, long entries and all.
        let short = format!("a={},b={}", "x".repeat(250), "y".repeat(200));
        let r = get(
            &http,
            proxy.data_addr(),
            "h",
            "/",
            &[
                ("traceparent", caller.as_str()),
                ("tracestate", short.as_str()),
            ],
        )
        .await;
        assert_eq!(r.seen_header("tracestate").as_deref(), Some(short.as_str()));
        let spans = receiver.wait_for(4, SPANS_WAIT).await;
        assert_eq!(server_spans(&spans)[1].trace_state, short);
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

/// Requests whose responses are still streaming when the grace period ends are cut off, and
/// their server spans are exported, marked so, before the process exits: over HTTP/1.1 and
/// over HTTP/2, whose streams are tasks of their own.
#[tokio::test]
async fn requests_cut_at_the_end_of_the_grace_period_are_exported_as_aborted() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        // A first chunk, and the body left open.
        let backend = answering_backend(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await;
        let doc =
            json!({"version": 1, "rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
        let endpoint = receiver.endpoint();
        let BinaryProxy {
            mut child,
            data,
            dir,
            ..
        } = BinaryProxy::start(
            "cut-spans",
            &doc,
            &[
                ("PROXY_GRACE_PERIOD", "200ms"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ],
        )
        .await;

        let mut h1 = tokio::net::TcpStream::connect(data).await.expect("connect");
        h1.write_all(b"GET /cut/h1 HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        while !got.windows(5).any(|w| w == b"hello") {
            let mut buf = [0u8; 1024];
            let n = h1.read(&mut buf).await.expect("read");
            assert!(n > 0, "cut off early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        let (mut sender, _conn) = cftunnel_testkit::client::connect_h2c(data)
            .await
            .expect("connect");
        let resp = sender
            .send_request(
                Request::get("http://h/cut/h2")
                    .body(Full::new(Bytes::new()))
                    .expect("request"),
            )
            .await
            .expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        let mut h2 = resp.into_body();
        let first = h2.frame().await.expect("a frame").expect("data");
        assert_eq!(first.data_ref().map(|d| d.as_ref()), Some(&b"hello"[..]));

        let pid = child.id().expect("the proxy runs");
        let killed = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(killed.success());
        let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
            .await
            .expect("the proxy exits in time")
            .expect("wait");
        assert_eq!(status.code(), Some(0));

        let spans = receiver.spans();
        for path in ["/cut/h1", "/cut/h2"] {
            let span = server_spans(&spans)
                .into_iter()
                .find(|s| s.str("url.path") == Some(path))
                .unwrap_or_else(|| panic!("a server span for {path}: {spans:#?}"));
            assert_eq!(
                span.bool("cftunnel.aborted"),
                Some(true),
                "{path}: {span:#?}"
            );
            assert_eq!(span.int("http.response.status_code"), Some(200), "{path}");
        }
        drop((h1, h2));
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}
