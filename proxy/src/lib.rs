//! Gateway API L7 proxy for Cloudflare Tunnel.
//!
//! Routes requests by Gateway API HTTPRoute/GRPCRoute semantics over a table that is compiled
//! once per config push and swapped atomically ([`config::Reloader`]); readers never lock.
//! Requests arrive from the standalone listener ([`serve`]) or, in tunnel mode, straight from
//! the tunnel connector, both through [`Proxy::handle`]. The admin port ([`admin`]) carries the
//! config API, health and metrics. The proxy contract fixes ports, environment and metric names.

pub mod access;
pub mod access_log;
pub mod admin;
pub mod body;
pub mod cli;
mod completion;
pub mod config;
pub mod conn;
pub mod error;
pub mod filter;
pub mod forward;
mod headers;
pub mod memory;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod response;
pub mod route;
pub mod routes;
pub mod rule;
pub mod serve;
pub mod trace;
pub mod tunnel;
pub mod upgrade;

pub use config::ConfigError;
pub use conn::ConnInfo;
pub use proxy::{Proxy, ProxyOptions};
pub use response::ResponseBody;
pub use upgrade::{ClientUpgrade, UpgradedIo};

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How to run an in-process proxy.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Data listener; `None` when requests arrive only through the tunnel.
    pub data_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub auth_token: Option<String>,
    /// Drain window after the first shutdown signal.
    pub grace: Duration,
    pub access_log: bool,
    /// What the access log's lines carry and how many are written.
    pub access_log_options: access_log::AccessLogOptions,
    /// Starts each request's spans; `None`: tracing is off.
    pub tracer: Option<trace::RequestTracer>,
    pub metrics_enabled: bool,
    pub backend_header_timeout: Duration,
    /// How long a request body may send nothing before any response comes.
    pub request_body_timeout: Duration,
    /// An upgraded (WebSocket) session with no bytes either way for this long is ended;
    /// `None`: never. A session whose peer reads nothing for `limits.send_timeout` is too.
    pub websocket_idle_timeout: Option<Duration>,
    /// Connections open at once to one backend, HTTP/1.1 and HTTP/2 together; requests beyond
    /// wait for one (or for a share of an HTTP/2 one).
    pub backend_max_connections: usize,
    /// When connections to HTTP/2 backends are pinged.
    pub backend_keep_alive: forward::KeepAlive,
    /// The cluster's own ranges, which `publicOnly` backends are not dialled at though
    /// globally routable.
    pub cluster_ranges: cftunnel_config::address::ClusterRanges,
    /// Largest config document `PUT /config` accepts.
    pub max_config_bytes: usize,
    /// Connections open at once on the admin port; more wait to be accepted.
    pub admin_max_connections: usize,
    /// How the keys of Cloudflare Access teams that rules name are fetched and kept.
    pub access: access::AccessSettings,
    pub limits: serve::Limits,
    /// Worker threads of the runtime serving requests; sizes the per-thread copies of the
    /// duration histograms (see [`metrics::histogram::Shards`]).
    pub worker_threads: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            data_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            auth_token: None,
            grace: Duration::from_secs(30),
            access_log: false,
            access_log_options: access_log::AccessLogOptions::default(),
            tracer: None,
            metrics_enabled: true,
            backend_header_timeout: Duration::from_secs(60),
            request_body_timeout: Duration::from_secs(60),
            websocket_idle_timeout: Some(upgrade::DEFAULT_IDLE_TIMEOUT),
            backend_max_connections: forward::DEFAULT_MAX_CONNECTIONS,
            backend_keep_alive: forward::KeepAlive::default(),
            cluster_ranges: cftunnel_config::address::ClusterRanges::default(),
            max_config_bytes: admin::DEFAULT_MAX_CONFIG_BYTES,
            admin_max_connections: admin::DEFAULT_MAX_CONNECTIONS,
            access: access::AccessSettings::default(),
            limits: serve::Limits::default(),
            worker_threads: 1,
        }
    }
}

/// A running proxy: data listener (standalone), admin listener, route table.
#[derive(Debug)]
pub struct Server {
    data_addr: Option<SocketAddr>,
    admin_addr: SocketAddr,
    proxy: Proxy,
    reloader: Arc<config::Reloader>,
    health: Arc<admin::Health>,
    stop: watch::Sender<bool>,
    data_task: Option<tokio::task::JoinHandle<serve::Connections>>,
    admin_task: tokio::task::JoinHandle<()>,
    timer_anchor: tokio::task::JoinHandle<()>,
    grace: Duration,
}

impl Server {
    /// Binds the listeners and starts serving; `initial` is applied before the first request.
    pub async fn start(
        options: ServerOptions,
        initial: Option<cftunnel_config::Config>,
    ) -> anyhow::Result<Self> {
        Self::start_with_registry(options, initial, Registry::default()).await
    }

    /// As [`Server::start`], registering the proxy's metrics next to ones already in `registry`.
    pub async fn start_with_registry(
        options: ServerOptions,
        initial: Option<cftunnel_config::Config>,
        mut registry: Registry,
    ) -> anyhow::Result<Self> {
        let metrics =
            metrics::ProxyMetrics::register_for_workers(&mut registry, options.worker_threads);
        let mut empty = config::Cache::default();
        let routes = config::compile(&cftunnel_config::Config::default(), &metrics, &mut empty)
            .context("compiling the empty table")?;
        let access_metrics = metrics.access.clone();
        let proxy = Proxy::new(
            routes,
            metrics,
            ProxyOptions {
                backend_header_timeout: options.backend_header_timeout,
                request_body_timeout: options.request_body_timeout,
                access_log: options.access_log,
                access_log_options: options.access_log_options,
                tracer: options.tracer.clone(),
                sessions: upgrade::SessionLimits {
                    idle_timeout: options.websocket_idle_timeout,
                    send_timeout: options.limits.send_timeout,
                },
            },
        );
        let reloader = Arc::new(config::Reloader::with_cache(
            proxy.clone(),
            config::Cache::with_backends(forward::BackendOptions {
                max_connections: options.backend_max_connections,
                // A backend may answer with as large a head as a client may send.
                max_header_bytes: options.limits.max_header_bytes,
                keep_alive: options.backend_keep_alive,
                cluster_ranges: options.cluster_ranges.clone(),
            })
            .with_access(options.access.clone(), access_metrics),
        ));
        if let Some(doc) = initial {
            reloader.apply(doc).await.context("initial config")?;
        }
        let admin_listener = listen(options.admin_addr)
            .with_context(|| format!("binding the admin listener on {}", options.admin_addr))?;
        let data_listener = match options.data_addr {
            Some(addr) => {
                Some(listen(addr).with_context(|| format!("binding the data listener on {addr}"))?)
            }
            None => None,
        };
        let admin_addr = admin_listener.local_addr()?;
        let data_addr = data_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let health = Arc::new(if data_listener.is_some() {
            admin::Health::default()
        } else {
            admin::Health::tunnel_mode()
        });
        let admin = Arc::new(admin::Admin {
            reloader: reloader.clone(),
            registry: options.metrics_enabled.then(|| Arc::new(registry)),
            health: health.clone(),
            auth_token: options.auth_token.clone(),
            max_config_bytes: options.max_config_bytes,
            body_timeout: options.request_body_timeout,
        });
        let admin_task = tokio::spawn(admin::serve(
            admin_listener,
            admin,
            options.admin_max_connections,
            options.limits.send_timeout,
        ));
        let timer_anchor = tokio::spawn(anchor_timers());
        let (stop, stop_rx) = watch::channel(false);
        let data_task = data_listener.map(|l| {
            tokio::spawn(serve::serve(
                l,
                proxy.clone(),
                options.limits.clone(),
                stop_rx,
            ))
        });
        Ok(Self {
            data_addr,
            admin_addr,
            proxy,
            reloader,
            health,
            stop,
            data_task,
            admin_task,
            timer_anchor,
            grace: options.grace,
        })
    }

    /// The data listener's address (`0.0.0.0:0` when there is no data listener).
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The request handler, for the tunnel connector.
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    pub fn health(&self) -> &Arc<admin::Health> {
        &self.health
    }

    /// Applies a config document as `PUT /config` would.
    pub async fn apply(&self, doc: cftunnel_config::Config) -> Result<i64, ConfigError> {
        self.reloader.apply(doc).await
    }

    /// Marks the proxy not ready (`/readyz` answers 503). First step of a drain.
    pub fn begin_drain(&self) {
        self.health.set_draining();
        self.proxy.metrics().draining.set(1);
    }

    /// Drains: readiness off, the data listener closed (new connections are refused), open
    /// connections closed after their current request; waits up to the grace period for
    /// in-flight requests and open upgraded (WebSocket) sessions. Returns whether everything
    /// finished in time.
    pub async fn shutdown(self) -> bool {
        let deadline = tokio::time::Instant::now() + self.grace;
        self.shutdown_by(deadline).await
    }

    /// As [`Server::shutdown`], with the drain bounded by `deadline` instead of the grace
    /// period from now (the caller may have spent part of it draining the tunnel).
    pub async fn shutdown_by(mut self, deadline: tokio::time::Instant) -> bool {
        self.begin_drain();
        let _ = self.stop.send(true);
        let mut clean = true;
        if let Some(task) = self.data_task.take() {
            if let Ok(connections) = task.await {
                clean = connections.shutdown_by(deadline).await;
            }
        }
        // Requests that arrived in-process (tunnel) are counted by the in-flight gauge.
        while self.proxy.metrics().in_flight.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        clean &= self.proxy.metrics().in_flight.get() == 0;
        // Upgraded sessions outlive their requests (which end at the `101`): they get what is
        // left of the grace period too, in both modes (the tunnel's streams are kept that long).
        clean &= tokio::time::timeout_at(deadline, self.proxy.sessions_closed())
            .await
            .is_ok();
        self.admin_task.abort();
        self.timer_anchor.abort();
        clean
    }
}

/// Keeps a timer due within a second at all times. Every proxied request arms
/// its backend timeout; when no earlier timer is pending, tokio wakes its I/O
/// driver for the new one through an `eventfd` write, one system call per
/// request. A listener's connections keep earlier timers pending (their
/// header-read timeouts); a tunnel connection has none, so without this
/// every request through it paid that call.
async fn anchor_timers() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
    }
}

/// TCP keep-alive for the data plane's connections, clients' and backends': a peer that
/// vanishes (a phone leaving coverage, a node losing power) from a connection that waits on
/// it (a WebSocket, a stalled upload, a response body) is found out within about two
/// minutes, instead of the connection and what it holds staying for good.
pub(crate) fn tcp_keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(15))
        .with_retries(4)
}

/// Binds a listener. The IPv6 wildcard (what `:PORT` means) takes both families, as Go's
/// listeners do, whatever the host's `bindv6only` default; on a host without IPv6 it falls
/// back to IPv4's wildcard. Accepted connections inherit its keep-alive ([`tcp_keepalive`]).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let open = |addr: SocketAddr| -> std::io::Result<TcpListener> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_tcp_keepalive(&tcp_keepalive())?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        TcpListener::from_std(socket.into())
    };
    match open(addr) {
        Err(e) if addr.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) => open(
            SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port()),
        )
        .map_err(|_| e),
        other => other,
    }
}
