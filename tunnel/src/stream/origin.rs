//! What the connector changes in every request before the service sees it, on
//! either transport, as `cloudflared`'s proxy does: the edge's internal headers
//! come out, the connector's tag goes in, and on WebSocket streams the handshake
//! headers the edge strips from eyeball requests are put back.

use http::header::{
    HeaderMap, HeaderName, HeaderValue, MaxSizeReached, CONNECTION, CONTENT_LENGTH,
    SEC_WEBSOCKET_VERSION, TRANSFER_ENCODING, UPGRADE,
};
use uuid::Uuid;

use super::headers::CONNECTION_UPGRADE;

/// The edge's trace propagation header; `cloudflared` always deletes it before
/// the origin sees the request.
pub const TRACE_ID: &str = "cf-trace-id";
/// The connector's id, sent to origins on every request (`cloudflared`'s
/// `Cf-Warp-Tag-Id`, the tag it always adds besides those given with `--tag`).
pub const WARP_TAG_ID: &str = "cf-warp-tag-id";

/// The [`WARP_TAG_ID`] value for a connector: its id as `cloudflared` prints it
/// (lower-case, hyphenated), which is also the `clientId` it registers with.
pub fn connector_tag(id: Uuid) -> HeaderValue {
    let mut buf = Uuid::encode_buffer();
    let text = id.hyphenated().encode_lower(&mut buf);
    HeaderValue::from_str(text).unwrap_or(HeaderValue::from_static(""))
}

/// Removes the edge's internal headers and adds the connector's tag. A head
/// already holding as many header names as an [`HeaderMap`] can goes on
/// without the tag.
pub fn prepare(headers: &mut HeaderMap, tag: &HeaderValue) {
    // Names built at compile time: no parsing or allocation per request.
    const TRACE: HeaderName = HeaderName::from_static(TRACE_ID);
    const MARKER: HeaderName = HeaderName::from_static(CONNECTION_UPGRADE);
    const TAG: HeaderName = HeaderName::from_static(WARP_TAG_ID);
    headers.remove(TRACE);
    headers.remove(MARKER);
    let _ = headers.try_append(TAG, tag.clone());
}

/// The connector adds these towards the origin for WebSocket streams, as
/// `cloudflared` does (its `Set` replaces what the eyeball sent). A head
/// already holding as many header names as an [`HeaderMap`] can is left
/// without those it has no room for.
///
/// The handshake goes out with no body, the stream's bytes following only once the
/// origin has switched protocols, so the eyeball's `Content-Length` and
/// `Transfer-Encoding` go: passed on, a length with no body after it would make an
/// origin that does not switch read the next request on its connection as this one's
/// body.
pub fn add_websocket_headers(headers: &mut HeaderMap) {
    let _ = try_add_websocket_headers(headers);
}

pub(super) fn try_add_websocket_headers(headers: &mut HeaderMap) -> Result<(), MaxSizeReached> {
    headers.remove(CONTENT_LENGTH);
    headers.remove(TRANSFER_ENCODING);
    headers.try_insert(CONNECTION, HeaderValue::from_static("Upgrade"))?;
    headers.try_insert(UPGRADE, HeaderValue::from_static("websocket"))?;
    headers.try_insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_sees_the_tag_and_no_edge_internal_headers() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let tag = connector_tag(id);
        assert_eq!(tag, "01234567-89ab-cdef-0123-456789abcdef");
        let mut headers = HeaderMap::new();
        headers.append(TRACE_ID, HeaderValue::from_static("a:b:0:1"));
        headers.append(TRACE_ID, HeaderValue::from_static("c:d:0:1"));
        headers.append(CONNECTION_UPGRADE, HeaderValue::from_static("websocket"));
        headers.append("x-kept", HeaderValue::from_static("1"));
        prepare(&mut headers, &tag);
        assert!(!headers.contains_key(TRACE_ID));
        assert!(!headers.contains_key(CONNECTION_UPGRADE));
        assert_eq!(headers.get("x-kept").unwrap(), "1");
        let tags: Vec<_> = headers.get_all(WARP_TAG_ID).iter().collect();
        assert_eq!(tags, [&tag]);
    }

    #[test]
    fn websocket_headers_replace_the_eyeballs() {
        let mut headers = HeaderMap::new();
        headers.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        headers.insert(CONNECTION, HeaderValue::from_static("keep-alive"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("314"));
        headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        add_websocket_headers(&mut headers);
        assert!(!headers.contains_key(CONTENT_LENGTH));
        assert!(!headers.contains_key(TRANSFER_ENCODING));
        assert_eq!(headers.get(SEC_WEBSOCKET_VERSION).unwrap(), "13");
        assert_eq!(headers.get(CONNECTION).unwrap(), "Upgrade");
        assert_eq!(headers.get(UPGRADE).unwrap(), "websocket");
    }
}
