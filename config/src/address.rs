//! Which addresses are public: the rule behind `publicOnly` ([`crate::Backend::public_only`]).
//! The proxy applies it to every address a public-only backend resolves to, at each dial; the
//! controller applies it ahead to the IP literals it is given, so that a backend the proxy
//! would never dial is refused with a reason rather than admitted and then failing every
//! request.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is a public (global unicast) address: not loopback, private, link-local,
/// CGNAT, multicast, reserved or unspecified, nor a cloud's host endpoint (Azure's WireServer),
/// nor an IPv6 form that reaches an IPv4 address (mapped, compatible, SIIT, NAT64, 6to4)
/// unless that address is public, nor a prefix that tunnels or translates to places this check
/// cannot see (local-use NAT64, Teredo).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, d] = ip.octets();
    !(a == 0 // this network
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // CGNAT, 100.64/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, cloud metadata
        || [a, b, c, d] == [168, 63, 129, 16] // Azure WireServer, reachable from every Azure VM
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 168) // private
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18/15
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: [u16; 2]| Ipv4Addr::from((u32::from(hi[0]) << 16) | u32::from(hi[1]));
    // ::a.b.c.d (compatible, also `::` and `::1`) and ::ffff:a.b.c.d (mapped).
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // SIIT, ::ffff:0:a.b.c.d.
    if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // NAT64, 64:ff9b::/96: the translator dials the embedded IPv4 address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // 6to4, 2002:a.b.c.d::/48: relayed to the embedded IPv4 address.
    if s[0] == 0x2002 {
        return is_public_v4(embedded([s[1], s[2]]));
    }
    !((s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64, 64:ff9b:1::/48
        || (s[0] == 0x2001 && s[1] == 0) // Teredo, 2001::/32
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated, still routed inside sites), fec0::/10
        || (s[0] & 0xff00) == 0xff00) // multicast, ff00::/8
}

#[cfg(test)]
mod tests {
    use super::is_public;
    use std::net::IpAddr;

    fn public(ip: &str) -> bool {
        is_public(ip.parse::<IpAddr>().expect("test address parses"))
    }

    #[test]
    fn only_global_unicast_addresses_are_public() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            // IPv4-mapped, IPv4-compatible and NAT64 forms reach the IPv4 address they embed.
            "::ffff:127.0.0.1",
            "::ffff:10.96.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::192.168.0.1",
            // SIIT and 6to4 forms of private addresses, and prefixes that lead past the check.
            "::ffff:0:10.0.0.1",
            "::ffff:0:169.254.169.254",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
            "feff::1",
        ] {
            assert!(!public(ip), "{ip} is not public");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.255.255",
            "169.255.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "192.167.255.255",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "fbff::1",
            "::ffff:0:8.8.8.8",
            "2002:808:808::1",
            "2001:1::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(public(ip), "{ip} is public");
        }
    }

    /// Azure's host endpoint answers every VM as a metadata service does (agent configuration,
    /// health reports), at an address of Microsoft's public range: that one address, in any
    /// form, is not public; its neighbours are.
    #[test]
    fn azures_wireserver_is_not_public_but_its_neighbours_are() {
        for ip in [
            "168.63.129.16",
            "::ffff:168.63.129.16",
            "::ffff:0:168.63.129.16",
            "64:ff9b::a83f:8110",
            "2002:a83f:8110::1",
        ] {
            assert!(!public(ip), "{ip} is not public");
        }
        for ip in [
            "168.63.129.15",
            "168.63.129.17",
            "168.63.128.16",
            "::ffff:168.63.129.17",
        ] {
            assert!(public(ip), "{ip} is public");
        }
    }
}
