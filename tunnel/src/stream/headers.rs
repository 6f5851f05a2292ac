//! HTTP/2 transport: the `cf-cloudflared-response-headers` serialisation
//! (`b64(name) ":" b64(value)` pairs joined by `;`, standard alphabet without
//! padding, Go canonical names, one pair per value) and Go header-name case.

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
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

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
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

/// Appends unpadded standard base64 of `input` to `out`.
fn encode_into(input: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    let len = input.len().div_ceil(3) * 4;
    out.resize(start + len, 0);
    match STANDARD_NO_PAD.encode_slice(input, &mut out[start..]) {
        Ok(written) => out.truncate(start + written),
        // Unreachable: the slice is sized for padded output.
        Err(_) => out.truncate(start),
    }
}

/// Decodes a serialised header list. Empty items are skipped.
pub fn deserialise(s: &str) -> Result<Vec<(HeaderName, HeaderValue)>, HeaderCodecError> {
    let mut out = Vec::new();
    for (i, item) in s.split(';').enumerate() {
        if item.is_empty() {
            continue;
        }
        let mut parts = item.split(':');
        let (Some(n), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(HeaderCodecError::Pair(i));
        };
        let n = STANDARD_NO_PAD
            .decode(n)
            .map_err(|_| HeaderCodecError::Base64(i))?;
        let v = STANDARD_NO_PAD
            .decode(v)
            .map_err(|_| HeaderCodecError::Base64(i))?;
        let name = HeaderName::from_bytes(&n).map_err(|_| HeaderCodecError::Name(i))?;
        let value = HeaderValue::from_bytes(&v).map_err(|_| HeaderCodecError::Value(i))?;
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
