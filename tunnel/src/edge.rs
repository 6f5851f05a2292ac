//! Edge addresses: static `--edge HOST:PORT` entries or the well-known
//! region names, and the per-connection-index address assignment.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom as _;

/// One edge entry as configured (`HOST:PORT` or a socket address).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EdgeAddr {
    host: String,
    port: u16,
}

/// An edge entry that is not `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("edge address {0:?} is not HOST:PORT")]
pub struct EdgeAddrError(pub String);

impl EdgeAddr {
    /// Host (name or IP literal) and port.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }

    /// Resolves to socket addresses (IP literals without DNS).
    pub async fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect())
    }
}

impl std::fmt::Display for EdgeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl From<SocketAddr> for EdgeAddr {
    fn from(a: SocketAddr) -> Self {
        Self::new(a.ip().to_string(), a.port())
    }
}

impl FromStr for EdgeAddr {
    type Err = EdgeAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(sa) = s.parse::<SocketAddr>() {
            return Ok(sa.into());
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| EdgeAddrError(s.to_owned()))?;
        let port = port.parse().map_err(|_| EdgeAddrError(s.to_owned()))?;
        if host.is_empty() || host.contains(':') {
            return Err(EdgeAddrError(s.to_owned()));
        }
        Ok(Self::new(host, port))
    }
}

/// The one address `cloudflared` takes for a static entry: the first IPv4
/// address when the name has one (Go resolves a "tcp" address that way),
/// otherwise the first.
pub(crate) fn static_choice(addrs: &[SocketAddr]) -> Option<SocketAddr> {
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
}

/// Edge port used by discovery.
pub const EDGE_PORT: u16 = 7844;
/// Well-known names of the two edge regions.
pub const REGION_HOSTS: [&str; 2] = ["region1.v2.argotunnel.com", "region2.v2.argotunnel.com"];

/// Which address family of the discovered edge to use (`--edge-ip-version`,
/// `TUNNEL_EDGE_IP_VERSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EdgeIpVersion {
    /// Both families; each region prefers the family of its first address (the
    /// system's RFC 6724 order) and uses the other while that one fails.
    #[default]
    Auto,
    /// IPv4 addresses only.
    V4,
    /// IPv6 addresses only.
    V6,
}

/// An edge IP version other than `auto`, `4` or `6`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("edge IP version {0:?} is not one of auto, 4, 6")]
pub struct EdgeIpVersionError(pub String);

impl FromStr for EdgeIpVersion {
    type Err = EdgeIpVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "4" => Ok(Self::V4),
            "6" => Ok(Self::V6),
            other => Err(EdgeIpVersionError(other.to_owned())),
        }
    }
}

impl EdgeIpVersion {
    /// Whether addresses of `ip`'s family are used.
    pub fn allows(self, ip: IpAddr) -> bool {
        match self {
            Self::Auto => true,
            Self::V4 => ip.is_ipv4(),
            Self::V6 => ip.is_ipv6(),
        }
    }
}

/// How long a region that moved from IPv6 to IPv4 after a connectivity error
/// stays there before an IPv6 failure may move it back (`cloudflared`'s
/// region timeout).
const SECONDARY_FAMILY_PERIOD: Duration = Duration::from_secs(10 * 60);

/// Address assignment per connection index, as `cloudflared` hands out
/// addresses. Entries are split into two regions (even/odd for static
/// edges); each index takes a random unused entry of a region's active
/// family, preferring the region with more of them, and moves to another
/// entry after every duplicate-connection refusal and dial failure.
#[derive(Debug)]
pub(crate) struct EdgePool {
    inner: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    entries: Vec<(SocketAddr, u8)>,
    owner: Vec<Option<u8>>,
    regions: [Region; 2],
}

/// A region's entries by family: the family of its first entry is primary.
/// After a connectivity error on an IPv6 entry the other family becomes
/// active; an error on an IPv4 entry, or one on IPv6 after
/// [`SECONDARY_FAMILY_PERIOD`], makes the primary family active again.
#[derive(Debug, Default)]
struct Region {
    primary: Vec<usize>,
    secondary: Vec<usize>,
    secondary_active: bool,
    secondary_until: Option<Instant>,
}

impl Region {
    fn new(entries: &[(SocketAddr, u8)], region: u8) -> Self {
        let mut primary = Vec::new();
        let mut secondary = Vec::new();
        let mut first_v6 = None;
        for (i, (addr, _)) in entries
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| *r == region)
        {
            let v6 = *first_v6.get_or_insert(addr.is_ipv6());
            if addr.is_ipv6() == v6 {
                primary.push(i);
            } else {
                secondary.push(i);
            }
        }
        Self {
            primary,
            secondary,
            ..Self::default()
        }
    }

    fn active(&self) -> &[usize] {
        if self.secondary_active {
            &self.secondary
        } else {
            &self.primary
        }
    }

    /// Family switching after a connectivity error on one of its entries.
    fn connectivity_error(&mut self, ipv6: bool, now: Instant) {
        if !self.secondary_active {
            if ipv6 && !self.secondary.is_empty() {
                self.secondary_active = true;
                self.secondary_until = Some(now + SECONDARY_FAMILY_PERIOD);
            }
            return;
        }
        if !ipv6 || self.secondary_until.is_none_or(|t| now > t) {
            self.secondary_active = false;
            self.secondary_until = None;
        }
    }
}

impl EdgePool {
    pub(crate) fn new(entries: Vec<(SocketAddr, u8)>) -> Self {
        let owner = vec![None; entries.len()];
        let regions = [Region::new(&entries, 0), Region::new(&entries, 1)];
        Self {
            inner: Mutex::new(PoolState {
                entries,
                owner,
                regions,
            }),
        }
    }

    /// Adds the entries of `found` the pool lacks (a region or a host that did not resolve
    /// before), each as many times as `found` lists it (a static edge listed twice is two
    /// entries); returns how many. A region's family state is kept.
    pub(crate) fn extend(&self, found: Vec<(SocketAddr, u8)>) -> usize {
        let Ok(mut s) = self.inner.lock() else {
            return 0;
        };
        let before = s.entries.len();
        for entry in &found {
            let listed = found.iter().filter(|e| *e == entry).count();
            let held = s.entries.iter().filter(|e| *e == entry).count();
            if held < listed {
                s.entries.push(*entry);
                s.owner.push(None);
            }
        }
        let added = s.entries.len() - before;
        if added > 0 {
            for (r, tag) in [(0, 0u8), (1, 1u8)] {
                let mut region = Region::new(&s.entries, tag);
                region.secondary_active = s.regions[r].secondary_active;
                region.secondary_until = s.regions[r].secondary_until;
                s.regions[r] = region;
            }
        }
        added
    }

    /// Unused entries of the regions' active families.
    pub(crate) fn available(&self) -> usize {
        self.inner
            .lock()
            .map(|s| s.free(0, None).len() + s.free(1, None).len())
            .unwrap_or(0)
    }

    /// Entries of the regions' active families, free or held: how many connections the
    /// pool has addresses for.
    pub(crate) fn usable(&self) -> usize {
        self.inner
            .lock()
            .map(|s| s.regions.iter().map(|r| r.active().len()).sum())
            .unwrap_or(0)
    }

    /// The entry held by `idx`, taking a free one if it holds none.
    pub(crate) fn address(&self, idx: u8) -> Option<SocketAddr> {
        let mut s = self.inner.lock().ok()?;
        if let Some(i) = s.owner.iter().position(|o| *o == Some(idx)) {
            return Some(s.entries[i].0);
        }
        let i = s.pick_free(None)?;
        s.owner[i] = Some(idx);
        Some(s.entries[i].0)
    }

    /// Gives back the entry `idx` holds after a connectivity error and moves
    /// `idx` to a different free entry; keeps the current one if there is
    /// none.
    pub(crate) fn rotate(&self, idx: u8) {
        self.rotate_at(idx, Instant::now());
    }

    fn rotate_at(&self, idx: u8, now: Instant) {
        let Ok(mut s) = self.inner.lock() else {
            return;
        };
        let current = s.owner.iter().position(|o| *o == Some(idx));
        if let Some(c) = current {
            s.owner[c] = None;
            let (addr, region) = s.entries[c];
            if let Some(region) = s.regions.get_mut(usize::from(region)) {
                region.connectivity_error(addr.is_ipv6(), now);
            }
        }
        if let Some(next) = s.pick_free(current).or(current) {
            s.owner[next] = Some(idx);
        }
    }
}

impl PoolState {
    /// Unused entries of region `r`'s active family, other than `exclude`.
    fn free(&self, r: usize, exclude: Option<usize>) -> Vec<usize> {
        self.regions[r]
            .active()
            .iter()
            .copied()
            .filter(|i| self.owner[*i].is_none() && Some(*i) != exclude)
            .collect()
    }

    /// A random free entry of the region with more of them (either on a tie,
    /// at random), else of the other region, as `cloudflared` picks.
    fn pick_free(&self, exclude: Option<usize>) -> Option<usize> {
        let first = match self.free(0, None).len().cmp(&self.free(1, None).len()) {
            std::cmp::Ordering::Equal => usize::from(rand::random_bool(0.5)),
            std::cmp::Ordering::Greater => 0,
            std::cmp::Ordering::Less => 1,
        };
        [first, 1 - first]
            .into_iter()
            .find_map(|r| self.free(r, exclude).choose(&mut rand::rng()).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn parses_host_port_forms() {
        assert_eq!(
            "127.0.0.1:7844".parse::<EdgeAddr>().unwrap().to_string(),
            "127.0.0.1:7844"
        );
        assert_eq!(
            "[::1]:1".parse::<EdgeAddr>().unwrap().to_string(),
            "[::1]:1"
        );
        assert_eq!(
            "edge.example:7844".parse::<EdgeAddr>().unwrap(),
            EdgeAddr::new("edge.example", 7844)
        );
        assert!("nope".parse::<EdgeAddr>().is_err());
        assert!("a:b".parse::<EdgeAddr>().is_err());
    }

    fn v6(n: u16) -> SocketAddr {
        SocketAddr::from(([0x2606, 0x4700, 0xa0, 0, 0, 0, 0, n], 7844))
    }

    #[test]
    fn entries_found_later_join_the_pool_as_often_as_listed() {
        let pool = EdgePool::new(vec![(sa(1), 0)]);
        assert_eq!(pool.address(0), Some(sa(1)));
        assert_eq!(pool.available(), 0);
        // The other region, found on a later lookup, with the entry already held.
        assert_eq!(pool.extend(vec![(sa(1), 0), (sa(2), 1), (sa(3), 1)]), 2);
        assert_eq!(pool.extend(vec![(sa(2), 1)]), 0, "none held twice over");
        // An address listed twice (two connections to one listener) is two entries.
        assert_eq!(pool.extend(vec![(sa(1), 0), (sa(1), 0)]), 1);
        assert_eq!(pool.available(), 3);
        assert_eq!(pool.address(0), Some(sa(1)), "held entries stay");
        let mut taken = [pool.address(1), pool.address(2), pool.address(3)];
        taken.sort();
        assert_eq!(taken, [Some(sa(1)), Some(sa(2)), Some(sa(3))]);
        assert_eq!(pool.available(), 0);
    }

    fn v4(n: u8) -> SocketAddr {
        SocketAddr::from(([198, 41, 192, n], 7844))
    }

    #[test]
    fn static_names_take_their_first_ipv4_address() {
        assert_eq!(static_choice(&[v6(1), v4(1), v4(2)]), Some(v4(1)));
        assert_eq!(static_choice(&[v6(1), v6(2)]), Some(v6(1)));
        assert_eq!(static_choice(&[]), None);
    }

    #[test]
    fn edge_ip_versions_parse_as_cloudflared_spells_them() {
        assert_eq!("auto".parse(), Ok(EdgeIpVersion::Auto));
        assert_eq!("4".parse(), Ok(EdgeIpVersion::V4));
        assert_eq!("6".parse(), Ok(EdgeIpVersion::V6));
        assert!("ipv6".parse::<EdgeIpVersion>().is_err());
        assert!(EdgeIpVersion::V6.allows(v6(1).ip()) && !EdgeIpVersion::V6.allows(v4(1).ip()));
    }

    /// A region prefers the family of its first address, moves to the other
    /// family after a connectivity error on IPv6, and back after one on IPv4.
    #[test]
    fn a_region_falls_back_from_ipv6_to_ipv4_and_back() {
        let pool = EdgePool::new(vec![(v6(1), 0), (v4(1), 0)]);
        assert_eq!(pool.available(), 1, "only the preferred family is in use");
        assert_eq!(pool.address(0), Some(v6(1)));
        pool.rotate(0);
        assert_eq!(pool.address(0), Some(v4(1)));
        pool.rotate(0);
        assert_eq!(pool.address(0), Some(v6(1)));
    }

    /// After the move to IPv4, an IPv6 failure of another connection returns
    /// the region to IPv6 only once the period has passed.
    #[test]
    fn ipv6_failures_return_to_ipv6_only_after_the_period() {
        let start = Instant::now();
        let pool = EdgePool::new(vec![
            (v6(1), 0),
            (v6(2), 0),
            (v6(3), 0),
            (v4(1), 0),
            (v4(2), 0),
            (v4(3), 0),
        ]);
        for idx in 0..3 {
            assert!(pool.address(idx).is_some_and(|a| a.is_ipv6()));
        }
        pool.rotate_at(0, start);
        assert!(pool.address(0).is_some_and(|a| a.is_ipv4()));
        pool.rotate_at(1, start + Duration::from_secs(60));
        assert!(
            pool.address(1).is_some_and(|a| a.is_ipv4()),
            "still on IPv4 within the period"
        );
        pool.rotate_at(2, start + SECONDARY_FAMILY_PERIOD + Duration::from_secs(1));
        assert!(
            pool.address(2).is_some_and(|a| a.is_ipv6()),
            "back on IPv6 after it"
        );
    }

    /// A region that prefers IPv4 stays on IPv4 after IPv4 failures.
    #[test]
    fn an_ipv4_region_does_not_move_to_ipv6() {
        let pool = EdgePool::new(vec![(v4(1), 0), (v6(1), 0), (v4(2), 0)]);
        for _ in 0..10 {
            assert!(pool.address(0).is_some_and(|a| a.is_ipv4()));
            pool.rotate(0);
        }
    }

    /// Addresses within a region and regions with as many free addresses are
    /// picked at random, and every rotation moves to another address.
    #[test]
    fn picks_are_random_and_rotation_always_moves() {
        let entries: Vec<_> = (1..=4).map(|n| (v4(n), 0)).collect();
        let mut seen = std::collections::HashSet::new();
        let pool = EdgePool::new(entries.clone());
        for _ in 0..200 {
            seen.insert(EdgePool::new(entries.clone()).address(0).unwrap());
            let before = pool.address(0).unwrap();
            pool.rotate(0);
            assert_ne!(pool.address(0).unwrap(), before);
        }
        assert_eq!(seen.len(), 4, "every address is a first pick: {seen:?}");
        let regions: std::collections::HashSet<_> = (0..200)
            .map(|_| {
                EdgePool::new(vec![(v4(1), 0), (v4(2), 1)])
                    .address(0)
                    .unwrap()
            })
            .collect();
        assert_eq!(regions.len(), 2, "either region on a tie");
    }

    #[test]
    fn indexes_spread_over_regions_and_rotate() {
        let pool = EdgePool::new(vec![(sa(1), 0), (sa(2), 1), (sa(3), 0), (sa(4), 1)]);
        let a = pool.address(0).unwrap();
        let b = pool.address(1).unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.address(0), Some(a));
        pool.rotate(0);
        let a2 = pool.address(0).unwrap();
        assert_ne!(a2, a);
        assert_ne!(a2, b);
    }

    #[test]
    fn repeated_entries_give_one_connection_each() {
        let pool = EdgePool::new(vec![(sa(1), 0), (sa(1), 1)]);
        assert_eq!(pool.address(0), Some(sa(1)));
        assert_eq!(pool.address(1), Some(sa(1)));
        assert_eq!(pool.address(2), None);
    }
}
