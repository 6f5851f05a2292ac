use std::process::ExitCode;

use clap::Parser;

use anyhow::Context as _;
use cftunnel_controller::cli::{
    run_crd, run_render, run_translate, Cli, Command, RunArgs, SERVICE_NAME, TRACED_TARGETS,
};
use cftunnel_controller::runtime::{api_client, RuntimeOptions};
use cftunnel_telemetry::{ExportedSpans, Traces};

/// mimalloc: a translation allocates and frees hundreds of thousands of small objects (rules,
/// hostnames, conditions) every round; with glibc's malloc that alone was half its time.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(args) => run(args),
        Command::Translate(args) => run_translate(
            args,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Render(args) => run_render(
            args,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Crd(args) => run_crd(args, &mut std::io::stdout().lock()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The controller's main job: until SIGTERM or SIGINT.
fn run(args: &RunArgs) -> anyhow::Result<()> {
    let trace_settings = args
        .traces
        .settings(SERVICE_NAME)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The exporter's connections run on the runtime; it starts before the log subscriber so
    // the first round's spans are exported too.
    let traces = match &trace_settings {
        Some(settings) => {
            let _entered = runtime.enter();
            Some(Traces::start(settings).context("starting the trace exporter")?)
        }
        None => None,
    };
    cftunnel_telemetry::init_logs_and_spans(
        args.log_format,
        traces.as_ref().map(|traces| ExportedSpans {
            traces,
            scope: SERVICE_NAME,
            targets: TRACED_TARGETS,
        }),
    )
    .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    if let Some(settings) = &trace_settings {
        tracing::info!(
            endpoint = %settings.endpoint,
            protocol = ?settings.protocol,
            "exporting traces"
        );
    }
    // One TLS provider for every client in the process (the API server's, Cloudflare's).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let options = args.options()?;
    if options.render.proxy_image.is_none() {
        tracing::warn!(
            "no --proxy-image: Gateways whose GatewayConfig names no image are not accepted"
        );
    }
    runtime.block_on(async {
        let result = serve(args, options).await;
        // The spans of the last rounds, queued for export: sent now, within a bound.
        if let Some(traces) = traces {
            traces.shutdown(TRACE_FLUSH_WAIT).await;
        }
        result
    })
}

/// How long the spans still queued at exit get to reach the collector.
const TRACE_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve(args: &RunArgs, options: RuntimeOptions) -> anyhow::Result<()> {
    let request_timeout = std::time::Duration::from_secs(args.api_request_timeout_seconds);
    let client = api_client::connect(request_timeout).await.map_err(|e| {
        anyhow::anyhow!(
            "connecting to the Kubernetes API (kubeconfig or in-cluster service account): {e}"
        )
    })?;
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
    };
    let health = std::sync::Arc::new(cftunnel_controller::runtime::health::Health::default());
    let listener = match tokio::net::TcpListener::bind(args.health_addr).await {
        Ok(listener) => listener,
        // `[::]` on a host without IPv6: the IPv4 wildcard instead.
        Err(_) if args.health_addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => {
            let v4 = std::net::SocketAddr::from(([0, 0, 0, 0], args.health_addr.port()));
            tokio::net::TcpListener::bind(v4)
                .await
                .map_err(|e| anyhow::anyhow!("binding --health-addr {v4}: {e}"))?
        }
        Err(e) => anyhow::bail!("binding --health-addr {}: {e}", args.health_addr),
    };
    tokio::spawn(cftunnel_controller::runtime::health::serve(
        listener,
        std::sync::Arc::clone(&health),
    ));
    cftunnel_controller::runtime::run(client, options, health, shutdown).await
}
