//! What every edge connection, QUIC or HTTP/2, shares with the connector that supervises it:
//! the connector's state, the count of registered connections, how a connection ended or why
//! it failed, and the registration it sends.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use uuid::Uuid;

use crate::backoff::SharedBackoff;
use crate::metrics::{FailureCause, ProtocolLabel, TunnelMetrics};
use crate::options::{ConnectorOptions, Protocol, FEATURES, FEATURE_POST_QUANTUM};
use crate::preference::{Http2Retry, Verdict};
use crate::rpc::control::{EdgeRefusal, RegisterParams};
use crate::rpc::remote_config::RemoteConfigState;
use crate::rpc::{LocalWorker, RpcError};
use crate::service::Handler;
use crate::token::Token;
use crate::trailers::DroppedTrailers;

/// Drain state shared with every connection task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    Running,
    Draining,
    Shutdown,
}

/// What every connection task watches: the drain state, and whether an `auto` connector's
/// connections are to run over HTTP/2 (see `ConnectorHandle::prefer_http2`). One watch for
/// both, so that a QUIC connection's accept loop, which turns once per request, waits on a
/// single notifier for either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    pub(crate) run: RunState,
    /// Set once, never cleared.
    pub(crate) http2: bool,
    /// HTTP/2 does not reach the edge: the preference is given up until it is tried again
    /// (see `connector::give_up_move`).
    pub(crate) http2_given_up: bool,
    /// How many times the preference was taken up again after it was given up (HTTP/2 tried
    /// again after its wait, or the give-up taken back: see `preference::Http2Retry`): a
    /// connection's failed HTTP/2 attempts count towards the try they were made in, not a
    /// later one.
    pub(crate) http2_try: u32,
}

impl Control {
    pub(crate) const START: Self = Self {
        run: RunState::Running,
        http2: false,
        http2_given_up: false,
        http2_try: 0,
    };

    pub(crate) fn running(self) -> bool {
        self.run == RunState::Running
    }
}

/// Per-connector state shared by connection tasks.
pub(crate) struct Shared {
    pub(crate) handler: Arc<dyn Handler>,
    pub(crate) worker: LocalWorker,
    pub(crate) remote_config: Arc<RemoteConfigState>,
    pub(crate) metrics: TunnelMetrics,
    pub(crate) token: Token,
    pub(crate) client_id: Uuid,
    /// `Cf-Warp-Tag-Id` for every request towards the service: the client id.
    pub(crate) warp_tag: http::HeaderValue,
    pub(crate) opts: ConnectorOptions,
    pub(crate) quic_client: quinn::ClientConfig,
    pub(crate) h2_client: Arc<rustls::ClientConfig>,
    pub(crate) registered: watch::Sender<usize>,
    pub(crate) state: watch::Receiver<Control>,
    /// The sender of `state`, to give the preference for HTTP/2 up and try it again. Weak:
    /// the handles own the sender, and dropping them all stops the connections.
    pub(crate) control: Weak<watch::Sender<Control>>,
    /// One connection at a time moves from QUIC to HTTP/2: a turn is held from the moment
    /// its QUIC connection starts to unregister until it registers over HTTP/2, through the
    /// attempts that fail, so the tunnel is never more than one connection short because of
    /// the move. The connections waiting for a turn when the move is given up (HTTP/2 does
    /// not reach the edge) serve on over QUIC, and wait again once HTTP/2 is tried again.
    pub(crate) moves: Arc<tokio::sync::Semaphore>,
    /// When HTTP/2 is tried again after it was given up.
    pub(crate) http2_retry: Mutex<Http2Retry>,
    /// A connection registered over HTTP/2 since HTTP/2 was last tried again (or since the
    /// start): HTTP/2 does reach the edge from here.
    pub(crate) http2_registered: AtomicBool,
    pub(crate) quic_ever_registered: AtomicBool,
    /// Connections registered over QUIC right now: while one is, QUIC reaches the edge, and a
    /// QUIC attempt that fails tells of that connection's address, not of an outage.
    pub(crate) quic_registered: AtomicUsize,
    /// A connection has registered, over either transport: unlike `registered`, which a
    /// connection moving to HTTP/2 right after it registered takes back to 0 at once, it stays.
    pub(crate) ever_registered: AtomicBool,
    /// The first connection is on HTTP/2: the others start on the protocol it is on,
    /// as in `cloudflared`.
    pub(crate) first_on_http2: AtomicBool,
    pub(crate) local_ports: Mutex<Vec<u16>>,
    pub(crate) ha_backoff: SharedBackoff,
    /// Response trailers the QUIC transport dropped.
    pub(crate) dropped_trailers: DroppedTrailers,
}

impl Shared {
    pub(crate) fn run_state(&self) -> RunState {
        self.state.borrow().run
    }

    /// Whether the connections are to move to HTTP/2: asked for, and not given up.
    pub(crate) fn prefers_http2(&self) -> bool {
        self.moves_to_http2(&self.state.borrow())
    }

    /// Whether `control` has the connections move to HTTP/2: asked for, and not given up.
    pub(crate) fn moves_to_http2(&self, control: &Control) -> bool {
        control.http2 && !control.http2_given_up
    }

    /// `ClientInfo.arch` for this build (see [`go_arch`]).
    pub(crate) fn arch() -> String {
        go_arch(
            std::env::consts::OS,
            std::env::consts::ARCH,
            cfg!(target_endian = "little"),
        )
    }

    /// `ClientInfo.features` for these options.
    pub(crate) fn features(&self) -> Vec<String> {
        let mut features: Vec<String> = FEATURES.iter().map(|f| (*f).to_owned()).collect();
        if self.opts.post_quantum {
            features.push(FEATURE_POST_QUANTUM.to_owned());
        }
        features
    }
}

/// Runs the steps of a connection attempt up to its registration, unless the connector stops
/// running first: `None` then, and the attempt is dropped, its dial, handshake or
/// registration call with it. A drain or shutdown thus neither waits for an attempt in
/// progress (a silent edge holds one for its timeouts) nor lets it register afterwards,
/// which would have the edge route new requests to a connector on its way out.
pub(crate) async fn unless_stopped<F: std::future::Future>(
    shared: &Shared,
    steps: F,
) -> Option<F::Output> {
    let mut state = shared.state.clone();
    tokio::select! {
        biased;
        _ = state.wait_for(|s| !s.running()) => None,
        out = steps => Some(out),
    }
}

/// `ClientInfo.arch` as `cloudflared` sends it: Go's `GOOS_GOARCH` (`linux_amd64`,
/// `darwin_arm64`, ...), from Rust's target OS and architecture names and the byte order
/// (Go names little-endian MIPS and POWER variants apart). Names Go has no other
/// spelling for pass through.
fn go_arch(os: &str, arch: &str, little_endian: bool) -> String {
    let os = match os {
        "macos" => "darwin",
        other => other,
    };
    let arch = match (arch, little_endian) {
        ("x86_64", _) => "amd64",
        ("x86", _) => "386",
        ("aarch64", _) => "arm64",
        ("loongarch64", _) => "loong64",
        ("powerpc64", true) => "ppc64le",
        ("powerpc64", false) => "ppc64",
        ("mips", true) => "mipsle",
        ("mips64", true) => "mips64le",
        ("wasm32", _) => "wasm",
        (other, _) => other,
    };
    format!("{os}_{arch}")
}

/// Counts one registered connection until dropped.
pub(crate) struct RegisteredGuard {
    shared: Arc<Shared>,
    protocol: ProtocolLabel,
    active: bool,
}

impl RegisteredGuard {
    pub(crate) fn new(shared: &Arc<Shared>, protocol: ProtocolLabel, idx: u8) -> Self {
        if idx != 0 {
            shared
                .ha_backoff
                .registered(tokio::time::Instant::now(), rand::random());
        }
        shared.metrics.connections(protocol).inc();
        shared.metrics.registered(protocol);
        match protocol {
            ProtocolLabel::Quic => {
                shared.quic_ever_registered.store(true, Ordering::Relaxed);
                shared.quic_registered.fetch_add(1, Ordering::Relaxed);
            }
            ProtocolLabel::Http2 => shared.http2_registered.store(true, Ordering::Relaxed),
        }
        shared.ever_registered.store(true, Ordering::Relaxed);
        // What it tells of a give-up of HTTP/2 in force.
        registered_over(shared, protocol, idx);
        // Readiness last, so observers of the count see consistent metrics.
        shared.registered.send_modify(|n| *n += 1);
        Self {
            shared: shared.clone(),
            protocol,
            active: true,
        }
    }

    /// Stops counting (the connection unregistered or was lost).
    pub(crate) fn release(&mut self) {
        if std::mem::take(&mut self.active) {
            self.shared.metrics.connections(self.protocol).dec();
            if self.protocol == ProtocolLabel::Quic {
                self.shared.quic_registered.fetch_sub(1, Ordering::Relaxed);
            }
            self.shared
                .registered
                .send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

impl Drop for RegisteredGuard {
    fn drop(&mut self) {
        self.release();
    }
}

/// How a registered connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Drained or shut down on request: do not reconnect.
    Stopped,
    /// A QUIC connection unregistered and closed to move to HTTP/2: reconnect over HTTP/2
    /// at once, holding `turn` (see [`Shared::moves`]) until that registers or the move is
    /// given up.
    Moved {
        turn: tokio::sync::OwnedSemaphorePermit,
    },
    /// Lost after registering: reconnect.
    Lost {
        /// The edge went silent (QUIC idle timeout, HTTP/2 unanswered PING). Logged
        /// only: the connection reconnects to the same address, as `cloudflared` does.
        /// Its address rotation on a QUIC idle timeout matches the bare idle-timeout
        /// error only, which a connection that registered never reports: its loss
        /// reaches the address logic as a stream-listener error, which keeps the address.
        idle_timeout: bool,
    },
}

/// Why a connection attempt failed before registering.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// The edge could not be reached: socket, TCP, TLS or QUIC handshake.
    /// `unanswered`: the QUIC handshake heard nothing from the edge within its
    /// idle timeout, which `cloudflared` takes for QUIC being blocked.
    #[error("dial failed: {reason}")]
    Dial { reason: String, unanswered: bool },
    /// The transport came up but the control stream did not.
    #[error("control stream failed: {0}")]
    ControlStream(String),
    #[error("edge refused registration: {}", .0.cause)]
    Refused(EdgeRefusal),
    #[error(transparent)]
    Rpc(#[from] RpcError),
}

impl ConnError {
    pub(crate) fn dial(reason: impl std::fmt::Display) -> Self {
        Self::Dial {
            reason: reason.to_string(),
            unanswered: false,
        }
    }

    pub(crate) fn control_stream(reason: impl std::fmt::Display) -> Self {
        Self::ControlStream(reason.to_string())
    }

    pub(crate) fn cause(&self) -> FailureCause {
        match self {
            Self::Dial { .. } => FailureCause::Dial,
            Self::ControlStream(_) => FailureCause::Rpc,
            Self::Refused(r) if r.is_duplicate() => FailureCause::Duplicate,
            Self::Refused(r) if r.cause.contains("Unauthorized") => FailureCause::Unauthorized,
            Self::Refused(_) => FailureCause::ServerError,
            Self::Rpc(_) => FailureCause::Rpc,
        }
    }
}

/// Registration parameters. `origin_ip` is sent as `originLocalIp` in the
/// 16-byte form Go's `net.IP` has (an IPv4 address IPv4-mapped), as
/// `cloudflared` sends it.
pub(crate) fn register_params(
    shared: &Shared,
    idx: u8,
    origin_ip: IpAddr,
    attempt: u8,
) -> RegisterParams {
    let origin_local_ip = match origin_ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    RegisterParams {
        account_tag: shared.token.account_tag().to_owned(),
        tunnel_secret: shared.token.tunnel_secret().to_vec(),
        tunnel_id: shared.token.tunnel_id(),
        conn_index: idx,
        client_id: shared.client_id,
        features: shared.features(),
        version: shared.opts.client_version.clone(),
        arch: Shared::arch(),
        origin_local_ip,
        num_previous_attempts: attempt,
    }
}

/// What a connection's registration over `protocol` tells of a give-up of HTTP/2 in force
/// (see [`Http2Retry::registered`]): once QUIC registers after it, it stands, and is logged as
/// an error; after an outage, or once HTTP/2 registers, it is taken back.
pub(crate) fn registered_over(shared: &Shared, protocol: ProtocolLabel, idx: u8) {
    let preferred = shared.state.borrow().http2;
    if shared.opts.protocol != Protocol::Auto || !preferred {
        return;
    }
    let Some(control) = shared.control.upgrade() else {
        return;
    };
    let mut verdict = Verdict::Unchanged;
    control.send_if_modified(|c| {
        let given_up = c.running() && c.http2_given_up;
        verdict = retry_state(shared).registered(protocol == ProtocolLabel::Quic, given_up);
        take_back(shared, c, &verdict)
    });
    match verdict {
        Verdict::Unchanged => {}
        Verdict::Stands { error, retry_in } => tracing::error!(
            conn_index = idx,
            error = %error,
            retry_in_s = retry_in.as_secs(),
            "HTTP/2 to the edge failed, so the tunnel runs on QUIC, which carries no response \
             trailers: gRPC responses lose their status until HTTP/2 is tried again, retry_in_s \
             from the failure; make sure TCP port 7844 to the edge is open end to end (the error \
             says what failed), or set PROXY_TUNNEL_PROTOCOL=http2"
        ),
        Verdict::TakenBack { .. } => tracing::info!(
            conn_index = idx,
            protocol = protocol.as_str(),
            "the edge answers again: the tunnel prefers HTTP/2 again, and its connections on \
             QUIC move to it one at a time"
        ),
    }
}

/// Takes the give-up in force back within a send of `c`, if `verdict` says so: the connections
/// prefer HTTP/2 again, their failures counted afresh (a new [`Control::http2_try`]), and a
/// registration over HTTP/2 since the last try still counts. Whether `c` changed.
pub(crate) fn take_back(shared: &Shared, c: &mut Control, verdict: &Verdict) -> bool {
    let Verdict::TakenBack { registered } = *verdict else {
        return false;
    };
    c.http2_given_up = false;
    c.http2_try = c.http2_try.wrapping_add(1);
    if registered {
        shared.http2_registered.store(true, Ordering::Relaxed);
    }
    true
}

pub(crate) fn retry_state(shared: &Shared) -> std::sync::MutexGuard<'_, Http2Retry> {
    shared
        .http2_retry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_is_named_as_go_names_it() {
        let cases = [
            ("linux", "x86_64", true, "linux_amd64"),
            ("linux", "x86", true, "linux_386"),
            ("linux", "aarch64", true, "linux_arm64"),
            ("linux", "arm", true, "linux_arm"),
            ("linux", "riscv64", true, "linux_riscv64"),
            ("linux", "s390x", false, "linux_s390x"),
            ("linux", "loongarch64", true, "linux_loong64"),
            ("linux", "powerpc64", true, "linux_ppc64le"),
            ("linux", "powerpc64", false, "linux_ppc64"),
            ("linux", "mips", false, "linux_mips"),
            ("linux", "mips", true, "linux_mipsle"),
            ("linux", "mips64", false, "linux_mips64"),
            ("linux", "mips64", true, "linux_mips64le"),
            ("macos", "aarch64", true, "darwin_arm64"),
            ("macos", "x86_64", true, "darwin_amd64"),
            ("windows", "x86_64", true, "windows_amd64"),
            ("freebsd", "x86_64", true, "freebsd_amd64"),
            ("illumos", "x86_64", true, "illumos_amd64"),
        ];
        for (os, arch, little, expected) in cases {
            assert_eq!(go_arch(os, arch, little), expected, "{os} {arch}");
        }
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        assert_eq!(Shared::arch(), "linux_amd64");
    }
}
