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
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
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
        if let Some(error) = unreadable(&body, unknown_filter) {
            return respond(StatusCode::BAD_REQUEST, format!("invalid JSON: {error}"));
        }
    }
    match forward(parts, body, current).await {
        Ok(response) => response,
        Err(e) => respond(StatusCode::BAD_GATEWAY, e),
    }
}

/// The filter types the older release reads.
const KNOWN_FILTERS: &[&str] = &[
    "RequestHeaderModifier",
    "ResponseHeaderModifier",
    "RequestRedirect",
    "URLRewrite",
    "RequestMirror",
];

/// Why the older release cannot read the document `text`, as its JSON reader says it: the
/// first filter of type `unknown_filter` in document order, named by its path, and where the
/// reader stood. `None` for a document it reads (or one it cannot for another reason, which
/// the real proxy answers).
fn unreadable(text: &[u8], unknown_filter: &str) -> Option<String> {
    let mut reading = Reading {
        path: Vec::new(),
        unknown_filter,
        found: false,
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let read = Walk(&mut reading).deserialize(&mut de);
    match read {
        Err(e) if reading.found => Some(e.to_string()),
        _ => None,
    }
}

/// Where a [`Walk`] is in the document, and what it looks for.
struct Reading<'a> {
    path: Vec<Step>,
    unknown_filter: &'a str,
    /// The walk stopped at a filter of that type.
    found: bool,
}

enum Step {
    Field(String),
    Element(usize),
}

impl Reading<'_> {
    /// The path as serde names it: `rules[1].filters[0].type`.
    fn path(&self) -> String {
        let mut path = String::new();
        for step in &self.path {
            match step {
                Step::Field(name) if path.is_empty() => path.push_str(name),
                Step::Field(name) => {
                    path.push('.');
                    path.push_str(name);
                }
                Step::Element(i) => path.push_str(&format!("[{i}]")),
            }
        }
        path
    }

    /// The value at the path is a filter's type.
    fn at_filter_type(&self) -> bool {
        matches!(
            self.path.as_slice(),
            [.., Step::Field(list), Step::Element(_), Step::Field(field)]
                if list == "filters" && field == "type"
        )
    }
}

/// Reads any JSON value in full, stopping at a filter type the older release does not know
/// with the error its reader gives (so the position after it is the reader's too).
struct Walk<'r, 'a>(&'r mut Reading<'a>);

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        if self.0.at_filter_type() && value == self.0.unknown_filter {
            self.0.found = true;
            let unknown = E::unknown_variant(value, KNOWN_FILTERS);
            return Err(E::custom(format_args!("{}: {unknown}", self.0.path())));
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for i in 0.. {
            self.0.path.push(Step::Element(i));
            let more = seq.next_element_seed(Walk(&mut *self.0))?;
            self.0.path.pop();
            if more.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(field) = map.next_key::<String>()? {
            self.0.path.push(Step::Field(field));
            map.next_value_seed(Walk(&mut *self.0))?;
            self.0.path.pop();
        }
        Ok(())
    }
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
    use serde::Deserialize;

    /// The older release's document, as far as its filters go: what its reader says of one
    /// it cannot read is what [`unreadable`] says, but for the path.
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
    struct Document {
        #[serde(rename = "rules")]
        _rules: Vec<Rule>,
    }

    #[test]
    fn the_first_filter_it_cannot_read_is_named_by_its_path_and_the_readers_position() {
        let text = r#"{"version":3,"rules":[{"name":"a","filters":[{"type":"RequestHeaderModifier"}]},{"backends":[{"url":"http://b","filters":[{"type":"URLRewrite"},{"type":"CORS"}]}]},{"filters":[{"type":"CORS"}]}]}"#;
        let said = unreadable(text.as_bytes(), "CORS").expect("refused");
        let typed = serde_json::from_str::<Document>(text)
            .err()
            .expect("the older type refuses it");
        assert_eq!(
            said,
            format!("rules[1].backends[0].filters[1].type: {typed}")
        );
        assert!(said.ends_with(" at line 1 column 158"), "{said}");
        // The position is where the rule stands in the document.
        let later = text.replace(r#""name":"a""#, r#""name":"a longer name""#);
        let moved = unreadable(later.as_bytes(), "CORS").expect("refused");
        assert!(moved.ends_with(" at line 1 column 170"), "{moved}");
        for readable in [
            r#"{"rules":[{"filters":[{"type":"CORS"}]}]}"#,
            r#"{"rules":[]}"#,
            "not json",
        ] {
            assert_eq!(
                unreadable(readable.as_bytes(), "RequestMirror"),
                None,
                "{readable}"
            );
        }
    }
}
