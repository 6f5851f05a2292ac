//! Mapping between `ConnectRequest`/`ConnectResponse` metadata and `http`
//! request and response heads (QUIC transport).

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Response, StatusCode, Uri};

use bytes::Bytes;

use super::flat::{self, Flat, Writer};
use super::headers::{header_name, write_canonical};
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
    /// `HttpMethod` is not a method (missing or empty is a GET).
    #[error("invalid HttpMethod")]
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
    /// A TCP (private network) stream: this connector serves HTTP and WebSocket only.
    #[error("private network (TCP) streams are not served by this connector")]
    Unsupported,
}

fn header_key(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(HEADER_PREFIX.as_bytes())?
        .strip_prefix(b":")
        .filter(|name| !name.contains(&b':'))
}

/// A `Content-Length` value as the service will be given it: decimal digits
/// only.
pub(crate) fn parse_content_length(val: &[u8]) -> Option<u64> {
    std::str::from_utf8(val).ok()?.parse().ok()
}

/// One `HttpHeader:<name>` entry, counted against [`MAX_HEADERS`]. A value
/// that lies inside `frame` (the received message) shares its bytes instead
/// of being copied.
fn parse_header(
    name: &[u8],
    val: &[u8],
    frame: &Bytes,
    count: &mut usize,
) -> Result<(HeaderName, HeaderValue), MapError> {
    parse_parsed_header(header_name(name), name, val, frame, count)
}

/// [`parse_header`] with the name already parsed (`parsed`).
fn parse_parsed_header(
    parsed: Result<HeaderName, http::header::InvalidHeaderName>,
    name: &[u8],
    val: &[u8],
    frame: &Bytes,
    count: &mut usize,
) -> Result<(HeaderName, HeaderValue), MapError> {
    *count += 1;
    if *count > MAX_HEADERS {
        return Err(MapError::TooManyHeaders);
    }
    let name = parsed.map_err(|_| MapError::Header(String::from_utf8_lossy(name).into_owned()))?;
    let value = match frame_range(frame, val) {
        Some(range) => HeaderValue::from_maybe_shared(frame.slice(range)),
        None => HeaderValue::from_bytes(val),
    }
    .map_err(|_| MapError::Header(name.as_str().to_owned()))?;
    Ok((name, value))
}

/// Where `part` lies in `frame`, if it is a slice of it.
fn frame_range(frame: &Bytes, part: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(frame.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= frame.len()).then_some(start..end)
}

fn too_many(_: http::header::MaxSizeReached) -> MapError {
    MapError::TooManyHeaders
}

/// Builds the request head for a `ConnectRequest`. Returns the head and
/// whether a body follows on the stream (only when `Content-Length` or a
/// chunked `Transfer-Encoding` is present, as the edge expects).
pub fn request_from_connect(req: &ConnectRequest) -> Result<(Request<()>, bool), MapError> {
    map_request(
        &Bytes::new(),
        req.dest.as_bytes(),
        req.kind,
        req.metadata
            .iter()
            .map(|m| Ok((m.key.as_bytes(), m.val.as_bytes()))),
    )
}

/// [`request_from_connect`] over borrowed metadata entries, so the connector
/// can map a request straight from the received message.
pub(super) fn map_request<'a>(
    frame: &Bytes,
    dest: &[u8],
    kind: ConnectionType,
    metadata: impl Iterator<Item = Result<(&'a [u8], &'a [u8]), MapError>>,
) -> Result<(Request<()>, bool), MapError> {
    if kind == ConnectionType::Tcp {
        return Err(MapError::Unsupported);
    }
    let mut method = None;
    let mut host = None;
    let mut has_body = false;
    let mut count = 0usize;
    // Sized once for the usual head instead of grown and rehashed as entries arrive.
    let mut headers = http::HeaderMap::with_capacity(metadata.size_hint().0.min(64));
    for entry in metadata {
        let (key, val) = entry?;
        if key == METHOD.as_bytes() {
            if !val.is_empty() {
                method = Some(Method::from_bytes(val).map_err(|_| MapError::Method)?);
            }
        } else if key == HOST_KEY.as_bytes() {
            host = Some(val);
        } else if let Some(name) = key
            .strip_prefix(HEADER_PREFIX.as_bytes())
            .and_then(|k| k.strip_prefix(b":"))
        {
            let parsed = header_name(name);
            // A key that does not split into two parts on `:` is refused as malformed, as
            // `cloudflared` refuses it. No header name holds a `:`, so only a name that
            // does not parse is searched for one.
            if parsed.is_err() && name.contains(&b':') {
                return Err(MapError::Header(String::from_utf8_lossy(key).into_owned()));
            }
            let (name, value) = parse_parsed_header(parsed, name, val, frame, &mut count)?;
            if name == HOST {
                continue;
            }
            if name == CONTENT_LENGTH {
                // `cloudflared` refuses a length it cannot parse rather than
                // guess where the body ends.
                if parse_content_length(val).is_none() {
                    return Err(MapError::Header(name.as_str().to_owned()));
                }
                has_body = true;
            } else if name == TRANSFER_ENCODING
                && val.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))
            {
                has_body = true;
            }
            headers.try_append(name, value).map_err(too_many)?;
        }
    }
    let dest = parse_dest(frame, dest)?;
    // Entries are text, so the host is too.
    let host = host
        .and_then(|h| std::str::from_utf8(h).ok())
        .filter(|h| !h.is_empty())
        .or_else(|| dest.authority().map(|a| a.as_str()))
        .filter(|h| !h.is_empty());
    let host_value = match host {
        Some(h) => Some(host_value(frame, h).ok_or_else(|| MapError::Header("host".into()))?),
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
        super::origin::try_add_websocket_headers(&mut headers).map_err(too_many)?;
        has_body = false;
    }
    // Set in place: `Request::builder` moves the whole head through every step.
    let mut req = Request::new(());
    // No method is a GET, as Go's `http.NewRequest` reads an empty one.
    *req.method_mut() = method.unwrap_or(Method::GET);
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok((req, has_body))
}

/// The `Host` value for `host`, sharing the received message's bytes when `host` lies in
/// `frame`; either way `http`'s own check of a value decides what is taken.
fn host_value(frame: &Bytes, host: &str) -> Option<HeaderValue> {
    match frame_range(frame, host.as_bytes()) {
        Some(range) => HeaderValue::from_maybe_shared(frame.slice(range)).ok(),
        None => HeaderValue::from_str(host).ok(),
    }
}

/// Whether `dest` is parsed as it came: printable ASCII with none of the bytes
/// [`parse_dest_copied`] may have to encode or cut (a space, `<`, `>`, `"`, a backtick, `#`), which
/// is what the edge sends. Any other `dest` takes the long way, which gives the same
/// result for this one.
fn plain_dest(dest: &[u8]) -> bool {
    dest.iter()
        .all(|&b| (b'!'..=b'~').contains(&b) && !matches!(b, b'<' | b'>' | b'"' | b'`' | b'#'))
}

/// `dest` as a URI, sharing the received message's bytes when `dest` lies in `frame` and
/// needs no encoding; see [`parse_dest_copied`].
fn parse_dest(frame: &Bytes, dest: &[u8]) -> Result<Uri, MapError> {
    if plain_dest(dest) {
        if let Some(range) = frame_range(frame, dest) {
            return Uri::from_maybe_shared(frame.slice(range)).map_err(|_| MapError::Dest);
        }
    }
    parse_dest_copied(dest)
}

/// `dest` as a URI. `cloudflared` builds the request with Go's URL parser, which takes bytes
/// in a path or query that [`Uri`] refuses: a space, `<`, `>` and a backtick in the path, a
/// space, `"`, `<` and `>` in the query, and bytes that are not UTF-8. Those bytes are
/// percent-encoded first, as Go writes such a path to the origin; the rest of the URL is
/// kept as it came (a fragment, which the request does not carry, is dropped). Control
/// characters are refused, as Go refuses them ("invalid control character in URL"). Only a
/// `dest` that needs encoding is copied.
fn parse_dest_copied(dest: &[u8]) -> Result<Uri, MapError> {
    if dest.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(MapError::Dest);
    }
    let start = target_start(dest);
    let end = dest[start..]
        .iter()
        .position(|&b| b == b'#')
        .map_or(dest.len(), |i| start + i);
    let target = &dest[start..end];
    if let Ok(dest) = std::str::from_utf8(dest) {
        if !target
            .iter()
            .scan(false, in_query)
            .any(|(b, q)| escaped(b, q))
        {
            return dest.parse().map_err(|_| MapError::Dest);
        }
    }
    let mut out = Vec::with_capacity(end + 32);
    out.extend_from_slice(&dest[..start]);
    let mut query = false;
    for chunk in target.utf8_chunks() {
        for &b in chunk.valid().as_bytes() {
            query |= b == b'?';
            if escaped(b, query) {
                percent_encode(b, &mut out);
            } else {
                out.push(b);
            }
        }
        for &b in chunk.invalid() {
            percent_encode(b, &mut out);
        }
    }
    // Only the part before the target can still be other than UTF-8.
    let out = String::from_utf8(out).map_err(|_| MapError::Dest)?;
    out.parse().map_err(|_| MapError::Dest)
}

/// Where the path (or query) of `dest` starts: at once for a path, after the
/// authority of an absolute URL, nowhere (its length) for any other form.
fn target_start(dest: &[u8]) -> usize {
    if dest.first().is_some_and(|&b| b == b'/' || b == b'?') {
        return 0;
    }
    let Some(authority) = dest.windows(3).position(|w| w == b"://").map(|i| i + 3) else {
        return dest.len();
    };
    dest[authority..]
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .map_or(dest.len(), |i| authority + i)
}

/// For `scan`: each byte with whether it is in the query (from the first `?` on).
fn in_query(query: &mut bool, b: &u8) -> Option<(u8, bool)> {
    *query |= *b == b'?';
    Some((*b, *query))
}

/// An ASCII byte Go's URL parser takes in a path (or query) and [`Uri`] refuses there;
/// bytes above 0x7F are left to the UTF-8 check.
fn escaped(b: u8, query: bool) -> bool {
    match b {
        b' ' | b'<' | b'>' => true,
        b'"' => query,
        b'`' => !query,
        _ => false,
    }
}

fn percent_encode(b: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
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

/// `HttpStatus` then one `HttpHeader:<Canonical-Name>` entry per value
/// (`Transfer-Encoding` left out).
pub fn response_metadata(status: StatusCode, headers: &http::HeaderMap) -> Vec<Metadata> {
    let mut out = Vec::with_capacity(headers.len() + 1);
    out.push(Metadata::new(STATUS, status.as_str()));
    for (name, value) in response_entries(headers) {
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
pub fn decode_request_head(frame: &Bytes) -> Result<Result<RequestHead, MapError>, FrameError> {
    if let Some(mapped) = decode_plain_request_head(frame) {
        return Ok(mapped);
    }
    let mut copy = Vec::new();
    let msg = super::read_message_in_place(frame, &mut copy)?;
    let root: proto::connect_request::Reader<'_> = msg.get_root().map_err(super::decode_err)?;
    // As bytes: Go's URL parser takes a `dest` that is not UTF-8 (see `parse_dest`).
    let dest = text_bytes(root.get_dest())?;
    let kind = root.get_type().map_err(super::decode_err)?.into();
    let list = root.get_metadata().map_err(super::decode_err)?;
    let mapped = map_entries(list, |entries| map_request(frame, dest, kind, entries))?;
    Ok(mapped.map(|(head, body)| (head, body, kind)))
}

/// [`decode_request_head`] for a single-segment message of which `segment` holds the
/// segment alone, as the connector reads it off a stream (the segment table read apart).
pub fn decode_request_segment(
    segment: &Bytes,
) -> Result<Result<RequestHead, MapError>, FrameError> {
    if let Some(mapped) = Flat::segment(segment, super::TRAVERSAL_LIMIT_WORDS)
        .and_then(|flat| decode_plain_request(flat, segment))
    {
        return Ok(mapped);
    }
    // Any other message goes to `capnp`, its segment table put back.
    let words = u32::try_from(segment.len() / 8).map_err(|_| FrameError::TooLarge)?;
    let mut frame = Vec::with_capacity(8 + segment.len());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&words.to_le_bytes());
    frame.extend_from_slice(segment);
    decode_request_head(&Bytes::from(frame))
}

/// [`decode_request_head`] for the plain messages [`flat`] reads; `None` for
/// any other message.
fn decode_plain_request_head(frame: &Bytes) -> Option<Result<RequestHead, MapError>> {
    decode_plain_request(Flat::new(frame, super::TRAVERSAL_LIMIT_WORDS)?, frame)
}

/// The request head a plain message holds; its texts lie in `frame`.
fn decode_plain_request(
    mut flat: Flat<'_>,
    frame: &Bytes,
) -> Option<Result<RequestHead, MapError>> {
    let root = flat.root()?;
    let kind = proto::ConnectionType::try_from(flat.u16_field(root)?)
        .ok()?
        .into();
    let dest = flat.text(root, 0)?;
    let list = flat.struct_list(root, 1)?;
    let entries = flat::metadata(&mut flat, list)?;
    let mapped = map_request(frame, dest, kind, entries.into_iter().map(Ok));
    Some(mapped.map(|(head, body)| (head, body, kind)))
}

/// [`decode_response_head`] for the plain messages [`flat`] reads; `None`
/// for any other message.
fn decode_plain_response_head(frame: &Bytes) -> Option<Result<ConnectOutcome, MapError>> {
    let mut flat = Flat::new(frame, super::TRAVERSAL_LIMIT_WORDS)?;
    let root = flat.root()?;
    let error = flat.text(root, 0)?;
    if !error.is_empty() {
        let error = std::str::from_utf8(error).ok()?;
        return Some(Ok(ConnectOutcome::Refused(error.to_owned())));
    }
    let list = flat.struct_list(root, 1)?;
    let entries = flat::metadata(&mut flat, list)?;
    Some(map_response(frame, entries.into_iter().map(Ok)).map(ConnectOutcome::Head))
}

/// Runs `map` over a message's metadata entries as borrowed bytes. A text that
/// does not decode stops the mapping and is reported as the frame error it
/// is, not as a mapping error. Entries are taken as the bytes they are, not
/// checked for UTF-8: Go peers (`cloudflared`, the edge) copy header bytes
/// into `Text` fields as they come, and HTTP allows bytes above 0x7F in values.
fn map_entries<'a, T>(
    list: capnp::struct_list::Reader<'a, proto::metadata::Owned>,
    map: impl FnOnce(
        &mut dyn Iterator<Item = Result<(&'a [u8], &'a [u8]), MapError>>,
    ) -> Result<T, MapError>,
) -> Result<Result<T, MapError>, FrameError> {
    let mut undecodable = None;
    let mut entries =
        list.iter().map(
            |m| match (text_bytes(m.get_key()), text_bytes(m.get_val())) {
                (Ok(k), Ok(v)) => Ok((k, v)),
                (Err(e), _) | (_, Err(e)) => {
                    undecodable = Some(e);
                    Err(MapError::Status)
                }
            },
        );
    let mapped = map(&mut entries);
    match undecodable {
        Some(e) => Err(e),
        None => Ok(mapped),
    }
}

fn text_bytes(t: capnp::Result<capnp::text::Reader<'_>>) -> Result<&[u8], FrameError> {
    t.map(capnp::text::Reader::as_bytes)
        .map_err(super::decode_err)
}

fn text(t: capnp::Result<capnp::text::Reader<'_>>) -> Result<&str, FrameError> {
    t.map_err(super::decode_err)?
        .to_str()
        .map_err(super::decode_err)
}

/// Words one `HttpHeader:<Canonical-Name>` entry's texts take.
fn header_entry_words(name: &HeaderName, value_len: usize) -> usize {
    flat::text_words(HEADER_PREFIX.len() + 1 + name.as_str().len()) + flat::text_words(value_len)
}

/// Writes one `HttpHeader:<Canonical-Name>` entry.
fn write_header_entry(w: &mut Writer, entry: flat::Struct, name: &HeaderName, value: &[u8]) {
    let name = name.as_str().as_bytes();
    let key = w.text(entry, 0, &[HEADER_PREFIX.as_bytes(), b":", name]);
    if let Some(canonical) = key.get_mut(HEADER_PREFIX.len() + 1..) {
        write_canonical(name, canonical);
    }
    w.text(entry, 1, &[value]);
}

/// Above this many words a head is built with `capnp` (which would split
/// it into segments); no real head comes near it.
const FLAT_WORDS: usize = 1 << 24;

/// Connector side: the `ConnectResponse` message (with its preamble) for a
/// response head, written straight from the header map: `HttpStatus`, then
/// one `HttpHeader:<Canonical-Name>` entry per value, its bytes as they are
/// (as `cloudflared` copies them); for UTF-8 values byte for byte what
/// [`response_metadata`] and [`super::encode_connect_response`] produce
/// (their [`Metadata`] strings hold any other value made valid).
pub fn encode_response_head(status: StatusCode, headers: &http::HeaderMap) -> Vec<u8> {
    let sent = headers.len() - headers.get_all(TRANSFER_ENCODING).iter().count();
    // Root pointer, root struct, `error`, list tag, the `HttpStatus` entry,
    // then each value.
    let words = response_entries(headers).fold(
        1 + 2 + 1 + 1 + 2 + flat::text_words(STATUS.len()) + flat::text_words(3),
        |acc: usize, (n, v)| acc.saturating_add(2 + header_entry_words(n, v.len())),
    );
    if words > FLAT_WORDS {
        return super::encode_connect_response(&super::ConnectResponse {
            error: String::new(),
            metadata: response_metadata(status, headers),
        });
    }
    let mut w = Writer::new(&super::preamble(), words);
    let root = w.root(0, 2);
    w.text(root, 0, &[]);
    let list = w.pair_list(root, 1, sent + 1);
    let first = list.get(0);
    w.text(first, 0, &[STATUS.as_bytes()]);
    w.text(first, 1, &[status.as_str().as_bytes()]);
    for (i, (name, value)) in response_entries(headers).enumerate() {
        write_header_entry(&mut w, list.get(i + 1), name, value.as_bytes());
    }
    w.finish()
}

/// The response headers the edge is sent: all but `Transfer-Encoding`, which
/// describes a framing the stream does not use (the body is the stream's bytes
/// up to its end) and which Go's HTTP client never leaves in `cloudflared`'s.
fn response_entries(
    headers: &http::HeaderMap,
) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    headers.iter().filter(|(n, _)| *n != TRANSFER_ENCODING)
}

/// The host the edge names for a request (its `Host`, else the URI's
/// authority) and its path and query.
fn host_and_target(parts: &http::request::Parts) -> (&str, &str) {
    let host = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()))
        .unwrap_or_default();
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    (host, pq)
}

/// Scheme of the `dest` URL the edge sends.
const DEST_SCHEME: &str = "https://";

/// Edge side: the request stream's preamble and `ConnectRequest` for an
/// eyeball request, written straight from its head, header bytes as they are;
/// for UTF-8 values byte for byte what [`connect_from_request`] and
/// [`super::encode_connect_request`] produce.
pub fn encode_request_head(parts: &http::request::Parts, kind: ConnectionType) -> Vec<u8> {
    let (host, pq) = host_and_target(parts);
    let method = parts.method.as_str();
    let mut values = Vec::with_capacity(parts.headers.len());
    values.extend(
        parts
            .headers
            .iter()
            .filter(|(name, _)| *name != HOST)
            .map(|(n, v)| (n, v.as_bytes())),
    );
    // Root pointer, root struct, dest, list tag, method and host entries.
    let fixed = 1
        + 3
        + flat::text_words(DEST_SCHEME.len() + host.len() + pq.len())
        + 1
        + 2
        + flat::text_words(METHOD.len())
        + flat::text_words(method.len())
        + 2
        + flat::text_words(HOST_KEY.len())
        + flat::text_words(host.len());
    let words = values.iter().fold(fixed, |acc: usize, (n, v)| {
        acc.saturating_add(2 + header_entry_words(n, v.len()))
    });
    if words > FLAT_WORDS {
        return super::encode_connect_request(&connect_from_request(parts, kind));
    }
    let mut w = Writer::new(&super::preamble(), words);
    let root = w.root(1, 2);
    w.text(
        root,
        0,
        &[DEST_SCHEME.as_bytes(), host.as_bytes(), pq.as_bytes()],
    );
    w.set_u16(root, proto::ConnectionType::from(kind).into());
    let list = w.pair_list(root, 1, values.len() + 2);
    let entry = list.get(0);
    w.text(entry, 0, &[METHOD.as_bytes()]);
    w.text(entry, 1, &[method.as_bytes()]);
    let entry = list.get(1);
    w.text(entry, 0, &[HOST_KEY.as_bytes()]);
    w.text(entry, 1, &[host.as_bytes()]);
    for (i, (name, value)) in values.iter().enumerate() {
        write_header_entry(&mut w, list.get(i + 2), name, value);
    }
    w.finish()
}

/// Edge side: describes an eyeball request for the connector.
pub fn connect_from_request(parts: &http::request::Parts, kind: ConnectionType) -> ConnectRequest {
    let (host, pq) = host_and_target(parts);
    let mut metadata = Vec::with_capacity(parts.headers.len() + 2);
    metadata.push(Metadata::new(METHOD, parts.method.as_str()));
    metadata.push(Metadata::new(HOST_KEY, host));
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
        &Bytes::new(),
        resp.metadata
            .iter()
            .map(|m| Ok((m.key.as_bytes(), m.val.as_bytes()))),
    )
}

fn map_response<'a>(
    frame: &Bytes,
    metadata: impl Iterator<Item = Result<(&'a [u8], &'a [u8]), MapError>>,
) -> Result<Response<()>, MapError> {
    let mut builder = Response::builder();
    let mut status = None;
    let mut count = 0usize;
    let headers = builder.headers_mut().ok_or(MapError::Status)?;
    *headers = http::HeaderMap::with_capacity(metadata.size_hint().0.min(64));
    for entry in metadata {
        let (key, val) = entry?;
        if key == STATUS.as_bytes() {
            status = Some(StatusCode::from_bytes(val).map_err(|_| MapError::Status)?);
        } else if let Some(name) = header_key(key) {
            let (name, value) = parse_header(name, val, frame, &mut count)?;
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
pub fn decode_response_head(frame: &Bytes) -> Result<Result<ConnectOutcome, MapError>, FrameError> {
    if let Some(mapped) = decode_plain_response_head(frame) {
        return Ok(mapped);
    }
    let mut copy = Vec::new();
    let msg = super::read_message_in_place(frame, &mut copy)?;
    let root: proto::connect_response::Reader<'_> = msg.get_root().map_err(super::decode_err)?;
    let error = text(root.get_error())?;
    if !error.is_empty() {
        return Ok(Ok(ConnectOutcome::Refused(error.to_owned())));
    }
    let list = root.get_metadata().map_err(super::decode_err)?;
    Ok(map_entries(list, |entries| map_response(frame, entries))?.map(ConnectOutcome::Head))
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

    /// Bytes Go's URL parser takes in a path or query and `Uri` does not are percent-encoded,
    /// in absolute and path-only `dest`s alike; what `Uri` takes is left as it came.
    #[test]
    fn dest_bytes_go_accepts_are_percent_encoded() {
        let cases: [(&[u8], &str); 9] = [
            (
                b"https://a.example/a b<c>`d?q=\"x y\"<>`",
                "https://a.example/a%20b%3Cc%3E%60d?q=%22x%20y%22%3C%3E`",
            ),
            (b"/a b?c d", "/a%20b?c%20d"),
            (
                b"https://a.example/j/{\"k\":1}|^\\?{|}^",
                "https://a.example/j/{\"k\":1}|^\\?{|}^",
            ),
            (
                "https://a.example/café?é".as_bytes(),
                "https://a.example/café?é",
            ),
            (
                b"https://a.example/caf\xe9?x=\xff",
                "https://a.example/caf%E9?x=%FF",
            ),
            (
                b"https://a.example/a%20b?x=%3C",
                "https://a.example/a%20b?x=%3C",
            ),
            (b"https://a.example/a b#frag <x>", "https://a.example/a%20b"),
            (b"https://a.example?q=<1>", "https://a.example/?q=%3C1%3E"),
            (b"https://a.example", "https://a.example/"),
        ];
        for (dest, expected) in cases {
            let uri = parse_dest(&Bytes::new(), dest);
            assert_eq!(
                uri.map(|u| u.to_string()),
                Ok(expected.to_owned()),
                "{}",
                String::from_utf8_lossy(dest)
            );
        }
    }

    /// A `Host` read where it lies in the received message is taken and refused as
    /// [`HeaderValue::from_str`] takes and refuses it.
    #[test]
    fn host_in_the_message_is_taken_as_from_str_takes_it() {
        for host in [
            "a.example",
            "a.example:8443",
            "a\tb",
            "a b",
            "a\x01b",
            "a\x7fb",
            "é.example",
            "",
        ] {
            let frame = Bytes::copy_from_slice(host.as_bytes());
            let Ok(in_frame) = std::str::from_utf8(&frame) else {
                unreachable!("copied from a str")
            };
            let expected = HeaderValue::from_str(host).ok();
            assert_eq!(host_value(&frame, in_frame), expected, "{host:?}");
            assert_eq!(host_value(&Bytes::new(), host), expected, "{host:?}");
        }
    }

    /// A `dest` read where it lies in the received message parses as a copied one does.
    #[test]
    fn dest_in_the_message_parses_as_a_copied_one() {
        for dest in [
            &b"https://a.example/p?q=1"[..],
            b"/p?q=1",
            b"https://a.example",
            b"https://a.example/j/{\"k\":1}|^\\?{|}^",
            b"https://a.example/a b?c",
            b"https://a.example/a#frag",
            b"https://a.example/a\x01b",
            b"https://a.ex ample/",
            b"http://[::1]:8080/x",
            b"",
        ] {
            let frame = Bytes::copy_from_slice(dest);
            assert_eq!(
                parse_dest(&frame, &frame).map(|u| u.to_string()),
                parse_dest_copied(dest).map(|u| u.to_string()),
                "{}",
                String::from_utf8_lossy(dest)
            );
        }
    }

    /// Control characters are refused anywhere in `dest`, as Go refuses them; so is a `dest`
    /// whose host is not UTF-8 or that is no URL at all.
    #[test]
    fn dest_control_characters_and_bad_hosts_are_refused() {
        for dest in [
            &b"https://a.example/a\x01b"[..],
            b"https://a.example/a\tb",
            b"https://a.example/a\x7fb",
            b"https://a.example/?q=\n",
            b"https://a.example/#\x00",
            b"/a\r\nb",
            b"https://a.ex\xffample/",
            b"https://a.ex ample/",
            b"",
        ] {
            assert_eq!(
                parse_dest(&Bytes::new(), dest).map(|u| u.to_string()),
                Err(MapError::Dest),
                "{}",
                String::from_utf8_lossy(dest)
            );
        }
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
        // A key that does not split into two parts on `:`, and a length that is
        // not a number, are refused as `cloudflared` refuses them.
        req.metadata = vec![Metadata::new("HttpHeader:X-A:B", "x")];
        assert_eq!(
            request_from_connect(&req).unwrap_err(),
            MapError::Header("HttpHeader:X-A:B".into())
        );
        req.metadata = vec![Metadata::new("HttpHeader:Content-Length", "12x")];
        assert_eq!(
            request_from_connect(&req).unwrap_err(),
            MapError::Header("content-length".into())
        );
        req.metadata = vec![Metadata::new("HttpMethod", "GE T")];
        assert_eq!(request_from_connect(&req).unwrap_err(), MapError::Method);
        // No method, or an empty one, is a GET, as Go reads it.
        for metadata in [vec![], vec![Metadata::new("HttpMethod", "")]] {
            req.metadata = metadata;
            let (head, has_body) = request_from_connect(&req).unwrap();
            assert_eq!((head.method(), has_body), (&Method::GET, false));
        }
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
        let in_place = Bytes::from(frame.clone()).slice(8..);
        let (head, body, kind) = decode_request_head(&in_place).unwrap().unwrap();
        let (reference, ref_body) = request_from_connect(&req).unwrap();
        assert_eq!(head.uri(), reference.uri());
        assert_eq!(head.uri(), "https://app.example.com/p?q=1");
        assert_eq!(head.method(), reference.method());
        assert_eq!(head.headers(), reference.headers());
        assert_eq!((body, kind), (ref_body, ConnectionType::Http));
        // Read in place, the values share the received frame instead of copying it.
        let value = head.headers()["x-a"].as_bytes();
        assert!(frame_range(&in_place, value).is_some(), "value was copied");

        // A frame that is not word-aligned is read from a copy, to the same head.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&frame[8..]);
        let unaligned = Bytes::from(shifted).slice(1..);
        assert!(!(unaligned.as_ptr() as usize).is_multiple_of(8));
        let (copied, body, kind) = decode_request_head(&unaligned).unwrap().unwrap();
        assert_eq!(
            (copied.method(), copied.uri(), copied.headers()),
            (head.method(), head.uri(), head.headers())
        );
        assert_eq!((body, kind), (ref_body, ConnectionType::Http));

        // A request that cannot be served is a mapping error, not a frame error.
        let bad = ConnectRequest {
            metadata: vec![Metadata::new("HttpHeader:Bad Name", "x")],
            ..req
        };
        let frame = Bytes::from(crate::stream::encode_connect_request(&bad));
        assert!(matches!(
            decode_request_head(&frame.slice(8..)),
            Ok(Err(MapError::Header(_)))
        ));
        assert!(decode_request_head(&frame.slice(8..frame.len() - 8)).is_err());

        let mut h = http::HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.insert(
            "x-long-header-name-of-some-length",
            HeaderValue::from_static(""),
        );
        let reference = crate::stream::encode_connect_response(&ConnectResponse {
            error: String::new(),
            metadata: response_metadata(StatusCode::CREATED, &h),
        });
        assert_eq!(encode_response_head(StatusCode::CREATED, &h), reference);

        // A Latin-1 value goes out as its bytes, as `cloudflared` sends it, and the
        // edge reads the message straight back to the same head, on either decoder.
        h.insert("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let encoded = Bytes::from(encode_response_head(StatusCode::CREATED, &h));
        assert!(encoded.windows(4).any(|w| w == b"caf\xe9"));
        let mut unaligned = vec![0u8];
        unaligned.extend_from_slice(&encoded[8..]);
        for frame in [encoded.slice(8..), Bytes::from(unaligned).slice(1..)] {
            match decode_response_head(&frame).unwrap().unwrap() {
                ConnectOutcome::Head(head) => {
                    assert_eq!(head.status(), StatusCode::CREATED);
                    assert_eq!(head.headers(), &h);
                }
                other => panic!("{other:?}"),
            }
        }
        // `Transfer-Encoding` describes a framing the stream does not use: it is
        // left out, in the direct writer and in the metadata alike.
        let mut chunked = h.clone();
        chunked.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let encoded = encode_response_head(StatusCode::CREATED, &chunked);
        assert_eq!(encoded, encode_response_head(StatusCode::CREATED, &h));
        assert!(!response_metadata(StatusCode::CREATED, &chunked)
            .iter()
            .any(|m| m.key.eq_ignore_ascii_case("HttpHeader:Transfer-Encoding")));
        let refused = crate::stream::encode_connect_response(&ConnectResponse {
            error: "no route".into(),
            metadata: Vec::new(),
        });
        assert!(matches!(
            decode_response_head(&Bytes::from(refused).slice(8..))
                .unwrap()
                .unwrap(),
            ConnectOutcome::Refused(e) if e == "no route"
        ));
        let no_status = crate::stream::encode_connect_response(&ConnectResponse::default());
        assert_eq!(
            decode_response_head(&Bytes::from(no_status).slice(8..))
                .unwrap()
                .unwrap_err(),
            MapError::Status
        );
    }

    #[test]
    fn request_heads_are_encoded_as_their_metadata_would_be() {
        let mut heads = Vec::new();
        let (parts, ()) = Request::get("https://app.example.com/api/items?page=2")
            .header("host", "app.example.com")
            .header("user-agent", "curl/8.5.0")
            .header("cf-ray", "8f2c3a9e1b7d4c21-MCK")
            .header("x-a", "1")
            .header("x-a", "2")
            .header("x-empty", "")
            .body(())
            .unwrap()
            .into_parts();
        heads.push((parts, ConnectionType::Http));
        // No Host header: the URI's authority names the host.
        let (parts, ()) = Request::post("http://origin.internal:8080/upload")
            .header("content-length", "3")
            .body(())
            .unwrap()
            .into_parts();
        heads.push((parts, ConnectionType::Http));
        // Two Host values, neither sent as a header; no path and query.
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        parts.uri = Uri::from_static("https://example.com");
        parts
            .headers
            .append(HOST, HeaderValue::from_static("a.example"));
        parts
            .headers
            .append(HOST, HeaderValue::from_static("b.example"));
        heads.push((parts, ConnectionType::Websocket));
        for (parts, kind) in &heads {
            assert_eq!(
                encode_request_head(parts, *kind),
                crate::stream::encode_connect_request(&connect_from_request(parts, *kind)),
                "{parts:?}"
            );
        }

        // A Latin-1 value (HTTP allows bytes above 0x7F) crosses as its bytes.
        let (parts, ()) = Request::get("https://app.example.com/")
            .header("x-bytes", HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .body(())
            .unwrap()
            .into_parts();
        let encoded = Bytes::from(encode_request_head(&parts, ConnectionType::Http));
        let (head, body, _) = decode_request_head(&encoded.slice(8..)).unwrap().unwrap();
        assert!(!body);
        assert_eq!(head.headers()["x-bytes"].as_bytes(), b"caf\xe9");
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
