//! The headers whose meaning ends at the next hop, which neither the proxy nor the tunnel
//! connector passes on: RFC 9110 §7.6.1's, those `Connection` lists aside, plus the legacy
//! names proxies have always dropped (`Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
//! `Proxy-Authorization`), as the Go reverse proxy and `cloudflared` drop them. The proxy keeps
//! `Trailer` ([`TRAILER`]), as Go's reverse proxy announces forwarded trailers again.

use http::header::{self, HeaderName};

/// Always hop-by-hop. The order is part of the contract: `Connection`, `Upgrade`,
/// `Transfer-Encoding` and `TE`, which a proxy treats apart, stand at [`CONNECTION`],
/// [`UPGRADE`], [`TRANSFER_ENCODING`] and [`TE`], so a caller
/// may keep the names a message holds as bits of a set.
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// [`HOP_BY_HOP`]'s names as text, in its order, for checks made before a name is parsed
/// (or in a `const`).
pub const NAMES: [&str; 9] = [
    "connection",
    "upgrade",
    "transfer-encoding",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-authenticate",
    "keep-alive",
    "proxy-connection",
];

/// Where `Connection` stands in [`HOP_BY_HOP`].
pub const CONNECTION: usize = 0;
/// Where `Upgrade` stands in [`HOP_BY_HOP`].
pub const UPGRADE: usize = 1;
/// Where `Transfer-Encoding` stands in [`HOP_BY_HOP`].
pub const TRANSFER_ENCODING: usize = 2;
/// Where `TE` stands in [`HOP_BY_HOP`].
pub const TE: usize = 3;
/// Where `Trailer` stands in [`HOP_BY_HOP`]: dropped as Go's reverse proxy drops it, which then
/// announces the trailers it forwards again; a proxy that forwards trailers keeps it.
pub const TRAILER: usize = 4;

/// Whether `name` is always hop-by-hop.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// Joins an HTTP/2 request's `Cookie` fields into one, as RFC 9113 §8.2.3 requires before
/// the request goes on over HTTP/1.1 (and allows over HTTP/2): a client may split its cookies
/// into one field each, and HTTP/1.1 servers read one `Cookie` line. (Cloudflare's edge joins
/// them before a request enters a tunnel.)
pub fn join_cookie_crumbs(headers: &mut http::HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = Vec::with_capacity(first.len() * 2);
    for crumb in headers.get_all(header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(value) = http::HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_as_text_are_the_headers() {
        for (name, text) in HOP_BY_HOP.iter().zip(NAMES) {
            assert_eq!(name.as_str(), text);
        }
    }

    #[test]
    fn the_named_positions_hold_their_headers() {
        assert_eq!(HOP_BY_HOP[CONNECTION], header::CONNECTION);
        assert_eq!(HOP_BY_HOP[UPGRADE], header::UPGRADE);
        assert_eq!(HOP_BY_HOP[TRANSFER_ENCODING], header::TRANSFER_ENCODING);
        assert_eq!(HOP_BY_HOP[TE], header::TE);
        assert_eq!(HOP_BY_HOP[TRAILER], header::TRAILER);
    }

    #[test]
    fn hop_by_hop_names_are_told_from_end_to_end_ones() {
        for name in [
            "connection",
            "Keep-Alive",
            "PROXY-AUTHENTICATE",
            "te",
            "trailer",
            "upgrade",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a header name");
            assert!(is_hop_by_hop(&name), "{name}");
        }
        for name in [
            "content-length",
            "host",
            "trailers",
            "x-forwarded-for",
            "authorization",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a header name");
            assert!(!is_hop_by_hop(&name), "{name}");
        }
    }
}
