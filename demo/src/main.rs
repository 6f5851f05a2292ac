//! `cftunnel-demo`: the whole request path on one machine, in one process.
//!
//! A mock of Cloudflare's edge (QUIC and HTTP/2 listeners for connectors, a plain-HTTP
//! listener standing in for the eyeball side), the proxy in tunnel mode (the same lifecycle as
//! the `cftunnel-proxy` binary: it registers with the edge, serves through the tunnel and
//! drains on Ctrl-C) with one route, and an echo backend. It sends one request through the
//! edge, prints what came back, and keeps serving until Ctrl-C.
//!
//! The edge is a test double: nothing here talks to Cloudflare.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};
use cftunnel_testkit::edge::MockEdge;
use clap::Parser;
use http_body_util::{BodyExt, Empty};

/// The hostname the demo route serves.
const HOST: &str = "demo.localhost";

/// Runs a mock Cloudflare edge, the proxy in tunnel mode and an echo backend, and sends a
/// request through them.
#[derive(Debug, Parser)]
#[command(name = "cftunnel-demo", version)]
struct Args {
    /// Where the mock edge takes the eyeballs' plain-HTTP requests (what you curl).
    #[arg(long, default_value = "127.0.0.1:8088")]
    http: SocketAddr,
    /// Tunnel transport: `quic` or `http2`.
    #[arg(long, default_value = "quic")]
    protocol: String,
    /// Stop after the first request instead of serving until Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Log lines on stderr: `json` or `text`.
    #[arg(long, value_enum, default_value = "text")]
    log_format: cftunnel_telemetry::LogFormat,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(e) = cftunnel_telemetry::init_logs(args.log_format) {
        eprintln!("error: installing the log subscriber: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let workers = runtime.metrics().num_workers();
    match runtime.block_on(run(args, workers)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Stops the proxy on a signal or, once, when the demo asks (`--once`).
struct Stop {
    signals: cftunnel_proxy::process::Signals,
    /// The demo's own request, until it has come.
    requested: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl cftunnel_proxy::process::Stop for Stop {
    async fn next(&mut self) {
        let Some(requested) = self.requested.as_mut() else {
            return self.signals.next().await;
        };
        tokio::select! {
            _ = self.signals.next() => {}
            asked = requested => {
                self.requested = None;
                if asked.is_err() {
                    // The demo can no longer ask: only a signal stops it.
                    self.signals.next().await;
                }
            }
        }
    }
}

async fn run(args: Args, workers: usize) -> anyhow::Result<()> {
    let signals = cftunnel_proxy::process::Signals::new()?;
    let echo = EchoServer::start(EchoConfig {
        http_addr: "127.0.0.1:0".parse()?,
        h2c_addr: "127.0.0.1:0".parse()?,
        identity: EchoIdentity {
            namespace: "demo".to_owned(),
            pod: "echo-1".to_owned(),
        },
        record_log: false,
        print_log: false,
    })
    .await
    .context("starting the echo backend")?;
    let token = cftunnel_config::Token::new("demo-account", vec![7; 32], uuid::Uuid::new_v4());
    let edge = MockEdge::builder()
        .edge_addr("127.0.0.1:0".parse()?)
        .http_addr(args.http)
        .credentials(token.clone())
        .start()
        .await
        .with_context(|| format!("starting the mock edge (eyeball listener {})", args.http))?;
    let dir = std::env::temp_dir().join(format!("cftunnel-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating a scratch directory")?;
    let ca = dir.join("edge-ca.pem");
    edge.write_ca_pem(&ca)
        .await
        .context("writing the edge's CA")?;
    let config = dir.join("config.json");
    let route = serde_json::json!({"version": 1, "rules": [{
        "name": "demo/echo/0",
        "hostnames": [HOST],
        "backends": [{"url": format!("http://{}", echo.http_addr()), "weight": 1}]
    }]});
    std::fs::write(&config, route.to_string()).context("writing the route")?;

    let proxy_args = cftunnel_proxy::cli::Args::try_parse_from([
        "cftunnel-proxy".as_ref(),
        "--tunnel-token".as_ref(),
        token.encode().as_ref(),
        "--edge".as_ref(),
        edge.edge_addr().to_string().as_ref(),
        "--edge-ca-file".as_ref(),
        ca.as_os_str(),
        "--tunnel-protocol".as_ref(),
        args.protocol.as_ref(),
        "--config-addr".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--auth-token".as_ref(),
        "demo".as_ref(),
        "--grace-period".as_ref(),
        "1s".as_ref(),
        "--config-file".as_ref(),
        config.as_os_str(),
    ] as [&std::ffi::OsStr; 17])
    .context("the proxy's settings")?;
    let (stop, requested) = tokio::sync::oneshot::channel();
    let proxy = tokio::spawn(cftunnel_proxy::process::run(
        proxy_args,
        workers,
        Stop {
            signals,
            requested: Some(requested),
        },
    ));

    // Registered with the edge: the edge now routes the tunnel's requests to the proxy.
    let by = Instant::now() + Duration::from_secs(20);
    while edge.serving() == 0 {
        if proxy.is_finished() || Instant::now() > by {
            let _ = stop.send(());
            return match proxy.await {
                Ok(Err(e)) => Err(e.context("the proxy did not start")),
                _ => anyhow::bail!("the proxy did not register with the edge in 20 s"),
            };
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let url = format!("http://{}/hello", edge.http_addr());
    println!(
        "tunnel up over {}: eyeball -> mock edge -> tunnel -> proxy -> echo backend",
        args.protocol
    );
    let (status, body) = get(edge.http_addr(), "/hello").await?;
    println!("GET {url} (Host: {HOST}) -> {status}");
    println!("{body}");
    if args.once {
        let _ = stop.send(());
    } else {
        println!("\ntry it:  curl -H 'Host: {HOST}' {url}\nCtrl-C drains the proxy and stops.");
    }
    let result = proxy.await.context("the proxy task")?;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// One request through the edge's eyeball listener; the status and the body as text.
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the mock edge at {addr}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, HOST)
        .body(Empty::<Bytes>::new())?;
    let res = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .context("no answer through the tunnel in 10 s")??;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
