//! HTTP/2 transport (connector side): TLS client, HTTP/2 *server* on that
//! connection (the edge sends the preface and opens every stream). The
//! control stream is a request marked
//! `cf-cloudflared-proxy-connection-upgrade: control-stream`; eyeball
//! requests arrive as ordinary HTTP/2 requests; responses carry the origin
//! headers serialised in `cf-cloudflared-response-headers`.

use std::future::Future as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt as _, Limited};
use tokio::sync::{oneshot, watch};

use crate::body::{Body, OnUpgrade, Upgraded};
use crate::connection::{
    register_params, unless_stopped, ConnError, Ended, RegisteredGuard, RunState, Shared,
};
use crate::h2io::{send_body, H2Io, H2Reader, H2Writer};
use crate::liveness::{self, Heard};
use crate::metrics::ProtocolLabel;

use crate::rpc::control::{self, RegisterOutcome, RegisterParams};
use crate::rpc::RpcStream;
use crate::stream::headers::{
    self, CONNECTION_UPGRADE, META_CONNECTOR, META_ORIGIN, PROXY_SRC, RESPONSE_HEADERS,
    RESPONSE_META,
};
use crate::stream::origin::{self, add_websocket_headers};
use crate::tasks::{InFlight, StreamTasks};
use crate::tls::H2_SERVER_NAME;

/// How long the TCP connect to the edge, and then the TLS handshake, may each take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(15);
/// [`DIAL_TIMEOUT`] of an attempt made by preference: an `auto` connection on HTTP/2 because
/// the connector prefers it, which has QUIC to go to once HTTP/2 is given up (after three
/// failures), and has not registered over HTTP/2 since it took the preference up (once it
/// has, the path carries HTTP/2, and its reconnects wait the usual time). Where TCP to the
/// edge is dropped, three attempts of 15 s would keep a tunnel starting with gRPC in its table
/// unready for about 50 s before QUIC is tried; the edge
/// answers a connect, and a TLS handshake, within a second from anywhere it serves. A
/// connection on HTTP/2 by configuration, or by the fallback from QUIC, has nowhere else to
/// go and waits as `cloudflared` does.
const PREFERRED_DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The [`DIAL_TIMEOUT`] of an attempt, made by preference before the connection registered
/// over HTTP/2 (`by_preference`) or not.
fn dial_timeout(by_preference: bool) -> Duration {
    match by_preference {
        true => PREFERRED_DIAL_TIMEOUT,
        false => DIAL_TIMEOUT,
    }
}
/// How long the edge has to send its HTTP/2 connection preface, as in Go's HTTP/2 server.
const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONFIG_BYTES: usize = 8 * 1024 * 1024;

type TlsStream = Heard<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
type Accepted = (Request<h2::RecvStream>, h2::server::SendResponse<Bytes>);

/// Largest frame the edge may send: Go's HTTP/2 server default, which `cloudflared` uses.
const MAX_FRAME_SIZE: u32 = 1 << 20;
/// Largest request head the edge may send: Go's `http.DefaultMaxHeaderBytes` plus the
/// 320 bytes of slack its HTTP/2 server adds, as `cloudflared` advertises it.
const MAX_HEADER_LIST_SIZE: u32 = (1 << 20) + 320;

/// The HTTP/2 server settings the edge gets. Frame size and header list are `cloudflared`'s;
/// concurrent request streams are bounded at `max_streams`, as on QUIC connections (`cloudflared`
/// sets no bound, which leaves the requests in flight, each a task holding its head, to the
/// edge); the flow-control windows are larger than Go's 1 MiB, so an upload is not held to
/// 1 MiB in flight per connection (the edge reads them from the SETTINGS frame, as from any
/// peer).
fn server_builder(max_streams: u32) -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        // The edge's control stream, open for the connection's life, counts too.
        .max_concurrent_streams(max_streams.max(1).saturating_add(1))
        .initial_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(16 * 1024 * 1024)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    builder
}

/// One HTTP/2 connection: dial, register, serve until lost or drained. `turn`, the turn of a
/// connection moving from QUIC, is given back once this one has registered; an attempt that
/// fails leaves it with the caller, for the next attempt. `by_preference`: made by an `auto`
/// connection on HTTP/2 because the connector prefers it, not registered over HTTP/2 since it
/// took the preference up (see [`PREFERRED_DIAL_TIMEOUT`]).
pub(crate) async fn connect(
    shared: &Arc<Shared>,
    idx: u8,
    addr: SocketAddr,
    attempt: u8,
    turn: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    by_preference: bool,
) -> Result<Ended, ConnError> {
    let timeout = dial_timeout(by_preference);
    let dialing = async {
        let tcp = dial_tcp(addr, timeout).await?;
        let local_ip = tcp.local_addr().map_err(ConnError::dial)?.ip();
        let name =
            rustls::pki_types::ServerName::try_from(H2_SERVER_NAME).map_err(ConnError::dial)?;
        let tls = tokio::time::timeout(
            timeout,
            tokio_rustls::TlsConnector::from(shared.h2_client.clone()).connect(name, tcp),
        )
        .await
        .map_err(|_| ConnError::dial("tls handshake timed out"))?
        .map_err(ConnError::dial)?;
        let (tls, read) = Heard::new(tls);
        // The edge speaks first over HTTP/2 (its connection preface); one that never does
        // would hold this connection forever. Go's HTTP/2 server, `cloudflared`'s, waits 10 s
        // for it.
        let conn = tokio::time::timeout(
            PREFACE_TIMEOUT,
            server_builder(shared.opts.quic_max_streams).handshake::<_, Bytes>(tls),
        )
        .await
        .map_err(|_| ConnError::control_stream("edge sent no HTTP/2 preface"))?
        .map_err(ConnError::control_stream)?;
        Ok::<_, ConnError>((conn, read, local_ip))
    };
    let Some(dialed) = unless_stopped(shared, dialing).await else {
        return Ok(Ended::Stopped);
    };
    let (mut conn, read, local_ip) = dialed?;
    let interval = keepalive(shared);
    let silent = liveness::silent(conn.ping_pong(), read, interval, interval);

    let tracker = StreamTasks::new();
    let _cancel = tracker.cancel_on_drop();
    let (control_tx, control_rx) = oneshot::channel();
    let (close_tx, close_rx) = watch::channel(false);
    let mut accept_task = tokio::spawn(accept_loop(
        conn,
        silent,
        shared.clone(),
        control_tx,
        tracker.clone(),
        close_rx,
    ));
    let params = register_params(shared, idx, local_ip, attempt);
    let result = serve(
        shared,
        idx,
        addr,
        params,
        control_rx,
        &mut accept_task,
        turn,
    )
    .await;
    // A shutdown, or the end of a drain's grace period, ends the requests still in flight at
    // once (their streams are reset), so the graceful close below does not wait on them.
    if shared.run_state() != RunState::Running {
        tracker.cancel();
    }
    let _ = close_tx.send(true);
    // `is_finished` guards against polling a handle that already completed.
    if !accept_task.is_finished()
        && tokio::time::timeout(Duration::from_secs(2), &mut accept_task)
            .await
            .is_err()
    {
        accept_task.abort();
    }
    result
}

fn keepalive(shared: &Shared) -> Duration {
    shared.opts.http2_keepalive.max(Duration::from_millis(1))
}

/// TCP keep-alive as Go's dialer sets it for `cloudflared`: the first probe
/// after 15 s of silence, then every 15 s, 9 unanswered probes end the
/// connection. Without it a half-open connection stays registered.
fn tcp_keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(15))
        .with_interval(Duration::from_secs(15))
        .with_retries(9)
}

/// Connects to the edge with `cloudflared`'s socket options, within `timeout`.
async fn dial_tcp(addr: SocketAddr, timeout: Duration) -> Result<tokio::net::TcpStream, ConnError> {
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| ConnError::dial("tcp connect timed out"))?
        .map_err(ConnError::dial)?;
    let _ = tcp.set_nodelay(true);
    // As in Go, a socket that refuses the options is still used.
    if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&tcp_keepalive()) {
        tracing::debug!(error = %e, "tcp keep-alive not set");
    }
    Ok(tcp)
}

async fn serve(
    shared: &Arc<Shared>,
    idx: u8,
    addr: SocketAddr,
    params: RegisterParams,
    control_rx: oneshot::Receiver<Accepted>,
    accept_task: &mut tokio::task::JoinHandle<Closed>,
    turn: &mut Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<Ended, ConnError> {
    let registering = async {
        let (req, mut respond) = tokio::time::timeout(shared.opts.rpc_timeout * 2, control_rx)
            .await
            .map_err(|_| ConnError::control_stream("edge opened no control stream"))?
            .map_err(|_| {
                ConnError::control_stream("connection closed before the control stream")
            })?;
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(())
            .map_err(ConnError::control_stream)?;
        let send = respond
            .send_response(resp, false)
            .map_err(ConnError::control_stream)?;
        Ok::<_, ConnError>(
            control::register(
                &shared.worker,
                RpcStream {
                    reader: H2Reader::new(req.into_body()),
                    writer: H2Writer::new(send),
                },
                params,
                shared.opts.rpc_timeout,
            )
            .await?,
        )
    };
    let Some(registered) = unless_stopped(shared, registering).await else {
        return Ok(Ended::Stopped);
    };
    let (session, outcome) = registered?;
    let details = match outcome {
        RegisterOutcome::Registered(d) => d,
        RegisterOutcome::Refused(r) => {
            // The edge closes the connection after an error; give it a moment.
            if !accept_task.is_finished() {
                let _ = tokio::time::timeout(Duration::from_secs(1), &mut *accept_task).await;
            }
            return Err(ConnError::Refused(r));
        }
    };
    tracing::info!(
        conn_index = idx,
        connection = %details.uuid,
        edge = %addr,
        location = %details.location,
        protocol = "http2",
        "registered tunnel connection"
    );
    let mut guard = RegisteredGuard::new(shared, ProtocolLabel::Http2, idx);
    // Registered: the next connection may start its move.
    drop(turn.take());
    let mut state = shared.state.clone();
    let ended = tokio::select! {
        closed = &mut *accept_task => Ended::Lost {
            idle_timeout: matches!(closed, Ok(Closed::Silent)),
        },
        _ = session.closed() => Ended::Lost { idle_timeout: false },
        _ = state.wait_for(|s| !s.running()) => Ended::Stopped,
    };
    guard.release();
    if let Ended::Lost { .. } = ended {
        return Ok(ended);
    }
    if shared.run_state() == RunState::Draining {
        let grace = shared.opts.grace_period;
        // The grace period runs from the start of the drain, unregistering included.
        let deadline = tokio::time::Instant::now() + grace;
        tokio::select! {
            res = session.unregister(grace) => match res {
                Ok(()) => tracing::info!(conn_index = idx, "unregistered tunnel connection"),
                Err(e) => tracing::warn!(conn_index = idx, error = %e, "unregister failed"),
            },
            _ = state.wait_for(|s| s.run == RunState::Shutdown) => return Ok(Ended::Stopped),
        }
        // The connection is held open for the whole grace period, idle or not, as
        // `cloudflared` holds it: the accept loop keeps serving the requests the edge
        // still routes to it while the unregistration propagates. Then it closes.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = &mut *accept_task, if !accept_task.is_finished() => {}
            _ = state.wait_for(|s| s.run == RunState::Shutdown) => {}
        }
    }
    Ok(Ended::Stopped)
}

/// Why an edge connection's accept loop ended.
#[derive(Debug)]
enum Closed {
    /// The connection ended, with an error or without, or was closed on request.
    Ended,
    /// The edge went silent (see [`liveness`]): the connection is dropped as lost.
    Silent,
}

async fn accept_loop(
    mut conn: h2::server::Connection<TlsStream, Bytes>,
    silent: impl std::future::Future<Output = ()>,
    shared: Arc<Shared>,
    control_tx: oneshot::Sender<Accepted>,
    tracker: StreamTasks,
    mut close_rx: watch::Receiver<bool>,
) -> Closed {
    tokio::pin!(silent);
    let mut control_tx = Some(control_tx);
    let active = shared.metrics.active_streams(ProtocolLabel::Http2);
    // Configuration pushes are read one at a time: the others wait unread, held to their
    // flow-control windows, instead of each buffering a document of its own.
    let pushes = Arc::new(tokio::sync::Semaphore::new(1));
    loop {
        tokio::select! {
            r = conn.accept() => match r {
                Some(Ok((req, respond))) => {
                    let upgrade = req
                        .headers()
                        .get(CONNECTION_UPGRADE)
                        .map(|v| v.as_bytes().to_ascii_lowercase());
                    let tcp = req.headers().get(PROXY_SRC).is_some_and(|v| !v.is_empty());
                    match upgrade.as_deref() {
                        Some(b"update-configuration") => {
                            tracker.spawn(config_push(shared.clone(), pushes.clone(), req, respond));
                        }
                        Some(b"websocket") => {
                            tracker.spawn(handle_request(shared.clone(), req, respond, true, tracker.in_flight(&active)));
                        }
                        _ if tcp => {
                            let mut respond = respond;
                            connector_error(&mut respond, StatusCode::BAD_GATEWAY);
                        }
                        Some(b"control-stream") => match control_tx.take() {
                            Some(tx) => {
                                let _ = tx.send((req, respond));
                            }
                            None => {
                                let mut respond = respond;
                                connector_error(&mut respond, StatusCode::BAD_REQUEST);
                            }
                        },
                        _ => {
                            tracker.spawn(handle_request(shared.clone(), req, respond, false, tracker.in_flight(&active)));
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "http2 edge connection ended");
                    return Closed::Ended;
                }
                None => return Closed::Ended,
            },
            () = &mut silent => {
                tracing::warn!(
                    keepalive = ?keepalive(&shared),
                    "edge sent nothing in answer to an HTTP/2 ping; dropping the connection"
                );
                return Closed::Silent;
            }
            _ = async { let _ = close_rx.wait_for(|c| *c).await; } => {
                conn.graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(_)) = conn.accept().await {}
                })
                .await;
                return Closed::Ended;
            }
        }
    }
}

/// An answer the connector makes itself, with the headers Go's HTTP/2 server adds
/// to an empty `cloudflared` response (`content-length: 0`, `date`).
fn connector_error(respond: &mut h2::server::SendResponse<Bytes>, status: StatusCode) {
    let resp = Response::builder()
        .status(status)
        .header(RESPONSE_META, META_CONNECTOR)
        .header(CONTENT_LENGTH, 0)
        .header(
            http::header::DATE,
            httpdate::fmt_http_date(std::time::SystemTime::now()),
        )
        .body(());
    if let Ok(resp) = resp {
        let _ = respond.send_response(resp, true);
    }
}

async fn handle_request(
    shared: Arc<Shared>,
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    websocket: bool,
    in_flight: InFlight,
) {
    let (mut parts, recv) = req.into_parts();
    let content_length = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| crate::stream::http_map::parse_content_length(v.as_bytes()));
    origin::prepare(&mut parts.headers, &shared.warp_tag);
    if let Some(authority) = parts.uri.authority() {
        if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(HOST, v);
        }
    }
    // Same request shape as over QUIC: the eyeball's protocol is not the
    // connector's to expose; trailers still arrive through the body.
    parts.version = Version::HTTP_11;
    let mut upgrade = None;
    let body = if websocket {
        add_websocket_headers(&mut parts.headers);
        let (tx, on) = OnUpgrade::pair();
        parts.extensions.insert(on);
        upgrade = Some((tx, recv));
        Body::empty()
    } else {
        Body::h2_request(recv, content_length)
    };
    // The edge resets the stream when the eyeball goes away; the service's future is then
    // dropped at once, as `cloudflared` ends the origin request's context, not left to run
    // until its answer finds the stream gone.
    let call = shared.handler.call(Request::from_parts(parts, body));
    let mut call = std::pin::pin!(call);
    let answered = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        respond.poll_reset(cx).map(|_| None)
    })
    .await;
    let resp = match answered {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            tracing::debug!(error = %e, "service failed");
            connector_error(&mut respond, StatusCode::BAD_GATEWAY);
            return;
        }
        None => {
            tracing::debug!("stream reset by the edge before the response");
            return;
        }
    };
    let (rparts, rbody) = resp.into_parts();
    let switched = websocket && rparts.status == StatusCode::SWITCHING_PROTOCOLS;
    // HTTP/2 has no 101 (a 1xx head is interim, and the stream would end on it):
    // any 101 goes out as 200, as `cloudflared` writes it, upgrade or not.
    let mut builder =
        Response::builder().status(if rparts.status == StatusCode::SWITCHING_PROTOCOLS {
            StatusCode::OK
        } else {
            rparts.status
        });
    if let Some(h) = builder.headers_mut() {
        if let Some(v) = headers::serialise_value(&rparts.headers, switched) {
            h.insert(RESPONSE_HEADERS, v);
        }
        h.insert(RESPONSE_META, HeaderValue::from_static(META_ORIGIN));
        if let Some(cl) = rparts.headers.get(CONTENT_LENGTH) {
            h.insert(CONTENT_LENGTH, cl.clone());
        }
        if let Some(t) = rparts.headers.get("cf-int-cloudflared-tracing") {
            h.insert("cf-int-cloudflared-tracing", t.clone());
        }
    }
    let Ok(head) = builder.body(()) else {
        connector_error(&mut respond, StatusCode::BAD_GATEWAY);
        return;
    };
    let end = !switched && http_body::Body::is_end_stream(&rbody);
    let Ok(mut send) = respond.send_response(head, end) else {
        return;
    };
    if switched {
        if let Some((tx, recv)) = upgrade {
            let _ = tx.send(Upgraded::h2(H2Io::new(recv, send)).counted(in_flight));
        }
        return;
    }
    if end {
        return;
    }
    if let Err(e) = send_body(&mut send, rbody, Some(shared.opts.send_timeout)).await {
        tracing::debug!(error = %e, "response body failed; resetting stream");
        send.send_reset(h2::Reason::INTERNAL_ERROR);
    }
}

/// A configuration push as `cloudflared` decodes it: the first JSON value of
/// the body, fields absent or unknown allowed, the document kept as the bytes
/// it came in (Go's `json.RawMessage`).
#[derive(serde::Deserialize)]
struct PushBody {
    #[serde(default)]
    version: i32,
    /// `None` only when absent: a `null` document is kept as the bytes `null`,
    /// as Go's `json.RawMessage` keeps it.
    #[serde(default, deserialize_with = "present")]
    config: Option<Box<serde_json::value::RawValue>>,
}

fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<serde_json::value::RawValue>>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

/// The answer to a push, JSON-encoded as `cloudflared` encodes its Go
/// response: `err` is `null` when the push applied (or was not newer), and an
/// object when it failed. Go writes an error as its exported fields: `{}` for
/// the plain errors ingress validation returns, but `{"Offset":N}` for a JSON
/// syntax error; that field is not reproduced here, every failure is `{}`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PushReply {
    last_applied_version: i32,
    err: Option<PushError>,
}

#[derive(serde::Serialize)]
struct PushError {}

/// The reply body for a push body, or `None` when the body does not decode;
/// `cloudflared` answers that as a connector error (502) instead.
fn push_reply(
    state: &crate::rpc::remote_config::RemoteConfigState,
    body: &[u8],
) -> Option<Vec<u8>> {
    let push = serde_json::Deserializer::from_slice(body)
        .into_iter::<PushBody>()
        .next()?
        .ok()?;
    // An absent config applies as an empty document, which fails as in `cloudflared`.
    let config = push
        .config
        .map(|c| c.get().as_bytes().to_vec())
        .unwrap_or_default();
    let (version, err) = state.apply(push.version, &config);
    if let Some(e) = &err {
        tracing::warn!(version = push.version, error = %e, "configuration push not applied");
    }
    serde_json::to_vec(&PushReply {
        last_applied_version: version,
        err: err.map(|_| PushError {}),
    })
    .ok()
}

/// Answers one configuration push. Its document must arrive within the RPC timeout once
/// it is being read, so a push that trickles in cannot hold the turn (or a drain) for long.
async fn config_push(
    shared: Arc<Shared>,
    pushes: Arc<tokio::sync::Semaphore>,
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let Ok(_turn) = pushes.acquire().await else {
        return;
    };
    let collect = Limited::new(Body::h2(req.into_body()), MAX_CONFIG_BYTES).collect();
    let body = tokio::time::timeout(shared.opts.rpc_timeout, collect).await;
    // Decoding and checking a document of up to 8 MiB takes milliseconds, which a worker
    // serving requests is not held for.
    let state = Arc::clone(&shared.remote_config);
    let reply = match body.ok().and_then(|b| b.ok()).map(|c| c.to_bytes()) {
        Some(b) => tokio::task::spawn_blocking(move || push_reply(&state, &b))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let Some(reply) = reply else {
        connector_error(&mut respond, StatusCode::BAD_GATEWAY);
        return;
    };
    // Go's server sniffs this content type for the JSON text.
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(CONTENT_LENGTH, reply.len())
        .body(());
    if let Ok(resp) = resp {
        if let Ok(mut send) = respond.send_response(resp, false) {
            let _ = send.send_data(Bytes::from(reply), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_replies_are_encoded_as_cloudflared_encodes_them() {
        let state = crate::rpc::remote_config::RemoteConfigState::new(Default::default());
        let reply = |body: &str| push_reply(&state, body.as_bytes()).map(String::from_utf8);
        assert_eq!(
            reply(r#"{"version":3,"config":{"ingress":[]}} trailing"#),
            Some(Ok(r#"{"lastAppliedVersion":3,"err":null}"#.to_owned()))
        );
        assert_eq!(
            reply(r#"{"version":2,"config":{}}"#),
            Some(Ok(r#"{"lastAppliedVersion":3,"err":null}"#.to_owned())),
            "an older push is no error"
        );
        assert_eq!(
            reply(r#"{"version":4}"#),
            Some(Ok(r#"{"lastAppliedVersion":3,"err":{}}"#.to_owned()))
        );
        // A `null` document is one Go decodes (to an empty configuration); an
        // array is not.
        assert_eq!(
            reply(r#"{"version":5,"config":null}"#),
            Some(Ok(r#"{"lastAppliedVersion":5,"err":null}"#.to_owned()))
        );
        assert_eq!(
            reply(r#"{"version":6,"config":[]}"#),
            Some(Ok(r#"{"lastAppliedVersion":5,"err":{}}"#.to_owned()))
        );
        assert_eq!(reply("not json"), None);
        assert_eq!(reply(r#"{"version":"5","config":{}}"#), None);
        assert_eq!(reply(""), None);
    }

    /// The SETTINGS frame the connector's HTTP/2 server opens with, as the edge reads it.
    #[tokio::test]
    async fn the_edge_gets_cloudflareds_frame_and_header_limits_and_a_stream_bound() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut edge, connector) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let conn = server_builder(1024).handshake::<_, Bytes>(connector).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(conn);
        });
        // The client preface and an empty SETTINGS frame.
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        edge.write_all(&preface).await.unwrap();
        let mut settings = std::collections::HashMap::new();
        loop {
            let mut head = [0u8; 9];
            edge.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            edge.read_exact(&mut payload).await.unwrap();
            // SETTINGS (type 4) without the ACK flag.
            if head[3] == 4 && head[4] & 1 == 0 {
                for entry in payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([entry[0], entry[1]]);
                    let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
                    settings.insert(id, value);
                }
                break;
            }
        }
        server.abort();
        assert_eq!(
            settings.get(&3),
            Some(&1025),
            "MAX_CONCURRENT_STREAMS: 1024 requests and the control stream"
        );
        assert_eq!(settings.get(&4), Some(&(4 << 20)), "INITIAL_WINDOW_SIZE");
        assert_eq!(settings.get(&5), Some(&(1 << 20)), "MAX_FRAME_SIZE");
        assert_eq!(settings.get(&6), Some(&1_048_896), "MAX_HEADER_LIST_SIZE");
    }

    #[tokio::test]
    async fn edge_tcp_connections_keep_alive_as_cloudflared() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = dial_tcp(listener.local_addr().unwrap(), DIAL_TIMEOUT)
            .await
            .unwrap();
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(15));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(15)
        );
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), 9);
        assert!(sock.tcp_nodelay().unwrap());
    }

    /// An attempt made by preference, with QUIC to go to, gives a silent edge 5 s to answer
    /// its connect and its TLS handshake; one by configuration or fallback waits 15 s, as
    /// `cloudflared` does.
    #[test]
    fn an_attempt_by_preference_waits_less_for_the_edge_to_answer() {
        assert_eq!(dial_timeout(true), Duration::from_secs(5));
        assert_eq!(dial_timeout(false), Duration::from_secs(15));
    }
}
