//! `cftunnel-proxy` in tunnel mode behind `cftunnel-mock-edge`: load enters at the mock
//! edge's plain-HTTP listener, crosses one QUIC or HTTP/2 tunnel connection to the proxy, and
//! the proxy forwards it to the echo backend with the same one-rule config as `proxy`.
//!
//! Pinning: the proxy (the server under test, measured) runs on the server CPUs with the
//! usual worker count; the mock edge stands in for Cloudflare's network, so it runs on the
//! load generator's CPUs like the other client-side work.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cftunnel_testkit::ports::free_port;

use super::super::process::{exchange, CpuList, ServerProcess};
use super::{ScenarioEnv, StartError, Target, LOAD_HOST};

const EDGE_READY_TIMEOUT: Duration = Duration::from_secs(10);
const PROXY_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// From the proxy's readiness to the first request answered through the edge.
const FORWARD_READY_TIMEOUT: Duration = Duration::from_secs(10);
const CA_POLL: Duration = Duration::from_millis(20);
/// Attempts at finding a port free for both TCP and UDP.
const EDGE_PORT_ATTEMPTS: usize = 20;
/// Mock edge admin path that answers 200 as soon as its HTTP listener is up.
const EDGE_ADMIN_PATH: &str = "/__mock-edge/connections";
/// Mock edge admin path that makes a JSON body the tunnel's configuration (`cloudflared`'s
/// ingress), pushed to every connection as it registers.
const EDGE_CONFIG_PATH: &str = "/__mock-edge/config?version=1";
/// Echo backend path that answers 200; used to see a request cross the whole chain.
const ECHO_HEALTH_PATH: &str = "/health";

/// The tunnel transport between the mock edge and the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Quic,
    Http2,
}

impl Transport {
    /// The value of `PROXY_TUNNEL_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quic => "quic",
            Self::Http2 => "http2",
        }
    }
}

/// A tunnel token for the mock edge, which accepts any credentials unless started with
/// `--token`.
fn token() -> String {
    cftunnel_tunnel::Token::new("loadtest", vec![7u8; 32], uuid::Uuid::new_v4()).encode()
}

/// A 127.0.0.1 address whose port is free for TCP and UDP (the edge serves HTTP/2 over TCP
/// and QUIC over UDP on one port). Picked and released before the mock edge binds it, as by
/// `free_port`: below the ephemeral range, where outgoing connections and the connector's
/// UDP sockets do not land.
fn free_edge_addr() -> std::io::Result<SocketAddr> {
    let mut last = None;
    for _ in 0..EDGE_PORT_ATTEMPTS {
        let addr = free_port()?;
        match std::net::UdpSocket::bind(addr) {
            Ok(_) => return Ok(addr),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port free for both TCP and UDP")))
}

/// Environment of the mock edge child: warnings only (no per-connection info lines), and as
/// many runtime threads as it has CPUs.
pub(crate) fn edge_env(cpus: Option<&CpuList>) -> Vec<(String, String)> {
    let mut env = vec![("RUST_LOG".to_owned(), "warn".to_owned())];
    if let Some(cpus) = cpus {
        env.push((
            "TOKIO_WORKER_THREADS".to_owned(),
            cpus.count().max(1).to_string(),
        ));
    }
    env
}

/// Environment of the proxy child in tunnel mode.
pub(crate) fn proxy_env(
    transport: Transport,
    token: String,
    edge: SocketAddr,
    ca: &Path,
    admin: SocketAddr,
    workers: usize,
    connections: usize,
) -> Vec<(String, String)> {
    // The connector opens one HA connection per edge address (up to four); the mock edge
    // has one address, so it is listed once per connection wanted.
    let edges = vec![edge.to_string(); connections.max(1)].join(",");
    vec![
        ("TUNNEL_TOKEN".to_owned(), token),
        ("TUNNEL_EDGE".to_owned(), edges),
        ("TUNNEL_CACERT".to_owned(), ca.display().to_string()),
        (
            "PROXY_TUNNEL_PROTOCOL".to_owned(),
            transport.as_str().to_owned(),
        ),
        ("PROXY_CONFIG_ADDR".to_owned(), admin.to_string()),
        ("PROXY_WORKER_THREADS".to_owned(), workers.to_string()),
        ("PROXY_ACCESS_LOG_ENABLED".to_owned(), "false".to_owned()),
        ("PROXY_GRACE_PERIOD".to_owned(), "1s".to_owned()),
    ]
}

/// The mock edge as a child process with its plain-HTTP listener in front, and `connector`
/// (the proxy in tunnel mode, or `cloudflared` with the one-rule ingress pushed through the
/// edge's admin API) behind it; load goes to the returned address.
pub async fn start(
    env: &ScenarioEnv<'_>,
    transport: Transport,
    connector: Connector,
) -> Result<Target, StartError> {
    let cloudflared = match connector {
        Connector::Proxy => None,
        Connector::Cloudflared => Some(require_cloudflared(env)?),
    };
    let mut needed = vec![(env.edge_bin, "cftunnel-testkit")];
    if cloudflared.is_none() {
        needed.push((env.proxy_bin, "cftunnel-proxy"));
    }
    for (bin, package) in needed {
        if !bin.is_file() {
            return Err(StartError::Skipped(format!(
                "{} not found (cargo build --release -p {package})",
                bin.display()
            )));
        }
    }
    let proto = transport.as_str();
    let config_path = super::proxy::write_scratch(
        env,
        &format!("tunnel-{proto}-config.json"),
        super::proxy::config_document(env.echo_addr).to_string(),
    )
    .await?;
    let ca_path = env.scratch.join(format!("mock-edge-{proto}-ca.pem"));
    // A CA from an earlier round must not be mistaken for this edge's.
    let _ = tokio::fs::remove_file(&ca_path).await;

    let edge_addr = free_edge_addr().map_err(StartError::Port)?;
    let edge_http = free_port().map_err(StartError::Port)?;
    let edge_args = vec![
        "--listen".to_owned(),
        edge_addr.to_string(),
        "--http".to_owned(),
        edge_http.to_string(),
        "--ca-out".to_owned(),
        ca_path.display().to_string(),
    ];
    let mut edge = ServerProcess::spawn(
        &format!("mock-edge-{proto}"),
        env.edge_bin,
        &edge_args,
        &edge_env(env.client_cpus),
        &[
            "MOCK_EDGE_TOKEN",
            "MOCK_EDGE_LISTEN",
            "MOCK_EDGE_HTTP",
            "MOCK_EDGE_CA_OUT",
        ],
        env.client_cpus,
        env.scratch,
    )?;
    if let Err(e) = edge
        .wait_ready(
            edge_http,
            &edge_http.to_string(),
            EDGE_ADMIN_PATH,
            EDGE_READY_TIMEOUT,
        )
        .await
    {
        edge.stop().await;
        return Err(e.into());
    }
    if let Err(e) = wait_for_ca(&ca_path, EDGE_READY_TIMEOUT).await {
        edge.stop().await;
        return Err(e);
    }

    let proxy = match cloudflared {
        None => start_proxy(env, transport, edge_addr, &ca_path, &config_path).await,
        Some(bin) => {
            let body = cloudflared_ingress(env.echo_addr).to_string();
            match exchange(
                edge_http,
                http::Method::PUT,
                &edge_http.to_string(),
                EDGE_CONFIG_PATH,
                Some(body),
            )
            .await
            {
                Ok((200, _)) => start_cloudflared(env, bin, transport, edge_addr, &ca_path),
                Ok((status, body)) => Err(StartError::NotReady(format!(
                    "the mock edge answered {status} to the configuration push: {}",
                    String::from_utf8_lossy(&body).trim()
                ))),
                Err(e) => Err(StartError::NotReady(format!(
                    "pushing the configuration to the mock edge: {e}"
                ))),
            }
        }
    };
    let proxy = match proxy {
        Ok(proxy) => proxy,
        Err(e) => {
            edge.stop().await;
            return Err(e);
        }
    };
    // Registered is not yet routed: wait for a request to cross edge, tunnel and proxy.
    if let Err(e) = edge
        .wait_ready(
            edge_http,
            LOAD_HOST,
            ECHO_HEALTH_PATH,
            FORWARD_READY_TIMEOUT,
        )
        .await
    {
        let proxy_log = proxy.log_tail().await;
        proxy.stop().await;
        edge.stop().await;
        return Err(StartError::NotReady(format!(
            "no answer through the {proto} tunnel: {e}\nconnector log:\n{proxy_log}"
        )));
    }
    Ok(Target {
        addr: edge_http,
        host: LOAD_HOST.to_owned(),
        server: Some(proxy),
        helpers: vec![edge],
        edge: None,
    })
}

/// Who answers the tunnel connections of the in-process mock edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connector {
    /// `cftunnel-proxy` in tunnel mode, with the one-rule config of `proxy`.
    Proxy,
    /// `cloudflared`, with one catch-all ingress rule to the echo backend, pushed by the
    /// edge as Cloudflare's edge pushes a remotely managed tunnel's configuration.
    Cloudflared,
}

/// The proxy (or `cloudflared`) in tunnel mode behind a mock edge that runs inside this
/// process (on the load generator's CPUs): the load is handed to the edge directly, as
/// Cloudflare's network hands an eyeball request to a tunnel connection.
pub(super) async fn start_in_process(
    env: &ScenarioEnv<'_>,
    transport: Transport,
    connector: Connector,
) -> Result<Target, StartError> {
    let cloudflared = match connector {
        Connector::Proxy => {
            super::proxy::require_proxy(env)?;
            None
        }
        Connector::Cloudflared => Some(require_cloudflared(env)?),
    };
    let proto = transport.as_str();
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut builder = cftunnel_testkit::edge::MockEdge::builder()
        .edge_addr(free_edge_addr().map_err(StartError::Port)?)
        .http_addr(localhost);
    if transport == Transport::Http2 {
        builder = builder.disable_quic();
    }
    let edge = builder
        .start()
        .await
        .map_err(|e| StartError::NotReady(format!("in-process mock edge: {e}")))?;
    let ca_path = env
        .scratch
        .join(format!("mock-edge-{proto}-in-process-ca.pem"));
    if let Err(source) = edge.write_ca_pem(&ca_path).await {
        edge.shutdown().await;
        return Err(StartError::Write {
            path: ca_path,
            source,
        });
    }
    let server = match cloudflared {
        None => start_edge_proxy(env, transport, edge.edge_addr(), &ca_path).await,
        Some(bin) => {
            // Kept by the edge and sent to each connection as it registers.
            edge.push_config(1, cloudflared_ingress(env.echo_addr).to_string().as_bytes())
                .await;
            start_cloudflared(env, bin, transport, edge.edge_addr(), &ca_path)
        }
    };
    let server = match server {
        Ok(server) => server,
        Err(e) => {
            edge.shutdown().await;
            return Err(e);
        }
    };
    let edge = std::sync::Arc::new(edge);
    let deadline = tokio::time::Instant::now() + FORWARD_READY_TIMEOUT;
    loop {
        let req = http::Request::get(ECHO_HEALTH_PATH)
            .header(http::header::HOST, LOAD_HOST)
            .body(http_body_util::Empty::<bytes::Bytes>::new());
        let status = match req {
            Ok(req) => edge.request(req).await.status(),
            Err(_) => http::StatusCode::BAD_REQUEST,
        };
        if status == http::StatusCode::OK {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let log = server.log_tail().await;
            server.stop().await;
            return Err(StartError::NotReady(format!(
                "no answer through the in-process {proto} edge (last status {status})\nserver log:\n{log}"
            )));
        }
        tokio::time::sleep(CA_POLL).await;
    }
    // The first connection answers before the others have registered; the load waits for
    // all of them so every round runs on the same number.
    let wanted = env.tunnel_connections.max(1);
    if tokio::time::timeout(FORWARD_READY_TIMEOUT, edge.wait_serving(wanted))
        .await
        .is_err()
    {
        let serving = edge.serving();
        server.stop().await;
        return Err(StartError::NotReady(format!(
            "{serving} of {wanted} tunnel connections registered with the in-process {proto} edge"
        )));
    }
    Ok(Target {
        addr: edge.http_addr(),
        host: LOAD_HOST.to_owned(),
        server: Some(server),
        helpers: Vec::new(),
        edge: Some(super::InProcessEdge(edge)),
    })
}

/// The `cloudflared` binary, or why the scenario is skipped.
fn require_cloudflared<'a>(env: &ScenarioEnv<'a>) -> Result<&'a Path, StartError> {
    env.cloudflared_bin.ok_or_else(|| {
        StartError::Skipped(
            "no cloudflared binary (--cloudflared-bin, $CLOUDFLARED or cloudflared on PATH)"
                .to_owned(),
        )
    })
}

/// The proxy in tunnel mode with the one-rule config of `proxy`, for the in-process edge.
async fn start_edge_proxy(
    env: &ScenarioEnv<'_>,
    transport: Transport,
    edge_addr: SocketAddr,
    ca_path: &Path,
) -> Result<ServerProcess, StartError> {
    let config = super::proxy::write_scratch(
        env,
        &format!("tunnel-{}-edge-config.json", transport.as_str()),
        super::proxy::config_document(env.echo_addr).to_string(),
    )
    .await?;
    start_proxy(env, transport, edge_addr, ca_path, &config).await
}

/// `cloudflared`'s remotely managed configuration: every request to the echo backend.
pub(crate) fn cloudflared_ingress(echo: SocketAddr) -> serde_json::Value {
    serde_json::json!({
        "ingress": [{ "service": format!("http://{echo}") }],
        "warp-routing": {},
        "originRequest": {}
    })
}

/// `cloudflared tunnel ... run` against the mock edge: as many HA connections as the proxy
/// gets (the edge listed once per connection), no update checks or start-up pre-checks,
/// warnings only, and as many Go threads running code as the proxy has workers.
pub(crate) fn cloudflared_args(
    transport: Transport,
    edge: SocketAddr,
    ca: &Path,
    metrics: SocketAddr,
    connections: usize,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "tunnel",
        "--no-autoupdate",
        "--no-prechecks",
        "--loglevel",
        "warn",
        "--transport-loglevel",
        "warn",
        "--grace-period",
        "1s",
        "--metrics",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(metrics.to_string());
    args.push("--cacert".to_owned());
    args.push(ca.display().to_string());
    for _ in 0..connections.max(1) {
        args.push("--edge".to_owned());
        args.push(edge.to_string());
    }
    args.extend([
        "--protocol".to_owned(),
        transport.as_str().to_owned(),
        "run".to_owned(),
        "--token".to_owned(),
        token(),
    ]);
    args
}

fn start_cloudflared(
    env: &ScenarioEnv<'_>,
    bin: &Path,
    transport: Transport,
    edge_addr: SocketAddr,
    ca_path: &Path,
) -> Result<ServerProcess, StartError> {
    let metrics = free_port().map_err(StartError::Port)?;
    let args = cloudflared_args(
        transport,
        edge_addr,
        ca_path,
        metrics,
        env.tunnel_connections,
    );
    let vars = [("GOMAXPROCS".to_owned(), env.workers.to_string())];
    Ok(ServerProcess::spawn(
        &format!("cloudflared-{}", transport.as_str()),
        bin,
        &args,
        &vars,
        // Its settings come from the arguments alone.
        &[
            "TUNNEL_TOKEN",
            "TUNNEL_EDGE",
            "TUNNEL_CACERT",
            "TUNNEL_TRANSPORT_PROTOCOL",
        ],
        env.server_cpus,
        env.scratch,
    )?)
}

async fn start_proxy(
    env: &ScenarioEnv<'_>,
    transport: Transport,
    edge_addr: SocketAddr,
    ca_path: &Path,
    config_path: &Path,
) -> Result<ServerProcess, StartError> {
    let admin = free_port().map_err(StartError::Port)?;
    let args = vec![
        "--config-file".to_owned(),
        config_path.display().to_string(),
    ];
    let env_vars = proxy_env(
        transport,
        token(),
        edge_addr,
        ca_path,
        admin,
        env.workers,
        env.tunnel_connections,
    );
    let mut proxy = ServerProcess::spawn(
        &format!("proxy-tunnel-{}", transport.as_str()),
        env.proxy_bin,
        &args,
        &env_vars,
        // Nothing from the caller's environment may change the edge or the data listener.
        &["PROXY_CONFIG_FILE", "PROXY_ADDR", "PROXY_AUTH_TOKEN"],
        env.server_cpus,
        env.scratch,
    )?;
    if let Err(e) = proxy
        .wait_ready(admin, &admin.to_string(), "/readyz", PROXY_READY_TIMEOUT)
        .await
    {
        proxy.stop().await;
        return Err(e.into());
    }
    Ok(proxy)
}

/// Waits until the mock edge has written its whole CA certificate (the proxy reads it once at
/// start).
async fn wait_for_ca(path: &Path, timeout: Duration) -> Result<(), StartError> {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if let Ok(pem) = tokio::fs::read_to_string(path).await {
            if pem.trim_end().ends_with("-----END CERTIFICATE-----") {
                return Ok(());
            }
        }
        tokio::time::sleep(CA_POLL).await;
    }
    Err(StartError::NotReady(format!(
        "the mock edge did not write {} within {timeout:?}",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_gets_the_edge_ca_protocol_and_worker_count() {
        let edge: SocketAddr = "127.0.0.1:17844".parse().expect("addr");
        let admin: SocketAddr = "127.0.0.1:18081".parse().expect("addr");
        let vars = proxy_env(
            Transport::Http2,
            "tok".to_owned(),
            edge,
            Path::new("/tmp/lt/ca.pem"),
            admin,
            2,
            3,
        );
        let get = |k: &str| {
            vars.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("TUNNEL_TOKEN"), Some("tok"));
        assert_eq!(
            get("TUNNEL_EDGE"),
            Some("127.0.0.1:17844,127.0.0.1:17844,127.0.0.1:17844"),
            "one entry per HA connection"
        );
        assert_eq!(get("TUNNEL_CACERT"), Some("/tmp/lt/ca.pem"));
        assert_eq!(get("PROXY_TUNNEL_PROTOCOL"), Some("http2"));
        assert_eq!(get("PROXY_CONFIG_ADDR"), Some("127.0.0.1:18081"));
        assert_eq!(get("PROXY_WORKER_THREADS"), Some("2"));
        assert_eq!(get("PROXY_ACCESS_LOG_ENABLED"), Some("false"));
        assert_eq!(get("PROXY_ADDR"), None, "tunnel mode has no data listener");
        assert_eq!(Transport::Quic.as_str(), "quic");
    }

    #[test]
    fn cloudflared_gets_the_edge_once_per_connection_and_the_protocol() {
        let edge: SocketAddr = "127.0.0.1:17844".parse().expect("addr");
        let metrics: SocketAddr = "127.0.0.1:19090".parse().expect("addr");
        let args = cloudflared_args(Transport::Http2, edge, Path::new("/tmp/ca.pem"), metrics, 3);
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .map(String::as_str)
        };
        assert_eq!(args.first().map(String::as_str), Some("tunnel"));
        assert_eq!(args.iter().filter(|a| *a == "--edge").count(), 3);
        assert_eq!(after("--edge"), Some("127.0.0.1:17844"));
        assert_eq!(after("--cacert"), Some("/tmp/ca.pem"));
        assert_eq!(after("--protocol"), Some("http2"));
        assert_eq!(after("--metrics"), Some("127.0.0.1:19090"));
        let run = args.iter().position(|a| a == "run").expect("run");
        assert!(args[..run].contains(&"--no-autoupdate".to_owned()));
        assert!(after("--token").is_some_and(|t| t.parse::<cftunnel_tunnel::Token>().is_ok()));
        let ingress = cloudflared_ingress(edge);
        assert_eq!(ingress["ingress"][0]["service"], "http://127.0.0.1:17844");
    }

    #[test]
    fn the_token_decodes() {
        let raw = token();
        let parsed: Result<cftunnel_tunnel::Token, _> = raw.parse();
        assert!(parsed.is_ok(), "{raw}");
    }

    #[test]
    fn the_mock_edge_gets_one_runtime_thread_per_client_cpu() {
        let cpus: CpuList = "0,2".parse().expect("valid");
        let vars = edge_env(Some(&cpus));
        assert!(vars.contains(&("TOKIO_WORKER_THREADS".to_owned(), "2".to_owned())));
        assert!(vars.contains(&("RUST_LOG".to_owned(), "warn".to_owned())));
        assert!(!edge_env(None)
            .iter()
            .any(|(k, _)| k == "TOKIO_WORKER_THREADS"));
    }

    #[test]
    fn the_edge_port_is_free_for_tcp_and_udp_below_the_ephemeral_range() {
        let addr = free_edge_addr().expect("a free port");
        assert!(addr.ip().is_loopback());
        assert!(addr.port() < 32_768, "{addr}: in the ephemeral range");
        assert!(std::net::TcpListener::bind(addr).is_ok());
        assert!(std::net::UdpSocket::bind(addr).is_ok());
    }
}
