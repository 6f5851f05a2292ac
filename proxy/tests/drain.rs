//! Drain of the real binary: SIGTERM with a slow request in flight.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

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
        let dir = std::env::temp_dir().join(format!("cftunnel-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join("config.json");
        let doc = serde_json::json!({"version": 1, "rules": [{"name": "ns/route/0", "hostnames": ["app.example"], "backends": [{"url": url(a.http_addr()), "weight": 1}]}]});
        std::fs::write(&config, doc.to_string()).expect("write config");
        let (data_port, admin_port) = (free_port(), free_port());
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
            .env("PROXY_ADDR", format!("127.0.0.1:{data_port}"))
            .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
            .env("PROXY_ACCESS_LOG_ENABLED", "true")
            .env("PROXY_AUTH_TOKEN", TOKEN)
            .arg("--config-file")
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("proxy binary starts");
        let data: std::net::SocketAddr = format!("127.0.0.1:{data_port}").parse().expect("addr");
        let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
        let http = client();
        let ready_by = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(admin).await.is_err() {
            assert!(Instant::now() < ready_by, "proxy started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
