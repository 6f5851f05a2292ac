//! The connector: start-up, HA supervision and the handle the
//! proxy uses for readiness and drain.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::backoff::{next_transport, Backoff, DialFailures, SharedBackoff, Transport};
use crate::body::{Body, BoxError};
use crate::connection::{retry_state, take_back, ConnError, Control, Ended, RunState, Shared};
use crate::discovery::DiscoveryError;
use crate::edge::{EdgeAddr, EdgeIpVersion, EdgePool, EDGE_PORT, REGION_HOSTS};
use crate::metrics::{ProtocolLabel, TunnelMetrics};
use crate::options::{ConnectorOptions, Protocol};
use crate::preference::{Http2Retry, HTTP2_RETRY_MIN};
use crate::rpc::remote_config::{RemoteConfig, RemoteConfigState};
use crate::rpc::LocalWorker;
use crate::service::{Handler, ServiceHandler};
use crate::tls::{self, TlsError};
use crate::token::Token;
use crate::trailers::DroppedTrailers;

/// Start-up errors of the connector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectorError {
    /// TLS setup (for example a bad CA override).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The RPC thread could not be started.
    #[error("starting the rpc thread: {0}")]
    Worker(#[source] std::io::Error),
    /// `ha_connections` is zero.
    #[error("ha_connections must be at least 1")]
    NoConnections,
    /// `ha_connections` is more than a connection index tells apart.
    #[error("ha_connections is {0}, over {MAX_HA_CONNECTIONS}: a connection's index is one byte")]
    TooManyConnections(usize),
    /// `http2_retry` is under a second: the connections would move to HTTP/2 and
    /// back without end where HTTP/2 does not reach the edge.
    #[error("http2_retry must be at least 1s, not {0:?}")]
    Http2Retry(Duration),
    /// A region with a token that names its own endpoint: the two would
    /// pick different edges.
    #[error("a region was given with a token that has an endpoint ({endpoint:?})")]
    RegionWithEndpoint {
        /// The token's endpoint.
        endpoint: String,
    },
    /// A region that cannot be part of a DNS name.
    #[error("region {0:?} is not {rule}", rule = cftunnel_config::REGION_RULE)]
    Region(String),
    /// [`Connector::start`] was called outside a Tokio runtime.
    #[error("the connector must be started inside a Tokio runtime")]
    NoRuntime,
}

/// A native tunnel connector, built from a token and options.
pub struct Connector {
    token: Token,
    opts: ConnectorOptions,
    quic_client: quinn::ClientConfig,
    h2_client: Arc<rustls::ClientConfig>,
    /// Start preferring HTTP/2 (see [`Connector::prefer_http2`]).
    http2_first: bool,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("token", &self.token)
            .field("opts", &self.opts)
            .field("http2_first", &self.http2_first)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Validates the options and builds the TLS configurations.
    pub fn new(token: Token, opts: ConnectorOptions) -> Result<Self, ConnectorError> {
        if opts.ha_connections == 0 {
            return Err(ConnectorError::NoConnections);
        }
        if opts.ha_connections > MAX_HA_CONNECTIONS {
            return Err(ConnectorError::TooManyConnections(opts.ha_connections));
        }
        if opts.http2_retry < HTTP2_RETRY_MIN {
            return Err(ConnectorError::Http2Retry(opts.http2_retry));
        }
        edge_region(opts.region.as_deref(), token.endpoint())?;
        let roots = tls::root_store(opts.edge_ca_pem.as_deref())?;
        let quic_client = tls::quic_client(roots.clone(), opts.post_quantum)?;
        let h2_client = tls::h2_client(roots, opts.post_quantum)?;
        Ok(Self {
            token,
            opts,
            quic_client,
            h2_client,
            http2_first: false,
        })
    }

    /// The transport the connections will use (settings are otherwise as
    /// validated by [`new`](Self::new)); for a choice made after the settings
    /// were checked.
    pub fn protocol(&self) -> Protocol {
        self.opts.protocol
    }

    /// Changes the transport before [`start`](Self::start).
    pub fn set_protocol(&mut self, protocol: Protocol) {
        self.opts.protocol = protocol;
    }

    /// Has an `auto` connector start preferring HTTP/2, as if
    /// [`ConnectorHandle::prefer_http2`] had been called before any connection dialed: for a
    /// service that needs response trailers from the start. Every connection dials HTTP/2
    /// first, with no turn to wait for (none is serving yet). Where HTTP/2 does not reach the
    /// edge and QUIC does, by the rule that gives a move up (see
    /// [`ConnectorHandle::prefer_http2`]), the preference is given up for the whole connector,
    /// logged as an error, and the connections dial QUIC and carry on as `auto` does: a
    /// tunnel that serves everything but gRPC's status rather than none at all, until HTTP/2
    /// is tried again (see [`ConnectorOptions::http2_retry`]). `http2` is the choice for
    /// HTTP/2 only.
    ///
    /// Whether it applies: a connector configured `quic` or `http2` ignores it.
    pub fn prefer_http2(&mut self) -> bool {
        self.http2_first = self.opts.protocol == Protocol::Auto;
        self.http2_first
    }

    /// Starts the connections on the current Tokio runtime and returns the
    /// handle for readiness and drain. Every request arriving through the
    /// tunnel is passed to `service`.
    pub fn start<S, B>(
        self,
        service: S,
        metrics: TunnelMetrics,
    ) -> Result<ConnectorHandle, ConnectorError>
    where
        S: hyper::service::Service<Request<Body>, Response = Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.start_handler(ServiceHandler(service), metrics)
    }

    /// [`start`](Self::start) with a [`Handler`], whose future the connector takes as it
    /// is: one box per request where a `hyper` service's future is boxed once more.
    pub fn start_handler<H: Handler>(
        self,
        handler: H,
        metrics: TunnelMetrics,
    ) -> Result<ConnectorHandle, ConnectorError> {
        self.start_with(handler, metrics, SystemResolver, REFILL_FIRST)
    }

    /// [`start_handler`](Self::start_handler) with the edge looked up through `resolver`,
    /// and looked up again `refill_first` after a lookup that left addresses out.
    fn start_with<H: Handler, R: EdgeResolver>(
        self,
        handler: H,
        metrics: TunnelMetrics,
        resolver: R,
        refill_first: Duration,
    ) -> Result<ConnectorHandle, ConnectorError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConnectorError::NoRuntime)?;
        let worker = LocalWorker::start("cftunnel-rpc").map_err(ConnectorError::Worker)?;
        let (state_tx, state_rx) = watch::channel(Control {
            http2: self.http2_first && self.opts.protocol == Protocol::Auto,
            ..Control::START
        });
        let state_tx = Arc::new(state_tx);
        let (registered_tx, registered_rx) = watch::channel(0usize);
        let (done_tx, done_rx) = watch::channel(false);
        let remote_config = RemoteConfigState::new(metrics.config_version.clone());
        // A connector that never registers (its edge unreachable, its dials refused) says so
        // at 0, rather than by a series that does not exist and no alert can match.
        let protocols: &[ProtocolLabel] = match self.opts.protocol {
            Protocol::Auto => &[ProtocolLabel::Quic, ProtocolLabel::Http2],
            Protocol::Quic => &[ProtocolLabel::Quic],
            Protocol::Http2 => &[ProtocolLabel::Http2],
        };
        for &protocol in protocols {
            metrics.connections(protocol);
        }
        let client_id = Uuid::new_v4();
        let protocol = self.opts.protocol;
        let ha = self.opts.ha_connections;
        let http2_retry = self.opts.http2_retry;
        let ha_backoff = SharedBackoff::new(self.opts.ha_backoff_base, self.opts.retries);
        let dropped_trailers = DroppedTrailers::new(metrics.dropped_trailers.clone());
        let shared = Arc::new(Shared {
            handler: Arc::new(handler),
            worker,
            remote_config: remote_config.clone(),
            metrics,
            token: self.token,
            client_id,
            warp_tag: crate::stream::origin::connector_tag(client_id),
            opts: self.opts,
            quic_client: self.quic_client,
            h2_client: self.h2_client,
            registered: registered_tx,
            state: state_rx,
            control: Arc::downgrade(&state_tx),
            moves: Arc::new(tokio::sync::Semaphore::new(1)),
            http2_retry: Mutex::new(Http2Retry::new(http2_retry)),
            http2_registered: AtomicBool::new(false),
            quic_ever_registered: AtomicBool::new(false),
            quic_registered: AtomicUsize::new(0),
            ever_registered: AtomicBool::new(false),
            first_on_http2: AtomicBool::new(false),
            local_ports: Mutex::new(vec![0; ha]),
            ha_backoff,
            dropped_trailers,
        });
        tracing::info!(connector_id = %client_id, "starting tunnel connector");
        runtime.spawn(run_all(shared, done_tx, resolver, refill_first));
        Ok(ConnectorHandle {
            registered: registered_rx,
            state: state_tx,
            done: done_rx,
            remote_config: remote_config.subscribe(),
            connector_id: client_id,
            protocol,
        })
    }

    /// [`start`](Self::start), then waits until every connection has ended.
    /// Nothing can drain a connector started this way, so it runs until the
    /// process ends; use [`start`](Self::start) to keep a handle for
    /// readiness and drain.
    pub async fn run<S, B>(self, service: S, metrics: TunnelMetrics) -> Result<(), ConnectorError>
    where
        S: hyper::service::Service<Request<Body>, Response = Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let handle = self.start(service, metrics)?;
        handle.closed().await;
        Ok(())
    }
}

/// Handle on a running connector. Dropping every clone stops the connections at once,
/// without unregistering them: call [`drain`](Self::drain) first for a graceful stop.
#[derive(Debug, Clone)]
pub struct ConnectorHandle {
    registered: watch::Receiver<usize>,
    /// The only strong references: the connections stop once every handle is dropped.
    state: Arc<watch::Sender<Control>>,
    done: watch::Receiver<bool>,
    remote_config: watch::Receiver<RemoteConfig>,
    connector_id: Uuid,
    /// The transport configured, which [`prefer_http2`](Self::prefer_http2) may override
    /// only when it is `auto`.
    protocol: Protocol,
}

impl ConnectorHandle {
    /// Connections registered with the edge right now (readiness: `> 0`).
    pub fn registered(&self) -> usize {
        *self.registered.borrow()
    }

    /// Watch of the registered-connection count.
    pub fn subscribe_registered(&self) -> watch::Receiver<usize> {
        self.registered.clone()
    }

    /// Waits until at least `n` connections are registered.
    pub async fn wait_registered(&self, n: usize) {
        let mut rx = self.registered.clone();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// The connector id sent as `ClientInfo.clientId`.
    pub fn connector_id(&self) -> Uuid {
        self.connector_id
    }

    /// The latest configuration pushed by the edge (version `-1`: none yet).
    pub fn remote_config(&self) -> watch::Receiver<RemoteConfig> {
        self.remote_config.clone()
    }

    /// Graceful drain: every connection calls `unregisterConnection` (the
    /// edge stops sending new requests once it has acted on it), then stays
    /// open for the whole grace period, idle or not, serving in-flight
    /// requests and any the edge still routes to it; then connections close
    /// with code 0. Returns when all connections have ended, so at the end of
    /// the grace period. [`shutdown`](Self::shutdown) cuts it short. A
    /// connection still dialing or waiting for its registration is abandoned,
    /// never registered. Idempotent.
    pub async fn drain(&self) {
        self.state.send_if_modified(|s| {
            if s.running() {
                s.run = RunState::Draining;
                true
            } else {
                false
            }
        });
        self.closed().await;
    }

    /// Moves an `auto` connector to HTTP/2 while it runs: for a service that now needs
    /// response trailers (gRPC's status is one), which the edge carries over HTTP/2 and not
    /// over QUIC. Each connection registered over QUIC is replaced in turn: it unregisters as
    /// in a [`drain`](Self::drain), so the edge stops sending it requests, serves those in
    /// flight and its WebSocket sessions until none is left (and none has come for a second,
    /// or the grace period is over), closes with code 0, and its index dials HTTP/2 at once,
    /// and stays on it. A connection that is not registered over QUIC then (dialing, or lost),
    /// or starts later, registers over QUIC as it would have, and moves in its turn: while
    /// one moves, the others keep the tunnel up. Only while no connection has registered over
    /// QUIC yet does a connection starting dial HTTP/2 from the start, as all do after
    /// [`Connector::prefer_http2`].
    ///
    /// One connection moves at a time: the next starts only once the previous one has
    /// registered over HTTP/2, so the tunnel has at most one connection fewer than usual
    /// while it moves; with one HA connection it has none for as long as that one takes to
    /// move. A connection on HTTP/2 because of this preference (moving, moved, or started on
    /// it) that cannot reach the edge over HTTP/2 (TCP or TLS fails, or either takes over 5 s
    /// before the connection first registers over HTTP/2, 15 s after; or HTTP/2 does not get
    /// through end to end), or is refused registration for good, three
    /// times running since it last registered, or fails ten times in all, gives the
    /// preference up for the whole connector: it dials QUIC again at once, the connections on
    /// QUIC stay there, those registered over HTTP/2 serve on and dial QUIC once lost, and no
    /// connection moves until HTTP/2 is tried again (HTTP/2 does not reach the edge from here
    /// now, and a move would only take a connection down). A retryable refusal (a duplicate
    /// registration among them), or an RPC that fails, does not count towards the three and
    /// starts that count over: the edge answered over HTTP/2, so the connection retries with
    /// the usual backoff and keeps its turn.
    ///
    /// The give-up stands only where QUIC reaches the edge and HTTP/2 does not: it is logged
    /// as an error once a connection registers over QUIC after it. It is taken back at once
    /// (logged as a warning), the connections that left HTTP/2 for it going back to HTTP/2
    /// with their failures counted afresh, when the first QUIC attempt of one of them fails
    /// too (whatever the failure) while no connection is registered over QUIC: the edge or
    /// the network is down, and a tunnel on HTTP/2
    /// before the outage comes back on it, not on QUIC for the retry wait. Through a long
    /// outage they go on alternating, three HTTP/2 attempts to one over QUIC, with their
    /// usual backoff. It is also taken back when a connection registers over HTTP/2, or when
    /// the first registration after such an outage is over QUIC (whether the edge takes HTTP/2
    /// again is then found out by moving, one connection at a time).
    ///
    /// HTTP/2 is tried again by itself, while the connector runs, after
    /// [`ConnectorOptions::http2_retry`] (logged at info, `trying HTTP/2 to the edge
    /// again`): the connections on QUIC move one at a time as above, and the move is given up
    /// again by the same rule. The wait doubles each time HTTP/2 is given up again with no
    /// connection registered over it since the last try, up to an hour: a path that never
    /// carries HTTP/2 has a connection taken down for nothing once an hour at most.
    ///
    /// Returns at once; whether the call changed anything. Idempotent, the preference given
    /// up or not (it does not bring the next try forward); a connector configured `quic` or
    /// `http2`, or no longer running, ignores it.
    pub fn prefer_http2(&self) -> bool {
        if self.protocol != Protocol::Auto {
            return false;
        }
        self.state.send_if_modified(|s| {
            let change = s.running() && !s.http2;
            s.http2 |= change;
            change
        })
    }

    /// Immediate shutdown: connections close now, in-flight streams are
    /// reset, attempts in progress are abandoned. Returns when all
    /// connections have ended.
    pub async fn shutdown(&self) {
        self.state.send_modify(|s| s.run = RunState::Shutdown);
        self.closed().await;
    }

    /// Resolves once every connection task has ended.
    pub async fn closed(&self) {
        let mut rx = self.done.clone();
        let _ = rx.wait_for(|d| *d).await;
    }
}

async fn wait_state_change(state: &mut watch::Receiver<Control>) {
    let _ = state.wait_for(|s| !s.running()).await;
}

/// Where edge addresses come from: SRV discovery, and host names resolved (`TUNNEL_EDGE`
/// hosts, the region hosts). A seam, so that lookups failing at start and answering later
/// can be exercised without DNS.
pub(crate) trait EdgeResolver: Send + Sync + 'static {
    /// The discovered edge of `region`, tagged with the region (0 or 1) of each address.
    fn discover(
        &self,
        region: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Vec<(SocketAddr, u8)>, DiscoveryError>> + Send;
    /// The addresses of `edge`.
    fn resolve(
        &self,
        edge: &EdgeAddr,
    ) -> impl std::future::Future<Output = std::io::Result<Vec<SocketAddr>>> + Send;
}

/// The system's DNS (and DNS-over-TLS for discovery, see [`crate::discovery`]).
struct SystemResolver;

impl EdgeResolver for SystemResolver {
    async fn discover(
        &self,
        region: Option<&str>,
    ) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError> {
        crate::discovery::discover(region).await
    }

    async fn resolve(&self, edge: &EdgeAddr) -> std::io::Result<Vec<SocketAddr>> {
        edge.resolve().await
    }
}

async fn resolve_edges(shared: &Shared, resolver: &impl EdgeResolver) -> Vec<(SocketAddr, u8)> {
    let mut out = Vec::new();
    if shared.opts.edges.is_empty() {
        let version = shared.opts.edge_ip_version;
        // Checked by `Connector::new`.
        let endpoint =
            edge_region(shared.opts.region.as_deref(), shared.token.endpoint()).unwrap_or_default();
        match resolver.discover(endpoint).await {
            Ok(mut found) => {
                found.retain(|(a, _)| version.allows(a.ip()));
                if !found.is_empty() {
                    return found;
                }
                tracing::warn!(
                    ?version,
                    "edge discovery found no address of this IP version"
                );
            }
            Err(e) => tracing::warn!(error = %e, "edge discovery failed"),
        }
        return region_host_fallback(endpoint, version, |host| async move {
            resolver.resolve(&EdgeAddr::new(host, EDGE_PORT)).await
        })
        .await;
    }
    for (i, edge) in shared.opts.edges.iter().enumerate() {
        match resolver.resolve(edge).await {
            Ok(addrs) => {
                if let Some(a) = crate::edge::static_choice(&addrs) {
                    out.push((a, (i % 2) as u8));
                }
            }
            Err(e) => tracing::warn!(edge = %edge, error = %e, "edge lookup failed"),
        }
    }
    out
}

/// The edge region discovery asks for: the configured region, else the token's
/// endpoint (`cloudflared` treats the two alike and refuses both at once).
fn edge_region<'a>(
    region: Option<&'a str>,
    endpoint: Option<&'a str>,
) -> Result<Option<&'a str>, ConnectorError> {
    let endpoint = endpoint.filter(|e| !e.is_empty());
    let Some(region) = region.filter(|r| !r.is_empty()) else {
        return Ok(endpoint);
    };
    if let Some(endpoint) = endpoint {
        return Err(ConnectorError::RegionWithEndpoint {
            endpoint: endpoint.to_owned(),
        });
    }
    if !cftunnel_config::is_region_label(region) {
        return Err(ConnectorError::Region(region.to_owned()));
    }
    Ok(Some(region))
}

/// The global edge's well-known region hosts, resolved with `resolve`, for when
/// discovery fails. Not for a token with an endpoint (`fed`, ...) or a
/// configured region: its edge is found only through its own SRV name, as in
/// `cloudflared`, and the global hosts would take the tunnel out of it.
async fn region_host_fallback<F, Fut>(
    endpoint: Option<&str>,
    version: EdgeIpVersion,
    resolve: F,
) -> Vec<(SocketAddr, u8)>
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<Vec<SocketAddr>>>,
{
    let mut out = Vec::new();
    if endpoint.is_some_and(|e| !e.is_empty()) {
        tracing::warn!(
            endpoint,
            "edge discovery failed; retrying it (no fallback outside the token's endpoint)"
        );
        return out;
    }
    tracing::warn!("trying the edge region hosts");
    for (region, host) in REGION_HOSTS.iter().enumerate() {
        match resolve(host).await {
            Ok(addrs) => {
                let ips = addrs
                    .iter()
                    .map(SocketAddr::ip)
                    .filter(|ip| version.allows(*ip))
                    .collect();
                out.extend(crate::discovery::region_entries(
                    ips,
                    EDGE_PORT,
                    region as u8,
                ));
            }
            Err(e) => tracing::warn!(host, error = %e, "edge region lookup failed"),
        }
    }
    out
}

/// Whether a lookup found every address it looks for: each `TUNNEL_EDGE` host, or both
/// regions of discovery.
fn complete(shared: &Shared, entries: &[(SocketAddr, u8)]) -> bool {
    if shared.opts.edges.is_empty() {
        [0, 1].iter().all(|r| entries.iter().any(|(_, e)| e == r))
    } else {
        entries.len() == shared.opts.edges.len()
    }
}

/// The most connections one connector keeps: each registers with its own one-byte index
/// (`connIndex`), and the edge refuses a second connection on an index in use.
pub const MAX_HA_CONNECTIONS: usize = 256;

/// The wait before the edge is looked up again for addresses a lookup left out, doubled after
/// each lookup that still leaves some out, up to [`REFILL_MAX`].
const REFILL_FIRST: Duration = Duration::from_secs(10);
/// See [`REFILL_FIRST`].
const REFILL_MAX: Duration = Duration::from_secs(300);

/// Looks the edge up again while the lookup at start left addresses out (a discovery region
/// or a `TUNNEL_EDGE` host that did not resolve, a passing DNS failure): after `first`, then
/// after twice the wait each time, up to [`REFILL_MAX`], until a lookup is complete. It does
/// so whether or not every connection runs: what is found joins the pool, where a connection
/// moving on after a dial failure or a duplicate refusal finds it (the region left out may be
/// the one still up when the other fails), and raises `target`, the connections to run, up to
/// `wanted`. Returns then, or when the connector stops running.
async fn refill<F, Fut>(
    pool: &EdgePool,
    wanted: usize,
    target: &watch::Sender<usize>,
    first: Duration,
    state: &mut watch::Receiver<Control>,
    mut resolve: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (Vec<(SocketAddr, u8)>, bool)>,
{
    let mut wait = first;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wait_state_change(state) => return,
        }
        let (found, complete) = tokio::select! {
            found = resolve() => found,
            _ = wait_state_change(state) => return,
        };
        let added = pool.extend(found);
        if added > 0 {
            let usable = pool.usable().min(wanted);
            target.send_if_modified(|t| {
                let raise = usable > *t;
                if raise {
                    *t = usable;
                }
                raise
            });
            tracing::info!(
                added,
                connections = *target.borrow(),
                "a later edge lookup found more addresses"
            );
        }
        if complete {
            return;
        }
        wait = wait.saturating_mul(2).min(REFILL_MAX);
    }
}

async fn run_all<R: EdgeResolver>(
    shared: Arc<Shared>,
    done: watch::Sender<bool>,
    resolver: R,
    refill_first: Duration,
) {
    let mut state = shared.state.clone();
    let mut backoff = Backoff::new(shared.opts.backoff_base, shared.opts.retries);
    let entries = loop {
        // A drain or shutdown does not wait for a lookup (DNS may take its timeouts).
        let entries = tokio::select! {
            entries = resolve_edges(&shared, &resolver) => entries,
            _ = wait_state_change(&mut state) => {
                let _ = done.send(true);
                return;
            }
        };
        if !entries.is_empty() {
            break entries;
        }
        let wait = backoff.next_wait(rand::random::<f64>());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wait_state_change(&mut state) => {
                let _ = done.send(true);
                return;
            }
        }
    };
    tracing::debug!(edges = entries.len(), "edge addresses resolved");
    let incomplete = !complete(&shared, &entries);
    let pool = Arc::new(EdgePool::new(entries));
    let ha = shared.opts.ha_connections.min(pool.available()).max(1);
    if ha < shared.opts.ha_connections {
        tracing::warn!(
            requested = shared.opts.ha_connections,
            available = ha,
            "fewer edge addresses than HA connections"
        );
    }
    let (target_tx, target) = watch::channel(ha);
    // Looked up again from the start, not once a connection registers: the addresses left
    // out may be the only ones that answer.
    let lookups = async {
        if incomplete {
            let resolve = || async {
                let found = resolve_edges(&shared, &resolver).await;
                let complete = complete(&shared, &found);
                (found, complete)
            };
            let wanted = shared.opts.ha_connections;
            let mut state = shared.state.clone();
            refill(&pool, wanted, &target_tx, refill_first, &mut state, resolve).await;
        }
        // The connections to run are settled.
        drop(target_tx);
    };
    tokio::join!(
        lookups,
        run_indexes(&shared, &pool, target),
        retry_http2(&shared)
    );
    let _ = done.send(true);
}

/// Runs connection index 0 and, once it has registered (as `cloudflared` starts its HA
/// connections), the others the lookup at start found addresses for, one
/// [`ha_start_interval`] apart. Those `target` rises to later (a later lookup found more
/// addresses) start without waiting for a registration: the addresses found at start may be
/// the ones that never register. Returns when every connection has ended.
///
/// [`ha_start_interval`]: ConnectorOptions::ha_start_interval
async fn run_indexes(
    shared: &Arc<Shared>,
    pool: &Arc<EdgePool>,
    mut target: watch::Receiver<usize>,
) {
    let mut state = shared.state.clone();
    let mut set = JoinSet::new();
    spawn_index(&mut set, shared, pool, 0);
    let mut registered = shared.registered.subscribe();
    let initial = *target.borrow_and_update();
    let (mut first_registered, mut lookups_over) = (false, false);
    let mut started = 1;
    loop {
        let may_start = first_registered || started >= initial;
        if may_start && started < *target.borrow() {
            tokio::select! {
                _ = tokio::time::sleep(shared.opts.ha_start_interval) => {}
                _ = wait_state_change(&mut state) => break,
            }
            spawn_index(
                &mut set,
                shared,
                pool,
                u8::try_from(started).unwrap_or(u8::MAX),
            );
            started += 1;
            continue;
        }
        // Nothing more can start: the lookups are over and none waits for a registration.
        if lookups_over && may_start {
            break;
        }
        // Seen by the flag too: the count may be back to 0 by the time this task looks (the
        // connection moving to HTTP/2 right after it registered).
        let ever = || shared.ever_registered.load(Ordering::Relaxed);
        tokio::select! {
            r = registered.wait_for(|n| *n >= 1 || ever()), if !first_registered => match r {
                Ok(_) => first_registered = true,
                Err(_) => break,
            },
            // Closed once the lookups are over; a last raise is still seen first.
            changed = target.changed(), if !lookups_over => if changed.is_err() {
                lookups_over = true;
            },
            _ = wait_state_change(&mut state) => break,
        }
    }
    while set.join_next().await.is_some() {}
}

fn spawn_index(set: &mut JoinSet<()>, shared: &Arc<Shared>, pool: &Arc<EdgePool>, idx: u8) {
    // Debug level: an enabled span is entered and exited on every poll of the
    // connection's accept loop, i.e. on every request. The events operators see at
    // info and warn carry `conn_index` themselves.
    let span = tracing::debug_span!("edge_connection", conn_index = idx);
    set.spawn(supervise(shared.clone(), pool.clone(), idx).instrument(span));
}

/// Failed HTTP/2 attempts in a row after which a connection on HTTP/2 because the connector
/// prefers it gives the preference up; only the failures [`counts_against_move`] says so
/// count.
const MOVE_ATTEMPTS: u32 = 3;

/// Failed HTTP/2 attempts of any kind after which a connection on HTTP/2 by preference gives
/// it up: an edge that keeps answering with transient errors must not keep the tunnel a
/// connection short for good (with one HA connection, with none).
const MOVE_TRIES: u32 = 10;

/// Whether a failed HTTP/2 attempt of a connection on HTTP/2 by preference (moving, moved or
/// started on it) says HTTP/2 cannot serve this tunnel: the edge unreachable over TCP or TLS,
/// HTTP/2 not getting through end to end (no preface, no control stream: a middlebox that
/// passes the handshake and drops the flow), or a registration refused for good. A retryable
/// refusal (a duplicate registration is one), or an RPC that failed, came from an edge HTTP/2
/// does reach: it does not count and starts the count over, and the attempt is retried with
/// the usual backoff, up to [`MOVE_TRIES`] in all. A moving connection keeps its turn
/// meanwhile, so no other one moves and the tunnel stays at most one connection short.
fn counts_against_move(error: &ConnError) -> bool {
    match error {
        ConnError::Dial { .. } | ConnError::ControlStream(_) => true,
        ConnError::Refused(r) => !r.should_retry && !r.is_duplicate(),
        ConnError::Rpc(_) => false,
    }
}

/// The failed HTTP/2 attempts of a connection on HTTP/2 by preference since it last
/// registered: [`MoveFailures::failed`] says when to give the preference up.
#[derive(Debug, Default, Clone, Copy)]
struct MoveFailures {
    in_a_row: u32,
    total: u32,
}

impl MoveFailures {
    /// Takes in a failed attempt; whether the preference is to be given up.
    fn failed(&mut self, error: &ConnError) -> bool {
        self.total += 1;
        if counts_against_move(error) {
            self.in_a_row += 1;
        } else {
            self.in_a_row = 0;
        }
        self.in_a_row >= MOVE_ATTEMPTS || self.total >= MOVE_TRIES
    }
}

/// Gives the preference for HTTP/2 up for the whole connector, until it is tried again (see
/// [`retry_http2`]) or the give-up is taken back (see [`Http2Retry`]): the edge is not
/// reachable over HTTP/2 from here (TCP to it blocked, say, or down for now), and a tunnel on
/// QUIC serves everything but gRPC's status, where one that kept dialing HTTP/2 would serve
/// nothing. The connections on QUIC stay there, those registered over HTTP/2 serve on and dial
/// QUIC once lost, and no connection moves meanwhile. `tried`: the try of HTTP/2 the failures
/// were counted in (see [`Control::http2_try`]); a later try is not given up for them.
///
/// For the whole connector, not the one connection, whether the preference was there from the
/// start, the connection was moving, or it had registered over HTTP/2 and was lost: all its
/// connections take the same path to the edge, so the others would fail alike when next they
/// dial; a tunnel left part on QUIC and part on HTTP/2 would lose gRPC's status on some
/// requests and not others, harder to tell than one error; and a connection back on QUIC
/// while the connector still preferred HTTP/2 would be moved again, and fail again, in a loop.
///
/// Logged as a warning: whether it stands is known once QUIC has been tried, and the error
/// that says gRPC loses its status comes then (see [`registered_over`](crate::connection::registered_over)), each time, however
/// often HTTP/2 was given up before.
fn give_up_move(
    shared: &Shared,
    idx: u8,
    tried: u32,
    turn: Option<tokio::sync::OwnedSemaphorePermit>,
    error: &ConnError,
) {
    let mut given_up = false;
    if let Some(control) = shared.control.upgrade() {
        control.send_if_modified(|c| {
            if !c.running() || !shared.moves_to_http2(c) || c.http2_try != tried {
                return false;
            }
            c.http2_given_up = true;
            // Within the send: the retry task, which it wakes, reads the wait set here.
            let registered = shared.http2_registered.swap(false, Ordering::Relaxed);
            retry_state(shared).given_up(registered, error.to_string());
            given_up = true;
            true
        });
    }
    // Given up before the turn goes back, so that no connection waiting for it moves.
    drop(turn);
    if !given_up {
        // Given up by another connection at the same time (and said once), or the connector
        // no longer runs.
        return;
    }
    tracing::warn!(
        conn_index = idx,
        error = %error,
        "HTTP/2 to the edge keeps failing: trying QUIC, to tell a path closed to HTTP/2 from \
         an outage of the edge or the network"
    );
}

/// Whether the failed first QUIC attempt of a connection that left HTTP/2 when the preference
/// was given up (`error`) tells of an outage of the edge or the network, with `quic_serving`
/// connections registered over QUIC right now.
///
/// Not while one is: QUIC reaches the edge, and what failed is this connection's address or
/// attempt; taking the give-up back then would have a connection serving over QUIC move (its
/// turn free again) while this one dials HTTP/2 too, two connections down at once. Otherwise
/// any failure does: the give-up stands only once QUIC registers, and an attempt that got as
/// far as the edge's answer (no control stream, a refusal, an RPC error) did not, as an edge
/// restarting or failing fails HTTP/2 alike. Read as a path closed to HTTP/2, it would have
/// the edge's first QUIC registration once it recovers confirm the give-up, and gRPC lose its
/// status for the whole wait; read as an outage where it was not one, it costs one more round
/// of HTTP/2 attempts before the give-up stands.
fn quic_failure_says_outage(error: &ConnError, quic_serving: usize) -> bool {
    if quic_serving > 0 {
        return false;
    }
    match error {
        ConnError::Dial { .. } | ConnError::ControlStream(_) => true,
        ConnError::Refused(_) | ConnError::Rpc(_) => true,
    }
}

/// The first QUIC attempt of a connection that left HTTP/2 when the preference was given up
/// failed too (`error`), with no connection serving over QUIC (see
/// [`quic_failure_says_outage`]): an outage, not a path closed to HTTP/2, so the give-up is
/// taken back, unless a QUIC registration confirmed it meanwhile (see [`Http2Retry`]).
fn quic_unreachable(shared: &Shared, idx: u8, error: &ConnError) {
    let Some(control) = shared.control.upgrade() else {
        return;
    };
    let taken_back = control.send_if_modified(|c| {
        if !c.running() || !c.http2 || !c.http2_given_up {
            return false;
        }
        let verdict = retry_state(shared).quic_unreachable();
        take_back(shared, c, &verdict)
    });
    if taken_back {
        tracing::warn!(
            conn_index = idx,
            error = %error,
            "QUIC does not reach the edge either: the edge or the network is down, HTTP/2 is \
             not blocked, so the tunnel keeps preferring HTTP/2"
        );
    }
}

/// Tries HTTP/2 again each time the preference for it is given up, once the wait
/// [`Http2Retry`] sets is over: the connections on QUIC then move to HTTP/2 one at a time, as
/// after [`ConnectorHandle::prefer_http2`], and the move is given up again by the same rule.
/// A give-up taken back before then ends its wait. Returns when the connector stops running; a
/// drain or shutdown ends a wait in progress, so neither waits for the next try.
async fn retry_http2(shared: &Shared) {
    if shared.opts.protocol != Protocol::Auto {
        return;
    }
    let mut state = shared.state.clone();
    let mut tries = 0u32;
    loop {
        // The try the give-up ended.
        let given_up = state
            .wait_for(|c| !c.running() || c.http2_given_up)
            .await
            .ok()
            .filter(|c| c.running())
            .map(|c| c.http2_try);
        let Some(given_up) = given_up else {
            return;
        };
        let wait = retry_state(shared).wait();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            over = state.wait_for(|c| {
                !c.running() || !c.http2_given_up || c.http2_try != given_up
            }) => {
                if over.is_ok_and(|c| c.running()) {
                    // Taken back (and maybe given up again since, with a wait of its own).
                    continue;
                }
                return;
            }
        }
        let Some(control) = shared.control.upgrade() else {
            return;
        };
        let tried = control.send_if_modified(|c| {
            if !c.running() || !c.http2_given_up || c.http2_try != given_up {
                return false;
            }
            c.http2_given_up = false;
            c.http2_try = c.http2_try.wrapping_add(1);
            // Registrations count from this try on (see `Http2Retry::given_up`).
            shared.http2_registered.store(false, Ordering::Relaxed);
            retry_state(shared).tried_again();
            true
        });
        drop(control);
        if tried {
            tries = tries.saturating_add(1);
            tracing::info!(
                tries,
                after_s = wait.as_secs(),
                "trying HTTP/2 to the edge again: the connections on QUIC move to it one at a time"
            );
        }
    }
}

/// A connection on HTTP/2 because the connector prefers it: its failed attempts since it last
/// registered, in the try of HTTP/2 they count towards (see [`Control::http2_try`]).
#[derive(Debug, Clone, Copy)]
struct Preferred {
    tried: u32,
    failures: MoveFailures,
    /// It has registered over HTTP/2 since it took the preference up (at its start, in a move,
    /// or when a give-up was taken back).
    registered: bool,
}

impl Preferred {
    /// No failure yet, in the current try.
    fn new(shared: &Shared) -> Self {
        Self::in_try(shared.state.borrow().http2_try)
    }

    /// Taking the preference up in try `tried`: not registered over HTTP/2 yet.
    fn in_try(tried: u32) -> Self {
        Self {
            tried,
            failures: MoveFailures::default(),
            registered: false,
        }
    }

    /// It registered over HTTP/2 (and was lost since), in try `now`: HTTP/2 reached the edge,
    /// its failures count afresh.
    fn registered(&mut self, now: u32) {
        *self = Self {
            registered: true,
            ..Self::in_try(now)
        };
    }

    /// Whether its HTTP/2 attempts get the short dial timeout (see
    /// `http2::PREFERRED_DIAL_TIMEOUT`): only until it first registers over HTTP/2. Until then
    /// a silent edge most likely means a path that drops TCP, and QUIC is the way out; once it
    /// has, the path carries HTTP/2, and a slow connect or TLS handshake on a lossy link gets
    /// the usual time rather than counting against the preference.
    fn short_dials(&self) -> bool {
        !self.registered
    }

    /// Takes in a failed attempt; the try to give up, if it is to be. Failures counted in an
    /// earlier try (HTTP/2 was given up and tried again since) are left out: they tell nothing
    /// of the edge now.
    fn failed(&mut self, shared: &Shared, error: &ConnError) -> Option<u32> {
        let now = shared.state.borrow().http2_try;
        if now != self.tried {
            *self = Self {
                registered: self.registered,
                ..Self::in_try(now)
            };
        }
        self.failures.failed(error).then_some(self.tried)
    }
}

/// A connection that was on HTTP/2 by preference and left it for QUIC when the preference was
/// given up, until it registers: it goes back to HTTP/2 if the give-up is taken back (or HTTP/2
/// tried again) before then, and its first QUIC attempt tells whether the give-up stands (see
/// [`Http2Retry`]).
#[derive(Debug, Clone, Copy)]
struct LeftHttp2 {
    /// Its next QUIC attempt is the first since it left with no other connection counted as
    /// serving over QUIC: the one whose failure reads as an outage.
    first_quic: bool,
}

impl LeftHttp2 {
    const NOW: Self = Self { first_quic: true };
}

/// The transport a connection of a connector configured `protocol` dials first: HTTP/2 when
/// an `auto` connector prefers it from this connection's start (`prefers_http2`: nothing
/// serves on it yet, so it needs no turn to move; see [`supervise`] for when), else as
/// `cloudflared` starts it, on the first connection's transport (`first_on_http2`, for
/// connections other than the first) or on QUIC.
fn first_transport(protocol: Protocol, prefers_http2: bool, first_on_http2: bool) -> Transport {
    match protocol {
        Protocol::Auto if prefers_http2 || first_on_http2 => Transport::Http2,
        Protocol::Auto | Protocol::Quic => Transport::Quic,
        Protocol::Http2 => Transport::Http2,
    }
}

async fn supervise(shared: Arc<Shared>, pool: Arc<EdgePool>, idx: u8) {
    let opts = &shared.opts;
    let auto = opts.protocol == Protocol::Auto;
    // HTTP/2 from the start, with no turn, only while no connection has registered over QUIC.
    // Once one has, a connection starting may find another moving with the turn, unregistered:
    // starting on HTTP/2 as well, it would leave the tunnel more than one connection short, and
    // with none at all, for as long as HTTP/2 takes to be given up, where it cannot reach the
    // edge. It starts on QUIC, and moves in its turn.
    let prefers_http2 =
        auto && shared.prefers_http2() && !shared.quic_ever_registered.load(Ordering::Relaxed);
    let mut transport = first_transport(
        opts.protocol,
        prefers_http2,
        idx != 0 && shared.first_on_http2.load(Ordering::Relaxed),
    );
    // On HTTP/2 because the connector prefers it (from the start, or moved to it), not because
    // it was configured or fell back: its failed attempts there since it last registered, which
    // may give the preference up (see `give_up_move`).
    let mut preferred = prefers_http2.then(|| Preferred::new(&shared));
    let mut left: Option<LeftHttp2> = None;
    // On HTTP/2 after falling back, until a connection registers.
    let mut in_fallback = false;
    let mut backoff = Backoff::new(opts.backoff_base, opts.retries);
    // Waits for a free address have a backoff of their own: they are not attempts,
    // so they count neither in `numPreviousAttempts` nor towards the fallback.
    let mut address_wait = Backoff::new(opts.backoff_base, opts.retries);
    let mut dial_failures = DialFailures::default();
    let mut state = shared.state.clone();
    // The turn of this connection's move from QUIC to HTTP/2, while it has one: held until
    // it registers over HTTP/2, through the HTTP/2 attempts that fail meanwhile.
    let mut turn = None;
    if idx != 0 {
        shared.ha_backoff.connecting();
    }
    loop {
        if shared.run_state() != RunState::Running {
            return;
        }
        if preferred.is_some() && !shared.prefers_http2() {
            // Another connection gave the preference up (and said why).
            tracing::info!(conn_index = idx, "HTTP/2 was given up: dialing QUIC");
            preferred = None;
            turn = None;
            transport = Transport::Quic;
            left = Some(LeftHttp2::NOW);
        } else if left.is_some() && shared.prefers_http2() {
            // Taken back, or tried again, before this connection registered over QUIC: it
            // serves nothing, so it goes back at once, with the turn if it is free, so that no
            // connection that serves moves while it is down.
            tracing::info!(
                conn_index = idx,
                "HTTP/2 is preferred again: dialing HTTP/2"
            );
            left = None;
            preferred = Some(Preferred::new(&shared));
            turn = shared.moves.clone().try_acquire_owned().ok();
            transport = Transport::Http2;
        }
        let Some(addr) = pool.address(idx) else {
            // A moving connection keeps its turn meanwhile: it is the one connection short.
            // Every address of the regions' active families is taken (one moved to IPv4
            // with fewer addresses): wait and look again, as `cloudflared` retries.
            let wait = address_wait.next_wait(rand::random::<f64>());
            tracing::warn!(conn_index = idx, "no free edge address; retrying");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = wait_state_change(&mut state) => return,
            }
            continue;
        };
        address_wait.reset();
        let label = match transport {
            Transport::Quic => ProtocolLabel::Quic,
            Transport::Http2 => ProtocolLabel::Http2,
        };
        let attempt = u8::try_from(backoff.retries()).unwrap_or(u8::MAX);
        let span = tracing::debug_span!("attempt", protocol = label.as_str(), edge = %addr);
        let result = match transport {
            Transport::Quic => {
                crate::quic::connect(&shared, idx, addr, attempt)
                    .instrument(span)
                    .await
            }
            Transport::Http2 => {
                let short_dials = preferred.is_some_and(|p| p.short_dials());
                crate::http2::connect(&shared, idx, addr, attempt, &mut turn, short_dials)
                    .instrument(span)
                    .await
            }
        };
        // Whether the failure may change the protocol, as `cloudflared` decides it,
        // and whether QUIC looks blocked.
        let (may_switch, quic_broken) = match result {
            Ok(Ended::Stopped) => return,
            Ok(Ended::Moved { turn: moving }) => {
                // Closed on purpose, to register over HTTP/2 now: no failure, no wait.
                turn = Some(moving);
                preferred = Some(Preferred::new(&shared));
                left = None;
                transport = Transport::Http2;
                backoff.reset();
                in_fallback = false;
                if idx != 0 {
                    shared.ha_backoff.connecting();
                }
                continue;
            }
            Ok(Ended::Lost { idle_timeout }) => {
                tracing::warn!(conn_index = idx, edge = %addr, idle_timeout, "edge connection lost");
                backoff.reset();
                in_fallback = false;
                left = None;
                // It registered: HTTP/2 reached the edge, its failures count afresh.
                if let Some(preferred) = &mut preferred {
                    preferred.registered(shared.state.borrow().http2_try);
                }
                if idx != 0 {
                    shared.ha_backoff.connecting();
                }
                (true, false)
            }
            Err(e) => {
                shared.metrics.failed(label, e.cause());
                tracing::warn!(conn_index = idx, edge = %addr, error = %e, "edge connection failed");
                // Only an edge HTTP/2 does not reach, or one that will not take this
                // connection over it, counts; one that answers with a transient error shows
                // HTTP/2 gets through, and the connection retries (a moving one with its turn).
                if let Some(tried) = preferred.as_mut().and_then(|p| p.failed(&shared, &e)) {
                    give_up_move(&shared, idx, tried, turn.take(), &e);
                    // Over QUIC at once: this connection has been down a while. Its backoff
                    // goes on, so that through an outage, HTTP/2 and QUIC failing in turn, it
                    // waits as long as any reconnect does.
                    preferred = None;
                    transport = Transport::Quic;
                    left = Some(LeftHttp2::NOW);
                    continue;
                }
                if let Some(left) = left.as_mut() {
                    let quic_serving = shared.quic_registered.load(Ordering::Relaxed);
                    // While a connection counts as serving over QUIC, this attempt tells
                    // nothing, and the next one asks again: that connection may be one the
                    // outage has cut and QUIC has not timed out yet (its idle timeout).
                    if left.first_quic && transport == Transport::Quic && quic_serving == 0 {
                        left.first_quic = false;
                        if quic_failure_says_outage(&e, quic_serving) {
                            quic_unreachable(&shared, idx, &e);
                        }
                    }
                }
                match e {
                    ConnError::Refused(r) if r.is_duplicate() => {
                        pool.rotate(idx);
                        (false, false)
                    }
                    ConnError::Refused(r) => (r.should_retry, false),
                    ConnError::Dial { unanswered, .. } => {
                        pool.rotate(idx);
                        (dial_failures.exhausted(), unanswered)
                    }
                    ConnError::ControlStream(_) | ConnError::Rpc(_) => (true, false),
                }
            }
        };
        let wait = backoff.next_wait(rand::random::<f64>());
        shared.metrics.reconnect(label);
        tracing::info!(
            conn_index = idx,
            wait_ms = wait.as_millis() as u64,
            "retrying edge connection"
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wait_state_change(&mut state) => return,
        }
        // A connection on HTTP/2 while the connector prefers it stays there, until the
        // preference is given up; one that left it then goes where the preference says.
        if auto
            && may_switch
            && preferred.is_none()
            && left.is_none()
            && !shared.quic_ever_registered.load(Ordering::Relaxed)
            && !(transport == Transport::Http2 && shared.prefers_http2())
        {
            let next = next_transport(transport, in_fallback, backoff.exhausted(), quic_broken);
            if next != transport {
                if next == Transport::Http2 {
                    tracing::warn!(
                        conn_index = idx,
                        "QUIC keeps failing; falling back to HTTP/2"
                    );
                    in_fallback = true;
                    backoff.reset();
                } else {
                    tracing::info!(conn_index = idx, "trying QUIC again");
                }
                transport = next;
                if idx == 0 {
                    shared
                        .first_on_http2
                        .store(transport == Transport::Http2, Ordering::Relaxed);
                }
            }
        }
        // The first connection restarts on its own backoff alone; the others also wait on the
        // shared one, so that an edge failing them all does not have them all dial at once.
        if idx != 0 {
            let at = shared
                .ha_backoff
                .restart_at(tokio::time::Instant::now(), rand::random());
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = wait_state_change(&mut state) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
