//! Edge discovery through the SRV records `cloudflared` uses:
//! `_v2-origintunneld._tcp.argotunnel.com` (or `_<region>-v2-origintunneld…`
//! for a token endpoint such as `fed`). The system resolver is tried first,
//! then DNS-over-TLS to 1.1.1.1:853 (`cloudflare-dns.com`) when the system
//! resolver is unavailable or its lookup fails. The first SRV
//! target is region 1, the second region 2; each is resolved to its IPv4 and
//! IPv6 addresses, all on the SRV port, by the system resolver first, and
//! ordered as Go's resolver orders them (RFC 6724), which decides the
//! family a region prefers.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use hickory_resolver::config::{LookupIpStrategy, NameServerConfigGroup, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::{ResolverBuilder, TokioResolver};

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

/// The source address the system would use towards `dst`, found by
/// connecting a UDP socket (nothing is sent); `None` when there is no route.
pub(crate) fn source_towards(dst: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((any, 0)).ok()?;
    sock.connect((dst, 9)).ok()?;
    sock.local_addr().ok().map(|a| a.ip())
}

/// Orders destination addresses as Go's resolver does (RFC 6724 section 6,
/// the rules that tell the families apart): reachable first, then a source
/// of matching scope, then a source of matching label, then higher
/// precedence. The order is otherwise kept. `source` gives the source
/// address towards a destination.
pub(crate) fn sort_rfc6724(ips: &mut [IpAddr], source: impl Fn(IpAddr) -> Option<IpAddr>) {
    let mut keyed: Vec<_> = ips
        .iter()
        .map(|&dst| {
            let key = match source(dst) {
                None => (false, false, false, 0),
                Some(src) => {
                    let (dst_p, dst_l) = policy(dst);
                    (
                        true,
                        scope(src) == scope(dst),
                        policy(src).1 == dst_l,
                        dst_p,
                    )
                }
            };
            (std::cmp::Reverse(key), dst)
        })
        .collect();
    keyed.sort_by_key(|(key, _)| *key);
    for (slot, (_, ip)) in ips.iter_mut().zip(keyed) {
        *slot = ip;
    }
}

/// A region's edge entries: `ips` in Go's order ([`sort_rfc6724`] from this
/// host), all on `port`.
pub(crate) fn region_entries(
    mut ips: Vec<IpAddr>,
    port: u16,
    region: u8,
) -> impl Iterator<Item = (SocketAddr, u8)> {
    sort_rfc6724(&mut ips, source_towards);
    ips.into_iter()
        .map(move |ip| (SocketAddr::new(ip, port), region))
}

/// RFC 6724 scope, as Go classifies it.
fn scope(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() || v4.is_link_local() => 0x2,
        IpAddr::V4(_) => 0xe,
        IpAddr::V6(v6) => {
            let o = v6.octets();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return scope(v4.into());
            }
            if v6.is_loopback() || (o[0] == 0xfe && o[1] & 0xc0 == 0x80) {
                0x2
            } else if v6.is_multicast() {
                o[1] & 0xf
            } else if o[0] == 0xfe && o[1] & 0xc0 == 0xc0 {
                0x5
            } else {
                0xe
            }
        }
    }
}

/// (precedence, label) from RFC 6724's default policy table.
fn policy(ip: IpAddr) -> (u8, u8) {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let bits = u128::from(v6);
    let within = |prefix: u128, len: u32| len == 0 || (bits ^ prefix) >> (128 - len) == 0;
    const TABLE: [(u128, u32, u8, u8); 9] = [
        (1, 128, 50, 0),               // ::1/128
        (0xffff_0000_0000, 96, 35, 4), // ::ffff:0:0/96
        (0, 96, 1, 3),                 // ::/96
        (0x2001_0000 << 96, 32, 5, 5), // 2001::/32
        (0x2002 << 112, 16, 30, 2),    // 2002::/16
        (0x3ffe << 112, 16, 1, 12),    // 3ffe::/16
        (0xfec0 << 112, 10, 1, 11),    // fec0::/10
        (0xfc00 << 112, 7, 3, 13),     // fc00::/7
        (0, 0, 40, 1),                 // ::/0
    ];
    TABLE
        .iter()
        .find(|(prefix, len, _, _)| within(*prefix, *len))
        .map_or((40, 1), |&(_, _, p, l)| (p, l))
}

/// SRV and address lookups of one resolver. A seam so the order in which
/// discovery consults resolvers can be exercised without a network.
pub(crate) trait EdgeLookup: Send + Sync {
    /// The SRV answer for `name`.
    fn srv(&self, name: &str) -> impl Future<Output = Result<Vec<SrvTarget>, String>> + Send;
    /// The A/AAAA addresses of `host`.
    fn ips(&self, host: &str) -> impl Future<Output = Result<Vec<IpAddr>, String>> + Send;
}

/// A hickory resolver: the system one or DNS-over-TLS to 1.1.1.1.
pub(crate) struct Hickory(TokioResolver);

impl Hickory {
    /// Asks for A and AAAA records together, as Go's resolver does; hickory's
    /// default asks for AAAA only when there is no A record, which leaves an
    /// IPv6-only host without a usable edge.
    fn build(mut builder: ResolverBuilder<TokioConnectionProvider>) -> Self {
        builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        Self(builder.build())
    }
}

impl EdgeLookup for Hickory {
    async fn srv(&self, name: &str) -> Result<Vec<SrvTarget>, String> {
        let answer = self.0.srv_lookup(name).await.map_err(|e| e.to_string())?;
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

    async fn ips(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let answer = self.0.lookup_ip(host).await.map_err(|e| e.to_string())?;
        Ok(answer.iter().collect())
    }
}

/// Builds the system resolver. Blocking: it reads /etc/resolv.conf and
/// /etc/hosts.
fn system_resolver() -> Result<Hickory, String> {
    TokioResolver::builder_tokio()
        .map(Hickory::build)
        .map_err(|e| e.to_string())
}

/// Builds the DNS-over-TLS resolver. Blocking: it reads /etc/hosts.
fn dot_resolver() -> Result<Hickory, String> {
    let ips: [IpAddr; 2] = [
        Ipv4Addr::new(1, 1, 1, 1).into(),
        Ipv4Addr::new(1, 0, 0, 1).into(),
    ];
    let group = NameServerConfigGroup::from_ips_tls(&ips, 853, "cloudflare-dns.com".into(), true);
    Ok(Hickory::build(TokioResolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], group),
        TokioConnectionProvider::default(),
    )))
}

/// Runs a resolver constructor on tokio's blocking pool, because building
/// one reads system files with blocking I/O that would stall the async
/// worker threads.
async fn build_resolver<L, F>(build: F) -> Result<L, String>
where
    L: Send + 'static,
    F: FnOnce() -> Result<L, String> + Send + 'static,
{
    tokio::task::spawn_blocking(build)
        .await
        .map_err(|e| format!("resolver setup did not complete: {e}"))?
}

/// An SRV lookup with the DNS-over-TLS timeout. An empty answer is a failed
/// lookup (Go's resolver, which `cloudflared` uses, reports it as an error).
async fn lookup_srv<L: EdgeLookup>(resolver: &L, name: &str) -> Result<Vec<SrvTarget>, String> {
    let records = tokio::time::timeout(DOT_TIMEOUT, resolver.srv(name))
        .await
        .map_err(|_| "timed out".to_owned())??;
    if records.is_empty() {
        return Err("no SRV records".to_owned());
    }
    Ok(records)
}

/// Resolves the two region targets of an SRV answer. Each host is looked
/// up with the resolvers in order, the system one first when it exists (as
/// in `cloudflared`, so `/etc/hosts` entries and split-horizon DNS for the
/// region hosts are honoured), DNS-over-TLS after it. A host that resolves
/// nowhere is logged and left out; discovery fails only when neither does.
async fn resolve_regions<L: EdgeLookup>(
    resolvers: &[&L],
    records: Vec<SrvTarget>,
) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError> {
    let targets = region_targets(records)?;
    let mut out = Vec::new();
    for (region, t) in targets.iter().enumerate() {
        for (i, resolver) in resolvers.iter().enumerate() {
            let failure =
                match tokio::time::timeout(DOT_TIMEOUT, resolver.ips(t.target.as_str())).await {
                    Ok(Ok(ips)) if !ips.is_empty() => {
                        out.extend(region_entries(ips, t.port, region as u8));
                        break;
                    }
                    Ok(Ok(_)) => "no addresses".to_owned(),
                    Ok(Err(e)) => e,
                    Err(_) => "timed out".to_owned(),
                };
            let last = i + 1 == resolvers.len();
            tracing::warn!(host = %t.target, error = %failure, last, "edge region lookup failed");
        }
    }
    if out.is_empty() {
        return Err(DiscoveryError::NoAddresses);
    }
    Ok(out)
}

/// Discovers edge addresses, tagged with their region (0 or 1).
pub(crate) async fn discover(
    region: Option<&str>,
) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError> {
    discover_with(&srv_name(region), system_resolver, dot_resolver).await
}

/// Discovery with the resolvers given as constructors.
///
/// As in `cloudflared`, DNS-over-TLS is tried only when the system resolver
/// cannot be set up or its SRV lookup fails; a system answer with fewer than
/// two targets is refused as it is, like any other answer. The region hosts
/// are resolved by the system resolver even after a DNS-over-TLS SRV answer,
/// falling back to DNS-over-TLS per host.
async fn discover_with<L, S, D>(
    name: &str,
    system: S,
    dot: D,
) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError>
where
    L: EdgeLookup + 'static,
    S: FnOnce() -> Result<L, String> + Send + 'static,
    D: FnOnce() -> Result<L, String> + Send + 'static,
{
    let mut failures = Vec::new();
    let system = match build_resolver(system).await {
        Ok(resolver) => match lookup_srv(&resolver, name).await {
            Ok(records) => return resolve_regions(&[&resolver], records).await,
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "edge SRV lookup failed; trying DNS-over-TLS");
                failures.push(format!("system resolver: {e}"));
                Some(resolver)
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "system resolver unavailable; trying DNS-over-TLS");
            failures.push(format!("system resolver unavailable: {e}"));
            None
        }
    };
    let looked_up = match build_resolver(dot).await {
        Ok(dot) => match lookup_srv(&dot, name).await {
            Ok(records) => {
                let resolvers: Vec<&L> = system.iter().chain([&dot]).collect();
                return resolve_regions(&resolvers, records).await;
            }
            Err(e) => e,
        },
        Err(e) => e,
    };
    tracing::warn!(name = %name, error = %looked_up, "edge SRV lookup over DNS-over-TLS failed");
    failures.push(format!("DNS-over-TLS: {looked_up}"));
    Err(DiscoveryError::Lookup {
        name: name.to_owned(),
        reason: failures.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    use super::*;

    /// A resolver with a fixed SRV answer whose every host resolves to `ip`,
    /// or to nothing when it is `None`.
    struct Fake {
        srv: Result<Vec<SrvTarget>, String>,
        ip: Option<IpAddr>,
    }

    impl EdgeLookup for Fake {
        async fn srv(&self, _: &str) -> Result<Vec<SrvTarget>, String> {
            self.srv.clone()
        }

        async fn ips(&self, host: &str) -> Result<Vec<IpAddr>, String> {
            self.ip
                .map(|ip| vec![ip])
                .ok_or_else(|| format!("{host}: NXDOMAIN"))
        }
    }

    const SYSTEM_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    const DOT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));

    fn both_regions() -> Vec<SrvTarget> {
        vec![
            t("region1.v2.argotunnel.com.", 1, 1),
            t("region2.v2.argotunnel.com.", 2, 1),
        ]
    }

    /// Which resolvers were built, and on which threads.
    #[derive(Default, Clone)]
    struct Built(Arc<Mutex<Vec<(&'static str, ThreadId)>>>);

    impl Built {
        fn builder(
            &self,
            which: &'static str,
            srv: Result<Vec<SrvTarget>, String>,
            ip: Option<IpAddr>,
        ) -> impl FnOnce() -> Result<Fake, String> + Send + 'static {
            let log = self.0.clone();
            move || {
                log.lock()
                    .unwrap()
                    .push((which, std::thread::current().id()));
                Ok(Fake { srv, ip })
            }
        }

        fn names(&self) -> Vec<&'static str> {
            self.0.lock().unwrap().iter().map(|(n, _)| *n).collect()
        }
    }

    async fn run(
        system: Result<Vec<SrvTarget>, String>,
        dot: Result<Vec<SrvTarget>, String>,
    ) -> (Result<Vec<(SocketAddr, u8)>, DiscoveryError>, Built) {
        run_with_hosts(system, Some(SYSTEM_IP), dot, Some(DOT_IP)).await
    }

    async fn run_with_hosts(
        system: Result<Vec<SrvTarget>, String>,
        system_ip: Option<IpAddr>,
        dot: Result<Vec<SrvTarget>, String>,
        dot_ip: Option<IpAddr>,
    ) -> (Result<Vec<(SocketAddr, u8)>, DiscoveryError>, Built) {
        let built = Built::default();
        let res = discover_with(
            "_v2-origintunneld._tcp.argotunnel.com.",
            built.builder("system", system, system_ip),
            built.builder("dot", dot, dot_ip),
        )
        .await;
        (res, built)
    }

    fn on(ip: IpAddr) -> Vec<(SocketAddr, u8)> {
        vec![
            (SocketAddr::new(ip, 7844), 0),
            (SocketAddr::new(ip, 7844), 1),
        ]
    }

    #[tokio::test]
    async fn a_system_answer_is_used_without_dns_over_tls() {
        let (res, built) = run(Ok(both_regions()), Err("unused".into())).await;
        assert_eq!(res.unwrap(), on(SYSTEM_IP));
        assert_eq!(built.names(), ["system"]);
    }

    /// The SRV answer comes over DNS-over-TLS; the region hosts are still
    /// the system resolver's to answer, as in `cloudflared`.
    #[tokio::test]
    async fn a_failed_or_empty_system_lookup_falls_back_to_dns_over_tls() {
        for system in [Err("SERVFAIL".to_owned()), Ok(vec![])] {
            let (res, built) = run(system.clone(), Ok(both_regions())).await;
            assert_eq!(res.unwrap(), on(SYSTEM_IP), "{system:?}");
            assert_eq!(built.names(), ["system", "dot"]);
        }
    }

    #[tokio::test]
    async fn region_hosts_the_system_cannot_resolve_are_looked_up_over_dns_over_tls() {
        let (res, _) = run_with_hosts(
            Err("SERVFAIL".into()),
            None,
            Ok(both_regions()),
            Some(DOT_IP),
        )
        .await;
        assert_eq!(res.unwrap(), on(DOT_IP));
    }

    /// One region is enough to start; with neither, discovery fails.
    #[tokio::test]
    async fn region_hosts_that_resolve_nowhere_are_left_out() {
        struct OneHost;
        impl EdgeLookup for OneHost {
            async fn srv(&self, _: &str) -> Result<Vec<SrvTarget>, String> {
                Ok(both_regions())
            }
            async fn ips(&self, host: &str) -> Result<Vec<IpAddr>, String> {
                match host.starts_with("region2") {
                    true => Ok(vec![SYSTEM_IP]),
                    false => Err("NXDOMAIN".into()),
                }
            }
        }
        let res = discover_with("x.", || Ok(OneHost), || Err("unused".into())).await;
        assert_eq!(res.unwrap(), vec![(SocketAddr::new(SYSTEM_IP, 7844), 1)]);
        let (res, _) = run_with_hosts(Ok(both_regions()), None, Err("x".into()), None).await;
        assert_eq!(res.unwrap_err(), DiscoveryError::NoAddresses);
    }

    #[tokio::test]
    async fn an_unavailable_system_resolver_falls_back_to_dns_over_tls() {
        let built = Built::default();
        let res = discover_with(
            "x.",
            || Err::<Fake, _>("no resolv.conf".to_owned()),
            built.builder("dot", Ok(both_regions()), Some(DOT_IP)),
        )
        .await;
        assert_eq!(res.unwrap(), on(DOT_IP));
        assert_eq!(built.names(), ["dot"]);
    }

    /// `cloudflared` falls back only when the lookup itself fails; an
    /// answer with a single target is refused as it is.
    #[tokio::test]
    async fn a_single_target_system_answer_is_refused_without_dns_over_tls() {
        let one = vec![t("region1.v2.argotunnel.com.", 1, 1)];
        let (res, built) = run(Ok(one), Ok(both_regions())).await;
        assert_eq!(res.unwrap_err(), DiscoveryError::TooFewTargets(1));
        assert_eq!(built.names(), ["system"]);
    }

    #[tokio::test]
    async fn both_lookup_failures_are_reported() {
        let (res, _) = run(Err("SERVFAIL".into()), Err("timed out".into())).await;
        match res.unwrap_err() {
            DiscoveryError::Lookup { reason, .. } => {
                assert!(reason.contains("SERVFAIL"), "{reason}");
                assert!(reason.contains("timed out"), "{reason}");
            }
            other => panic!("unexpected error {other:?}"),
        }
    }

    /// Building a resolver reads /etc/resolv.conf and /etc/hosts with
    /// blocking I/O; that must not happen on the runtime's own thread.
    #[tokio::test]
    async fn resolvers_are_built_off_the_async_thread() {
        let (_, built) = run(Err("SERVFAIL".into()), Ok(both_regions())).await;
        let here = std::thread::current().id();
        let threads = built.0.lock().unwrap().clone();
        assert_eq!(threads.len(), 2);
        for (which, id) in threads {
            assert_ne!(id, here, "{which} resolver built on the async thread");
        }
    }

    /// A DNS server on 127.0.0.1 that answers every A query with 192.0.2.7
    /// and every AAAA query with 2001:db8::7.
    async fn dual_stack_dns() -> SocketAddr {
        use hickory_resolver::proto::op::{Message, MessageType};
        use hickory_resolver::proto::rr::{rdata, RData, Record, RecordType};
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut reply = Message::new();
                reply
                    .set_id(query.id())
                    .set_message_type(MessageType::Response)
                    .set_recursion_desired(true)
                    .set_recursion_available(true);
                for q in query.queries() {
                    reply.add_query(q.clone());
                    let answer = match q.query_type() {
                        RecordType::A => RData::A(rdata::A(V4_ANSWER)),
                        RecordType::AAAA => RData::AAAA(rdata::AAAA(V6_ANSWER)),
                        _ => continue,
                    };
                    reply.add_answer(Record::from_rdata(q.name().clone(), 60, answer));
                }
                let _ = sock.send_to(&reply.to_vec().unwrap(), peer).await;
            }
        });
        addr
    }

    const V4_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
    const V6_ANSWER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7);

    /// A host with both records resolves to both families, so an IPv6-only
    /// node gets IPv6 edge addresses.
    #[tokio::test]
    async fn region_hosts_resolve_to_both_families() {
        let dns = dual_stack_dns().await;
        let group = NameServerConfigGroup::from_ips_clear(&[dns.ip()], dns.port(), true);
        let resolver = Hickory::build(TokioResolver::builder_with_config(
            ResolverConfig::from_parts(None, vec![], group),
            TokioConnectionProvider::default(),
        ));
        let mut ips = resolver.ips("region1.edge.test.").await.unwrap();
        ips.sort();
        assert_eq!(ips, [IpAddr::from(V4_ANSWER), IpAddr::from(V6_ANSWER)]);
    }

    #[test]
    fn families_are_ordered_as_go_orders_them() {
        let v4: IpAddr = "198.41.192.7".parse().unwrap();
        let v6: IpAddr = "2606:4700:a0::1".parse().unwrap();
        let order = |src6: Option<&str>| {
            let mut ips = [v4, v6];
            sort_rfc6724(&mut ips, |dst| match dst {
                IpAddr::V4(_) => Some("10.0.0.2".parse().unwrap()),
                IpAddr::V6(_) => src6.map(|s| s.parse().unwrap()),
            });
            ips
        };
        // A global IPv6 source: IPv6 first (higher precedence).
        assert_eq!(order(Some("2001:db8:1::2")), [v6, v4]);
        // No IPv6 route: IPv4 first.
        assert_eq!(order(None), [v4, v6]);
        // Only a unique-local or link-local IPv6 source: IPv4 first.
        assert_eq!(order(Some("fd00::2")), [v4, v6]);
        assert_eq!(order(Some("fe80::2")), [v4, v6]);
        // The order within a family is kept.
        let v6b: IpAddr = "2606:4700:a0::2".parse().unwrap();
        let mut ips = [v4, v6b, v6];
        sort_rfc6724(&mut ips, |_| Some("2001:db8:1::2".parse().unwrap()));
        assert_eq!(ips, [v6b, v6, v4]);
    }

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
