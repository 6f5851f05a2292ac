//! Request tracing against a local OTLP receiver: the server span continues the caller's
//! trace, each try and mirror copy gets a client span under it, the backend is handed a
//! `traceparent` naming its client span, statuses and attributes follow the HTTP semantic
//! conventions, the sampler is honoured, and a collector that is down or hangs costs the
//! requests nothing.

use crate::support::*;
use cftunnel_proxy::trace::RequestTracer;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_telemetry::{TraceArgs, Traces};
use cftunnel_testkit::otlp::{OtlpReceiver, RecordedSpan, SpanKind, SpanStatus};
use serde_json::json;
use std::time::Duration;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// How long a test waits for spans to reach the receiver (they are exported every 50 ms).
const SPANS_WAIT: Duration = Duration::from_secs(10);

/// Trace settings exporting to `endpoint` every 50 ms, as the flags would give them.
fn trace_args(endpoint: &str) -> TraceArgs {
    TraceArgs {
        endpoint: Some(endpoint.to_owned()),
        schedule_delay: Some("50".into()),
        timeout: Some("2000".into()),
        ..TraceArgs::default()
    }
}

/// A proxy tracing its requests as `args` say, with the exporter that serves it.
async fn traced_proxy(args: &TraceArgs) -> (Server, Traces) {
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

fn by_kind(spans: &[RecordedSpan], kind: SpanKind) -> Vec<&RecordedSpan> {
    spans.iter().filter(|s| s.kind == kind).collect()
}

/// The parts of a `traceparent` value: trace id, parent span id, flags.
fn traceparent(value: &str) -> (String, String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[tokio::test]
async fn a_request_continues_the_callers_trace_and_hands_its_client_span_to_the_backend() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let (proxy, traces) = traced_proxy(&trace_args(&receiver.endpoint())).await;
        let http = client();
        let doc = json!({"version": 1, "rules": [{"name": "ns/route/0", "hostnames": ["*.example.com"],
            "backends": [{"url": url(backend.http_addr()), "weight": 1}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, 200);
        let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
        let r = get(
            &http,
            proxy.data_addr(),
            "app.example.com",
            "/items/7?page=2",
            &[
                ("traceparent", caller.as_str()),
                ("tracestate", "vendor=abc"),
                ("user-agent", "trace-test/1"),
                // A client of the proxy's own listener is not the edge: its ray is not taken.
                ("cf-ray", "0123456789abcdef-FAKE"),
            ],
        )
        .await;
        assert_eq!(r.status, 200);
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server);
        let client = by_kind(&spans, SpanKind::Client);
        assert_eq!((server.len(), client.len()), (1, 1), "{spans:#?}");
        let (server, client) = (server[0], client[0]);

        // The server span continues the caller's trace; the client span is its child.
        assert_eq!(server.trace_id, CALLER_TRACE);
        assert_eq!(server.parent_span_id, CALLER_SPAN);
        assert_eq!(server.trace_state, "vendor=abc");
        assert_eq!(client.trace_id, CALLER_TRACE);
        assert_eq!(client.parent_span_id, server.span_id);
        // The backend continues from the client span.
        let seen = r.seen_header("traceparent").expect("the backend got a traceparent");
        assert_eq!(
            traceparent(&seen),
            (CALLER_TRACE.into(), client.span_id.clone(), "01".into())
        );
        assert_eq!(r.seen_header("tracestate").as_deref(), Some("vendor=abc"));

        assert_eq!(server.name, "GET");
        assert_eq!(server.status, SpanStatus::Unset);
        assert_eq!(server.str("http.request.method"), Some("GET"));
        assert_eq!(server.str("url.path"), Some("/items/7"));
        assert_eq!(server.str("url.scheme"), Some("http"));
        assert_eq!(server.str("server.address"), Some("app.example.com"));
        assert_eq!(server.str("client.address"), Some("127.0.0.1"));
        assert_eq!(server.str("user_agent.original"), Some("trace-test/1"));
        assert_eq!(server.str("network.protocol.version"), Some("1.1"));
        assert_eq!(server.str("cftunnel.route"), Some("ns/route/0"));
        assert_eq!(server.str("cftunnel.hostname"), Some("*.example.com"));
        assert_eq!(server.int("http.response.status_code"), Some(200));
        assert_eq!(server.str("cloudflare.ray_id"), None);
        assert_eq!(server.resource_str("service.name"), Some("cftunnel-proxy"));
        assert_eq!(server.scope, "cftunnel-proxy");

        assert_eq!(client.name, "GET");
        assert_eq!(client.status, SpanStatus::Unset);
        assert_eq!(client.str("server.address"), Some("127.0.0.1"));
        assert_eq!(
            client.int("server.port"),
            Some(i64::from(backend.http_addr().port()))
        );
        assert_eq!(
            client.str("url.full"),
            Some(format!("{}/items/7", url(backend.http_addr())).as_str())
        );
        assert_eq!(client.int("http.response.status_code"), Some(200));
        assert_eq!(client.int("http.request.resend_count"), None);
        // The client span lies within the server span.
        assert!(client.start_unix_nanos >= server.start_unix_nanos);
        assert!(client.end_unix_nanos <= server.end_unix_nanos);
        assert!(traces.shutdown(Duration::from_secs(5)).await);
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_request_without_a_caller_starts_a_trace_and_5xx_marks_its_spans_failed() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let (proxy, traces) = traced_proxy(&trace_args(&receiver.endpoint())).await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
        )
        .await;
        let r = get(&http, proxy.data_addr(), "h", "/status/503", &[]).await;
        assert_eq!(r.status, 503);
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[0];
        let client = by_kind(&spans, SpanKind::Client)[0];
        assert_eq!(server.parent_span_id, "", "a new trace");
        assert_eq!(server.status, SpanStatus::Error);
        assert_eq!(server.str("error.type"), Some("503"));
        assert_eq!(client.status, SpanStatus::Error);
        assert_eq!(client.int("http.response.status_code"), Some(503));
        assert_eq!(client.parent_span_id, server.span_id);

        // A 4xx is the client's: an error on the client span only, as the conventions say.
        let r = get(&http, proxy.data_addr(), "h", "/status/404", &[]).await;
        assert_eq!(r.status, 404);
        let spans = receiver.wait_for(4, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[1];
        let client = by_kind(&spans, SpanKind::Client)[1];
        assert_eq!(server.status, SpanStatus::Unset);
        assert_eq!(client.status, SpanStatus::Error);
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

/// The export queue holds a number of spans whatever their size: the request's own text is
/// cut to 4 KiB an attribute, as in the access log.
#[tokio::test]
async fn a_long_host_path_or_user_agent_is_cut_in_the_spans() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let (proxy, traces) = traced_proxy(&trace_args(&receiver.endpoint())).await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
        )
        .await;
        let host = format!("{}.example.com", "h".repeat(10_000));
        let path = format!("/{}", "p".repeat(20_000));
        let ua = "u".repeat(20_000);
        let r = get(
            &http,
            proxy.data_addr(),
            &host,
            &path,
            &[("user-agent", &ua)],
        )
        .await;
        assert_eq!(r.status, 200);
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[0];
        let client = by_kind(&spans, SpanKind::Client)[0];
        assert_eq!(server.str("url.path"), Some(&path[..4096]));
        assert_eq!(server.str("server.address"), Some(&host[..4096]));
        assert_eq!(server.str("user_agent.original"), Some(&ua[..4096]));
        assert_eq!(
            client.str("url.full"),
            Some(format!("{}{}", url(backend.http_addr()), &path[..4096]).as_str())
        );
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn every_retry_is_a_client_span_of_its_own_and_a_failed_dial_is_an_error() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let (proxy, traces) = traced_proxy(&trace_args(&receiver.endpoint())).await;
        let http = client();
        let closed = format!("http://127.0.0.1:{}", free_port());
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/retry"}}],
             "retry": {"codes": [500], "attempts": 2, "backoff": "1ms"},
             "backends": [{"url": url(backend.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/down"}}],
             "backends": [{"url": closed, "weight": 1}]},
        ]});
        push(&http, proxy.admin_addr(), &doc).await;
        let r = get(
            &http,
            proxy.data_addr(),
            "h",
            "/retry/x?responseCode=500&succeedAfter=2&uuid=trace-retry",
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "answered by the third try");
        let spans = receiver.wait_for(4, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[0];
        let mut tries = by_kind(&spans, SpanKind::Client);
        tries.sort_by_key(|s| s.start_unix_nanos);
        assert_eq!(tries.len(), 3, "{spans:#?}");
        let statuses: Vec<_> = tries
            .iter()
            .map(|s| {
                (
                    s.int("http.response.status_code"),
                    s.int("http.request.resend_count"),
                    s.status,
                )
            })
            .collect();
        assert_eq!(
            statuses,
            [
                (Some(500), None, SpanStatus::Error),
                (Some(500), Some(1), SpanStatus::Error),
                (Some(200), Some(2), SpanStatus::Unset),
            ]
        );
        assert!(tries.iter().all(|t| t.parent_span_id == server.span_id));
        assert_eq!(server.status, SpanStatus::Unset);

        let r = get(&http, proxy.data_addr(), "h", "/down", &[]).await;
        assert_eq!(r.status, 502);
        let spans = receiver.wait_for(6, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[1];
        let dial = by_kind(&spans, SpanKind::Client)[3];
        assert_eq!(server.status, SpanStatus::Error);
        assert_eq!(server.str("error.type"), Some("dial"));
        assert_eq!(server.int("http.response.status_code"), Some(502));
        assert_eq!(dial.status, SpanStatus::Error);
        assert_eq!(dial.str("error.type"), Some("dial"));
        assert_eq!(dial.int("http.response.status_code"), None);
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_mirror_copy_gets_its_own_client_span_and_traceparent() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let (a, m) = (echo("svc-a-1").await, echo("mirror-1").await);
        let (proxy, traces) = traced_proxy(&trace_args(&receiver.endpoint())).await;
        let http = client();
        let doc = json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.http_addr())}}],
            "backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        push(&http, proxy.admin_addr(), &doc).await;
        let r = get(&http, proxy.data_addr(), "h", "/mirrored", &[]).await;
        assert_eq!(r.status, 200);
        let spans = receiver.wait_for(3, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server)[0];
        let clients = by_kind(&spans, SpanKind::Client);
        assert_eq!(clients.len(), 2, "{spans:#?}");
        let mirror = clients
            .iter()
            .find(|s| s.bool("cftunnel.mirror") == Some(true))
            .expect("a mirror span");
        let primary = clients
            .iter()
            .find(|s| s.bool("cftunnel.mirror").is_none())
            .expect("the try's span");
        assert_eq!(mirror.parent_span_id, server.span_id);
        assert_eq!(primary.parent_span_id, server.span_id);
        assert_eq!(
            mirror.int("server.port"),
            Some(i64::from(m.http_addr().port()))
        );
        assert_ne!(mirror.span_id, primary.span_id);
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn a_sampling_ratio_of_zero_exports_nothing_but_still_propagates() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let args = TraceArgs {
            sampler: Some("parentbased_traceidratio".into()),
            sampler_arg: Some("0".into()),
            ..trace_args(&receiver.endpoint())
        };
        let (proxy, traces) = traced_proxy(&args).await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
        )
        .await;
        for _ in 0..20 {
            let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
            assert_eq!(r.status, 200);
            // The decision travels on: the backend's trace is not sampled either.
            let seen = r.seen_header("traceparent").expect("a traceparent");
            assert_eq!(traceparent(&seen).2, "00");
        }
        // A caller that sampled its trace decides for it.
        let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
        get(
            &http,
            proxy.data_addr(),
            "h",
            "/",
            &[("traceparent", caller.as_str())],
        )
        .await;
        assert!(traces.shutdown(Duration::from_secs(5)).await, "flushed");
        let spans = receiver.spans();
        assert_eq!(
            spans.len(),
            2,
            "only the caller's sampled trace: {spans:#?}"
        );
        assert!(spans.iter().all(|s| s.trace_id == CALLER_TRACE));
    })
    .await
    .expect("test finished in time");
}

/// A collector that is down or never answers costs the requests nothing: spans go to a
/// bounded queue and are dropped once it is full. Each export may wait as long as the whole
/// test may take, so a request that waited on one would never finish in time.
#[tokio::test]
async fn a_collector_that_is_down_or_hangs_neither_slows_nor_fails_requests() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc-a-1").await;
        let stalled = OtlpReceiver::stalled().await.expect("receiver starts");
        let down = format!("http://127.0.0.1:{}", free_port());
        for (name, endpoint, protocol) in [
            ("down, HTTP", down.clone(), "http/protobuf"),
            ("down, gRPC", down.clone(), "grpc"),
            ("hanging, HTTP", stalled.endpoint(), "http/protobuf"),
            ("hanging, gRPC", stalled.endpoint(), "grpc"),
        ] {
            let args = TraceArgs {
                protocol: Some(protocol.into()),
                timeout: Some(TEST_TIMEOUT.as_millis().to_string()),
                // A small queue fills at once: spans beyond it are dropped, never waited for.
                max_queue_size: Some("8".into()),
                ..trace_args(&endpoint)
            };
            let (proxy, traces) = traced_proxy(&args).await;
            let http = client();
            push(
                &http,
                proxy.admin_addr(),
                &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
            )
            .await;
            for _ in 0..200 {
                let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
                assert_eq!(r.status, 200, "{name}");
            }
            // The drain's flush gives up at its deadline rather than wait on the collector.
            traces.shutdown(Duration::from_millis(500)).await;
        }
        assert!(stalled.spans().is_empty());
    })
    .await
    .expect("test finished in time: no request waited on the collector");
}

#[tokio::test]
async fn spans_reach_a_grpc_collector_too() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let args = TraceArgs {
            protocol: Some("grpc".into()),
            service_name: Some("edge-proxy".into()),
            resource_attributes: Some("deployment.environment.name=test".into()),
            ..trace_args(&receiver.endpoint())
        };
        let (proxy, traces) = traced_proxy(&args).await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]}),
        )
        .await;
        get(&http, proxy.data_addr(), "h", "/", &[]).await;
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        assert_eq!(spans.len(), 2, "{spans:#?}");
        assert_eq!(receiver.exports().0, 0, "nothing over HTTP");
        assert!(receiver.exports().1 > 0, "exported over gRPC");
        assert_eq!(spans[0].resource_str("service.name"), Some("edge-proxy"));
        assert_eq!(
            spans[0].resource_str("deployment.environment.name"),
            Some("test")
        );
        traces.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test finished in time");
}

/// The binary, configured by the standard variables alone, serving through the tunnel: its
/// server span carries the edge's ray id and the eyeball's address, and the access log line
/// names the same trace and span, the ray and the client.
#[tokio::test]
async fn the_binary_traces_tunnel_requests_with_the_edges_ray_and_logs_their_ids() {
    use cftunnel_testkit::edge::MockEdge;
    use tokio::io::AsyncBufReadExt as _;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let receiver = OtlpReceiver::start().await.expect("receiver starts");
        let backend = echo("svc-a-1").await;
        let edge = MockEdge::start().await.expect("mock edge starts");
        let dir = std::env::temp_dir().join(format!("cftunnel-trace-tunnel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca = dir.join("edge-ca.pem");
        edge.write_ca_pem(&ca).await.expect("CA written");
        let config = dir.join("config.json");
        let doc = json!({"version": 1, "rules": [{"name": "ns/app/0", "hostnames": ["app.example.com"],
            "backends": [{"url": url(backend.http_addr()), "weight": 1}]}]});
        std::fs::write(&config, doc.to_string()).expect("write config");
        let admin_port = free_port();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
            .env("TUNNEL_TOKEN", cftunnel_testkit::connector::token().encode())
            .env("TUNNEL_EDGE", edge.edge_addr().to_string())
            .env("TUNNEL_CACERT", &ca)
            .env("PROXY_TUNNEL_PROTOCOL", "http2")
            .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
            .env("PROXY_AUTH_TOKEN", TOKEN)
            .env("PROXY_GRACE_PERIOD", "0s")
            .env("PROXY_ACCESS_LOG_ENABLED", "true")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_SERVICE_NAME", "edge-proxy")
            .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .arg("--config-file")
            .arg(&config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("proxy binary starts");
        let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
        let http = client();
        loop {
            let up = tokio::net::TcpStream::connect(admin).await.is_ok();
            if up && get(&http, admin, "a", "/readyz", &[]).await.status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
        let r = get(
            &http,
            edge.http_addr(),
            "app.example.com",
            "/via/edge",
            &[("traceparent", caller.as_str()), ("user-agent", "eyeball/1")],
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let ray = r.seen_header("cf-ray").expect("the edge's ray reached the backend");
        let spans = receiver.wait_for(2, SPANS_WAIT).await;
        let server = by_kind(&spans, SpanKind::Server);
        assert_eq!(server.len(), 1, "{spans:#?}");
        let server = server[0];
        assert_eq!(server.trace_id, CALLER_TRACE);
        assert_eq!(server.parent_span_id, CALLER_SPAN);
        assert_eq!(server.str("cloudflare.ray_id"), Some(ray.as_str()));
        assert_eq!(server.str("client.address"), Some("127.0.0.1"));
        assert_eq!(server.str("url.scheme"), Some("https"));
        assert_eq!(server.resource_str("service.name"), Some("edge-proxy"));
        assert_eq!(
            server.resource_str("deployment.environment.name"),
            Some("test")
        );

        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = lines
            .next_line()
            .await
            .expect("stdout readable")
            .expect("an access log line");
        let line: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(line["path"], "/via/edge");
        assert_eq!(line["trace_id"], CALLER_TRACE);
        assert_eq!(line["span_id"], server.span_id.as_str());
        assert_eq!(line["cf_ray"], ray.as_str());
        assert_eq!(line["client_ip"], "127.0.0.1");
        assert_eq!(line["user_agent"], "eyeball/1");
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}
