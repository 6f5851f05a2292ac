//! The proxy as a process: settings in, serving (on its listener or through the tunnel) until
//! told to stop, then drained. `main` parses the settings and builds the runtime; everything
//! after that is here, so the same lifecycle can run inside another program (a demo).

use crate::cli::Args;
use crate::{Server, ServerOptions};
use anyhow::Context as _;
use std::future::Future;

/// How long the tunnel connections get to close (code 0) once the grace period is over.
const TUNNEL_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the spans still queued at the end of the drain get to reach the collector.
const TRACE_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where the requests to stop come from: the first drains, a second ends the process at once.
pub trait Stop: Send + 'static {
    /// Resolves at the next request to stop.
    fn next(&mut self) -> impl Future<Output = ()> + Send;
}

/// Runtime worker threads when `PROXY_WORKER_THREADS` is not set: one per CPU the process may
/// use, which on Linux is its CPU affinity (`taskset`, a cpuset) capped by its cgroup CPU quota
/// (a Kubernetes CPU limit, `cpu.max`; rounded down), and at least one. A pod limited to one CPU
/// on a large node gets one worker, not one per node CPU contending for its quota.
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Seeds the TLS stack's random generator (aws-lc's), on a thread of its own. It seeds itself on
/// first use, partly from CPU timing jitter: about 40 ms of CPU once per process. Left to the
/// first TLS handshake (in listener mode, a TLS backend's, dialled under load), that time would
/// stall its worker and every request on it; started with the process, it is usually over
/// before the first handshake, which otherwise waits for what is left of it. In tunnel mode
/// the edge's handshake at start would have paid it anyway. A generator that cannot be seeded
/// (no usable timer) ends the process, now at start rather than at the first handshake.
pub fn seed_random() {
    let seed = || {
        use aws_lc_rs::rand::SecureRandom as _;
        let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut [0u8; 1]);
    };
    if std::thread::Builder::new()
        .name("seed-random".to_owned())
        .spawn(seed)
        .is_err()
    {
        seed();
    }
}

/// Runs the proxy as `args` say until `stop` asks it to stop, then drains it. `worker_threads`
/// is the runtime's, which sizes per-worker metric shards.
///
/// # Errors
/// A setting that cannot be used (each message names it), a listener that cannot be bound, or
/// a tunnel connector that cannot start; all before serving begins.
pub async fn run(args: Args, worker_threads: usize, mut signals: impl Stop) -> anyhow::Result<()> {
    // The file is read and compiled as a push's body is, so it is refused with the message a
    // push of it gets (`rules[2].backends[0].weight: ...`), after the file's name.
    let file = match &args.config_file {
        Some(path) => {
            let setting = format!("PROXY_CONFIG_FILE ({})", path.display());
            let text = tokio::fs::read(path)
                .await
                .with_context(|| format!("{setting}: reading the file"))?;
            Some((setting, text))
        }
        None => None,
    };
    if args.check {
        let Some((setting, text)) = file else {
            anyhow::bail!("--check needs --config-file");
        };
        let metrics = crate::metrics::ProxyMetrics::register(&mut Default::default());
        let routes = crate::config::compile_json(&text, 0, &metrics, &mut Default::default())
            .context(setting)?;
        println!(
            "config is valid: {} rules, version {}",
            routes.rule_count(),
            routes.version()
        );
        return Ok(());
    }
    let initial = match &file {
        Some((setting, text)) => {
            Some(crate::config::read_document(text).with_context(|| setting.clone())?)
        }
        None => None,
    };
    let config_file = file.map(|(setting, _)| setting);
    // Tunnel settings are checked before any socket is bound.
    let connector = match tunnel_token(&args).await? {
        Some((setting, raw)) => Some(connector(&args, setting, &raw).await?),
        None => None,
    };
    if args.auth_token.is_none() {
        tracing::warn!(
            "PROXY_AUTH_TOKEN is not set: the config API accepts unauthenticated pushes and answers the document, backend client keys included, to anyone"
        );
    }
    let traces = match args
        .traces
        .settings(crate::cli::SERVICE_NAME)
        .map_err(|e| anyhow::anyhow!("{e}"))?
    {
        Some(settings) => {
            let traces = cftunnel_telemetry::Traces::start(&settings)
                .context("starting the trace exporter")?;
            tracing::info!(
                endpoint = %settings.endpoint,
                protocol = ?settings.protocol,
                sampler = ?settings.sampler,
                "tracing requests"
            );
            Some(traces)
        }
        None => None,
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let tunnel_metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
    let options = ServerOptions {
        // In tunnel mode requests arrive only through the connector.
        data_addr: connector.is_none().then_some(args.addr.0),
        admin_addr: args.config_addr.0,
        // A token read from a Secret file often ends in a newline, which no client can send.
        auth_token: args.auth_token.as_deref().map(|t| t.trim().to_owned()),
        grace: args.grace_period.0,
        access_log: args.access_log_enabled,
        access_log_options: crate::access_log::AccessLogOptions {
            query: args.access_log_query,
            sample_every: args.access_log_sample,
        },
        tracer: traces
            .as_ref()
            .map(|t| crate::trace::RequestTracer::new(t.tracer(crate::cli::SERVICE_NAME))),
        metrics_enabled: args.metrics_enabled,
        backend_header_timeout: args.backend_header_timeout.0,
        request_body_timeout: args.request_body_timeout.0,
        websocket_idle_timeout: Some(args.websocket_idle_timeout.0).filter(|t| !t.is_zero()),
        access: args.access_settings(),
        backend_max_connections: args.backend_max_connections as usize,
        cluster_ranges: args.cluster_cidrs.clone(),
        backend_keep_alive: crate::forward::KeepAlive::default(),
        max_config_bytes: args.max_config_bytes as usize,
        admin_max_connections: crate::admin::DEFAULT_MAX_CONNECTIONS,
        limits: crate::serve::Limits {
            max_connections: args.max_connections as usize,
            // The tunnel's streams are bounded by the same setting (see `connector`).
            send_timeout: args.send_timeout.0,
            ..Default::default()
        },
        worker_threads,
    };
    let server = Server::start_with_registry(options, initial, registry)
        .await
        .map_err(|e| match config_file {
            // The file's is the one document compiled at start (the empty table cannot fail).
            Some(setting) if e.downcast_ref::<crate::config::ConfigError>().is_some() => {
                e.context(setting)
            }
            _ => e,
        })?;
    let tunnel = match connector {
        Some(mut connector) => {
            use crate::tunnel::{
                await_first_table, http2_once_trailers_needed, warn_on_trailers_without_http2,
                TrailersNeeded,
            };
            if !server.proxy().is_loaded() {
                tracing::info!(
                    "the tunnel registers with the edge once the proxy has its first config"
                );
            }
            tokio::select! {
                _ = await_first_table(server.proxy()) => {}
                _ = signals.next() => {
                    tracing::info!("signal before the tunnel started: exiting");
                    server.begin_drain();
                    server.shutdown_by(tokio::time::Instant::now() + args.grace_period.0).await;
                    if let Some(traces) = traces {
                        traces.shutdown(TRACE_FLUSH_WAIT).await;
                    }
                    return Ok(());
                }
            }
            // Whether the table serves gRPC decides the transport an `auto` tunnel tries
            // first; a later table that does moves the tunnel to HTTP/2 (below). Preferred,
            // not forced: where HTTP/2 does not reach the edge, the tunnel runs on QUIC and
            // serves all but gRPC's status, rather than nothing.
            if let Some(reason) = TrailersNeeded::of(&server.proxy().routes()) {
                if connector.prefer_http2() {
                    tracing::info!(
                        reason = reason.as_str(),
                        "the table serves gRPC: the tunnel dials HTTP/2, which carries the \
                         trailers gRPC needs (QUIC does not), and QUIC should HTTP/2 not \
                         reach the edge"
                    );
                }
            }
            let dialed = connector.protocol();
            let service = crate::tunnel::TunnelService::new(server.proxy().clone());
            let handle = connector
                .start_handler(service, tunnel_metrics)
                .context("starting the tunnel connector")?;
            match dialed {
                cftunnel_tunnel::Protocol::Auto => tokio::spawn(http2_once_trailers_needed(
                    server.proxy().clone(),
                    handle.clone(),
                )),
                other => tokio::spawn(warn_on_trailers_without_http2(
                    server.proxy().clone(),
                    other,
                )),
            };
            let registered = handle.clone();
            server
                .health()
                .track_tunnel(move || registered.registered());
            tracing::info!(
                admin = %server.admin_addr(),
                workers = worker_threads,
                "proxy serving through the tunnel"
            );
            Some(handle)
        }
        None => {
            tracing::info!(
                data = %server.data_addr(),
                admin = %server.admin_addr(),
                workers = worker_threads,
                "proxy serving"
            );
            None
        }
    };

    signals.next().await;
    tracing::info!(grace = ?args.grace_period.0, "draining");
    // One deadline for the whole drain: unregistering, in-flight requests, connections.
    let deadline = tokio::time::Instant::now() + args.grace_period.0;
    server.begin_drain();
    // A second signal ends the process at once.
    tokio::spawn(async move {
        signals.next().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    if let Some(tunnel) = &tunnel {
        // The edge stops sending new requests here; the connections serve what still comes
        // for the grace period, as cloudflared's do, and close themselves (code 0) at its end:
        // they get that long to do so before they are closed from here.
        if tokio::time::timeout_at(deadline + TUNNEL_CLOSE_WAIT, tunnel.drain())
            .await
            .is_err()
        {
            tracing::warn!("grace period over before the tunnel connections drained");
            // Close them with code 0 now rather than drop them with the runtime.
            if tokio::time::timeout(TUNNEL_CLOSE_WAIT, tunnel.shutdown())
                .await
                .is_err()
            {
                tracing::warn!("tunnel connections did not close in time");
            }
        }
    }
    if !server.shutdown_by(deadline).await {
        tracing::warn!("grace period over with requests or upgraded sessions still open");
    }
    // The spans of the last requests, queued for export: sent now, within a bound.
    if let Some(traces) = traces {
        traces.shutdown(TRACE_FLUSH_WAIT).await;
    }
    tracing::info!("drained");
    Ok(())
}

/// The connector token and the setting it came from, as `cloudflared` picks it: a
/// non-empty `TUNNEL_TOKEN`, else the contents of `TUNNEL_TOKEN_FILE`; `None` is
/// standalone mode. A set but empty `TUNNEL_TOKEN` with no file is kept, to be refused.
async fn tunnel_token(args: &Args) -> anyhow::Result<Option<(String, String)>> {
    let from_env = args
        .tunnel_token
        .as_ref()
        .map(|t| ("TUNNEL_TOKEN".to_owned(), t.clone()));
    if from_env.as_ref().is_some_and(|(_, t)| !t.trim().is_empty()) {
        return Ok(from_env);
    }
    let Some(path) = &args.tunnel_token_file else {
        return Ok(from_env);
    };
    let setting = format!("TUNNEL_TOKEN_FILE ({})", path.display());
    let bytes = tokio::fs::read(path)
        .await
        .with_context(|| format!("{setting}: reading the token"))?;
    let raw = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{setting}: the token is not UTF-8 text"))?;
    if raw.trim().is_empty() {
        anyhow::bail!("{setting}: the file is empty");
    }
    Ok(Some((setting, raw)))
}

/// Parses the token and the connector settings; every error names the setting.
async fn connector(
    args: &Args,
    setting: String,
    raw: &str,
) -> anyhow::Result<cftunnel_tunnel::Connector> {
    let token: cftunnel_tunnel::Token = raw
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("{setting}: {e}"))?;
    let edges = args
        .edge
        .iter()
        .map(|e| e.parse::<cftunnel_tunnel::EdgeAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("TUNNEL_EDGE: {e}"))?;
    let edge_ca_pem = match &args.edge_ca_file {
        Some(path) => Some(
            tokio::fs::read(path)
                .await
                .with_context(|| format!("TUNNEL_CACERT: reading {}", path.display()))?,
        ),
        None => None,
    };
    let protocol = match args.tunnel_protocol {
        crate::cli::TunnelProtocol::Auto => cftunnel_tunnel::Protocol::Auto,
        crate::cli::TunnelProtocol::Quic => cftunnel_tunnel::Protocol::Quic,
        crate::cli::TunnelProtocol::Http2 => cftunnel_tunnel::Protocol::Http2,
    };
    let options = cftunnel_tunnel::ConnectorOptions {
        protocol,
        edges,
        edge_ca_pem,
        edge_ip_version: args.edge_ip_version,
        region: args.region.clone(),
        grace_period: args.grace_period.0,
        post_quantum: args.tunnel_post_quantum,
        quic_max_streams: args.tunnel_quic_max_streams,
        // A client that stops reading holds a tunnel stream as it would a listener's
        // connection: one setting bounds both.
        send_timeout: args.send_timeout.0,
        ..Default::default()
    };
    cftunnel_tunnel::Connector::new(token, options).map_err(|e| match e {
        cftunnel_tunnel::ConnectorError::RegionWithEndpoint { .. }
        | cftunnel_tunnel::ConnectorError::Region(_) => anyhow::anyhow!("TUNNEL_REGION: {e}"),
        e => anyhow::Error::new(e).context("tunnel connector settings"),
    })
}

/// SIGTERM or SIGINT, whichever comes.
#[derive(Debug)]
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: install them before anything can take long, so a signal always
    /// drains.
    ///
    /// # Errors
    /// The handlers cannot be installed.
    pub fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }
}

impl Stop for Signals {
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
