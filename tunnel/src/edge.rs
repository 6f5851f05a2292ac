//! Edge addresses: static `--edge HOST:PORT` entries or the well-known
//! region names, and the per-connection-index address assignment.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Mutex;

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

/// Edge port used by discovery.
pub const EDGE_PORT: u16 = 7844;
/// Well-known names of the two edge regions.
pub const REGION_HOSTS: [&str; 2] = ["region1.v2.argotunnel.com", "region2.v2.argotunnel.com"];

/// Address assignment per connection index. Entries are split into two
/// regions (even/odd for static edges); each index takes an unused entry,
/// preferring the region with more free entries, and moves to another
/// entry on duplicate-connection errors or repeated dial failures.
#[derive(Debug)]
pub(crate) struct EdgePool {
    inner: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    entries: Vec<(SocketAddr, u8)>,
    owner: Vec<Option<u8>>,
}

impl EdgePool {
    pub(crate) fn new(entries: Vec<(SocketAddr, u8)>) -> Self {
        let owner = vec![None; entries.len()];
        Self {
            inner: Mutex::new(PoolState { entries, owner }),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.lock().map(|s| s.entries.len()).unwrap_or(0)
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

    /// Moves `idx` to a different free entry, if there is one.
    pub(crate) fn rotate(&self, idx: u8) {
        let Ok(mut s) = self.inner.lock() else {
            return;
        };
        let current = s.owner.iter().position(|o| *o == Some(idx));
        if let Some(next) = s.pick_free(current) {
            if let Some(c) = current {
                s.owner[c] = None;
            }
            s.owner[next] = Some(idx);
        }
    }
}

impl PoolState {
    fn pick_free(&self, exclude: Option<usize>) -> Option<usize> {
        let free = |region: u8| {
            self.entries
                .iter()
                .enumerate()
                .filter(|(i, (_, r))| {
                    *r == region && self.owner[*i].is_none() && Some(*i) != exclude
                })
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        let (r0, r1) = (free(0), free(1));
        let region = if r0.len() >= r1.len() { r0 } else { r1 };
        region.first().copied()
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
