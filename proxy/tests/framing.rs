//! What reaches a backend is framed and addressed as the proxy routed it: a host with userinfo
//! is refused, `Connection` cannot strip the host, a GET body of unknown length is passed on,
//! and only WebSocket is ever spliced after a `101`. Real sockets: a raw client, and backends
//! that record the bytes they receive.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use http::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A backend that records each request head (and what follows it within 300 ms) and answers
/// it with `answer`, keeping the connection open for more.
async fn recording_backend(answer: &'static [u8]) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = scripted_backend(move |mut conn: tokio::net::TcpStream| {
        let log = log.clone();
        async move {
            let mut buf = [0u8; 8192];
            loop {
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                // A body, if any, follows at once.
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                if let Ok(mut seen) = log.lock() {
                    seen.push(String::from_utf8_lossy(&got).into_owned());
                }
                if conn.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

async fn proxy_for(backend: SocketAddr) -> (cftunnel_proxy::Server, TestClient) {
    let proxy = proxy().await;
    let http = client();
    let doc = json!({"rules": [
        {"hostnames": ["app.example.com"],
         "backends": [{"url": url(backend), "weight": 1, "websocket": true}]},
    ]});
    assert_eq!(
        push(&http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    (proxy, http)
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn a_host_with_userinfo_is_refused() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, seen) = recording_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        let (proxy, _http) = proxy_for(backend).await;
        let d = proxy.data_addr();
        for request in [
            "GET /a HTTP/1.1\r\nHost: admin.example:1@app.example.com\r\n\r\n",
            "GET http://admin.example:1@app.example.com/a HTTP/1.1\r\nHost: app.example.com\r\n\r\n",
        ] {
            let answer = raw(d, request.as_bytes()).await;
            assert_eq!(status(&answer), "400", "{request:?}: {answer}");
        }
        let answer = raw(d, b"GET /ok HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n").await;
        assert_eq!(status(&answer), "200", "{answer}");
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen.len(), 1, "only the plain request reached the backend: {seen:?}");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn connection_cannot_strip_the_host_and_a_get_body_of_unknown_length_goes_on() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, seen) =
            recording_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        let (proxy, _http) = proxy_for(backend).await;
        let d = proxy.data_addr();
        let answer = raw(
            d,
            b"GET /host HTTP/1.1\r\nHost: app.example.com\r\nConnection: host, close\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "200", "{answer}");
        let answer = raw(
            d,
            b"GET /search HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\
              Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "200", "{answer}");
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        let host = seen
            .iter()
            .find(|r| r.starts_with("GET /host"))
            .expect("/host arrived");
        assert!(
            host.to_ascii_lowercase()
                .contains("\r\nhost: app.example.com\r\n"),
            "{host}"
        );
        let search = seen
            .iter()
            .find(|r| r.starts_with("GET /search"))
            .expect("/search arrived");
        assert!(search.contains("hello"), "the body went on: {search}");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn only_websocket_is_asked_for_and_spliced() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, seen) = recording_backend(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        )
        .await;
        let (proxy, _http) = proxy_for(backend).await;
        let answer = raw(
            proxy.data_addr(),
            b"GET /ws HTTP/1.1\r\nHost: app.example.com\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nUpgrade: h2c\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await;
        assert_eq!(
            status(&answer),
            "502",
            "a switch to h2c is not spliced: {answer}"
        );
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        let head = seen
            .first()
            .expect("the handshake arrived")
            .to_ascii_lowercase();
        assert_eq!(
            head.matches("\r\nupgrade:").count(),
            1,
            "one Upgrade line went on: {head}"
        );
        assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
    })
    .await
    .expect("test finished in time");
}

/// What a backend that answers every request `101 Switching Protocols` to WebSocket, asked
/// or not, then holds its side, writes first.
const UNASKED_SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";

/// A backend that answers every request head with `answer`, then holds the connection, reading
/// until the proxy closes it; each close is reported on the returned channel.
async fn holding_backend(
    answer: &'static [u8],
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let (closed_tx, closed) = tokio::sync::mpsc::unbounded_channel();
    let addr = scripted_backend(move |mut conn: tokio::net::TcpStream| {
        let closed_tx = closed_tx.clone();
        async move {
            if request_head(&mut conn).await.is_none() {
                return;
            }
            if conn.write_all(answer).await.is_err() {
                return;
            }
            let mut buf = [0u8; 1024];
            while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
        }
    })
    .await;
    (addr, closed)
}

/// A `101` to a request that asked for no WebSocket upgrade is the backend's error (RFC 9110
/// §15.2.2: a server must not switch to a protocol the request did not ask for): the client
/// gets 502, not a switch of its connection, it is counted as a backend error and the backend
/// connection, which has left HTTP, is closed rather than reused.
#[tokio::test]
async fn a_switch_the_request_did_not_ask_for_is_refused() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, mut closed) = holding_backend(UNASKED_SWITCH).await;
        let (proxy, http) = proxy_for(backend).await;
        let answer = raw(
            proxy.data_addr(),
            b"GET / HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "502", "{answer}");
        assert!(
            !answer.to_ascii_lowercase().contains("upgrade"),
            "nothing of the switch reaches the client: {answer}"
        );
        tokio::time::timeout(Duration::from_secs(2), closed.recv())
            .await
            .expect("the backend connection is closed, not pooled")
            .expect("the backend says so");
        let errors =
            "cftunnel_proxy_backend_errors_total{hostname=\"app.example.com\",reason=\"other\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), errors).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket handshake the backend refuses (no `101`) and whose answer's body then stalls
/// is cut once the body has sent nothing for the backend header timeout, counted as the
/// backend's timeout: the refusal would otherwise hold the client, the backend connection and
/// its place in flight for good when the rule sets no timeout.
#[tokio::test]
async fn a_refused_handshake_whose_body_stalls_is_cut() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, mut closed) =
            holding_backend(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\npartial").await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_header_timeout: Duration::from_millis(300),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [
            {"hostnames": ["app.example.com"],
             "backends": [{"url": url(backend), "weight": 1, "websocket": true}]},
        ]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let mut conn = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        conn.write_all(
            b"GET /ws HTTP/1.1\r\nHost: app.example.com\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .expect("handshake written");
        let started = std::time::Instant::now();
        let mut answer = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(3), async {
            let mut buf = [0u8; 1024];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(ended.is_ok(), "the connection ends: {answer}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "within about the bound: {:?}",
            started.elapsed()
        );
        assert_eq!(status(&answer), "403", "{answer}");
        assert!(answer.ends_with("partial"), "cut mid-body: {answer}");
        tokio::time::timeout(Duration::from_secs(2), closed.recv())
            .await
            .expect("the backend connection is let go")
            .expect("the backend says so");
        let gauge = "cftunnel_proxy_requests_in_flight";
        let zero_by = std::time::Instant::now() + Duration::from_secs(2);
        while metric(&http, proxy.admin_addr(), gauge).await != Some(0.0) {
            assert!(
                std::time::Instant::now() < zero_by,
                "nothing left in flight"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let errors =
            "cftunnel_proxy_backend_errors_total{hostname=\"app.example.com\",reason=\"timeout\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), errors).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}
