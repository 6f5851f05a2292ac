//! Eyeball requests forwarded through registered connector connections, as the edge
//! does, and the edge's other streams to connectors: configuration pushes and TCP streams.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, COOKIE, HOST, SERVER, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use quinn::VarInt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

use cftunnel_tunnel::h2io::{send_body, H2Io};
use cftunnel_tunnel::rpc::RpcStream;
use cftunnel_tunnel::stream::headers::{
    self, CDN_LOOP, CF_CONNECTING_IP, CF_RAY, CF_VISITOR, CONNECTION_UPGRADE, RESPONSE_HEADERS,
    X_FORWARDED_FOR, X_FORWARDED_PROTO,
};
use cftunnel_tunnel::stream::http_map::{
    decode_response_head, encode_request_head, ConnectOutcome,
};
use cftunnel_tunnel::stream::{self, ConnectionType, RPC_SIGNATURE};
use cftunnel_tunnel::{Body, BoxError, Upgraded};

use super::answer::{self, EdgeBody};
use super::{rpc, Inner, MockEdgeError, Transport, VisitorScheme};

/// How long the edge waits for a connector's response head by default:
/// Cloudflare's proxy read timeout, after which it answers 524.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(100);
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the edge waits by default to open a stream on a QUIC connection, for the
/// connector to grant one (stream credit). A connection that grants none in time is
/// treated as one on which no stream can be opened. (Over HTTP/2, h2 queues a stream
/// past the connector's limit without waiting; the response timeouts bound that wait.)
pub const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

fn no_stream_in_time() -> MockEdgeError {
    MockEdgeError::Stream("the connector granted no stream in time".into())
}

/// Opens a request stream on a QUIC connection, within `wait`.
pub(super) async fn open_quic_stream(
    conn: &quinn::Connection,
    wait: Duration,
) -> Result<(quinn::SendStream, quinn::RecvStream), MockEdgeError> {
    tokio::time::timeout(wait, conn.open_bi())
        .await
        .map_err(|_| no_stream_in_time())?
        .map_err(stream_err)
}

pub(super) fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<EdgeBody> {
    let mut r = Response::new(EdgeBody::boxed(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    ));
    *r.status_mut() = status;
    r
}

fn is_websocket<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Location (colo) code of the mock, in `Cf-Ray` and registration replies.
pub(super) const LOCATION: &str = "MCK";

/// The headers Cloudflare's edge sets on every proxied request: the
/// eyeball's address (`Cf-Connecting-Ip`, replacing any the client sent, and
/// appended to `X-Forwarded-For`), the scheme (`X-Forwarded-Proto`,
/// `Cf-Visitor`; `https` unless the mock was built for plain-HTTP eyeballs,
/// whatever its `dest` URLs say), a ray id (`Cf-Ray`) and
/// `CDN-Loop`. Headers named `Cf-Cloudflared-*` are the edge's own words to the
/// connector (over HTTP/2 they mark config pushes, control and TCP streams), so
/// an eyeball's are dropped.
pub(super) fn add_edge_headers(headers: &mut http::HeaderMap, peer: IpAddr, scheme: VisitorScheme) {
    remove_matching(headers, is_cloudflared_header);
    // Room for the six names below at once, instead of growing (and rehashing) on the way.
    headers.reserve(6);
    let ip = ip_value(peer);
    let xff = if headers.contains_key(&X_FORWARDED_FOR) {
        let mut joined = String::new();
        for prior in headers.get_all(&X_FORWARDED_FOR) {
            if let Ok(prior) = prior.to_str() {
                joined.push_str(prior);
                joined.push_str(", ");
            }
        }
        joined.push_str(ip.to_str().unwrap_or_default());
        HeaderValue::try_from(joined).ok()
    } else {
        Some(ip.clone())
    };
    headers.insert(CF_CONNECTING_IP.clone(), ip);
    if let Some(xff) = xff {
        headers.insert(X_FORWARDED_FOR.clone(), xff);
    }
    let (proto, visitor) = match scheme {
        VisitorScheme::Https => ("https", r#"{"scheme":"https"}"#),
        VisitorScheme::Http => ("http", r#"{"scheme":"http"}"#),
    };
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    headers.insert(CF_VISITOR.clone(), HeaderValue::from_static(visitor));
    headers.insert(CF_RAY.clone(), ray_id(rand::random::<u64>()));
    headers.append(CDN_LOOP.clone(), HeaderValue::from_static("cloudflare"));
}

fn is_cloudflared_header(name: &HeaderName) -> bool {
    name.as_str().starts_with("cf-cloudflared-")
}

/// An address as a header value. Loopback, the in-process edge's peer on
/// every request, is a constant; other addresses are formatted, an IPv4 one
/// that reached an IPv6 listener (`::ffff:a.b.c.d`) as IPv4.
fn ip_value(ip: IpAddr) -> HeaderValue {
    let ip = ip.to_canonical();
    if ip == IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) {
        return HeaderValue::from_static("127.0.0.1");
    }
    HeaderValue::try_from(ip.to_string()).unwrap_or(HeaderValue::from_static("127.0.0.1"))
}

/// 16 hex digits and the colo, as Cloudflare's ray ids. The number comes from the
/// thread-local generator, not the OS, so the mock spends no system call per request on it.
fn ray_id(n: u64) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 16 + 1 + LOCATION.len()];
    for (i, b) in buf[..16].iter_mut().enumerate() {
        *b = HEX[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    buf[16] = b'-';
    buf[17..].copy_from_slice(LOCATION.as_bytes());
    HeaderValue::from_bytes(&buf).unwrap_or(HeaderValue::from_static("0000000000000000-MCK"))
}

/// Sends one eyeball request through a registered connection, as the edge does.
///
/// A connection on which no stream can be opened (one that has just died, or
/// is going away) has carried nothing of the request, so the request moves on
/// to the next connection in turn, each tried at most once. The body is not
/// touched until a stream is open, so nothing of it is held back for a retry.
pub(super) async fn forward<B>(
    inner: &Inner,
    mut req: Request<B>,
    peer: IpAddr,
) -> Response<EdgeBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let websocket = is_websocket(&req);
    // Before the edge's own headers are added, so that the names an eyeball's
    // `Connection` lists never reach those.
    strip_request_headers(req.headers_mut());
    join_cookies(req.headers_mut());
    add_edge_headers(req.headers_mut(), peer, inner.visitor_scheme);
    let ray = req.headers().get(&CF_RAY).cloned();
    let mut resp = through_tunnel(inner, req, websocket).await;
    // Every answer is the edge's: its `Server` in place of the origin's, and the ray id
    // the origin saw in the request.
    let headers = resp.headers_mut();
    headers.insert(SERVER, HeaderValue::from_static("cloudflare"));
    if let Some(ray) = ray {
        headers.insert(CF_RAY.clone(), ray);
    }
    resp
}

async fn through_tunnel<B>(inner: &Inner, req: Request<B>, websocket: bool) -> Response<EdgeBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let wait = inner.response_timeout;
    let open_wait = inner.stream_open_timeout;
    let mut tried = Vec::new();
    let mut failure = None;
    while let Some((id, transport)) = inner.next_serving(&tried) {
        let result = match transport {
            Transport::Quic(conn) => match open_quic_stream(&conn, open_wait).await {
                Ok(stream) => {
                    inner.count_request(id);
                    forward_quic(stream, req, websocket, wait).await
                }
                Err(e) => {
                    tracing::debug!(conn = id, error = %e, "no request stream on this connection");
                    failure = Some(e);
                    tried.push(id);
                    continue;
                }
            },
            // `send_request` makes the same connection checks as `ready` just after it, so
            // what fails there (but for a race with the connection's task) is the request
            // itself, which no other connection would take either: it is not retried.
            Transport::H2(sr) => match sr.ready().await {
                Ok(sr) => {
                    inner.count_request(id);
                    forward_h2(sr, req, websocket, wait).await
                }
                Err(e) => {
                    tracing::debug!(conn = id, error = %e, "no request stream on this connection");
                    failure = Some(stream_err(e));
                    tried.push(id);
                    continue;
                }
            },
        };
        return result.unwrap_or_else(error_response);
    }
    match failure {
        Some(e) => error_response(e),
        // What Cloudflare answers for a tunnel with no connector: 530, error 1033.
        None => full(
            StatusCode::from_u16(530).unwrap_or(StatusCode::BAD_GATEWAY),
            "error code: 1033\n",
        ),
    }
}

fn error_response(e: MockEdgeError) -> Response<EdgeBody> {
    tracing::debug!(error = %e, "forwarding through the tunnel failed");
    match e {
        MockEdgeError::Timeout => full(
            // Cloudflare's "A timeout occurred".
            StatusCode::from_u16(524).unwrap_or(StatusCode::GATEWAY_TIMEOUT),
            "timeout waiting for the origin's response\n",
        ),
        e => full(StatusCode::BAD_GATEWAY, format!("tunnel error: {e}\n")),
    }
}

/// Whether a header is connection-specific (RFC 9110 §7.6.1): it describes
/// one hop, the eyeball's to the edge or the origin's to the connector, and
/// the edge does not pass it on as it stands.
fn is_connection_specific(name: &HeaderName) -> bool {
    CONNECTION_SPECIFIC.contains(&name.as_str())
}

/// The other header names a `Connection` header lists: they belong to that
/// hop too. The usual tokens (`keep-alive`, `close`, `Upgrade`, `TE`) are
/// matched as text and skipped, so a head that lists only those costs no
/// allocation.
fn listed_in_connection(headers: &http::HeaderMap) -> Vec<HeaderName> {
    let mut listed = Vec::new();
    for value in headers.get_all(CONNECTION) {
        let Ok(value) = value.to_str() else { continue };
        for token in value.split(',').map(str::trim) {
            if token.is_empty()
                || token.eq_ignore_ascii_case("close")
                || CONNECTION_SPECIFIC
                    .iter()
                    .any(|n| token.eq_ignore_ascii_case(n))
            {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                listed.push(name);
            }
        }
    }
    listed
}

const CONNECTION_SPECIFIC: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the eyeball's connection-specific headers from a request, for both
/// transports, as the edge does (`cloudflared` adds `Connection`, `Upgrade` and
/// `Sec-Websocket-Version` back for WebSockets because the edge strips them).
/// `TE: trailers` stays: gRPC needs it, and HTTP/2 allows it.
/// `Transfer-Encoding` stays too: over QUIC a connector reads a body only when
/// the head names one (over HTTP/2 the stream's framing carries the body, and
/// that path drops it).
fn strip_request_headers(headers: &mut http::HeaderMap) {
    if !headers.keys().any(is_connection_specific) {
        return;
    }
    for name in listed_in_connection(headers) {
        headers.remove(name);
    }
    headers.remove(CONNECTION);
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers.remove(UPGRADE);
    headers.remove(TRAILER);
    let trailers = headers.get_all(TE).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    if trailers {
        // Other codings are the eyeball's hop only; HTTP/2 forbids any but this one.
        headers.insert(TE, HeaderValue::from_static("trailers"));
    } else {
        headers.remove(TE);
    }
}

/// An HTTP/2 eyeball may split its cookies over several `cookie` fields. They are joined
/// into one with `"; "`, as RFC 9113 (8.2.3) has an intermediary do before passing them on,
/// and as Go's HTTP/2 stack joins them on the way to `cloudflared`: the origin sees one
/// `Cookie` over either transport.
fn join_cookies(headers: &mut http::HeaderMap) {
    if headers.get_all(COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined = headers
        .get_all(COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(COOKIE, value);
    }
}

/// Removes the edge's internal headers (`cf-int-*`, such as `cloudflared`'s tracing
/// answer) from a response: they are for the edge, never shown to the eyeball.
fn strip_internal_response_headers(headers: &mut http::HeaderMap) {
    remove_matching(headers, |n| n.as_str().starts_with("cf-int-"));
}

/// Removes every header whose name matches; allocates nothing when none does.
fn remove_matching(headers: &mut http::HeaderMap, matches: impl Fn(&HeaderName) -> bool) {
    if !headers.keys().any(&matches) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| matches(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Removes the connector's connection-specific headers from a response before
/// it reaches the eyeball, on both transports: an origin's `Connection: close`
/// is about the origin's connection to the connector, not the eyeball's to the
/// edge. A switched WebSocket response (`switched`) keeps `Connection` and
/// `Upgrade`, which the eyeball's upgrade handshake needs.
fn strip_response_headers(headers: &mut http::HeaderMap, switched: bool) {
    strip_internal_response_headers(headers);
    if !headers.keys().any(is_connection_specific) {
        return;
    }
    for name in listed_in_connection(headers) {
        headers.remove(name);
    }
    if !switched {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers.remove(TE);
    headers.remove(TRAILER);
    headers.remove(TRANSFER_ENCODING);
}

/// Over QUIC a connector takes a request body to follow only when the head
/// names one (`Content-Length`, or `Transfer-Encoding: chunked`; `cloudflared`
/// reads nothing otherwise; over HTTP/2 the stream itself carries the body).
/// An HTTP/1.1 eyeball's body always is named; an HTTP/2 eyeball may send one
/// without `Content-Length`, and the mock then names it chunked so that it
/// reaches the origin.
fn mark_body<B: http_body::Body>(req: &mut Request<B>) {
    if req.body().is_end_stream()
        || req.body().size_hint().exact() == Some(0)
        || req.headers().contains_key(CONTENT_LENGTH)
        || req.headers().contains_key(TRANSFER_ENCODING)
    {
        return;
    }
    req.headers_mut()
        .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
}

fn stream_err(e: impl std::fmt::Display) -> MockEdgeError {
    MockEdgeError::Stream(e.to_string())
}

/// Reads and maps the connector's `ConnectResponse`, within `wait`.
async fn read_response_head(
    recv: &mut quinn::RecvStream,
    wait: Duration,
) -> Result<ConnectOutcome, MockEdgeError> {
    let frame = tokio::time::timeout(wait, stream::read_response_frame(recv))
        .await
        .map_err(|_| MockEdgeError::Timeout)?
        .map_err(stream_err)?;
    decode_response_head(&Bytes::from(frame))
        .map_err(stream_err)?
        .map_err(stream_err)
}

/// Sends the request on an opened QUIC request stream; `websocket`: the eyeball
/// asked for an upgrade (its `Upgrade` header is stripped by now).
async fn forward_quic<B>(
    (mut send, mut recv): (quinn::SendStream, quinn::RecvStream),
    mut req: Request<B>,
    websocket: bool,
    wait: Duration,
) -> Result<Response<EdgeBody>, MockEdgeError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let on_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    mark_body(&mut req);
    let (parts, body) = req.into_parts();
    let kind = if websocket {
        ConnectionType::Websocket
    } else {
        ConnectionType::Http
    };
    let head = encode_request_head(&parts, kind);
    send.write_all(&head).await.map_err(stream_err)?;
    if !websocket {
        if body.is_end_stream() {
            // No body (a GET): the request side is finished here, without a task.
            let _ = send.finish();
        } else {
            let mut send = send;
            tokio::spawn(async move {
                let mut body = std::pin::pin!(body);
                while let Some(frame) = body.frame().await {
                    let Ok(frame) = frame else {
                        let _ = send.reset(VarInt::from_u32(0));
                        return;
                    };
                    if let Ok(data) = frame.into_data() {
                        if send.write_chunk(data).await.is_err() {
                            return;
                        }
                    }
                }
                let _ = send.finish();
            });
        }
        let (head, body) = tokio::time::timeout(wait, answer::read(recv))
            .await
            .map_err(|_| MockEdgeError::Timeout)??;
        let head = match head {
            ConnectOutcome::Head(head) => head,
            ConnectOutcome::Refused(error) => {
                return Ok(full(StatusCode::BAD_GATEWAY, format!("{error}\n")))
            }
        };
        let (mut parts, ()) = head.into_parts();
        strip_response_headers(&mut parts.headers, false);
        return Ok(Response::from_parts(parts, EdgeBody::quic(body)));
    }
    let head = match read_response_head(&mut recv, wait).await? {
        ConnectOutcome::Head(head) => head,
        ConnectOutcome::Refused(error) => {
            return Ok(full(StatusCode::BAD_GATEWAY, format!("{error}\n")))
        }
    };
    let (mut parts, ()) = head.into_parts();
    let switched = parts.status == StatusCode::SWITCHING_PROTOCOLS;
    strip_response_headers(&mut parts.headers, switched);
    if switched {
        if let Some(on_upgrade) = on_upgrade {
            tokio::spawn(pipe(on_upgrade, TunnelStream::Quic(send, recv)));
        }
        return Ok(Response::from_parts(parts, ().into_edge_body()));
    }
    Ok(Response::from_parts(
        parts,
        EdgeBody::boxed(Body::quic(recv, None).map_err(Into::into).boxed_unsync()),
    ))
}

/// Opens a TCP stream (WARP, private network) to `dest` through the next serving connection,
/// as the edge does for such traffic: over QUIC a `ConnectRequest` of type TCP, over HTTP/2 a
/// request to `dest` marked with `Cf-Cloudflared-Proxy-Src`. Returns the byte pipe once the
/// connector has acknowledged the stream; a refusal is [`MockEdgeError::Rejected`] with the
/// connector's error (QUIC) or status and `Cf-Cloudflared-Response-Meta` (HTTP/2).
pub(super) async fn open_tcp(inner: &Inner, dest: SocketAddr) -> Result<Upgraded, MockEdgeError> {
    let (id, transport) = inner
        .pick()
        .into_iter()
        .next()
        .ok_or_else(|| MockEdgeError::Stream("no serving connection".into()))?;
    let wait = inner.response_timeout;
    let pipe = match transport {
        Transport::Quic(conn) => {
            let (mut send, mut recv) = open_quic_stream(&conn, inner.stream_open_timeout).await?;
            let req = stream::ConnectRequest {
                dest: dest.to_string(),
                kind: ConnectionType::Tcp,
                metadata: vec![stream::Metadata::new("FlowID", format!("mock-{id}"))],
            };
            send.write_all(&stream::encode_connect_request(&req))
                .await
                .map_err(stream_err)?;
            let ack = tokio::time::timeout(wait, stream::read_response_preamble(&mut recv))
                .await
                .map_err(|_| MockEdgeError::Timeout)?
                .map_err(stream_err)?;
            if !ack.error.is_empty() {
                return Err(MockEdgeError::Rejected(ack.error));
            }
            Upgraded::quic(send, recv)
        }
        Transport::H2(ready) => {
            let mut ready = ready.ready().await.map_err(stream_err)?;
            let req = Request::get(format!("https://{dest}/"))
                .header(headers::PROXY_SRC, "tcp")
                .body(())
                .map_err(stream_err)?;
            let (resp, send) = ready.send_request(req, false).map_err(stream_err)?;
            let resp = tokio::time::timeout(wait, resp)
                .await
                .map_err(|_| MockEdgeError::Timeout)?
                .map_err(stream_err)?;
            if resp.status() != StatusCode::OK {
                let meta = resp.headers().get(headers::RESPONSE_META);
                let meta = meta.and_then(|v| v.to_str().ok()).unwrap_or("");
                return Err(MockEdgeError::Rejected(format!("{} {meta}", resp.status())));
            }
            Upgraded::h2(H2Io::new(resp.into_body(), send))
        }
    };
    inner.count_request(id);
    Ok(pipe)
}

/// The connector's side of an upgraded (WebSocket) stream.
enum TunnelStream {
    Quic(quinn::SendStream, quinn::RecvStream),
    H2(H2Io),
}

/// Longest wait for the eyeball to take the last bytes and the end of its connection.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Pipes an upgraded eyeball connection and the connector's stream. These pipes have no
/// half-close: once either direction ends or fails, both are torn down. What was read
/// before the end is passed on; then the eyeball's connection is closed, and the
/// connector's stream ended and no longer read. Over QUIC that is a FIN and
/// STOP_SENDING(0), or RESET_STREAM(0) after a failure, as the edge cancels a stream; over
/// HTTP/2 END_STREAM, and a reset (CANCEL) if the connector's side is still open.
async fn pipe(on_upgrade: hyper::upgrade::OnUpgrade, tunnel: TunnelStream) {
    // Without the eyeball's connection, dropping the stream tears it down.
    let Ok(eyeball) = on_upgrade.await else {
        return;
    };
    let (mut eyeball_r, mut eyeball_w) = tokio::io::split(TokioIo::new(eyeball));
    match tunnel {
        TunnelStream::Quic(mut send, mut recv) => {
            let clean = splice(&mut eyeball_r, &mut eyeball_w, &mut recv, &mut send).await;
            if clean {
                let _ = send.finish();
            } else {
                let _ = send.reset(VarInt::from_u32(0));
            }
            let _ = recv.stop(VarInt::from_u32(0));
        }
        TunnelStream::H2(io) => {
            let (mut tunnel_r, mut tunnel_w) = tokio::io::split(io);
            if splice(&mut eyeball_r, &mut eyeball_w, &mut tunnel_r, &mut tunnel_w).await {
                drop((eyeball_r, eyeball_w));
                let _ = tunnel_w.shutdown().await;
                // A reset discards what h2 still holds for the connector, the end of the
                // stream included: the connector gets a moment to end its side as well,
                // and whatever it still sends goes nowhere.
                let _ = tokio::time::timeout(
                    CLOSE_WAIT,
                    tokio::io::copy(&mut tunnel_r, &mut tokio::io::sink()),
                )
                .await;
            }
            // Dropping both halves resets the stream unless both sides have ended it.
        }
    }
}

/// Copies both ways until one direction ends (`true`) or fails (`false`), then, after a
/// clean end, shuts down the eyeball's connection. Whatever the other direction had not
/// yet passed on is dropped with it.
async fn splice<ER, EW, TR, TW>(
    eyeball_r: &mut ER,
    eyeball_w: &mut EW,
    tunnel_r: &mut TR,
    tunnel_w: &mut TW,
) -> bool
where
    ER: AsyncRead + Unpin,
    EW: AsyncWrite + Unpin,
    TR: AsyncRead + Unpin,
    TW: AsyncWrite + Unpin,
{
    let clean = tokio::select! {
        r = tokio::io::copy(eyeball_r, tunnel_w) => r.is_ok(),
        r = tokio::io::copy(tunnel_r, eyeball_w) => r.is_ok(),
    };
    if clean {
        let _ = tokio::time::timeout(CLOSE_WAIT, eyeball_w.shutdown()).await;
    }
    clean
}

/// Sends the request on an HTTP/2 connection that is ready for a new stream;
/// `websocket` as for [`forward_quic`].
async fn forward_h2<B>(
    mut ready: h2::client::SendRequest<Bytes>,
    mut req: Request<B>,
    websocket: bool,
    wait: Duration,
) -> Result<Response<EdgeBody>, MockEdgeError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let on_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // The eyeball's head becomes the HTTP/2 request in place: `:authority`
    // from its Host, and connection-specific headers already stripped.
    let authority = match parts.headers.get(HOST) {
        Some(h) => http::uri::Authority::try_from(h.as_bytes()).ok(),
        None => parts.uri.authority().cloned(),
    };
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(http::uri::Scheme::HTTPS);
    uri.authority = authority;
    uri.path_and_query = Some(
        parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    parts.uri = http::Uri::from_parts(uri).map_err(stream_err)?;
    parts.headers.remove(HOST);
    // The body's length is the stream's framing here.
    parts.headers.remove(TRANSFER_ENCODING);
    if websocket {
        parts
            .headers
            .insert(CONNECTION_UPGRADE, HeaderValue::from_static("websocket"));
    }
    parts.extensions = http::Extensions::new();
    let h2req = Request::from_parts(parts, ());
    let end = !websocket && http_body::Body::is_end_stream(&body);
    let (resp, mut send) = ready.send_request(h2req, end).map_err(stream_err)?;
    if !websocket && !end {
        tokio::spawn(async move {
            if send_body(&mut send, body, None).await.is_err() {
                send.send_reset(h2::Reason::CANCEL);
            }
        });
        let resp = tokio::time::timeout(wait, resp)
            .await
            .map_err(|_| MockEdgeError::Timeout)?
            .map_err(stream_err)?;
        return map_h2_response(resp, false);
    }
    let resp = tokio::time::timeout(wait, resp)
        .await
        .map_err(|_| MockEdgeError::Timeout)?
        .map_err(stream_err)?;
    if websocket && resp.status() == StatusCode::OK {
        let (rparts, recv) = resp.into_parts();
        let out = map_h2_response(Response::from_parts(rparts, ()), true)?;
        if out.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(on_upgrade) = on_upgrade {
                tokio::spawn(pipe(on_upgrade, TunnelStream::H2(H2Io::new(recv, send))));
            }
            return Ok(out);
        }
        let _ = send.send_data(Bytes::new(), true);
        let (parts, _empty) = out.into_parts();
        return Ok(Response::from_parts(parts, recv.into_edge_body()));
    }
    map_h2_response(resp, false)
}

/// A response the connector made itself over HTTP/2 (marked `{"src":"cloudflared"}`: it
/// could not reach the origin or serve the stream) is the edge's to answer, as an error
/// `ConnectResponse` is over QUIC: a 502 of the edge's own, with a body saying where it
/// came from, rather than the connector's empty one.
fn connector_failure<T>(resp: &Response<T>) -> Option<Response<EdgeBody>> {
    let meta = resp.headers().get(headers::RESPONSE_META)?;
    (meta == headers::META_CONNECTOR).then(|| {
        full(
            StatusCode::BAD_GATEWAY,
            format!(
                "the connector answered {} {}\n",
                resp.status(),
                headers::META_CONNECTOR
            ),
        )
    })
}

/// The eyeball's response from a connector's HTTP/2 response: the origin's
/// headers from their serialised form, without connection-specific ones.
/// HTTP/2 has no 101: the connector answers an accepted WebSocket upgrade
/// (`websocket`) with 200 and the origin's `Upgrade` among the serialised
/// headers, which becomes the eyeball's 101. Any other 200 is the origin
/// turning the upgrade down, and `cloudflared` writes that answer as it came.
/// A response the connector made itself (never a 200) becomes the edge's 502.
fn map_h2_response<T: IntoEdgeBody>(
    resp: Response<T>,
    websocket: bool,
) -> Result<Response<EdgeBody>, MockEdgeError> {
    if let Some(answer) = connector_failure(&resp) {
        return Ok(answer);
    }
    let (mut parts, body) = resp.into_parts();
    let mut headers = http::HeaderMap::new();
    match parts
        .headers
        .get(RESPONSE_HEADERS)
        .and_then(|v| v.to_str().ok())
    {
        Some(serialised) => {
            for (n, v) in headers::deserialise(serialised).map_err(stream_err)? {
                headers.append(n, v);
            }
        }
        None => {
            for (n, v) in &parts.headers {
                if !n.as_str().starts_with("cf-cloudflared-") {
                    headers.append(n.clone(), v.clone());
                }
            }
        }
    }
    if let Some(cl) = parts.headers.get(CONTENT_LENGTH) {
        headers.insert(CONTENT_LENGTH, cl.clone());
    }
    let switched = websocket && parts.status == StatusCode::OK && headers.contains_key(UPGRADE);
    if switched {
        parts.status = StatusCode::SWITCHING_PROTOCOLS;
    }
    strip_response_headers(&mut headers, switched);
    parts.headers = headers;
    Ok(Response::from_parts(parts, body.into_edge_body()))
}

trait IntoEdgeBody {
    fn into_edge_body(self) -> EdgeBody;
}

impl IntoEdgeBody for () {
    fn into_edge_body(self) -> EdgeBody {
        EdgeBody::boxed(
            Full::new(Bytes::new())
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
    }
}

impl IntoEdgeBody for h2::RecvStream {
    fn into_edge_body(self) -> EdgeBody {
        EdgeBody::boxed(Body::h2(self).map_err(Into::into).boxed_unsync())
    }
}

/// Pushes a configuration over one connection: at most the time to open a stream and
/// the RPC's own timeout.
pub(super) async fn push_config(
    inner: &Inner,
    transport: Transport,
    version: i32,
    config: Vec<u8>,
) -> Result<i32, MockEdgeError> {
    let limit = inner.stream_open_timeout + RPC_TIMEOUT;
    tokio::time::timeout(
        limit,
        push_config_unbounded(inner, transport, version, config),
    )
    .await
    .map_err(|_| MockEdgeError::Timeout)?
}

async fn push_config_unbounded(
    inner: &Inner,
    transport: Transport,
    version: i32,
    config: Vec<u8>,
) -> Result<i32, MockEdgeError> {
    match transport {
        Transport::Quic(conn) => {
            let (mut send, recv) = open_quic_stream(&conn, inner.stream_open_timeout).await?;
            send.write_all(&RPC_SIGNATURE).await.map_err(stream_err)?;
            let (latest, err) = rpc::push_config(
                &inner.worker,
                RpcStream {
                    reader: recv,
                    writer: send,
                },
                version,
                config,
                RPC_TIMEOUT,
            )
            .await?;
            if err.is_empty() {
                Ok(latest)
            } else {
                Err(MockEdgeError::Rejected(err))
            }
        }
        Transport::H2(sr) => {
            // The document goes out byte for byte, as over QUIC: one that is not JSON
            // (a negative test) is the connector's to refuse.
            let mut body = format!(r#"{{"version":{version},"config":"#).into_bytes();
            body.extend_from_slice(&config);
            body.push(b'}');
            let resp = h2_config_push(sr, body, true).await?;
            if resp.status() != StatusCode::OK {
                return Err(MockEdgeError::Rejected(format!(
                    "configuration push answered {}",
                    resp.status()
                )));
            }
            config_reply(resp.body())
        }
    }
}

/// Reads a connector's answer to an HTTP/2 configuration push: the applied version,
/// or the rejection. `cloudflared` encodes a Go `error` as `err`: `null`, or an
/// object (`{}`) that carries no text.
fn config_reply(bytes: &[u8]) -> Result<i32, MockEdgeError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Reply {
        last_applied_version: i32,
        #[serde(default)]
        err: serde_json::Value,
    }
    let reply: Reply = serde_json::from_slice(bytes).map_err(stream_err)?;
    match reply.err {
        serde_json::Value::Null => Ok(reply.last_applied_version),
        serde_json::Value::String(e) if e.is_empty() => Ok(reply.last_applied_version),
        serde_json::Value::String(e) => Err(MockEdgeError::Rejected(e)),
        other => Err(MockEdgeError::Rejected(format!(
            "configuration rejected ({other}); version {} stays applied",
            reply.last_applied_version
        ))),
    }
}

/// Sends `body` as an HTTP/2 configuration push and returns the connector's
/// answer with its body.
/// `finished`: the body ends with `body`; otherwise `body` is sent and the stream is held
/// open (a push whose document never completes) until the answer comes.
pub(super) async fn h2_config_push(
    sr: h2::client::SendRequest<Bytes>,
    body: Vec<u8>,
    finished: bool,
) -> Result<http::Response<Bytes>, MockEdgeError> {
    let mut req = Request::builder()
        .method(http::Method::PUT)
        .uri("https://h2.cftunnel.com/config")
        .header(CONNECTION_UPGRADE, "update-configuration");
    if finished {
        req = req.header(CONTENT_LENGTH, body.len());
    }
    let req = req.body(()).map_err(stream_err)?;
    let mut ready = sr.ready().await.map_err(stream_err)?;
    let (resp, mut send) = ready.send_request(req, false).map_err(stream_err)?;
    send.send_data(Bytes::from(body), finished)
        .map_err(stream_err)?;
    let resp = tokio::time::timeout(RPC_TIMEOUT, resp)
        .await
        .map_err(stream_err)?
        .map_err(stream_err)?;
    drop(send);
    let (parts, recv) = resp.into_parts();
    let bytes = tokio::time::timeout(RPC_TIMEOUT, Body::h2(recv).collect())
        .await
        .map_err(stream_err)?
        .map_err(stream_err)?
        .to_bytes();
    Ok(http::Response::from_parts(parts, bytes))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;
    use crate::connector::{options, token};
    use crate::wait::wait_until;

    #[test]
    fn config_replies_are_read_as_cloudflared_writes_them() {
        assert_eq!(
            config_reply(br#"{"lastAppliedVersion":3,"err":null}"#).unwrap(),
            3
        );
        assert_eq!(config_reply(br#"{"lastAppliedVersion":4}"#).unwrap(), 4);
        assert!(matches!(
            config_reply(br#"{"lastAppliedVersion":3,"err":{}}"#),
            Err(MockEdgeError::Rejected(e)) if e.contains("version 3")
        ));
        assert!(matches!(
            config_reply(br#"{"lastAppliedVersion":3,"err":"bad ingress"}"#),
            Err(MockEdgeError::Rejected(e)) if e == "bad ingress"
        ));
        assert!(config_reply(br#"{"src":"cloudflared"}"#).is_err());
    }

    #[test]
    fn eyeball_cloudflared_headers_are_dropped() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "cf-cloudflared-proxy-connection-upgrade",
            HeaderValue::from_static("update-configuration"),
        );
        h.insert("cf-cloudflared-proxy-src", HeaderValue::from_static("x"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        add_edge_headers(&mut h, "127.0.0.1".parse().unwrap(), VisitorScheme::Https);
        assert!(
            h.keys().all(|n| !n.as_str().starts_with("cf-cloudflared-")),
            "{h:?}"
        );
        assert_eq!(h["x-app"], "kept");
    }

    fn header_map(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn requests_lose_the_eyeballs_connection_specific_headers() {
        let eyeball = [
            ("connection", "keep-alive, X-Hop"),
            ("connection", "TE"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "x"),
            ("upgrade", "h2c"),
            ("trailer", "x-sum"),
            ("te", "trailers, deflate"),
            ("transfer-encoding", "chunked"),
            ("x-app", "kept"),
        ];
        let mut h = header_map(&eyeball);
        strip_request_headers(&mut h);
        let mut names: Vec<&str> = h.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "transfer-encoding", "x-app"]);
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["transfer-encoding"], "chunked");

        let mut h = header_map(&[("te", "gzip"), ("x-app", "kept")]);
        strip_request_headers(&mut h);
        assert!(!h.contains_key("te"), "{h:?}");
    }

    #[test]
    fn responses_lose_the_origins_connection_specific_headers() {
        let origin = [
            ("connection", "close, X-Hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=1"),
            ("proxy-connection", "x"),
            ("transfer-encoding", "chunked"),
            ("trailer", "grpc-status"),
            ("upgrade", "websocket"),
            ("content-length", "7"),
        ];
        let mut h = header_map(&origin);
        strip_response_headers(&mut h, false);
        assert_eq!(
            h.keys().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["content-length"]
        );

        let mut h = header_map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("keep-alive", "timeout=1"),
            ("sec-websocket-accept", "dGVzdA=="),
        ]);
        strip_response_headers(&mut h, true);
        assert_eq!(h["connection"], "Upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["sec-websocket-accept"], "dGVzdA==");
        assert!(!h.contains_key("keep-alive"), "{h:?}");
    }

    /// `cloudflared` serialises an origin's `Keep-Alive`, `Connection` and the names
    /// `Connection` lists into its HTTP/2 answer (only `cf-*` names are left out);
    /// the eyeball gets none of them.
    #[test]
    fn http2_answers_lose_the_origins_connection_specific_headers() {
        use base64::engine::general_purpose::STANDARD_NO_PAD;
        use base64::Engine as _;
        let serialised = [
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "1"),
            ("Keep-Alive", "timeout=1"),
            ("Content-Type", "text/plain"),
        ]
        .iter()
        .map(|(n, v)| {
            format!(
                "{}:{}",
                STANDARD_NO_PAD.encode(n),
                STANDARD_NO_PAD.encode(v)
            )
        })
        .collect::<Vec<_>>()
        .join(";");
        let resp = Response::builder()
            .header(RESPONSE_HEADERS, serialised)
            .body(())
            .unwrap();
        let out = map_h2_response(resp, false).unwrap();
        assert_eq!(
            out.headers().keys().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["content-type"]
        );
    }

    /// Kills connection `id` and, once the mock has taken it out, lists it again as
    /// serving: the moment between a connection's death and the edge noticing it,
    /// held still. Returns the dead entry's id.
    async fn relist_dead_connection(edge: &super::super::MockEdge, id: u64) -> u64 {
        let inner = &edge.inner;
        let (transport, protocol) = inner
            .with_state(|s| {
                let c = &s.conns[&id];
                c.close.cancel();
                (c.transport.clone(), c.info.protocol)
            })
            .unwrap();
        wait_until(|| edge.connections().iter().all(|c| c.id != id)).await;
        match &transport {
            Transport::Quic(conn) => assert!(conn.close_reason().is_some()),
            Transport::H2(sr) => {
                while sr.clone().ready().await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        let (dead, _close) = inner.add_connection(transport, protocol, None);
        inner.with_state(|s| {
            if let Some(c) = s.conns.get_mut(&dead) {
                c.info.registered = true;
            }
        });
        dead
    }

    /// A request whose first connection can no longer open a stream goes through the
    /// next one, and is counted there only.
    async fn requests_move_past_a_dead_connection(protocol: cftunnel_tunnel::Protocol) {
        let edge = super::super::MockEdge::start().await.unwrap();
        let opts = cftunnel_tunnel::ConnectorOptions {
            grace_period: Duration::from_secs(1),
            ..options(&edge, protocol, 2)
        };
        let service = hyper::service::service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
        let handle = cftunnel_tunnel::Connector::new(token(), opts)
            .unwrap()
            .start(service, metrics)
            .unwrap();
        handle.wait_registered(2).await;
        edge.wait_serving(2).await;

        let victim = edge.connections()[0].id;
        let dead = relist_dead_connection(&edge, victim).await;
        // The dead entry, the surviving connection and the connector's replacement.
        edge.wait_serving(3).await;
        // Taken in turn, each of the three is first for one of three requests.
        for _ in 0..3 {
            let req = Request::get("/")
                .header("host", "app.example.com")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            let resp = edge.request(req).await;
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&body);
            assert_eq!((status, &*body), (StatusCode::OK, "ok"), "{protocol:?}");
        }
        let conns = edge.connections();
        let on_dead = conns.iter().find(|c| c.id == dead).map(|c| c.requests);
        assert_eq!(on_dead, Some(0), "{conns:?}");
        assert_eq!(
            conns.iter().map(|c| c.requests).sum::<u64>(),
            3,
            "{conns:?}"
        );
        handle.shutdown().await;
        edge.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quic_requests_move_past_a_dead_connection() {
        tokio::time::timeout(
            Duration::from_secs(30),
            requests_move_past_a_dead_connection(cftunnel_tunnel::Protocol::Quic),
        )
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http2_requests_move_past_a_dead_connection() {
        tokio::time::timeout(
            Duration::from_secs(30),
            requests_move_past_a_dead_connection(cftunnel_tunnel::Protocol::Http2),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn the_connectors_own_http2_failures_become_the_edges_502() {
        let marked = |status: StatusCode, meta: &'static str| {
            Response::builder()
                .status(status)
                .header(headers::RESPONSE_META, meta)
                .header(CONTENT_LENGTH, 0)
                .body(())
                .unwrap()
        };
        let answer =
            connector_failure(&marked(StatusCode::BAD_REQUEST, headers::META_CONNECTOR)).unwrap();
        assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            &b"the connector answered 400 Bad Request {\"src\":\"cloudflared\"}\n"[..]
        );
        // The origin's own 502 passes through as it came.
        assert!(
            connector_failure(&marked(StatusCode::BAD_GATEWAY, headers::META_ORIGIN)).is_none()
        );
        assert!(connector_failure(&Response::new(())).is_none());
    }

    #[test]
    fn split_cookies_are_joined_and_internal_answers_dropped() {
        let mut h = http::HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1"));
        h.append(COOKIE, HeaderValue::from_static("b=2"));
        h.append(COOKIE, HeaderValue::from_static("c=3"));
        join_cookies(&mut h);
        assert_eq!(
            h.get_all(COOKIE).iter().collect::<Vec<_>>(),
            ["a=1; b=2; c=3"]
        );
        let mut one = http::HeaderMap::new();
        one.append(COOKIE, HeaderValue::from_static("a=1; b=2"));
        join_cookies(&mut one);
        assert_eq!(one[COOKIE], "a=1; b=2");

        let mut r = http::HeaderMap::new();
        r.insert("cf-int-cloudflared-tracing", HeaderValue::from_static("x"));
        r.insert("content-type", HeaderValue::from_static("text/plain"));
        strip_response_headers(&mut r, false);
        assert_eq!(r.len(), 1);
        assert_eq!(r["content-type"], "text/plain");
    }

    #[test]
    fn edge_headers_replace_the_client_ip_and_extend_forwarding() {
        let mut h = http::HeaderMap::new();
        h.insert("cf-connecting-ip", HeaderValue::from_static("10.9.9.9"));
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.2"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
        add_edge_headers(&mut h, "127.0.0.1".parse().unwrap(), VisitorScheme::Https);
        assert_eq!(h["cf-connecting-ip"], "127.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "192.0.2.1, 192.0.2.2, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["cf-visitor"], r#"{"scheme":"https"}"#);
        assert_eq!(h["cdn-loop"], "cloudflare");
        let ray = h["cf-ray"].to_str().unwrap();
        assert_eq!(ray.len(), 20, "{ray}");
        assert!(ray.ends_with("-MCK"), "{ray}");
        assert_eq!(ray_id(0x0123_4567_89ab_cdef), "0123456789abcdef-MCK");

        let mut h = http::HeaderMap::new();
        add_edge_headers(&mut h, "::1".parse().unwrap(), VisitorScheme::Https);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["cf-connecting-ip"], "::1");

        // An IPv4 eyeball on a dual-stack listener.
        let mut h = http::HeaderMap::new();
        add_edge_headers(
            &mut h,
            "::ffff:192.0.2.7".parse().unwrap(),
            VisitorScheme::Https,
        );
        assert_eq!(h["cf-connecting-ip"], "192.0.2.7");
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");

        // An eyeball of a zone that serves plain HTTP: the edge's word replaces the client's.
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        add_edge_headers(&mut h, "127.0.0.1".parse().unwrap(), VisitorScheme::Http);
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["cf-visitor"], r#"{"scheme":"http"}"#);
    }
}
