use anyhow::{bail, Context as _};
use cftunnel_proxy::cli::Args;
use cftunnel_proxy::{Server, ServerOptions};
use clap::Parser;

/// mimalloc: a config push allocates and frees tens of thousands of small objects, and the
/// request path allocates per connection; both are several times cheaper than with glibc's malloc.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(n) = args.worker_threads {
        runtime.worker_threads(n.get());
    }
    let runtime = match runtime.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let initial = match &args.config_file {
        Some(path) => {
            let text = tokio::fs::read(path)
                .await
                .with_context(|| format!("reading {}", path.display()))?;
            let doc: cftunnel_config::Config = serde_json::from_slice(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            Some(doc)
        }
        None => None,
    };
    if args.check {
        let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
        let doc = initial.unwrap_or_default();
        cftunnel_proxy::config::compile(&doc, &metrics, &mut Default::default())
            .context("config is invalid")?;
        println!(
            "config is valid: {} rules, version {}",
            doc.rules.len(),
            doc.version
        );
        return Ok(());
    }
    if args.tunnel_token.is_some() {
        bail!("TUNNEL_TOKEN is set, but this build has no tunnel connector; unset it to run standalone");
    }
    if args.auth_token.is_none() {
        tracing::warn!(
            "PROXY_AUTH_TOKEN is not set: the config API accepts unauthenticated pushes"
        );
    }
    let options = ServerOptions {
        data_addr: Some(args.addr.0),
        admin_addr: args.config_addr.0,
        auth_token: args.auth_token.clone(),
        grace: args.grace_period.0,
        access_log: args.access_log_enabled,
        metrics_enabled: args.metrics_enabled,
        backend_header_timeout: args.backend_header_timeout.0,
        ..ServerOptions::default()
    };
    let server = Server::start(options, initial).await?;
    tracing::info!(data = %server.data_addr(), admin = %server.admin_addr(), "proxy serving");

    let mut signals = Signals::new()?;
    signals.next().await;
    tracing::info!(grace = ?args.grace_period.0, "draining");
    server.begin_drain();
    // A second signal ends the process at once.
    tokio::spawn(async move {
        signals.next().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    if !server.shutdown().await {
        tracing::warn!("grace period over with requests still in flight");
    }
    tracing::info!("drained");
    Ok(())
}

/// SIGTERM or SIGINT, whichever comes.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
