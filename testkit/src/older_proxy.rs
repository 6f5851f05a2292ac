//! A proxy of an earlier release, as a controller meets one during an upgrade.
//!
//! Its config API refuses a document holding a filter type that release predates, the way that
//! release answers: 400, with the serde path of the value it could not read as the only naming
//! of the rule, and the JSON reader's position after it (`invalid JSON: rules[1].filters[0].type:
//! unknown variant ... at line 1 column 57`; no `rule` or `name` fields, which later releases
//! add). Every other request goes unchanged to a real proxy's config API, so what the older pod
//! serves is what a real proxy serves.
//!
//! Left out: everything else an earlier release might do differently.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
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
    /// that hold a filter of a type the release predates (`CORS`), in a rule or a backend.
    pub async fn start(current: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| async move {
                        Ok::<_, Infallible>(answer(req, current).await)
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

async fn answer(req: Request<Incoming>, current: SocketAddr) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, 16 * 1024 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return respond(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
    };
    if parts.method == Method::PUT && parts.uri.path() == "/config" {
        if let Some(error) = unreadable(&body) {
            return respond(StatusCode::BAD_REQUEST, format!("invalid JSON: {error}"));
        }
    }
    match forward(parts, body, current).await {
        Ok(response) => response,
        Err(e) => respond(StatusCode::BAD_GATEWAY, e),
    }
}

/// The document as the older release reads it, as far as its filters go: a filter of a type
/// it predates fails its reader at that filter's path, in document order, as it would fail
/// the release's whole config type.
mod older {
    use serde::Deserialize;

    #[derive(Deserialize)]
    enum Kind {
        RequestHeaderModifier,
        ResponseHeaderModifier,
        RequestRedirect,
        URLRewrite,
        RequestMirror,
    }

    #[derive(Deserialize)]
    struct Filter {
        #[serde(rename = "type")]
        _kind: Kind,
    }

    #[derive(Deserialize)]
    struct Backend {
        #[serde(default, rename = "filters")]
        _filters: Vec<Filter>,
    }

    #[derive(Deserialize)]
    struct Rule {
        #[serde(default, rename = "filters")]
        _filters: Vec<Filter>,
        #[serde(default, rename = "backends")]
        _backends: Vec<Backend>,
    }

    #[derive(Deserialize)]
    pub(super) struct Document {
        #[serde(default, rename = "rules")]
        _rules: Vec<Rule>,
    }
}

/// Why the older release cannot read the document `text`, as its reader says it: the path of
/// the first filter whose type it predates, the reader's complaint and where the reader stood
/// (`rules[1].filters[0].type: unknown variant ... at line 1 column 57`). `None` for a document
/// it reads, or one it cannot read for another reason (which the real proxy answers).
fn unreadable(text: &[u8]) -> Option<String> {
    let mut reader = serde_json::Deserializer::from_slice(text);
    let error = serde_path_to_error::deserialize::<_, older::Document>(&mut reader).err()?;
    let path = error.path().to_string();
    (path.contains("filters[") && path.ends_with(".type")).then(|| error.to_string())
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

    #[test]
    fn the_first_filter_it_cannot_read_is_named_by_its_path_and_the_readers_position() {
        let text = r#"{"version":3,"rules":[{"name":"a","filters":[{"type":"RequestHeaderModifier"}]},{"backends":[{"url":"http://b","filters":[{"type":"URLRewrite"},{"type":"CORS"}]}]},{"filters":[{"type":"CORS"}]}]}"#;
        let said = unreadable(text.as_bytes()).expect("refused");
        assert!(
            said.starts_with(
                "rules[1].backends[0].filters[1].type: unknown variant `CORS`, expected one of \
                 `RequestHeaderModifier`, "
            ),
            "{said}"
        );
        assert!(said.ends_with(" at line 1 column 158"), "{said}");
        // The position is where the rule stands in the document.
        let later = text.replace(r#""name":"a""#, r#""name":"a longer name""#);
        let moved = unreadable(later.as_bytes()).expect("refused");
        assert!(moved.ends_with(" at line 1 column 170"), "{moved}");
        for readable in [
            r#"{"rules":[{"filters":[{"type":"RequestMirror"}]}]}"#,
            r#"{"rules":[]}"#,
            r#"{"rules":[{"filters":"not a list"}]}"#,
            "not json",
        ] {
            assert_eq!(unreadable(readable.as_bytes()), None, "{readable}");
        }
    }
}
