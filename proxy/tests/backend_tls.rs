//! End to end: how the proxy dials TLS backends. Which certificates it accepts (wildcard
//! subject alternative names, a self-signed certificate named as its own CA, a Go block that
//! trusts nothing) and how a failed handshake counts (dropped: retried as a dial; refused: a
//! TLS failure, not retried).
//!
//! `fixtures/self-signed-ca-{a,b}.pem` are what `openssl req -x509` makes by default: a
//! self-signed certificate marked `CA:TRUE`, here for `localhost` and `127.0.0.1`, valid for a
//! hundred years, then its key:
//!
//! ```text
//! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 36500 \
//!   -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
//!   -keyout key.pem -out cert.pem
//! ```
//!
//! `fixtures/self-signed-ca-expired.pem` is the same kind of certificate valid only in 2000
//! (`openssl ca -selfsign -startdate 20000101000000Z -enddate 20010101000000Z`, with
//! `basicConstraints = critical,CA:TRUE` and the same names).

use crate::support::*;
use http::StatusCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SELF_SIGNED_A: &str = include_str!("fixtures/self-signed-ca-a.pem");
const SELF_SIGNED_B: &str = include_str!("fixtures/self-signed-ca-b.pem");
const SELF_SIGNED_EXPIRED: &str = include_str!("fixtures/self-signed-ca-expired.pem");

fn rule(prefix: &str, backend: serde_json::Value) -> serde_json::Value {
    json!({"matches": [{"path": {"type": "PathPrefix", "value": prefix}}], "backends": [backend]})
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The certificate of a fixture, as PEM (what a CA bundle names).
fn certificate_pem(fixture: &str) -> &str {
    let end = fixture
        .find("-----BEGIN PRIVATE KEY-----")
        .expect("the fixture holds a key after its certificate");
    &fixture[..end]
}

/// A server config presenting a fixture's certificate.
fn fixture_server(fixture: &str) -> rustls::ServerConfig {
    let cert = CertificateDer::from_pem_slice(fixture.as_bytes()).expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(fixture.as_bytes()).expect("key");
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server config")
}

/// A server config presenting a new certificate for `names` signed by a new private CA, and
/// that CA as PEM.
fn private_ca_server(names: &[&str]) -> (rustls::ServerConfig, String) {
    let pki = cftunnel_testkit::pki::TestPki::for_names(names).expect("PKI");
    let config = pki.tcp_server(provider()).expect("server config");
    (config, pki.ca_pem().to_owned())
}

/// Answers one HTTP/1.1 request on an established TLS stream with 200 and its path, then
/// closes.
async fn answer_once<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut tls: S) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{path}",
        path.len()
    );
    let _ = tls.write_all(resp.as_bytes()).await;
    let _ = tls.shutdown().await;
}

/// A TLS backend serving `config`, and the number of connections it has accepted.
async fn tls_backend(config: rustls::ServerConfig) -> (SocketAddr, Arc<AtomicUsize>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let addr = scripted_backend(move |tcp| {
        let acceptor = acceptor.clone();
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if let Ok(tls) = acceptor.accept(tcp).await {
                answer_once(tls).await;
            }
        }
    })
    .await;
    (addr, accepted)
}

fn https(addr: SocketAddr) -> String {
    format!("https://127.0.0.1:{}", addr.port())
}

async fn tls_errors(http: &TestClient, proxy: &cftunnel_proxy::Server) -> Option<f64> {
    let series = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"tls\"}";
    metric(http, proxy.admin_addr(), series).await
}

/// Gateway API's `Hostname` subject alternative names may start with `*.`: a policy naming
/// `*.svc.example` is accepted (the whole document with it, 200 rather than 400), and is
/// satisfied by a certificate carrying that wildcard or a name with one label in its place,
/// not two.
#[tokio::test]
async fn a_wildcard_subject_alt_name_accepts_that_wildcard_or_one_label_in_its_place() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let mut rules = Vec::new();
        for (prefix, presented) in [
            ("/wildcard", "*.svc.example"),
            ("/one-label", "api.svc.example"),
            ("/two-labels", "a.b.svc.example"),
            ("/parent", "svc.example"),
        ] {
            let (config, ca) = private_ca_server(&[presented]);
            let (addr, _) = tls_backend(config).await;
            rules.push(rule(
                prefix,
                json!({"url": https(addr), "weight": 1,
                "tls": {"caBundle": ca, "serverName": "api.svc.example",
                        "subjectAltNames": ["*.svc.example"]}}),
            ));
        }
        // The Go implementation's spelling, as its controller pushes a policy's names.
        let (config, ca) = private_ca_server(&["web.svc.example"]);
        let (addr, _) = tls_backend(config).await;
        rules.push(rule(
            "/go",
            json!({"url": https(addr), "weight": 1,
            "tls": {"caBundle": ca, "serverName": "web.svc.example",
                    "subjectAltNames": ["*.svc.example"],
                    "subjectAltNameUris": ["spiffe://cluster.local/ns/shop/sa/web"]}}),
        ));
        let r = push(&http, proxy.admin_addr(), &json!({"rules": rules})).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

        let d = proxy.data_addr();
        for (path, want) in [
            ("/wildcard", StatusCode::OK),
            ("/one-label", StatusCode::OK),
            ("/go", StatusCode::OK),
            ("/two-labels", StatusCode::BAD_GATEWAY),
            ("/parent", StatusCode::BAD_GATEWAY),
        ] {
            assert_eq!(get(&http, d, "h", path, &[]).await.status, want, "{path}");
        }
        assert_eq!(tls_errors(&http, &proxy).await, Some(2.0));
    })
    .await
    .expect("test finished in time");
}

/// A backend that drops the connection during the TLS handshake (a pod shutting down) failed
/// the dial, not TLS: the rule's retries try again, and reach it once it serves. The first
/// connection ends at the end of the client's hello, the second is reset.
#[tokio::test]
async fn a_connection_dropped_mid_handshake_is_retried_as_a_dial_failure() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (config, ca) = private_ca_server(&["backend.internal"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let addr = scripted_backend(move |mut tcp| {
            let acceptor = acceptor.clone();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => {
                        let mut hello = [0u8; 4096];
                        let _ = tcp.read(&mut hello).await;
                        let _ = tcp.shutdown().await;
                    }
                    1 => {
                        let _ = socket2::SockRef::from(&tcp)
                            .set_linger(Some(std::time::Duration::ZERO));
                    }
                    _ => {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            answer_once(tls).await;
                        }
                    }
                }
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [json!({
            "retry": {"attempts": 2, "backoff": "10ms"},
            "backends": [{"url": https(addr), "weight": 1,
                "tls": {"caBundle": ca, "serverName": "backend.internal"}}],
        })]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = get(&http, proxy.data_addr(), "h", "/after-two-drops", &[]).await;
        assert_eq!(
            (r.status, &r.body[..]),
            (StatusCode::OK, &b"/after-two-drops"[..])
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        let dial = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"dial\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), dial).await, Some(2.0));
        assert_eq!(tls_errors(&http, &proxy).await.unwrap_or(0.0), 0.0);
    })
    .await
    .expect("test finished in time");
}

/// A certificate the proxy refuses is a TLS failure: 502, counted as `tls`, and not retried
/// whatever the rule's retries.
#[tokio::test]
async fn a_refused_certificate_is_a_tls_failure_and_is_not_retried() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (config, _) = private_ca_server(&["backend.internal"]);
        let (addr, accepted) = tls_backend(config).await;
        let (_, other_ca) = private_ca_server(&["backend.internal"]);
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [json!({
            "retry": {"attempts": 2, "backoff": "10ms"},
            "backends": [{"url": https(addr), "weight": 1,
                "tls": {"caBundle": other_ca, "serverName": "backend.internal"}}],
        })]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one try, no retry");
        assert_eq!(tls_errors(&http, &proxy).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}

/// A self-signed certificate marked as a CA (as `openssl req -x509` makes one) named as its
/// own trust anchor is accepted, its names still checked; another such certificate, or the
/// same kind of certificate out of its validity period, is not.
#[tokio::test]
async fn a_self_signed_ca_certificate_named_as_its_own_anchor_is_accepted() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, _) = tls_backend(fixture_server(SELF_SIGNED_A)).await;
        let (b, _) = tls_backend(fixture_server(SELF_SIGNED_B)).await;
        let (expired, _) = tls_backend(fixture_server(SELF_SIGNED_EXPIRED)).await;
        let trust_a = certificate_pem(SELF_SIGNED_A);
        let trust_expired = certificate_pem(SELF_SIGNED_EXPIRED);
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/by-ip", json!({"url": https(a), "weight": 1, "tls": {"caBundle": trust_a}})),
            rule("/by-name", json!({"url": https(a), "weight": 1,
                "tls": {"caBundle": trust_a, "serverName": "localhost"}})),
            rule("/by-san", json!({"url": https(a), "weight": 1,
                "tls": {"caBundle": trust_a, "subjectAltNames": ["localhost"]}})),
            rule("/wrong-name", json!({"url": https(a), "weight": 1,
                "tls": {"caBundle": trust_a, "serverName": "impostor.internal"}})),
            rule("/another", json!({"url": https(b), "weight": 1,
                "tls": {"caBundle": trust_a, "serverName": "localhost"}})),
            rule("/expired", json!({"url": https(expired), "weight": 1,
                "tls": {"caBundle": trust_expired, "serverName": "localhost"}})),
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();
        for (path, want) in [
            ("/by-ip", StatusCode::OK),
            ("/by-name", StatusCode::OK),
            ("/by-san", StatusCode::OK),
            ("/wrong-name", StatusCode::BAD_GATEWAY),
            ("/another", StatusCode::BAD_GATEWAY),
            ("/expired", StatusCode::BAD_GATEWAY),
        ] {
            assert_eq!(get(&http, d, "h", path, &[]).await.status, want, "{path}");
        }
        assert_eq!(tls_errors(&http, &proxy).await, Some(3.0));
    })
    .await
    .expect("test finished in time");
}

/// The Go implementation's fail-closed block (no CA bundle, here with the Gateway's client
/// certificate, which only its spelling carries) is accepted and every try fails as TLS: 502,
/// counted as `tls`. That it trusts no root at all, not the web roots, is checked where the
/// client is built (`forward::tls`): no test certificate chains to a web root.
#[tokio::test]
async fn a_go_block_without_a_ca_bundle_answers_502_tls() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let (config, _) = private_ca_server(&["api.example.com"]);
        let (addr, _) = tls_backend(config).await;
        let client_pki =
            cftunnel_testkit::pki::TestPki::for_names(&["gateway.client"]).expect("PKI");
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [rule("/", json!({"url": https(addr), "weight": 1,
            "tls": {"serverName": "api.example.com",
                    "clientCertPem": b64(&client_pki.leaf_pem()),
                    "clientKeyPem": b64(&client_pki.key_pem())}}))]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert_eq!(tls_errors(&http, &proxy).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}
