//! Mapping between `ConnectRequest`/`ConnectResponse` metadata and `http`
//! request and response heads (QUIC transport).

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Response, StatusCode, Uri};

use super::headers::write_canonical;
use super::{ConnectRequest, ConnectResponse, ConnectionType, FrameError, Metadata};
use crate::quic_metadata_protocol_capnp as proto;

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
    key.strip_prefix(HEADER_PREFIX)?
        .strip_prefix(':')
        .filter(|name| !name.as_bytes().contains(&b':'))
}

/// One `HttpHeader:<name>` entry, counted against [`MAX_HEADERS`].
fn parse_header(
    name: &str,
    val: &str,
    count: &mut usize,
) -> Result<(HeaderName, HeaderValue), MapError> {
    *count += 1;
    if *count > MAX_HEADERS {
        return Err(MapError::TooManyHeaders);
    }
    let name =
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| MapError::Header(name.to_owned()))?;
    let value =
        HeaderValue::from_str(val).map_err(|_| MapError::Header(name.as_str().to_owned()))?;
    Ok((name, value))
}

fn too_many(_: http::header::MaxSizeReached) -> MapError {
    MapError::TooManyHeaders
}

/// Builds the request head for a `ConnectRequest`. Returns the head and
/// whether a body follows on the stream (only when `Content-Length` or a
/// chunked `Transfer-Encoding` is present, as the edge expects).
pub fn request_from_connect(req: &ConnectRequest) -> Result<(Request<()>, bool), MapError> {
    map_request(
        &req.dest,
        req.kind,
        req.metadata
            .iter()
            .map(|m| Ok((m.key.as_str(), m.val.as_str()))),
    )
}

/// [`request_from_connect`] over borrowed metadata entries, so the connector
/// can map a request straight from the received message.
pub(super) fn map_request<'a>(
    dest: &str,
    kind: ConnectionType,
    metadata: impl Iterator<Item = Result<(&'a str, &'a str), MapError>>,
) -> Result<(Request<()>, bool), MapError> {
    if kind == ConnectionType::Tcp {
        return Err(MapError::Unsupported);
    }
    let mut method = None;
    let mut host = None;
    let mut builder = Request::builder();
    let mut has_body = false;
    let mut count = 0usize;
    let headers = builder.headers_mut().ok_or(MapError::Dest)?;
    // Sized once for the usual head instead of grown and rehashed as entries arrive.
    *headers = http::HeaderMap::with_capacity(metadata.size_hint().0.min(64));
    for entry in metadata {
        let (key, val) = entry?;
        if key == METHOD {
            method = Some(Method::from_bytes(val.as_bytes()).map_err(|_| MapError::Method)?);
        } else if key == HOST_KEY {
            host = Some(val);
        } else if let Some(name) = header_key(key) {
            let (name, value) = parse_header(name, val, &mut count)?;
            if name == HOST {
                continue;
            }
            if name == CONTENT_LENGTH
                || (name == TRANSFER_ENCODING && val.to_ascii_lowercase().contains("chunked"))
            {
                has_body = true;
            }
            headers.try_append(name, value).map_err(too_many)?;
        }
    }
    let dest: Uri = dest.parse().map_err(|_| MapError::Dest)?;
    let host = host
        .filter(|h| !h.is_empty())
        .or_else(|| dest.authority().map(|a| a.as_str()))
        .filter(|h| !h.is_empty());
    let host_value = match host {
        Some(h) => Some(HeaderValue::from_str(h).map_err(|_| MapError::Header("host".into()))?),
        None => None,
    };
    let uri = match host {
        // The edge's usual shape: `dest` already names that host.
        Some(h)
            if dest.authority().is_some_and(|a| a.as_str() == h)
                && dest.scheme().is_some()
                && dest.path_and_query().is_some() =>
        {
            dest
        }
        Some(h) => {
            let pq = dest.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            Uri::builder()
                .scheme(dest.scheme_str().unwrap_or("https"))
                .authority(h)
                .path_and_query(pq)
                .build()
                .map_err(|_| MapError::Dest)?
        }
        None => dest,
    };
    if let Some(v) = host_value {
        headers.try_insert(HOST, v).map_err(too_many)?;
    }
    if kind == ConnectionType::Websocket {
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

/// `HttpHeader:<Canonical-Name>` for a header name.
fn header_metadata_key(name: &HeaderName) -> String {
    let name = name.as_str().as_bytes();
    let mut key = Vec::with_capacity(HEADER_PREFIX.len() + 1 + name.len());
    key.extend_from_slice(HEADER_PREFIX.as_bytes());
    key.push(b':');
    let start = key.len();
    key.resize(start + name.len(), 0);
    write_canonical(name, &mut key[start..]);
    // A header name is ASCII, and so is its canonical form.
    String::from_utf8(key).unwrap_or_default()
}

/// `HttpStatus` then one `HttpHeader:<Canonical-Name>` entry per value.
pub fn response_metadata(status: StatusCode, headers: &http::HeaderMap) -> Vec<Metadata> {
    let mut out = Vec::with_capacity(headers.len() + 1);
    out.push(Metadata::new(STATUS, status.as_str()));
    for (name, value) in headers {
        out.push(Metadata::new(
            header_metadata_key(name),
            String::from_utf8_lossy(value.as_bytes()),
        ));
    }
    out
}

/// A mapped request head, whether a body follows it, and the stream type.
pub type RequestHead = (Request<()>, bool, ConnectionType);

/// Connector side: maps a received `ConnectRequest` message straight to a
/// request head (and whether a body follows, and the stream type), without
/// copying its metadata out first. The outer error is a message that cannot
/// be decoded (the stream is reset); the inner one a request that cannot be
/// served (answered with an error response).
pub fn decode_request_head(frame: &[u8]) -> Result<Result<RequestHead, MapError>, FrameError> {
    let msg = super::read_message(frame)?;
    let root: proto::connect_request::Reader<'_> = msg.get_root().map_err(super::decode_err)?;
    let dest = text(root.get_dest())?;
    let kind = match root.get_type().map_err(super::decode_err)? {
        proto::ConnectionType::Http => ConnectionType::Http,
        proto::ConnectionType::Websocket => ConnectionType::Websocket,
        proto::ConnectionType::Tcp => ConnectionType::Tcp,
    };
    let list = root.get_metadata().map_err(super::decode_err)?;
    let mapped = map_entries(list, |entries| map_request(dest, kind, entries))?;
    Ok(mapped.map(|(head, body)| (head, body, kind)))
}

/// Runs `map` over a message's metadata entries as borrowed text. A text that
/// does not decode stops the mapping and is reported as the frame error it
/// is, not as a mapping error.
fn map_entries<'a, T>(
    list: capnp::struct_list::Reader<'a, proto::metadata::Owned>,
    map: impl FnOnce(
        &mut dyn Iterator<Item = Result<(&'a str, &'a str), MapError>>,
    ) -> Result<T, MapError>,
) -> Result<Result<T, MapError>, FrameError> {
    let mut undecodable = None;
    let mut entries = list
        .iter()
        .map(|m| match (text(m.get_key()), text(m.get_val())) {
            (Ok(k), Ok(v)) => Ok((k, v)),
            (Err(e), _) | (_, Err(e)) => {
                undecodable = Some(e);
                Err(MapError::Status)
            }
        });
    let mapped = map(&mut entries);
    match undecodable {
        Some(e) => Err(e),
        None => Ok(mapped),
    }
}

fn text(t: capnp::Result<capnp::text::Reader<'_>>) -> Result<&str, FrameError> {
    t.map_err(super::decode_err)?
        .to_str()
        .map_err(super::decode_err)
}

/// Connector side: the `ConnectResponse` message (with its preamble) for a
/// response head, written straight from the header map: `HttpStatus`, then
/// one `HttpHeader:<Canonical-Name>` entry per value, as
/// [`response_metadata`] lists them.
pub fn encode_response_head(status: StatusCode, headers: &http::HeaderMap) -> Vec<u8> {
    let prefix = HEADER_PREFIX.len() + 1;
    // One segment for the whole message; a non-UTF-8 value may grow threefold
    // when it is made valid text.
    // 16: root, error text, list tag and the `HttpStatus` entry, with room to spare.
    let words = headers.iter().fold(16, |acc: usize, (name, value)| {
        let value_len = if value.as_bytes().is_ascii() {
            value.len()
        } else {
            value.len().saturating_mul(3)
        };
        acc.saturating_add(
            2 + (prefix + name.as_str().len() + 1).div_ceil(8) + (value_len + 1).div_ceil(8),
        )
    });
    let mut builder = super::builder(words);
    {
        let mut root: proto::connect_response::Builder<'_> = builder.init_root();
        root.set_error("");
        let mut list = root.init_metadata(u32::try_from(headers.len() + 1).unwrap_or(u32::MAX));
        let mut entry = list.reborrow().get(0);
        entry.set_key(STATUS);
        entry.set_val(status.as_str());
        for (i, (name, value)) in (1..list.len()).zip(headers) {
            let mut entry = list.reborrow().get(i);
            let name = name.as_str().as_bytes();
            let key = entry
                .reborrow()
                .init_key(u32::try_from(prefix + name.len()).unwrap_or(0))
                .as_bytes_mut();
            if key.len() == prefix + name.len() {
                let (head, tail) = key.split_at_mut(prefix);
                head[..prefix - 1].copy_from_slice(HEADER_PREFIX.as_bytes());
                head[prefix - 1] = b':';
                write_canonical(name, tail);
            }
            match std::str::from_utf8(value.as_bytes()) {
                Ok(v) => entry.set_val(v),
                Err(_) => entry.set_val(String::from_utf8_lossy(value.as_bytes()).as_ref()),
            }
        }
    }
    super::frame(&builder, &super::preamble())
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
            header_metadata_key(name),
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
    map_response(
        resp.metadata
            .iter()
            .map(|m| Ok((m.key.as_str(), m.val.as_str()))),
    )
}

fn map_response<'a>(
    metadata: impl Iterator<Item = Result<(&'a str, &'a str), MapError>>,
) -> Result<Response<()>, MapError> {
    let mut builder = Response::builder();
    let mut status = None;
    let mut count = 0usize;
    let headers = builder.headers_mut().ok_or(MapError::Status)?;
    *headers = http::HeaderMap::with_capacity(metadata.size_hint().0.min(64));
    for entry in metadata {
        let (key, val) = entry?;
        if key == STATUS {
            status = Some(StatusCode::from_bytes(val.as_bytes()).map_err(|_| MapError::Status)?);
        } else if let Some(name) = header_key(key) {
            let (name, value) = parse_header(name, val, &mut count)?;
            headers.try_append(name, value).map_err(too_many)?;
        }
    }
    builder
        .status(status.ok_or(MapError::Status)?)
        .body(())
        .map_err(|_| MapError::Status)
}

/// What a connector answered on a request stream.
#[derive(Debug)]
pub enum ConnectOutcome {
    /// The origin's (or the connector's own) response head.
    Head(Response<()>),
    /// The connector could not serve the request, for this reason.
    Refused(String),
}

/// Edge side: maps a received `ConnectResponse` message straight to a
/// response head, without copying its metadata out first. The outer error is
/// a message that cannot be decoded, the inner one metadata that does not
/// make a response head.
pub fn decode_response_head(frame: &[u8]) -> Result<Result<ConnectOutcome, MapError>, FrameError> {
    let msg = super::read_message(frame)?;
    let root: proto::connect_response::Reader<'_> = msg.get_root().map_err(super::decode_err)?;
    let error = text(root.get_error())?;
    if !error.is_empty() {
        return Ok(Ok(ConnectOutcome::Refused(error.to_owned())));
    }
    let list = root.get_metadata().map_err(super::decode_err)?;
    Ok(map_entries(list, |entries| map_response(entries))?.map(ConnectOutcome::Head))
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
    fn direct_paths_match_the_metadata_paths() {
        let req = ConnectRequest {
            dest: "https://app.example.com/p?q=1".into(),
            kind: ConnectionType::Http,
            metadata: vec![
                Metadata::new("HttpMethod", "POST"),
                Metadata::new("HttpHost", "app.example.com"),
                Metadata::new("HttpHeader:Content-Length", "3"),
                Metadata::new("HttpHeader:X-A", "1"),
                Metadata::new("HttpHeader:X-A", "2"),
                Metadata::new("Other:Key", "ignored"),
            ],
        };
        let frame = crate::stream::encode_connect_request(&req);
        let (head, body, kind) = decode_request_head(&frame[8..]).unwrap().unwrap();
        let (reference, ref_body) = request_from_connect(&req).unwrap();
        assert_eq!(head.uri(), reference.uri());
        assert_eq!(head.uri(), "https://app.example.com/p?q=1");
        assert_eq!(head.method(), reference.method());
        assert_eq!(head.headers(), reference.headers());
        assert_eq!((body, kind), (ref_body, ConnectionType::Http));

        // A request that cannot be served is a mapping error, not a frame error.
        let bad = ConnectRequest {
            metadata: vec![Metadata::new("HttpHeader:Bad Name", "x")],
            ..req
        };
        let frame = crate::stream::encode_connect_request(&bad);
        assert!(matches!(
            decode_request_head(&frame[8..]),
            Ok(Err(MapError::Header(_)))
        ));
        assert!(decode_request_head(&frame[8..frame.len() - 8]).is_err());

        let mut h = http::HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.insert(
            "x-long-header-name-of-some-length",
            HeaderValue::from_static(""),
        );
        h.insert("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let reference = crate::stream::encode_connect_response(&ConnectResponse {
            error: String::new(),
            metadata: response_metadata(StatusCode::CREATED, &h),
        });
        assert_eq!(encode_response_head(StatusCode::CREATED, &h), reference);

        // The edge reads that message straight back to the same head.
        match decode_response_head(&reference[8..]).unwrap().unwrap() {
            ConnectOutcome::Head(head) => {
                assert_eq!(head.status(), StatusCode::CREATED);
                let mut expected = h.clone();
                expected.insert("x-bytes", HeaderValue::from_str("caf\u{fffd}").unwrap());
                assert_eq!(head.headers(), &expected);
            }
            other => panic!("{other:?}"),
        }
        let refused = crate::stream::encode_connect_response(&ConnectResponse {
            error: "no route".into(),
            metadata: Vec::new(),
        });
        assert!(matches!(
            decode_response_head(&refused[8..]).unwrap().unwrap(),
            ConnectOutcome::Refused(e) if e == "no route"
        ));
        let no_status = crate::stream::encode_connect_response(&ConnectResponse::default());
        assert_eq!(
            decode_response_head(&no_status[8..]).unwrap().unwrap_err(),
            MapError::Status
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
