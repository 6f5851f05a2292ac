//! The processes of the side-by-side comparison: the nginx backend (`return 200`) on the load
//! CPU, and each reverse proxy alone on the server CPU, all on free 127.0.0.1 ports with
//! their configs and logs in the scratch directory.
//!
//! The three reverse proxies do the same work per request: keep-alive to the client and to
//! the backend, no access log, `X-Forwarded-For` and `X-Forwarded-Proto` added (the proxy
//! always adds them), and no limit on requests per connection (nginx closes a keep-alive
//! connection after 1,000 requests unless told otherwise).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cftunnel_testkit::ports::free_port;

use crate::harness::process::{exchange, CpuList, ServerProcess};
use crate::harness::scenario::tunnel::{self, Connector, Transport};
use crate::harness::scenario::{ScenarioEnv, StartError, Target};

const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// `Host` of the readiness probes; every proxy routes any host.
const PROBE_HOST: &str = "compare.localhost";

/// The backend every row ends at, and its `stub_status` listener, read for the live rate.
pub struct Backend {
    pub process: ServerProcess,
    pub addr: SocketAddr,
    pub status_addr: SocketAddr,
}

/// Where the programs are.
#[derive(Debug, Clone, Default)]
pub struct Programs {
    pub wrk: Option<PathBuf>,
    pub nginx: Option<PathBuf>,
    pub haproxy: Option<PathBuf>,
    pub proxy: PathBuf,
    pub mock_edge: PathBuf,
    pub cloudflared: Option<PathBuf>,
}

/// Temp paths nginx would otherwise put under its compiled-in prefix.
fn nginx_paths(dir: &Path, name: &str) -> String {
    let d = dir.display();
    format!(
        "    client_body_temp_path {d}/{name}-client_body;
    proxy_temp_path {d}/{name}-proxy;
    fastcgi_temp_path {d}/{name}-fastcgi;
    uwsgi_temp_path {d}/{name}-uwsgi;
    scgi_temp_path {d}/{name}-scgi;
"
    )
}

/// The backend: one worker answering `return 200` to everything on `listen`, and
/// `stub_status` on `status`.
pub fn backend_config(dir: &Path, listen: SocketAddr, status: SocketAddr) -> String {
    let d = dir.display();
    let paths = nginx_paths(dir, "backend");
    format!(
        r#"worker_processes 1;
daemon off;
master_process on;
pid {d}/backend.pid;
error_log {d}/backend-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
{paths}    keepalive_requests 1000000;

    server {{
        listen {listen};
        location / {{
            return 200;
        }}
    }}

    server {{
        listen {status};
        location / {{
            stub_status;
        }}
    }}
}}
"#
    )
}

/// nginx as the reverse proxy: one worker, keep-alive upstream.
pub fn nginx_proxy_config(dir: &Path, listen: SocketAddr, backend: SocketAddr) -> String {
    let d = dir.display();
    let paths = nginx_paths(dir, "nginx-proxy");
    format!(
        r#"worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx-proxy.pid;
error_log {d}/nginx-proxy-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
{paths}    keepalive_requests 1000000;

    upstream backend {{
        server {backend};
        keepalive 256;
        keepalive_requests 1000000;
    }}

    server {{
        listen {listen};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }}
    }}
}}
"#
    )
}

/// HAProxy as the reverse proxy: one thread, keep-alive both ways, idle backend
/// connections shared between clients.
pub fn haproxy_config(listen: SocketAddr, backend: SocketAddr) -> String {
    format!(
        r#"global
    nbthread 1
    maxconn 4096

defaults
    mode http
    option http-keep-alive
    option forwardfor
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s

frontend proxy
    bind {listen}
    http-request set-header X-Forwarded-Proto http
    default_backend backend

backend backend
    server backend {backend}
"#
    )
}

/// The proxy's config document: one rule without hostnames or matches, every request to
/// the backend.
pub fn proxy_document(backend: SocketAddr) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "rules": [{ "backends": [{ "url": format!("http://{backend}"), "weight": 1 }] }]
    })
}

/// Settings callers may have in their environment that would move the proxy off its
/// defaults; the comparison measures the defaults.
const PROXY_ENV_REMOVED: [&str; 8] = [
    "TUNNEL_TOKEN",
    "PROXY_CONFIG_FILE",
    "PROXY_AUTH_TOKEN",
    "PROXY_WORKER_THREADS",
    "PROXY_ACCESS_LOG_ENABLED",
    "PROXY_METRICS_ENABLED",
    "PROXY_LOG_FORMAT",
    "RUST_LOG",
];

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, StartError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| StartError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// `nginx -c <conf> -p <dir> -e <error log>`, pinned to `cpus`.
fn spawn_nginx(
    name: &str,
    nginx: &Path,
    conf: &Path,
    dir: &Path,
    cpus: Option<&CpuList>,
) -> Result<ServerProcess, StartError> {
    let args = vec![
        "-c".to_owned(),
        conf.display().to_string(),
        "-p".to_owned(),
        dir.display().to_string(),
        // start-up errors go here too, instead of the packaged /var/log path
        "-e".to_owned(),
        dir.join(format!("{name}-error.log")).display().to_string(),
    ];
    Ok(ServerProcess::spawn(
        name,
        nginx,
        &args,
        &[],
        &[],
        cpus,
        dir,
    )?)
}

/// Starts the backend on `cpus`.
pub async fn start_backend(
    nginx: &Path,
    cpus: Option<&CpuList>,
    dir: &Path,
) -> Result<Backend, StartError> {
    let addr = free_port().map_err(StartError::Port)?;
    let status_addr = free_port().map_err(StartError::Port)?;
    let conf = write(dir, "backend.conf", &backend_config(dir, addr, status_addr))?;
    let mut process = spawn_nginx("backend", nginx, &conf, dir, cpus)?;
    process
        .wait_ready(addr, PROBE_HOST, "/", READY_TIMEOUT)
        .await?;
    Ok(Backend {
        process,
        addr,
        status_addr,
    })
}

/// The requests the backend has answered so far, from its `stub_status` page.
pub async fn backend_requests(status_addr: SocketAddr) -> Option<u64> {
    let (status, body) = exchange(
        status_addr,
        http::Method::GET,
        &status_addr.to_string(),
        "/",
        None,
    )
    .await
    .ok()?;
    (status == 200)
        .then(|| stub_status_requests(&String::from_utf8_lossy(&body)))
        .flatten()
}

/// The `requests` total of an nginx `stub_status` page:
/// `server accepts handled requests\n 66 66 25046`.
pub fn stub_status_requests(page: &str) -> Option<u64> {
    let mut lines = page.lines();
    lines.find(|l| {
        l.trim_start()
            .starts_with("server accepts handled requests")
    })?;
    lines
        .next()?
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
}

/// What a row needs to start.
pub struct RowEnv<'a> {
    pub programs: &'a Programs,
    pub backend: SocketAddr,
    pub load_cpus: Option<&'a CpuList>,
    pub server_cpus: Option<&'a CpuList>,
    pub tunnel: Transport,
    pub tunnel_connections: usize,
    pub dir: &'a Path,
}

/// `cftunnel-proxy` with its defaults (standalone, one worker thread per CPU it may use,
/// metrics on, access log off), routed to the backend by a `PUT /config`.
pub async fn start_proxy(env: &RowEnv<'_>) -> Result<Target, StartError> {
    let bin = &env.programs.proxy;
    if !bin.is_file() {
        return Err(StartError::Skipped(format!(
            "{} not found (cargo build --release -p cftunnel-proxy)",
            bin.display()
        )));
    }
    let data = free_port().map_err(StartError::Port)?;
    let admin = free_port().map_err(StartError::Port)?;
    let vars = vec![
        ("PROXY_ADDR".to_owned(), data.to_string()),
        ("PROXY_CONFIG_ADDR".to_owned(), admin.to_string()),
    ];
    let mut server = ServerProcess::spawn(
        "cftunnel-proxy",
        bin,
        &[],
        &vars,
        &PROXY_ENV_REMOVED,
        env.server_cpus,
        env.dir,
    )?;
    let configured = async {
        server
            .wait_ready(admin, &admin.to_string(), "/healthz", READY_TIMEOUT)
            .await?;
        let doc = proxy_document(env.backend).to_string();
        match exchange(
            admin,
            http::Method::PUT,
            &admin.to_string(),
            "/config",
            Some(doc),
        )
        .await
        {
            Ok((200, _)) => {}
            Ok((status, body)) => {
                return Err(StartError::NotReady(format!(
                    "PUT /config answered {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                )))
            }
            Err(e) => return Err(StartError::NotReady(format!("PUT /config: {e}"))),
        }
        server
            .wait_ready(data, PROBE_HOST, "/", READY_TIMEOUT)
            .await?;
        Ok(())
    };
    if let Err(e) = configured.await {
        server.stop().await;
        return Err(e);
    }
    Ok(plain_target(data, server))
}

fn plain_target(addr: SocketAddr, server: ServerProcess) -> Target {
    Target {
        addr,
        host: PROBE_HOST.to_owned(),
        server: Some(server),
        helpers: Vec::new(),
        edge: None,
    }
}

/// nginx, one worker, as the reverse proxy.
pub async fn start_nginx(env: &RowEnv<'_>) -> Result<Target, StartError> {
    let Some(nginx) = &env.programs.nginx else {
        return Err(StartError::Skipped(
            "nginx is not installed (apt-get install -y nginx)".to_owned(),
        ));
    };
    let listen = free_port().map_err(StartError::Port)?;
    let conf = write(
        env.dir,
        "nginx-proxy.conf",
        &nginx_proxy_config(env.dir, listen, env.backend),
    )?;
    let mut server = spawn_nginx("nginx-proxy", nginx, &conf, env.dir, env.server_cpus)?;
    if let Err(e) = server
        .wait_ready(listen, PROBE_HOST, "/", READY_TIMEOUT)
        .await
    {
        server.stop().await;
        return Err(e.into());
    }
    Ok(plain_target(listen, server))
}

/// HAProxy, one thread, as the reverse proxy (`haproxy -f <conf> -db`: foreground).
pub async fn start_haproxy(env: &RowEnv<'_>) -> Result<Target, StartError> {
    let Some(haproxy) = &env.programs.haproxy else {
        return Err(StartError::Skipped(
            "haproxy is not installed (apt-get install -y haproxy)".to_owned(),
        ));
    };
    let listen = free_port().map_err(StartError::Port)?;
    let conf = write(env.dir, "haproxy.cfg", &haproxy_config(listen, env.backend))?;
    let args = vec![
        "-f".to_owned(),
        conf.display().to_string(),
        "-db".to_owned(),
    ];
    let mut server = ServerProcess::spawn(
        "haproxy",
        haproxy,
        &args,
        &[],
        &[],
        env.server_cpus,
        env.dir,
    )?;
    if let Err(e) = server
        .wait_ready(listen, PROBE_HOST, "/", READY_TIMEOUT)
        .await
    {
        server.stop().await;
        return Err(e.into());
    }
    Ok(plain_target(listen, server))
}

/// A connector behind `cftunnel-mock-edge`: the edge's plain-HTTP listener takes the load
/// and forwards it over the tunnel; the edge runs on the load CPU (it stands for
/// Cloudflare's network), the connector alone on the server CPU.
pub async fn start_tunnel(env: &RowEnv<'_>, connector: Connector) -> Result<Target, StartError> {
    if connector == Connector::Cloudflared && env.programs.cloudflared.is_none() {
        return Err(StartError::Skipped(
            "set CLOUDFLARED=/path/to/cloudflared (or --cloudflared) to compare with cloudflared"
                .to_owned(),
        ));
    }
    let scenario_env = ScenarioEnv {
        echo_addr: env.backend,
        workers: 1,
        tunnel_connections: env.tunnel_connections,
        server_cpus: env.server_cpus,
        proxy_bin: &env.programs.proxy,
        edge_bin: &env.programs.mock_edge,
        client_cpus: env.load_cpus,
        nginx_bin: None,
        cloudflared_bin: env.programs.cloudflared.as_deref(),
        scratch: env.dir,
    };
    tunnel::start(&scenario_env, env.tunnel, connector).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn the_backend_answers_200_and_shows_its_status_elsewhere() {
        let conf = backend_config(
            Path::new("/tmp/cmp"),
            addr("127.0.0.1:18000"),
            addr("127.0.0.1:18001"),
        );
        assert!(conf.contains("worker_processes 1;"));
        assert!(
            conf.contains("listen 127.0.0.1:18000;\n        location / {\n            return 200;")
        );
        assert!(conf
            .contains("listen 127.0.0.1:18001;\n        location / {\n            stub_status;"));
        assert!(conf.contains("keepalive_requests 1000000;"));
        assert!(conf.contains("access_log off;"));
        assert!(conf.contains("pid /tmp/cmp/backend.pid;"));
    }

    #[test]
    fn the_reverse_proxies_do_the_same_work() {
        let listen = addr("127.0.0.1:18080");
        let backend = addr("127.0.0.1:18000");
        let nginx = nginx_proxy_config(Path::new("/tmp/cmp"), listen, backend);
        for line in [
            "worker_processes 1;",
            "server 127.0.0.1:18000;",
            "keepalive 256;",
            "listen 127.0.0.1:18080;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
            "proxy_set_header X-Forwarded-Proto $scheme;",
            "access_log off;",
        ] {
            assert!(nginx.contains(line), "nginx: {line}");
        }
        let haproxy = haproxy_config(listen, backend);
        for line in [
            "nbthread 1",
            "bind 127.0.0.1:18080",
            "server backend 127.0.0.1:18000",
            "option http-keep-alive",
            "option forwardfor",
            "http-request set-header X-Forwarded-Proto http",
            "http-reuse always",
        ] {
            assert!(haproxy.contains(line), "haproxy: {line}");
        }
        assert!(!haproxy.contains("log "), "no request log");
        let doc = proxy_document(backend);
        assert_eq!(
            doc["rules"][0]["backends"][0]["url"],
            "http://127.0.0.1:18000"
        );
        assert!(doc["rules"][0].get("hostnames").is_none(), "any host");
    }

    #[test]
    fn the_live_rate_reads_the_backend_request_total() {
        let page = "Active connections: 1 \nserver accepts handled requests\n 66 66 25046 \nReading: 0 Writing: 1 Waiting: 0 \n";
        assert_eq!(stub_status_requests(page), Some(25_046));
        assert_eq!(stub_status_requests("nothing"), None);
    }
}
