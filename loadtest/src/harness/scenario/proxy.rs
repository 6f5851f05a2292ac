//! `cftunnel-proxy` standalone: `--config-file` with one catch-all rule to the echo backend,
//! data and config listeners on free 127.0.0.1 ports, ready when `/readyz` answers 200.

use std::time::Duration;

use cftunnel_testkit::ports::free_port;

use super::super::process::ServerProcess;
use super::{ScenarioEnv, StartError, Target};

const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The config document (proxy contract): one rule without hostnames or matches, so every
/// request goes to the single backend.
pub(crate) fn config_document(echo: std::net::SocketAddr) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "rules": [{ "backends": [{ "url": format!("http://{echo}"), "weight": 1 }] }]
    })
}

/// Skips the scenario when the proxy binary has not been built.
pub(super) fn require_proxy(env: &ScenarioEnv<'_>) -> Result<(), StartError> {
    if env.proxy_bin.is_file() {
        return Ok(());
    }
    Err(StartError::Skipped(format!(
        "{} not found (cargo build --release -p cftunnel-proxy)",
        env.proxy_bin.display()
    )))
}

/// Writes `contents` to `name` in the scratch directory.
pub(super) async fn write_scratch(
    env: &ScenarioEnv<'_>,
    name: &str,
    contents: String,
) -> Result<std::path::PathBuf, StartError> {
    let path = env.scratch.join(name);
    tokio::fs::write(&path, contents)
        .await
        .map_err(|source| StartError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

pub(super) async fn start(env: &ScenarioEnv<'_>) -> Result<Target, StartError> {
    require_proxy(env)?;
    let config_path = write_scratch(
        env,
        "proxy-config.json",
        config_document(env.echo_addr).to_string(),
    )
    .await?;
    let data = free_port().map_err(StartError::Port)?;
    let admin = free_port().map_err(StartError::Port)?;
    let args = vec![
        "--config-file".to_owned(),
        config_path.display().to_string(),
    ];
    let env_vars = vec![
        ("PROXY_ADDR".to_owned(), data.to_string()),
        ("PROXY_CONFIG_ADDR".to_owned(), admin.to_string()),
        ("PROXY_WORKER_THREADS".to_owned(), env.workers.to_string()),
        ("PROXY_ACCESS_LOG_ENABLED".to_owned(), "false".to_owned()),
        ("PROXY_GRACE_PERIOD".to_owned(), "1s".to_owned()),
    ];
    let mut server = ServerProcess::spawn(
        "proxy",
        env.proxy_bin,
        &args,
        &env_vars,
        // Standalone mode: no connector token may leak in from the caller's environment.
        &["TUNNEL_TOKEN", "PROXY_CONFIG_FILE"],
        env.server_cpus,
        env.scratch,
    )?;
    server
        .wait_ready(admin, &admin.to_string(), "/readyz", READY_TIMEOUT)
        .await?;
    Ok(Target {
        addr: data,
        host: super::LOAD_HOST.to_owned(),
        server: Some(server),
        helpers: Vec::new(),
        edge: None,
    })
}
