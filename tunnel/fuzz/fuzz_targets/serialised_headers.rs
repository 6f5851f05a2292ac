//! HTTP/2 transport: the `cf-cloudflared-response-headers` codec.
//!
//! The first input byte picks how the rest is used: as the serialised text
//! itself (even), or as a list of raw header names and values (odd), which
//! reaches the encoder with header maps the text form rarely produces.
//!
//! Properties checked:
//!
//! - [`headers::deserialise`] never panics, and accepts exactly one pair per
//!   non-empty `;` item;
//! - for any header map and either WebSocket setting, `serialise` output
//!   decodes to the serialised subset of the map (per
//!   [`headers::is_serialised`]), with Go-canonical names and no padding, and
//!   serialising the decoded map gives the same text again;
//! - [`headers::canonical_name`] matches Go's `CanonicalMIMEHeaderKey`, is
//!   idempotent, and keeps the header name it was given (only case changes).
#![no_main]

use cftunnel_tunnel::stream::headers;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let map = if mode % 2 == 0 {
        let text = String::from_utf8_lossy(rest);
        let decoded = headers::deserialise(&text);
        assert_eq!(
            decoded.as_ref().ok(),
            reference_deserialise(&text).as_ref(),
            "decoder differs from the base64 crate's"
        );
        let Ok(pairs) = decoded else {
            return;
        };
        let items = text.split(';').filter(|i| !i.is_empty()).count();
        assert_eq!(pairs.len(), items, "one pair per non-empty item");
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            if map.try_append(n, v).is_err() {
                return;
            }
        }
        map
    } else {
        let mut u = Unstructured::new(rest);
        let mut map = HeaderMap::new();
        for pair in u.arbitrary_iter::<(&[u8], &[u8])>().into_iter().flatten() {
            let Ok((n, v)) = pair else { break };
            let text = String::from_utf8_lossy(n);
            let canon = headers::canonical_name(&text);
            assert_eq!(canon, go_canonical(&text), "canonical_name differs from Go");
            assert_eq!(
                canon,
                headers::canonical_name(&canon),
                "canonical_name idempotent"
            );
            let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) else {
                continue;
            };
            if map.try_append(n, v).is_err() {
                break;
            }
        }
        map
    };

    for name in map.keys() {
        let canon = headers::canonical_name(name.as_str());
        assert!(
            canon.eq_ignore_ascii_case(name.as_str()),
            "{canon} is not {name}"
        );
        assert_eq!(
            HeaderName::from_bytes(canon.as_bytes()).ok().as_ref(),
            Some(name)
        );
        assert_eq!(
            headers::canonical_name(&canon),
            canon,
            "canonical_name idempotent"
        );
    }

    for websocket in [false, true] {
        let mut expected = HeaderMap::new();
        for (n, v) in &map {
            if headers::is_serialised(n, websocket) {
                expected.append(n.clone(), v.clone());
            }
        }
        let text = headers::serialise(&map, websocket);
        assert!(!text.contains('='), "padding in {text:?}");
        let reference: Vec<String> = expected
            .iter()
            .map(|(n, v)| {
                let canon = headers::canonical_name(n.as_str());
                format!("{}:{}", encode_no_pad(canon.as_bytes()), encode_no_pad(v.as_bytes()))
            })
            .collect();
        assert_eq!(text, reference.join(";"), "encoder differs from the reference");
        let pairs = match headers::deserialise(&text) {
            Ok(p) => p,
            Err(e) => panic!("serialised headers {text:?} do not decode: {e}"),
        };
        assert_eq!(pairs.len(), expected.len());
        for (item, (n, _)) in text.split(';').zip(&pairs) {
            let wire_name = item.split(':').next().unwrap_or_default();
            let canon = headers::canonical_name(n.as_str());
            assert_eq!(
                wire_name,
                encode_no_pad(canon.as_bytes()),
                "name not in canonical case"
            );
        }
        let mut back = HeaderMap::new();
        for (n, v) in pairs {
            back.append(n, v);
        }
        assert_eq!(
            back, expected,
            "serialised subset changed (websocket={websocket})"
        );
        assert_eq!(
            headers::serialise(&back, websocket),
            text,
            "re-serialising is not stable"
        );
    }
});

/// Go's `textproto.CanonicalMIMEHeaderKey`, written out independently: a
/// key holding any byte outside the RFC 7230 token set is returned as is;
/// otherwise ASCII letters are upper-cased at the start and after `-`, and
/// lower-cased elsewhere.
fn go_canonical(key: &str) -> String {
    const TOKEN_PUNCT: &[u8] = b"!#$%&'*+-.^_`|~";
    if key
        .bytes()
        .any(|b| !(b.is_ascii_alphanumeric() || TOKEN_PUNCT.contains(&b)))
    {
        return key.to_owned();
    }
    let mut out = Vec::with_capacity(key.len());
    let mut prev = b'-';
    for b in key.bytes() {
        out.push(if prev == b'-' {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        });
        prev = b;
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The decoder as the `base64` crate's unpadded standard engine reads it.
fn reference_deserialise(s: &str) -> Option<Vec<(HeaderName, HeaderValue)>> {
    use base64::engine::general_purpose::STANDARD_NO_PAD;
    use base64::Engine as _;
    let mut out = Vec::new();
    for item in s.split(';').filter(|i| !i.is_empty()) {
        let mut parts = item.split(':');
        let (Some(n), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let n = STANDARD_NO_PAD.decode(n).ok()?;
        let v = STANDARD_NO_PAD.decode(v).ok()?;
        out.push((HeaderName::from_bytes(&n).ok()?, HeaderValue::from_bytes(&v).ok()?));
    }
    Some(out)
}

/// Standard base64 without padding, written out so the check does not
/// share the codec under test.
fn encode_no_pad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}
