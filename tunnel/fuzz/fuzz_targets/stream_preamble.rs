//! QUIC request-stream preamble: signature, version, framed Cap'n Proto
//! `ConnectRequest` / `ConnectResponse`, and the mapping of their metadata to
//! and from HTTP heads.
//!
//! The first input byte picks how the rest is used:
//!
//! - `0`: the bytes are a whole request stream (signature, version, frame,
//!   body);
//! - `1`: the bytes follow a valid signature and version (so mutations go to
//!   the Cap'n Proto frame);
//! - `2`: the bytes are a framed `ConnectResponse`;
//! - `3`: the bytes describe a `ConnectRequest` and a `ConnectResponse`
//!   field by field, which are encoded and then decoded.
//!
//! Properties checked:
//!
//! - nothing panics on any input;
//! - [`stream::framed_len`] only reports aligned lengths within the cap;
//! - the in-memory parser and the async stream readers agree;
//! - whatever decodes re-encodes to bytes that decode to the same value, and
//!   encoding is stable (`encode(decode(encode(x))) == encode(x)`);
//! - a decoded request maps to an HTTP head consistent with its metadata
//!   (`Host` equals the URI authority, one header value per `HttpHeader:*`
//!   entry, body only with `Content-Length` or chunked encoding), and the
//!   edge-side mapping of that head maps back to the same head;
//! - a decoded response maps to an HTTP head whose metadata maps back to the
//!   same head.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use arbitrary::{Arbitrary, Unstructured};
use cftunnel_tunnel::stream::http_map::{
    self, connect_from_request, request_from_connect, response_from_connect, response_metadata, MapError,
    HEADER_PREFIX, HOST_KEY, MAX_HEADERS, METHOD, STATUS,
};
use cftunnel_tunnel::stream::{
    self, ConnectRequest, ConnectResponse, ConnectionType, Metadata, StreamKind, DATA_SIGNATURE,
    DATA_VERSION, MAX_MESSAGE_BYTES,
};
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => check_request_stream(rest),
        1 => {
            let mut bytes = preamble();
            bytes.extend_from_slice(rest);
            check_request_stream(&bytes);
        }
        2 => check_response_frame(rest),
        _ => {
            let mut u = Unstructured::new(rest);
            if let Ok(req) = build_request(&mut u) {
                check_encoded_request(&req);
            }
            if let Ok(resp) = build_response(&mut u) {
                let bytes = stream::encode_connect_response(&resp);
                if bytes.len() - 8 <= MAX_MESSAGE_BYTES {
                    check_response_frame(&bytes[8..]);
                }
            }
        }
    }
});

fn preamble() -> Vec<u8> {
    let mut p = DATA_SIGNATURE.to_vec();
    p.extend_from_slice(&DATA_VERSION);
    p
}

/// Runs a future that cannot wait (it only reads from a slice).
/// `bytes` in a buffer of its own, as a frame read off a stream is (the
/// allocator hands out word-aligned buffers, so this is read in place).
fn aligned(bytes: &[u8]) -> bytes::Bytes {
    bytes::Bytes::from(bytes.to_vec())
}

/// `bytes` one byte past a word boundary, so the decoder has to copy it.
fn unaligned(bytes: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.push(0);
    out.extend_from_slice(bytes);
    bytes::Bytes::from(out).slice(1..)
}

fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("reading from a slice returned Pending"),
    }
}

fn check_framed_len(buf: &[u8]) {
    if let Ok(Some(n)) = stream::framed_len(buf) {
        assert_eq!(n % 8, 0, "framed length {n} is not word aligned");
        assert!(
            n >= 8 && n <= MAX_MESSAGE_BYTES,
            "framed length {n} out of range"
        );
    }
}

fn check_request_stream(data: &[u8]) {
    check_framed_len(data);
    check_framed_len(data.get(8..).unwrap_or_default());
    let parsed = stream::parse_request_preamble(data);

    // The async readers the QUIC transport uses must agree with the parser.
    let mut r = data;
    let read = ready(async {
        match stream::read_signature(&mut r).await? {
            StreamKind::Data => {}
            StreamKind::Rpc => return Err(stream::FrameError::UnknownSignature),
        }
        stream::read_version(&mut r).await?;
        let frame = stream::read_frame(&mut r).await?;
        stream::decode_connect_request(&frame)
    });
    assert_eq!(
        parsed.as_ref().map(|(req, _)| req),
        read.as_ref(),
        "parser and stream reader disagree"
    );
    if let Ok((_, used)) = &parsed {
        assert_eq!(*used, data.len() - r.len(), "consumed lengths differ");
    }

    // The two-read data preamble reader agrees on every well-formed
    // stream (on a broken one it may name the fault differently).
    if let Ok((req, used)) = &parsed {
        let mut r = data;
        let read = ready(async {
            stream::read_signature(&mut r).await?;
            stream::decode_connect_request(&stream::read_data_preamble(&mut r).await?)
        });
        assert_eq!(read.as_ref(), Ok(req), "data preamble reader disagrees");
        assert_eq!(*used, data.len() - r.len(), "data preamble reader consumed differently");
    }

    // The connector maps the frame straight to a head; it must agree with
    // decoding first and mapping the decoded request.
    if let Some(frame) = data.get(8..).filter(|_| parsed.is_ok()) {
        let len = parsed.as_ref().map_or(0, |(_, used)| used - 8);
        // Read in place (word-aligned) and from a copy (not aligned).
        for frame in [aligned(&frame[..len]), unaligned(&frame[..len])] {
            let direct = http_map::decode_request_head(&frame);
            let reference = parsed
                .as_ref()
                .map(|(req, _)| request_from_connect(req).map(|(h, b)| (h, b, req.kind)));
            match (direct, reference) {
                (Ok(Ok((h1, b1, k1))), Ok(Ok((h2, b2, k2)))) => {
                    assert_eq!((h1.method(), h1.uri(), h1.headers()), (h2.method(), h2.uri(), h2.headers()));
                    assert_eq!((b1, k1), (b2, k2), "direct head mapping differs");
                }
                (Ok(Err(e1)), Ok(Err(e2))) => assert_eq!(e1, e2, "direct mapping error differs"),
                (d, r) => panic!("direct and reference mapping disagree: {d:?} vs {r:?}"),
            }
        }
    }

    if let Ok((req, used)) = parsed {
        assert!(used <= data.len());
        check_encoded_request(&req);
    }
}

/// `req` is a decoded (or freshly built) request: encode, decode, compare,
/// then check its HTTP mapping.
fn check_encoded_request(req: &ConnectRequest) {
    let bytes = stream::encode_connect_request(req);
    if bytes.len() - 8 > MAX_MESSAGE_BYTES {
        assert_eq!(
            stream::parse_request_preamble(&bytes).map(|_| ()),
            Err(stream::FrameError::TooLarge),
            "oversized request not rejected"
        );
        return;
    }
    let (back, used) = match stream::parse_request_preamble(&bytes) {
        Ok(v) => v,
        Err(e) => panic!("encoded request does not parse: {e}"),
    };
    assert_eq!(used, bytes.len(), "encoded preamble not consumed exactly");
    assert_eq!(&back, req, "request changed through encode/decode");
    assert_eq!(
        stream::encode_connect_request(&back),
        bytes,
        "re-encoding is not stable"
    );
    check_request_mapping(req);
}

fn header_name(key: &str) -> Option<&str> {
    let mut parts = key.split(':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(HEADER_PREFIX), Some(name), None) => Some(name),
        _ => None,
    }
}

fn header_entries(metadata: &[Metadata]) -> usize {
    metadata
        .iter()
        .filter(|m| header_name(&m.key).is_some())
        .count()
}

fn check_request_mapping(req: &ConnectRequest) {
    let mapped = request_from_connect(req);
    if req.kind != ConnectionType::Tcp {
        // Over the limit is always refused; an earlier bad entry may be what
        // is reported.
        if matches!(mapped, Err(MapError::TooManyHeaders)) {
            assert!(header_entries(&req.metadata) > MAX_HEADERS, "header limit");
        }
        if header_entries(&req.metadata) > MAX_HEADERS {
            assert!(mapped.is_err(), "header limit");
        }
    }
    let Ok((head, has_body)) = mapped else {
        return;
    };
    assert_ne!(req.kind, ConnectionType::Tcp, "TCP streams are not mapped");
    let headers = head.headers();

    // Host and URI authority agree.
    match (headers.get(HOST), head.uri().authority()) {
        (Some(h), Some(a)) => assert_eq!(h.as_bytes(), a.as_str().as_bytes()),
        (None, None) => {}
        (h, a) => panic!("Host {h:?} and authority {a:?} disagree"),
    }
    assert_eq!(
        headers.get_all(HOST).iter().count(),
        usize::from(headers.contains_key(HOST))
    );

    // One header value per `HttpHeader:*` entry (except Host, which comes
    // from `HttpHost`), plus the connector's WebSocket headers.
    let entries: Vec<(&str, &str)> = req
        .metadata
        .iter()
        .filter_map(|m| header_name(&m.key).map(|n| (n, m.val.as_str())))
        .filter(|(n, _)| !n.eq_ignore_ascii_case("host"))
        .collect();
    for (name, val) in &entries {
        assert!(
            headers
                .get_all(*name)
                .iter()
                .any(|v| v.as_bytes() == val.as_bytes())
                || (req.kind == ConnectionType::Websocket
                    && ["connection", "upgrade"]
                        .iter()
                        .any(|w| name.eq_ignore_ascii_case(w))),
            "header {name}: {val:?} lost"
        );
    }
    match req.kind {
        ConnectionType::Http => {
            assert_eq!(
                headers.len(),
                entries.len() + usize::from(headers.contains_key(HOST)),
                "header count differs from the metadata"
            );
            let expect_body = entries.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case(CONTENT_LENGTH.as_str())
                    || (n.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str())
                        && v.to_ascii_lowercase().contains("chunked"))
            });
            assert_eq!(has_body, expect_body, "body detection");
        }
        ConnectionType::Websocket => {
            assert!(!has_body, "WebSocket requests have no body");
            assert_eq!(headers["upgrade"], "websocket");
            assert_eq!(headers["connection"], "Upgrade");
            assert!(headers.contains_key("sec-websocket-version"));
        }
        ConnectionType::Tcp => unreachable!(),
    }

    // The edge's mapping of this head maps back to the same head, for the
    // absolute `https://host/path` requests the edge sends.
    let uri = head.uri();
    let edge_shaped = uri.scheme_str() == Some("https")
        && uri.authority().is_some()
        && uri.path().starts_with('/');
    // The edge writes a head's request message straight from the head; it is
    // byte for byte the message built from its metadata.
    let (parts, ()) = head.clone().into_parts();
    assert_eq!(
        http_map::encode_request_head(&parts, req.kind),
        stream::encode_connect_request(&connect_from_request(&parts, req.kind)),
        "direct request encoding differs"
    );
    if edge_shaped {
        let again = connect_from_request(&parts, req.kind);
        let (head2, has_body2) = match request_from_connect(&again) {
            Ok(v) => v,
            Err(e) => panic!("edge mapping of {head:?} does not map back: {e} ({again:?})"),
        };
        assert_eq!(head2.method(), head.method());
        assert_eq!(head2.uri(), head.uri());
        assert_eq!(head2.headers(), head.headers());
        assert_eq!(has_body2, has_body);
    }
}

fn check_response_frame(frame: &[u8]) {
    check_framed_len(frame);
    let decoded = stream::decode_connect_response(frame);

    // The async reader over a full preamble agrees with the in-memory decoder
    // whenever the frame is exactly as long as its framing header says.
    if let Ok(Some(n)) = stream::framed_len(frame) {
        if let Some(exact) = frame.get(..n) {
            let mut bytes = preamble();
            bytes.extend_from_slice(exact);
            let read = ready(stream::read_response_preamble(&mut bytes.as_slice()));
            let direct = stream::decode_connect_response(exact);
            assert_eq!(read, direct, "stream reader and decoder disagree");
        }
    }

    let Ok(resp) = decoded else {
        return;
    };
    let bytes = stream::encode_connect_response(&resp);
    if bytes.len() - 8 > MAX_MESSAGE_BYTES {
        // Decoding is bounded by the traversal limit only; the stream reader
        // enforces the size cap.
        return;
    }
    assert_eq!(&bytes[..8], preamble().as_slice());
    assert_eq!(stream::framed_len(&bytes[8..]), Ok(Some(bytes.len() - 8)));
    let back = match stream::decode_connect_response(&bytes[8..]) {
        Ok(v) => v,
        Err(e) => panic!("encoded response does not decode: {e}"),
    };
    assert_eq!(back, resp, "response changed through encode/decode");
    assert_eq!(
        ready(stream::read_response_preamble(&mut bytes.as_slice())),
        Ok(resp.clone())
    );
    assert_eq!(
        stream::encode_connect_response(&back),
        bytes,
        "re-encoding is not stable"
    );

    // Edge side: response head -> connector-side metadata -> same head.
    let mapped = response_from_connect(&resp);
    if matches!(mapped, Err(MapError::TooManyHeaders)) {
        assert!(header_entries(&resp.metadata) > MAX_HEADERS, "header limit");
    }
    if header_entries(&resp.metadata) > MAX_HEADERS {
        assert!(mapped.is_err(), "header limit");
    }

    // The edge maps the frame straight to a head; it must agree with decoding
    // first and mapping the decoded response.
    for frame in [aligned(&bytes[8..]), unaligned(&bytes[8..])] {
        match (http_map::decode_response_head(&frame), &mapped) {
            (Ok(Ok(http_map::ConnectOutcome::Refused(e))), _) => assert_eq!(e, resp.error),
            (Ok(Ok(http_map::ConnectOutcome::Head(h1))), Ok(h2)) => {
                assert!(resp.error.is_empty());
                assert_eq!((h1.status(), h1.headers()), (h2.status(), h2.headers()));
            }
            (Ok(Err(e1)), Err(e2)) => assert_eq!(&e1, e2, "direct mapping error differs"),
            (d, r) => panic!("direct and reference response mapping disagree: {d:?} vs {r:?}"),
        }
    }
    if let Ok(head) = mapped {
        let md = response_metadata(head.status(), head.headers());
        let reference = stream::encode_connect_response(&ConnectResponse {
            error: String::new(),
            metadata: md.clone(),
        });
        assert_eq!(
            http_map::encode_response_head(head.status(), head.headers()),
            reference,
            "direct response encoding differs"
        );
        assert_eq!(
            md.first(),
            Some(&Metadata::new(STATUS, head.status().as_str()))
        );
        let again = ConnectResponse {
            error: resp.error.clone(),
            metadata: md,
        };
        let head2 = match response_from_connect(&again) {
            Ok(v) => v,
            Err(e) => panic!("response metadata does not map back: {e}"),
        };
        assert_eq!(head2.status(), head.status());
        assert_eq!(head2.headers(), head.headers());
    }
}

#[derive(Arbitrary, Debug)]
enum Kind {
    Http,
    Websocket,
    Tcp,
}

/// Metadata keys the mapping treats specially, so generated requests hit
/// them often.
#[derive(Arbitrary, Debug)]
enum Key {
    Method,
    Host,
    Status,
    Header(String),
    Raw(String),
}

impl Key {
    fn render(self) -> String {
        match self {
            Key::Method => METHOD.to_owned(),
            Key::Host => HOST_KEY.to_owned(),
            Key::Status => STATUS.to_owned(),
            Key::Header(name) => format!("{HEADER_PREFIX}:{name}"),
            Key::Raw(key) => key,
        }
    }
}

fn build_metadata(u: &mut Unstructured<'_>) -> arbitrary::Result<Vec<Metadata>> {
    let mut metadata = Vec::new();
    for entry in u.arbitrary_iter::<(Key, String)>()? {
        let (key, val) = entry?;
        metadata.push(Metadata::new(key.render(), val));
    }
    Ok(metadata)
}

fn build_request(u: &mut Unstructured<'_>) -> arbitrary::Result<ConnectRequest> {
    let dest: String = u.arbitrary()?;
    let kind = match u.arbitrary::<Kind>()? {
        Kind::Http => ConnectionType::Http,
        Kind::Websocket => ConnectionType::Websocket,
        Kind::Tcp => ConnectionType::Tcp,
    };
    let metadata = build_metadata(u)?;
    Ok(ConnectRequest {
        dest,
        kind,
        metadata,
    })
}

fn build_response(u: &mut Unstructured<'_>) -> arbitrary::Result<ConnectResponse> {
    Ok(ConnectResponse {
        error: u.arbitrary()?,
        metadata: build_metadata(u)?,
    })
}
