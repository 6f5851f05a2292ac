//! Header rewriting between client and backend: hop-by-hop removal (RFC 9110 §7.6.1) and the
//! `X-Forwarded-*` headers; and the bound on a header block both sides share.
//!
//! Both run on every request and most responses, and the common message carries none of the
//! hop-by-hop headers, so each first scans the header names once and only then pays for
//! removals: a removal of an absent name still hashes it.

use crate::conn::ConnInfo;
use cftunnel_config::hop_by_hop::{self, HOP_BY_HOP};
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};
use std::net::IpAddr;

/// Default bound on a header block: a request head on the listener
/// ([`crate::serve::Limits::max_header_bytes`]), and an HTTP/2 backend's answer head or
/// trailers ([`crate::forward::BackendOptions::max_header_bytes`]).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

const CONNECTION_BIT: u16 = 1 << hop_by_hop::CONNECTION;
const TRANSFER_ENCODING_BIT: u16 = 1 << hop_by_hop::TRANSFER_ENCODING;
const UPGRADE_BIT: u16 = 1 << hop_by_hop::UPGRADE;
const TE_BIT: u16 = 1 << hop_by_hop::TE;
const TRAILER_BIT: u16 = 1 << hop_by_hop::TRAILER;

/// The lengths of the [`HOP_BY_HOP`] names, as bits: a name of another length is none of
/// them, which one test tells for most names (`host`, `content-type`, `date`...).
const HOP_BY_HOP_LENGTHS: u32 = {
    let mut bits = 0;
    let mut i = 0;
    while i < hop_by_hop::NAMES.len() {
        bits |= 1 << hop_by_hop::NAMES[i].len();
        i += 1;
    }
    bits
};

/// Which of [`HOP_BY_HOP`] the map holds, found in one pass over its names (a lookup of an
/// absent name still hashes it).
fn present(headers: &HeaderMap) -> u16 {
    let mut set = 0;
    for name in headers.keys() {
        let len = name.as_str().len();
        if len >= 32 || HOP_BY_HOP_LENGTHS & (1 << len) == 0 {
            continue;
        }
        if let Some(i) = HOP_BY_HOP.iter().position(|h| *h == name) {
            set |= 1 << i;
        }
    }
    set
}

/// Removes hop-by-hop headers, keeping `Upgrade` (and the names `Connection` lists, bar
/// `Upgrade`) when the request is being upgraded; the caller then sets `Connection: upgrade`.
/// `TE: trailers` is end-to-end for gRPC and stays; other `TE` values go. `Trailer` stays: an
/// HTTP/1.1 encoder writes only the trailers a message announces, and Go's reverse proxy,
/// which drops the header, announces them again. A `Content-Length` beside
/// `Transfer-Encoding` goes too: the message's length was its chunked framing's.
/// Returns whether the map held a `Connection` header, whose list may have named any other
/// header.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) -> bool {
    let set = present(headers);
    if set == 0 {
        return false;
    }
    if set & CONNECTION_BIT != 0 {
        // Taken out of the map, which frees it for the removals below: one lookup, no copy.
        // Almost always one value (a backend's `keep-alive`), held without a `Vec`.
        let (first, rest) = match headers.entry(header::CONNECTION) {
            header::Entry::Occupied(entry) => {
                let (_, mut values) = entry.remove_entry_mult();
                let first = values.next();
                (first, values.collect::<Vec<HeaderValue>>())
            }
            header::Entry::Vacant(_) => (None, Vec::new()),
        };
        for value in first.iter().chain(&rest) {
            let Ok(value) = value.to_str() else { continue };
            for token in value.split(',').map(str::trim) {
                // Connection options, not header names; `keep-alive` goes below if present.
                if token.eq_ignore_ascii_case("keep-alive")
                    || token.eq_ignore_ascii_case("close")
                    || (keep_upgrade && token.eq_ignore_ascii_case("upgrade"))
                    // The host routed on and the body's length are the message's own, never
                    // a hop's (Go's proxy keeps them out of the header map it strips).
                    || token.eq_ignore_ascii_case("host")
                    || token.eq_ignore_ascii_case("content-length")
                {
                    continue;
                }
                // A token that is not a valid header name matches nothing.
                headers.remove(token);
            }
        }
    }
    if set & TRANSFER_ENCODING_BIT != 0 {
        // A message framed by `Transfer-Encoding` whose `Content-Length` is stale (RFC 9112
        // §6.3: the length is the chunked framing's): passed on, the length would cut the
        // body short of what was read.
        headers.remove(header::CONTENT_LENGTH);
    }
    if set & UPGRADE_BIT != 0 && !keep_upgrade {
        headers.remove(header::UPGRADE);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        let bit = 1 << i;
        if set & bit != 0 && bit & (CONNECTION_BIT | UPGRADE_BIT | TE_BIT | TRAILER_BIT) == 0 {
            headers.remove(name);
        }
    }
    if set & TE_BIT != 0 {
        let te_trailers = headers
            .get(header::TE)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
        if !te_trailers {
            headers.remove(header::TE);
        }
    }
    set & CONNECTION_BIT != 0
}

/// Whether a message's body is framed by `chunked` alone, or by no transfer coding at all:
/// any other coding (`gzip, chunked`) would be passed on as if it were the body itself once
/// the framing is undone, and HTTP/1.1 needs none but `chunked` (RFC 9112 §6.1).
pub(crate) fn only_chunked_coding(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(coding), None) => coding.as_bytes().eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => false,
    }
}

/// Whether a request says it takes trailers: `trailers` in its `TE` list, which is what an
/// HTTP/1.1 server reads before it writes any (RFC 9110 §10.1.4).
pub(crate) fn takes_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(header::TE).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    })
}

/// Announces gRPC's trailers on a gRPC response (not gRPC-Web, whose trailers travel in its
/// body) that announces none. An HTTP/1.1 encoder writes only the trailers a response's
/// `Trailer` header names, and an HTTP/2 backend has no reason to name them: without this, a
/// client over HTTP/1.1 would never see the call's `grpc-status`.
pub(crate) fn announce_grpc_trailers(headers: &mut HeaderMap) {
    let grpc = headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.starts_with(b"application/grpc") && !v.starts_with(b"application/grpc-web")
    });
    if grpc {
        if let header::Entry::Vacant(entry) = headers.entry(header::TRAILER) {
            entry.insert(HeaderValue::from_static(
                "grpc-status, grpc-message, grpc-status-details-bin",
            ));
        }
    }
}

/// Settles `X-Forwarded-Proto` before routing, since rules may match on it (a Gateway's HTTP
/// and HTTPS listeners are told apart by it): a trusted hop's value stands, and `http` from it
/// becomes the request's scheme; anyone else's is replaced with the scheme the client used.
/// Returns the connection as the request is to be served.
pub(crate) fn settle_forwarded_proto(headers: &mut HeaderMap, mut conn: ConnInfo) -> ConnInfo {
    // One lookup reads and writes it: hashing a name the `http` crate does not know costs
    // about as much as the rest of the write.
    match headers.entry(&X_FORWARDED_PROTO) {
        header::Entry::Occupied(entry) if conn.trusted_forwarding => {
            if entry.get().as_bytes().eq_ignore_ascii_case(b"http") {
                conn.scheme = "http";
            }
        }
        header::Entry::Occupied(mut entry) => {
            entry.insert(HeaderValue::from_static(conn.scheme));
        }
        header::Entry::Vacant(entry) => {
            entry.insert(HeaderValue::from_static(conn.scheme));
        }
    }
    conn
}

/// Prepares a request's headers for the backend, after [`settle_forwarded_proto`]:
/// hop-by-hop removal, `Connection: upgrade` for an upgrade, and `X-Forwarded-For`: a trusted
/// hop's stands, and is filled in where it left it out.
pub(crate) fn prepare_forward_headers(headers: &mut HeaderMap, conn: ConnInfo, upgrade: bool) {
    let connection_listed = strip_hop_by_hop(headers, upgrade);
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if let Some(peer) = conn.peer {
        // An IPv4 client of the dual-stack listener arrives as `::ffff:a.b.c.d`.
        let ip = peer.ip().to_canonical();
        match headers.entry(&X_FORWARDED_FOR) {
            header::Entry::Vacant(entry) => {
                if let Some(value) = ip_header_value(ip) {
                    entry.insert(value);
                }
            }
            header::Entry::Occupied(_) if conn.trusted_forwarding => {}
            header::Entry::Occupied(mut entry) => {
                if let Some(value) = appended_forwarded_for(entry.iter(), ip) {
                    entry.insert(value);
                }
            }
        }
    }
    // Settled before routing; only a `Connection` header naming it can have taken it out.
    if connection_listed {
        if let header::Entry::Vacant(entry) = headers.entry(&X_FORWARDED_PROTO) {
            entry.insert(HeaderValue::from_static(conn.scheme));
        }
    }
}

/// Every earlier `X-Forwarded-For` entry, then the peer, as one value.
fn appended_forwarded_for<'a>(
    prior: impl Iterator<Item = &'a HeaderValue>,
    ip: IpAddr,
) -> Option<HeaderValue> {
    let mut joined = String::new();
    for prior in prior {
        if let Ok(prior) = prior.to_str() {
            joined.push_str(prior);
            joined.push_str(", ");
        }
    }
    joined.push_str(&ip.to_string());
    HeaderValue::try_from(joined).ok()
}

/// The address as a header value; IPv4 is written by hand, which costs a tenth of `Display`.
fn ip_header_value(ip: IpAddr) -> Option<HeaderValue> {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::try_from(ip.to_string()).ok();
    };
    let mut buf = [0u8; 15];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            buf[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            buf[len] = b'0' + (octet / 10) % 10;
            len += 1;
        }
        buf[len] = b'0' + octet % 10;
        len += 1;
    }
    HeaderValue::from_bytes(&buf[..len]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut v: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn end_to_end_headers_pass_untouched() {
        let mut h = map(&[
            ("host", "a"),
            ("accept", "*/*"),
            ("x-id", "1"),
            ("x-id", "2"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(names(&h), ["accept", "host", "x-id"]);
        assert_eq!(h.get_all("x-id").iter().count(), 2);
    }

    #[test]
    fn fixed_and_listed_hop_by_hop_headers_are_removed() {
        let mut h = map(&[
            ("host", "a"),
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic x"),
            ("proxy-authenticate", "Basic realm=\"x\""),
            ("transfer-encoding", "chunked"),
            ("trailer", "x-sum"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
            ("x-secret", "s"),
            ("x-other", "o"),
            ("x-kept", "k"),
        ]);
        strip_hop_by_hop(&mut h, false);
        // The announcement of the trailers the message ends with stays.
        assert_eq!(names(&h), ["host", "trailer", "x-kept"]);
    }

    #[test]
    fn connection_options_go_with_the_connection_header() {
        for value in ["keep-alive", "close", "Keep-Alive, x-hop", "close, upgrade"] {
            let mut h = map(&[
                ("connection", value),
                ("x-hop", "1"),
                ("upgrade", "h2c"),
                ("x-kept", "k"),
            ]);
            strip_hop_by_hop(&mut h, false);
            let kept = if value.contains("x-hop") {
                vec!["x-kept"]
            } else {
                vec!["x-hop", "x-kept"]
            };
            assert_eq!(names(&h), kept, "{value}");
        }
    }

    #[test]
    fn te_trailers_stays_for_grpc() {
        let mut h = map(&[("te", "trailers"), ("connection", "te")]);
        strip_hop_by_hop(&mut h, false);
        // Listed in `Connection`, so it goes even though its value is `trailers`.
        assert!(h.get("te").is_none());
        let mut h = map(&[("te", "Trailers"), ("keep-alive", "1")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.get("te").unwrap(), "Trailers");
    }

    #[test]
    fn upgrade_is_kept_when_upgrading() {
        let mut h = map(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
        ]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(names(&h), ["upgrade"]);
    }

    #[test]
    fn invalid_connection_tokens_are_ignored() {
        let mut h = map(&[
            ("connection", "bad name, , x-a"),
            ("x-a", "1"),
            ("x-b", "2"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(names(&h), ["x-b"]);
    }

    fn conn(ip: IpAddr, trusted: bool) -> ConnInfo {
        ConnInfo {
            peer: Some(SocketAddr::new(ip, 4000)),
            scheme: "http",
            trusted_forwarding: trusted,
        }
    }

    #[test]
    fn forwarded_for_is_set_or_appended() {
        for (ip, text) in [
            (IpAddr::V4(Ipv4Addr::new(0, 9, 10, 255)), "0.9.10.255"),
            (IpAddr::V4(Ipv4Addr::new(100, 99, 1, 200)), "100.99.1.200"),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), "::1"),
        ] {
            let mut h = HeaderMap::new();
            let c = settle_forwarded_proto(&mut h, conn(ip, false));
            prepare_forward_headers(&mut h, c, false);
            assert_eq!(h.get("x-forwarded-for").unwrap(), text);
            assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        }
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        prepare_forward_headers(&mut h, conn(IpAddr::V4(Ipv4Addr::LOCALHOST), false), false);
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["10.0.0.1, 10.0.0.2, 127.0.0.1"]
        );
    }

    /// Settled before routing: a trusted hop's scheme stands and `http` from it becomes the
    /// request's scheme; a client's own claim is replaced with the scheme it used.
    #[test]
    fn the_forwarded_scheme_is_settled_before_routing() {
        let proto = |h: &HeaderMap| h.get("x-forwarded-proto").cloned();
        let mut h = map(&[("x-forwarded-proto", "http")]);
        let mut tunnel = conn(IpAddr::V4(Ipv4Addr::LOCALHOST), true);
        tunnel.scheme = "https";
        assert_eq!(settle_forwarded_proto(&mut h, tunnel).scheme, "http");
        assert_eq!(proto(&h).unwrap(), "http");
        let mut h = map(&[("x-forwarded-proto", "https")]);
        assert_eq!(settle_forwarded_proto(&mut h, tunnel).scheme, "https");
        let mut h = HeaderMap::new();
        assert_eq!(settle_forwarded_proto(&mut h, tunnel).scheme, "https");
        assert_eq!(
            proto(&h).unwrap(),
            "https",
            "filled in when the edge left it out"
        );

        let mut h = map(&[("x-forwarded-proto", "https")]);
        let client = conn(IpAddr::V4(Ipv4Addr::LOCALHOST), false);
        assert_eq!(settle_forwarded_proto(&mut h, client).scheme, "http");
        assert_eq!(
            proto(&h).unwrap(),
            "http",
            "a client's claim is not believed"
        );
    }

    #[test]
    fn trusted_hops_keep_their_forwarding_headers() {
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-proto", "https"),
        ]);
        prepare_forward_headers(&mut h, conn(IpAddr::V4(Ipv4Addr::LOCALHOST), true), true);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "1.2.3.4");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(h.get("connection").unwrap(), "upgrade");

        let mut h = HeaderMap::new();
        let c = settle_forwarded_proto(&mut h, conn(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)), true));
        prepare_forward_headers(&mut h, c, false);
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.2.3.4",
            "filled in when left out"
        );
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
    }

    /// A `Connection` header may name any header as hop-by-hop, but not the forwarding
    /// headers the proxy itself sets: they reach the backend whatever the client listed.
    #[test]
    fn a_connection_header_cannot_take_out_the_forwarding_headers() {
        for trusted in [false, true] {
            let mut h = map(&[
                ("connection", "x-forwarded-proto, x-forwarded-for, x-gone"),
                ("x-forwarded-proto", "http"),
                ("x-forwarded-for", "10.0.0.1"),
                ("x-gone", "1"),
            ]);
            let mut client = conn(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)), trusted);
            client.scheme = "https";
            let c = settle_forwarded_proto(&mut h, client);
            prepare_forward_headers(&mut h, c, false);
            assert_eq!(
                names(&h),
                ["x-forwarded-for", "x-forwarded-proto"],
                "trusted: {trusted}"
            );
            // A trusted hop's `http` is the request's scheme; anyone else's claim is not.
            let scheme = if trusted { "http" } else { "https" };
            assert_eq!(h.get("x-forwarded-proto").unwrap(), scheme);
            assert_eq!(h.get("x-forwarded-for").unwrap(), "192.0.2.7");
        }
    }
}
