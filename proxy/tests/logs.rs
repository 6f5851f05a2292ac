//! The binary's own log lines: JSON objects one per line with `--log-format json`, plain text
//! otherwise, and no terminal colour codes when stderr is not a terminal.

use crate::support::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the proxy with `format` until it has applied its config file, then stops it; returns
/// what it wrote to stderr.
async fn run_with(format: &str) -> String {
    run(format, Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))).await
}

/// [`run_with`] of `command`, which runs the proxy binary (directly, or through a program such
/// as `taskset` that executes it).
async fn run(format: &str, mut command: Command) -> String {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "cftunnel-logs-{format}-{}-{run}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("config.json");
    std::fs::write(&config, r#"{"version": 7, "rules": []}"#).expect("write config");
    let admin_port = free_port();
    let child = command
        .env_remove("TUNNEL_TOKEN")
        .env_remove("RUST_LOG")
        .env("PROXY_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
        .env("PROXY_AUTH_TOKEN", TOKEN)
        .env("PROXY_GRACE_PERIOD", "0s")
        .env("PROXY_LOG_FORMAT", format)
        .arg("--config-file")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("proxy binary starts");
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
    let http = client();
    let ready_by = Instant::now() + Duration::from_secs(10);
    loop {
        let up = tokio::net::TcpStream::connect(admin).await.is_ok();
        if up && get(&http, admin, "a", "/readyz", &[]).await.status == 200 {
            break;
        }
        assert!(Instant::now() < ready_by, "proxy became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().expect("the proxy exits");
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stderr).expect("UTF-8 logs")
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_with_fields_as_keys() {
    let logs = tokio::time::timeout(TEST_TIMEOUT, run_with("json"))
        .await
        .expect("in time");
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    let applied = lines
        .iter()
        .find(|l| l["message"] == "config applied")
        .unwrap_or_else(|| panic!("no `config applied` line in {logs}"));
    assert_eq!(applied["level"], "INFO");
    assert_eq!(
        applied["version"], 7,
        "fields are keys of the object: {applied}"
    );
    assert!(applied["timestamp"].is_string());
}

#[tokio::test]
async fn text_logs_carry_no_colour_codes_off_a_terminal() {
    let logs = tokio::time::timeout(TEST_TIMEOUT, run_with("text"))
        .await
        .expect("in time");
    assert!(logs.contains("config applied"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "no escape codes: {logs:?}");
}

/// The `workers` field of the `proxy serving` line of JSON logs.
fn workers(logs: &str) -> u64 {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "proxy serving")
        .and_then(|l| l["workers"].as_u64())
        .unwrap_or_else(|| panic!("no `proxy serving` line naming its workers in {logs}"))
}

/// Without `PROXY_WORKER_THREADS` the proxy runs one worker per CPU it may use: pinned to one
/// CPU (as a cpuset or a one-CPU limit leaves a pod), one worker, however many the machine has.
#[tokio::test]
async fn the_default_worker_count_is_the_cpus_the_process_may_use() {
    let proxy = env!("CARGO_BIN_EXE_cftunnel-proxy");
    let mut pinned = Command::new("taskset");
    pinned
        .args(["-c", "0", proxy])
        .env_remove("PROXY_WORKER_THREADS");
    let logs = tokio::time::timeout(TEST_TIMEOUT, run("json", pinned))
        .await
        .expect("in time");
    assert_eq!(workers(&logs), 1, "pinned to one CPU");

    let mut free = Command::new(proxy);
    free.env_remove("PROXY_WORKER_THREADS");
    let logs = tokio::time::timeout(TEST_TIMEOUT, run("json", free))
        .await
        .expect("in time");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(workers(&logs), cpus as u64, "one per CPU this test may use");

    // The setting wins over the CPU count.
    let mut set = Command::new("taskset");
    set.args(["-c", "0", proxy])
        .env("PROXY_WORKER_THREADS", "3");
    let logs = tokio::time::timeout(TEST_TIMEOUT, run("json", set))
        .await
        .expect("in time");
    assert_eq!(workers(&logs), 3, "PROXY_WORKER_THREADS=3");
}
