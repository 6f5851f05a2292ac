//! `cftunnel-echo`: the echo backend as a process, configured like echo-basic.

use std::net::SocketAddr;

use anyhow::Context;
use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};
use clap::Parser;

/// mimalloc, as the proxy uses: the backend allocates per request, and glibc's malloc would
/// cost several times more there, on the same cores as the server under test.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

/// Gateway API conformance echo backend (echo-basic compatible).
#[derive(Parser, Debug)]
#[command(name = "cftunnel-echo", version)]
struct Args {
    /// HTTP/1.1 (and HTTP/2 prior knowledge) listen address.
    #[arg(long, env = "HTTP_ADDR", default_value = "0.0.0.0:3000")]
    http_addr: SocketAddr,
    /// h2c-only (HTTP/2 prior knowledge) listen address.
    #[arg(long, env = "H2C_ADDR", default_value = "0.0.0.0:3001")]
    h2c_addr: SocketAddr,
    /// echo-basic's port variable: when set, replaces the port of --http-addr.
    #[arg(long, env = "HTTP_PORT")]
    http_port: Option<u16>,
    /// echo-basic's port variable: when set, replaces the port of --h2c-addr.
    #[arg(long, env = "H2C_PORT")]
    h2c_port: Option<u16>,
    /// Namespace echoed in every response.
    #[arg(long, env = "NAMESPACE", default_value = "")]
    namespace: String,
    /// Pod name echoed in every response.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pod_name: String,
    /// Do not print the per-request log line (for load runs).
    #[arg(long, env = "ECHO_QUIET")]
    quiet: bool,
    /// Tokio worker threads (default: one per CPU the process may run on).
    #[arg(long, env = "ECHO_WORKER_THREADS")]
    worker_threads: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let Args {
        mut http_addr,
        mut h2c_addr,
        http_port,
        h2c_port,
        namespace,
        pod_name,
        quiet,
        worker_threads,
    } = Args::parse();
    if let Some(port) = http_port {
        http_addr.set_port(port);
    }
    if let Some(port) = h2c_port {
        h2c_addr.set_port(port);
    }
    // One worker: a current-thread runtime, which skips the multi-thread scheduler's
    // cross-thread wake-ups and queue handoffs on every request.
    let mut runtime = match worker_threads {
        Some(n) if n <= 1 => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    runtime.enable_all();
    let runtime = runtime.build().context("building the tokio runtime")?;
    runtime.block_on(async move {
        let server = EchoServer::start(EchoConfig {
            http_addr,
            h2c_addr,
            identity: EchoIdentity {
                namespace,
                pod: pod_name,
            },
            record_log: false,
            print_log: !quiet,
        })
        .await
        .context("binding the echo listeners")?;
        eprintln!(
            "cftunnel-echo listening: http {} h2c {}",
            server.http_addr(),
            server.h2c_addr()
        );
        wait_for_signal().await?;
        server.shutdown().await;
        Ok(())
    })
}

/// SIGINT or SIGTERM (what a container runtime or the load harness sends).
async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
