//! Request handling for the echo server, following echo-basic's routes: `/health`,
//! `/status/NNN`, `/ws`, `/retry/...` and the JSON echo for everything else.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Serialize;

use super::conn_io::ConnControl;
use super::response::{bare, text, EchoResponse};
use super::{go_duration, websocket, Shared};

/// Request bodies are read and discarded up to this size; larger bodies end the read early.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Upper bound for `delay` / `delayRetry`, so a typo cannot park a connection for hours.
const MAX_DELAY: Duration = Duration::from_secs(300);
/// How many distinct `/retry/` UUIDs are remembered before the table is cleared.
const MAX_RETRY_IDS: usize = 100_000;
/// How long a handler waits for its connection to be torn down after asking for an RST.
const RESET_WAIT: Duration = Duration::from_secs(30);

/// Per-connection context handed to every request on that connection.
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) remote: SocketAddr,
    pub(crate) control: Arc<ConnControl>,
    pub(crate) stop: tokio::sync::watch::Receiver<bool>,
    /// The TLS session, on the TLS port.
    pub(crate) tls: Option<TlsInfo>,
}

/// What echo-basic's TLS port echoes as `tls` (its `TLSAssertions`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TlsInfo {
    pub(crate) version: String,
    /// The SNI the client sent; empty without one.
    pub(crate) server_name: String,
    pub(crate) negotiated_protocol: String,
    pub(crate) cipher_suite: String,
    /// The client's certificate chain, each as PEM (`CERTIFICATE`); empty without one.
    pub(crate) peer_certificates: Vec<String>,
}

/// Attempt counters of the `/retry/` handler, keyed by the `uuid` query parameter.
#[derive(Debug, Default)]
pub(crate) struct RetryCounters {
    attempts: Mutex<HashMap<String, u64>>,
}

impl RetryCounters {
    /// Counts one attempt; returns true while the attempt must fail (attempts so far < N).
    fn should_fail(&self, uuid: &str, succeed_after: u64) -> bool {
        let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        if attempts.len() >= MAX_RETRY_IDS && !attempts.contains_key(uuid) {
            attempts.clear();
        }
        let n = attempts.entry(uuid.to_owned()).or_insert(0);
        if *n < succeed_after {
            *n += 1;
            true
        } else {
            false
        }
    }
}

/// The JSON body of an echoed request (field names as echo-basic writes them).
#[derive(Serialize)]
struct EchoBody<'a> {
    path: &'a str,
    host: &'a str,
    method: &'a str,
    proto: &'a str,
    headers: BTreeMap<String, Vec<String>>,
    namespace: &'a str,
    ingress: &'a str,
    service: &'a str,
    pod: &'a str,
    #[serde(rename = "httpPort")]
    http_port: &'a str,
    /// The SNI the client sent, on the TLS port.
    sni: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<&'a TlsInfo>,
}

pub(crate) async fn handle(mut req: Request<Incoming>, ctx: &ConnCtx) -> EchoResponse {
    let route = collapse_slashes(req.uri().path());
    if route == "/ws" {
        return websocket::upgrade(&mut req, ctx.stop.clone());
    }
    let request_uri = request_uri(&req);
    let query = req.uri().query().unwrap_or("").to_owned();
    let (parts, body) = req.into_parts();
    drain_body(body).await;

    if route == "/health" {
        return text(StatusCode::OK, "OK");
    }
    if route.starts_with("/status/") {
        return bare(status_from_uri(&request_uri).unwrap_or(StatusCode::BAD_REQUEST));
    }
    if route.starts_with("/retry/") {
        if let Some(failure) = retry(&query, ctx).await {
            return failure;
        }
    }
    echo(&parts, &request_uri, &query, ctx).await
}

/// echo-basic takes the code from the whole RequestURI with `^/status/(\d\d\d)$`, so a query
/// string or doubled slashes make it 400. Informational codes cannot be a final answer here.
fn status_from_uri(request_uri: &str) -> Option<StatusCode> {
    let digits = request_uri.strip_prefix("/status/")?;
    if digits.len() != 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let status = StatusCode::from_u16(digits.parse().ok()?).ok()?;
    (status.as_u16() >= 200).then_some(status)
}

/// Reads and discards the request body, up to `MAX_BODY` bytes: a client may not read the
/// response before it has sent the whole request. Past the limit (or on a read error) the
/// rest is left unread and hyper closes the connection after the response.
async fn drain_body(mut body: Incoming) {
    let mut seen = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            seen = seen.saturating_add(data.len());
            if seen > MAX_BODY {
                break;
            }
        }
    }
}

/// The `/retry/` simulator. Returns `Some(response)` when this attempt fails or the query is
/// malformed, `None` when the request should be echoed normally.
async fn retry(query: &str, ctx: &ConnCtx) -> Option<EchoResponse> {
    let params = QueryParams::parse(query);
    let bad = |msg: &'static str| Some(text(StatusCode::BAD_REQUEST, msg));
    let (Some(uuid), Some(succeed_after)) = (params.get("uuid"), params.get("succeedAfter")) else {
        return bad("missing uuid or succeedAfter\n");
    };
    if uuid.is_empty() {
        return bad("missing uuid\n");
    }
    let Ok(succeed_after) = succeed_after.parse::<u64>() else {
        return bad("invalid succeedAfter\n");
    };
    let response_code = match params.get("responseCode").filter(|s| !s.is_empty()) {
        None => None,
        Some(c) => match c
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
        {
            Some(status) if status.as_u16() >= 200 => Some(status),
            _ => return bad("invalid responseCode\n"),
        },
    };
    let delay = match params.get("delayRetry").filter(|s| !s.is_empty()) {
        None => Duration::ZERO,
        Some(d) => match go_duration::parse(d) {
            Ok(d) => d.min(MAX_DELAY),
            Err(_) => return bad("invalid delayRetry\n"),
        },
    };
    if !ctx.shared.retries.should_fail(uuid, succeed_after) {
        return None;
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = response_code {
        return Some(bare(status));
    }
    ctx.control.reset();
    // The connection task drops this future together with the connection; the timeout only
    // guards against a connection that is somehow not torn down.
    tokio::time::sleep(RESET_WAIT).await;
    Some(bare(StatusCode::INTERNAL_SERVER_ERROR))
}

async fn echo(
    parts: &http::request::Parts,
    request_uri: &str,
    query: &str,
    ctx: &ConnCtx,
) -> EchoResponse {
    let shared = &ctx.shared;
    shared.log(request_uri, ctx.remote).await;

    if let Some(delay) = QueryParams::parse(query)
        .get("delay")
        .filter(|s| !s.is_empty())
    {
        match go_duration::parse(delay) {
            Ok(d) => tokio::time::sleep(d.min(MAX_DELAY)).await,
            // echo-basic answers a bad delay with 500 and a JSON message
            Err(_) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("time: invalid duration {delay:?}"),
                )
            }
        }
    }

    let host = request_host(parts);
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in &parts.headers {
        // Go's server moves Host into r.Host and consumes Transfer-Encoding.
        if name == HOST || name == TRANSFER_ENCODING {
            continue;
        }
        headers
            .entry(canonical_header_key(name.as_str()))
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    let body = EchoBody {
        path: request_uri,
        host: &host,
        method: parts.method.as_str(),
        proto: proto(parts.version),
        headers,
        namespace: &shared.identity.namespace,
        ingress: "",
        service: "",
        pod: &shared.identity.pod,
        http_port: &shared.http_port,
        sni: ctx.tls.as_ref().map_or("", |t| t.server_name.as_str()),
        tls: ctx.tls.as_ref(),
    };
    let json = match encode_indented(&body) {
        Ok(json) => json,
        Err(e) => return json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };

    let mut response = Response::new(Full::new(Bytes::from(json)));
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    for spec in parts.headers.get_all("x-echo-set-header") {
        apply_set_header(h, &String::from_utf8_lossy(spec.as_bytes()));
    }
    response
}

/// JSON indented by one space, as Go's `json.MarshalIndent(v, "", " ")` writes it.
fn encode_indented<T: Serialize>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(512);
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut ser)?;
    Ok(out)
}

/// echo-basic's error answer: `{"message": "..."}` as JSON.
fn json_error(status: StatusCode, message: &str) -> EchoResponse {
    let body = serde_json::json!({ "message": message }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `X-Echo-Set-Header: Name1:val1,Name2:val2`: each pair sets a response header; a name seen
/// again appends `,val` to the existing value; a pair without `:` sets an empty value, as
/// echo-basic does. Names that are not valid header names (e.g. empty) are skipped.
fn apply_set_header(headers: &mut http::HeaderMap, spec: &str) {
    for pair in spec.split(',') {
        let (name, value) = pair.trim().split_once(':').unwrap_or((pair.trim(), ""));
        let (name, value) = (name.trim(), value.trim());
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        let combined = match headers.get(&name) {
            Some(existing) => {
                let mut v = existing.as_bytes().to_vec();
                v.push(b',');
                v.extend_from_slice(value.as_bytes());
                HeaderValue::from_bytes(&v)
            }
            None => HeaderValue::from_str(value),
        };
        if let Ok(v) = combined {
            headers.insert(name, v);
        }
    }
}

/// Go's `r.RequestURI`: the request target exactly as received. hyper keeps the target's
/// bytes in the `Uri`; for HTTP/2 it is the `:path` pseudo-header.
fn request_uri<B>(req: &Request<B>) -> String {
    let uri = req.uri();
    if req.version() < Version::HTTP_2 && uri.scheme().is_some() {
        // absolute-form request target (a forward-proxy style request)
        return uri.to_string();
    }
    uri.path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| uri.path().to_owned())
}

/// Go's `r.Host`: the Host header for HTTP/1, `:authority` for HTTP/2.
fn request_host(parts: &http::request::Parts) -> String {
    let header = parts
        .headers
        .get(HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let authority = parts.uri.authority().map(|a| a.as_str().to_owned());
    if parts.version >= Version::HTTP_2 {
        authority.or(header).unwrap_or_default()
    } else {
        header.or(authority).unwrap_or_default()
    }
}

fn proto(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: upper-case the first letter and each letter after
/// a hyphen, lower-case the rest; names with bytes outside the token set are left unchanged.
pub(crate) fn canonical_header_key(name: &str) -> String {
    let is_token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(is_token) {
        return name.to_owned();
    }
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        upper = c == '-';
    }
    out
}

/// echo-basic routes on a path where `//` runs are collapsed to `/`; the echoed `path` keeps
/// the original.
pub(crate) fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut prev_slash = false;
    for c in path.chars() {
        if c == '/' && prev_slash {
            continue;
        }
        prev_slash = c == '/';
        out.push(c);
    }
    out
}

/// Decoded query parameters; the first value of a repeated name wins, as `url.Values.Get`.
struct QueryParams(Vec<(String, String)>);

impl QueryParams {
    fn parse(query: &str) -> Self {
        Self(
            form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_canonicalised_like_go() {
        assert_eq!(canonical_header_key("x-forwarded-for"), "X-Forwarded-For");
        assert_eq!(canonical_header_key("content-length"), "Content-Length");
        assert_eq!(canonical_header_key("x-b3-traceid"), "X-B3-Traceid");
        assert_eq!(canonical_header_key("weird header"), "weird header");
    }

    #[test]
    fn status_codes_are_three_digits_of_the_whole_request_uri() {
        assert_eq!(
            status_from_uri("/status/503"),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(status_from_uri("/status/200"), Some(StatusCode::OK));
        for bad in [
            "/status/50",
            "/status/5030",
            "/status/503?x=1",
            "/status/abc",
            "/status/101",
            "//status/503",
        ] {
            assert_eq!(status_from_uri(bad), None, "{bad}");
        }
    }

    #[test]
    fn double_slashes_collapse_for_routing() {
        assert_eq!(collapse_slashes("//status//503"), "/status/503");
        assert_eq!(collapse_slashes("/a/b/"), "/a/b/");
    }

    #[test]
    fn set_header_appends_repeated_names() {
        let mut h = http::HeaderMap::new();
        apply_set_header(&mut h, "X-A:1, X-B: two ,X-A:3,bare,:x,");
        assert_eq!(h.get("x-a").map(|v| v.as_bytes()), Some(&b"1,3"[..]));
        assert_eq!(h.get("x-b").map(|v| v.as_bytes()), Some(&b"two"[..]));
        assert_eq!(h.get("bare").map(|v| v.as_bytes()), Some(&b""[..]));
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn retry_counter_fails_n_times_then_succeeds() {
        let c = RetryCounters::default();
        assert!(c.should_fail("u", 2));
        assert!(c.should_fail("u", 2));
        assert!(!c.should_fail("u", 2));
        assert!(!c.should_fail("u", 2));
        assert!(!c.should_fail("v", 0));
    }
}
