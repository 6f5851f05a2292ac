//! Mapping between `ConnectRequest`/`ConnectResponse` metadata and `http`
//! request and response heads (QUIC transport).

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Response, StatusCode, Uri};

use super::headers::canonical_name;
use super::{ConnectRequest, ConnectResponse, ConnectionType, Metadata};

pub(crate) const METHOD: &str = "HttpMethod";
pub(crate) const HOST_KEY: &str = "HttpHost";
pub(crate) const HEADER_PREFIX: &str = "HttpHeader";
pub(crate) const STATUS: &str = "HttpStatus";

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

/// Builds the request head for a `ConnectRequest`. Returns the head and
/// whether a body follows on the stream (only when `Content-Length` or a
/// chunked `Transfer-Encoding` is present, as the edge expects).
pub(crate) fn request_from_connect(req: &ConnectRequest) -> Result<(Request<()>, bool), MapError> {
    if req.kind == ConnectionType::Tcp {
        return Err(MapError::Unsupported);
    }
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
            headers.append(name, value);
        }
    }
    let dest: Uri = req.dest.parse().map_err(|_| MapError::Dest)?;
    let authority = dest.authority().map(|a| a.as_str().to_owned());
    let host = host
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
        headers.insert(HOST, v);
    }
    if req.kind == ConnectionType::Websocket {
        add_websocket_headers(headers);
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
/// `cloudflared` does.
pub(crate) fn add_websocket_headers(headers: &mut http::HeaderMap) {
    headers.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    headers.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    headers
        .entry(http::header::SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
}

/// `HttpStatus` then one `HttpHeader:<Canonical-Name>` entry per value.
pub(crate) fn response_metadata(status: StatusCode, headers: &http::HeaderMap) -> Vec<Metadata> {
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
pub(crate) fn connect_from_request(
    parts: &http::request::Parts,
    kind: ConnectionType,
) -> ConnectRequest {
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
pub(crate) fn response_from_connect(resp: &ConnectResponse) -> Result<Response<()>, MapError> {
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
            headers.append(name, value);
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
