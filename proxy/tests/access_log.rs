//! The access log of the real binary, read from its stdout: what a line says about the
//! request, the backend and its tries, the opt-in query string, and one-in-N sampling that
//! still writes every failure.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// A proxy binary with its access log on, serving `doc`, with `env` on top.
struct LoggingProxy {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    data: std::net::SocketAddr,
    dir: std::path::PathBuf,
}

impl LoggingProxy {
    async fn start(name: &str, doc: &Value, env: &[(&str, &str)]) -> Self {
        let mut env = env.to_vec();
        env.push(("PROXY_ACCESS_LOG_ENABLED", "true"));
        let BinaryProxy {
            mut child,
            data,
            dir,
            ..
        } = BinaryProxy::start(name, doc, &env).await;
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
            data,
            dir,
        }
    }

    /// The next line written, as JSON.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("a log line in time")
            .expect("stdout readable")
            .expect("one more line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"))
    }

    /// Every line up to and including the first whose path is `last`: the log is written in
    /// the order requests end, so sending `last` after the others and reading to it reads
    /// everything they wrote.
    async fn until(&mut self, last: &str) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let line = self.next().await;
            let done = line["path"] == last;
            out.push(line);
            if done {
                return out;
            }
        }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_line_names_the_client_the_backend_its_tries_and_the_query_when_asked() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc-a-1").await;
        let closed = format!("http://127.0.0.1:{}", free_port());
        let doc = json!({"version": 1, "rules": [
            {"name": "ns/retry/0", "matches": [{"path": {"type": "PathPrefix", "value": "/retry"}}],
             "retry": {"codes": [500], "attempts": 2, "backoff": "1ms"},
             "backends": [{"url": url(backend.http_addr()), "weight": 1}]},
            {"name": "ns/down/0", "matches": [{"path": {"type": "PathPrefix", "value": "/down"}}],
             "backends": [{"url": closed, "weight": 1}]},
        ]});
        let mut proxy =
            LoggingProxy::start("access-fields", &doc, &[("PROXY_ACCESS_LOG_QUERY", "true")]).await;
        let http = client();
        let r = get(
            &http,
            proxy.data,
            "app.example",
            "/retry/a?responseCode=500&succeedAfter=2&uuid=log-retry",
            &[
                ("user-agent", "log-test/2"),
                // A client of the proxy's own listener is not the edge: its ray is not taken.
                ("cf-ray", "0123456789abcdef-FAKE"),
            ],
        )
        .await;
        assert_eq!(r.status, 200, "the third try answers");
        let line = proxy.next().await;
        assert_eq!(line["path"], "/retry/a");
        assert_eq!(
            line["query"],
            "responseCode=500&succeedAfter=2&uuid=log-retry"
        );
        assert_eq!(line["status"], 200);
        assert_eq!(line["route"], "ns/retry/0");
        assert_eq!(line["user_agent"], "log-test/2");
        assert_eq!(line["client_ip"], "127.0.0.1");
        assert_eq!(line["backend"], url(backend.http_addr()));
        assert_eq!(line["tries"], 3);
        let upstream = line["upstream_ms"].as_f64().expect("upstream_ms");
        let total = line["duration_ms"].as_f64().expect("duration_ms");
        assert!(upstream > 0.0 && upstream <= total, "{line}");
        for absent in ["cf_ray", "error", "trace_id", "span_id", "aborted"] {
            assert!(line.get(absent).is_none(), "{absent} in {line}");
        }

        // A backend that cannot be dialled: one try, and why the proxy answered itself.
        let r = get(&http, proxy.data, "app.example", "/down", &[]).await;
        assert_eq!(r.status, 502);
        let line = proxy.next().await;
        assert_eq!(line["status"], 502);
        assert_eq!(line["error"], "dial");
        assert_eq!(line["tries"], 1);
        assert_eq!(line["backend"], closed);
        assert!(line.get("query").is_none(), "no query string: {line}");

        // The same over gRPC: the line says the 200 the client got (the metrics count a 502).
        let grpc = [("content-type", "application/grpc")];
        let r = get(&http, proxy.data, "app.example", "/down", &grpc).await;
        assert_eq!(r.status, 200);
        let line = proxy.next().await;
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["error"], "dial");

        // No route: no backend, no tries.
        let r = get(&http, proxy.data, "app.example", "/nowhere", &[]).await;
        assert_eq!(r.status, 404);
        let line = proxy.next().await;
        assert_eq!(line["error"], "no_route");
        assert!(
            line.get("backend").is_none() && line.get("tries").is_none(),
            "{line}"
        );
        proxy.stop().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn one_request_in_n_is_written_and_every_failure_and_no_query_unless_asked() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc-a-1").await;
        let doc = json!({"version": 1, "rules": [
            {"backends": [{"url": url(backend.http_addr()), "weight": 1}]},
        ]});
        let mut proxy =
            LoggingProxy::start("access-sampled", &doc, &[("PROXY_ACCESS_LOG_SAMPLE", "5")]).await;
        let http = client();
        // Requests 0..10 succeed; 10..13 fail; one in five is written whatever its outcome.
        for i in 0..10 {
            let r = get(&http, proxy.data, "h", &format!("/ok/{i}?secret=1"), &[]).await;
            assert_eq!(r.status, 200);
        }
        for _ in 0..3 {
            let r = get(&http, proxy.data, "h", "/status/503", &[]).await;
            assert_eq!(r.status, 503);
        }
        let last = "/status/500";
        assert_eq!(get(&http, proxy.data, "h", last, &[]).await.status, 500);
        let lines = proxy.until(last).await;
        let written: Vec<(&str, u64)> = lines
            .iter()
            .map(|l| {
                (
                    l["path"].as_str().unwrap_or_default(),
                    l["status"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            written,
            [
                ("/ok/0", 200),
                ("/ok/5", 200),
                ("/status/503", 503),
                ("/status/503", 503),
                ("/status/503", 503),
                (last, 500),
            ]
        );
        assert!(
            lines.iter().all(|l| l.get("query").is_none()),
            "the query string is left out by default: {lines:?}"
        );
        proxy.stop().await;
    })
    .await
    .expect("test finished in time");
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// With stdout not read, long lines fill the queue's few MiB long before its 8192 lines: the
/// rest are dropped and counted, and the bytes held, and the process, stay small. A line
/// carries at most 4 KiB of each of the request's fields, and says which it cut.
#[tokio::test]
async fn long_lines_behind_a_stalled_output_are_dropped_within_a_byte_budget() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Every request is a 404 (no rule for its host), whose line is always written.
        let doc = json!({"version": 1, "rules": [
            {"hostnames": ["other.example"], "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]},
        ]});
        let env = [("PROXY_ACCESS_LOG_ENABLED", "true")];
        let BinaryProxy {
            mut child,
            data,
            admin,
            dir,
        } = BinaryProxy::start("access-bytes", &doc, &env).await;
        let stdout = child.stdout.take().expect("stdout");
        let pid = child.id().expect("the proxy runs");
        let http = client();
        // About 92 KB of JSON a line as sent: a `"` is escaped as two bytes.
        let path = format!("/{}", "a".repeat(28_000));
        let ua = "\"".repeat(32_000);
        let before = rss(pid);
        let sent = 600;
        for _ in 0..sent {
            let r = get(&http, data, "app.example", &path, &[("user-agent", &ua)]).await;
            assert_eq!(r.status, 404);
        }
        let dropped = metric(&http, admin, "cftunnel_proxy_access_log_lines_dropped_total")
            .await
            .expect("dropped lines counted");
        let queued = metric(&http, admin, "cftunnel_proxy_access_log_queued_bytes")
            .await
            .expect("queued bytes shown");
        let grown = rss(pid).saturating_sub(before);
        assert!(
            dropped > 0.0 && dropped < f64::from(sent),
            "{dropped} of {sent} lines dropped"
        );
        assert!(queued <= f64::from(4 << 20), "{queued} bytes queued");
        // Unbounded, the queued lines alone would be over 50 MB.
        assert!(grown < 32 << 20, "the proxy grew by {grown} bytes");

        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a log line in time")
            .expect("stdout readable")
            .expect("a line");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(line["path"].as_str().map(str::len), Some(4096));
        assert_eq!(line["user_agent"].as_str(), Some(&ua[..4096]));
        assert_eq!(line["truncated"], json!(["path", "user_agent"]));
        assert_eq!(line["error"], "no_route");
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}
