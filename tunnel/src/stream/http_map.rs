//! Mapping between `ConnectRequest`/`ConnectResponse` metadata and `http`
//! request and response heads (QUIC transport).

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Response, StatusCode, Uri};

use super::headers::canonical_name;
use super::{ConnectRequest, ConnectResponse, ConnectionType, Metadata};

/// Metadata key carrying the request method.
pub const METHOD: &str = "HttpMethod";
/// Metadata key carrying the eyeball's host (the request's `Host`).
pub const HOST_KEY: &str = "HttpHost";
/// Prefix of `HttpHeader:<Name>` metadata keys, one entry per header value.
pub const HEADER_PREFIX: &str = "HttpHeader";
/// Metadata key carrying the response status.
pub const STATUS: &str = "HttpStatus";
/// Most `HttpHeader:*` entries accepted in one request or response. Far
/// above what the edge forwards, and well below the 24576 names an
/// [`http::HeaderMap`] holds, so a service can still add its own headers to
/// the head it is given.
pub const MAX_HEADERS: usize = 8192;

/// Why request or response metadata could not be mapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// `HttpMethod` is missing or invalid.
    #[error("invalid or missing HttpMethod")]
    Method,
    /// `dest` is not a URL or path.
    #[error("invalid dest URL")]
    Dest,
    /// A header entry has an invalid name or value.
    #[error("invalid header {0:?}")]
    Header(String),
    /// `HttpStatus` is missing or invalid.
    #[error("invalid or missing HttpStatus")]
    Status,
    /// More `HttpHeader:*` entries than [`MAX_HEADERS`].
    #[error("more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    /// The stream type is not served by this connector.
    #[error("unsupported stream type")]
    Unsupported,
}

fn header_key(key: &str) -> Option<&str> {
    let mut parts = key.split(':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(HEADER_PREFIX), Some(name), None) => Some(name),
        _ => None,
    }
}

fn check_header_count(metadata: &[Metadata]) -> Result<(), MapError> {
    let headers = metadata
        .iter()
        .filter(|m| header_key(&m.key).is_some())
        .count();
    if headers > MAX_HEADERS {
        return Err(MapError::TooManyHeaders);
    }
    Ok(())
}

fn too_many(_: http::header::MaxSizeReached) -> MapError {
    MapError::TooManyHeaders
}

/// Builds the request head for a `ConnectRequest`. Returns the head and
/// whether a body follows on the stream (only when `Content-Length` or a
/// chunked `Transfer-Encoding` is present, as the edge expects).
pub fn request_from_connect(req: &ConnectRequest) -> Result<(Request<()>, bool), MapError> {
    if req.kind == ConnectionType::Tcp {
        return Err(MapError::Unsupported);
    }
    check_header_count(&req.metadata)?;
    let mut method = None;
    let mut host = None;
    let mut builder = Request::builder();
    let mut has_body = false;
    let headers = builder.headers_mut().ok_or(MapError::Dest)?;
    for m in &req.metadata {
        if m.key == METHOD {
            method = Some(Method::from_bytes(m.val.as_bytes()).map_err(|_| MapError::Method)?);
        } else if m.key == HOST_KEY {
            host = Some(m.val.as_str());
        } else if let Some(name) = header_key(&m.key) {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| MapError::Header(name.to_owned()))?;
            if name == HOST {
                continue;
            }
            let value = HeaderValue::from_str(&m.val)
                .map_err(|_| MapError::Header(name.as_str().to_owned()))?;
            if name == CONTENT_LENGTH
                || (name == TRANSFER_ENCODING && m.val.to_ascii_lowercase().contains("chunked"))
            {
                has_body = true;
            }
            headers.try_append(name, value).map_err(too_many)?;
        }
    }
    let dest: Uri = req.dest.parse().map_err(|_| MapError::Dest)?;
    let authority = dest.authority().map(|a| a.as_str().to_owned());
    let host = host
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .or(authority)
        .filter(|h| !h.is_empty());
    let uri = match (&host, dest.scheme_str()) {
        (Some(h), scheme) => {
            let pq = dest.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            Uri::builder()
                .scheme(scheme.unwrap_or("https"))
                .authority(h.as_str())
                .path_and_query(pq)
                .build()
                .map_err(|_| MapError::Dest)?
        }
        (None, _) => dest,
    };
    if let Some(h) = &host {
        let v = HeaderValue::from_str(h).map_err(|_| MapError::Header("host".into()))?;
        headers.try_insert(HOST, v).map_err(too_many)?;
    }
    if req.kind == ConnectionType::Websocket {
        try_add_websocket_headers(headers).map_err(too_many)?;
        has_body = false;
    }
    let req = builder
        .method(method.ok_or(MapError::Method)?)
        .uri(uri)
        .body(())
        .map_err(|_| MapError::Dest)?;
    Ok((req, has_body))
}

/// The connector adds these towards the origin for WebSocket streams, as
/// `cloudflared` does. A head already holding as many header names as an
/// [`http::HeaderMap`] can is left without those it has no room for.
pub fn add_websocket_headers(headers: &mut http::HeaderMap) {
    let _ = try_add_websocket_headers(headers);
}

fn try_add_websocket_headers(
    headers: &mut http::HeaderMap,
) -> Result<(), http::header::MaxSizeReached> {
    headers.try_insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    )?;
    headers.try_insert(http::header::UPGRADE, HeaderValue::from_static("websocket"))?;
    if !headers.contains_key(http::header::SEC_WEBSOCKET_VERSION) {
        headers.try_insert(
            http::header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        )?;
    }
    Ok(())
}

/// `HttpStatus` then one `HttpHeader:<Canonical-Name>` entry per value.
pub fn response_metadata(status: StatusCode, headers: &http::HeaderMap) -> Vec<Metadata> {
    let mut out = Vec::with_capacity(headers.len() + 1);
    out.push(Metadata::new(STATUS, status.as_str()));
    for (name, value) in headers {
        out.push(Metadata::new(
            format!("{HEADER_PREFIX}:{}", canonical_name(name.as_str())),
            String::from_utf8_lossy(value.as_bytes()),
        ));
    }
    out
}

/// Edge side: describes an eyeball request for the connector.
pub fn connect_from_request(parts: &http::request::Parts, kind: ConnectionType) -> ConnectRequest {
    let host = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default();
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut metadata = Vec::with_capacity(parts.headers.len() + 2);
    metadata.push(Metadata::new(METHOD, parts.method.as_str()));
    metadata.push(Metadata::new(HOST_KEY, host.clone()));
    for (name, value) in &parts.headers {
        if name == HOST {
            continue;
        }
        metadata.push(Metadata::new(
            format!("{HEADER_PREFIX}:{}", canonical_name(name.as_str())),
            String::from_utf8_lossy(value.as_bytes()),
        ));
    }
    ConnectRequest {
        dest: format!("https://{host}{pq}"),
        kind,
        metadata,
    }
}

/// Edge side: turns a successful `ConnectResponse` into a response head.
pub fn response_from_connect(resp: &ConnectResponse) -> Result<Response<()>, MapError> {
    check_header_count(&resp.metadata)?;
    let mut builder = Response::builder();
    let mut status = None;
    let headers = builder.headers_mut().ok_or(MapError::Status)?;
    for m in &resp.metadata {
        if m.key == STATUS {
            status = Some(StatusCode::from_bytes(m.val.as_bytes()).map_err(|_| MapError::Status)?);
        } else if let Some(name) = header_key(&m.key) {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| MapError::Header(name.to_owned()))?;
            let value = HeaderValue::from_str(&m.val)
                .map_err(|_| MapError::Header(name.as_str().to_owned()))?;
            headers.try_append(name, value).map_err(too_many)?;
        }
    }
    builder
        .status(status.ok_or(MapError::Status)?)
        .body(())
        .map_err(|_| MapError::Status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_head_uses_http_host_and_detects_bodies() {
        let req = ConnectRequest {
            dest: "https://ignored.example/p?q=1".into(),
            kind: ConnectionType::Http,
            metadata: vec![
                Metadata::new("HttpMethod", "POST"),
                Metadata::new("HttpHost", "app.example.com"),
                Metadata::new("HttpHeader:Host", "other.example"),
                Metadata::new("HttpHeader:Content-Length", "3"),
                Metadata::new("HttpHeader:X-A", "1"),
                Metadata::new("HttpHeader:X-A", "2"),
            ],
        };
        let (head, body) = request_from_connect(&req).unwrap();
        assert!(body);
        assert_eq!(head.method(), Method::POST);
        assert_eq!(head.uri(), "https://app.example.com/p?q=1");
        assert_eq!(head.headers()[HOST], "app.example.com");
        assert_eq!(head.headers().get_all("x-a").iter().count(), 2);
    }

    #[test]
    fn path_only_dest_and_no_length_means_no_body() {
        let req = ConnectRequest {
            dest: "/ok".into(),
            kind: ConnectionType::Http,
            metadata: vec![
                Metadata::new("HttpMethod", "GET"),
                Metadata::new("HttpHost", "h.example"),
            ],
        };
        let (head, body) = request_from_connect(&req).unwrap();
        assert!(!body);
        assert_eq!(head.uri(), "https://h.example/ok");
    }

    #[test]
    fn empty_http_host_falls_back_to_the_dest_authority() {
        // Found by fuzzing: an empty `HttpHost` left an absolute URI without
        // a `Host` header.
        let req = ConnectRequest {
            dest: "https://app.example.com/p".into(),
            kind: ConnectionType::Http,
            metadata: vec![
                Metadata::new("HttpMethod", "GET"),
                Metadata::new("HttpHost", ""),
            ],
        };
        let (head, _) = request_from_connect(&req).unwrap();
        assert_eq!(head.uri(), "https://app.example.com/p");
        assert_eq!(head.headers()[HOST], "app.example.com");
    }

    #[test]
    fn too_many_headers_is_an_error() {
        // More distinct names than a HeaderMap holds used to panic while
        // building the head.
        let mut req = ConnectRequest {
            dest: "https://h.example/".into(),
            kind: ConnectionType::Websocket,
            metadata: vec![Metadata::new("HttpMethod", "GET")],
        };
        // 25000 distinct names (HeaderMap holds at most 24576) with names
        // short enough to stay within the message size cap.
        const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        for i in 0..25_000 {
            let name: String = [i / 1296, i / 36 % 36, i % 36]
                .iter()
                .map(|&d| char::from(DIGITS[d]))
                .collect();
            req.metadata
                .push(Metadata::new(format!("HttpHeader:{name}"), ""));
        }
        let bytes = crate::stream::encode_connect_request(&req);
        assert!(bytes.len() <= crate::stream::MAX_MESSAGE_BYTES);
        let (decoded, _) = crate::stream::parse_request_preamble(&bytes).unwrap();
        assert_eq!(
            request_from_connect(&decoded).unwrap_err(),
            MapError::TooManyHeaders
        );
        // Up to the limit, every header gets through.
        req.metadata.truncate(1 + MAX_HEADERS);
        let (head, _) = request_from_connect(&req).unwrap();
        assert_eq!(head.headers().len(), MAX_HEADERS + 4);

        let mut resp = ConnectResponse {
            error: String::new(),
            metadata: req.metadata.clone(),
        };
        resp.metadata[0] = Metadata::new(STATUS, "200");
        assert_eq!(
            response_from_connect(&resp).unwrap().headers().len(),
            MAX_HEADERS
        );
        resp.metadata.push(Metadata::new("HttpHeader:X", "1"));
        assert_eq!(
            response_from_connect(&resp).unwrap_err(),
            MapError::TooManyHeaders
        );
    }

    #[test]
    fn malformed_metadata_is_an_error() {
        let mut req = ConnectRequest {
            dest: "/".into(),
            kind: ConnectionType::Http,
            metadata: vec![Metadata::new("HttpHeader:Bad Name", "x")],
        };
        assert!(matches!(
            request_from_connect(&req),
            Err(MapError::Header(_))
        ));
        req.metadata = vec![];
        assert_eq!(request_from_connect(&req).unwrap_err(), MapError::Method);
        req.kind = ConnectionType::Tcp;
        assert_eq!(
            request_from_connect(&req).unwrap_err(),
            MapError::Unsupported
        );
    }

    #[test]
    fn response_metadata_round_trips() {
        let mut h = http::HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        let md = response_metadata(StatusCode::CREATED, &h);
        assert_eq!(md[0], Metadata::new("HttpStatus", "201"));
        assert_eq!(
            md[1],
            Metadata::new("HttpHeader:Content-Type", "text/plain")
        );
        let resp = response_from_connect(&ConnectResponse {
            error: String::new(),
            metadata: md,
        })
        .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(resp.headers(), &h);
    }
}
