//! Drain of the real binary: SIGTERM with a slow request in flight.

use crate::support::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn sigterm_refuses_new_connections_finishes_in_flight_requests_and_exits_zero() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let dir = std::env::temp_dir().join(format!("cftunnel-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join("config.json");
        let doc = serde_json::json!({"version": 1, "rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        std::fs::write(&config, doc.to_string()).expect("write config");
        let (data_port, admin_port) = (free_port(), free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
            .env("PROXY_ADDR", format!("127.0.0.1:{data_port}"))
            .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
            .env("PROXY_GRACE_PERIOD", "10s")
            .env("PROXY_AUTH_TOKEN", TOKEN)
            .arg("--config-file")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("proxy binary starts");
        let data: std::net::SocketAddr = format!("127.0.0.1:{data_port}").parse().expect("addr");
        let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
        let http = client();
        let ready_by = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(admin)).await;
            if matches!(ok, Ok(Ok(_))) && get(&http, admin, "a", "/readyz", &[]).await.status == 200 {
                break;
            }
            assert!(Instant::now() < ready_by, "proxy became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(metric(&http, admin, "cftunnel_proxy_draining").await, Some(0.0), "not draining yet");

        let slow = tokio::spawn({
            let http = client();
            async move { get(&http, data, "h", "/slow?delay=1500ms", &[]).await }
        });
        // SIGTERM once the request is at the backend (logged before its delay).
        let arrived_by = Instant::now() + Duration::from_secs(10);
        while a.count_echoed("/slow?delay=1500ms") == 0 {
            assert!(Instant::now() < arrived_by, "the slow request reaches the backend");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let killed = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().expect("kill runs");
        assert!(killed.success());

        // New connections are refused once the listener is closed.
        let refused_by = Instant::now() + Duration::from_secs(3);
        loop {
            if tokio::net::TcpStream::connect(data).await.is_err() {
                break;
            }
            assert!(Instant::now() < refused_by, "new connections are refused during drain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(get(&http, admin, "a", "/readyz", &[]).await.status, 503, "not ready while draining");
        assert_eq!(metric(&http, admin, "cftunnel_proxy_draining").await, Some(1.0), "the gauge says it drains");
        let config = http::Request::get(format!("http://{admin}/config"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("req");
        let state = send(&http, config).await.json();
        assert_eq!((&state["version"], &state["ready"]), (&serde_json::json!(1), &serde_json::json!(false)), "GET /config says so too: {state}");

        let r = slow.await.expect("slow request task");
        assert_eq!(r.status, 200, "the in-flight request completed");
        assert_eq!(r.pod(), "svc-a-1");

        let exit_by = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < exit_by, "proxy exits after the drain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(status.code(), Some(0));
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

#[test]
fn start_up_refuses_bad_settings_with_a_clear_message() {
    let run = |envs: &[(&str, &str)], args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
            .env_remove("TUNNEL_TOKEN")
            .env_remove("PROXY_AUTH_TOKEN")
            .envs(envs.iter().copied())
            .args(args)
            .output()
            .expect("binary runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[("PROXY_AUTH_TOKEN", "")], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("PROXY_AUTH_TOKEN"), "{err}");
    // A zero that would fail every request or every Access token.
    for name in [
        "PROXY_BACKEND_HEADER_TIMEOUT",
        "PROXY_REQUEST_BODY_TIMEOUT",
        "PROXY_ACCESS_KEYS_MAX_STALE",
    ] {
        let (code, err) = run(&[(name, "0s")], &[]);
        assert_ne!(code, Some(0), "{name}");
        assert!(err.contains(name), "{err}");
    }
    // Keys that could age past their limit between two fetches.
    let (code, err) = run(&[("PROXY_ACCESS_KEYS_MAX_STALE", "2m")], &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("PROXY_ACCESS_KEYS_MAX_STALE (120s) must be longer than PROXY_ACCESS_KEYS_REFRESH (300s)"),
        "{err}"
    );
    // A grace period over 3m is capped, not refused (see the CLI's unit test); one that is not
    // a duration is refused.
    let (code, err) = run(&[("PROXY_GRACE_PERIOD", "ten")], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("ten"), "{err}");
    let (code, err) = run(&[("PROXY_TUNNEL_PROTOCOL", "udp")], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("udp"), "{err}");
    let dir = std::env::temp_dir().join(format!("cftunnel-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"rules":[{"matches":[{"path":{"type":"RegularExpression","value":"(["}}]}]}"#,
    )
    .expect("write");
    let (code, err) = run(
        &[],
        &["--check", "--config-file", bad.to_str().expect("utf8")],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("rules[0].matches[0].path"), "{err}");
    let good = dir.join("good.json");
    std::fs::write(
        &good,
        r#"{"version":3,"rules":[{"backends":[{"url":"http://127.0.0.1:9","weight":1}]}]}"#,
    )
    .expect("write");
    let (code, _) = run(
        &[],
        &["--check", "--config-file", good.to_str().expect("utf8")],
    );
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn access_log_writes_one_json_line_per_request() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "rules": [{"name": "ns/route/0", "hostnames": ["app.example"], "backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        let BinaryProxy { mut child, data, admin, dir } =
            BinaryProxy::start("log", &doc, &[("PROXY_ACCESS_LOG_ENABLED", "true")]).await;
        let http = client();
        assert_eq!(get(&http, admin, "a", "/healthz", &[]).await.status, 200);
        assert_eq!(get(&http, data, "App.Example:80", "/hello?x=1", &[]).await.status, 200);
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .expect("a log line in time")
            .expect("stdout readable")
            .expect("one line");
        let entry: serde_json::Value = serde_json::from_str(&line).expect("the line is JSON");
        assert_eq!(entry["method"], "GET");
        assert_eq!(entry["host"], "app.example");
        assert_eq!(entry["path"], "/hello");
        assert_eq!(entry["status"], 200);
        assert_eq!(entry["route"], "ns/route/0");
        assert!(entry["bytes"].as_u64() > Some(0));
        assert!(entry["duration_ms"].is_number());
        // RFC 3339 in UTC, of today (or of a midnight just passed).
        let time = entry["time"].as_str().expect("a time field");
        let now = time::OffsetDateTime::now_utc();
        let day = |t: time::OffsetDateTime| {
            format!("{:04}-{:02}-{:02}T", t.year(), u8::from(t.month()), t.day())
        };
        assert!(
            time.starts_with(&day(now)) || time.starts_with(&day(now - time::Duration::DAY)),
            "{time}"
        );
        assert!(time.ends_with('Z') && time.len() >= 20, "{time}");
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// [`BinaryProxy::start`] with the grace period `grace`: its child, data and admin
/// addresses and the scratch directory to remove.
async fn ready_proxy(
    name: &str,
    doc: &serde_json::Value,
    grace: &str,
    env: &[(&str, &str)],
) -> (
    tokio::process::Child,
    std::net::SocketAddr,
    std::net::SocketAddr,
    std::path::PathBuf,
) {
    let mut env = env.to_vec();
    env.push(("PROXY_GRACE_PERIOD", grace));
    let proxy = BinaryProxy::start(name, doc, &env).await;
    (proxy.child, proxy.data, proxy.admin, proxy.dir)
}

/// SIGTERM to `child`, then waits until it has begun draining: `/readyz` answers 503 (or the
/// admin port is already gone).
async fn terminate(child: &tokio::process::Child, admin: std::net::SocketAddr) {
    let pid = child.id().expect("the proxy runs");
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let http = client();
    let draining_by = Instant::now() + Duration::from_secs(5);
    loop {
        if tokio::net::TcpStream::connect(admin).await.is_err()
            || get(&http, admin, "a", "/readyz", &[]).await.status == 503
        {
            break;
        }
        assert!(Instant::now() < draining_by, "the proxy drains");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 5 s) until the listener on `addr` (127.0.0.1) has no connection waiting to be
/// accepted: its accept queue, which Linux shows as the listening socket's receive queue in
/// `/proc/net/tcp`.
async fn accepted(addr: std::net::SocketAddr) {
    let local = format!("0100007F:{:04X}", addr.port());
    let by = Instant::now() + Duration::from_secs(5);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let waiting = table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local address, remote address, state (0A: listening), tx_queue:rx_queue
            (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A"))
                .then(|| fields.get(4)?.split(':').nth(1).map(|q| q != "00000000"))
                .flatten()
        });
        if waiting == Some(false) {
            return;
        }
        assert!(
            Instant::now() < by,
            "the proxy accepts the connection: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits up to `within` for `child` to exit; its exit code, and how long it took.
async fn exit_of(child: &mut tokio::process::Child, within: Duration) -> (Option<i32>, Duration) {
    let started = Instant::now();
    let status = tokio::time::timeout(within, child.wait())
        .await
        .expect("the proxy exits in time")
        .expect("wait");
    (status.code(), started.elapsed())
}

/// A connection that was open but silent when the drain began is asked to close with its
/// first response (`Connection: close`), as every open connection is, and the process exits
/// once it has: the drain is not held for the connection's idle timeout.
#[tokio::test]
async fn a_connection_silent_when_the_drain_begins_closes_after_its_first_response() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        let (mut child, data, admin, dir) = ready_proxy("silent-drain", &doc, "30s", &[]).await;
        let mut silent = tokio::net::TcpStream::connect(data).await.expect("connect");
        // Open means taken by the proxy: one still in the listener's queue is refused with
        // the listener as the drain begins.
        accepted(data).await;
        terminate(&child, admin).await;
        silent
            .write_all(b"GET /late HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .expect("request written");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(read.is_ok(), "the connection is closed after its response: {text}");
        assert!(text.starts_with("http/1.1 200"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
        let (code, took) = exit_of(&mut child, Duration::from_secs(10)).await;
        assert_eq!(code, Some(0));
        assert!(took < Duration::from_secs(5), "exits once the connection closed: {took:?}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket session opened before the SIGTERM is still served during the drain, as an
/// in-flight request is (proxy contract: up to `PROXY_GRACE_PERIOD`), and the process exits
/// once it ends, without waiting out the grace period; one left open is cut at its end.
#[tokio::test]
async fn sigterm_keeps_open_websocket_sessions_until_they_end_or_the_grace_period_does() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1, "websocket": true}]}]});
        async fn echoed(ws: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + SinkExt<Message> + Unpin), text: &str) -> bool {
            if ws.send(Message::text(text)).await.is_err() {
                return false;
            }
            matches!(
                tokio::time::timeout(Duration::from_secs(5), ws.next()).await,
                Ok(Some(Ok(Message::Text(t)))) if t.as_str() == text
            )
        }

        // Closed by its client during the drain: the proxy exits then, long before 30s.
        let (mut child, data, admin, dir) = ready_proxy("ws-drain", &doc, "30s", &[]).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{data}/ws"))
            .await
            .expect("websocket handshake through the proxy");
        assert!(echoed(&mut ws, "before").await);
        terminate(&child, admin).await;
        assert!(echoed(&mut ws, "during the drain").await, "the session is still served while draining");
        assert!(child.try_wait().expect("wait").is_none(), "the drain waits for the open session");
        ws.close(None).await.expect("close sent");
        let (code, took) = exit_of(&mut child, Duration::from_secs(10)).await;
        assert_eq!(code, Some(0));
        assert!(took < Duration::from_secs(10), "exits once the session ends: {took:?}");
        let _ = std::fs::remove_dir_all(&dir);

        // Left open: served until the grace period ends, then cut, and the process exits 0.
        let (mut child, data, admin, dir) = ready_proxy("ws-cut", &doc, "2s", &[]).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{data}/ws"))
            .await
            .expect("websocket handshake through the proxy");
        let drain_started = Instant::now();
        terminate(&child, admin).await;
        assert!(echoed(&mut ws, "during the drain").await, "the session is still served while draining");
        let (code, _) = exit_of(&mut child, Duration::from_secs(10)).await;
        assert_eq!(code, Some(0));
        assert!(drain_started.elapsed() >= Duration::from_millis(1900), "kept for the grace period");
        assert!(!echoed(&mut ws, "after").await, "the session ended with the process");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// The access-log lines of the last requests are written before the process exits: that of
/// a request that finished during the drain, and that of one the end of the grace period cut
/// off (`aborted`), whose line is made as the process stops.
#[tokio::test]
async fn access_log_lines_queued_at_exit_are_written() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let doc = serde_json::json!({"version": 1, "rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        let (mut child, data, admin, dir) =
            ready_proxy("log-exit", &doc, "1s", &[("PROXY_ACCESS_LOG_ENABLED", "true")]).await;
        let mut stdout = child.stdout.take().expect("stdout");
        let cut = tokio::spawn({
            let http = client();
            async move {
                let req = http::Request::get(format!("http://{data}/cut?delay=60s"))
                    .header("host", "h")
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .expect("request");
                // Cut off: no response, or one whose body does not end.
                let _ = http.request(req).await;
            }
        });
        let finishing = tokio::spawn({
            let http = client();
            async move { get(&http, data, "h", "/finishing?delay=500ms", &[]).await }
        });
        let arrived_by = Instant::now() + Duration::from_secs(10);
        while a.count_echoed("/cut?delay=60s") == 0 || a.count_echoed("/finishing?delay=500ms") == 0 {
            assert!(Instant::now() < arrived_by, "both requests reach the backend");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        terminate(&child, admin).await;
        assert_eq!(finishing.await.expect("task").status, 200);
        let (code, _) = exit_of(&mut child, Duration::from_secs(10)).await;
        assert_eq!(code, Some(0));
        cut.abort();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out).await.expect("stdout read");
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        let line = |path: &str| lines.iter().find(|l| l["path"] == path).cloned();
        assert_eq!(line("/finishing").map(|l| l["status"].clone()), Some(200.into()), "{out}");
        assert_eq!(line("/cut").map(|l| l["aborted"].clone()), Some(true.into()), "{out}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}
