//! Which addresses are public: the rule behind `publicOnly` ([`crate::Backend::public_only`]).
//! The proxy applies it to every address a public-only backend resolves to, at each dial; the
//! controller applies it ahead to the IP literals it is given, so that a backend the proxy
//! would never dial is refused with a reason rather than admitted and then failing every
//! request.
//!
//! The reserved ranges are not all of a cluster's own: a cluster may give its Services, pods
//! or nodes globally routable addresses (GKE's Google-managed Service range, EKS's IPv6 pods,
//! nodes with public IPs). Those ranges are listed by the operator ([`ClusterRanges`]), and
//! both sides read them out of public with [`is_public_with`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;

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

/// [`is_public`], and outside every one of the cluster's own `ranges` (in any form that
/// reaches an address of them: an IPv4 range covers its mapped, SIIT, NAT64 and 6to4 forms).
pub fn is_public_with(ip: IpAddr, ranges: &ClusterRanges) -> bool {
    is_public(ip) && ranges.containing(ip).is_none()
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

/// The IPv4 address an IPv6 form reaches, for the forms that lead to one: compatible
/// (`::a.b.c.d`, also `::` and `::1`), mapped (`::ffff:a.b.c.d`), SIIT (`::ffff:0:a.b.c.d`),
/// NAT64 (`64:ff9b::/96`, whose translator dials the embedded address) and 6to4
/// (`2002:a.b.c.d::/48`, relayed to it).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if (s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff))
        || (s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0)
        || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
    {
        return Some(embedded(s[6], s[7]));
    }
    (s[0] == 0x2002).then(|| embedded(s[1], s[2]))
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    !((s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64, 64:ff9b:1::/48
        || (s[0] == 0x2001 && s[1] == 0) // Teredo, 2001::/32
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated, still routed inside sites), fec0::/10
        || (s[0] & 0xff00) == 0xff00) // multicast, ff00::/8
}

/// One range of addresses, `ADDRESS/PREFIX` (a bare address: that address alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range (an IPv4 range holds IPv4 addresses only, an IPv6 range
    /// IPv6 ones).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// Refuses an address with bits set past its prefix (`34.118.224.10/20`): whether the
    /// range or the address was meant cannot be told, and taking either quietly would leave
    /// addresses in or out that the operator did not mean.
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address range (ADDRESS/PREFIX)"))?;
        // An IPv4 range written as IPv6 would match no IPv4 address a name resolves to.
        if let IpAddr::V6(v6) = addr {
            if v6.to_ipv4_mapped().is_some() {
                return Err(format!(
                    "{s:?}: write an IPv4 range as IPv4 (it covers the IPv6 forms that reach it)"
                ));
            }
        }
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => Some(p)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        let range = Self { addr, prefix };
        let network = Self {
            addr: match addr {
                IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(
                    u32::from(a) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0),
                )),
                IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(
                    u128::from(a) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0),
                )),
            },
            prefix,
        };
        if network != range {
            return Err(format!(
                "{s:?} has bits set past its prefix length: the range is {network}"
            ));
        }
        Ok(range)
    }
}

/// The cluster's own address ranges (Service, pod and node ranges) that are globally routable,
/// which `publicOnly` backends must not reach all the same: comma-separated CIDRs, IPv4 and
/// IPv6, none by default. Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterRanges(Arc<[Cidr]>);

impl ClusterRanges {
    /// The range `ip` falls in, directly or through an IPv6 form that reaches an IPv4 address
    /// (see [`is_public`]).
    pub fn containing(&self, ip: IpAddr) -> Option<Cidr> {
        let reached = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.0
            .iter()
            .find(|r| r.contains(ip) || reached.is_some_and(|v4| r.contains(v4)))
            .copied()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ClusterRanges {
    /// As the setting is written: comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{range}")?;
        }
        Ok(())
    }
}

impl FromStr for ClusterRanges {
    type Err = String;

    /// Comma-separated ranges, spaces around each ignored; empty: none.
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<Cidr>, _>>()
            .map(|ranges| Self(ranges.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_public, is_public_with, ClusterRanges};
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

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address parses")
    }

    /// A cluster's own globally routable ranges (GKE's Service range, EKS's IPv6 pods, a node's
    /// public address) are public by the reserved ranges alone, and not once listed: in every
    /// form that reaches them, and only them.
    #[test]
    fn the_clusters_own_ranges_are_not_public() {
        let ranges: ClusterRanges = "34.118.224.0/20, 2600:1f14:abc::/56,203.0.113.7"
            .parse()
            .expect("ranges parse");
        for inside in [
            "34.118.224.10",
            "34.118.224.0",
            "34.118.239.255",
            "::ffff:34.118.224.10",
            "::ffff:0:34.118.224.10",
            "64:ff9b::2276:e00a",
            "2002:2276:e00a::1",
            "2600:1f14:abc:ff::1",
            "203.0.113.7",
        ] {
            assert!(
                public(inside),
                "{inside} is public by the reserved ranges alone"
            );
            assert!(
                !is_public_with(ip(inside), &ranges),
                "{inside} is in a listed range"
            );
        }
        assert_eq!(
            ranges
                .containing(ip("::ffff:34.118.230.1"))
                .map(|r| r.to_string()),
            Some("34.118.224.0/20".to_owned())
        );
        for outside in [
            "34.118.240.0",
            "34.118.223.255",
            "2600:1f14:abc:100::1",
            "203.0.113.8",
            "8.8.8.8",
        ] {
            assert!(
                is_public_with(ip(outside), &ranges),
                "{outside} is outside every listed range"
            );
        }
        // Listing ranges never makes a reserved address public.
        assert!(!is_public_with(ip("10.0.0.1"), &ranges));
        assert!(!is_public_with(ip("10.0.0.1"), &ClusterRanges::default()));
        assert!(is_public_with(
            ip("34.118.224.10"),
            &ClusterRanges::default()
        ));
    }

    #[test]
    fn ranges_read_as_written_and_malformed_ones_are_refused() {
        let ranges: ClusterRanges = " 10.96.0.0/12 ,fd00::/8,,1.2.3.4".parse().expect("parse");
        assert_eq!(ranges.to_string(), "10.96.0.0/12,fd00::/8,1.2.3.4/32");
        assert!("".parse::<ClusterRanges>().expect("empty").is_empty());
        for (bad, says) in [
            ("34.118.224.10/20", "the range is 34.118.224.0/20"),
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0.0/", "prefix length"),
            ("10.0.0.0/+8", "prefix length"),
            ("10.0.0/8", "not an address range"),
            ("example.com/8", "not an address range"),
            ("::ffff:34.118.224.0/116", "write an IPv4 range as IPv4"),
        ] {
            let err = bad.parse::<ClusterRanges>().expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        // A /0 holds every address of its family only.
        let all_v4: ClusterRanges = "0.0.0.0/0".parse().expect("parse");
        assert!(!is_public_with(ip("8.8.8.8"), &all_v4));
        assert!(is_public_with(ip("2606:4700::1111"), &all_v4));
    }
}
