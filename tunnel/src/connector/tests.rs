use super::*;

async fn fallback(endpoint: Option<&str>) -> (Vec<(SocketAddr, u8)>, Vec<&'static str>) {
    let asked = Mutex::new(Vec::new());
    let found = region_host_fallback(endpoint, EdgeIpVersion::Auto, |host| {
        asked.lock().unwrap().push(host);
        async { Ok(vec![SocketAddr::from(([192, 0, 2, 1], EDGE_PORT))]) }
    })
    .await;
    (found, asked.into_inner().unwrap())
}

#[tokio::test]
async fn the_global_edge_falls_back_to_its_region_hosts() {
    for endpoint in [None, Some("")] {
        let (found, asked) = fallback(endpoint).await;
        assert_eq!(asked, REGION_HOSTS);
        let regions: Vec<u8> = found.iter().map(|(_, r)| *r).collect();
        assert_eq!(regions, [0, 1]);
    }
}

/// A FedRAMP (or other endpoint) tunnel never looks up the global hosts.
#[tokio::test]
async fn an_endpoint_token_never_falls_back_to_the_global_edge() {
    let (found, asked) = fallback(Some("fed")).await;
    assert!(found.is_empty());
    assert!(asked.is_empty(), "looked up {asked:?}");
}

#[test]
fn a_region_stands_where_a_token_endpoint_would() {
    assert_eq!(edge_region(None, None).ok(), Some(None));
    assert_eq!(edge_region(Some(""), Some("")).ok(), Some(None));
    assert_eq!(edge_region(Some("us"), None).ok(), Some(Some("us")));
    assert_eq!(edge_region(Some(""), Some("fed")).ok(), Some(Some("fed")));
    assert_eq!(edge_region(None, Some("fed")).ok(), Some(Some("fed")));
    assert!(matches!(
        edge_region(Some("us"), Some("fed")),
        Err(ConnectorError::RegionWithEndpoint { endpoint }) if endpoint == "fed"
    ));
    for bad in ["us.evil", "-us", "us-", "u s", "ü"] {
        assert!(
            matches!(edge_region(Some(bad), None), Err(ConnectorError::Region(r)) if r == bad),
            "{bad}"
        );
    }
    assert_eq!(
        crate::discovery::srv_name(edge_region(Some("us"), None).ok().flatten()),
        "_us-v2-origintunneld._tcp.argotunnel.com."
    );
}

fn sa(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `lookup` for `refill`: pops the answers (last first), counting the calls; an empty
/// answer once they are used up.
fn scripted(
    answers: Vec<(Vec<(SocketAddr, u8)>, bool)>,
    lookups: &std::sync::atomic::AtomicUsize,
) -> impl FnMut() -> std::future::Ready<(Vec<(SocketAddr, u8)>, bool)> + '_ {
    let answers = Mutex::new(answers);
    move || {
        lookups.fetch_add(1, Ordering::SeqCst);
        let answer = answers.lock().ok().and_then(|mut a| a.pop());
        std::future::ready(answer.unwrap_or_default())
    }
}

#[tokio::test]
async fn addresses_found_later_start_the_connections_they_were_missing_for() {
    let pool = EdgePool::new(vec![(sa(1), 0)]);
    assert_eq!(pool.address(0), Some(sa(1)));
    let (_tx, mut state) = watch::channel(Control::START);
    let (target, connections) = watch::channel(1);
    // A lookup that still fails, one that finds a host of the other region, one complete.
    let lookups = std::sync::atomic::AtomicUsize::new(0);
    let resolve = scripted(
        vec![
            (vec![(sa(1), 0), (sa(2), 1), (sa(3), 1)], true),
            (vec![(sa(1), 0), (sa(2), 1)], false),
            (vec![], false),
        ],
        &lookups,
    );
    let first = Duration::from_millis(5);
    refill(&pool, 4, &target, first, &mut state, resolve).await;
    assert_eq!(*connections.borrow(), 3, "one for each address");
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        3,
        "until a lookup is complete"
    );
    assert_eq!(pool.available(), 2);
}

/// A region left out at start is looked up again although the other region has an
/// address for every connection: it joins the pool, and a connection moving on after a
/// failure in the first region is moved to it.
#[tokio::test]
async fn a_region_left_out_is_looked_up_again_with_every_connection_running() {
    let pool = EdgePool::new(vec![(sa(1), 0), (sa(2), 0)]);
    let held = [pool.address(0), pool.address(1)];
    let (_tx, mut state) = watch::channel(Control::START);
    let (target, connections) = watch::channel(2);
    let lookups = std::sync::atomic::AtomicUsize::new(0);
    let resolve = scripted(
        vec![
            (vec![(sa(1), 0), (sa(2), 0), (sa(3), 1)], true),
            (vec![(sa(1), 0), (sa(2), 0)], false),
        ],
        &lookups,
    );
    let first = Duration::from_millis(5);
    refill(&pool, 2, &target, first, &mut state, resolve).await;
    assert_eq!(lookups.load(Ordering::SeqCst), 2);
    assert_eq!(*connections.borrow(), 2, "no more connections than wanted");
    assert_eq!(pool.available(), 1);
    pool.rotate(0);
    assert_eq!(pool.address(0), Some(sa(3)), "moved to the other region");
    assert_eq!(pool.address(1), held[1]);
}

#[tokio::test]
async fn looking_up_missing_addresses_stops_with_the_connector() {
    let pool = EdgePool::new(vec![(sa(1), 0)]);
    let (tx, mut state) = watch::channel(Control::START);
    let (target, _connections) = watch::channel(1);
    let stop = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send_modify(|s| s.run = RunState::Draining);
    };
    // Lookups that never answer, as DNS that does not: the drain does not wait for them.
    let resolve = || std::future::pending::<(Vec<(SocketAddr, u8)>, bool)>();
    let first = Duration::from_millis(5);
    let looking = refill(&pool, 4, &target, first, &mut state, resolve);
    tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(looking, stop)
    })
    .await
    .expect("stops at the drain");
}

/// Edge lookups answered from tables a test changes: discovery's answer (empty: it
/// fails) and each host's addresses (a host missing does not resolve).
#[derive(Clone, Default)]
struct FakeDns(Arc<Mutex<FakeAnswers>>);

#[derive(Default)]
struct FakeAnswers {
    discovered: Vec<(SocketAddr, u8)>,
    hosts: std::collections::HashMap<String, SocketAddr>,
    discoveries: usize,
    resolved: usize,
}

impl FakeDns {
    fn with<T>(&self, f: impl FnOnce(&mut FakeAnswers) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }
}

impl EdgeResolver for FakeDns {
    async fn discover(&self, _: Option<&str>) -> Result<Vec<(SocketAddr, u8)>, DiscoveryError> {
        self.with(|a| {
            a.discoveries += 1;
            match a.discovered.is_empty() {
                true => Err(DiscoveryError::NoAddresses),
                false => Ok(a.discovered.clone()),
            }
        })
    }

    async fn resolve(&self, edge: &EdgeAddr) -> std::io::Result<Vec<SocketAddr>> {
        self.with(|a| {
            a.resolved += 1;
            match a.hosts.get(&edge.to_string()) {
                Some(addr) => Ok(vec![*addr]),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such host",
                )),
            }
        })
    }
}

/// A connector facing `edge`'s test CA, with short timers, looking the edge up through
/// `dns` and again 50 ms after a lookup that left addresses out.
fn start_with_dns(
    edge: &cftunnel_testkit::edge::MockEdge,
    edges: Vec<EdgeAddr>,
    ha: usize,
    dns: &FakeDns,
) -> ConnectorHandle {
    let opts = ConnectorOptions {
        protocol: Protocol::Http2,
        edges,
        edge_ca_pem: Some(edge.ca_pem().as_bytes().to_vec()),
        ha_connections: ha,
        grace_period: Duration::from_secs(2),
        rpc_timeout: Duration::from_secs(3),
        backoff_base: Duration::from_millis(20),
        ha_backoff_base: Duration::from_millis(20),
        ha_start_interval: Duration::from_millis(20),
        handshake_timeout: Duration::from_secs(2),
        ..ConnectorOptions::default()
    };
    let token = Token::new("test-account", vec![7u8; 32], Uuid::new_v4());
    let service = hyper::service::service_fn(|_req| async {
        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
            Bytes::from_static(b"ok"),
        )))
    });
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    Connector::new(token, opts)
        .unwrap()
        .start_with(
            crate::service::ServiceHandler(service),
            metrics,
            dns.clone(),
            Duration::from_millis(50),
        )
        .unwrap()
}

/// Ports bound but not listening: dials to them are refused, and they stay taken while
/// the sockets live, so no other test's listener lands on one.
fn refusing_ports(n: usize) -> Vec<tokio::net::TcpSocket> {
    (0..n)
        .map(|_| {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(sa(0)).unwrap();
            socket
        })
        .collect()
}

/// Discovery finds one region at start, with an address for each connection, and the
/// other region only on a later lookup. When the first region's edge goes down, the
/// connections move to the other region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_move_to_a_region_a_later_lookup_found_when_theirs_fails() {
    cftunnel_testkit::trace::trace_init();
    tokio::time::timeout(Duration::from_secs(20), async {
        let region0 = cftunnel_testkit::edge::MockEdge::start().await.unwrap();
        let pki = region0.pki().clone();
        let region1 = cftunnel_testkit::edge::MockEdge::builder()
            .pki(pki)
            .start()
            .await
            .unwrap();
        let dns = FakeDns::default();
        let first = vec![(region0.edge_addr(), 0), (region0.edge_addr(), 0)];
        dns.with(|a| a.discovered = first.clone());
        let handle = start_with_dns(&region0, Vec::new(), 2, &dns);
        handle.wait_registered(2).await;
        region0.wait_serving(2).await;
        // More addresses than the first region, as a whole region has: a connection moving
        // on takes a free address of the region with more of them.
        let found = first
            .into_iter()
            .chain([(region1.edge_addr(), 1); 4])
            .collect();
        dns.with(|a| a.discovered = found);
        // Looked up again until the lookup is complete.
        let looked = dns.with(|a| a.discoveries);
        while dns.with(|a| a.discoveries) == looked {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        region0.shutdown().await;
        region1.wait_serving(2).await;
        handle.wait_registered(2).await;
        handle.shutdown().await;
        region1.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Of three `TUNNEL_EDGE` hosts, the two that resolve at start refuse every dial, and the
/// third resolves only later: it is looked up again although no connection registered,
/// and the first connection moves to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_left_out_is_looked_up_again_before_any_connection_registers() {
    cftunnel_testkit::trace::trace_init();
    tokio::time::timeout(Duration::from_secs(20), async {
        let edge = cftunnel_testkit::edge::MockEdge::start().await.unwrap();
        let refusing = refusing_ports(2);
        let dns = FakeDns::default();
        dns.with(|a| {
            for (name, socket) in ["a.edge.test:7844", "b.edge.test:7844"]
                .iter()
                .zip(&refusing)
            {
                a.hosts
                    .insert((*name).to_owned(), socket.local_addr().unwrap());
            }
        });
        let edges = ["a.edge.test:7844", "b.edge.test:7844", "c.edge.test:7844"]
            .iter()
            .map(|e| e.parse().unwrap())
            .collect();
        let handle = start_with_dns(&edge, edges, 3, &dns);
        // The lookup at start is over, without the third host.
        while dns.with(|a| a.resolved) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dns.with(|a| {
            a.hosts
                .insert("c.edge.test:7844".to_owned(), edge.edge_addr())
        });
        handle.wait_registered(1).await;
        edge.wait_serving(1).await;
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// The one `TUNNEL_EDGE` host that resolves at start answers but refuses every registration
/// (a retryable refusal, which keeps the connection on its address); the other resolves
/// later, and a connection starts there at once, without waiting for the first to register.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_found_later_gets_a_connection_while_the_first_cannot_register() {
    cftunnel_testkit::trace::trace_init();
    tokio::time::timeout(Duration::from_secs(20), async {
        let refusing = cftunnel_testkit::edge::MockEdge::start().await.unwrap();
        refusing.refuse_registrations("server busy");
        let answering = cftunnel_testkit::edge::MockEdge::builder()
            .pki(refusing.pki().clone())
            .start()
            .await
            .unwrap();
        let dns = FakeDns::default();
        dns.with(|a| {
            a.hosts
                .insert("a.edge.test:7844".to_owned(), refusing.edge_addr())
        });
        let edges = ["a.edge.test:7844", "b.edge.test:7844"]
            .iter()
            .map(|e| e.parse().unwrap())
            .collect();
        let handle = start_with_dns(&refusing, edges, 2, &dns);
        while dns.with(|a| a.resolved) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dns.with(|a| {
            a.hosts
                .insert("b.edge.test:7844".to_owned(), answering.edge_addr())
        });
        handle.wait_registered(1).await;
        answering.wait_serving(1).await;
        handle.shutdown().await;
        refusing.shutdown().await;
        answering.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A moving connection gives the move to HTTP/2 up after three failures in a row that say
/// HTTP/2 cannot serve the tunnel (unreachable, no control stream, refused for good), and
/// after ten failures of any kind; a transient one (a retryable refusal, a duplicate, an RPC
/// error) starts the count in a row over.
#[test]
fn a_move_gives_up_on_failures_that_say_http2_cannot_serve_the_tunnel() {
    use crate::rpc::control::EdgeRefusal;
    let refused = |cause: &str, should_retry: bool| {
        ConnError::Refused(EdgeRefusal {
            cause: cause.to_owned(),
            retry_after: std::time::Duration::ZERO,
            should_retry,
        })
    };
    let given_up_after = |errors: &[ConnError]| {
        let mut failures = MoveFailures::default();
        errors
            .iter()
            .position(|e| failures.failed(e))
            .map(|i| i + 1)
    };
    let no_preface = || ConnError::control_stream("edge sent no HTTP/2 preface");
    assert_eq!(
        given_up_after(&[no_preface(), no_preface(), no_preface()]),
        Some(3)
    );
    let dial = || ConnError::dial("connection refused");
    assert_eq!(given_up_after(&[dial(), dial(), dial()]), Some(3));
    let for_good = || refused("Unauthorized: no", false);
    assert_eq!(
        given_up_after(&[for_good(), for_good(), for_good()]),
        Some(3)
    );
    // Transient failures between them start the count over.
    let transient = || refused("server error", true);
    assert_eq!(
        given_up_after(&[dial(), dial(), transient(), dial(), dial()]),
        None
    );
    assert_eq!(
        given_up_after(&[refused("EDUPCONN", false), dial(), dial()]),
        None
    );
    // Transient ones alone give up at the tenth.
    let many: Vec<ConnError> = (0..12).map(|_| transient()).collect();
    assert_eq!(given_up_after(&many), Some(10));
}

/// An `auto` connector that prefers HTTP/2 before a connection starts has it dial HTTP/2
/// first, whatever the first connection is on; one that does not starts as `cloudflared`
/// does; a transport configured is kept.
#[test]
fn a_connection_dials_http2_first_when_the_connector_prefers_it_already() {
    use crate::backoff::Transport::{Http2, Quic};
    let cases = [
        // (configured, prefers HTTP/2, first connection on HTTP/2, dialed first)
        (Protocol::Auto, true, false, Http2),
        (Protocol::Auto, true, true, Http2),
        (Protocol::Auto, false, false, Quic),
        (Protocol::Auto, false, true, Http2),
        (Protocol::Quic, true, true, Quic),
        (Protocol::Http2, false, false, Http2),
    ];
    for (protocol, prefers, first_on_http2, expected) in cases {
        assert_eq!(
            first_transport(protocol, prefers, first_on_http2),
            expected,
            "{protocol:?}, prefers {prefers}, first on HTTP/2 {first_on_http2}"
        );
    }
}

/// An HTTP/2 retry under a second is refused at start, naming the option: the connections
/// would move to HTTP/2 and back without pause.
#[test]
fn an_http2_retry_under_a_second_is_refused() {
    let token = || Token::new("test-account", vec![7u8; 32], Uuid::new_v4());
    let with_retry = |http2_retry| ConnectorOptions {
        http2_retry,
        ..ConnectorOptions::default()
    };
    for short in [
        Duration::ZERO,
        Duration::from_millis(5),
        Duration::from_millis(999),
    ] {
        let err = Connector::new(token(), with_retry(short)).unwrap_err();
        assert!(
            matches!(err, ConnectorError::Http2Retry(d) if d == short),
            "{short:?}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("http2_retry must be at least 1s, not {short:?}")
        );
    }
    assert!(Connector::new(token(), with_retry(Duration::from_secs(1))).is_ok());
}

/// More connections than a one-byte index tells apart are refused at start, as none are: past
/// 256 the indexes would repeat and the edge refuse all but one connection on each.
#[test]
fn more_connections_than_an_index_tells_apart_are_refused() {
    let token = || Token::new("test-account", vec![7u8; 32], Uuid::new_v4());
    let with_ha = |ha_connections| ConnectorOptions {
        ha_connections,
        ..ConnectorOptions::default()
    };
    assert!(matches!(
        Connector::new(token(), with_ha(0)),
        Err(ConnectorError::NoConnections)
    ));
    let err = Connector::new(token(), with_ha(MAX_HA_CONNECTIONS + 1)).unwrap_err();
    assert!(
        matches!(err, ConnectorError::TooManyConnections(257)),
        "{err:?}"
    );
    assert!(err.to_string().contains("over 256"), "{err}");
    assert!(Connector::new(token(), with_ha(MAX_HA_CONNECTIONS)).is_ok());
}

/// The failed first QUIC attempt of a connection that left HTTP/2 tells of an outage whatever
/// failed (the dial, the control stream, a refusal, retryable or not, an RPC): QUIC did not
/// register either, and an edge that recovers must not have its first QUIC registration
/// confirm the give-up. Never while a connection is registered over QUIC: QUIC reaches the
/// edge then, and taking the give-up back would have a serving connection move while this one
/// is down too.
#[test]
fn a_first_quic_failure_tells_of_an_outage_only_with_no_connection_on_quic() {
    use crate::rpc::control::EdgeRefusal;
    let refused = |should_retry: bool| {
        ConnError::Refused(EdgeRefusal {
            cause: "server error".to_owned(),
            retry_after: Duration::ZERO,
            should_retry,
        })
    };
    let failures = [
        ConnError::dial("quic handshake timed out"),
        ConnError::control_stream("edge opened no control stream"),
        refused(true),
        refused(false),
        ConnError::Rpc(crate::rpc::RpcError::Timeout),
    ];
    for error in &failures {
        assert!(
            quic_failure_says_outage(error, 0),
            "{error}, nothing on QUIC: an outage"
        );
        for serving in [1, 2] {
            assert!(
                !quic_failure_says_outage(error, serving),
                "{error}, {serving} on QUIC: not an outage"
            );
        }
    }
}

/// HTTP/2 attempts by preference get the short dial timeout until the connection first
/// registers over HTTP/2; its reconnects after that, in any later try too, get the usual one.
/// Taking the preference up again (a new move) starts short again.
#[test]
fn only_a_connection_not_yet_registered_over_http2_dials_it_with_the_short_timeout() {
    let mut preferred = Preferred::in_try(0);
    assert!(preferred.short_dials(), "at start or in a move");
    preferred.registered(0);
    assert!(!preferred.short_dials(), "reconnecting after it was lost");
    preferred.registered(3);
    assert!(!preferred.short_dials());
    assert!(Preferred::in_try(3).short_dials(), "moving again");
}
