//! A mock Cloudflare edge for tests, load tests and local demos.
//!
//! It listens for connectors on one port number over QUIC (UDP) and
//! TLS/TCP (HTTP/2 transport) with a generated test CA, answers
//! `registerConnection`, and forwards requests from a local plain-HTTP
//! listener through the registered connections, spread round-robin across
//! those that have not unregistered (a request goes on to the next one when
//! a connection cannot open its stream), with the headers Cloudflare's edge
//! adds (`Cf-Connecting-Ip`, `X-Forwarded-For`, `X-Forwarded-Proto`,
//! `Cf-Visitor`, `Cf-Ray`, `CDN-Loop`) and without connection-specific ones
//! in either direction. Registration errors can be switched on
//! for negative tests, and configurations can be pushed to connectors.
//!
//! Paths under `/__mock-edge/` on the HTTP listener are not forwarded; they
//! are the mock's own admin API: `GET /__mock-edge/connections`,
//! `PUT /__mock-edge/config?version=N` (JSON body: the tunnel's configuration,
//! pushed to every serving connection and to each one that registers later) and `PUT /__mock-edge/registration-error?cause=TEXT` (empty
//! cause: accept registrations again).
//!
//! Each `registerConnection` call is kept with the time it arrived, so tests can
//! check when connectors retry, and [`MockEdge::close_connections`] drops every
//! connection at once while the mock keeps listening.

mod admin;
mod answer;
mod eyeball;
mod forward;
mod key_exchange;
mod listen;
pub mod rpc;

pub use forward::STREAM_OPEN_TIMEOUT;
pub use listen::{H2_PING_INTERVAL, H2_PING_TIMEOUT, REGISTRATION_TIMEOUT};

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cftunnel_tunnel::rpc::{LocalWorker, RpcError};
use cftunnel_tunnel::{ConnectionDetails, EdgeRefusal, Token};

use crate::pki::{PkiError, TestPki};
pub use key_exchange::key_exchange_group_by_name;
use rpc::RegistrationHooks;
pub use rpc::RegistrationRecord;

/// The scheme the mock edge states its eyeballs used (`X-Forwarded-Proto`, `Cf-Visitor`).
/// The request URIs connectors see say `https` either way, as Cloudflare's `dest` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VisitorScheme {
    /// An HTTPS zone, what the mock stands for unless told otherwise.
    #[default]
    Https,
    /// A zone that serves plain HTTP too: its eyeballs' requests are marked `http`.
    Http,
}

/// Mock edge errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MockEdgeError {
    /// Binding or I/O failed.
    #[error("mock edge i/o: {0}")]
    Io(#[from] std::io::Error),
    /// TLS setup failed.
    #[error(transparent)]
    Tls(#[from] PkiError),
    /// An RPC to a connector failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// A connection could not carry the request.
    #[error("connector stream failed: {0}")]
    Stream(String),
    /// The connector answered a configuration push with an error.
    #[error("connector rejected the request: {0}")]
    Rejected(String),
    /// No response head came from the connector within the edge's timeout.
    #[error("no response from the connector in time")]
    Timeout,
}

/// Transport of a connector connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeProtocol {
    /// QUIC.
    Quic,
    /// HTTP/2 over TLS/TCP.
    Http2,
}

/// Snapshot of one connector connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Mock-local id.
    pub id: u64,
    /// Transport.
    pub protocol: EdgeProtocol,
    /// `connIndex` once registered.
    pub conn_index: Option<u8>,
    /// Registered successfully.
    pub registered: bool,
    /// Called `unregisterConnection` (no new requests are sent to it).
    pub draining: bool,
    /// Requests forwarded through it so far.
    pub requests: u64,
    /// Key-exchange group the TLS handshake negotiated.
    pub key_exchange_group: Option<rustls::NamedGroup>,
    /// The configuration version the connector last reported as applied.
    pub config_version: Option<i32>,
}

/// A `registerConnection` call and when the mock edge received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedRegistration {
    /// When the call arrived, before the mock decided its answer.
    pub received_at: Instant,
    /// What the connector sent.
    pub record: RegistrationRecord,
}

/// How many registrations and local configurations the mock edge keeps.
/// Older entries are dropped first, so a long-running mock (load tests,
/// demos with reconnecting connectors) stays within bounded memory.
pub const HISTORY_LIMIT: usize = 1024;

/// How many bytes of `updateLocalConfiguration` documents the mock edge keeps in
/// all: each may be up to 8 MiB, so the entry count alone does not bound them.
/// The oldest documents are dropped first; the newest one is always kept.
pub const LOCAL_CONFIG_BYTES_LIMIT: usize = 16 * 1024 * 1024;

/// Appends to a history list, dropping the oldest entries past
/// [`HISTORY_LIMIT`].
fn push_bounded<T>(list: &mut VecDeque<T>, item: T) {
    while list.len() >= HISTORY_LIMIT {
        list.pop_front();
    }
    list.push_back(item);
}

/// The local configuration documents received, oldest first, within [`HISTORY_LIMIT`]
/// entries and [`LOCAL_CONFIG_BYTES_LIMIT`] bytes.
#[derive(Default)]
struct LocalConfigs {
    docs: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl LocalConfigs {
    fn push(&mut self, doc: Vec<u8>) {
        while !self.docs.is_empty()
            && (self.docs.len() >= HISTORY_LIMIT
                || self.bytes + doc.len() > LOCAL_CONFIG_BYTES_LIMIT)
        {
            if let Some(old) = self.docs.pop_front() {
                self.bytes -= old.len();
            }
        }
        self.bytes += doc.len();
        self.docs.push_back(doc);
    }
}

#[derive(Clone)]
pub(crate) enum Transport {
    Quic(quinn::Connection),
    H2(h2::client::SendRequest<Bytes>),
}

struct ConnEntry {
    transport: Transport,
    client_id: Option<Vec<u8>>,
    info: ConnectionInfo,
    /// Cancelled to close this connection (a child of the mock's own token).
    close: CancellationToken,
}

impl ConnEntry {
    /// Registered and not draining: the edge sends it requests.
    fn is_serving(&self) -> bool {
        self.info.registered && !self.info.draining
    }
}

#[derive(Default)]
struct State {
    conns: BTreeMap<u64, ConnEntry>,
    registration_error: Option<EdgeRefusal>,
    /// How long `unregisterConnection` takes before the edge acts on it and answers.
    unregister_delay: Duration,
    records: VecDeque<ReceivedRegistration>,
    local_configs: LocalConfigs,
    /// The tunnel's current remote configuration, as the edge keeps it: the last one
    /// pushed, sent again to every connection that registers.
    remote_config: Option<(i32, Bytes)>,
    next_id: u64,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    serving: watch::Sender<usize>,
    /// Serving connections that have applied the tunnel's current configuration.
    configured: watch::Sender<usize>,
    pub(crate) worker: LocalWorker,
    next_pick: AtomicUsize,
    remotely_managed: bool,
    credentials: Option<Token>,
    pub(crate) cancel: CancellationToken,
    pub(crate) tasks: TaskTracker,
    /// The runtime the mock was started on: registration hooks run on the RPC
    /// worker's thread, and the work they start belongs here.
    runtime: tokio::runtime::Handle,
    /// How long a forwarded request waits for the connector's response head.
    response_timeout: Duration,
    /// How long opening a stream on a QUIC connection may take.
    pub(crate) stream_open_timeout: Duration,
    /// How long a connection may go without a registration from its accept on.
    registration_timeout: Duration,
    /// HTTP/2 liveness: a PING this often, and the connection closed when one goes
    /// unanswered, with nothing read, for `h2_ping_timeout`.
    h2_ping_interval: Duration,
    h2_ping_timeout: Duration,
    /// What the edge headers say the eyeballs used.
    pub(crate) visitor_scheme: VisitorScheme,
}

impl Inner {
    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        let mut s = self.state.lock().ok()?;
        let out = f(&mut s);
        let live = || s.conns.values().filter(|c| c.is_serving());
        let serving = live().count();
        let current = s.remote_config.as_ref().map(|(v, _)| *v);
        let configured = live()
            .filter(|c| current.is_some() && c.info.config_version >= current)
            .count();
        for (watch, count) in [(&self.serving, serving), (&self.configured, configured)] {
            watch.send_if_modified(|n| {
                let changed = *n != count;
                *n = count;
                changed
            });
        }
        Some(out)
    }

    /// Adds a connection; returns its id and the token that closes it, which
    /// [`MockEdge::close_connections`] and [`MockEdge::shutdown`] cancel.
    pub(crate) fn add_connection(
        &self,
        transport: Transport,
        protocol: EdgeProtocol,
        key_exchange_group: Option<rustls::NamedGroup>,
    ) -> (u64, CancellationToken) {
        let close = self.cancel.child_token();
        let id = self
            .with_state(|s| {
                s.next_id += 1;
                let id = s.next_id;
                s.conns.insert(
                    id,
                    ConnEntry {
                        transport,
                        client_id: None,
                        info: ConnectionInfo {
                            id,
                            protocol,
                            conn_index: None,
                            registered: false,
                            draining: false,
                            requests: 0,
                            key_exchange_group,
                            config_version: None,
                        },
                        close: close.clone(),
                    },
                );
                id
            })
            .unwrap_or(0);
        (id, close)
    }

    pub(crate) fn remove_connection(&self, id: u64) {
        self.with_state(|s| s.conns.remove(&id));
    }

    /// Serving connections in id order, rotated round-robin.
    pub(crate) fn pick(&self) -> Vec<(u64, Transport)> {
        let mut list = match self.state.lock() {
            Ok(s) => s
                .conns
                .values()
                .filter(|c| c.is_serving())
                .map(|c| (c.info.id, c.transport.clone()))
                .collect::<Vec<_>>(),
            Err(_) => Vec::new(),
        };
        if !list.is_empty() {
            let n = self.next_pick.fetch_add(1, Ordering::Relaxed) % list.len();
            list.rotate_left(n);
        }
        list
    }

    /// The next serving connection in round-robin turn, leaving out those in `tried`:
    /// what [`pick`](Self::pick) gives first, for one request, with one lock, no list
    /// and no copy of the other connections' handles.
    pub(crate) fn next_serving(&self, tried: &[u64]) -> Option<(u64, Transport)> {
        let s = self.state.lock().ok()?;
        let open = |c: &&ConnEntry| c.is_serving() && !tried.contains(&c.info.id);
        let count = s.conns.values().filter(open).count();
        if count == 0 {
            return None;
        }
        let n = self.next_pick.fetch_add(1, Ordering::Relaxed) % count;
        s.conns
            .values()
            .filter(open)
            .nth(n)
            .map(|c| (c.info.id, c.transport.clone()))
    }

    /// Pushes `config` (version `version`) to every serving connection and returns
    /// each one's answer. A JSON document newer than the kept one becomes the
    /// tunnel's configuration; an older or malformed push (for negative tests) is
    /// sent but not kept.
    pub(crate) async fn set_remote_config(
        &self,
        version: i32,
        config: Bytes,
    ) -> Vec<(u64, Result<i32, MockEdgeError>)> {
        if serde_json::from_slice::<serde::de::IgnoredAny>(&config).is_ok() {
            self.with_state(|s| {
                if s.remote_config.as_ref().is_none_or(|(v, _)| version > *v) {
                    s.remote_config = Some((version, config.clone()));
                }
            });
        }
        // All at once: a connection that takes its time holds up no other.
        let pushes = self.pick().into_iter().map(|(id, t)| {
            let config = config.to_vec();
            async move {
                let r = forward::push_config(self, t, version, config).await;
                if let Ok(applied) = r {
                    self.record_applied(id, applied);
                }
                (id, r)
            }
        });
        futures_util::future::join_all(pushes).await
    }

    /// Whether connection `id` has registered.
    fn is_registered(&self, id: u64) -> bool {
        self.with_state(|s| s.conns.get(&id).is_some_and(|c| c.info.registered))
            .unwrap_or(false)
    }

    fn record_applied(&self, id: u64, applied: i32) {
        self.with_state(|s| {
            if let Some(c) = s.conns.get_mut(&id) {
                // Answers to pushes can arrive out of order; a connector never goes back.
                c.info.config_version = c.info.config_version.max(Some(applied));
            }
        });
    }

    /// Counts a request forwarded on connection `id`. Once per request, so it takes the lock
    /// directly: nothing the serving and configured counts depend on changes here.
    pub(crate) fn count_request(&self, id: u64) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(c) = s.conns.get_mut(&id) {
                c.info.requests += 1;
            }
        }
    }

    fn hooks(
        self: &Arc<Self>,
        id: u64,
        answered: tokio::sync::mpsc::Sender<listen::Answered>,
        answer_sent: Arc<listen::AnswerSent>,
    ) -> Arc<dyn RegistrationHooks> {
        Arc::new(ConnHooks {
            inner: self.clone(),
            id,
            answered,
            answer_sent,
        })
    }

    /// A remotely managed tunnel's connector gets its configuration from the edge
    /// only (`cloudflared` answers 503 until it has one), so the edge sends the
    /// current one to every connection once its registration has been answered.
    fn send_current_config(self: &Arc<Self>, id: u64) {
        let inner = self;
        if !inner.remotely_managed {
            return;
        }
        let Some(((version, config), transport)) = inner
            .with_state(|s| {
                let config = s.remote_config.clone()?;
                let transport = s.conns.get(&id)?.transport.clone();
                Some((config, transport))
            })
            .flatten()
        else {
            return;
        };
        let push_inner = inner.clone();
        let push = async move {
            match forward::push_config(&push_inner, transport, version, config.to_vec()).await {
                Ok(applied) => {
                    push_inner.record_applied(id, applied);
                    tracing::info!(conn = id, version, applied, "configuration sent")
                }
                Err(e) => {
                    tracing::info!(conn = id, version, error = %e, "configuration not applied")
                }
            }
        };
        inner.runtime.spawn(inner.tasks.track_future(push));
    }
}

struct ConnHooks {
    inner: Arc<Inner>,
    id: u64,
    answered: tokio::sync::mpsc::Sender<listen::Answered>,
    answer_sent: Arc<listen::AnswerSent>,
}

impl RegistrationHooks for ConnHooks {
    fn register(&self, record: RegistrationRecord) -> Result<ConnectionDetails, EdgeRefusal> {
        let received_at = Instant::now();
        let inner = &self.inner;
        let (conn_index, version, arch, features) = (
            record.conn_index,
            record.version.clone(),
            record.arch.clone(),
            record.features.join(","),
        );
        let mut key_exchange = String::from("unknown");
        let result = inner
            .with_state(|s| {
                push_bounded(
                    &mut s.records,
                    ReceivedRegistration {
                        received_at,
                        record: record.clone(),
                    },
                );
                if let Some(g) = s
                    .conns
                    .get(&self.id)
                    .and_then(|c| c.info.key_exchange_group)
                {
                    key_exchange = format!("{g:?}");
                }
                if let Some(err) = s.registration_error.clone() {
                    return Err(err);
                }
                if let Some(creds) = &inner.credentials {
                    if record.account_tag != creds.account_tag()
                        || record.tunnel_secret != creds.tunnel_secret()
                        || record.tunnel_id != creds.tunnel_id().as_bytes()
                    {
                        return Err(EdgeRefusal {
                            cause: "Unauthorized: invalid tunnel credentials".into(),
                            retry_after: Duration::ZERO,
                            should_retry: false,
                        });
                    }
                }
                let duplicate = s.conns.values().any(|c| {
                    c.info.id != self.id
                        && c.info.registered
                        && c.info.conn_index == Some(record.conn_index)
                        && c.client_id.as_deref() == Some(record.client_id.as_slice())
                });
                if duplicate {
                    return Err(EdgeRefusal {
                        cause: "EDUPCONN".into(),
                        retry_after: Duration::ZERO,
                        should_retry: true,
                    });
                }
                if let Some(c) = s.conns.get_mut(&self.id) {
                    c.info.registered = true;
                    c.info.conn_index = Some(record.conn_index);
                    c.client_id = Some(record.client_id.clone());
                }
                Ok(ConnectionDetails {
                    uuid: rpc::new_connection_id(),
                    location: forward::LOCATION.into(),
                    remotely_managed: inner.remotely_managed,
                })
            })
            .unwrap_or_else(|| {
                Err(EdgeRefusal {
                    cause: "mock edge state unavailable".into(),
                    retry_after: Duration::ZERO,
                    should_retry: true,
                })
            });
        match &result {
            Ok(d) => {
                tracing::info!(
                    conn = self.id,
                    conn_index,
                    connection = %d.uuid,
                    %version,
                    %arch,
                    %features,
                    %key_exchange,
                    "connector registered"
                );
                // The configuration follows once the answer is out.
                self.answer_sent.arm();
                let _ = self.answered.try_send(listen::Answered::Registered);
            }
            Err(e) => {
                tracing::info!(conn = self.id, conn_index, cause = %e.cause, "registration refused");
                // The edge closes the connection once the answer is out.
                self.answer_sent.arm();
                let _ = self.answered.try_send(listen::Answered::Refused);
            }
        }
        result
    }

    fn unregister(&self) {
        let conn_index = self.inner.with_state(|s| {
            let c = s.conns.get_mut(&self.id)?;
            c.info.draining = true;
            c.info.conn_index
        });
        match conn_index.flatten() {
            Some(conn_index) => {
                tracing::info!(
                    conn = self.id,
                    conn_index,
                    "connector unregistered, draining"
                );
            }
            None => tracing::info!(conn = self.id, "connector unregistered, draining"),
        }
    }

    fn unregister_delay(&self) -> Duration {
        self.inner
            .with_state(|s| s.unregister_delay)
            .unwrap_or_default()
    }

    fn local_config(&self, config: Vec<u8>) {
        tracing::info!(
            conn = self.id,
            config = %String::from_utf8_lossy(&config),
            "local configuration received"
        );
        self.inner.with_state(|s| s.local_configs.push(config));
    }
}

/// Builder for [`MockEdge`].
#[derive(Debug, Clone)]
pub struct MockEdgeBuilder {
    edge_addr: SocketAddr,
    http_addr: SocketAddr,
    pki: Option<TestPki>,
    remotely_managed: bool,
    credentials: Option<Token>,
    quic: bool,
    http2: bool,
    silent_http2: bool,
    key_exchange_groups: Option<Vec<rustls::NamedGroup>>,
    response_timeout: Duration,
    stream_open_timeout: Duration,
    registration_timeout: Duration,
    h2_ping_interval: Duration,
    h2_ping_timeout: Duration,
    visitor_scheme: VisitorScheme,
}

impl Default for MockEdgeBuilder {
    fn default() -> Self {
        Self {
            edge_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            pki: None,
            remotely_managed: true,
            credentials: None,
            quic: true,
            http2: true,
            silent_http2: false,
            key_exchange_groups: None,
            response_timeout: forward::RESPONSE_TIMEOUT,
            stream_open_timeout: forward::STREAM_OPEN_TIMEOUT,
            registration_timeout: listen::REGISTRATION_TIMEOUT,
            h2_ping_interval: listen::H2_PING_INTERVAL,
            h2_ping_timeout: listen::H2_PING_TIMEOUT,
            visitor_scheme: VisitorScheme::Https,
        }
    }
}

impl MockEdgeBuilder {
    /// Address for both the UDP (QUIC) and TCP (HTTP/2) edge listeners.
    /// Port 0 picks a port free for both.
    pub fn edge_addr(mut self, addr: SocketAddr) -> Self {
        self.edge_addr = addr;
        self
    }

    /// Address of the plain-HTTP listener whose requests are forwarded.
    pub fn http_addr(mut self, addr: SocketAddr) -> Self {
        self.http_addr = addr;
        self
    }

    /// Reuse a CA and certificate (for example across a restart).
    pub fn pki(mut self, pki: TestPki) -> Self {
        self.pki = Some(pki);
        self
    }

    /// `tunnelIsRemotelyManaged` in registration replies (default true).
    pub fn remotely_managed(mut self, yes: bool) -> Self {
        self.remotely_managed = yes;
        self
    }

    /// Only accept these credentials; others get `Unauthorized`.
    pub fn credentials(mut self, token: Token) -> Self {
        self.credentials = Some(token);
        self
    }

    /// Keep the UDP port bound but never answer QUIC (simulates networks
    /// that block UDP, to exercise the HTTP/2 fallback).
    pub fn disable_quic(mut self) -> Self {
        self.quic = false;
        self
    }

    /// Keep the TCP port bound but close every connection to it as soon as it is accepted
    /// (simulates networks that block TCP to the edge while UDP gets through, so that no
    /// HTTP/2 connection comes up while QUIC ones do).
    pub fn disable_http2(mut self) -> Self {
        self.http2 = false;
        self
    }

    /// Keep the TCP port bound and accept every connection to it, but never answer on one:
    /// no TLS handshake completes (stands for a path that drops TCP to the edge, as a
    /// connector that times its dials out sees it; on localhost a refused or closed
    /// connection is all [`disable_http2`](Self::disable_http2) can give). QUIC is served as
    /// usual.
    pub fn silent_http2(mut self) -> Self {
        self.silent_http2 = true;
        self
    }

    /// Accept only these key-exchange groups, in this order of preference
    /// (default: every group of rustls' aws-lc-rs provider, X25519MLKEM768
    /// first). For example `[X25519, secp256r1]` stands for an edge without
    /// post-quantum key exchange. [`start`](Self::start) fails on a group
    /// rustls does not implement.
    pub fn key_exchange_groups(
        mut self,
        groups: impl IntoIterator<Item = rustls::NamedGroup>,
    ) -> Self {
        self.key_exchange_groups = Some(groups.into_iter().collect());
        self
    }

    /// How long a forwarded request waits for the connector's response head before
    /// the mock answers 524, as Cloudflare's edge does (default 100 s).
    pub fn response_timeout(mut self, wait: Duration) -> Self {
        self.response_timeout = wait;
        self
    }

    /// How long the mock waits to open a stream on a QUIC connection, for the connector
    /// to grant one more (stream credit). A connection that grants none in time is
    /// treated as one that cannot open a stream: a request goes on to the next
    /// connection, a configuration push to it fails (default [`STREAM_OPEN_TIMEOUT`]).
    pub fn stream_open_timeout(mut self, wait: Duration) -> Self {
        self.stream_open_timeout = wait;
        self
    }

    /// How long a connector has to register a connection, from the moment it is
    /// accepted; one with no registration by then is closed, QUIC with code 0, HTTP/2
    /// by closing the TCP connection (default [`REGISTRATION_TIMEOUT`]).
    pub fn registration_timeout(mut self, wait: Duration) -> Self {
        self.registration_timeout = wait;
        self
    }

    /// HTTP/2 liveness: a PING goes to each connector every `interval`, and a connection
    /// on which one stays unanswered, with nothing at all arriving, for `timeout` is
    /// closed, as QUIC's idle timeout closes a silent QUIC connection (defaults
    /// [`H2_PING_INTERVAL`], [`H2_PING_TIMEOUT`]). Connectors answer PINGs themselves
    /// (Go's HTTP/2 server does for `cloudflared`).
    pub fn http2_ping(mut self, interval: Duration, timeout: Duration) -> Self {
        self.h2_ping_interval = interval.max(Duration::from_millis(1));
        self.h2_ping_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The scheme the edge headers say the eyeballs used (default [`VisitorScheme::Https`]).
    pub fn visitor_scheme(mut self, scheme: VisitorScheme) -> Self {
        self.visitor_scheme = scheme;
        self
    }

    /// Binds the listeners and starts serving on the current runtime.
    pub async fn start(self) -> Result<MockEdge, MockEdgeError> {
        let pki = match self.pki {
            Some(p) => p,
            None => TestPki::generate()?,
        };
        let provider = match &self.key_exchange_groups {
            Some(groups) => key_exchange::provider_with_groups(groups)?,
            None => cftunnel_tunnel::tls::provider(),
        };
        let (serving, _) = watch::channel(0);
        let (configured, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            serving,
            configured,
            worker: LocalWorker::start("mock-edge-rpc")?,
            next_pick: AtomicUsize::new(0),
            remotely_managed: self.remotely_managed,
            credentials: self.credentials,
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            runtime: tokio::runtime::Handle::current(),
            response_timeout: self.response_timeout,
            stream_open_timeout: self.stream_open_timeout,
            registration_timeout: self.registration_timeout,
            h2_ping_interval: self.h2_ping_interval,
            h2_ping_timeout: self.h2_ping_timeout,
            visitor_scheme: self.visitor_scheme,
        });
        // A previous instance on the same port may still be releasing it.
        let mut attempts = 0;
        let (endpoint, tcp) = loop {
            match listen::bind(self.edge_addr, &pki, provider.clone(), self.quic) {
                Err(MockEdgeError::Io(e))
                    if e.kind() == std::io::ErrorKind::AddrInUse && attempts < 60 =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other?,
            }
        };
        let edge_addr = tcp.local_addr()?;
        let http = tokio::net::TcpListener::bind(self.http_addr).await?;
        let http_addr = http.local_addr()?;
        if let listen::Udp::Quic(endpoint) = &endpoint {
            listen::spawn_quic(&inner, endpoint.clone());
        }
        if self.silent_http2 {
            listen::spawn_silent_tcp(&inner, tcp)?;
        } else {
            listen::spawn_tcp(&inner, tcp, &pki, provider, self.http2)?;
        }
        eyeball::spawn_http(&inner, http);
        tracing::info!(edge = %edge_addr, http = %http_addr, "mock edge listening");
        Ok(MockEdge {
            inner,
            endpoint,
            edge_addr,
            http_addr,
            pki,
        })
    }
}

/// The body of a response forwarded by [`MockEdge::request`].
pub type EdgeResponseBody = answer::EdgeBody;

/// A running mock edge. Dropping it does not stop it; call
/// [`shutdown`](Self::shutdown).
pub struct MockEdge {
    inner: Arc<Inner>,
    endpoint: listen::Udp,
    edge_addr: SocketAddr,
    http_addr: SocketAddr,
    pki: TestPki,
}

impl std::fmt::Debug for MockEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockEdge")
            .field("edge_addr", &self.edge_addr)
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

impl MockEdge {
    /// A builder with defaults (127.0.0.1, ephemeral ports, fresh CA).
    pub fn builder() -> MockEdgeBuilder {
        MockEdgeBuilder::default()
    }

    /// Starts with defaults.
    pub async fn start() -> Result<Self, MockEdgeError> {
        Self::builder().start().await
    }

    /// Address connectors dial (same port for UDP and TCP).
    pub fn edge_addr(&self) -> SocketAddr {
        self.edge_addr
    }

    /// Address of the plain-HTTP listener that forwards into the tunnel.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// CA certificate (PEM) connectors must trust.
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// The CA and certificate, to restart on the same identity.
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }

    /// Writes the CA certificate as PEM.
    pub async fn write_ca_pem(&self, path: &std::path::Path) -> std::io::Result<()> {
        tokio::fs::write(path, self.pki.ca_pem()).await
    }

    /// Answer every following registration with this error (`None`: accept).
    pub fn set_registration_error(&self, error: Option<EdgeRefusal>) {
        self.inner.with_state(|s| s.registration_error = error);
    }

    /// Refuse every following registration with a retryable `cause`, retried at once: the
    /// connector's own unit tests link another copy of the tunnel crate than this one, so
    /// they cannot hand over an [`EdgeRefusal`].
    pub fn refuse_registrations(&self, cause: &str) {
        self.set_registration_error(Some(EdgeRefusal {
            cause: cause.into(),
            retry_after: Duration::ZERO,
            should_retry: true,
        }));
    }

    /// Hold every following `unregisterConnection` for `delay` before acting on it (the
    /// connection keeps getting requests meanwhile) and answering: a slow edge.
    pub fn set_unregister_delay(&self, delay: Duration) {
        self.inner.with_state(|s| s.unregister_delay = delay);
    }

    /// The `registerConnection` calls received, oldest first: the most
    /// recent [`HISTORY_LIMIT`], older ones are dropped.
    pub fn registrations(&self) -> Vec<RegistrationRecord> {
        self.inner
            .with_state(|s| s.records.iter().map(|r| r.record.clone()).collect())
            .unwrap_or_default()
    }

    /// [`registrations`](Self::registrations), each with the time it arrived.
    pub fn received_registrations(&self) -> Vec<ReceivedRegistration> {
        self.inner
            .with_state(|s| s.records.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The `updateLocalConfiguration` documents received, oldest first: the
    /// most recent [`HISTORY_LIMIT`], and of those the most recent that fit in
    /// [`LOCAL_CONFIG_BYTES_LIMIT`] bytes; older ones are dropped.
    pub fn local_configs(&self) -> Vec<Vec<u8>> {
        self.inner
            .with_state(|s| s.local_configs.docs.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Open connector connections.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        self.inner
            .with_state(|s| s.conns.values().map(|c| c.info.clone()).collect())
            .unwrap_or_default()
    }

    /// Closes every open connector connection at once and keeps listening, as
    /// an edge that drops its connections does: connectors see them as lost and
    /// reconnect. A QUIC connection is closed with code 0, an HTTP/2 one by
    /// closing its TCP connection. Connections that arrive afterwards are served.
    pub fn close_connections(&self) {
        self.inner.with_state(|s| {
            for c in s.conns.values() {
                c.close.cancel();
            }
        });
    }

    /// Registered connections that have not unregistered.
    pub fn serving(&self) -> usize {
        *self.inner.serving.borrow()
    }

    /// Waits until exactly `n` connections are serving.
    pub async fn wait_serving(&self, n: usize) {
        let mut rx = self.inner.serving.subscribe();
        let _ = rx.wait_for(|c| *c == n).await;
    }

    /// Waits until at least `n` serving connections have applied the tunnel's current
    /// configuration (a remotely managed connector answers 503 until it has one). With no
    /// configuration pushed yet, it waits for the first one.
    pub async fn wait_configured(&self, n: usize) {
        let mut rx = self.inner.configured.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Makes `config` the tunnel's configuration and pushes it to every serving
    /// connection; returns each connection's `latestAppliedVersion`. Connections
    /// that register later get it when they register, as from Cloudflare's edge.
    pub async fn push_config(
        &self,
        version: i32,
        config: &[u8],
    ) -> Vec<Result<i32, MockEdgeError>> {
        self.inner
            .set_remote_config(version, Bytes::copy_from_slice(config))
            .await
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Opens a request stream on a serving QUIC connection, writes `bytes`
    /// verbatim, finishes, and returns what the connector sent back (at most
    /// 1 MiB), or an error if it reset the stream. For negative tests.
    pub async fn send_raw_quic_stream(&self, bytes: &[u8]) -> Result<Vec<u8>, MockEdgeError> {
        self.send_raw_quic_stream_in_pieces(&[bytes], Duration::ZERO)
            .await
    }

    /// [`send_raw_quic_stream`](Self::send_raw_quic_stream) without finishing the stream:
    /// `bytes` are written and the stream held open until the connector ends it.
    pub async fn send_unfinished_quic_stream(
        &self,
        bytes: &[u8],
    ) -> Result<Vec<u8>, MockEdgeError> {
        self.raw_quic_stream(&[bytes], Duration::ZERO, false).await
    }

    /// [`send_raw_quic_stream`](Self::send_raw_quic_stream) with the bytes written in
    /// `pieces`, `gap` apart, so that each arrives in a packet of its own.
    pub async fn send_raw_quic_stream_in_pieces(
        &self,
        pieces: &[&[u8]],
        gap: Duration,
    ) -> Result<Vec<u8>, MockEdgeError> {
        self.raw_quic_stream(pieces, gap, true).await
    }

    async fn raw_quic_stream(
        &self,
        pieces: &[&[u8]],
        gap: Duration,
        finished: bool,
    ) -> Result<Vec<u8>, MockEdgeError> {
        let conn = self
            .inner
            .pick()
            .into_iter()
            .find_map(|(_, t)| match t {
                Transport::Quic(c) => Some(c),
                Transport::H2(_) => None,
            })
            .ok_or_else(|| MockEdgeError::Stream("no serving QUIC connection".into()))?;
        let (mut send, mut recv) =
            forward::open_quic_stream(&conn, self.inner.stream_open_timeout).await?;
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            send.write_all(piece)
                .await
                .map_err(|e| MockEdgeError::Stream(e.to_string()))?;
        }
        if finished {
            let _ = send.finish();
        }
        let answer = recv.read_to_end(1024 * 1024).await;
        drop(send);
        answer.map_err(|e| MockEdgeError::Stream(e.to_string()))
    }

    /// Opens a unidirectional stream on a serving QUIC connection and writes `len` bytes on
    /// it (the edge opens none; for negative tests), then finishes it. Returns the bytes
    /// written: all of them, or fewer if the connector stopped the stream first.
    pub async fn send_quic_uni_stream(&self, len: usize) -> Result<usize, MockEdgeError> {
        let conn = self
            .inner
            .pick()
            .into_iter()
            .find_map(|(_, t)| match t {
                Transport::Quic(c) => Some(c),
                Transport::H2(_) => None,
            })
            .ok_or_else(|| MockEdgeError::Stream("no serving QUIC connection".into()))?;
        let mut send = tokio::time::timeout(self.inner.stream_open_timeout, conn.open_uni())
            .await
            .map_err(|_| MockEdgeError::Stream("no unidirectional stream in time".into()))?
            .map_err(|e| MockEdgeError::Stream(e.to_string()))?;
        let chunk = Bytes::from(vec![b'u'; 64 * 1024]);
        let mut written = 0;
        while written < len {
            let piece = chunk.slice(..chunk.len().min(len - written));
            match send.write_all(&piece).await {
                Ok(()) => written += piece.len(),
                Err(quinn::WriteError::Stopped(_)) => return Ok(written),
                Err(e) => return Err(MockEdgeError::Stream(e.to_string())),
            }
        }
        let _ = send.finish();
        Ok(written)
    }

    /// Sends `body` verbatim as a configuration push over a serving HTTP/2
    /// connection and returns the connector's answer. For negative tests.
    pub async fn send_raw_config_push(
        &self,
        body: &[u8],
    ) -> Result<http::Response<Bytes>, MockEdgeError> {
        self.raw_config_push(body, true).await
    }

    /// [`send_raw_config_push`](Self::send_raw_config_push) of a document that never
    /// completes: `body` is sent and the stream held open until the connector answers.
    pub async fn send_unfinished_config_push(
        &self,
        body: &[u8],
    ) -> Result<http::Response<Bytes>, MockEdgeError> {
        self.raw_config_push(body, false).await
    }

    async fn raw_config_push(
        &self,
        body: &[u8],
        finished: bool,
    ) -> Result<http::Response<Bytes>, MockEdgeError> {
        let sr = self
            .inner
            .pick()
            .into_iter()
            .find_map(|(_, t)| match t {
                Transport::H2(sr) => Some(sr),
                Transport::Quic(_) => None,
            })
            .ok_or_else(|| MockEdgeError::Stream("no serving HTTP/2 connection".into()))?;
        forward::h2_config_push(sr, body.to_vec(), finished).await
    }

    /// Forwards one request through a registered connection exactly as a request arriving
    /// at the HTTP listener is forwarded (edge headers added, connections taken in turn),
    /// without the listener's HTTP hop: for load generators that play the edge themselves.
    /// Failures are answered as the listener answers them (`502` with the reason).
    pub async fn request<B>(&self, req: http::Request<B>) -> http::Response<EdgeResponseBody>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<cftunnel_tunnel::BoxError> + Send,
    {
        forward::forward(&self.inner, req, std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// Opens a TCP (private network) stream to `dest` through a serving connection, as the
    /// edge does for WARP traffic, and returns its byte pipe once the connector has
    /// acknowledged it. A connector that refuses gives [`MockEdgeError::Rejected`].
    pub async fn open_tcp(
        &self,
        dest: std::net::SocketAddr,
    ) -> Result<cftunnel_tunnel::Upgraded, MockEdgeError> {
        forward::open_tcp(&self.inner, dest).await
    }

    /// Stops listening and closes every connection; the port is free again
    /// when this returns.
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        if let listen::Udp::Quic(endpoint) = &self.endpoint {
            endpoint.close(quinn::VarInt::from_u32(0), b"");
        }
        self.inner.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.tasks.wait()).await;
        self.inner.with_state(|s| s.conns.clear());
        if let listen::Udp::Quic(endpoint) = &self.endpoint {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
        drop(self.endpoint);
        // The QUIC driver releases the UDP socket asynchronously.
        for _ in 0..40 {
            if std::net::UdpSocket::bind(self.edge_addr).is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: usize) -> RegistrationRecord {
        RegistrationRecord {
            account_tag: "acct".into(),
            tunnel_secret: vec![1; 32],
            tunnel_id: vec![2; 16],
            conn_index: 0,
            client_id: n.to_be_bytes().to_vec(),
            features: Vec::new(),
            version: "test".into(),
            arch: "test".into(),
            origin_local_ip: Vec::new(),
            num_previous_attempts: 0,
        }
    }

    #[tokio::test]
    async fn histories_keep_only_the_most_recent_entries() {
        let edge = MockEdge::start().await.unwrap();
        let (answered, _answers) = tokio::sync::mpsc::channel(1);
        let hooks = edge.inner.hooks(1, answered, Default::default());
        let extra = 5;
        for n in 0..HISTORY_LIMIT + extra {
            let _ = hooks.register(record(n));
            hooks.local_config(n.to_string().into_bytes());
        }

        let records = edge.registrations();
        assert_eq!(records.len(), HISTORY_LIMIT);
        assert_eq!(records[0].client_id, extra.to_be_bytes());
        assert_eq!(
            records[HISTORY_LIMIT - 1].client_id,
            (HISTORY_LIMIT + extra - 1).to_be_bytes()
        );

        let configs = edge.local_configs();
        assert_eq!(configs.len(), HISTORY_LIMIT);
        assert_eq!(configs[0], extra.to_string().into_bytes());
        assert_eq!(
            configs[HISTORY_LIMIT - 1],
            (HISTORY_LIMIT + extra - 1).to_string().into_bytes()
        );
        edge.shutdown().await;
    }

    #[tokio::test]
    async fn local_configs_are_kept_within_a_byte_budget() {
        let edge = MockEdge::start().await.unwrap();
        let (answered, _answers) = tokio::sync::mpsc::channel(1);
        let hooks = edge.inner.hooks(1, answered, Default::default());
        // 3 MiB documents, each filled with its own number: five fit in 16 MiB.
        let doc = |n: u8| vec![n; 3 * 1024 * 1024];
        for n in 0..8 {
            hooks.local_config(doc(n));
        }
        let configs = edge.local_configs();
        let kept: Vec<u8> = configs.iter().map(|c| c[0]).collect();
        assert_eq!(kept, [3, 4, 5, 6, 7]);
        assert!(configs.iter().map(Vec::len).sum::<usize>() <= LOCAL_CONFIG_BYTES_LIMIT);

        // A document larger than the whole budget is still kept, alone.
        hooks.local_config(vec![9; LOCAL_CONFIG_BYTES_LIMIT + 1]);
        let configs = edge.local_configs();
        assert_eq!(configs.len(), 1);
        assert_eq!(configs[0].len(), LOCAL_CONFIG_BYTES_LIMIT + 1);
        // And the next small one drops it.
        hooks.local_config(b"{}".to_vec());
        assert_eq!(edge.local_configs(), [b"{}".to_vec()]);
        edge.shutdown().await;
    }
}
