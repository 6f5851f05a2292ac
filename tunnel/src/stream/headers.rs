//! HTTP/2 transport: the `cf-cloudflared-response-headers` serialisation
//! (`b64(name) ":" b64(value)` pairs joined by `;`, standard alphabet without
//! padding, Go canonical names, one pair per value) and Go header-name case.

use cftunnel_config::hop_by_hop::is_hop_by_hop;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Name of the response header carrying the serialised origin headers.
pub const RESPONSE_HEADERS: &str = "cf-cloudflared-response-headers";
/// Name of the response header telling who produced the response.
pub const RESPONSE_META: &str = "cf-cloudflared-response-meta";
/// Request header selecting control stream, WebSocket or configuration push.
pub const CONNECTION_UPGRADE: &str = "cf-cloudflared-proxy-connection-upgrade";
/// Request header marking a TCP stream.
pub const PROXY_SRC: &str = "cf-cloudflared-proxy-src";
/// `cf-cloudflared-response-meta` for origin responses.
pub const META_ORIGIN: &str = r#"{"src":"origin"}"#;
/// `cf-cloudflared-response-meta` for responses the connector made itself.
pub const META_CONNECTOR: &str = r#"{"src":"cloudflared"}"#;

/// Errors decoding a serialised header list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderCodecError {
    /// An item is not exactly `name:value`.
    #[error("header item {0} is not a name:value pair")]
    Pair(usize),
    /// A name or value is not valid unpadded base64.
    #[error("header item {0} is not valid base64")]
    Base64(usize),
    /// A decoded name is not a valid HTTP header name.
    #[error("header item {0} has an invalid name")]
    Name(usize),
    /// A decoded value is not a valid HTTP header value.
    #[error("header item {0} has an invalid value")]
    Value(usize),
}

/// Go's `CanonicalMIMEHeaderKey`: upper-case the first letter and every letter
/// after `-`, lower-case the rest. Names with bytes outside the token set are
/// returned unchanged, as Go does.
pub fn canonical_name(name: &str) -> String {
    let valid = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid {
        return name.to_owned();
    }
    let mut out = vec![0; name.len()];
    write_canonical(name.as_bytes(), &mut out);
    // Token bytes are ASCII, and case changes keep them ASCII.
    String::from_utf8(out).unwrap_or_else(|_| name.to_owned())
}

/// Writes the canonical form of a token `name` into `out` (same length). For
/// a [`HeaderName`] (always a lower-case token) this is [`canonical_name`].
pub(crate) fn write_canonical(name: &[u8], out: &mut [u8]) {
    let mut upper = true;
    for (o, &b) in out.iter_mut().zip(name) {
        *o = if upper {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        };
        upper = b == b'-';
    }
}

// The edge's own headers, as constants so a match arm costs nothing.
/// `CDN-Loop`, which the edge adds to every proxied request (a test edge sets it by this
/// name too).
pub const CDN_LOOP: HeaderName = HeaderName::from_static("cdn-loop");
/// `Cf-Connecting-Ip`: the eyeball's address, as the edge sets it.
pub const CF_CONNECTING_IP: HeaderName = HeaderName::from_static("cf-connecting-ip");
pub(crate) const CF_IPCOUNTRY: HeaderName = HeaderName::from_static("cf-ipcountry");
/// `Cf-Ray`: the edge's id of a request.
pub const CF_RAY: HeaderName = HeaderName::from_static("cf-ray");
/// `Cf-Visitor`: the eyeball's scheme, as JSON, as the edge sets it.
pub const CF_VISITOR: HeaderName = HeaderName::from_static("cf-visitor");
pub(crate) const CF_WARP_TAG_ID: HeaderName = HeaderName::from_static("cf-warp-tag-id");
/// `X-Forwarded-For`, which the edge extends with the eyeball's address.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`, which the edge sets to the eyeball's scheme.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The header name for a name as it travels between edge and connector (Go
/// canonical case). The names every request and response carries are matched
/// to constants, so they cost neither a parse nor, for the edge's own
/// `Cf-*` headers, an allocation; any other name is parsed.
pub(crate) fn header_name(name: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    use http::header;
    Ok(match name {
        b"Accept" => header::ACCEPT,
        b"Accept-Encoding" => header::ACCEPT_ENCODING,
        b"Accept-Language" => header::ACCEPT_LANGUAGE,
        b"Authorization" => header::AUTHORIZATION,
        b"Cache-Control" => header::CACHE_CONTROL,
        b"Cdn-Loop" => CDN_LOOP,
        b"Cf-Connecting-Ip" => CF_CONNECTING_IP,
        b"Cf-Ipcountry" => CF_IPCOUNTRY,
        b"Cf-Ray" => CF_RAY,
        b"Cf-Visitor" => CF_VISITOR,
        b"Cf-Warp-Tag-Id" => CF_WARP_TAG_ID,
        b"Content-Encoding" => header::CONTENT_ENCODING,
        b"Content-Length" => header::CONTENT_LENGTH,
        b"Content-Type" => header::CONTENT_TYPE,
        b"Cookie" => header::COOKIE,
        b"Date" => header::DATE,
        b"Etag" => header::ETAG,
        b"Last-Modified" => header::LAST_MODIFIED,
        b"Location" => header::LOCATION,
        b"Origin" => header::ORIGIN,
        b"Referer" => header::REFERER,
        b"Server" => header::SERVER,
        b"Set-Cookie" => header::SET_COOKIE,
        b"User-Agent" => header::USER_AGENT,
        b"Vary" => header::VARY,
        b"X-Forwarded-For" => X_FORWARDED_FOR,
        b"X-Forwarded-Proto" => X_FORWARDED_PROTO,
        _ => return HeaderName::from_bytes(name),
    })
}

fn is_internal(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("cf-int-") || n.starts_with("cf-cloudflared-") || n.starts_with("cf-proxy-")
}

/// Whether a response header goes into the serialised list. WebSocket
/// responses keep `connection` and `upgrade`.
pub fn is_serialised(name: &HeaderName, websocket: bool) -> bool {
    if is_internal(name) {
        return false;
    }
    if is_hop_by_hop(name) {
        return websocket && (name == http::header::CONNECTION || name == http::header::UPGRADE);
    }
    true
}

/// Serialises response headers for `cf-cloudflared-response-headers`.
pub fn serialise(headers: &HeaderMap, websocket: bool) -> String {
    // Base64 output and canonical token names are ASCII.
    String::from_utf8(serialise_bytes(headers, websocket)).unwrap_or_default()
}

/// [`serialise`] as a header value, without copying the serialised bytes again.
pub fn serialise_value(headers: &HeaderMap, websocket: bool) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(serialise_bytes(headers, websocket))).ok()
}

fn serialise_bytes(headers: &HeaderMap, websocket: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len() * 48);
    let mut name_buf = [0u8; 64];
    for (name, value) in headers {
        if !is_serialised(name, websocket) {
            continue;
        }
        if !out.is_empty() {
            out.push(b';');
        }
        let name = name.as_str().as_bytes();
        match name_buf.get_mut(..name.len()) {
            Some(canon) => {
                write_canonical(name, canon);
                encode_into(canon, &mut out);
            }
            None => {
                let mut canon = vec![0; name.len()];
                write_canonical(name, &mut canon);
                encode_into(&canon, &mut out);
            }
        }
        out.push(b':');
        encode_into(value.as_bytes(), &mut out);
    }
    out
}

// Base64 here is written out because every name and value is a separate
// few-byte string: a general-purpose engine spends more on setting up each
// call than on the bytes. The `serialised_headers` fuzz target checks this
// codec against the `base64` crate.

/// The standard base64 alphabet.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Marks bytes outside [`ALPHABET`] in [`DECODE`].
const INVALID: u8 = 0xff;

/// Each byte's 6-bit value in [`ALPHABET`], or [`INVALID`].
const DECODE: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 64 {
        table[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// Appends unpadded standard base64 of `input` to `out`.
fn encode_into(input: &[u8], out: &mut Vec<u8>) {
    let sextet = |n: u32, shift: u32| ALPHABET[((n >> shift) & 63) as usize];
    out.reserve(input.len().div_ceil(3) * 4);
    let mut chunks = input.chunks_exact(3);
    for c in &mut chunks {
        let n = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        out.extend_from_slice(&[sextet(n, 18), sextet(n, 12), sextet(n, 6), sextet(n, 0)]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[sextet(n, 18), sextet(n, 12)]);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[sextet(n, 18), sextet(n, 12), sextet(n, 6)]);
        }
        _ => {}
    }
}

/// Appends the bytes of unpadded standard base64 `input` to `out`; `None`
/// for a byte outside the alphabet (padding included), a length no encoding
/// has, or non-zero bits after the last byte, as the `base64` crate's
/// `STANDARD_NO_PAD` rejects them.
fn decode_into(input: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let value = |b: u8| match DECODE[usize::from(b)] {
        INVALID => None,
        v => Some(u32::from(v)),
    };
    out.reserve(input.len() / 4 * 3 + 2);
    let mut chunks = input.chunks_exact(4);
    for c in &mut chunks {
        let n = value(c[0])? << 18 | value(c[1])? << 12 | value(c[2])? << 6 | value(c[3])?;
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    match *chunks.remainder() {
        [] => {}
        [a, b] => {
            let n = value(a)? << 18 | value(b)? << 12;
            if n & 0xffff != 0 {
                return None;
            }
            out.push((n >> 16) as u8);
        }
        [a, b, c] => {
            let n = value(a)? << 18 | value(b)? << 12 | value(c)? << 6;
            if n & 0xff != 0 {
                return None;
            }
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8]);
        }
        _ => return None,
    }
    Some(())
}

/// Decodes a serialised header list. Empty items are skipped.
pub fn deserialise(s: &str) -> Result<Vec<(HeaderName, HeaderValue)>, HeaderCodecError> {
    let mut out = Vec::new();
    let (mut name, mut value) = (Vec::new(), Vec::new());
    for (i, item) in s.split(';').enumerate() {
        if item.is_empty() {
            continue;
        }
        let mut parts = item.split(':');
        let (Some(n), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(HeaderCodecError::Pair(i));
        };
        name.clear();
        value.clear();
        decode_into(n.as_bytes(), &mut name).ok_or(HeaderCodecError::Base64(i))?;
        decode_into(v.as_bytes(), &mut value).ok_or(HeaderCodecError::Base64(i))?;
        let name = header_name(&name).map_err(|_| HeaderCodecError::Name(i))?;
        let value = HeaderValue::from_bytes(&value).map_err(|_| HeaderCodecError::Value(i))?;
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD_NO_PAD;
    use base64::Engine as _;

    #[test]
    fn base64_agrees_with_the_base64_crate() {
        // Every input length up to three full blocks, over all byte values.
        let bytes: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
        for len in 0..=12 {
            for start in (0..bytes.len() - len).step_by(7) {
                let input = &bytes[start..start + len];
                let mut out = Vec::new();
                encode_into(input, &mut out);
                assert_eq!(out, STANDARD_NO_PAD.encode(input).into_bytes(), "{input:?}");
            }
        }
        // Every string of up to four characters over an alphabet with valid
        // characters, trailing-bit cases, padding and outsiders.
        let chars = b"AQgw/+=a09-_ \xff";
        let mut inputs = vec![Vec::new()];
        for _ in 0..4 {
            let longer: Vec<Vec<u8>> = inputs
                .iter()
                .filter(|i: &&Vec<u8>| i.len() == inputs.last().map_or(0, Vec::len))
                .flat_map(|i| chars.iter().map(move |&c| [i.as_slice(), &[c]].concat()))
                .collect();
            inputs.extend(longer);
        }
        for input in inputs
            .iter()
            .chain([b"TWFu".to_vec(), b"TWFuTQ".to_vec()].iter())
        {
            let mut out = Vec::new();
            let ours = decode_into(input, &mut out).map(|()| out);
            assert_eq!(ours, STANDARD_NO_PAD.decode(input).ok(), "{input:?}");
        }
    }

    #[test]
    fn known_names_are_the_names_they_spell() {
        for name in [
            "Accept",
            "Accept-Encoding",
            "Accept-Language",
            "Authorization",
            "Cache-Control",
            "Cdn-Loop",
            "Cf-Connecting-Ip",
            "Cf-Ipcountry",
            "Cf-Ray",
            "Cf-Visitor",
            "Cf-Warp-Tag-Id",
            "Content-Encoding",
            "Content-Length",
            "Content-Type",
            "Cookie",
            "Date",
            "Etag",
            "Last-Modified",
            "Location",
            "Origin",
            "Referer",
            "Server",
            "Set-Cookie",
            "User-Agent",
            "Vary",
            "X-Forwarded-For",
            "X-Forwarded-Proto",
            "X-Other",
            "x-lower",
            "Bad Name",
        ] {
            assert_eq!(
                header_name(name.as_bytes()).ok(),
                HeaderName::from_bytes(name.as_bytes()).ok(),
                "{name}"
            );
        }
    }

    #[test]
    fn serialises_like_the_observed_wire_example() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        h.insert("content-length", HeaderValue::from_static("18"));
        h.insert("connection", HeaderValue::from_static("close"));
        h.insert("cf-int-x", HeaderValue::from_static("1"));
        assert_eq!(
            serialise(&h, false),
            "Q29udGVudC1UeXBl:dGV4dC9wbGFpbg;Q29udGVudC1MZW5ndGg:MTg"
        );
    }

    #[test]
    fn round_trips_multi_values_and_websocket_headers() {
        let mut h = HeaderMap::new();
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        let back = deserialise(&serialise(&h, true)).unwrap();
        let mut got = HeaderMap::new();
        for (n, v) in back {
            got.append(n, v);
        }
        assert_eq!(got, h);
    }

    #[test]
    fn decoder_rejects_bad_items_and_skips_empty_ones() {
        assert_eq!(deserialise(";;").unwrap(), vec![]);
        assert_eq!(deserialise("YQ:Yg:Yw"), Err(HeaderCodecError::Pair(0)));
        assert_eq!(deserialise("YQ"), Err(HeaderCodecError::Pair(0)));
        assert_eq!(deserialise("YQ:Yg;*:Yg"), Err(HeaderCodecError::Base64(1)));
        assert_eq!(deserialise("IA:Yg"), Err(HeaderCodecError::Name(0)));
        assert_eq!(deserialise("YQ:Cg"), Err(HeaderCodecError::Value(0)));
    }

    #[test]
    fn long_names_and_every_value_length_serialise() {
        let long = "x-".to_owned() + &"a".repeat(100);
        let mut h = HeaderMap::new();
        for (i, value) in ["", "a", "ab", "abc", "abcd"].into_iter().enumerate() {
            h.insert(
                HeaderName::from_bytes(format!("{long}-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static(value),
            );
        }
        let text = serialise(&h, false);
        assert_eq!(serialise_value(&h, false).unwrap(), text.as_str());
        let back = deserialise(&text).unwrap();
        assert_eq!(back.len(), 5);
        for ((n, v), (n0, v0)) in back.iter().zip(&h) {
            assert_eq!((n, v), (n0, v0));
        }
        let first = text.split(';').next().unwrap().split(':').next().unwrap();
        let name = STANDARD_NO_PAD.decode(first).unwrap();
        assert_eq!(
            name,
            format!("X-{}-0", "A".to_owned() + &"a".repeat(99)).as_bytes()
        );
    }

    #[test]
    fn canonical_names_follow_go() {
        assert_eq!(canonical_name("content-type"), "Content-Type");
        assert_eq!(
            canonical_name("sec-websocket-accept"),
            "Sec-Websocket-Accept"
        );
        assert_eq!(canonical_name("x-b3-traceid"), "X-B3-Traceid");
        assert_eq!(canonical_name("a b"), "a b");
    }
}
