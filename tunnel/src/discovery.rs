//! Edge discovery through the SRV records `cloudflared` uses:
//! `_v2-origintunneld._tcp.argotunnel.com` (or `_<region>-v2-origintunneld…`
//! for a token endpoint such as `fed`). The system resolver is tried first,
//! then DNS-over-TLS to 1.1.1.1:853 (`cloudflare-dns.com`). The first SRV
//! target is region 1, the second region 2; each is resolved to its
//! addresses, all on the SRV port.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;

/// Why discovery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// Neither the system resolver nor DNS-over-TLS answered.
    #[error("SRV lookup of {name} failed: {reason}")]
    Lookup {
        /// The SRV name.
        name: String,
        /// Resolver error text.
        reason: String,
    },
    /// The SRV answer has fewer than two targets.
    #[error("SRV answer has {0} targets, at least 2 are needed")]
    TooFewTargets(usize),
    /// No region target resolved to an address.
    #[error("edge region hosts resolved to no address")]
    NoAddresses,
}

const DOT_TIMEOUT: Duration = Duration::from_secs(15);

/// SRV name for an optional region.
pub(crate) fn srv_name(region: Option<&str>) -> String {
    match region {
        Some(r) if !r.is_empty() => format!("_{r}-v2-origintunneld._tcp.argotunnel.com."),
        _ => "_v2-origintunneld._tcp.argotunnel.com.".to_owned(),
    }
}

/// One SRV answer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SrvTarget {
    pub(crate) target: String,
    pub(crate) port: u16,
    pub(crate) priority: u16,
    pub(crate) weight: u16,
}

/// Orders the answer (priority, then heavier weight first) and keeps the
/// two region targets.
pub(crate) fn region_targets(
    mut records: Vec<SrvTarget>,
) -> Result<[SrvTarget; 2], DiscoveryError> {
    records.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.weight.cmp(&a.weight)));
    let n = records.len();
    let mut it = records.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(DiscoveryError::TooFewTargets(n)),
    }
}

fn dot_resolver() -> TokioResolver {
    let ips: [IpAddr; 2] = [
        Ipv4Addr::new(1, 1, 1, 1).into(),
        Ipv4Addr::new(1, 0, 0, 1).into(),
    ];
    let group = NameServerConfigGroup::from_ips_tls(&ips, 853, "cloudflare-dns.com".into(), true);
    TokioResolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], group),
        TokioConnectionProvider::default(),
    )
    .build()
}

async fn lookup_srv(resolver: &TokioResolver, name: &str) -> Result<Vec<SrvTarget>, String> {
    let answer = tokio::time::timeout(DOT_TIMEOUT, resolver.srv_lookup(name))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(answer
        .iter()
        .map(|r| SrvTarget {
            target: r.target().to_utf8(),
            port: r.port(),
            priority: r.priority(),
            weight: r.weight(),
        })
        .collect())
}

/// Discovers edge addresses, tagged with their region (0 or 1).
pub(crate) async fn discover(
    region: Option<&str>,
) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError> {
    let name = srv_name(region);
    let system = TokioResolver::builder_tokio().map(|b| b.build());
    let mut resolvers = Vec::new();
    if let Ok(r) = system {
        resolvers.push(r);
    }
    resolvers.push(dot_resolver());
    let mut last_err = String::from("no resolver");
    for resolver in &resolvers {
        let records = match lookup_srv(resolver, &name).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "edge SRV lookup failed");
                last_err = e;
                continue;
            }
        };
        let targets = region_targets(records)?;
        let mut out = Vec::new();
        for (region, t) in targets.iter().enumerate() {
            match tokio::time::timeout(DOT_TIMEOUT, resolver.lookup_ip(t.target.as_str())).await {
                Ok(Ok(ips)) => out.extend(
                    ips.iter()
                        .map(|ip| (SocketAddr::new(ip, t.port), region as u8)),
                ),
                Ok(Err(e)) => {
                    tracing::warn!(host = %t.target, error = %e, "edge region lookup failed")
                }
                Err(_) => tracing::warn!(host = %t.target, "edge region lookup timed out"),
            }
        }
        if out.is_empty() {
            return Err(DiscoveryError::NoAddresses);
        }
        return Ok(out);
    }
    Err(DiscoveryError::Lookup {
        name,
        reason: last_err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(target: &str, priority: u16, weight: u16) -> SrvTarget {
        SrvTarget {
            target: target.into(),
            port: 7844,
            priority,
            weight,
        }
    }

    #[test]
    fn srv_names_are_region_aware() {
        assert_eq!(srv_name(None), "_v2-origintunneld._tcp.argotunnel.com.");
        assert_eq!(
            srv_name(Some("fed")),
            "_fed-v2-origintunneld._tcp.argotunnel.com."
        );
    }

    #[test]
    fn two_targets_become_the_regions_in_priority_order() {
        let [a, b] = region_targets(vec![
            t("region2.v2.argotunnel.com.", 2, 1),
            t("region1.v2.argotunnel.com.", 1, 1),
        ])
        .unwrap();
        assert_eq!(a.target, "region1.v2.argotunnel.com.");
        assert_eq!(b.target, "region2.v2.argotunnel.com.");
        assert_eq!(
            region_targets(vec![t("x.", 1, 1)]).unwrap_err(),
            DiscoveryError::TooFewTargets(1)
        );
    }
}
