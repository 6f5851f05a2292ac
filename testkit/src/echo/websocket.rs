//! The `/ws` endpoint: an RFC 6455 upgrade that echoes text and binary messages back.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::header::{HeaderValue, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use http::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::response::{text, EchoResponse};

/// A WebSocket connection with no traffic for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_MESSAGE: usize = 1024 * 1024;

fn header_has_token(
    req: &Request<hyper::body::Incoming>,
    name: http::HeaderName,
    token: &str,
) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// Answers the upgrade request with 101 and spawns the echo loop on the upgraded stream.
/// A request that is not a WebSocket handshake gets 400, as gorilla/websocket answers.
pub(crate) fn upgrade(
    req: &mut Request<hyper::body::Incoming>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> EchoResponse {
    let key = req.headers().get(SEC_WEBSOCKET_KEY).cloned();
    let version_ok = req
        .headers()
        .get("sec-websocket-version")
        .is_some_and(|v| v.as_bytes() == b"13");
    let (Some(key), true, true, true) = (
        key,
        version_ok,
        header_has_token(req, UPGRADE, "websocket"),
        header_has_token(req, CONNECTION, "upgrade"),
    ) else {
        return text(StatusCode::BAD_REQUEST, "Bad Request\n");
    };
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        loop {
            let next = tokio::select! {
                _ = stop.changed() => break,
                next = tokio::time::timeout(IDLE_TIMEOUT, ws.next()) => next,
            };
            let msg = match next {
                Ok(Some(Ok(msg))) => msg,
                // idle timeout, end of stream or protocol error
                _ => break,
            };
            let reply = match msg {
                Message::Text(_) | Message::Binary(_) => msg,
                Message::Close(_) => break,
                // Pings are answered by tungstenite itself; pongs and raw frames are ignored.
                _ => continue,
            };
            if ws.send(reply).await.is_err() {
                break;
            }
        }
        let _ = ws.close(None).await;
    });

    let mut response = text(StatusCode::SWITCHING_PROTOCOLS, "");
    let h = response.headers_mut();
    h.remove(http::header::CONTENT_TYPE);
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}
