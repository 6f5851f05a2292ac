//! A proxy of an earlier release, as a controller meets one during an upgrade.
//!
//! Its config API refuses a document holding a filter type that release predates, the way that
//! release answers: 400, with the serde path of the value it could not read as the only naming
//! of the rule (`invalid JSON: rules[1].filters[0].type: unknown variant ...`; no `rule` or
//! `name` fields, which later releases add). Every other request goes unchanged to a real
//! proxy's config API, so what the older pod serves is what a real proxy serves.
//!
//! Left out: everything else an earlier release might do differently.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A config API on loopback that predates one filter type; see the module docs.
#[derive(Debug)]
pub struct OlderProxy {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for OlderProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OlderProxy {
    /// Fronts the config API at `current` (a real proxy's admin address), refusing documents
    /// that hold a filter of type `unknown_filter` (as `"CORS"`), in a rule or a backend.
    pub async fn start(current: SocketAddr, unknown_filter: &'static str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| async move {
                        Ok::<_, Infallible>(answer(req, current, unknown_filter).await)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// Where its config API listens (the address a controller pushes to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn answer(
    req: Request<Incoming>,
    current: SocketAddr,
    unknown_filter: &str,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, 16 * 1024 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return respond(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
    };
    if parts.method == Method::PUT && parts.uri.path() == "/config" {
        if let Ok(doc) = serde_json::from_slice::<Value>(&body) {
            if let Some(at) = unreadable(&doc, unknown_filter) {
                return respond(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "invalid JSON: {at}: unknown variant `{unknown_filter}`, expected one of \
                         `RequestHeaderModifier`, `ResponseHeaderModifier`, `RequestRedirect`, \
                         `URLRewrite`, `RequestMirror`"
                    ),
                );
            }
        }
    }
    match forward(parts, body, current).await {
        Ok(response) => response,
        Err(e) => respond(StatusCode::BAD_GATEWAY, e),
    }
}

/// The path of the first filter type the older release cannot read.
fn unreadable(doc: &Value, unknown_filter: &str) -> Option<String> {
    let filters = |list: Option<&Value>, at: String| {
        list.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .position(|f| f.get("type").and_then(Value::as_str) == Some(unknown_filter))
            .map(|j| format!("{at}.filters[{j}].type"))
    };
    let rules = doc.get("rules").and_then(Value::as_array)?;
    rules.iter().enumerate().find_map(|(i, rule)| {
        filters(rule.get("filters"), format!("rules[{i}]")).or_else(|| {
            rule.get("backends")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .find_map(|(k, b)| filters(b.get("filters"), format!("rules[{i}].backends[{k}]")))
        })
    })
}

/// Sends a request on to the config API at `current`, and its answer back.
pub(crate) async fn forward(
    parts: http::request::Parts,
    body: Bytes,
    current: SocketAddr,
) -> Result<Response<Full<Bytes>>, String> {
    let stream = TcpStream::connect(current)
        .await
        .map_err(|e| format!("connecting to {current}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::from_parts(parts, Full::new(body));
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = res.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

pub(crate) fn respond(status: StatusCode, error: impl std::fmt::Display) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": error.to_string() }).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_filter_it_cannot_read_is_named_by_its_path() {
        let doc = json!({"rules": [
            {"filters": [{"type": "RequestHeaderModifier"}]},
            {"backends": [{"url": "http://b", "filters": [{"type": "URLRewrite"}, {"type": "CORS"}]}]},
            {"filters": [{"type": "CORS"}]},
        ]});
        assert_eq!(
            unreadable(&doc, "CORS").as_deref(),
            Some("rules[1].backends[0].filters[1].type")
        );
        assert_eq!(unreadable(&doc, "RequestMirror"), None);
        assert_eq!(unreadable(&json!({"rules": []}), "CORS"), None);
    }
}
