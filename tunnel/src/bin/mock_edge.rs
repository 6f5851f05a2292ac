//! `cftunnel-mock-edge`: a local stand-in for Cloudflare's edge.
//!
//! Connectors (this crate's, or `cloudflared`) dial `--listen` over QUIC or
//! TLS/TCP and trust the CA written to `--ca-out`; requests to `--http` are
//! forwarded through their registered connections.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use cftunnel_tunnel::mock_edge::MockEdge;
use clap::Parser;

/// Mock Cloudflare Tunnel edge for tests, load tests and local demos.
#[derive(Debug, Parser)]
#[command(name = "cftunnel-mock-edge", version)]
struct Args {
    /// Edge address (UDP for QUIC and TCP for HTTP/2, same port).
    #[arg(long, env = "MOCK_EDGE_LISTEN", default_value = "127.0.0.1:7844")]
    listen: SocketAddr,
    /// Plain-HTTP listener whose requests are forwarded into the tunnel.
    #[arg(long, env = "MOCK_EDGE_HTTP", default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Where to write the generated CA certificate (PEM).
    #[arg(long, env = "MOCK_EDGE_CA_OUT", default_value = "mock-edge-ca.pem")]
    ca_out: PathBuf,
    /// Answer registrations with `tunnelIsRemotelyManaged = false`, so
    /// `cloudflared --url ...` pushes its local configuration.
    #[arg(long)]
    locally_managed: bool,
    /// Only accept this tunnel token's credentials.
    #[arg(long, env = "MOCK_EDGE_TOKEN")]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut builder = MockEdge::builder()
        .edge_addr(args.listen)
        .http_addr(args.http)
        .remotely_managed(!args.locally_managed);
    if let Some(token) = &args.token {
        builder = builder.credentials(token.parse().context("--token")?);
    }
    let edge = builder.start().await.context("starting the mock edge")?;
    edge.write_ca_pem(&args.ca_out)
        .await
        .with_context(|| format!("writing {}", args.ca_out.display()))?;
    tracing::info!(
        edge = %edge.edge_addr(),
        http = %edge.http_addr(),
        ca = %args.ca_out.display(),
        "mock edge ready"
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    edge.shutdown().await;
    Ok(())
}
