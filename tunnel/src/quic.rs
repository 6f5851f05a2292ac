//! QUIC transport (connector side): one UDP socket and QUIC connection per
//! connection index, the control stream, and edge-opened request streams.

use std::future::{poll_fn, Future};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Request, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use quinn::VarInt;
use tokio::io::AsyncReadExt as _;
use tokio::sync::{oneshot, watch};

use crate::body::{Body, OnUpgrade, Upgraded};
use crate::connection::{
    register_params, unless_stopped, ConnError, Control, Ended, RegisteredGuard, RunState, Shared,
};
use crate::metrics::ProtocolLabel;
use crate::options::ConnectorOptions;
use crate::rpc::control::{self, RegisterOutcome};
use crate::rpc::{remote_config, RpcStream};
use crate::service::ResponseBody;
use crate::stream::http_map::{
    decode_request_head, decode_request_segment, encode_response_head, MapError, RequestHead,
};
use crate::stream::{self, ConnectResponse, ConnectionType, FrameError, StreamKind};
use crate::tasks::{InFlight, StreamTasks};
use crate::tls::QUIC_SERVER_NAME;
use crate::trailers::DroppedTrailers;

/// Length of a stream's signature.
const DATA_SIGNATURE_LEN: usize = stream::DATA_SIGNATURE.len();

/// Time allowed for an edge-opened stream to deliver its preamble.
pub(crate) const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes the request preambles arriving on one connection may hold at once (see
/// [`stream::PreambleBudget`]). The edge keeps request heads under 32 KiB, so this is
/// hundreds of heads arriving together; only an edge sending heads far past its own
/// limits, slowly, on many streams, ever waits for it.
const PREAMBLE_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// Congestion window a connection starts with, in packets of the initial size, as
/// `cloudflared`'s QUIC stack (quic-go) starts it.
const INITIAL_WINDOW_PACKETS: u64 = 32;

/// Transport parameters `cloudflared` uses: 5 s idle timeout, 1 s keep-alive,
/// datagrams on, 6 MiB stream / 30 MiB connection windows, initial packet
/// size 1232 (IPv4) / 1252 (IPv6); see [`DEFAULT_QUIC_MAX_STREAMS`](crate::DEFAULT_QUIC_MAX_STREAMS).
pub(crate) fn client_transport(opts: &ConnectorOptions, ipv6: bool) -> quinn::TransportConfig {
    let initial_mtu = if ipv6 { 1252 } else { 1232 };
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(opts.quic_max_streams.max(1)))
        .max_concurrent_uni_streams(VarInt::from_u32(16))
        .max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(5)).ok())
        .keep_alive_interval(Some(Duration::from_secs(1)))
        // quinn advertises this as `max_datagram_frame_size`: 16383, as cloudflared.
        .datagram_receive_buffer_size(Some(16383))
        .stream_receive_window(VarInt::from_u32(6 * 1024 * 1024))
        .receive_window(VarInt::from_u32(30 * 1024 * 1024))
        .initial_mtu(initial_mtu);
    // quic-go's Cubic starts at 32 packets; quinn's default is 10.
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(INITIAL_WINDOW_PACKETS * u64::from(initial_mtu));
    t.congestion_controller_factory(Arc::new(cubic));
    t
}

/// Binds this index's UDP socket, reusing its previous local port when free.
fn bind_endpoint(shared: &Shared, idx: u8, peer: SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let ip: IpAddr = if peer.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let prev = shared
        .local_ports
        .lock()
        .ok()
        .and_then(|p| p.get(idx as usize).copied())
        .unwrap_or(0);
    let sock =
        std::net::UdpSocket::bind((ip, prev)).or_else(|_| std::net::UdpSocket::bind((ip, 0)))?;
    sock.set_nonblocking(true)?;
    let port = sock.local_addr()?.port();
    if let Ok(mut p) = shared.local_ports.lock() {
        if let Some(slot) = p.get_mut(idx as usize) {
            *slot = port;
        }
    }
    crate::udp::endpoint(endpoint_config(), None, sock)
}

/// Largest UDP payload the edge may send: quic-go's 1452, which `cloudflared` advertises
/// in `max_udp_payload_size` (quinn's default is 1472).
const MAX_UDP_PAYLOAD: u16 = 1452;

/// How long a closed control session's last messages (Release, Abort) may take to be
/// acknowledged before the connection is closed regardless.
const CLOSE_DELIVERY: Duration = Duration::from_secs(1);

fn endpoint_config() -> quinn::EndpointConfig {
    let mut config = quinn::EndpointConfig::default();
    // In range (1200..=65527), so this cannot fail; the default stays if it ever did.
    let _ = config.max_udp_payload_size(MAX_UDP_PAYLOAD);
    config
}

/// One QUIC connection: dial, register, serve until lost or drained.
pub(crate) async fn connect(
    shared: &Arc<Shared>,
    idx: u8,
    addr: SocketAddr,
    attempt: u8,
) -> Result<Ended, ConnError> {
    tracing::debug!(edge = %addr, "dialing edge over QUIC");
    let endpoint = bind_endpoint(shared, idx, addr).map_err(ConnError::dial)?;
    let mut cfg = shared.quic_client.clone();
    cfg.transport_config(Arc::new(client_transport(&shared.opts, addr.is_ipv6())));
    let connecting = endpoint
        .connect_with(cfg, addr, QUIC_SERVER_NAME)
        .map_err(ConnError::dial)?;
    // quinn's 5 s idle timeout ends a handshake that hears nothing from the edge, as
    // quic-go's handshake idle timeout does for `cloudflared`; the overall limit is
    // `handshake_timeout`.
    let handshake = async {
        match tokio::time::timeout(shared.opts.handshake_timeout, connecting).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(quinn::ConnectionError::TimedOut)) => Err(ConnError::Dial {
                reason: "no answer from the edge to the QUIC handshake".into(),
                unanswered: true,
            }),
            Err(_) => Err(ConnError::dial("QUIC handshake timed out")),
            Ok(Err(e)) => Err(ConnError::dial(e)),
        }
    };
    let Some(conn) = unless_stopped(shared, handshake).await else {
        return Ok(Ended::Stopped);
    };
    let conn = conn?;
    tracing::debug!(edge = %addr, "QUIC handshake complete");
    // Ends with this connection, or with this future if it is dropped first: a task that held
    // the connection would keep it, and its keep-alives, going.
    let uni = StreamTasks::new();
    let _uni = uni.cancel_on_drop();
    uni.spawn(refuse_uni_streams(conn.clone()));
    let result = serve(shared, idx, addr, &conn, attempt).await;
    conn.close(VarInt::from_u32(0), b"");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    result
}

/// Stops every unidirectional stream the edge opens, as soon as it is open. Nothing the
/// connector serves comes on one (`cloudflared` accepts none), but the data sent on them takes
/// the connection's flow-control credit, which quinn gives back as it is read, or at once for
/// a stream stopped (its data unread, or still to come): left unaccepted, a few such streams
/// would leave the edge no credit to send requests on, while keep-alives kept the connection
/// registered.
async fn refuse_uni_streams(conn: quinn::Connection) {
    while let Ok(mut recv) = conn.accept_uni().await {
        let _ = recv.stop(VarInt::from_u32(0));
    }
}

async fn serve(
    shared: &Arc<Shared>,
    idx: u8,
    addr: SocketAddr,
    conn: &quinn::Connection,
    attempt: u8,
) -> Result<Ended, ConnError> {
    let registering = async {
        // Opening waits for stream credit from the edge; one that grants none would hold the
        // attempt forever, so opening is bounded as the registration call is.
        let (send, recv) = tokio::time::timeout(shared.opts.rpc_timeout, conn.open_bi())
            .await
            .map_err(|_| ConnError::control_stream("the edge allowed no control stream in time"))?
            .map_err(ConnError::control_stream)?;
        // Over QUIC `cloudflared` reports the edge's address as `originLocalIp`.
        let params = register_params(shared, idx, addr.ip(), attempt);
        // Resolves once the edge has acknowledged all the control stream sent after it ended.
        // Closing the connection discards stream data still in flight, so a session closed
        // by a refusal waits for this before the connection goes.
        let delivered = send.stopped();
        let registered = control::register(
            &shared.worker,
            RpcStream {
                reader: recv,
                writer: send,
            },
            params,
            shared.opts.rpc_timeout,
        )
        .await?;
        Ok::<_, ConnError>((registered, delivered))
    };
    let Some(registered) = unless_stopped(shared, registering).await else {
        return Ok(Ended::Stopped);
    };
    let ((session, outcome), delivered) = registered?;
    let details = match outcome {
        RegisterOutcome::Registered(d) => d,
        RegisterOutcome::Refused(r) => {
            let _ = tokio::time::timeout(CLOSE_DELIVERY, delivered).await;
            return Err(ConnError::Refused(r));
        }
    };
    tracing::info!(
        conn_index = idx,
        connection = %details.uuid,
        edge = %addr,
        location = %details.location,
        protocol = "quic",
        "registered tunnel connection"
    );
    let mut guard = RegisteredGuard::new(shared, ProtocolLabel::Quic, idx);
    let tracker = StreamTasks::new();
    let _cancel = tracker.cancel_on_drop();
    let active = shared.metrics.active_streams(ProtocolLabel::Quic);
    let bounds = Arc::new(Bounds {
        preambles: stream::PreambleBudget::new(PREAMBLE_BUDGET_BYTES),
        // Configuration pushes are read one at a time, as over HTTP/2: the others wait
        // unread, held to their streams' flow-control windows.
        pushes: tokio::sync::Semaphore::new(1),
    });
    let serve_stream = |send, recv| {
        tracker.spawn(handle_stream(
            shared.clone(),
            send,
            recv,
            bounds.clone(),
            tracker.in_flight(&active),
        ));
    };
    let mut state = shared.state.clone();
    let closed = session.closed();
    tokio::pin!(closed);
    // Moving to HTTP/2: one connection at a time, so the tunnel never has more than one
    // connection fewer; this one serves as before until its turn comes, and on if the move
    // is given up meanwhile.
    let turn = loop {
        let ended = {
            // Created once a loop: the loop inside turns once per request stream, and
            // re-creating these waits (watch receivers, notifier registrations) each time
            // showed up as a per-request cost. The one wait ends it for a drain, a shutdown
            // and a move to HTTP/2 alike.
            let stopped = state.wait_for(|s| !s.running() || shared.moves_to_http2(s));
            tokio::pin!(stopped);
            loop {
                tokio::select! {
                    s = conn.accept_bi() => match s {
                        Ok((send, recv)) => {
                            serve_stream(send, recv);
                        }
                        Err(e) => break lost(&e),
                    },
                    _ = &mut closed => break Ended::Lost { idle_timeout: false },
                    _ = &mut stopped => break Ended::Stopped,
                }
            }
        };
        if let Ended::Lost { .. } = ended {
            return Ok(ended);
        }
        // Every handle dropped closes the channel: stopped, whatever it last said.
        if shared.run_state() != RunState::Running || state.has_changed().is_err() {
            break None;
        }
        match await_turn(shared, conn, &serve_stream, closed.as_mut(), &mut state).await {
            Turn::Taken(turn) => break Some(turn),
            Turn::GivenUp => continue,
            Turn::Stopped => break None,
            Turn::Lost(ended) => return Ok(ended),
        }
    };
    guard.release();
    let turn = match shared.run_state() {
        RunState::Running => turn,
        RunState::Draining => None,
        RunState::Shutdown => return Ok(Ended::Stopped),
    };
    let grace = shared.opts.grace_period;
    // The grace period runs from the start of the drain (or move), unregistering included.
    let deadline = tokio::time::Instant::now() + grace;
    if !unregister(idx, &session, conn, &serve_stream, grace, &mut state).await {
        return Ok(Ended::Stopped);
    }
    match turn {
        Some(turn) => {
            hold(conn, &serve_stream, deadline, Some(&bounds), &mut state).await;
            if shared.run_state() == RunState::Running {
                tracing::info!(
                    conn_index = idx,
                    "closing the QUIC connection to move it to HTTP/2"
                );
                return Ok(Ended::Moved { turn });
            }
        }
        None => hold(conn, &serve_stream, deadline, None, &mut state).await,
    }
    Ok(Ended::Stopped)
}

/// What a connection asked to move to HTTP/2 got while it waited for its turn.
enum Turn {
    /// Its turn to move.
    Taken(tokio::sync::OwnedSemaphorePermit),
    /// The move was given up (see [`Shared::moves`]): the connection serves on, until HTTP/2
    /// is tried again.
    GivenUp,
    /// The connector drains or shuts down.
    Stopped,
    /// The connection was lost meanwhile.
    Lost(Ended),
}

/// Serves the streams the edge opens until this connection's turn to move to HTTP/2 comes.
async fn await_turn(
    shared: &Shared,
    conn: &quinn::Connection,
    serve_stream: &impl Fn(quinn::SendStream, quinn::RecvStream),
    mut closed: std::pin::Pin<&mut impl Future>,
    state: &mut watch::Receiver<Control>,
) -> Turn {
    let acquire = shared.moves.clone().acquire_owned();
    let stopped = state.wait_for(|s| !s.running() || !shared.moves_to_http2(s));
    tokio::pin!(acquire, stopped);
    loop {
        tokio::select! {
            s = conn.accept_bi() => match s {
                Ok((send, recv)) => {
                    serve_stream(send, recv);
                }
                Err(e) => return Turn::Lost(lost(&e)),
            },
            _ = &mut closed => return Turn::Lost(Ended::Lost { idle_timeout: false }),
            s = &mut stopped => return match s {
                Ok(s) if s.running() => Turn::GivenUp,
                // Drained, shut down, or every handle dropped.
                _ => Turn::Stopped,
            },
            permit = &mut acquire => return match permit {
                // The move is given up before the turn it held goes back.
                Ok(turn) if shared.prefers_http2() => Turn::Taken(turn),
                Ok(_) => Turn::GivenUp,
                // `moves` is never closed.
                Err(_) => Turn::Stopped,
            },
        }
    }
}

/// A registered connection that QUIC reports closed: lost.
fn lost(e: &quinn::ConnectionError) -> Ended {
    tracing::debug!(error = %e, "quic connection ended");
    Ended::Lost {
        idle_timeout: matches!(e, quinn::ConnectionError::TimedOut),
    }
}

/// How long a connection moving to HTTP/2 stays open, once unregistered, after its last
/// stream has ended: closing a QUIC connection discards the response data the edge has not
/// yet acknowledged, and requests the edge routed to it before acting on the
/// unregistration are still served meanwhile (each starts the wait over).
const MOVE_QUIET: Duration = Duration::from_secs(1);
/// How often a moving connection looks whether its streams have ended.
const MOVE_CHECK: Duration = Duration::from_millis(50);

/// Calls `unregisterConnection` (within `grace`) and serves the streams the edge opens until
/// it answers: requests keep arriving until the edge has acted on it, as `cloudflared`'s
/// accept loop keeps running. `false` if the connector shuts down meanwhile.
async fn unregister(
    idx: u8,
    session: &control::ControlSession,
    conn: &quinn::Connection,
    serve_stream: &impl Fn(quinn::SendStream, quinn::RecvStream),
    grace: Duration,
    state: &mut watch::Receiver<Control>,
) -> bool {
    let unregister = session.unregister(grace);
    tokio::pin!(unregister);
    loop {
        tokio::select! {
            res = &mut unregister => {
                match res {
                    Ok(()) => tracing::info!(conn_index = idx, "unregistered tunnel connection"),
                    Err(e) => tracing::warn!(conn_index = idx, error = %e, "unregister failed"),
                }
                return true;
            }
            s = conn.accept_bi() => match s {
                Ok((send, recv)) => {
                    serve_stream(send, recv);
                }
                // What follows sees the connection gone.
                Err(_) => return true,
            },
            _ = state.wait_for(|s| s.run == RunState::Shutdown) => return false,
        }
    }
}

/// Serves the streams the edge still opens, once unregistered, until `deadline` (the end of
/// the grace period), a shutdown, or the end of the connection. A draining connection is held
/// open that long, idle or not, as `cloudflared` holds it: the edge may still route requests
/// to it while the unregistration propagates. One moving to HTTP/2 (`moving`: its streams'
/// bounds, which each of its streams holds) returns sooner, once none of its streams has been
/// in flight for [`MOVE_QUIET`]. A stream handed on as an upgraded connection (WebSocket)
/// counts until its session is over (see [`serve_data`]); one still open at the deadline ends
/// with the connection, as at the end of a drain.
async fn hold(
    conn: &quinn::Connection,
    serve_stream: &impl Fn(quinn::SendStream, quinn::RecvStream),
    deadline: tokio::time::Instant,
    moving: Option<&Arc<Bounds>>,
    state: &mut watch::Receiver<Control>,
) {
    let over = tokio::time::sleep_until(deadline);
    let shutdown = state.wait_for(|s| s.run == RunState::Shutdown);
    let mut check = tokio::time::interval(MOVE_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut idle_since = None;
    tokio::pin!(over, shutdown);
    loop {
        tokio::select! {
            s = conn.accept_bi() => match s {
                Ok((send, recv)) => {
                    serve_stream(send, recv);
                }
                Err(_) => break,
            },
            _ = &mut over => break,
            _ = &mut shutdown => break,
            now = check.tick(), if moving.is_some() => {
                // Only this task adds streams, so a count of one (its own) stays one
                // until it accepts another.
                if moving.is_some_and(|b| Arc::strong_count(b) > 1) {
                    idle_since = None;
                } else if now.duration_since(*idle_since.get_or_insert(now)) >= MOVE_QUIET {
                    break;
                }
            }
        }
    }
}

/// Bytes a data stream starts with before its `ConnectRequest`'s segment: signature,
/// version, segment count and the first segment's size, which give the length of a
/// single-segment message (what edges send).
const STREAM_START: usize = 16;

/// The first bytes of an edge-opened stream: as many as had arrived together, up to
/// [`STREAM_START`].
struct StreamStart {
    bytes: [u8; STREAM_START],
    len: usize,
}

impl StreamStart {
    fn new() -> Self {
        Self {
            bytes: [0; STREAM_START],
            len: 0,
        }
    }

    /// Reads until at least `want` bytes are held, taking what else has arrived up to
    /// [`STREAM_START`] in the same read: every read of a QUIC stream takes the
    /// connection's lock, and the edge sends a request's preamble at once.
    async fn fill(&mut self, recv: &mut quinn::RecvStream, want: usize) -> Result<(), FrameError> {
        while self.len < want {
            match recv.read(&mut self.bytes[self.len..]).await {
                Ok(Some(n)) => self.len += n,
                Ok(None) => return Err(FrameError::Truncated),
                Err(e) => return Err(FrameError::Io(e.to_string())),
            }
        }
        Ok(())
    }

    fn kind(&self) -> Result<StreamKind, FrameError> {
        let [a, b, c, d, e, f, ..] = self.bytes;
        stream::classify(&[a, b, c, d, e, f])
    }
}

/// `fut`, given at most `limit` once it has to wait. A stream's preamble has usually all
/// arrived when the stream is accepted, and is then read with no timer set up.
async fn within<F: Future>(
    limit: Duration,
    fut: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(out);
    }
    tokio::time::timeout(limit, fut).await
}

/// What a connection's streams share. Each stream's task holds a clone of its connection's
/// `Arc` while it runs, which also counts the streams a connection has in flight.
struct Bounds {
    /// Room for the heads of data streams being read.
    preambles: stream::PreambleBudget,
    /// The one turn to read a configuration push.
    pushes: tokio::sync::Semaphore,
}

async fn handle_stream(
    shared: Arc<Shared>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    bounds: Arc<Bounds>,
    in_flight: InFlight,
) {
    let mut start = StreamStart::new();
    let kind = within(PREAMBLE_TIMEOUT, async {
        start.fill(&mut recv, DATA_SIGNATURE_LEN).await?;
        start.kind()
    })
    .await;
    match kind {
        Ok(Ok(StreamKind::Rpc)) => {
            let Ok(_turn) = bounds.pushes.acquire().await else {
                return;
            };
            // The session's first bytes may have come with the signature.
            let early = start.bytes[DATA_SIGNATURE_LEN..start.len].to_vec();
            let stream = RpcStream {
                reader: std::io::Cursor::new(early).chain(recv),
                writer: send,
            };
            if let Err(e) = remote_config::serve(
                &shared.worker,
                stream,
                shared.remote_config.clone(),
                shared.opts.rpc_timeout,
            )
            .await
            {
                tracing::debug!(error = %e, "edge rpc stream ended");
            }
        }
        Ok(Ok(StreamKind::Data)) => {
            let upgraded = serve_data(&shared, send, recv, start, &bounds.preambles, in_flight);
            if let Some(session) = upgraded.await {
                // The session holds its connection's bounds while it lasts, so that a
                // connection moving to HTTP/2 waits for it as for a request (see [`hold`]).
                // A task of its own: this one, kilobytes, ends now.
                tokio::spawn(async move {
                    session.await;
                    drop(bounds);
                });
            }
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "resetting stream with a bad preamble");
            let _ = send.reset(VarInt::from_u32(0));
            let _ = recv.stop(VarInt::from_u32(0));
        }
        Err(_) => {
            let _ = send.reset(VarInt::from_u32(0));
            let _ = recv.stop(VarInt::from_u32(0));
        }
    }
}

/// Answers with a `ConnectResponse` error and finishes the stream; whether it got out. The
/// write is bounded by `limit` (the send timeout) as a response's are: an edge that grants
/// the stream no credit would otherwise hold it, and its place in flight, for good.
async fn write_error(send: &mut quinn::SendStream, message: String, limit: Duration) -> bool {
    let resp = ConnectResponse {
        error: message,
        metadata: Vec::new(),
    };
    let answer = Bytes::from(stream::encode_connect_response(&resp));
    write_all(send, &mut [answer], limit).await.is_ok() && send.finish().is_ok()
}

/// A response stream that is reset if it is dropped before it was finished, reset or
/// handed on. quinn finishes a dropped send stream, so a response cut off by a panicking
/// service or a cancelled task would otherwise reach the edge as a complete one.
struct ResponseStream(Option<quinn::SendStream>);

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if let Some(send) = &mut self.0 {
            // Also discards the data of a finished stream: only unfinished ones get here.
            let _ = send.reset(VarInt::from_u32(0));
        }
    }
}

/// How a request stream's exchange ended.
enum Exchange {
    /// The stream was finished or reset: nothing left to do.
    Closed,
    /// Cut short mid-write: the stream is reset.
    Abandoned,
    /// `101 Switching Protocols` went out: the service's side of the upgrade gets the
    /// stream in both directions.
    Upgraded(oneshot::Sender<Upgraded>, quinn::RecvStream),
}

/// Serves a request stream. For one handed on as an upgraded connection (WebSocket), returns
/// what resolves once its session is over: the edge has stopped the connector's side of the
/// stream, or has acknowledged all of it once the service finished it (dropping it does), or
/// the connection has closed.
async fn serve_data(
    shared: &Shared,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    start: StreamStart,
    budget: &stream::PreambleBudget,
    in_flight: InFlight,
) -> Option<impl Future<Output = ()> + Send + 'static> {
    let mut stream = ResponseStream(Some(send));
    let send = stream.0.as_mut()?;
    match serve_exchange(shared, send, recv, start, budget).await {
        Exchange::Closed => {
            stream.0 = None;
        }
        Exchange::Abandoned => {}
        Exchange::Upgraded(tx, recv) => {
            if let Some(send) = stream.0.take() {
                let over = send.stopped();
                if tx
                    .send(Upgraded::quic(send, recv).counted(in_flight))
                    .is_ok()
                {
                    return Some(async move {
                        let _ = over.await;
                    });
                }
            }
        }
    }
    None
}

/// Reads and decodes the rest of a data stream's preamble: the version and the framed
/// `ConnectRequest`. A single-segment message whose segment came in one piece (as the
/// edge sends it) is decoded where quinn holds it, with no copy: with the signature, the
/// whole preamble takes two reads of the stream.
async fn read_request_head(
    recv: &mut quinn::RecvStream,
    mut start: StreamStart,
    budget: &stream::PreambleBudget,
) -> Result<Result<RequestHead, MapError>, FrameError> {
    start.fill(recv, STREAM_START).await?;
    let [_, _, _, _, _, _, v0, v1, table @ ..] = start.bytes;
    if [v0, v1] != stream::DATA_VERSION {
        return Err(FrameError::UnsupportedVersion);
    }
    let Some(total) = stream::framed_len(&table)? else {
        // More than one segment: their sizes follow.
        let (frame, _share) = stream::read_frame_rest(recv, table.to_vec(), Some(budget)).await?;
        return decode_request_head(&Bytes::from(frame));
    };
    // The frame's share of the budget goes back once it is decoded.
    let _share = stream::BudgetShare::reserve(Some(budget), total).await;
    let len = total - table.len();
    let segment = match len {
        0 => Bytes::new(),
        _ => match recv.read_chunk(len, true).await {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => return Err(FrameError::Truncated),
            Err(e) => return Err(FrameError::Io(e.to_string())),
        },
    };
    if segment.len() == len {
        return decode_request_segment(&segment);
    }
    // It came in pieces: gathered into one buffer.
    let mut buf = Vec::with_capacity(table.len() + segment.len());
    buf.extend_from_slice(&table);
    buf.extend_from_slice(&segment);
    let frame = stream::read_frame_tail(recv, buf, total).await?;
    decode_request_head(&Bytes::from(frame))
}

async fn serve_exchange(
    shared: &Shared,
    send: &mut quinn::SendStream,
    mut recv: quinn::RecvStream,
    start: StreamStart,
    budget: &stream::PreambleBudget,
) -> Exchange {
    let preamble = within(
        PREAMBLE_TIMEOUT,
        read_request_head(&mut recv, start, budget),
    )
    .await;
    let mapped = match preamble {
        Ok(Ok(mapped)) => mapped,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "resetting stream with a malformed request");
            let _ = recv.stop(VarInt::from_u32(0));
            return Exchange::Abandoned;
        }
        Err(_) => return Exchange::Abandoned,
    };
    let (head, has_body, kind) = match mapped {
        Ok(h) => h,
        Err(e) => {
            let _ = recv.stop(VarInt::from_u32(0));
            let error = match e {
                MapError::Unsupported => e.to_string(),
                e => format!("malformed request: {e}"),
            };
            return closed_if(write_error(send, error, shared.opts.send_timeout).await);
        }
    };
    let websocket = kind == ConnectionType::Websocket;
    let content_length = head
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| crate::stream::http_map::parse_content_length(v.as_bytes()));
    let (mut parts, ()) = head.into_parts();
    crate::stream::origin::prepare(&mut parts.headers, &shared.warp_tag);
    let mut upgrade_tx = None;
    let mut handback = None;
    let (body, mut spare_recv) = if websocket {
        let (tx, on) = OnUpgrade::pair();
        parts.extensions.insert(on);
        upgrade_tx = Some(tx);
        (Body::empty(), Some(recv))
    } else if has_body {
        let (tx, rx) = oneshot::channel();
        handback = Some(rx);
        (Body::quic_request(recv, content_length, tx), None)
    } else {
        (Body::empty(), Some(recv))
    };
    tracing::debug!(uri = %parts.uri, websocket, "serving tunnelled request");
    // The edge cancels the stream (STOP_SENDING) when the eyeball goes away. As in
    // `cloudflared`, whose request context ends then, the exchange is abandoned at once and
    // the service's future dropped, rather than on the next write: a request waiting on a
    // slow backend or an idle response stream would otherwise keep its backend request and
    // its stream credit until then.
    let stopped = send.stopped();
    tokio::pin!(stopped);
    let call = shared.handler.call(Request::from_parts(parts, body));
    let resp = tokio::select! {
        biased;
        resp = call => match resp {
            Ok(r) => r,
            Err(e) => {
                let error = format!("service failed: {e}");
                return closed_if(write_error(send, error, shared.opts.send_timeout).await);
            }
        },
        _ = &mut stopped => {
            tracing::debug!("stream cancelled by the edge before the response");
            return Exchange::Abandoned;
        }
    };
    let (parts, body) = resp.into_parts();
    let head = Bytes::from(encode_response_head(parts.status, &parts.headers));
    let limit = shared.opts.send_timeout;
    if websocket && parts.status == StatusCode::SWITCHING_PROTOCOLS {
        if write_all(send, &mut [head], limit).await.is_err() {
            return Exchange::Abandoned;
        }
        return match (upgrade_tx, spare_recv.take()) {
            (Some(tx), Some(recv)) => Exchange::Upgraded(tx, recv),
            _ => closed_if(send.finish().is_ok()),
        };
    }
    let written = write_response(send, head, body, stopped, limit, &shared.dropped_trailers);
    let ended = match written.await {
        Ok(()) => {
            let _ = send.finish();
            Exchange::Closed
        }
        Err(e) => {
            tracing::debug!(error = %e, "response body failed; resetting stream");
            Exchange::Abandoned
        }
    };
    // A request body the service left unread is stopped now that the response is
    // out, as `cloudflared` stops it; one the service still holds is stopped when
    // it lets go.
    if let Some(mut recv) = spare_recv.or_else(|| handback.and_then(|mut rx| rx.try_recv().ok())) {
        let _ = recv.stop(VarInt::from_u32(0));
    }
    ended
}

fn closed_if(finished: bool) -> Exchange {
    if finished {
        Exchange::Closed
    } else {
        Exchange::Abandoned
    }
}

/// Writes the response head and body. A body frame that is already there goes
/// out with the head, in one packet; a body that is not ready yet (a stream, a
/// slow backend) does not hold the head back. It returns as soon as the body
/// says it has ended, without waiting for the final empty poll (a backend
/// connection signals the end of a sized body a task hop later), so the
/// caller's `finish` goes out in the same packet as the last data.
/// `stopped` resolves when the edge cancels the stream: waiting for the body then ends with
/// an error, as does a write blocked for `limit` (the send timeout). Trailers go into
/// `dropped`: a QUIC stream cannot carry them.
async fn write_response(
    send: &mut quinn::SendStream,
    head: Bytes,
    body: ResponseBody,
    mut stopped: impl Future + Unpin,
    limit: Duration,
    dropped: &DroppedTrailers,
) -> Result<(), crate::body::BoxError> {
    let mut body = std::pin::pin!(body);
    let mut head = Some(head);
    while !body.is_end_stream() {
        let frame = match head.take() {
            Some(h) => match poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await {
                Poll::Ready(frame) => {
                    head = Some(h);
                    frame
                }
                Poll::Pending => {
                    write_all(send, &mut [h], limit).await?;
                    next_frame(body.as_mut(), &mut stopped).await?
                }
            },
            None => next_frame(body.as_mut(), &mut stopped).await?,
        };
        let Some(frame) = frame else { break };
        match frame?.into_data() {
            Ok(data) => match head.take() {
                Some(h) => write_all(send, &mut [h, data], limit).await?,
                None if !data.is_empty() => write_all(send, &mut [data], limit).await?,
                None => {}
            },
            // Trailers cannot be carried over QUIC; they are dropped as the edge does, and
            // counted, since gRPC's status goes with them.
            Err(frame) => {
                if frame.is_trailers() {
                    dropped.record();
                }
            }
        }
    }
    if let Some(h) = head {
        write_all(send, &mut [h], limit).await?;
    }
    Ok(())
}

/// Writes all of `bufs`. Each wait for the stream to take more is bounded by `limit`, so the
/// send timeout starts over whenever some of it goes through: an eyeball that reads slowly
/// is not cut, one that reads nothing is.
async fn write_all(
    send: &mut quinn::SendStream,
    mut bufs: &mut [Bytes],
    limit: Duration,
) -> Result<(), crate::body::BoxError> {
    while !bufs.is_empty() {
        let written = {
            let mut write = std::pin::pin!(send.write_chunks(bufs));
            crate::send_timeout::within(limit, |cx| write.as_mut().poll(cx)).await??
        };
        bufs = &mut bufs[written.chunks..];
    }
    Ok(())
}

/// The body's next frame, unless the edge cancels the stream first.
async fn next_frame(
    mut body: std::pin::Pin<&mut ResponseBody>,
    stopped: &mut (impl Future + Unpin),
) -> Result<Option<Result<http_body::Frame<Bytes>, crate::body::BoxError>>, crate::body::BoxError> {
    tokio::select! {
        biased;
        frame = body.frame() => Ok(frame),
        _ = stopped => Err("stream cancelled by the edge".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edge_may_send_quic_gos_largest_payload() {
        assert_eq!(endpoint_config().get_max_udp_payload_size(), 1452);
    }
}
