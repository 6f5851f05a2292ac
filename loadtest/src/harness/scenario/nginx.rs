//! nginx as the comparison reverse proxy: same single upstream, keep-alive to it, no access
//! log, `worker_processes` equal to the proxy's worker threads.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cftunnel_testkit::ports::free_port;

use super::super::process::ServerProcess;
use super::{ScenarioEnv, StartError, Target};

const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The generated `nginx.conf`; every path nginx writes lives under `dir`.
pub(crate) fn config(dir: &Path, listen: SocketAddr, echo: SocketAddr, workers: usize) -> String {
    let d = dir.display();
    format!(
        r#"worker_processes {workers};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;

    upstream echo {{
        server {echo};
        keepalive 256;
        keepalive_requests 1000000;
    }}

    server {{
        listen {listen};
        location / {{
            proxy_pass http://echo;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
        }}
    }}
}}
"#
    )
}

pub(super) async fn start(env: &ScenarioEnv<'_>) -> Result<Target, StartError> {
    let Some(nginx) = env.nginx_bin else {
        return Err(StartError::Skipped(
            "nginx is not installed (apt-get install -y nginx)".to_owned(),
        ));
    };
    let listen = free_port().map_err(StartError::Port)?;
    let conf = config(env.scratch, listen, env.echo_addr, env.workers);
    let conf_path = super::proxy::write_scratch(env, "nginx.conf", conf).await?;
    let args = vec![
        "-c".to_owned(),
        conf_path.display().to_string(),
        "-p".to_owned(),
        env.scratch.display().to_string(),
        // start-up errors go here too, instead of the packaged /var/log path
        "-e".to_owned(),
        env.scratch.join("nginx-error.log").display().to_string(),
    ];
    let mut server = ServerProcess::spawn(
        "nginx",
        nginx,
        &args,
        &[],
        &[],
        env.server_cpus,
        env.scratch,
    )?;
    server
        .wait_ready(listen, &listen.to_string(), "/health", READY_TIMEOUT)
        .await?;
    Ok(Target {
        addr: listen,
        host: super::LOAD_HOST.to_owned(),
        server: Some(server),
        helpers: Vec::new(),
        edge: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keeps_everything_in_the_scratch_dir() {
        let listen: SocketAddr = "127.0.0.1:18080".parse().expect("addr");
        let echo: SocketAddr = "127.0.0.1:13000".parse().expect("addr");
        let conf = config(Path::new("/tmp/lt"), listen, echo, 2);
        assert!(conf.contains("worker_processes 2;"));
        assert!(conf.contains("pid /tmp/lt/nginx.pid;"));
        assert!(conf.contains("server 127.0.0.1:13000;"));
        assert!(conf.contains("keepalive 256;"));
        assert!(conf.contains("listen 127.0.0.1:18080;"));
        assert!(conf.contains("proxy_http_version 1.1;"));
        assert!(conf.contains("proxy_set_header Connection \"\";"));
        assert!(conf.contains("access_log off;"));
        assert!(conf.contains("daemon off;"));
    }
}
