//! `cftunnel-mock-edge`: a local stand-in for Cloudflare's edge.
//!
//! Connectors (this crate's, or `cloudflared`) dial `--listen` over QUIC or
//! TLS/TCP and trust the CA written to `--ca-out`; requests to `--http` are
//! forwarded through their registered connections.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_testkit::pki::TestPki;
use clap::Parser;

/// mimalloc, as the proxy uses: the edge side of every request allocates its metadata and frames, and glibc's malloc would
/// cost several times more there, on the same cores as the server under test.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

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
    /// Where to write the CA certificate (PEM) connectors must trust.
    #[arg(long, env = "MOCK_EDGE_CA_OUT", default_value = "mock-edge-ca.pem")]
    ca_out: PathBuf,
    /// Keep the CA, the edge certificate and its key in this file: loaded
    /// when it exists, else generated and written. A restarted mock edge
    /// then keeps the identity running connectors already trust.
    #[arg(long, env = "MOCK_EDGE_PKI")]
    pki: Option<PathBuf>,
    /// Answer registrations with `tunnelIsRemotelyManaged = false`, so
    /// `cloudflared --url ...` pushes its local configuration.
    #[arg(long)]
    locally_managed: bool,
    /// Only accept this tunnel token's credentials.
    #[arg(long, env = "MOCK_EDGE_TOKEN")]
    token: Option<String>,
    /// Accept only these TLS key-exchange groups, in order of preference
    /// (e.g. `X25519,secp256r1` for an edge without post-quantum key
    /// exchange). Default: all of rustls' groups, X25519MLKEM768 first.
    #[arg(long, env = "MOCK_EDGE_KEY_EXCHANGE_GROUPS", value_delimiter = ',', value_parser = parse_group)]
    key_exchange_groups: Vec<rustls::NamedGroup>,
}

fn parse_group(name: &str) -> Result<rustls::NamedGroup, String> {
    cftunnel_testkit::edge::key_exchange_group_by_name(name)
        .ok_or_else(|| format!("{name:?} is not a key-exchange group rustls implements"))
}

/// On one CPU (affinity or cgroup quota) the current-thread runtime: the edge shares the load
/// CPU with the load generator and the backend in the comparisons, and a multi-thread runtime's
/// hand-offs cost that CPU more for no parallelism.
fn main() -> anyhow::Result<()> {
    let mut runtime = match std::thread::available_parallelism().map_or(1, usize::from) {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    runtime
        .enable_all()
        .build()
        .context("building the runtime")?
        .block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
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
    if let Some(path) = &args.pki {
        builder = builder.pki(load_or_create_pki(path).await?);
    }
    if let Some(token) = &args.token {
        builder = builder.credentials(token.parse().context("--token")?);
    }
    if !args.key_exchange_groups.is_empty() {
        builder = builder.key_exchange_groups(args.key_exchange_groups.iter().copied());
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
    if args.locally_managed {
        tracing::info!("locally managed: connectors serve their own ingress (cloudflared --url)");
    } else {
        tracing::info!(
            "remotely managed: connectors serve the configuration pushed with PUT \
             /__mock-edge/config?version=N (cloudflared answers 503 until then); \
             --locally-managed lets cloudflared --url serve its own"
        );
    }
    wait_for_signal().await?;
    tracing::info!("shutting down");
    edge.shutdown().await;
    Ok(())
}

async fn load_or_create_pki(path: &Path) -> anyhow::Result<TestPki> {
    match tokio::fs::read_to_string(path).await {
        Ok(pem) => TestPki::from_pem(&pem).with_context(|| format!("reading {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let pki = TestPki::generate()?;
            tokio::fs::write(path, pki.to_pem())
                .await
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(pki)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// SIGINT or SIGTERM: close every connector connection before exiting.
async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    Ok(())
}
