//! The conformance client: one fresh connection per request (the Go suite disables
//! keep-alives), HTTP/1.1, HTTP/2 with prior knowledge, or a WebSocket exchange.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use super::case::WsFrame;

/// Per-request client timeout (Go suite: 10 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_LIMIT: usize = 1 << 20;

/// What the client saw.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header name (lower-case) to its values in order.
    pub headers: BTreeMap<String, Vec<String>>,
    /// The echo JSON, when the response was one (`Content-Type: application/json`).
    pub echo: Option<Echo>,
}

impl Response {
    pub fn header_joined(&self, name: &str) -> Option<String> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(|v| v.join(","))
    }
}

/// The fields of echo-basic's JSON the comparison reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Echo {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub method: String,
    #[serde(default)]
    pub headers: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
}

/// A request as sent on the wire.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub addr: SocketAddr,
    pub h2c: bool,
    pub method: String,
    pub host: String,
    /// Request-target: path and query, sent as is.
    pub path: String,
    pub headers: Vec<(String, String)>,
}

pub async fn send(req: &Outgoing) -> anyhow::Result<Response> {
    tokio::time::timeout(REQUEST_TIMEOUT, send_inner(req))
        .await
        .context("client timeout")?
}

async fn send_inner(req: &Outgoing) -> anyhow::Result<Response> {
    let stream = TcpStream::connect(req.addr).await.context("connect")?;
    stream.set_nodelay(true)?;
    let io = TokioIo::new(stream);
    let uri = if req.h2c {
        format!("http://{}{}", req.host, req.path)
    } else {
        req.path.clone()
    };
    let mut builder = hyper::Request::builder()
        .method(req.method.as_str())
        .uri(uri.as_str());
    if !req.h2c {
        builder = builder.header(hyper::header::HOST, req.host.as_str());
        builder = builder.header(hyper::header::CONNECTION, "close");
    }
    for (name, value) in &req.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    let response = if req.h2c {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .context("h2c handshake")?;
        tokio::spawn(conn);
        sender.send_request(request).await.context("h2c request")?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .context("http/1.1 handshake")?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .context("http/1.1 request")?
    };
    let status = response.status().as_u16();
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in response.headers() {
        headers
            .entry(name.as_str().to_owned())
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    let json = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/json");
    let body = Limited::new(response.into_body(), BODY_LIMIT)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the body: {e}"))?
        .to_bytes();
    let echo = if json {
        Some(serde_json::from_slice(&body).context("echo JSON")?)
    } else {
        None
    };
    Ok(Response {
        status,
        headers,
        echo,
    })
}

/// Dials `ws://<gateway><path>` with the row's Host and headers and plays the frames in order;
/// the handshake must answer 101 and every frame's payload must come back identical. As with
/// Go's `x/net/websocket` `Message.Receive`, the echo is the next data frame whatever its kind:
/// a text frame echoed as binary, or the reverse, passes.
pub async fn websocket(req: &Outgoing, frames: &[WsFrame]) -> anyhow::Result<()> {
    if frames.is_empty() {
        bail!("the WebSocket row has no frame to exchange");
    }
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let stream = TcpStream::connect(req.addr).await.context("connect")?;
        let mut request = hyper::Request::builder()
            .method(req.method.as_str())
            .uri(format!("ws://{}{}", req.addr, req.path))
            .header("Host", req.host.as_str())
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header(
                "Sec-WebSocket-Key",
                tokio_tungstenite::tungstenite::handshake::client::generate_key(),
            );
        for (name, value) in &req.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request.body(()).context("building the handshake")?;
        let (mut ws, response) = tokio_tungstenite::client_async(request, stream)
            .await
            .context("websocket handshake")?;
        if response.status().as_u16() != 101 {
            bail!("handshake answered {}", response.status());
        }
        for (i, frame) in frames.iter().enumerate() {
            let (send, want) = ws_frame(frame).with_context(|| format!("frame {i}"))?;
            ws.send(send).await.context("sending a frame")?;
            let got = loop {
                match ws.next().await {
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(m)) => break echoed_payload(m)?,
                    Some(Err(e)) => bail!("reading a frame: {e}"),
                    None => bail!("connection closed before the echo"),
                }
            };
            if got != want {
                bail!("echoed {got:?}, expected {want:?}");
            }
        }
        let _ = ws.close(None).await;
        Ok(())
    })
    .await
    .context("websocket timeout")?
}

/// The message a frame sends and the payload it expects back: exactly one of a text or a
/// binary payload, with the expectation of the same kind.
pub fn ws_frame(frame: &WsFrame) -> anyhow::Result<(Message, Vec<u8>)> {
    match frame {
        WsFrame {
            send_text: Some(t),
            expect_text: Some(e),
            send_binary: None,
            expect_binary: None,
        } => Ok((Message::text(t.clone()), e.clone().into_bytes())),
        WsFrame {
            send_text: None,
            expect_text: None,
            send_binary: Some(b),
            expect_binary: Some(e),
        } => Ok((Message::binary(b.clone()), e.clone())),
        other => bail!(
            "a frame needs send_text with expect_text, or send_binary with expect_binary: {other:?}"
        ),
    }
}

/// The payload of a received data message, text or binary alike; a close ends the exchange.
fn echoed_payload(message: Message) -> anyhow::Result<Vec<u8>> {
    match message {
        Message::Text(t) => Ok(t.as_bytes().to_vec()),
        Message::Binary(b) => Ok(b.to_vec()),
        Message::Close(c) => bail!("connection closed before the echo: {c:?}"),
        other => bail!("unexpected message {other:?}"),
    }
}

#[test]
fn an_echo_is_compared_by_payload_whatever_its_frame_kind() {
    let text = WsFrame {
        send_text: Some("hi".to_owned()),
        expect_text: Some("hi".to_owned()),
        send_binary: None,
        expect_binary: None,
    };
    let (sent, want) = ws_frame(&text).expect("a text frame");
    assert_eq!(sent, Message::text("hi"));
    assert_eq!(echoed_payload(Message::text("hi")).ok(), Some(want.clone()));
    assert_eq!(
        echoed_payload(Message::binary(b"hi".to_vec())).ok(),
        Some(want)
    );
    let binary = WsFrame {
        send_text: None,
        expect_text: None,
        send_binary: Some(vec![1, 2, 3]),
        expect_binary: Some(vec![1, 2, 3]),
    };
    let (_, want) = ws_frame(&binary).expect("a binary frame");
    assert_eq!(
        echoed_payload(Message::text("\u{1}\u{2}\u{3}")).ok(),
        Some(want)
    );
    assert!(echoed_payload(Message::Close(None)).is_err());
}
