//! End to end: what the proxy's listeners accept, over real sockets.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::support::*;
use cftunnel_proxy::{cli::ListenAddr, ServerOptions};
use serde_json::json;

/// `:PORT` (the default `:8080` and `:8081`) listens on every address of both families, as a Go
/// listener does: IPv4 clients are served (and named by their IPv4 address in
/// `X-Forwarded-For`), and so are IPv6 ones where the host has IPv6.
#[tokio::test]
async fn port_only_addresses_take_both_families() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = echo("svc-a-1").await;
        let any: ListenAddr = ":0".parse().expect("listen address");
        let proxy = proxy_with(ServerOptions {
            data_addr: Some(any.0),
            admin_addr: any.0,
            auth_token: Some(TOKEN.into()),
            ..ServerOptions::default()
        })
        .await;
        let http = client();
        let admin = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), proxy.admin_addr().port());
        let doc = json!({"version": 1, "rules": [{"backends": [{"url": url(backend.http_addr()), "weight": 1}]}]});
        assert_eq!(push(&http, admin, &doc).await.status, http::StatusCode::OK);

        let v4 = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), proxy.data_addr().port());
        let r = get(&http, v4, "app.example.com", "/", &[]).await;
        assert_eq!(r.status, http::StatusCode::OK);
        assert_eq!(r.seen_header("x-forwarded-for").as_deref(), Some("127.0.0.1"));

        // Where `::1` works the listener must be IPv6's wildcard; a host with the IPv6 stack but
        // no IPv6 loopback may still bind it, so only IPv4 is checked there.
        let host_has_ipv6 = std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok();
        if host_has_ipv6 {
            assert!(proxy.data_addr().is_ipv6(), "{:?}", proxy.data_addr());
            let v6 = SocketAddr::new(Ipv6Addr::LOCALHOST.into(), proxy.data_addr().port());
            let r = get(&http, v6, "app.example.com", "/", &[]).await;
            assert_eq!(r.status, http::StatusCode::OK);
            assert_eq!(r.seen_header("x-forwarded-for").as_deref(), Some("::1"));
            let admin6 = SocketAddr::new(Ipv6Addr::LOCALHOST.into(), proxy.admin_addr().port());
            assert_eq!(get(&http, admin6, "admin", "/healthz", &[]).await.status, http::StatusCode::OK);
        } else {
            eprintln!("no IPv6 loopback on this host: only IPv4 was checked");
        }
    })
    .await
    .expect("test finished in time");
}

/// A host name and port (`localhost:8081`), as Go's listener takes it, listens on the name's
/// first address, IPv4 first; one that cannot be resolved is refused, named.
#[tokio::test]
async fn a_host_name_listens_on_its_first_address() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let named: ListenAddr = "localhost:0".parse().expect("listen address");
        assert_eq!(named.0.ip(), std::net::IpAddr::from(Ipv4Addr::LOCALHOST));
        let proxy = proxy_with(ServerOptions {
            admin_addr: named.0,
            auth_token: Some(TOKEN.into()),
            ..ServerOptions::default()
        })
        .await;
        let http = client();
        let admin = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), proxy.admin_addr().port());
        assert_eq!(
            get(&http, admin, "admin", "/healthz", &[]).await.status,
            http::StatusCode::OK
        );

        let err = "localhost:http".parse::<ListenAddr>().expect_err("refused");
        assert!(err.contains("\"localhost:http\""), "{err}");
        assert!(
            "localhost".parse::<ListenAddr>().is_err(),
            "a port is needed"
        );
    })
    .await
    .expect("test finished in time");
}
