//! The mock's plain-HTTP listener: eyeball requests forwarded through
//! registered connector connections, as the edge does.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use quinn::VarInt;

use super::{Inner, MockEdgeError, Transport};
use crate::body::{Body, BoxError, Upgraded};
use crate::h2io::{send_body, H2Io};
use crate::rpc::edge;
use crate::rpc::RpcStream;
use crate::stream::headers::{
    self, CDN_LOOP, CF_CONNECTING_IP, CF_RAY, CF_VISITOR, CONNECTION_UPGRADE, RESPONSE_HEADERS,
    X_FORWARDED_FOR, X_FORWARDED_PROTO,
};
use crate::stream::http_map::{decode_response_head, encode_request_head, ConnectOutcome};
use crate::stream::{self, ConnectionType, RPC_SIGNATURE};

pub(crate) type EdgeBody = UnsyncBoxBody<Bytes, BoxError>;

/// How long the edge waits for a connector's response head by default:
/// Cloudflare's proxy read timeout, after which it answers 524.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(100);
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<EdgeBody> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r
}

pub(super) fn spawn_http(inner: &Arc<Inner>, listener: tokio::net::TcpListener) {
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = inner2.cancel.cancelled() => return,
            };
            let Ok((tcp, peer)) = accepted else { continue };
            let _ = tcp.set_nodelay(true);
            let inner3 = inner2.clone();
            let cancel = inner2.cancel.clone();
            inner2.tasks.spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let inner = inner3.clone();
                    async move { Ok::<_, Infallible>(handle(inner, req, peer.ip()).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
                tokio::select! {
                    res = conn => {
                        if let Err(e) = res {
                            tracing::debug!(error = %e, "mock edge eyeball connection ended");
                        }
                    }
                    _ = cancel.cancelled() => {}
                }
            });
        }
    });
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
/// `Cf-Visitor`; the mock stands for an HTTPS edge, as its `dest` URLs
/// say), a ray id (`Cf-Ray`) and
/// `CDN-Loop`. Headers named `Cf-Cloudflared-*` are the edge's own words to the
/// connector (over HTTP/2 they mark config pushes, control and TCP streams), so
/// an eyeball's are dropped.
pub(super) fn add_edge_headers(headers: &mut http::HeaderMap, peer: IpAddr) {
    if headers.keys().any(is_cloudflared_header) {
        let internal: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_cloudflared_header(n))
            .cloned()
            .collect();
        for name in internal {
            headers.remove(name);
        }
    }
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
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("https"));
    headers.insert(
        CF_VISITOR.clone(),
        HeaderValue::from_static(r#"{"scheme":"https"}"#),
    );
    headers.insert(CF_RAY.clone(), ray_id(rand::random::<u64>()));
    headers.append(CDN_LOOP.clone(), HeaderValue::from_static("cloudflare"));
}

fn is_cloudflared_header(name: &HeaderName) -> bool {
    name.as_str().starts_with("cf-cloudflared-")
}

/// An address as a header value. Loopback, the in-process edge's peer on
/// every request, is a constant; other addresses are formatted.
fn ip_value(ip: IpAddr) -> HeaderValue {
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

async fn handle(inner: Arc<Inner>, req: Request<Incoming>, peer: IpAddr) -> Response<EdgeBody> {
    if req.uri().path().starts_with(super::admin::PREFIX) {
        return super::admin::handle(&inner, req).await;
    }
    forward(&inner, req, peer).await
}

/// Sends one eyeball request through a registered connection, as the edge does.
pub(super) async fn forward<B>(
    inner: &Inner,
    mut req: Request<B>,
    peer: IpAddr,
) -> Response<EdgeBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    add_edge_headers(req.headers_mut(), peer);
    mark_body(&mut req);
    let candidates = inner.pick();
    let Some((id, transport)) = candidates.into_iter().next() else {
        // What Cloudflare answers for a tunnel with no connector: 530, error 1033.
        let status = StatusCode::from_u16(530).unwrap_or(StatusCode::BAD_GATEWAY);
        return full(status, "error code: 1033\n");
    };
    inner.count_request(id);
    let wait = inner.response_timeout;
    let result = match transport {
        Transport::Quic(conn) => forward_quic(conn, req, wait).await,
        Transport::H2(sr) => forward_h2(sr, req, wait).await,
    };
    result.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "forwarding through the tunnel failed");
        match e {
            MockEdgeError::Timeout => full(
                // Cloudflare's "A timeout occurred".
                StatusCode::from_u16(524).unwrap_or(StatusCode::GATEWAY_TIMEOUT),
                "timeout waiting for the origin's response\n",
            ),
            e => full(StatusCode::BAD_GATEWAY, format!("tunnel error: {e}\n")),
        }
    })
}

/// A connector takes a request body to follow only when the head names one
/// (`Content-Length`, or `Transfer-Encoding: chunked`; `cloudflared` over QUIC
/// reads nothing otherwise). An HTTP/1.1 eyeball's body always is named; an
/// HTTP/2 eyeball may send one without `Content-Length`, and the mock then
/// names it chunked so that it reaches the origin.
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

async fn forward_quic<B>(
    conn: quinn::Connection,
    mut req: Request<B>,
    wait: Duration,
) -> Result<Response<EdgeBody>, MockEdgeError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let websocket = is_websocket(&req);
    let on_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let kind = if websocket {
        ConnectionType::Websocket
    } else {
        ConnectionType::Http
    };
    let head = encode_request_head(&parts, kind);
    let (mut send, mut recv) = conn.open_bi().await.map_err(stream_err)?;
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
        let head = match read_response_head(&mut recv, wait).await? {
            ConnectOutcome::Head(head) => head,
            ConnectOutcome::Refused(error) => {
                return Ok(full(StatusCode::BAD_GATEWAY, format!("{error}\n")))
            }
        };
        let (parts, ()) = head.into_parts();
        return Ok(Response::from_parts(
            parts,
            Body::quic(recv, None).map_err(Into::into).boxed_unsync(),
        ));
    }
    let head = match read_response_head(&mut recv, wait).await? {
        ConnectOutcome::Head(head) => head,
        ConnectOutcome::Refused(error) => {
            return Ok(full(StatusCode::BAD_GATEWAY, format!("{error}\n")))
        }
    };
    let (parts, ()) = head.into_parts();
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(on_upgrade) = on_upgrade {
            tokio::spawn(pipe(on_upgrade, Upgraded::quic(send, recv)));
        }
        return Ok(Response::from_parts(
            parts,
            Full::new(Bytes::new())
                .map_err(|e| match e {})
                .boxed_unsync(),
        ));
    }
    Ok(Response::from_parts(
        parts,
        Body::quic(recv, None).map_err(Into::into).boxed_unsync(),
    ))
}

async fn pipe(on_upgrade: hyper::upgrade::OnUpgrade, mut tunnel: Upgraded) {
    let Ok(eyeball) = on_upgrade.await else {
        return;
    };
    let mut eyeball = TokioIo::new(eyeball);
    let _ = tokio::io::copy_bidirectional(&mut eyeball, &mut tunnel).await;
}

fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

async fn forward_h2<B>(
    sr: h2::client::SendRequest<Bytes>,
    mut req: Request<B>,
    wait: Duration,
) -> Result<Response<EdgeBody>, MockEdgeError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let websocket = is_websocket(&req);
    let on_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // The eyeball's head becomes the HTTP/2 request in place: `:authority`
    // from its Host, no connection-specific headers.
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
    if parts.headers.keys().any(is_hop_by_hop) {
        let hop: Vec<HeaderName> = parts
            .headers
            .keys()
            .filter(|n| is_hop_by_hop(n))
            .cloned()
            .collect();
        for name in hop {
            parts.headers.remove(name);
        }
    }
    if websocket {
        parts
            .headers
            .insert(CONNECTION_UPGRADE, HeaderValue::from_static("websocket"));
    }
    parts.extensions = http::Extensions::new();
    let h2req = Request::from_parts(parts, ());
    let end = !websocket && http_body::Body::is_end_stream(&body);
    let mut ready = sr.ready().await.map_err(stream_err)?;
    let (resp, mut send) = ready.send_request(h2req, end).map_err(stream_err)?;
    if !websocket && !end {
        tokio::spawn(async move {
            if send_body(&mut send, body).await.is_err() {
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
        // HTTP/2 has no 101: the connector answers an accepted upgrade with 200 and the
        // origin's `Upgrade` among the serialised headers. Any other 200 is the origin
        // turning the upgrade down, and `cloudflared` writes that answer as it came.
        let (rparts, recv) = resp.into_parts();
        let mut out = map_h2_response(Response::from_parts(rparts, ()), true)?;
        if out.headers().contains_key(UPGRADE) {
            *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            if let Some(on_upgrade) = on_upgrade {
                tokio::spawn(pipe(on_upgrade, Upgraded::h2(H2Io::new(recv, send))));
            }
            return Ok(out);
        }
        let _ = send.send_data(Bytes::new(), true);
        out.headers_mut().remove(http::header::CONNECTION);
        let (parts, _empty) = out.into_parts();
        return Ok(Response::from_parts(parts, recv.into_edge_body()));
    }
    map_h2_response(resp, false)
}

fn map_h2_response<T: IntoEdgeBody>(
    resp: Response<T>,
    websocket: bool,
) -> Result<Response<EdgeBody>, MockEdgeError> {
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
    if !websocket {
        headers.remove(http::header::CONNECTION);
        headers.remove(UPGRADE);
    }
    parts.headers = headers;
    Ok(Response::from_parts(parts, body.into_edge_body()))
}

trait IntoEdgeBody {
    fn into_edge_body(self) -> EdgeBody;
}

impl IntoEdgeBody for () {
    fn into_edge_body(self) -> EdgeBody {
        Full::new(Bytes::new())
            .map_err(|e| match e {})
            .boxed_unsync()
    }
}

impl IntoEdgeBody for h2::RecvStream {
    fn into_edge_body(self) -> EdgeBody {
        Body::h2(self).map_err(Into::into).boxed_unsync()
    }
}

/// Pushes a configuration over one connection.
pub(super) async fn push_config(
    inner: &Inner,
    transport: Transport,
    version: i32,
    config: Vec<u8>,
) -> Result<i32, MockEdgeError> {
    match transport {
        Transport::Quic(conn) => {
            let (mut send, recv) = conn.open_bi().await.map_err(stream_err)?;
            send.write_all(&RPC_SIGNATURE).await.map_err(stream_err)?;
            let (latest, err) = edge::push_config(
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
            let config: serde_json::Value = serde_json::from_slice(&config)
                .map_err(|e| MockEdgeError::Rejected(e.to_string()))?;
            let body = serde_json::json!({ "version": version, "config": config }).to_string();
            let resp = h2_config_push(sr, body.into_bytes()).await?;
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
pub(super) async fn h2_config_push(
    sr: h2::client::SendRequest<Bytes>,
    body: Vec<u8>,
) -> Result<http::Response<Bytes>, MockEdgeError> {
    let req = Request::builder()
        .method(http::Method::PUT)
        .uri("https://h2.cftunnel.com/config")
        .header(CONNECTION_UPGRADE, "update-configuration")
        .header(CONTENT_LENGTH, body.len())
        .body(())
        .map_err(stream_err)?;
    let mut ready = sr.ready().await.map_err(stream_err)?;
    let (resp, mut send) = ready.send_request(req, false).map_err(stream_err)?;
    send.send_data(Bytes::from(body), true)
        .map_err(stream_err)?;
    let resp = tokio::time::timeout(RPC_TIMEOUT, resp)
        .await
        .map_err(stream_err)?
        .map_err(stream_err)?;
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
    use super::*;

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
        add_edge_headers(&mut h, "127.0.0.1".parse().unwrap());
        assert!(
            h.keys().all(|n| !n.as_str().starts_with("cf-cloudflared-")),
            "{h:?}"
        );
        assert_eq!(h["x-app"], "kept");
    }

    #[test]
    fn edge_headers_replace_the_client_ip_and_extend_forwarding() {
        let mut h = http::HeaderMap::new();
        h.insert("cf-connecting-ip", HeaderValue::from_static("10.9.9.9"));
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.2"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
        add_edge_headers(&mut h, "127.0.0.1".parse().unwrap());
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
        add_edge_headers(&mut h, "::1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["cf-connecting-ip"], "::1");
    }
}
